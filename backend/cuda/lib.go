package cuda

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext;
typedef void *CUmodule;
typedef void *CUfunction;
typedef unsigned long long CUdeviceptr;

// The driver entry points memsh uses, in the order of cuSymbols (lib.go).
// Every member is a function pointer, so the table is filled as an array.
typedef struct {
	CUresult (*cuInit)(unsigned int);
	CUresult (*cuDriverGetVersion)(int *);
	CUresult (*cuDeviceGetCount)(int *);
	CUresult (*cuDeviceGet)(CUdevice *, int);
	CUresult (*cuDeviceGetName)(char *, int, CUdevice);
	CUresult (*cuDeviceGetUuid)(unsigned char *, CUdevice);
	CUresult (*cuDeviceTotalMem)(size_t *, CUdevice);
	CUresult (*cuDeviceGetAttribute)(int *, int, CUdevice);
	CUresult (*cuDevicePrimaryCtxRetain)(CUcontext *, CUdevice);
	CUresult (*cuDevicePrimaryCtxRelease)(CUdevice);
	CUresult (*cuCtxSetCurrent)(CUcontext);
	CUresult (*cuCtxGetCurrent)(CUcontext *);
	CUresult (*cuCtxSynchronize)(void);
	CUresult (*cuMemAlloc)(CUdeviceptr *, size_t);
	CUresult (*cuMemFree)(CUdeviceptr);
	CUresult (*cuMemGetInfo)(size_t *, size_t *);
	CUresult (*cuMemsetD8)(CUdeviceptr, unsigned char, size_t);
	CUresult (*cuMemsetD16)(CUdeviceptr, unsigned short, size_t);
	CUresult (*cuMemsetD32)(CUdeviceptr, unsigned int, size_t);
	CUresult (*cuMemcpyHtoD)(CUdeviceptr, const void *, size_t);
	CUresult (*cuMemcpyDtoH)(void *, CUdeviceptr, size_t);
	CUresult (*cuMemcpyDtoD)(CUdeviceptr, CUdeviceptr, size_t);
	CUresult (*cuModuleLoadDataEx)(CUmodule *, const void *, unsigned int, int *, void **);
	CUresult (*cuModuleGetFunction)(CUfunction *, CUmodule, const char *);
	CUresult (*cuLaunchKernel)(CUfunction, unsigned int, unsigned int, unsigned int,
		unsigned int, unsigned int, unsigned int, unsigned int, void *, void **, void **);
	CUresult (*cuGetErrorName)(CUresult, const char **);
	CUresult (*cuGetErrorString)(CUresult, const char **);
} memsh_cu;

static int memsh_cu_nsyms(void) { return (int)(sizeof(memsh_cu) / sizeof(void *)); }

static void memsh_cu_set(memsh_cu *t, int i, void *fn) { ((void **)t)[i] = fn; }

static void *memsh_dlopen(const char *path, char *err, size_t errlen) {
	dlerror();
	void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!h) {
		const char *e = dlerror();
		strncpy(err, e ? e : "dlopen failed", errlen - 1);
		err[errlen - 1] = 0;
	}
	return h;
}

static void *memsh_dlsym(void *h, const char *name) { return dlsym(h, name); }

// Calls that need a context make ctx current on the calling OS thread first,
// within the same C call: the CUDA context is per thread, and a goroutine
// may run on any thread between two calls.
#define CTX(t, ctx) do { CUresult r_ = (t)->cuCtxSetCurrent(ctx); if (r_) return r_; } while (0)

static CUresult memsh_ctx_sync(memsh_cu *t, CUcontext ctx) { CTX(t, ctx); return t->cuCtxSynchronize(); }

static CUresult memsh_mem_alloc(memsh_cu *t, CUcontext ctx, CUdeviceptr *p, size_t n) {
	CTX(t, ctx);
	return t->cuMemAlloc(p, n);
}

static CUresult memsh_mem_free(memsh_cu *t, CUcontext ctx, CUdeviceptr p) { CTX(t, ctx); return t->cuMemFree(p); }

static CUresult memsh_mem_info(memsh_cu *t, CUcontext ctx, size_t *free, size_t *total) {
	CTX(t, ctx);
	return t->cuMemGetInfo(free, total);
}

static CUresult memsh_memset(memsh_cu *t, CUcontext ctx, CUdeviceptr p, int size, unsigned int v, size_t n) {
	CTX(t, ctx);
	switch (size) {
	case 1: return t->cuMemsetD8(p, (unsigned char)v, n);
	case 2: return t->cuMemsetD16(p, (unsigned short)v, n);
	}
	return t->cuMemsetD32(p, v, n);
}

static CUresult memsh_htod(memsh_cu *t, CUcontext ctx, CUdeviceptr dst, const void *src, size_t n) {
	CTX(t, ctx);
	return t->cuMemcpyHtoD(dst, src, n);
}

static CUresult memsh_dtoh(memsh_cu *t, CUcontext ctx, void *dst, CUdeviceptr src, size_t n) {
	CTX(t, ctx);
	return t->cuMemcpyDtoH(dst, src, n);
}

static CUresult memsh_dtod(memsh_cu *t, CUcontext ctx, CUdeviceptr dst, CUdeviceptr src, size_t n) {
	CTX(t, ctx);
	return t->cuMemcpyDtoD(dst, src, n);
}

// memsh_module_load loads a PTX image; the JIT's error log goes to log.
static CUresult memsh_module_load(memsh_cu *t, CUcontext ctx, CUmodule *mod, const char *image, char *log, size_t logsize) {
	CTX(t, ctx);
	int opts[2] = {5, 6}; // CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES
	void *vals[2] = {log, (void *)(uintptr_t)logsize};
	log[0] = 0;
	return t->cuModuleLoadDataEx(mod, image, 2, opts, vals);
}

static CUresult memsh_module_func(memsh_cu *t, CUcontext ctx, CUfunction *f, CUmodule mod, const char *name) {
	CTX(t, ctx);
	return t->cuModuleGetFunction(f, mod, name);
}

// memsh_launch launches f on a 1-D grid with its parameters packed in one
// buffer (CU_LAUNCH_PARAM_BUFFER_POINTER), then waits for it.
static CUresult memsh_launch(memsh_cu *t, CUcontext ctx, CUfunction f, unsigned int grid, unsigned int block,
		void *params, size_t size) {
	CTX(t, ctx);
	void *extra[] = {(void *)1, params, (void *)2, &size, (void *)0};
	CUresult r = t->cuLaunchKernel(f, grid, 1, 1, block, 1, 1, 0, NULL, NULL, extra);
	if (r)
		return r;
	return t->cuCtxSynchronize();
}

static CUresult memsh_retain(memsh_cu *t, CUcontext *ctx, CUdevice d) {
	CUresult r = t->cuDevicePrimaryCtxRetain(ctx, d);
	if (r)
		return r;
	return t->cuCtxSetCurrent(*ctx);
}

static CUresult memsh_current(memsh_cu *t, CUcontext *ctx) { return t->cuCtxGetCurrent(ctx); }

static CUresult memsh_init(memsh_cu *t) { return t->cuInit(0); }
static CUresult memsh_version(memsh_cu *t, int *v) { return t->cuDriverGetVersion(v); }
static CUresult memsh_count(memsh_cu *t, int *n) { return t->cuDeviceGetCount(n); }
static CUresult memsh_device(memsh_cu *t, int ordinal, CUdevice *d, char *name, int namelen,
		unsigned char *uuid, size_t *total, int *major, int *minor) {
	CUresult r = t->cuDeviceGet(d, ordinal);
	if (r) return r;
	if ((r = t->cuDeviceGetName(name, namelen, *d))) return r;
	if ((r = t->cuDeviceGetUuid(uuid, *d))) return r;
	if ((r = t->cuDeviceTotalMem(total, *d))) return r;
	if ((r = t->cuDeviceGetAttribute(major, 75, *d))) return r; // COMPUTE_CAPABILITY_MAJOR
	return t->cuDeviceGetAttribute(minor, 76, *d);
}

// cuBLAS entry points, in the order of blasSymbols (blas.go).
typedef struct {
	int (*create)(void **);
	int (*destroy)(void *);
	int (*sgemm)(void *, int, int, int, int, int, const float *, const float *, int,
		const float *, int, const float *, float *, int);
	int (*version)(void *, int *);
} memsh_blas;

static int memsh_blas_nsyms(void) { return (int)(sizeof(memsh_blas) / sizeof(void *)); }

static void memsh_blas_set(memsh_blas *t, int i, void *fn) { ((void **)t)[i] = fn; }

// The cuBLAS calls make the context current first (cuBLAS binds to the
// context current at each call); a failure to do so is returned in *cr
// with status -1.
static int memsh_blas_create(memsh_cu *t, CUcontext ctx, memsh_blas *b, void **h, int *version, CUresult *cr) {
	*cr = t->cuCtxSetCurrent(ctx);
	if (*cr)
		return -1;
	int s = b->create(h);
	if (s == 0 && b->version(*h, version) != 0)
		*version = 0;
	return s;
}

static int memsh_blas_sgemm(memsh_cu *t, CUcontext ctx, memsh_blas *b, void *h, int ta, int tb, int m, int n, int k,
		CUdeviceptr A, int lda, CUdeviceptr B, int ldb, CUdeviceptr C, int ldc, CUresult *cr) {
	*cr = t->cuCtxSetCurrent(ctx);
	if (*cr)
		return -1;
	float alpha = 1, beta = 0;
	int s = b->sgemm(h, ta, tb, m, n, k, &alpha, (const float *)(uintptr_t)A, lda, (const float *)(uintptr_t)B, ldb,
		&beta, (float *)(uintptr_t)C, ldc);
	if (s == 0)
		*cr = t->cuCtxSynchronize();
	return s;
}

static const char *memsh_err_name(memsh_cu *t, CUresult r) {
	const char *s = NULL;
	if (t->cuGetErrorName(r, &s) != 0)
		return NULL;
	return s;
}

static const char *memsh_err_string(memsh_cu *t, CUresult r) {
	const char *s = NULL;
	if (t->cuGetErrorString(r, &s) != 0)
		return NULL;
	return s;
}
*/
import "C"

import (
	"errors"
	"fmt"
	"unsafe"

	"github.com/memsh/memsh/backend"
)

// cuSymbols are the driver's symbols in memsh_cu's member order. Where a
// versioned symbol exists, the preferred name comes first and the others
// are fallbacks for older drivers.
var cuSymbols = [][]string{
	{"cuInit"},
	{"cuDriverGetVersion"},
	{"cuDeviceGetCount"},
	{"cuDeviceGet"},
	{"cuDeviceGetName"},
	{"cuDeviceGetUuid_v2", "cuDeviceGetUuid"},
	{"cuDeviceTotalMem_v2"},
	{"cuDeviceGetAttribute"},
	{"cuDevicePrimaryCtxRetain"},
	{"cuDevicePrimaryCtxRelease_v2", "cuDevicePrimaryCtxRelease"},
	{"cuCtxSetCurrent"},
	{"cuCtxGetCurrent"},
	{"cuCtxSynchronize"},
	{"cuMemAlloc_v2"},
	{"cuMemFree_v2"},
	{"cuMemGetInfo_v2"},
	{"cuMemsetD8_v2"},
	{"cuMemsetD16_v2"},
	{"cuMemsetD32_v2"},
	{"cuMemcpyHtoD_v2"},
	{"cuMemcpyDtoH_v2"},
	{"cuMemcpyDtoD_v2"},
	{"cuModuleLoadDataEx"},
	{"cuModuleGetFunction"},
	{"cuLaunchKernel"},
	{"cuGetErrorName"},
	{"cuGetErrorString"},
}

// cuTable is the driver's entry points, in C memory.
type cuTable = C.memsh_cu

// library is a dlopen'ed shared library.
type library struct {
	path   string
	handle unsafe.Pointer
}

// openLibrary dlopens path (a file name is searched as the dynamic loader
// does).
func openLibrary(path string) (*library, error) {
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	var buf [512]C.char
	h := C.memsh_dlopen(cpath, &buf[0], C.size_t(len(buf)))
	if h == nil {
		return nil, errors.New(C.GoString(&buf[0]))
	}
	return &library{path: path, handle: h}, nil
}

// sym returns the address of the first of names the library has, and the
// name found.
func (l *library) sym(names ...string) (unsafe.Pointer, string) {
	for _, n := range names {
		cn := C.CString(n)
		p := C.memsh_dlsym(l.handle, cn)
		C.free(unsafe.Pointer(cn))
		if p != nil {
			return p, n
		}
	}
	return nil, ""
}

// loadTable resolves every driver symbol into a table in C memory.
func loadTable(l *library) (*cuTable, error) {
	if int(C.memsh_cu_nsyms()) != len(cuSymbols) {
		panic("cuda: symbol table out of sync with memsh_cu")
	}
	t := (*C.memsh_cu)(C.calloc(1, C.size_t(unsafe.Sizeof(C.memsh_cu{}))))
	for i, names := range cuSymbols {
		p, _ := l.sym(names...)
		if p == nil {
			C.free(unsafe.Pointer(t))
			return nil, fmt.Errorf("%s has no symbol %s (a driver older than CUDA 11.4?)", l.path, names[0])
		}
		C.memsh_cu_set(t, C.int(i), p)
	}
	return t, nil
}

// result converts a CUresult to an error (nil for CUDA_SUCCESS).
func (d *Driver) result(op string, r C.CUresult) error {
	if r == 0 {
		return nil
	}
	e := &Error{Op: op, Code: int(r)}
	if s := C.memsh_err_name(d.tab, r); s != nil {
		e.Name = C.GoString(s)
	}
	if s := C.memsh_err_string(d.tab, r); s != nil {
		e.Message = C.GoString(s)
	}
	if e.Name == "" {
		e.Name, e.Message = builtinErrorText(int(r))
	}
	return e
}

// The driver calls, with C types kept in this file. Context, module and
// function handles are driver pointers held as unsafe.Pointer.

func (d *Driver) initDriver() error { return d.result("cuInit", C.memsh_init(d.tab)) }

func (d *Driver) driverVersion() (int, error) {
	var v C.int
	err := d.result("cuDriverGetVersion", C.memsh_version(d.tab, &v))
	return int(v), err
}

func (d *Driver) deviceCount() (int, error) {
	var n C.int
	err := d.result("cuDeviceGetCount", C.memsh_count(d.tab, &n))
	return int(n), err
}

// deviceProps are what the driver says about a device without a context.
type deviceProps struct {
	handle       int32
	name         string
	uuid         [16]byte
	total        uint64
	major, minor int
}

func (d *Driver) deviceProps(ordinal int) (deviceProps, error) {
	var (
		dev          C.CUdevice
		name         [256]C.char
		uuid         [16]C.uchar
		total        C.size_t
		major, minor C.int
	)
	r := C.memsh_device(d.tab, C.int(ordinal), &dev, &name[0], C.int(len(name)), &uuid[0], &total, &major, &minor)
	if err := d.result(fmt.Sprintf("cuDeviceGet(%d)", ordinal), r); err != nil {
		return deviceProps{}, err
	}
	p := deviceProps{handle: int32(dev), name: C.GoString(&name[0]), total: uint64(total), major: int(major), minor: int(minor)}
	for i := range uuid {
		p.uuid[i] = byte(uuid[i])
	}
	return p, nil
}

func (d *Driver) retainPrimary(dev int32) (unsafe.Pointer, error) {
	var ctx C.CUcontext
	err := d.result("cuDevicePrimaryCtxRetain", C.memsh_retain(d.tab, &ctx, C.CUdevice(dev)))
	return unsafe.Pointer(ctx), err
}

// currentContext returns the context current on the calling OS thread.
func (d *Driver) currentContext() (unsafe.Pointer, error) {
	var ctx C.CUcontext
	err := d.result("cuCtxGetCurrent", C.memsh_current(d.tab, &ctx))
	return unsafe.Pointer(ctx), err
}

func (d *Driver) synchronize(ctx unsafe.Pointer) error {
	return d.result("cuCtxSynchronize", C.memsh_ctx_sync(d.tab, C.CUcontext(ctx)))
}

func (d *Driver) memAlloc(ctx unsafe.Pointer, n uint64) (uintptr, error) {
	var p C.CUdeviceptr
	r := C.memsh_mem_alloc(d.tab, C.CUcontext(ctx), &p, C.size_t(n))
	return uintptr(p), d.result(fmt.Sprintf("cuMemAlloc(%s)", backend.FormatSize(n)), r)
}

func (d *Driver) memFree(ctx unsafe.Pointer, p uintptr) error {
	return d.result(fmt.Sprintf("cuMemFree(%#x)", p), C.memsh_mem_free(d.tab, C.CUcontext(ctx), C.CUdeviceptr(p)))
}

func (d *Driver) memInfo(ctx unsafe.Pointer) (free, total uint64, err error) {
	var f, t C.size_t
	err = d.result("cuMemGetInfo", C.memsh_mem_info(d.tab, C.CUcontext(ctx), &f, &t))
	return uint64(f), uint64(t), err
}

func (d *Driver) memset(ctx unsafe.Pointer, p uintptr, size int, v uint32, n uint64) error {
	return d.result(fmt.Sprintf("cuMemsetD%d", size*8), C.memsh_memset(d.tab, C.CUcontext(ctx), C.CUdeviceptr(p), C.int(size), C.uint(v), C.size_t(n)))
}

func (d *Driver) htod(ctx unsafe.Pointer, dst uintptr, src unsafe.Pointer, n uint64) error {
	return d.result("cuMemcpyHtoD", C.memsh_htod(d.tab, C.CUcontext(ctx), C.CUdeviceptr(dst), src, C.size_t(n)))
}

func (d *Driver) dtoh(ctx unsafe.Pointer, dst unsafe.Pointer, src uintptr, n uint64) error {
	return d.result("cuMemcpyDtoH", C.memsh_dtoh(d.tab, C.CUcontext(ctx), dst, C.CUdeviceptr(src), C.size_t(n)))
}

func (d *Driver) dtod(ctx unsafe.Pointer, dst, src uintptr, n uint64) error {
	return d.result("cuMemcpyDtoD", C.memsh_dtod(d.tab, C.CUcontext(ctx), C.CUdeviceptr(dst), C.CUdeviceptr(src), C.size_t(n)))
}

// moduleLoad loads a PTX image (NUL-terminated) and returns the module and
// the JIT's error log.
func (d *Driver) moduleLoad(ctx unsafe.Pointer, image string) (unsafe.Pointer, string, error) {
	cimg := C.CString(image)
	defer C.free(unsafe.Pointer(cimg))
	log := (*C.char)(C.calloc(8192, 1))
	defer C.free(unsafe.Pointer(log))
	var mod C.CUmodule
	err := d.result("cuModuleLoadDataEx", C.memsh_module_load(d.tab, C.CUcontext(ctx), &mod, cimg, log, 8192))
	return unsafe.Pointer(mod), C.GoString(log), err
}

func (d *Driver) moduleFunc(ctx, mod unsafe.Pointer, name string) (unsafe.Pointer, error) {
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	var f C.CUfunction
	err := d.result("cuModuleGetFunction("+name+")", C.memsh_module_func(d.tab, C.CUcontext(ctx), &f, C.CUmodule(mod), cname))
	return unsafe.Pointer(f), err
}

// launch runs f with 8-byte parameter words on a 1-D grid and waits for it.
func (d *Driver) launch(ctx, f unsafe.Pointer, name string, grid, block uint32, params []uint64) error {
	var p unsafe.Pointer
	if len(params) > 0 {
		p = unsafe.Pointer(&params[0])
	}
	r := C.memsh_launch(d.tab, C.CUcontext(ctx), C.CUfunction(f), C.uint(grid), C.uint(block), p, C.size_t(8*len(params)))
	return d.result("cuLaunchKernel("+name+")", r)
}

// blasTable is cuBLAS's entry points, in C memory.
type blasTable = C.memsh_blas

func loadBLASTable(l *library) (*blasTable, error) {
	if int(C.memsh_blas_nsyms()) != len(blasSymbols) {
		panic("cuda: symbol table out of sync with memsh_blas")
	}
	t := (*blasTable)(C.calloc(1, C.size_t(unsafe.Sizeof(C.memsh_blas{}))))
	for i, names := range blasSymbols {
		p, _ := l.sym(names...)
		if p == nil {
			C.free(unsafe.Pointer(t))
			return nil, fmt.Errorf("%s has no symbol %s", l.path, names[0])
		}
		C.memsh_blas_set(t, C.int(i), p)
	}
	return t, nil
}

// blasCreate creates a cuBLAS handle in ctx and returns it with cuBLAS's
// version.
func (d *Driver) blasCreate(ctx unsafe.Pointer, b *blasTable) (unsafe.Pointer, int, error) {
	var h unsafe.Pointer
	var version C.int
	var cr C.CUresult
	s := C.memsh_blas_create(d.tab, C.CUcontext(ctx), b, &h, &version, &cr)
	if s == -1 {
		return nil, 0, d.result("cuCtxSetCurrent", cr)
	}
	if s != 0 {
		return nil, 0, &BLASError{Op: "cublasCreate", Status: int(s)}
	}
	return h, int(version), nil
}

// blasSgemm runs cublasSgemm (alpha 1, beta 0) and waits for it.
func (d *Driver) blasSgemm(ctx unsafe.Pointer, b *blasTable, h unsafe.Pointer, ta, tb bool, m, n, k int, A uintptr, lda int, B uintptr, ldb int, Cp uintptr, ldc int) error {
	var cr C.CUresult
	s := C.memsh_blas_sgemm(d.tab, C.CUcontext(ctx), b, h, C.int(b64(ta)), C.int(b64(tb)), C.int(m), C.int(n), C.int(k),
		C.CUdeviceptr(A), C.int(lda), C.CUdeviceptr(B), C.int(ldb), C.CUdeviceptr(Cp), C.int(ldc), &cr)
	if s == -1 {
		return d.result("cuCtxSetCurrent", cr)
	}
	if s != 0 {
		return &BLASError{Op: "cublasSgemm", Status: int(s)}
	}
	return d.result("cuCtxSynchronize after cublasSgemm", cr)
}
