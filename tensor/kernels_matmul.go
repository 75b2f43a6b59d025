package tensor

import (
	"math"
	"runtime"
	"sync/atomic"
	"unsafe"

	"gonum.org/v1/gonum/blas"
)

// Matrix multiplication through the BLAS of blas.go (OpenBLAS when
// installed, else gonum): float32 with sgemm and float64 with dgemm
// directly on tensor memory (transposed views are passed as transposed
// operands, without copies); float16 and bfloat16 are widened to float32
// and rounded back, in Go-heap scratch buffers of one matrix each. Integer
// types use an exact int64 kernel that wraps around on overflow, as
// PyTorch's CPU kernel does.

// matLayout is how a matrix with row stride rs and column stride cs (in
// elements) is passed to BLAS: as is (row-major with leading dimension ld)
// or transposed (its transpose is row-major with leading dimension ld).
type matLayout struct {
	trans bool
	ld    int
}

// blasLayout returns the BLAS layout of a rows×cols matrix with strides
// (rs, cs), or ok=false if BLAS cannot read it directly.
func blasLayout(rows, cols, rs, cs int) (l matLayout, ok bool) {
	if cols == 1 || cs == 1 {
		ld := rs
		if rows == 1 {
			ld = cols
		}
		if ld >= max(cols, 1) {
			return matLayout{ld: ld}, true
		}
	}
	if rows == 1 || rs == 1 {
		ld := cs
		if cols == 1 {
			ld = rows
		}
		if ld >= max(rows, 1) {
			return matLayout{trans: true, ld: ld}, true
		}
	}
	return matLayout{}, false
}

// matOperand is one batch matrix: base address of element (0, 0), shape
// and strides in elements.
type matOperand struct {
	p          unsafe.Pointer
	rows, cols int
	rs, cs     int
}

// general returns the BLAS view of the matrix for element type T.
func general[T float32 | float64](m matOperand, l matLayout) (rows, cols, ld int, data []T, t blas.Transpose) {
	rows, cols, t = m.rows, m.cols, blas.NoTrans
	if l.trans {
		rows, cols, t = m.cols, m.rows, blas.Trans
	}
	n := (rows-1)*l.ld + cols
	return rows, cols, l.ld, unsafe.Slice((*T)(m.p), n), t
}

// gemmDirect computes c = a × b for float32 or float64 matrices BLAS can
// read in place; c is row-major (column stride 1, row stride c.rs).
func gemmDirect(g *gemm, dt DType, a, b, c matOperand, la, lb matLayout) {
	if dt == Float32 {
		_, _, ald, ad, ta := general[float32](a, la)
		_, _, bld, bd, tb := general[float32](b, lb)
		cd := unsafe.Slice((*float32)(c.p), (c.rows-1)*c.rs+c.cols)
		g.sgemm(ta, tb, c.rows, c.cols, a.cols, ad, ald, bd, bld, cd, c.rs)
		return
	}
	_, _, ald, ad, ta := general[float64](a, la)
	_, _, bld, bd, tb := general[float64](b, lb)
	cd := unsafe.Slice((*float64)(c.p), (c.rows-1)*c.rs+c.cols)
	g.dgemm(ta, tb, c.rows, c.cols, a.cols, ad, ald, bd, bld, cd, c.rs)
}

// panelFlops is the work of one tile of a large matrix product (see
// gemmTiles), 2·rows·cols·k floating-point operations: some tens of
// milliseconds, large enough that the per-call cost (an optimised BLAS
// packs its operands again) is lost in the noise, small enough that an
// interrupt waits for one tile at most. gonum runs at a few GFLOP/s,
// OpenBLAS at tens to hundreds. tileFlopsForTest, when positive, replaces
// it (tests of the tiling).
func panelFlops(g *gemm) int {
	if tileFlopsForTest > 0 {
		return tileFlopsForTest
	}
	if g == gonumGemm {
		return 1 << 27
	}
	return 1 << 32
}

var tileFlopsForTest int

// panelAlign keeps tile boundaries at multiples of gonum's block size
// (64) and of the register tiles of optimised BLAS kernels. With gonum
// each tile's products are then the ones the whole call computes, bit for
// bit; OpenBLAS chooses its kernels and its blocking of the inner
// dimension by the call's shape, so a tiled product's values can differ
// from one call's in the last bits (measured: up to 1.05e-6 relative in
// float32 and 1.0e-15 in float64 for inner dimensions of 512 to 2048,
// within the 2(k−1)ε any two summation orders can differ by;
// TestMatmulPanelsIdentical), as PyTorch's products differ between shapes.
const panelAlign = 64

// gemmTiles calls f(r0, r1, c0, c1) over the output of an n×k×m product
// of flops operations per tile: with a stop flag and a large product, in
// tiles of rows × cols outputs, each one BLAS call, checking the flag
// between calls so an interrupt stops the product within one tile; else
// in one call. Each tile packs its rows of the left operand and its
// columns of the right one again, so for a given work per tile square
// tiles (rows = cols = √(flops/2k), multiples of panelAlign) pack the
// least: a 4096² float32 product in 64-row panels packed the whole right
// operand 64 times and ran 1.25× slower than one call; in tiles of
// 704 × 704, six times, within a few percent. Where the output is narrower
// than that side, the tiles are panels of whole rows (or columns).
func gemmTiles(stop *atomic.Bool, n, k, m, flops int, f func(r0, r1, c0, c1 int)) {
	rows, cols := n, m
	if stop != nil && 2*n*k*m > flops {
		area := max(1, flops/max(1, 2*k)) // outputs per tile
		side := max(panelAlign, int(math.Sqrt(float64(area)))/panelAlign*panelAlign)
		switch {
		case side >= n:
			cols = max(panelAlign, area/n/panelAlign*panelAlign)
		case side >= m:
			rows = max(panelAlign, area/m/panelAlign*panelAlign)
		default:
			rows, cols = side, side
		}
	}
	for r0 := 0; r0 < n; r0 += rows {
		for c0 := 0; c0 < m; c0 += cols {
			if stop != nil && stop.Load() {
				return
			}
			f(r0, min(r0+rows, n), c0, min(c0+cols, m))
		}
	}
}

// tile returns rows [r0, r1) and columns [c0, c1) of m as a matrix.
func tile(m matOperand, size, r0, r1, c0, c1 int) matOperand {
	m.p = elemAddr(m.p, r0*m.rs+c0*m.cs, size)
	m.rows, m.cols = r1-r0, c1-c0
	return m
}

// widen copies a strided matrix of dtype dt into a row-major scratch
// buffer of T.
func widen[T float32 | float64](m matOperand, dt DType) []T {
	out := make([]T, m.rows*m.cols)
	size := dt.Size()
	if dt.IsFloat() && dt != Float64 {
		load := loadF32[dt]
		for i := range m.rows {
			for j := range m.cols {
				out[i*m.cols+j] = T(load(elemAddr(m.p, i*m.rs+j*m.cs, size)))
			}
		}
		return out
	}
	load := loadF64[dt]
	for i := range m.rows {
		for j := range m.cols {
			out[i*m.cols+j] = T(load(elemAddr(m.p, i*m.rs+j*m.cs, size)))
		}
	}
	return out
}

// gemmConvert computes c = a × b through row-major scratch buffers, for
// operands the BLAS cannot read in place: float16 and bfloat16 in float32,
// float64 in float64 (never narrowed).
// With stop, the product runs in tiles (gemmTiles).
func gemmConvert(g *gemm, dt DType, a, b, c matOperand, stop *atomic.Bool) {
	size := dt.Size()
	n, k, m := c.rows, a.cols, c.cols
	if dt == Float64 {
		ad, bd := widen[float64](a, dt), widen[float64](b, dt)
		cd := make([]float64, n*m)
		store := storeF64[dt]
		gemmTiles(stop, n, k, m, panelFlops(g), func(r0, r1, c0, c1 int) {
			g.dgemm(blas.NoTrans, blas.NoTrans, r1-r0, c1-c0, k, ad[r0*k:], k, bd[c0:], m, cd[r0*m+c0:], m)
			for i := r0; i < r1; i++ {
				for j := i*m + c0; j < i*m+c1; j++ {
					store(elemAddr(c.p, j, size), cd[j])
				}
			}
		})
		return
	}
	ad, bd := widen[float32](a, dt), widen[float32](b, dt)
	cd := make([]float32, n*m)
	store := storeF32[dt]
	gemmTiles(stop, n, k, m, panelFlops(g), func(r0, r1, c0, c1 int) {
		g.sgemm(blas.NoTrans, blas.NoTrans, r1-r0, c1-c0, k, ad[r0*k:], k, bd[c0:], m, cd[r0*m+c0:], m)
		for i := r0; i < r1; i++ {
			for j := i*m + c0; j < i*m+c1; j++ {
				store(elemAddr(c.p, j, size), cd[j])
			}
		}
	})
}

// gemmInt computes c = a × b exactly in int64 arithmetic (wrapping on
// overflow) for integer dtypes, storing into dt; rows of c in parallel.
func gemmInt(dt DType, a, b, c matOperand, stop *atomic.Bool) {
	size := dt.Size()
	load, store := loadI64[dt], storeI64[dt]
	bd := make([]int64, b.rows*b.cols) // b, row-major, read once per row of c
	for i := range b.rows {
		for j := range b.cols {
			bd[i*b.cols+j] = load(elemAddr(b.p, i*b.rs+j*b.cs, size))
		}
	}
	parallelForStop(stop, c.rows, max(1, parallelThreshold/max(1, a.cols*c.cols)), max(1, interruptGrain/max(1, a.cols*c.cols)), func(lo, hi int) {
		row := make([]int64, c.cols)
		for i := lo; i < hi; i++ {
			clear(row)
			for k := range a.cols {
				x := load(elemAddr(a.p, i*a.rs+k*a.cs, size))
				if x == 0 {
					continue
				}
				bk := bd[k*b.cols : (k+1)*b.cols]
				for j, y := range bk {
					row[j] += x * y
				}
			}
			for j, v := range row {
				store(elemAddr(c.p, i*c.cols+j, size), v)
			}
		}
	})
}

// batchedMatmul computes out[b] = a[b] × b[b] for every batch index. a and
// b are given with their batch strides broadcast to batch; out is
// contiguous with shape batch + [n, m].
//
// When out's Context is interrupted it stops between matrices and, in a
// large product, between panels of rows, leaving out partly written.
func batchedMatmul(dt DType, batch []int, a, b *Tensor, aSt, bSt []int, n, k, m int, out *Tensor) {
	nb := numel(batch)
	if nb == 0 || n == 0 || m == 0 {
		return
	}
	size := dt.Size()
	outP := elemAddr(out.mem.Pointer(), out.offset, size)
	if k == 0 {
		clear(unsafe.Slice((*byte)(outP), nb*n*m*size))
		return
	}
	ad, bd := len(a.shape), len(b.shape)
	ars, acs := a.strides[ad-2], a.strides[ad-1]
	brs, bcs := b.strides[bd-2], b.strides[bd-1]
	la, okA := blasLayout(n, k, ars, acs)
	lb, okB := blasLayout(k, m, brs, bcs)
	direct := (dt == Float32 || dt == Float64) && okA && okB
	g := currentGemm()
	aP, bP := a.mem.Pointer(), b.mem.Pointer()
	stop := out.ctx.stopFlag()
	one := func(i int) {
		if stop != nil && stop.Load() {
			return
		}
		aoff, boff := a.offset, b.offset
		rem := i
		for d := len(batch) - 1; d >= 0; d-- {
			x := rem % batch[d]
			rem /= batch[d]
			aoff += x * aSt[d]
			boff += x * bSt[d]
		}
		am := matOperand{p: elemAddr(aP, aoff, size), rows: n, cols: k, rs: ars, cs: acs}
		bm := matOperand{p: elemAddr(bP, boff, size), rows: k, cols: m, rs: brs, cs: bcs}
		cm := matOperand{p: elemAddr(outP, i*n*m, size), rows: n, cols: m, rs: m, cs: 1}
		switch {
		case direct:
			gemmTiles(stop, n, k, m, panelFlops(g), func(r0, r1, c0, c1 int) {
				gemmDirect(g, dt, tile(am, size, r0, r1, 0, k), tile(bm, size, 0, k, c0, c1), tile(cm, size, r0, r1, c0, c1), la, lb)
			})
		case dt.IsFloat():
			gemmConvert(g, dt, am, bm, cm, stop)
		default:
			gemmInt(dt, am, bm, cm, stop)
		}
	}
	// Large matrices: the BLAS parallelises each product; many small ones:
	// batches in parallel (with gonum, which is safe to call concurrently).
	if nb > 1 && n*k*m < 1<<21 {
		g = gonumGemm
		parallelFor(nb, 2, func(lo, hi int) {
			for i := lo; i < hi; i++ {
				one(i)
			}
		})
	} else {
		for i := range nb {
			one(i)
		}
	}
	runtime.KeepAlive(a)
	runtime.KeepAlive(b)
}
