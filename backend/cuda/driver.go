// Package cuda is memsh's backend for real NVIDIA GPUs: the CUDA driver
// API, loaded at run time from libcuda.so.1 with dlopen, so that a memsh
// binary builds without the CUDA toolkit and runs on a machine without a
// driver, where Open says why the backend is unavailable.
//
// A Device is one GPU as the driver numbers it (CUDA_VISIBLE_DEVICES is
// applied by the driver, so ordinals are the ones PyTorch would use). It
// implements backend.Device — Malloc is cuMemAlloc, Free is cuMemFree,
// MemGetInfo is cuMemGetInfo — so backend.CachingAllocator works over it
// unchanged. Its memory is not host-accessible (DeviceMem.Host is nil);
// values move with CopyHtoD / CopyDtoH and are computed by kernels:
// elementwise operations, casts, fills, sums and the random generator as
// PTX embedded in the binary (kernels.cu, compiled to kernels.ptx), and
// matrix products through cuBLAS (libcublas, loaded the same way when
// present).
//
// Contexts: each device uses its primary context, retained on first use
// (Device.Context; gpu.preload reports what that costs). A CUDA context is
// current per OS thread and a goroutine may move between threads, so every
// call that needs the context makes it current on the calling thread
// within the same C call; a Device may be used from any goroutine. Kernel
// launches wait for the kernel, so errors surface at the operation that
// caused them and timings are honest.
//
// Sizes are in bytes. Errors of driver calls are *Error values naming the
// call and the driver's own error name and message; an out-of-memory
// error wraps backend.ErrDeviceFull.
//
// Environment: MEMSH_LIBCUDA and MEMSH_LIBCUBLAS override the library
// paths (the tests point them at a stub built from C).
package cuda

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
)

// Environment variables naming the libraries; empty means the defaults.
const (
	LibraryEnv     = "MEMSH_LIBCUDA"   // default DefaultLibrary
	BLASLibraryEnv = "MEMSH_LIBCUBLAS" // default: libcublas.so.13, .12, .11, libcublas.so
)

// DefaultLibrary is the driver library's soname.
const DefaultLibrary = "libcuda.so.1"

// Driver is a loaded, initialised CUDA driver library and its devices.
// There is one per library path per process; Open returns it again.
type Driver struct {
	path    string
	lib     *library
	tab     *cuTable
	version int
	devices []*Device
}

var (
	driversMu sync.Mutex
	drivers   = map[string]*Driver{}
)

// Open loads and initialises the CUDA driver at path ("" means
// $MEMSH_LIBCUDA, or DefaultLibrary searched as the dynamic loader does)
// and lists its devices. Errors wrap ErrUnavailable and say why: the
// library cannot be loaded, lacks an entry point, cuInit fails, or there
// is no device.
func Open(path string) (*Driver, error) {
	if path == "" {
		path = os.Getenv(LibraryEnv)
	}
	if path == "" {
		path = DefaultLibrary
	}
	driversMu.Lock()
	defer driversMu.Unlock()
	if d, ok := drivers[path]; ok {
		return d, nil
	}
	lib, err := openLibrary(path)
	if err != nil {
		return nil, fmt.Errorf("%w: %s; is the NVIDIA driver installed? (%s names the library)", ErrUnavailable, err, LibraryEnv)
	}
	tab, err := loadTable(lib)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	d := &Driver{path: path, lib: lib, tab: tab}
	if err := d.initDriver(); err != nil {
		return nil, fmt.Errorf("%w: %v%s", ErrUnavailable, err, visibleNote(err))
	}
	if d.version, err = d.driverVersion(); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	n, err := d.deviceCount()
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	if n == 0 {
		return nil, fmt.Errorf("%w: the driver reports no CUDA device%s", ErrUnavailable, visibleNote(nil))
	}
	for i := range n {
		p, err := d.deviceProps(i)
		if err != nil {
			return nil, fmt.Errorf("%w: %v", ErrUnavailable, err)
		}
		d.devices = append(d.devices, newDevice(d, i, p))
	}
	drivers[path] = d
	return d, nil
}

// visibleNote mentions CUDA_VISIBLE_DEVICES when it is set and the driver
// found no device.
func visibleNote(err error) string {
	var e *Error
	if err != nil && (!errors.As(err, &e) || e.Code != codeNoDevice) {
		return ""
	}
	if v, ok := os.LookupEnv("CUDA_VISIBLE_DEVICES"); ok {
		return fmt.Sprintf(" (CUDA_VISIBLE_DEVICES=%q)", v)
	}
	return ""
}

// Path is the library the driver was loaded from.
func (d *Driver) Path() string { return d.path }

// Version is the CUDA version the driver supports, as cuDriverGetVersion
// reports it: 12040 for 12.4.
func (d *Driver) Version() int { return d.version }

// VersionString is Version as "12.4".
func (d *Driver) VersionString() string {
	return fmt.Sprintf("%d.%d", d.version/1000, d.version%1000/10)
}

// Devices returns the devices by CUDA ordinal. The same *Device values are
// returned to every caller: a device's context is shared by the process.
func (d *Driver) Devices() []*Device { return append([]*Device(nil), d.devices...) }

// formatUUID spells a CUDA UUID as NVML does: GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx.
func formatUUID(u [16]byte) string {
	h := fmt.Sprintf("%x", u[:])
	return "GPU-" + strings.Join([]string{h[0:8], h[8:12], h[12:16], h[16:20], h[20:32]}, "-")
}
