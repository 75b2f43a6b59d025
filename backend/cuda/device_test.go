package cuda_test

import (
	"errors"
	"os"
	"strings"
	"testing"
	"unsafe"

	"github.com/memsh/memsh/backend"
	"github.com/memsh/memsh/backend/cuda"
	"github.com/memsh/memsh/backend/cuda/cudatest"
)

const mib = 1 << 20

// open loads a fresh stub driver.
func open(t *testing.T, cfg cudatest.Config) (*cudatest.Stub, *cuda.Driver) {
	t.Helper()
	s := cudatest.New(t, cfg)
	d, err := cuda.Open(s.LibCUDA)
	if err != nil {
		t.Fatal(err)
	}
	return s, d
}

func TestOpenMissingLibrary(t *testing.T) {
	_, err := cuda.Open("/nonexistent/libcuda.so.1")
	if !errors.Is(err, cuda.ErrUnavailable) {
		t.Fatalf("err = %v", err)
	}
	for _, want := range []string{"CUDA driver unavailable", "/nonexistent/libcuda.so.1", "No such file", "is the NVIDIA driver installed", "MEMSH_LIBCUDA"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
}

func TestOpenNotALibrary(t *testing.T) {
	p := t.TempDir() + "/libcuda.so.1"
	os.WriteFile(p, []byte("#!/bin/sh\n"), 0o755)
	_, err := cuda.Open(p)
	if !errors.Is(err, cuda.ErrUnavailable) || !strings.Contains(err.Error(), p) {
		t.Fatalf("err = %v", err)
	}
}

func TestOpenMissingSymbol(t *testing.T) {
	s := cudatest.New(t, cudatest.Config{Omit: []string{"cuMemAlloc_v2"}})
	_, err := cuda.Open(s.LibCUDA)
	if !errors.Is(err, cuda.ErrUnavailable) || !strings.Contains(err.Error(), "has no symbol cuMemAlloc_v2") {
		t.Fatalf("err = %v", err)
	}
}

func TestOpenInitFailures(t *testing.T) {
	for _, tc := range []struct {
		cfg  cudatest.Config
		want string
	}{
		{cudatest.Config{InitError: 100}, "cuInit: no CUDA-capable device is detected (CUDA_ERROR_NO_DEVICE)"},
		{cudatest.Config{InitError: 34}, "CUDA driver is a stub library"},
		{cudatest.Config{InitError: 12345}, "cuInit: CUDA error 12345"},
		{cudatest.Config{Visible: new("")}, `(CUDA_VISIBLE_DEVICES="")`},
		{cudatest.Config{Visible: new("7")}, `(CUDA_VISIBLE_DEVICES="7")`},
	} {
		s := cudatest.New(t, tc.cfg)
		_, err := cuda.Open(s.LibCUDA)
		if !errors.Is(err, cuda.ErrUnavailable) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: err = %v, want %q", tc.cfg, err, tc.want)
		}
	}
}

func TestDevices(t *testing.T) {
	s, drv := open(t, cudatest.Config{GPUs: 3, Mem: 512 * mib, Ctx: 48 * mib})
	if again, err := cuda.Open(s.LibCUDA); err != nil || again != drv {
		t.Errorf("Open again: %p %v, want the same driver", again, err)
	}
	if drv.Version() != 12040 || drv.VersionString() != "12.4" || drv.Path() != s.LibCUDA {
		t.Errorf("version %d %q path %q", drv.Version(), drv.VersionString(), drv.Path())
	}
	devs := drv.Devices()
	if len(devs) != 3 {
		t.Fatalf("%d devices", len(devs))
	}
	d := devs[2]
	major, minor := d.ComputeCapability()
	if d.Name() != "cuda:2" || d.Description() != "Stub GPU 2" || d.Kind() != "cuda" || d.Ordinal() != 2 ||
		d.UUID() != "GPU-5354b000-0000-4000-8000-000000000002" || d.TotalMemory() != 512*mib || major != 8 || minor != 0 {
		t.Errorf("device %s %q %s %d %s %d cc %d.%d", d.Name(), d.Description(), d.Kind(), d.Ordinal(), d.UUID(), d.TotalMemory(), major, minor)
	}
	// Opening and describing devices creates no context.
	if d.HasContext() || s.Used(2) != 0 || s.Calls("cuDevicePrimaryCtxRetain") != 0 {
		t.Fatalf("context before first use: used %d", s.Used(2))
	}
	free, total, err := d.MemGetInfo()
	if err != nil {
		t.Fatal(err)
	}
	info, err := d.Context()
	if err != nil || !info.Created || info.Workspace != 512<<10 || info.ModuleErr != nil {
		t.Fatalf("context %+v, %v", info, err)
	}
	// The context took 48 MiB; the workspace was allocated after the first
	// MemGetInfo's context creation, so it shows now.
	if total != 512*mib || free != 512*mib-48*mib-info.Workspace {
		t.Errorf("free %d total %d", free, total)
	}
	if s.Calls("cuDevicePrimaryCtxRetain") != 1 || s.Calls("cuModuleLoadDataEx") != 1 {
		t.Errorf("retains %d module loads %d", s.Calls("cuDevicePrimaryCtxRetain"), s.Calls("cuModuleLoadDataEx"))
	}
	if devs[0].HasContext() {
		t.Error("device 0 got a context")
	}
}

func TestVisibleDevices(t *testing.T) {
	for _, tc := range []struct {
		visible string
		uuids   []string // last digit of each device's UUID, in ordinal order
	}{
		{"1", []string{"1"}},
		{"2,0", []string{"2", "0"}},
		{"GPU-5354b000-0000-4000-8000-000000000003,GPU-5354b000-0000-4000-8000-000000000000", []string{"3", "0"}},
		{"0,9,1", []string{"0"}}, // everything from the first invalid entry is ignored
		{"1,1", []string{"1"}},
	} {
		s := cudatest.New(t, cudatest.Config{GPUs: 4, Visible: &tc.visible})
		drv, err := cuda.Open(s.LibCUDA)
		if err != nil {
			t.Fatalf("%q: %v", tc.visible, err)
		}
		var got []string
		for i, d := range drv.Devices() {
			if d.Ordinal() != i || d.Name() != "cuda:"+string(rune('0'+i)) {
				t.Errorf("%q: device %d named %s", tc.visible, i, d.Name())
			}
			got = append(got, d.UUID()[len(d.UUID())-1:])
		}
		if strings.Join(got, ",") != strings.Join(tc.uuids, ",") {
			t.Errorf("CUDA_VISIBLE_DEVICES=%q: devices %v, want %v", tc.visible, got, tc.uuids)
		}
	}
}

func TestMemoryAndCopies(t *testing.T) {
	s, drv := open(t, cudatest.Config{Mem: 256 * mib, NoCtx: true})
	d := drv.Devices()[0]
	m, err := d.Malloc(4096)
	if err != nil {
		t.Fatal(err)
	}
	if m.Host != nil || m.Ptr == 0 {
		t.Fatalf("DeviceMem %+v: want a device address and no host view", m)
	}
	if s.LiveAllocs() != 2 || s.Used(0) != 4096+512<<10 { // with the workspace
		t.Errorf("live %d used %d", s.LiveAllocs(), s.Used(0))
	}
	src := make([]byte, 4096)
	for i := range src {
		src[i] = byte(i * 7)
	}
	if err := d.CopyHtoD(m.Ptr, unsafe.Pointer(&src[0]), 4096); err != nil {
		t.Fatal(err)
	}
	m2, _ := d.Malloc(4096)
	if err := d.CopyDtoD(m2.Ptr, m.Ptr, 4096); err != nil {
		t.Fatal(err)
	}
	dst := make([]byte, 4096)
	if err := d.CopyDtoH(unsafe.Pointer(&dst[0]), m2.Ptr, 4096); err != nil {
		t.Fatal(err)
	}
	if string(dst) != string(src) {
		t.Error("round trip changed the bytes")
	}
	// A copy past the allocation fails with the driver's error, named.
	err = d.CopyDtoH(unsafe.Pointer(&dst[0]), m2.Ptr+1, 4096)
	var ce *cuda.Error
	if !errors.As(err, &ce) || ce.Code != 1 || !strings.Contains(err.Error(), "cuMemcpyDtoH: invalid argument (CUDA_ERROR_INVALID_VALUE)") {
		t.Errorf("out-of-range copy: %v", err)
	}
	// Fills of every element size.
	for _, tc := range []struct {
		size    int
		pattern uint64
	}{{1, 0x5a}, {2, 0x3c00}, {4, 0x3f800000}, {8, 0x3ff0000000000000}, {8, 0x0101010101010101}} {
		count := uint64(4096 / tc.size)
		if err := d.Fill(m.Ptr, tc.size, tc.pattern, count); err != nil {
			t.Fatalf("fill %d: %v", tc.size, err)
		}
		d.CopyDtoH(unsafe.Pointer(&dst[0]), m.Ptr, 4096)
		for i := uint64(0); i < count; i++ {
			var v uint64
			for b := range tc.size {
				v |= uint64(dst[int(i)*tc.size+b]) << (8 * b)
			}
			if v != tc.pattern {
				t.Fatalf("fill %d: element %d = %#x, want %#x", tc.size, i, v, tc.pattern)
			}
		}
	}
	if s.LaunchCount() != 1 { // only the 8-byte pattern with unequal halves needs a kernel
		t.Errorf("%d launches for fills", s.LaunchCount())
	}
	if err := d.Free(m, 4096); err != nil {
		t.Fatal(err)
	}
	if err := d.Free(m2, 4096); err != nil {
		t.Fatal(err)
	}
	if err := d.Free(m2, 4096); err == nil || !strings.Contains(err.Error(), "cuMemFree") {
		t.Errorf("double free: %v", err)
	}
	if s.LiveAllocs() != 1 {
		t.Errorf("%d live allocations after frees", s.LiveAllocs())
	}
}

func TestOutOfMemory(t *testing.T) {
	s, drv := open(t, cudatest.Config{Mem: 64 * mib, Ctx: 4 * mib})
	d := drv.Devices()[0]
	_, err := d.Malloc(128 * mib)
	if !errors.Is(err, backend.ErrDeviceFull) {
		t.Fatalf("err = %v, want ErrDeviceFull", err)
	}
	if !strings.Contains(err.Error(), "cuda:0: cuMemAlloc(128.00 MiB): out of memory (CUDA_ERROR_OUT_OF_MEMORY)") {
		t.Errorf("message %q", err)
	}
	// Through the caching allocator: PyTorch's OOM message, and the
	// allocator stays usable.
	a := backend.NewCachingAllocator(d, 0)
	b1, err := a.Malloc(40 * mib)
	if err != nil {
		t.Fatal(err)
	}
	_, err = a.Malloc(40 * mib)
	var oom *backend.OOMError
	if !errors.As(err, &oom) {
		t.Fatalf("err = %v, want *OOMError", err)
	}
	if !strings.HasPrefix(err.Error(), "CUDA out of memory. Tried to allocate 40.00 MiB. GPU 0 has a total capacity of 64.00 MiB of which 19.50 MiB is free.") {
		t.Errorf("OOM message %q", err)
	}
	a.Free(b1)
	b2, err := a.Malloc(40 * mib)
	if err != nil {
		t.Fatalf("after freeing: %v", err)
	}
	a.Free(b2)
	a.EmptyCache()
	// A transient OOM from the driver: the allocator frees its cache and
	// retries once.
	b3, _ := a.Malloc(mib)
	a.Free(b3) // cached: a 2 MiB segment
	s.Fail("cuMemAlloc_v2", 2, 0, 1)
	b4, err := a.Malloc(30 * mib)
	if err != nil {
		t.Fatalf("retry after a transient OOM: %v", err)
	}
	if st := a.Stats(); st["num_alloc_retries"] != 2 || st["num_ooms"] != 1 || st["segment.all.current"] != 1 {
		t.Errorf("stats retries %d ooms %d segments %d", st["num_alloc_retries"], st["num_ooms"], st["segment.all.current"])
	}
	a.Free(b4)
	a.EmptyCache()
	if s.LiveAllocs() != 1 { // the workspace
		t.Errorf("%d live allocations", s.LiveAllocs())
	}
}

func TestErrorMapping(t *testing.T) {
	s, drv := open(t, cudatest.Config{})
	d := drv.Devices()[0]
	if _, err := d.Context(); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		code   int
		want   string
		full   bool
		sticky bool
	}{
		{201, "cuMemAlloc(1024.00 KiB): invalid device context (CUDA_ERROR_INVALID_CONTEXT)", false, false},
		{700, "an illegal memory access was encountered (CUDA_ERROR_ILLEGAL_ADDRESS)", false, true},
		{999, "unknown error (CUDA_ERROR_UNKNOWN)", false, false},
		{2, "out of memory (CUDA_ERROR_OUT_OF_MEMORY)", true, false},
		{4242, "cuMemAlloc(1024.00 KiB): CUDA error 4242", false, false},
	} {
		s.Fail("cuMemAlloc_v2", tc.code, 0, 1)
		_, err := d.Malloc(mib)
		var ce *cuda.Error
		if !errors.As(err, &ce) || ce.Code != tc.code || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("code %d: %v, want %q", tc.code, err, tc.want)
			continue
		}
		if errors.Is(err, backend.ErrDeviceFull) != tc.full || ce.Sticky() != tc.sticky {
			t.Errorf("code %d: full %v sticky %v", tc.code, errors.Is(err, backend.ErrDeviceFull), ce.Sticky())
		}
	}
	// A failed device allocation that is not an OOM is an error of the
	// caching allocator, not an OOM.
	a := backend.NewCachingAllocator(d, 0)
	s.Fail("cuMemAlloc_v2", 700, 0, 1)
	_, err := a.Malloc(mib)
	if err == nil || backend.IsOOM(err) || !strings.Contains(err.Error(), "allocating a 2.00 MiB segment") {
		t.Errorf("allocator error %v", err)
	}
	if s.Fail("cuCtxSynchronize", 719, 0, 1); d.Synchronize() == nil {
		t.Error("Synchronize hid an error")
	}
}
