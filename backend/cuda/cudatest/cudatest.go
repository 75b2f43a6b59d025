// Package cudatest builds the stub CUDA driver (libcuda.so.1) and cuBLAS
// (libcublas.so.12) that memsh's tests load through the real binding path
// of backend/cuda, and reads the stub's counters. The stubs are C
// (testdata/stub_cuda.c with stub_state.h, testdata/stub_cublas.c) compiled with the system
// C compiler; the driver stub includes backend/cuda's kernels.cu, so kernel
// launches compute on the CPU what the embedded PTX computes on a GPU.
//
// Each New returns a fresh copy of the library (a new file, so a new
// instance with its own state, and a new backend/cuda Driver), configured
// through environment variables the stub reads at cuInit. Tests that use
// it cannot run in parallel (they set the environment).
package cudatest

/*
#cgo LDFLAGS: -ldl -lpthread
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>

static void *ct_open(const char *path) { return dlopen(path, RTLD_NOW | RTLD_LOCAL); }
static void *ct_sym(void *h, const char *name) { return dlsym(h, name); }
static const char *ct_err(void) { return dlerror(); }

static void ct_fail(void *f, const char *name, int code, int after, int times) {
	((void (*)(const char *, int, int, int))f)(name, code, after, times);
}
static int ct_calls(void *f, const char *name) { return ((int (*)(const char *))f)(name); }
static int ct_int(void *f) { return ((int (*)(void))f)(); }
static size_t ct_used(void *f, int ordinal) { return ((size_t (*)(int))f)(ordinal); }
static int ct_range(void *f, uintptr_t p, size_t n) { return ((int (*)(uintptr_t, size_t))f)(p, n); }
static int ct_launch(void *f, int i, char *name, int namelen, unsigned long long *params, unsigned *grid, unsigned *block) {
	return ((int (*)(int, char *, int, unsigned long long *, unsigned *, unsigned *))f)(i, name, namelen, params, grid, block);
}
static void ct_ints(void *f, int *out) { ((void (*)(int *))f)(out); }
static void ct_setint(void *f, int v) { ((void (*)(int))f)(v); }
// ct_raw_alloc_thread calls cuMemAlloc_v2 directly on a new thread, where
// no context was ever made current, and returns its result.
struct ct_raw { void *f; size_t n; int code; };
static void *ct_raw_run(void *arg) {
	struct ct_raw *r = arg;
	unsigned long long p = 0;
	r->code = ((int (*)(unsigned long long *, size_t))r->f)(&p, r->n);
	return NULL;
}
static int ct_raw_alloc_thread(void *f, size_t n) {
	struct ct_raw r = {f, n, -1};
	pthread_t th;
	if (pthread_create(&th, NULL, ct_raw_run, &r) != 0)
		return -1;
	pthread_join(th, NULL);
	return r.code;
}
*/
import "C"

import (
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"unsafe"

	"github.com/memsh/memsh/backend/cuda"
)

//go:embed testdata/stub_cuda.c testdata/stub_state.h testdata/stub_cublas.c
var sources embed.FS

// Config configures a stub. Zero values mean the stub's defaults.
type Config struct {
	GPUs      int    // number of devices (default 2, at most 8)
	Mem       uint64 // bytes per device (default 1 GiB)
	Ctx       uint64 // bytes a context takes when first retained (default 64 MiB; set NoCtx for 0)
	NoCtx     bool   // contexts take no memory
	NoPoison  bool   // do not fill new allocations with 0xA5 (faster for benchmarks)
	InitError int    // cuInit returns this code
	// Visible sets CUDA_VISIBLE_DEVICES when non-nil (the variable is
	// removed otherwise).
	Visible *string
	// Omit leaves driver entry points out of the library (to test a
	// driver that lacks one). Only cuMemAlloc_v2 can be omitted.
	Omit []string
	// NoBLAS leaves MEMSH_LIBCUBLAS pointing at a library that does not
	// exist.
	NoBLAS bool
}

// Stub is a loaded stub driver (and cuBLAS).
type Stub struct {
	LibCUDA   string // the driver stub's path: give it to cuda.Open
	LibCUBLAS string
	h, hb     unsafe.Pointer
}

// compiler returns the system C compiler, or skips the test.
func compiler(t testing.TB) string {
	for _, cc := range []string{os.Getenv("CC"), "cc", "gcc", "clang"} {
		if cc == "" {
			continue
		}
		if p, err := exec.LookPath(cc); err == nil {
			return p
		}
	}
	t.Skip("no C compiler (cc, gcc or clang) found: cannot build the stub libcuda.so.1 these tests load")
	return ""
}

var buildMu sync.Mutex

// build compiles the stubs for the omitted symbols into a cache directory
// named by a hash of the sources and flags, once.
func build(t testing.TB, omit []string) (cudaLib, blasLib string) {
	t.Helper()
	cc := compiler(t)
	stubCUDA, _ := sources.ReadFile("testdata/stub_cuda.c")
	stubState, _ := sources.ReadFile("testdata/stub_state.h")
	stubBLAS, _ := sources.ReadFile("testdata/stub_cublas.c")
	flags := []string{"-shared", "-fPIC", "-O2", "-ffp-contract=off", "-std=gnu11"}
	for _, o := range omit {
		flags = append(flags, "-DSTUB_OMIT_"+o)
	}
	h := sha256.New()
	for _, part := range []string{cc, strings.Join(flags, " "), string(stubCUDA), string(stubState), string(stubBLAS), cuda.KernelSource()} {
		io.WriteString(h, part)
		h.Write([]byte{0})
	}
	dir := filepath.Join(os.TempDir(), "memsh-cudastub-"+hex.EncodeToString(h.Sum(nil))[:16])
	cudaLib, blasLib = filepath.Join(dir, "libcuda.so.1"), filepath.Join(dir, "libcublas.so.12")

	buildMu.Lock()
	defer buildMu.Unlock()
	if _, err := os.Stat(blasLib); err == nil {
		return cudaLib, blasLib
	}
	work, err := os.MkdirTemp(os.TempDir(), "memsh-cudastub-build-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(work)
	for name, data := range map[string][]byte{"stub_cuda.c": stubCUDA, "stub_state.h": stubState, "stub_cublas.c": stubBLAS, "kernels.cu": []byte(cuda.KernelSource())} {
		if err := os.WriteFile(filepath.Join(work, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	run := func(args ...string) {
		cmd := exec.Command(cc, args...)
		cmd.Dir = work
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("building the stub: %s %s: %v\n%s", cc, strings.Join(args, " "), err, out)
		}
	}
	run(append(flags, "-I.", "-o", "libcuda.so.1", "stub_cuda.c", "-lpthread", "-lm")...)
	run(append(flags, "-o", "libcublas.so.12", "stub_cublas.c", "-ldl")...)
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		t.Fatal(err)
	}
	// Publish the pair atomically: another test process may race us.
	tmp := work + ".out"
	if err := os.Mkdir(tmp, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"libcuda.so.1", "libcublas.so.12"} {
		if err := os.Rename(filepath.Join(work, n), filepath.Join(tmp, n)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Rename(tmp, dir); err != nil {
		os.RemoveAll(tmp)
		if _, serr := os.Stat(blasLib); serr != nil {
			t.Fatalf("publishing the stub: %v", err)
		}
	}
	return cudaLib, blasLib
}

// New builds the stub if needed, copies it to a fresh path, sets the
// environment (MEMSH_LIBCUDA, MEMSH_LIBCUBLAS, the stub's settings and
// CUDA_VISIBLE_DEVICES) for the rest of the test, and loads it for its
// counters. The test then opens it with cuda.Open(s.LibCUDA) (or "").
func New(t testing.TB, cfg Config) *Stub {
	t.Helper()
	srcCUDA, srcBLAS := build(t, cfg.Omit)
	dir := t.TempDir()
	s := &Stub{LibCUDA: filepath.Join(dir, "libcuda.so.1"), LibCUBLAS: filepath.Join(dir, "libcublas.so.12")}
	for src, dst := range map[string]string{srcCUDA: s.LibCUDA, srcBLAS: s.LibCUBLAS} {
		data, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(dst, data, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	set := func(k string, v uint64, ok bool) {
		if ok {
			t.Setenv(k, strconv.FormatUint(v, 10))
		} else {
			t.Setenv(k, "")
		}
	}
	t.Setenv(cuda.LibraryEnv, s.LibCUDA)
	t.Setenv("MEMSH_STUB_LIBCUDA", s.LibCUDA)
	if cfg.NoBLAS {
		t.Setenv(cuda.BLASLibraryEnv, filepath.Join(dir, "missing", "libcublas.so.12"))
	} else {
		t.Setenv(cuda.BLASLibraryEnv, s.LibCUBLAS)
	}
	set("MEMSH_STUB_GPUS", uint64(cfg.GPUs), cfg.GPUs > 0)
	set("MEMSH_STUB_MEM", cfg.Mem, cfg.Mem > 0)
	set("MEMSH_STUB_CTX", cfg.Ctx, cfg.Ctx > 0 || cfg.NoCtx)
	set("MEMSH_STUB_POISON", 0, cfg.NoPoison)
	set("MEMSH_STUB_INIT", uint64(cfg.InitError), cfg.InitError != 0)
	if cfg.Visible != nil {
		t.Setenv("CUDA_VISIBLE_DEVICES", *cfg.Visible)
	} else {
		t.Setenv("CUDA_VISIBLE_DEVICES", "")
		os.Unsetenv("CUDA_VISIBLE_DEVICES") // t.Setenv restores the old value afterwards
	}
	s.h = open(t, s.LibCUDA)
	s.hb = open(t, s.LibCUBLAS)
	return s
}

func open(t testing.TB, path string) unsafe.Pointer {
	cp := C.CString(path)
	defer C.free(unsafe.Pointer(cp))
	h := C.ct_open(cp)
	if h == nil {
		t.Fatalf("dlopen %s: %s", path, C.GoString(C.ct_err()))
	}
	return h
}

func (s *Stub) sym(h unsafe.Pointer, name string) unsafe.Pointer {
	cn := C.CString(name)
	defer C.free(unsafe.Pointer(cn))
	f := C.ct_sym(h, cn)
	if f == nil {
		panic("cudatest: the stub has no " + name)
	}
	return f
}

// Fail makes the next `times` calls of the driver function name (such as
// "cuMemAlloc_v2") fail with code, after `after` more successful calls.
func (s *Stub) Fail(name string, code, after, times int) {
	cn := C.CString(name)
	defer C.free(unsafe.Pointer(cn))
	C.ct_fail(s.sym(s.h, "stub_fail"), cn, C.int(code), C.int(after), C.int(times))
}

// Calls returns how many times the driver function name was called.
func (s *Stub) Calls(name string) int {
	cn := C.CString(name)
	defer C.free(unsafe.Pointer(cn))
	return int(C.ct_calls(s.sym(s.h, "stub_calls"), cn))
}

// Used returns the bytes in use on CUDA ordinal i: contexts and live
// allocations.
func (s *Stub) Used(i int) uint64 { return uint64(C.ct_used(s.sym(s.h, "stub_used"), C.int(i))) }

// LiveAllocs returns the number of live device allocations (all devices).
func (s *Stub) LiveAllocs() int { return int(C.ct_int(s.sym(s.h, "stub_live_allocs"))) }

// InRange reports whether [p, p+n) lies in one live device allocation.
func (s *Stub) InRange(p uintptr, n uint64) bool {
	return C.ct_range(s.sym(s.h, "stub_check_range"), C.uintptr_t(p), C.size_t(n)) != 0
}

// Launch is one recorded kernel launch.
type Launch struct {
	Name        string
	Grid, Block uint32
	Params      []uint64 // the 8-byte parameter words
}

// Launches returns the kernel launches made so far (the most recent 64),
// oldest first.
func (s *Stub) Launches() []Launch {
	f := s.sym(s.h, "stub_launch_get")
	n := int(C.ct_int(s.sym(s.h, "stub_launch_count")))
	var out []Launch
	for i := max(0, n-64); i < n; i++ {
		var name [48]C.char
		var params [16]C.ulonglong
		var grid, block C.unsigned
		np := C.ct_launch(f, C.int(i), &name[0], C.int(len(name)), &params[0], &grid, &block)
		if np < 0 {
			continue
		}
		l := Launch{Name: C.GoString(&name[0]), Grid: uint32(grid), Block: uint32(block)}
		for j := range int(np) {
			l.Params = append(l.Params, uint64(params[j]))
		}
		out = append(out, l)
	}
	return out
}

// LaunchCount returns the number of kernel launches so far.
func (s *Stub) LaunchCount() int { return int(C.ct_int(s.sym(s.h, "stub_launch_count"))) }

// BLASCalls returns the number of successful cublasSgemm_v2 calls.
func (s *Stub) BLASCalls() int { return int(C.ct_int(s.sym(s.hb, "stub_blas_calls"))) }

// BLASLast returns the last Sgemm's transa, transb, m, n, k, lda, ldb, ldc.
func (s *Stub) BLASLast() [8]int {
	var a [8]C.int
	C.ct_ints(s.sym(s.hb, "stub_blas_last"), &a[0])
	var out [8]int
	for i := range a {
		out[i] = int(a[i])
	}
	return out
}

// BLASFail makes the next cublasSgemm_v2 return status.
func (s *Stub) BLASFail(status int) { C.ct_setint(s.sym(s.hb, "stub_blas_fail"), C.int(status)) }

// Current returns the CUDA ordinal of the context current on the calling
// OS thread, or -1 (lock the goroutine to its thread around the call and
// what it checks).
func (s *Stub) Current() int { return int(C.ct_int(s.sym(s.h, "stub_current"))) }

// RawAllocNewThread calls the stub's cuMemAlloc_v2 directly on a new OS
// thread, where no context was ever made current, and returns its CUresult
// (201, CUDA_ERROR_INVALID_CONTEXT, unless something is wrong).
func (s *Stub) RawAllocNewThread(n uint64) int {
	return int(C.ct_raw_alloc_thread(s.sym(s.h, "cuMemAlloc_v2"), C.size_t(n)))
}

// String describes the stub.
func (s *Stub) String() string { return fmt.Sprintf("stub %s", s.LibCUDA) }
