package tensor

import (
	"fmt"
	"runtime"
	"strings"
	"sync/atomic"
	"unsafe"

	"gonum.org/v1/gonum/blas"
)

// 2-D convolution as PyTorch 2.x runs it on CUDA (at::convolution →
// _convolution → cudnn_convolution, bias added in place afterwards; the
// backward is convolution_backward → cudnn_convolution_backward, then
// grad_output.sum for the bias). The device allocations are PyTorch's:
// forward the output only (plus input.contiguous() for a non-contiguous
// input, freed at the end of the op); backward grad_input, grad_weight,
// grad_bias in that order, as requested (plus contiguous copies of a
// non-contiguous grad_output / input, freed at the end).
//
// Not modelled: the cuDNN workspace. cudnn_convolution* take a workspace
// from the caching allocator whose size depends on the algorithm cuDNN or
// the benchmark heuristics pick (often zero, sometimes tens of MiB); memsh
// allocates none, so a real GPU may peak higher by that workspace inside
// the op.
//
// The CPU kernel is im2col (Go-heap scratch) and the engine's gemm, in
// float32 (float32, float16, bfloat16) or float64.

// ConvParams are conv2d's stride, padding, dilation (height, width) and
// groups.
type ConvParams struct {
	Stride, Padding, Dilation [2]int
	Groups                    int
}

// checkConv2d checks x [N, C, H, W], w [O, C/groups, KH, KW] and bias [O]
// as ATen's check_shape_forward and returns the output shape.
func checkConv2d(fname string, x, w, bias *Tensor, p ConvParams) ([]int, error) {
	for _, t := range []*Tensor{x, w, bias} {
		if t != nil {
			if err := t.checkLive(fname); err != nil {
				return nil, err
			}
		}
	}
	if p.Groups <= 0 {
		return nil, errorf(fname, "non-positive groups is not supported")
	}
	for i := range 2 {
		if p.Stride[i] <= 0 {
			return nil, errorf(fname, "non-positive stride is not supported")
		}
		if p.Padding[i] < 0 {
			return nil, errorf(fname, "negative padding is not supported")
		}
		if p.Dilation[i] <= 0 {
			return nil, errorf(fname, "dilation should be greater than zero")
		}
	}
	if len(x.shape) != 4 {
		return nil, errorf(fname, "Expected 3D (unbatched) or 4D (batched) input to conv2d, but got input of size: %s", sizeList(x.shape))
	}
	ws := w.shape
	if len(ws) != 4 {
		return nil, errorf(fname, "Expected %d-dimensional input for %d-dimensional weight %s, but got 4-dimensional input of size %s instead", len(ws), len(ws), sizeList(ws), sizeList(x.shape))
	}
	if ws[0] < p.Groups {
		return nil, errorf(fname, "Given groups=%d, expected weight to be at least %d at dimension 0, but got weight of size %s instead", p.Groups, p.Groups, sizeList(ws))
	}
	if ws[0]%p.Groups != 0 {
		return nil, errorf(fname, "Given groups=%d, expected weight to be divisible by %d at dimension 0, but got weight of size [%s] instead", p.Groups, p.Groups, sizeList(ws))
	}
	if x.shape[1] != ws[1]*p.Groups {
		return nil, errorf(fname, "Given groups=%d, weight of size %s, expected input%s to have %d channels, but got %d channels instead", p.Groups, sizeList(ws), sizeList(x.shape), ws[1]*p.Groups, x.shape[1])
	}
	if bias != nil && (len(bias.shape) != 1 || bias.shape[0] != ws[0]) {
		return nil, errorf(fname, "Given weight of size %s, expected bias to be 1-dimensional with %d elements, but got bias of size %s instead", sizeList(ws), ws[0], sizeList(bias.shape))
	}
	var in, k [2]int
	bad := false
	for i := range 2 {
		in[i] = x.shape[2+i] + 2*p.Padding[i]
		k[i] = p.Dilation[i]*(ws[2+i]-1) + 1
		if in[i] < k[i] {
			bad = true
		}
	}
	if bad {
		return nil, errorf(fname, "Calculated padded input size per channel: (%d x %d). Kernel size: (%d x %d). Kernel size can't be greater than actual input size", in[0], in[1], k[0], k[1])
	}
	for _, t := range []*Tensor{w, bias} {
		if t == nil {
			continue
		}
		if t.mem.Device() != x.mem.Device() {
			return nil, errorf(fname, "Expected all tensors to be on the same device, but found at least two devices, %s and %s!", x.mem.Device(), t.mem.Device())
		}
		if t.dtype != x.dtype {
			which := "weight"
			if t == bias {
				which = "bias"
			}
			return nil, errorf(fname, "Input type (%s) and %s type (%s) should be the same", x.dtype, which, t.dtype)
		}
	}
	if !x.dtype.IsFloat() {
		return nil, errorf(fname, "\"conv2d\" not implemented for '%s'", dtypeTitle(x.dtype))
	}
	oh := (in[0]-k[0])/p.Stride[0] + 1
	ow := (in[1]-k[1])/p.Stride[1] + 1
	return []int{x.shape[0], ws[0], oh, ow}, nil
}

// sizeList formats a shape as ATen's IntArrayRef: "[16, 3, 3, 3]".
func sizeList(shape []int) string {
	parts := make([]string, len(shape))
	for i, s := range shape {
		parts[i] = fmt.Sprint(s)
	}
	return "[" + strings.Join(parts, ", ") + "]"
}

// Conv2d is at::convolution for 2-D inputs: x [N, C, H, W], w [O, C/groups,
// KH, KW], bias [O] or nil; the result [N, O, OH, OW] has x's dtype.
func Conv2d(x, w, bias *Tensor, p ConvParams) (*Tensor, error) {
	const fname = "conv2d"
	if anyOnGPU(x, w, bias) {
		return stagedTensor(contextOf(x, w, bias), fname, []*Tensor{x, w, bias}, func(s *staging) (*Tensor, error) {
			return conv2d(fname, s.shadowOf(x), s.shadowOf(w), s.shadowOf(bias), p)
		})
	}
	return conv2d(fname, x, w, bias, p)
}

func conv2d(fname string, x, w, bias *Tensor, p ConvParams) (*Tensor, error) {
	shape, err := checkConv2d(fname, x, w, bias, p)
	if err != nil {
		return nil, err
	}
	// _convolution: input.contiguous() (a temporary for a strided input).
	xc, err := Contiguous(x)
	if err != nil {
		return nil, Renamed(err, fname)
	}
	out, err := newTensor(x.ctx, fname, x.mem.Device(), x.dtype, shape)
	if err != nil {
		return nil, err
	}
	if out.hasData() && out.Numel() > 0 {
		if x.dtype == Float64 {
			convForward[float64](xc, w, bias, out, p)
		} else {
			convForward[float32](xc, w, bias, out, p)
		}
	}
	runtime.KeepAlive(xc)
	if err := x.ctx.interrupted(fname); err != nil {
		return nil, err // out is dropped
	}
	return out, nil
}

// Conv2dBackward is convolution_backward: the gradients of x, w and bias
// from grad [N, O, OH, OW], each computed when mask says so (nil
// otherwise), allocated in that order.
func Conv2dBackward(g, x, w *Tensor, p ConvParams, mask [3]bool) (gi, gw, gb *Tensor, err error) {
	const fname = "convolution_backward"
	if anyOnGPU(g, x, w) {
		err = staged(contextOf(g, x, w), fname, []*Tensor{g, x, w}, func(s *staging) error {
			a, b, c, err := conv2dBackward(fname, s.shadowOf(g), s.shadowOf(x), s.shadowOf(w), p, mask)
			if err != nil {
				return err
			}
			if gi, err = s.back(fname, a); err != nil {
				return err
			}
			if gw, err = s.back(fname, b); err != nil {
				return err
			}
			gb, err = s.back(fname, c)
			return err
		})
		return gi, gw, gb, err
	}
	return conv2dBackward(fname, g, x, w, p, mask)
}

func conv2dBackward(fname string, g, x, w *Tensor, p ConvParams, mask [3]bool) (gi, gw, gb *Tensor, err error) {
	shape, err := checkConv2d(fname, x, w, nil, p)
	if err != nil {
		return nil, nil, nil, err
	}
	if !sameInts(g.shape, shape) {
		return nil, nil, nil, errorf(fname, "grad_output of size %s does not match the convolution's output size %s", SizeString(g.shape), SizeString(shape))
	}
	// What it makes is held from when it is made, so that a reclaim while
	// it makes the next (one that would raise a peak) reaches it instead of
	// asking the collector whether this op still holds it.
	defer x.ctx.Hold()()
	// cudnn_convolution_backward: grad_output.contiguous(); the input is
	// made contiguous only when the weight's gradient needs it.
	gc, err := Contiguous(g)
	if err != nil {
		return nil, nil, nil, Renamed(err, fname)
	}
	x.ctx.Hold(gc)
	xc := x
	if mask[1] {
		if xc, err = Contiguous(x); err != nil {
			return nil, nil, nil, Renamed(err, fname)
		}
		x.ctx.Hold(xc)
	}
	dev := x.mem.Device()
	if mask[0] {
		if gi, err = newTensor(x.ctx, fname, dev, x.dtype, x.shape); err != nil {
			return nil, nil, nil, err
		}
		x.ctx.Hold(gi)
	}
	if mask[1] {
		if gw, err = newTensor(x.ctx, fname, dev, w.dtype, w.shape); err != nil {
			return nil, nil, nil, err
		}
		x.ctx.Hold(gw)
	}
	if gi != nil && gi.hasData() || gw != nil && gw.hasData() {
		if x.dtype == Float64 {
			convBackward[float64](gc, xc, w, gi, gw, p)
		} else {
			convBackward[float32](gc, xc, w, gi, gw, p)
		}
	}
	runtime.KeepAlive(xc)
	if err := x.ctx.interrupted(fname); err != nil {
		return nil, nil, nil, err // gi and gw are dropped
	}
	if mask[2] {
		if gb, err = reduce(redSum, fname, gc, []int{0, 2, 3}, false, Undefined); err != nil {
			return nil, nil, nil, err
		}
	}
	runtime.KeepAlive(gc)
	return gi, gw, gb, nil
}

func sameInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// readFloats returns t's values in row-major order as a Go-heap slice
// (once t's Context is interrupted, the rest stays zero: see actReadF64).
func readFloats[T float32 | float64](t *Tensor) []T {
	n := t.Numel()
	out := make([]T, n)
	if n == 0 {
		return out
	}
	var zero T
	if t.isContiguous() && t.dtype.Size() == int(unsafe.Sizeof(zero)) && (t.dtype == Float32 || t.dtype == Float64) {
		copy(out, unsafe.Slice((*T)(unsafe.Add(t.mem.Pointer(), t.offset*t.dtype.Size())), n))
		runtime.KeepAlive(t)
		return out
	}
	load := loadF64[t.dtype]
	i := 0
	forEachElem(t, func(p elemPtr) bool {
		out[i] = T(load(p))
		i++
		return goOn(t.ctx, i) // interrupted: the rest stays zero (see actReadF64)
	})
	runtime.KeepAlive(t)
	return out
}

// writeFloats stores vals (row-major) into t.
func writeFloats[T float32 | float64](t *Tensor, vals []T) {
	if t.Numel() == 0 {
		return
	}
	var zero T
	if t.isContiguous() && t.dtype.Size() == int(unsafe.Sizeof(zero)) && (t.dtype == Float32 || t.dtype == Float64) {
		copy(unsafe.Slice((*T)(unsafe.Add(t.mem.Pointer(), t.offset*t.dtype.Size())), len(vals)), vals)
		runtime.KeepAlive(t)
		return
	}
	store := storeF64[t.dtype]
	i := 0
	forEachElem(t, func(p elemPtr) bool {
		store(p, float64(vals[i]))
		i++
		return true
	})
	runtime.KeepAlive(t)
}

// gemmStop is gemmT in tiles (gemmTiles) when stop is not nil, so that
// an interrupt stops a large product within a tile; the tiles' products
// are the ones one call computes with gonum, and within rounding of them
// with OpenBLAS (panelAlign).
func gemmStop[T float32 | float64](stop *atomic.Bool, ta, tb blas.Transpose, m, n, k int, a []T, lda int, b []T, ldb int, c []T, ldc int) {
	gemmTiles(stop, m, k, n, panelFlops(currentGemm()), func(r0, r1, c0, c1 int) {
		ar := r0 * lda // rows r0.. of op(a): rows of a, or its columns when transposed
		if ta == blas.Trans {
			ar = r0
		}
		bc := c0 // columns c0.. of op(b): columns of b, or its rows when transposed
		if tb == blas.Trans {
			bc = c0 * ldb
		}
		gemmT(ta, tb, r1-r0, c1-c0, k, a[ar:], lda, b[bc:], ldb, c[r0*ldc+c0:], ldc)
	})
}

// gemmT is c = op(a) × op(b) for T (c row-major m×n, overwritten).
func gemmT[T float32 | float64](ta, tb blas.Transpose, m, n, k int, a []T, lda int, b []T, ldb int, c []T, ldc int) {
	g := currentGemm()
	switch av := any(a).(type) {
	case []float32:
		g.sgemm(ta, tb, m, n, k, av, lda, any(b).([]float32), ldb, any(c).([]float32), ldc)
	case []float64:
		g.dgemm(ta, tb, m, n, k, av, lda, any(b).([]float64), ldb, any(c).([]float64), ldc)
	default:
		panic(fmt.Sprintf("gemmT: %T", a))
	}
}

// convGeom is the geometry of one convolution.
type convGeom struct {
	n, c, h, w     int // input
	o, kh, kw      int // weight
	oh, ow         int // output
	groups, cg, og int
	p              ConvParams
}

func geomOf(x, w *Tensor, p ConvParams) convGeom {
	g := convGeom{n: x.shape[0], c: x.shape[1], h: x.shape[2], w: x.shape[3],
		o: w.shape[0], kh: w.shape[2], kw: w.shape[3], groups: p.Groups, p: p}
	g.cg, g.og = g.c/p.Groups, g.o/p.Groups
	g.oh = (g.h+2*p.Padding[0]-p.Dilation[0]*(g.kh-1)-1)/p.Stride[0] + 1
	g.ow = (g.w+2*p.Padding[1]-p.Dilation[1]*(g.kw-1)-1)/p.Stride[1] + 1
	return g
}

// im2col fills col [cg·kh·kw, oh·ow] from channels [c0, c0+cg) of one
// image img [c, h, w].
func im2col[T float32 | float64](g convGeom, col, img []T, c0 int) {
	l := g.oh * g.ow
	for c := range g.cg {
		plane := img[(c0+c)*g.h*g.w:]
		for i := range g.kh {
			for j := range g.kw {
				row := col[((c*g.kh+i)*g.kw+j)*l:][:l]
				for y := range g.oh {
					iy := y*g.p.Stride[0] - g.p.Padding[0] + i*g.p.Dilation[0]
					r := row[y*g.ow:][:g.ow]
					if iy < 0 || iy >= g.h {
						clear(r)
						continue
					}
					src := plane[iy*g.w:][:g.w]
					for x := range g.ow {
						ix := x*g.p.Stride[1] - g.p.Padding[1] + j*g.p.Dilation[1]
						if ix < 0 || ix >= g.w {
							r[x] = 0
						} else {
							r[x] = src[ix]
						}
					}
				}
			}
		}
	}
}

// col2im adds col [cg·kh·kw, oh·ow] into channels [c0, c0+cg) of img.
func col2im[T float32 | float64](g convGeom, col, img []T, c0 int) {
	l := g.oh * g.ow
	for c := range g.cg {
		plane := img[(c0+c)*g.h*g.w:]
		for i := range g.kh {
			for j := range g.kw {
				row := col[((c*g.kh+i)*g.kw+j)*l:][:l]
				for y := range g.oh {
					iy := y*g.p.Stride[0] - g.p.Padding[0] + i*g.p.Dilation[0]
					if iy < 0 || iy >= g.h {
						continue
					}
					dst := plane[iy*g.w:][:g.w]
					r := row[y*g.ow:][:g.ow]
					for x := range g.ow {
						ix := x*g.p.Stride[1] - g.p.Padding[1] + j*g.p.Dilation[1]
						if ix >= 0 && ix < g.w {
							dst[ix] += r[x]
						}
					}
				}
			}
		}
	}
}

func convForward[T float32 | float64](x, w, bias, out *Tensor, p ConvParams) {
	g := geomOf(x, w, p)
	xs, ws := readFloats[T](x), readFloats[T](w)
	var bs []T
	if bias != nil {
		bs = readFloats[T](bias)
	}
	k, l := g.cg*g.kh*g.kw, g.oh*g.ow
	res := make([]T, g.n*g.o*l)
	col := make([]T, k*l)
	stop := out.ctx.stopFlag()
	for n := range g.n {
		if out.ctx.Interrupted() {
			return // the caller drops out
		}
		img := xs[n*g.c*g.h*g.w:]
		for gr := range g.groups {
			im2col(g, col, img, gr*g.cg)
			dst := res[(n*g.o+gr*g.og)*l:][:g.og*l]
			gemmStop(stop, blas.NoTrans, blas.NoTrans, g.og, l, k, ws[gr*g.og*k:], k, col, l, dst, l)
		}
		if bs != nil {
			for o := range g.o {
				r := res[(n*g.o+o)*l:][:l]
				for i := range r {
					r[i] += bs[o]
				}
			}
		}
	}
	writeFloats(out, res)
}

func convBackward[T float32 | float64](gout, x, w, gi, gw *Tensor, p ConvParams) {
	g := geomOf(x, w, p)
	gs, ws := readFloats[T](gout), readFloats[T](w)
	k, l := g.cg*g.kh*g.kw, g.oh*g.ow
	col := make([]T, k*l)
	stop := x.ctx.stopFlag()
	if gi != nil && gi.hasData() {
		dx := make([]T, g.n*g.c*g.h*g.w)
		for n := range g.n {
			if x.ctx.Interrupted() {
				return // the caller drops gi and gw
			}
			img := dx[n*g.c*g.h*g.w:]
			for gr := range g.groups {
				src := gs[(n*g.o+gr*g.og)*l:]
				gemmStop(stop, blas.Trans, blas.NoTrans, k, l, g.og, ws[gr*g.og*k:], k, src, l, col, l)
				col2im(g, col, img, gr*g.cg)
			}
		}
		writeFloats(gi, dx)
	}
	if gw != nil && gw.hasData() {
		xs := readFloats[T](x)
		dw := make([]T, g.o*k)
		tmp := make([]T, g.og*k)
		for n := range g.n {
			if x.ctx.Interrupted() {
				return
			}
			img := xs[n*g.c*g.h*g.w:]
			for gr := range g.groups {
				im2col(g, col, img, gr*g.cg)
				src := gs[(n*g.o+gr*g.og)*l:]
				// one call: in row panels, OpenBLAS sums this product's
				// long inner dimension in another order (TestConvTilesIdentical)
				gemmT(blas.NoTrans, blas.Trans, g.og, k, l, src, l, col, l, tmp, k)
				d := dw[gr*g.og*k:][:g.og*k]
				for i, v := range tmp {
					d[i] += v
				}
			}
		}
		writeFloats(gw, dw)
	}
}
