// Package sim is the simulated GPU: a device with a fixed capacity whose
// memory is anonymous mmap outside the Go heap, so untouched pages cost the
// host nothing and freed memory goes back to the OS. Compute on it runs on
// the CPU with real data, unless the device is in meta mode, which keeps
// sizes and addresses but stores no data (PyTorch's meta device idea) so an
// 80 GiB GPU can be simulated on a small host.
//
// A spec string configures the devices, as in --device sim:SPEC:
//
//	16GiB                 one 16 GiB GPU
//	2x80GiB               two 80 GiB GPUs
//	16GiB,ctx=300MiB      300 MiB taken by the context (framework preload)
//	80GiB,meta            meta mode
//	H100                  a preset: one GPU named and sized as PyTorch sees an
//	                      H100, with that card's context size and PyTorch's
//	                      cuBLAS workspaces on it (see Presets)
//	2xH100,ctx=0B,meta    presets combine with the count and options
//	16GiB,cublas=32MiB,cublaslt=1MiB
//	                      PyTorch's cuBLAS / cuBLASLt workspace per thread
//	                      (tensor/blas_workspace.go); 0B turns one off
package sim

import (
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
	"sync"
	"unicode"

	"github.com/dustin/go-humanize"
	"github.com/memsh/memsh/backend"
	"github.com/memsh/memsh/backend/internal/pages"
)

// DefaultSpec is the simulated device used when none is given.
const DefaultSpec = "16GiB"

// Spec describes a set of identical simulated GPUs.
type Spec struct {
	Count int    // number of GPUs (>= 1)
	Total uint64 // capacity of each, bytes
	Ctx   uint64 // bytes taken by the context on each, as a CUDA context would
	Meta  bool   // keep no data
	// Cublas and CublasLt are the bytes of the cuBLAS and cuBLASLt
	// workspaces PyTorch 2.x allocates per thread on the device (0: none);
	// a preset's are PyTorch's defaults for its compute capability.
	Cublas, CublasLt uint64
	// Handle is the device memory, outside the allocator, that each
	// cuBLAS handle's creation takes (TakeDriverMemory; 0: none; a
	// preset's is what it was measured to be).
	Handle uint64
	// Preset is the preset's key ("H100") when the spec names one, and
	// Name the device name it gives ("NVIDIA H100 80GB HBM3"); "" without.
	Preset, Name string
}

// ParseSpec parses a spec string (see the package doc). The empty string
// means DefaultSpec.
func ParseSpec(s string) (Spec, error) {
	if s == "" {
		s = DefaultSpec
	}
	sp := Spec{Count: 1}
	parts := strings.Split(s, ",")
	size := strings.TrimSpace(parts[0])
	if _, ok := LookupPreset(size); !ok {
		if i := strings.IndexByte(size, 'x'); i > 0 {
			n, err := strconv.Atoi(size[:i])
			if err != nil || n < 1 || n > 64 {
				return Spec{}, fmt.Errorf("sim spec %q: bad device count %q (want 1 to 64)", s, size[:i])
			}
			sp.Count, size = n, size[i+1:]
		}
	}
	if p, ok := LookupPreset(size); ok {
		sp.Total, sp.Ctx, sp.Preset, sp.Name = p.Total, p.Ctx, p.Key, p.Name
		sp.Cublas, sp.CublasLt = p.workspaces()
		sp.Handle = p.Handle
	} else {
		total, err := parseSize(size)
		switch {
		case err != nil && looksLikeName(size):
			return Spec{}, fmt.Errorf("sim spec %q: unknown GPU preset %q (known: %s; or a size such as 16GiB)", s, size, presetKeys())
		case err != nil || total == 0:
			return Spec{}, fmt.Errorf("sim spec %q: bad capacity %q (want a size such as 16GiB%s)", s, size, why(err))
		}
		sp.Total = total
	}
	for _, p := range parts[1:] {
		p = strings.TrimSpace(p)
		switch {
		case p == "meta":
			sp.Meta = true
		case strings.HasPrefix(p, "ctx="):
			c, err := parseSize(p[len("ctx="):])
			if err != nil {
				return Spec{}, fmt.Errorf("sim spec %q: bad context size %q (want a size such as 300MiB%s)", s, p[len("ctx="):], why(err))
			}
			sp.Ctx = c
		case strings.HasPrefix(p, "cublas=") || strings.HasPrefix(p, "cublaslt="):
			k, v, _ := strings.Cut(p, "=")
			c, err := parseSize(v)
			if err != nil {
				return Spec{}, fmt.Errorf("sim spec %q: bad %s workspace size %q (want a size such as 32MiB, or 0B%s)", s, k, v, why(err))
			}
			if k == "cublas" {
				sp.Cublas = c
			} else {
				sp.CublasLt = c
			}
		default:
			return Spec{}, fmt.Errorf("sim spec %q: unknown option %q (want ctx=SIZE, cublas=SIZE, cublaslt=SIZE or meta)", s, p)
		}
	}
	if sp.Ctx >= sp.Total {
		return Spec{}, fmt.Errorf("sim spec %q: context %s does not fit in %s", s,
			backend.FormatSize(sp.Ctx), backend.FormatSize(sp.Total))
	}
	return sp, nil
}

// looksLikeName reports whether a spec's first word is meant as a preset
// name rather than a size: it starts with a letter and names no size unit.
func looksLikeName(w string) bool {
	return w != "" && unicode.IsLetter(rune(w[0])) && !hasUnit(w)
}

// maxSize is the largest capacity a spec may give (sizes are int64 in
// memsh's figures).
const maxSize = math.MaxInt64

// parseSize parses a size with its unit ("16GiB", "1.5KiB", "512B"),
// refusing NaN, infinities, negative sizes and sizes above 2^63-1 bytes
// with an error that says which.
func parseSize(size string) (uint64, error) {
	if !hasUnit(size) {
		return 0, fmt.Errorf("no unit")
	}
	num := strings.TrimRight(strings.TrimSpace(size), "KMGTPEZYkmgtpezyiIBb ")
	if f, err := strconv.ParseFloat(num, 64); err == nil {
		switch {
		case math.IsNaN(f) || math.IsInf(f, 0):
			return 0, fmt.Errorf("got %s, want a finite number", strings.ToLower(num))
		case f < 0:
			return 0, fmt.Errorf("negative")
		}
	}
	n, err := humanize.ParseBytes(size)
	if err != nil {
		if strings.Contains(err.Error(), "too large") {
			return 0, fmt.Errorf("too large (max 2^63-1 bytes)")
		}
		return 0, err
	}
	if n > maxSize {
		return 0, fmt.Errorf("%d bytes is too large (max 2^63-1 bytes)", n)
	}
	return n, nil
}

func why(err error) string {
	if err == nil {
		return ""
	}
	return "; " + err.Error()
}

// hasUnit reports whether a size names its unit ("16GiB", "300MiB", "512B"):
// a bare number is ambiguous, so it is refused.
func hasUnit(size string) bool {
	size = strings.TrimSpace(size)
	return size != "" && (size[len(size)-1] == 'B' || size[len(size)-1] == 'b')
}

// String formats the spec so that ParseSpec reads it back.
func (sp Spec) String() string {
	var b strings.Builder
	if sp.Count > 1 {
		fmt.Fprintf(&b, "%dx", sp.Count)
	}
	p, preset := LookupPreset(sp.Preset)
	var cublas, cublasLt uint64
	if preset && p.Total == sp.Total {
		b.WriteString(p.Key)
		if sp.Ctx != p.Ctx {
			b.WriteString(",ctx=" + exactSize(sp.Ctx))
		}
		cublas, cublasLt = p.workspaces()
	} else {
		b.WriteString(exactSize(sp.Total))
		if sp.Ctx > 0 {
			b.WriteString(",ctx=" + exactSize(sp.Ctx))
		}
	}
	if sp.Cublas != cublas {
		b.WriteString(",cublas=" + exactSize(sp.Cublas))
	}
	if sp.CublasLt != cublasLt {
		b.WriteString(",cublaslt=" + exactSize(sp.CublasLt))
	}
	if sp.Meta {
		b.WriteString(",meta")
	}
	return b.String()
}

// exactSize prints n in the largest IEC unit that divides it exactly, so
// that ParseSpec reads back the same number.
func exactSize(n uint64) string {
	for _, u := range []struct {
		size uint64
		name string
	}{{1 << 40, "TiB"}, {1 << 30, "GiB"}, {1 << 20, "MiB"}, {1 << 10, "KiB"}} {
		if n >= u.size && n%u.size == 0 {
			return strconv.FormatUint(n/u.size, 10) + u.name
		}
	}
	return strconv.FormatUint(n, 10) + "B"
}

// mapPages maps the host memory backing a data device's allocation; tests
// replace it to inject a failure.
var mapPages = pages.Map

// HostExhaustedError is returned by Malloc when the host cannot back the
// simulated device's memory (mmap failed): the host ran out, not the
// simulated GPU, so it is not an out-of-memory error of the device (it
// does not wrap backend.ErrDeviceFull, and the caching allocator does not
// turn it into a CUDA OOM).
type HostExhaustedError struct {
	Device string // "cuda:0"
	Size   uint64 // the allocation's size in bytes
	Err    error  // mmap's error
}

func (e *HostExhaustedError) Error() string {
	return fmt.Sprintf("host memory exhausted while backing simulated device %s (%d bytes): mmap: %v; use a smaller simulator or sim:SIZE,meta (sizes only, no data)", e.Device, e.Size, e.Err)
}

func (e *HostExhaustedError) Unwrap() error { return e.Err }

// HostBackingWarning returns a warning when a data device of this
// capacity (every device of a spec together: capacity is Count × Total
// less the contexts) could need more host memory than the machine has
// (MemTotal), or "" when it fits or the spec is meta. The session prints
// it when it creates the devices.
func HostBackingWarning(sp Spec) string {
	if sp.Meta {
		return ""
	}
	total, ok := hostMemTotal()
	if !ok {
		return ""
	}
	need := (sp.Total - sp.Ctx) * uint64(sp.Count)
	if need <= total {
		return ""
	}
	what := "a simulated GPU of " + backend.FormatSize(sp.Total)
	if sp.Count > 1 {
		what = fmt.Sprintf("%d simulated GPUs of %s", sp.Count, backend.FormatSize(sp.Total))
	}
	return fmt.Sprintf("warning: %s with data needs up to %s of host memory to back it, more than this machine's %s; "+
		"filling it fails with \"host memory exhausted\" (or the kernel's OOM killer ends memsh); use sim:%s to simulate sizes only",
		what, backend.FormatSize(need), backend.FormatSize(total), metaSpec(sp))
}

func metaSpec(sp Spec) Spec {
	sp.Meta = true
	return sp
}

// hostMemTotal is the host's RAM (MemTotal of /proc/meminfo); tests
// replace it.
var hostMemTotal = func() (uint64, bool) {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, false
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "MemTotal:"); ok {
			f := strings.Fields(rest)
			if len(f) >= 1 {
				kb, err := strconv.ParseUint(f[0], 10, 64)
				return kb << 10, err == nil
			}
		}
	}
	return 0, false
}

// Device is one simulated GPU.
type Device struct {
	mu      sync.Mutex
	ordinal int
	name    string // "cuda:N", made once: Name is called at every allocation
	spec    Spec
	used    uint64 // bytes handed out by Malloc
	driver  uint64 // bytes taken outside the allocator since the start (TakeDriverMemory)
	mallocs int
	va      *vaSpace         // the device addresses of allocations (va.go)
	maps    map[*byte][]byte // live mappings, by first byte
	// onDriver, if set, is told of the bytes every TakeDriverMemory took
	onDriver func(n uint64)
}

// SetDriverHook installs f to be told of every TakeDriverMemory that took
// memory; nil removes it. The Manager reports them to its ObserveAll
// observers (a recorder of a trial's stream).
func (d *Device) SetDriverHook(f func(n uint64)) {
	d.mu.Lock()
	d.onDriver = f
	d.mu.Unlock()
}

// Clone returns a meta copy of a meta device as it stands: the memory it
// has handed out and taken outside the allocator, and the addresses it
// would give the next allocations (va.go), so that an allocator over the
// copy (backend.CachingAllocator.Clone) places segments as the device
// would. It returns nil for a device that stores data.
func (d *Device) Clone() *Device {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.spec.Meta {
		return nil
	}
	va := *d.va
	va.gaps = append([]vaRange(nil), d.va.gaps...)
	va.live = make(map[uintptr]uint64, len(d.va.live))
	for p, n := range d.va.live {
		va.live[p] = n
	}
	return &Device{ordinal: d.ordinal, name: d.name, spec: d.spec, used: d.used, driver: d.driver, mallocs: d.mallocs, va: &va, maps: map[*byte][]byte{}}
}

// New returns the devices a spec describes, with ordinals 0..Count-1.
func New(sp Spec) []*Device {
	ds := make([]*Device, sp.Count)
	for i := range ds {
		ds[i] = &Device{ordinal: i, name: fmt.Sprintf("cuda:%d", i), spec: sp, va: newVASpace(), maps: map[*byte][]byte{}}
	}
	return ds
}

// Name implements backend.Device.
func (d *Device) Name() string { return d.name }

// Kind implements backend.Device.
func (d *Device) Kind() string { return "sim" }

// Ordinal is the device's CUDA ordinal.
func (d *Device) Ordinal() int { return d.ordinal }

// Meta reports whether the device is in meta mode (stores no data).
func (d *Device) Meta() bool { return d.spec.Meta }

// Spec returns the device's spec.
func (d *Device) Spec() Spec { return d.spec }

// Description implements backend.Device.
// A preset's device has the preset's name, as torch.cuda.get_device_name()
// shows it for the real card.
func (d *Device) Description() string {
	if d.spec.Name != "" {
		return d.spec.Name
	}
	s := "simulated GPU " + backend.FormatBytes(int64(d.spec.Total))
	if d.spec.Meta {
		s += ", meta"
	}
	return s
}

// MemGetInfo implements backend.Device: free is the capacity less the
// context and every live Malloc.
func (d *Device) MemGetInfo() (free, total uint64, err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.spec.Total - d.spec.Ctx - d.driver - d.used, d.spec.Total, nil
}

// TakeDriverMemory takes n more bytes of the device outside the allocator,
// as the driver does when a library creates a handle (a cuBLAS handle:
// BLASHandleBytes); they stay taken for the device's life. It fails,
// taking nothing, when fewer than n bytes are free.
func (d *Device) TakeDriverMemory(n uint64) error {
	d.mu.Lock()
	if n > d.spec.Total-d.spec.Ctx-d.driver-d.used {
		d.mu.Unlock()
		return fmt.Errorf("sim %s: cannot take %s for a library handle: %w", d.Name(), backend.FormatSize(n), backend.ErrDeviceFull)
	}
	d.driver += n
	hook := d.onDriver
	d.mu.Unlock()
	if hook != nil {
		hook(n)
	}
	return nil
}

// BLASHandleBytes returns the device memory a cuBLAS handle takes outside
// the allocator on this device (the spec's Handle).
func (d *Device) BLASHandleBytes() uint64 { return d.spec.Handle }

// Malloc implements backend.Device with an anonymous private mapping
// (MAP_NORESERVE), or a fake address range in meta mode.
func (d *Device) Malloc(size uint64) (backend.DeviceMem, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if size == 0 {
		return backend.DeviceMem{}, fmt.Errorf("sim: zero-size malloc")
	}
	if size > d.spec.Total-d.spec.Ctx-d.driver-d.used {
		return backend.DeviceMem{}, fmt.Errorf("sim %s: cannot allocate %s: %w", d.Name(), backend.FormatSize(size), backend.ErrDeviceFull)
	}
	if d.spec.Meta {
		d.used += size
		d.mallocs++
		return backend.DeviceMem{Ptr: d.va.alloc(size)}, nil
	}
	b, err := mapPages(size)
	if err != nil {
		return backend.DeviceMem{}, &HostExhaustedError{Device: d.Name(), Size: size, Err: err}
	}
	d.used += size
	d.mallocs++
	d.maps[&b[0]] = b
	// the device address (the allocator orders blocks by it) is the
	// driver's, as in meta mode; the data lives in the mapping
	return backend.DeviceMem{Ptr: d.va.alloc(size), Host: b}, nil
}

// Free implements backend.Device.
func (d *Device) Free(m backend.DeviceMem, size uint64) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if m.Host != nil {
		delete(d.maps, &m.Host[0])
		if err := pages.Unmap(m.Host[:cap(m.Host)]); err != nil {
			return fmt.Errorf("sim %s: munmap: %v", d.Name(), err)
		}
	}
	d.va.free(m.Ptr)
	d.used -= size
	d.mallocs--
	return nil
}

// Used returns the bytes currently obtained through Malloc (what the
// allocator has reserved).
func (d *Device) Used() uint64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.used
}

// Resident returns the bytes of the device's memory that are resident in
// host RAM (pages the simulator's data has touched), by mincore(2). The
// Session subtracts it from the process RSS so host figures count the host's
// own memory only.
func (d *Device) Resident() uint64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	var n uint64
	for _, b := range d.maps {
		n += pages.Resident(b)
	}
	return n
}
