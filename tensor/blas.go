package tensor

import (
	"fmt"
	"math"
	"os"
	"strings"
	"sync"
	"unsafe"

	"github.com/ebitengine/purego"
	"gonum.org/v1/gonum/blas"
	"gonum.org/v1/gonum/blas/blas32"
	"gonum.org/v1/gonum/blas/blas64"
)

// The BLAS behind matmul. When an optimised CBLAS library is installed
// (OpenBLAS: Debian's libopenblas0), it is loaded at run time with purego
// on the first matrix product, so neither the build nor CI needs it;
// otherwise gonum's pure-Go BLAS serves. The environment variable
// MEMSH_BLAS chooses: unset or "auto" tries libopenblas.so.0 and
// libopenblas.so; "gonum" forces gonum; anything else is the file name of
// a library exporting cblas_sgemm and cblas_dgemm (MKL, BLIS, ...), and if
// it cannot be loaded memsh falls back to gonum.
//
// Both compute C = op(A)·op(B) on row-major matrices in place (transposed
// operands are passed as transposed, without copies).

// gemm is one BLAS's pair of general matrix products.
type gemm struct {
	name  string // "gonum" or "openblas (/path/libopenblas.so.0)"
	sgemm func(ta, tb blas.Transpose, m, n, k int, a []float32, lda int, b []float32, ldb int, c []float32, ldc int)
	dgemm func(ta, tb blas.Transpose, m, n, k int, a []float64, lda int, b []float64, ldb int, c []float64, ldc int)
}

// stored returns the rows and columns of an operand as stored, for a
// product operand of rows × cols used with transpose t.
func stored(t blas.Transpose, rows, cols int) (int, int) {
	if t == blas.Trans {
		return cols, rows
	}
	return rows, cols
}

var gonumGemm = &gemm{
	name: "gonum",
	sgemm: func(ta, tb blas.Transpose, m, n, k int, a []float32, lda int, b []float32, ldb int, c []float32, ldc int) {
		ar, ac := stored(ta, m, k)
		br, bc := stored(tb, k, n)
		blas32.Gemm(ta, tb, 1,
			blas32.General{Rows: ar, Cols: ac, Stride: lda, Data: a},
			blas32.General{Rows: br, Cols: bc, Stride: ldb, Data: b},
			0, blas32.General{Rows: m, Cols: n, Stride: ldc, Data: c})
	},
	dgemm: func(ta, tb blas.Transpose, m, n, k int, a []float64, lda int, b []float64, ldb int, c []float64, ldc int) {
		ar, ac := stored(ta, m, k)
		br, bc := stored(tb, k, n)
		blas64.Gemm(ta, tb, 1,
			blas64.General{Rows: ar, Cols: ac, Stride: lda, Data: a},
			blas64.General{Rows: br, Cols: bc, Stride: ldb, Data: b},
			0, blas64.General{Rows: m, Cols: n, Stride: ldc, Data: c})
	},
}

var (
	blasOnce sync.Once
	blasImpl *gemm
	blasErr  error // why the requested library was not loaded (nil for gonum by choice)
)

// currentGemm returns the BLAS in use, loading it on first use.
func currentGemm() *gemm {
	blasOnce.Do(func() { blasImpl, blasErr = loadGemm(os.Getenv("MEMSH_BLAS")) })
	return blasImpl
}

// BLAS names the library behind matrix products ("gonum", or "openblas"
// with its path) and, when a requested library could not be loaded, why.
func BLAS() (name string, err error) {
	g := currentGemm()
	return g.name, blasErr
}

// CBLAS constants.
const (
	cblasRowMajor = 101
	cblasNoTrans  = 111
	cblasTrans    = 112
)

// loadGemm loads the BLAS chosen by the MEMSH_BLAS value spec.
func loadGemm(spec string) (*gemm, error) {
	var names []string
	switch spec {
	case "gonum":
		return gonumGemm, nil
	case "", "auto":
		names = []string{"libopenblas.so.0", "libopenblas.so"}
	default:
		names = []string{spec}
	}
	var errs []string
	for _, name := range names {
		g, err := loadCBLAS(name)
		if err == nil {
			return g, nil
		}
		errs = append(errs, err.Error())
	}
	err := fmt.Errorf("MEMSH_BLAS=%q: %s; using gonum", spec, strings.Join(errs, "; "))
	if spec == "" || spec == "auto" {
		err = nil // no optimised BLAS installed: gonum, as designed
	}
	return gonumGemm, err
}

// loadCBLAS opens a library with cblas_sgemm and cblas_dgemm.
func loadCBLAS(name string) (*gemm, error) {
	lib, err := purego.Dlopen(name, purego.RTLD_NOW|purego.RTLD_LOCAL)
	if err != nil {
		return nil, err
	}
	sym := func(s string) (uintptr, error) {
		p, err := purego.Dlsym(lib, s)
		if err != nil {
			return 0, fmt.Errorf("%s: %v", name, err)
		}
		return p, nil
	}
	sp, err := sym("cblas_sgemm")
	if err != nil {
		return nil, err
	}
	dp, err := sym("cblas_dgemm")
	if err != nil {
		return nil, err
	}
	var cs func(order, ta, tb, m, n, k int32, alpha float32, a unsafe.Pointer, lda int32, b unsafe.Pointer, ldb int32, beta float32, c unsafe.Pointer, ldc int32)
	var cd func(order, ta, tb, m, n, k int32, alpha float64, a unsafe.Pointer, lda int32, b unsafe.Pointer, ldb int32, beta float64, c unsafe.Pointer, ldc int32)
	purego.RegisterFunc(&cs, sp)
	purego.RegisterFunc(&cd, dp)
	label := name
	if strings.Contains(name, "openblas") {
		label = "openblas (" + name + ")"
	}
	g := &gemm{name: label}
	g.sgemm = func(ta, tb blas.Transpose, m, n, k int, a []float32, lda int, b []float32, ldb int, c []float32, ldc int) {
		if !fitsInt32(m, n, k, lda, ldb, ldc) {
			gonumGemm.sgemm(ta, tb, m, n, k, a, lda, b, ldb, c, ldc)
			return
		}
		cs(cblasRowMajor, cblasOp(ta), cblasOp(tb), int32(m), int32(n), int32(k), 1,
			unsafe.Pointer(unsafe.SliceData(a)), int32(lda), unsafe.Pointer(unsafe.SliceData(b)), int32(ldb), 0,
			unsafe.Pointer(unsafe.SliceData(c)), int32(ldc))
	}
	g.dgemm = func(ta, tb blas.Transpose, m, n, k int, a []float64, lda int, b []float64, ldb int, c []float64, ldc int) {
		if !fitsInt32(m, n, k, lda, ldb, ldc) {
			gonumGemm.dgemm(ta, tb, m, n, k, a, lda, b, ldb, c, ldc)
			return
		}
		cd(cblasRowMajor, cblasOp(ta), cblasOp(tb), int32(m), int32(n), int32(k), 1,
			unsafe.Pointer(unsafe.SliceData(a)), int32(lda), unsafe.Pointer(unsafe.SliceData(b)), int32(ldb), 0,
			unsafe.Pointer(unsafe.SliceData(c)), int32(ldc))
	}
	return g, nil
}

// cblasOp is the CBLAS code of a transpose flag.
func cblasOp(t blas.Transpose) int32 {
	if t == blas.Trans {
		return cblasTrans
	}
	return cblasNoTrans
}

// fitsInt32 reports whether every value fits CBLAS's 32-bit int.
func fitsInt32(v ...int) bool {
	for _, x := range v {
		if x > math.MaxInt32 {
			return false
		}
	}
	return true
}
