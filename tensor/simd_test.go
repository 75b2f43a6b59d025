package tensor

import (
	mrand "math/rand/v2"
	"testing"
	"unsafe"

	"gonum.org/v1/gonum/blas"
)

// opRef is the scalar definition the vectorised loops must match.
func opRef[T floatT](op BinaryOp, x, y T) T {
	switch op {
	case OpAdd:
		return x + y
	case OpSub:
		return x - y
	case OpMul:
		return x * y
	}
	return x / y
}

// testBinarySIMD checks binFloat (which hands runs of simdMin or more
// contiguous elements to the C loops) against opRef for every op, operand
// mode, streaming choice, length around the vector widths and the
// streaming block, and output misalignment.
func testBinarySIMD[T floatT](t *testing.T) {
	sz := int(unsafe.Sizeof(T(0)))
	rng := mrand.New(mrand.NewPCG(1, 2))
	const maxN = 1200 // more than one 4 KiB streaming block of float32
	a, b := make([]T, maxN+8), make([]T, maxN+8)
	for i := range a {
		a[i] = T(rng.NormFloat64() * 100)
		b[i] = T(rng.NormFloat64()*100 + 0.5)
	}
	for _, n := range []int{0, 1, 7, 63, 64, 65, 100, 1023, 1024, 1025, maxN} {
		for _, skew := range []int{0, 1, 3} { // misalign the output and inputs
			for op := OpAdd; op <= OpDiv; op++ {
				for mode := modeVV; mode <= modeSV; mode++ {
					for _, stream := range []bool{false, true} {
						out := make([]T, n+8)
						sa, sb := sz, sz
						if mode == modeVS {
							sb = 0
						}
						if mode == modeSV {
							sa = 0
						}
						o := unsafe.Pointer(&out[skew])
						pa, pb := unsafe.Pointer(&a[skew]), unsafe.Pointer(&b[(skew+1)%3])
						binFloat[T](op, n, o, sz, pa, sa, pb, sb, stream)
						for i := range n {
							x, y := a[skew], b[(skew+1)%3]
							if sa != 0 {
								x = a[skew+i]
							}
							if sb != 0 {
								y = b[(skew+1)%3+i]
							}
							if got, want := out[skew+i], opRef(op, x, y); got != want {
								t.Fatalf("%T op %d mode %d stream %v n %d skew %d: element %d = %v, want %v", T(0), op, mode, stream, n, skew, i, got, want)
							}
						}
						for i := skew + n; i < len(out); i++ {
							if out[i] != 0 {
								t.Fatalf("%T op %d mode %d n %d: wrote past the end (element %d)", T(0), op, mode, n, i)
							}
						}
					}
				}
			}
		}
	}
}

func TestBinarySIMD(t *testing.T) {
	t.Run("float32", testBinarySIMD[float32])
	t.Run("float64", testBinarySIMD[float64])
}

// TestBinarySIMDInPlace checks the loops with the output being the first
// input (in-place ops), streamed and not.
func TestBinarySIMDInPlace(t *testing.T) {
	for _, stream := range []bool{false, true} {
		n := 3000
		a, b := make([]float32, n), make([]float32, n)
		for i := range a {
			a[i], b[i] = float32(i), float32(2*i+1)
		}
		binFloat[float32](OpMul, n, unsafe.Pointer(&a[0]), 4, unsafe.Pointer(&a[0]), 4, unsafe.Pointer(&b[0]), 4, stream)
		for i := range a {
			if want := float32(i) * float32(2*i+1); a[i] != want {
				t.Fatalf("stream %v: a[%d] = %v, want %v", stream, i, a[i], want)
			}
		}
	}
}

func TestSumSIMD(t *testing.T) {
	for _, n := range []int{64, 65, 1000, 4097} {
		f32, f64 := make([]float32, n), make([]float64, n)
		var want float64
		for i := range n {
			f32[i], f64[i] = float32(i%17)-3.25, float64(i%13)+0.125
			want += float64(f32[i])
		}
		if got := sumRunF(unsafe.Pointer(&f32[0]), n, 4, Float32); got != want {
			t.Errorf("float32 sum of %d: %v, want %v", n, got, want)
		}
		want = 0
		for _, v := range f64 {
			want += v
		}
		if got := sumRunF(unsafe.Pointer(&f64[0]), n, 8, Float64); got != want {
			t.Errorf("float64 sum of %d: %v, want %v", n, got, want)
		}
	}
}

func TestFill32SIMD(t *testing.T) {
	buf := make([]uint32, 200)
	fill32SIMD(unsafe.Pointer(&buf[3]), 0xdeadbeef, 190)
	for i, v := range buf {
		want := uint32(0)
		if i >= 3 && i < 193 {
			want = 0xdeadbeef
		}
		if v != want {
			t.Fatalf("buf[%d] = %#x, want %#x", i, v, want)
		}
	}
}

func TestLastLevelCache(t *testing.T) {
	if n := lastLevelCache(12345); n != 12345 && n < 64<<10 {
		t.Errorf("last-level cache %d bytes: implausible", n)
	}
}

// naiveGemm is the reference matrix product of row-major op(a) (m×k) and
// op(b) (k×n) in float64.
func naiveGemm(ta, tb blas.Transpose, m, n, k int, a []float64, lda int, b []float64, ldb int) []float64 {
	at := func(i, j int) float64 {
		if ta == blas.Trans {
			return a[j*lda+i]
		}
		return a[i*lda+j]
	}
	bt := func(i, j int) float64 {
		if tb == blas.Trans {
			return b[j*ldb+i]
		}
		return b[i*ldb+j]
	}
	c := make([]float64, m*n)
	for i := range m {
		for j := range n {
			var s float64
			for p := range k {
				s += at(i, p) * bt(p, j)
			}
			c[i*n+j] = s
		}
	}
	return c
}

// TestGemmImplementations checks gonum and, where it is installed, the
// dynamically loaded OpenBLAS against naiveGemm with every transpose and
// padded leading dimensions. (Without libopenblas the OpenBLAS half is
// reported as not run.)
func TestGemmImplementations(t *testing.T) {
	impls := []*gemm{gonumGemm}
	if g, err := loadCBLAS("libopenblas.so.0"); err == nil {
		impls = append(impls, g)
	} else {
		t.Logf("OpenBLAS not installed here, only gonum checked: %v", err)
	}
	rng := mrand.New(mrand.NewPCG(3, 4))
	for _, g := range impls {
		for _, sz := range [][3]int{{1, 1, 1}, {3, 5, 7}, {64, 33, 17}, {130, 70, 90}} {
			m, n, k := sz[0], sz[1], sz[2]
			for _, ta := range []blas.Transpose{blas.NoTrans, blas.Trans} {
				for _, tb := range []blas.Transpose{blas.NoTrans, blas.Trans} {
					ar, ac := m, k
					if ta == blas.Trans {
						ar, ac = k, m
					}
					br, bc := k, n
					if tb == blas.Trans {
						br, bc = n, k
					}
					lda, ldb := ac+3, bc+1
					a64, b64 := make([]float64, ar*lda), make([]float64, br*ldb)
					for i := range a64 {
						a64[i] = float64(rng.IntN(9) - 4)
					}
					for i := range b64 {
						b64[i] = float64(rng.IntN(9) - 4)
					}
					want := naiveGemm(ta, tb, m, n, k, a64, lda, b64, ldb)
					a32, b32 := make([]float32, len(a64)), make([]float32, len(b64))
					for i, v := range a64 {
						a32[i] = float32(v)
					}
					for i, v := range b64 {
						b32[i] = float32(v)
					}
					c32, c64 := make([]float32, m*n), make([]float64, m*n)
					g.sgemm(ta, tb, m, n, k, a32, lda, b32, ldb, c32, n)
					g.dgemm(ta, tb, m, n, k, a64, lda, b64, ldb, c64, n)
					for i := range want {
						if float64(c32[i]) != want[i] || c64[i] != want[i] {
							t.Fatalf("%s %v%v %v: element %d: sgemm %v dgemm %v, want %v", g.name, ta, tb, sz, i, c32[i], c64[i], want[i])
						}
					}
				}
			}
		}
	}
}

func TestLoadGemm(t *testing.T) {
	if g, err := loadGemm("gonum"); g != gonumGemm || err != nil {
		t.Errorf(`loadGemm("gonum") = %s, %v`, g.name, err)
	}
	g, err := loadGemm("/nonexistent/libblas.so")
	if g != gonumGemm || err == nil {
		t.Errorf("loadGemm of a missing library = %s, %v; want gonum and an error", g.name, err)
	}
	if g, err := loadGemm("libc.so.6"); g != gonumGemm || err == nil {
		t.Errorf("loadGemm of a library without cblas_sgemm = %s, %v; want gonum and an error", g.name, err)
	}
	if g, err := loadGemm(""); err != nil || g == nil {
		t.Errorf(`loadGemm("") = %v, %v: want a BLAS and no error`, g, err)
	}
}
