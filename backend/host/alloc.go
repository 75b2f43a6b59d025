package host

import (
	"github.com/memsh/memsh/backend"
)

// Allocator is the backend.Allocator of "cpu" tensors. Like PyTorch's CPU
// allocator it does not cache: each Malloc is one Device.Malloc and each Free
// one Device.Free, which returns the memory to the operating system or, for
// blocks of RetainMin to RetainMax bytes, retains it below the allocator as
// glibc does under PyTorch (see RetainMin). Consequently:
//
//   - RoundSize(n) is n: allocated_bytes counts the bytes requested, not the
//     64-byte-aligned size the C allocator may actually use (which is not
//     observable exactly; RSS shows the real cost);
//   - reserved bytes always equal allocated bytes, and EmptyCache has
//     nothing to release;
//   - Malloc(0) returns a Block with no memory and changes no statistic
//     (as PyTorch, which does not call its allocator for empty tensors);
//   - blocks of MmapThreshold bytes or more are unmapped at Free, or
//     retained until Trim; smaller ones go back to glibc's arenas, which
//     the Allocator trims every TrimPacing freed bytes (see TrimPacing), so
//     they too go back to the operating system, give or take TrimPacing.
//
// Like the other allocators of package backend, an Allocator is not safe for
// concurrent use: its owner (the Manager) serialises calls.
type Allocator struct {
	dev   *Device
	live  map[*backend.Block]uint64 // every block handed out and not freed, with its size
	count stat                      // blocks (allocation, segment, active)
	bytes stat                      // bytes (allocated, reserved, active, requested)

	numOOMs, numDeviceAlloc, numDeviceFree int64
	tryOnly                                bool // a TryMalloc is running: do not count an OOM

	smallFreed uint64 // bytes of blocks below MmapThreshold freed since the last Trim

	peaks backend.PeakSet
}

var _ backend.Allocator = (*Allocator)(nil)

// stat is one PyTorch statistic: current, peak, allocated (cumulative
// increases) and freed (cumulative decreases).
type stat struct {
	current, peak, allocated, freed int64
}

func (s *stat) add(n int64) {
	s.current += n
	s.allocated += n
	s.peak = max(s.peak, s.current)
}

func (s *stat) sub(n int64) {
	s.current -= n
	s.freed += n
}

func (s *stat) put(m map[string]int64, prefix string) {
	m[prefix+".current"] = s.current
	m[prefix+".peak"] = s.peak
	m[prefix+".allocated"] = s.allocated
	m[prefix+".freed"] = s.freed
}

// NewAllocator returns a non-caching allocator over host RAM.
func NewAllocator() *Allocator {
	return &Allocator{dev: NewDevice(), live: make(map[*backend.Block]uint64)}
}

// NewMetaAllocator returns the allocator of a meta host (NewMetaDevice):
// the same statistics, no memory.
func NewMetaAllocator() *Allocator {
	return &Allocator{dev: NewMetaDevice(), live: make(map[*backend.Block]uint64)}
}

// Device returns the host Device.
func (a *Allocator) Device() backend.Device { return a.dev }

// RoundSize returns size unchanged: the allocator does not round (see
// Allocator).
func (a *Allocator) RoundSize(size uint64) uint64 { return size }

// TryMalloc implements backend.Allocator: Malloc without counting a failure
// in num_ooms.
func (a *Allocator) TryMalloc(size uint64) (*backend.Block, error) {
	a.tryOnly = true
	defer func() { a.tryOnly = false }()
	return a.Malloc(size)
}

// Malloc allocates size bytes (64-byte aligned, not zeroed). On failure it
// returns an *backend.OOMError for device "cpu" (Index -1) and counts it in
// num_ooms; nothing is allocated then.
func (a *Allocator) Malloc(size uint64) (*backend.Block, error) {
	if size == 0 {
		b := &backend.Block{}
		a.live[b] = 0
		return b, nil
	}
	m, err := a.dev.Malloc(size)
	if err != nil {
		if !a.tryOnly {
			a.numOOMs++
		}
		free, total, _ := memInfo()
		return nil, &backend.OOMError{
			Device:    "cpu",
			Index:     -1,
			Requested: size,
			Total:     total,
			Free:      free,
			Allocated: a.Allocated(),
			Reserved:  a.Reserved(),
		}
	}
	b := &backend.Block{Ptr: m.Ptr, Host: m.Host, Size: size, Requested: size}
	a.live[b] = size
	a.numDeviceAlloc++
	a.count.add(1)
	a.bytes.add(int64(size))
	cur := uint64(a.bytes.current)
	a.peaks.Observe(cur, cur)
	return b, nil
}

// Free returns b's memory. b must have come from this allocator's Malloc
// and must not be used afterwards; freeing it twice (or freeing a block of
// another allocator) panics.
func (a *Allocator) Free(b *backend.Block) {
	size, ok := a.live[b]
	if !ok {
		panic("host: Allocator.Free of a block that is not allocated by this allocator (double free?)")
	}
	delete(a.live, b)
	if size == 0 {
		return
	}
	if err := a.dev.Free(backend.DeviceMem{Ptr: b.Ptr, Host: b.Host}, size); err != nil {
		panic("host: " + err.Error())
	}
	a.numDeviceFree++
	a.count.sub(1)
	a.bytes.sub(int64(size))
	if size < MmapThreshold && !a.dev.meta {
		a.smallFreed += size
		if a.smallFreed >= TrimPacing {
			a.smallFreed = 0
			Trim()
		}
	}
}

// TrimPacing is how many bytes of small blocks (below MmapThreshold) an
// Allocator frees between two calls of Trim.
//
// glibc returns the free top of an arena to the operating system by itself,
// but a single live chunk above the freed ones pins it: for example one that
// the C runtime allocated when Go started a thread while the blocks were
// being allocated. Then freed small blocks stay resident until malloc_trim
// releases the free pages inside the arena. Pacing the trims bounds that
// retained memory by about TrimPacing. A trim costs ~30 µs on a compact
// arena and ~0.5 ms on a badly fragmented 256 MiB one (every other 4 KiB
// block free), i.e. under 1 ns to ~250 ns per 4 KiB block freed.
const TrimPacing = 8 << 20

// Allocated is allocated_bytes.all.current: the bytes of live blocks.
func (a *Allocator) Allocated() uint64 { return uint64(a.bytes.current) }

// Reserved is reserved_bytes.all.current, always equal to Allocated.
func (a *Allocator) Reserved() uint64 { return uint64(a.bytes.current) }

// EmptyCache does nothing: the allocator holds no cache. (Free memory kept
// by the C allocator's arenas for small blocks can be released with Trim.)
func (a *Allocator) EmptyCache() {}

// Stats returns the allocator's statistics under torch.cuda.memory_stats()'s
// key names, for the "all" pool:
//
//   - allocation, segment and active: block counts (each block is its own
//     device allocation, and every allocated block is active);
//   - allocated_bytes, reserved_bytes, active_bytes and requested_bytes: the
//     same byte figures, since nothing is rounded or cached;
//   - inactive_split and inactive_split_bytes: always 0 (no splitting);
//
// each with .current, .peak, .allocated and .freed; and num_alloc_retries
// (always 0), num_ooms, num_device_alloc and num_device_free.
func (a *Allocator) Stats() map[string]int64 {
	m := make(map[string]int64, 4*9+4)
	for _, k := range [...]string{"allocation", "segment", "active"} {
		a.count.put(m, k+".all")
	}
	for _, k := range [...]string{"allocated_bytes", "reserved_bytes", "active_bytes", "requested_bytes"} {
		a.bytes.put(m, k+".all")
	}
	var zero stat
	zero.put(m, "inactive_split.all")
	zero.put(m, "inactive_split_bytes.all")
	m["num_alloc_retries"] = 0
	m["num_ooms"] = a.numOOMs
	m["num_device_alloc"] = a.numDeviceAlloc
	m["num_device_free"] = a.numDeviceFree
	return m
}

// ResetPeakStats sets every ".peak" statistic to its current value, as
// torch.cuda.reset_peak_memory_stats. The counters of Peaks are independent
// of it.
func (a *Allocator) ResetPeakStats() {
	a.count.peak = a.count.current
	a.bytes.peak = a.bytes.current
}

// Peaks is the set of independent exact peak counters over this allocator;
// every allocation is observed.
func (a *Allocator) Peaks() *backend.PeakSet { return &a.peaks }
