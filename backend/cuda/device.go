package cuda

import (
	"fmt"
	"sync"
	"time"
	"unsafe"

	"github.com/memsh/memsh/backend"
	"github.com/memsh/memsh/backend/nvml"
)

// Device is one GPU of a Driver. It implements backend.Device; it is safe
// for concurrent use.
type Device struct {
	drv     *Driver
	ordinal int
	name    string // "cuda:N", made once: Name is called at every allocation
	props   deviceProps
	uuid    string

	mu        sync.Mutex
	ctx       unsafe.Pointer // the retained primary context, nil until first use
	info      ContextInfo
	module    unsafe.Pointer // memsh's kernels, nil until loaded
	moduleErr error
	funcs     map[string]unsafe.Pointer
	partials  uintptr    // Sum's workspace: maxPartials float64 values
	sumMu     sync.Mutex // serialises Sum's use of partials
	blas      *blasHandle
	nv        *nvml.Device
}

var _ backend.Device = (*Device)(nil)

func newDevice(drv *Driver, ordinal int, p deviceProps) *Device {
	return &Device{drv: drv, ordinal: ordinal, name: fmt.Sprintf("cuda:%d", ordinal), props: p, uuid: formatUUID(p.uuid), funcs: map[string]unsafe.Pointer{}}
}

// ContextInfo describes a device's primary context as memsh created it.
type ContextInfo struct {
	Created bool          // the context exists
	Time    time.Duration // retaining the context, loading memsh's kernels and allocating the workspace
	// ModuleTime is the part of Time spent loading (JIT-compiling) the
	// embedded PTX.
	ModuleTime time.Duration
	// Workspace is device memory memsh holds outside the allocator for
	// the context's lifetime (Sum's partial results), in bytes.
	Workspace uint64
	// ModuleErr is why memsh's kernels could not be loaded (ops then run
	// on the CPU through host copies), or nil.
	ModuleErr error
}

// Name implements backend.Device: "cuda:N".
func (d *Device) Name() string { return d.name }

// Description implements backend.Device: the driver's device name.
func (d *Device) Description() string { return d.props.name }

// Kind implements backend.Device: "cuda".
func (d *Device) Kind() string { return "cuda" }

// Ordinal is the CUDA ordinal.
func (d *Device) Ordinal() int { return d.ordinal }

// UUID is the device's UUID as NVML spells it (GPU-...; for a MIG device
// the driver's UUID of the MIG instance, in the same form).
func (d *Device) UUID() string { return d.uuid }

// TotalMemory is the device's memory as cuDeviceTotalMem reports it; it
// needs no context.
func (d *Device) TotalMemory() uint64 { return d.props.total }

// ComputeCapability returns the major and minor compute capability.
func (d *Device) ComputeCapability() (major, minor int) { return d.props.major, d.props.minor }

// Driver returns the driver the device belongs to.
func (d *Device) Driver() *Driver { return d.drv }

// SetNVML attaches the device's NVML view (found by UUID) for device-wide
// and per-process figures; nil detaches it.
func (d *Device) SetNVML(v *nvml.Device) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.nv = v
}

// NVML returns the device's NVML view, or nil when NVML is unavailable or
// has no device with this UUID.
func (d *Device) NVML() *nvml.Device {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.nv
}

// HasContext reports whether the primary context was created.
func (d *Device) HasContext() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.ctx != nil
}

// Context creates the device's primary context if it does not exist yet —
// retains it, loads memsh's kernels and allocates the workspace — and
// describes it. This is what the first use of a device costs (PyTorch's
// "CUDA context" preload).
func (d *Device) Context() (ContextInfo, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, err := d.contextLocked(); err != nil {
		return ContextInfo{}, err
	}
	return d.info, nil
}

// context returns the primary context, creating it on first use.
func (d *Device) context() (unsafe.Pointer, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.contextLocked()
}

func (d *Device) contextLocked() (unsafe.Pointer, error) {
	if d.ctx != nil {
		return d.ctx, nil
	}
	start := time.Now()
	ctx, err := d.drv.retainPrimary(d.props.handle)
	if err != nil {
		return nil, fmt.Errorf("%s: creating the CUDA context: %w", d.Name(), err)
	}
	d.ctx = ctx
	m0 := time.Now()
	d.loadModuleLocked()
	d.info.ModuleTime = time.Since(m0)
	if p, err := d.drv.memAlloc(ctx, maxPartials*8); err == nil {
		d.partials = p
		d.info.Workspace = maxPartials * 8
	}
	d.info.Created = true
	d.info.Time = time.Since(start)
	d.info.ModuleErr = d.moduleErr
	return ctx, nil
}

// MemGetInfo implements backend.Device with cuMemGetInfo (device-wide free
// and total bytes); it creates the context if needed.
func (d *Device) MemGetInfo() (free, total uint64, err error) {
	ctx, err := d.context()
	if err != nil {
		return 0, 0, err
	}
	return d.drv.memInfo(ctx)
}

// Malloc implements backend.Device with cuMemAlloc. When the device is
// full the error wraps backend.ErrDeviceFull.
func (d *Device) Malloc(size uint64) (backend.DeviceMem, error) {
	if size == 0 {
		return backend.DeviceMem{}, fmt.Errorf("%s: zero-size malloc", d.Name())
	}
	ctx, err := d.context()
	if err != nil {
		return backend.DeviceMem{}, err
	}
	p, err := d.drv.memAlloc(ctx, size)
	if err != nil {
		return backend.DeviceMem{}, fmt.Errorf("%s: %w", d.Name(), err)
	}
	return backend.DeviceMem{Ptr: p}, nil
}

// Free implements backend.Device with cuMemFree.
func (d *Device) Free(m backend.DeviceMem, size uint64) error {
	ctx, err := d.context()
	if err != nil {
		return err
	}
	if err := d.drv.memFree(ctx, m.Ptr); err != nil {
		return fmt.Errorf("%s: %w", d.Name(), err)
	}
	return nil
}

// Synchronize waits for all work on the device (cuCtxSynchronize). memsh's
// own operations already wait for their kernels.
func (d *Device) Synchronize() error {
	ctx, err := d.context()
	if err != nil {
		return err
	}
	return d.drv.synchronize(ctx)
}

// CopyHtoD copies n bytes from host memory at src to device address dst.
// src must not point into the Go heap across a garbage collection; tensor
// memory (C heap or mmap) and pinned Go memory are fine.
func (d *Device) CopyHtoD(dst uintptr, src unsafe.Pointer, n uint64) error {
	if n == 0 {
		return nil
	}
	ctx, err := d.context()
	if err != nil {
		return err
	}
	return d.drv.htod(ctx, dst, src, n)
}

// CopyDtoH copies n bytes from device address src to host memory at dst.
func (d *Device) CopyDtoH(dst unsafe.Pointer, src uintptr, n uint64) error {
	if n == 0 {
		return nil
	}
	ctx, err := d.context()
	if err != nil {
		return err
	}
	return d.drv.dtoh(ctx, dst, src, n)
}

// CopyDtoD copies n bytes between two addresses of the device.
func (d *Device) CopyDtoD(dst, src uintptr, n uint64) error {
	if n == 0 {
		return nil
	}
	ctx, err := d.context()
	if err != nil {
		return err
	}
	return d.drv.dtod(ctx, dst, src, n)
}

// CurrentContextIsOurs reports whether the calling OS thread has this
// device's context current (for tests of the per-thread handling).
func (d *Device) CurrentContextIsOurs() (bool, error) {
	ctx, err := d.context()
	if err != nil {
		return false, err
	}
	cur, err := d.drv.currentContext()
	return cur == ctx, err
}

var _ backend.HostCopier = (*Device)(nil)

// CopyToHost implements backend.HostCopier (backend.Manager.Migrate): it
// copies len(dst) bytes from device address src.
func (d *Device) CopyToHost(dst []byte, src uintptr) error {
	if len(dst) == 0 {
		return nil
	}
	return d.CopyDtoH(unsafe.Pointer(&dst[0]), src, uint64(len(dst)))
}

// CopyFromHost implements backend.HostCopier: it copies src to device
// address dst.
func (d *Device) CopyFromHost(dst uintptr, src []byte) error {
	if len(src) == 0 {
		return nil
	}
	return d.CopyHtoD(dst, unsafe.Pointer(&src[0]), uint64(len(src)))
}

// ProcessUsed returns the device memory this process uses, from NVML's
// list of compute processes (backend.ProcessMemory), for the OOM message's
// "this process has ... memory in use" as PyTorch's gives it; ok is false
// without NVML, or when NVML does not list this process with a figure (in
// some containers it lists host pids, or none).
func (d *Device) ProcessUsed() (used uint64, ok bool) {
	nv := d.NVML()
	if nv == nil {
		return 0, false
	}
	ps, err := nv.Processes()
	if err != nil {
		return 0, false
	}
	for _, p := range ps {
		if p.Self && p.UsedKnown {
			return p.Used, true
		}
	}
	return 0, false
}
