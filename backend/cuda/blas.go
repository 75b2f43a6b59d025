package cuda

import (
	"fmt"
	"math"
	"os"
	"sync"
	"unsafe"
)

// blasSymbols are cuBLAS's symbols in memsh_blas's member order.
var blasSymbols = [][]string{
	{"cublasCreate_v2"},
	{"cublasDestroy_v2"},
	{"cublasSgemm_v2"},
	{"cublasGetVersion_v2"},
}

// blasLibraries are the names tried when $MEMSH_LIBCUBLAS is not set.
var blasLibraries = []string{"libcublas.so.13", "libcublas.so.12", "libcublas.so.11", "libcublas.so"}

// BLASError is a failed cuBLAS call.
type BLASError struct {
	Op     string
	Status int // cublasStatus_t
}

func (e *BLASError) Error() string {
	names := map[int]string{
		1: "CUBLAS_STATUS_NOT_INITIALIZED", 3: "CUBLAS_STATUS_ALLOC_FAILED", 7: "CUBLAS_STATUS_INVALID_VALUE",
		8: "CUBLAS_STATUS_ARCH_MISMATCH", 11: "CUBLAS_STATUS_MAPPING_ERROR", 13: "CUBLAS_STATUS_EXECUTION_FAILED",
		14: "CUBLAS_STATUS_INTERNAL_ERROR", 15: "CUBLAS_STATUS_NOT_SUPPORTED", 16: "CUBLAS_STATUS_LICENSE_ERROR",
	}
	if n, ok := names[e.Status]; ok {
		return fmt.Sprintf("%s: %s", e.Op, n)
	}
	return fmt.Sprintf("%s: cuBLAS status %d", e.Op, e.Status)
}

// blasLibrary is a loaded libcublas.
type blasLibrary struct {
	path string
	tab  *blasTable
}

var (
	blasMu   sync.Mutex
	blasLibs = map[string]*blasLibrary{}
)

// loadBLAS loads libcublas: $MEMSH_LIBCUBLAS, or the first of
// blasLibraries the dynamic loader finds. Errors wrap ErrNoBLAS.
func loadBLAS() (*blasLibrary, error) {
	names := blasLibraries
	if p := os.Getenv(BLASLibraryEnv); p != "" {
		names = []string{p}
	}
	blasMu.Lock()
	defer blasMu.Unlock()
	var first error
	for _, name := range names {
		if b, ok := blasLibs[name]; ok {
			return b, nil
		}
		l, err := openLibrary(name)
		if err != nil {
			if first == nil {
				first = err
			}
			continue
		}
		tab, err := loadBLASTable(l)
		if err != nil {
			return nil, fmt.Errorf("%w: %v", ErrNoBLAS, err)
		}
		b := &blasLibrary{path: name, tab: tab}
		blasLibs[name] = b
		return b, nil
	}
	return nil, fmt.Errorf("%w: %v (set %s to libcublas's path)", ErrNoBLAS, first, BLASLibraryEnv)
}

// blasHandle is a device's cuBLAS handle.
type blasHandle struct {
	lib     *blasLibrary
	h       unsafe.Pointer
	version int
	err     error // why cuBLAS cannot be used on this device
}

// BLAS loads cuBLAS and creates the device's handle if that was not done
// yet, and returns the library's path and version (such as 120402), or an
// error wrapping ErrNoBLAS.
func (d *Device) BLAS() (path string, version int, err error) {
	b := d.blasFor()
	if b.err != nil {
		return "", 0, b.err
	}
	return b.lib.path, b.version, nil
}

func (d *Device) blasFor() *blasHandle {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.blas != nil {
		return d.blas
	}
	ctx, err := d.contextLocked()
	if err != nil {
		return &blasHandle{err: err} // not cached: the context may work later
	}
	lib, err := loadBLAS()
	if err != nil {
		d.blas = &blasHandle{err: err}
		return d.blas
	}
	h, v, err := d.drv.blasCreate(ctx, lib.tab)
	if err != nil {
		d.blas = &blasHandle{err: fmt.Errorf("%w: %s: %v", ErrNoBLAS, lib.path, err)}
		return d.blas
	}
	d.blas = &blasHandle{lib: lib, h: h, version: v}
	return d.blas
}

// Sgemm computes C = op(A)·op(B) in float32 with cuBLAS, in cuBLAS's
// column-major convention: op(A) is m×k, op(B) is k×n, C is m×n with
// leading dimension ldc; transA / transB select the transpose. It waits
// for the result. The error wraps ErrNoBLAS when cuBLAS is unavailable.
func (d *Device) Sgemm(transA, transB bool, m, n, k int, A uintptr, lda int, B uintptr, ldb int, C uintptr, ldc int) error {
	for _, v := range []int{m, n, k, lda, ldb, ldc} {
		if v < 0 || v > math.MaxInt32 {
			return fmt.Errorf("%s: cublasSgemm: dimension %d out of cuBLAS's int range", d.Name(), v)
		}
	}
	b := d.blasFor()
	if b.err != nil {
		return b.err
	}
	ctx, err := d.context()
	if err != nil {
		return err
	}
	if err := d.drv.blasSgemm(ctx, b.lib.tab, b.h, transA, transB, m, n, k, A, lda, B, ldb, C, ldc); err != nil {
		return fmt.Errorf("%s: %w", d.Name(), err)
	}
	return nil
}
