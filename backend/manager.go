package backend

import (
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"
	"weak"
)

// DefaultPacing is the number of bytes allocated since the last reclaim after
// which the Manager reclaims before the next allocation (Go's GC does not see
// off-heap bytes, so it would not run on its own).
const DefaultPacing = 256 << 20

// Config describes the devices of a Manager.
type Config struct {
	GPUs   []Allocator // one per GPU ordinal: GPUs[i] serves "cuda:i"
	Host   Allocator   // serves "cpu"
	Peak   PeakMode
	Pacing uint64 // 0 means DefaultPacing
}

// Manager owns every allocation of one Session: it allocates through the
// device allocators, keeps a weak pointer to each handle, and reclaims —
// runtime.GC() then frees every allocation whose handle is gone —
// synchronously at the points docs/architecture.md ("How memory is accounted") names. It never relies on
// finalizers or cleanups for a reported figure.
//
// The Manager's own methods are safe for use by several goroutines; the
// allocators it hands out (GPU, Host) are not, and a Session uses all of
// them from its one goroutine.
type Manager struct {
	mu      sync.Mutex
	gpus    []Allocator
	host    Allocator
	current int
	peak    PeakMode
	pacing  uint64

	entries      []entry
	live         int // entries not freed yet
	seq          uint64
	sinceReclaim uint64
	stats        ManagerStats

	observers []*observer

	// reach proves, when it can, that a reclaim would find no garbage
	// (reach.go).
	reach reachState

	// layout decides when layout mode needs to reclaim (mayHaveGarbage).
	layout layoutState

	// global holds one peak counter per allocator, open for the Manager's
	// life, mirroring PyTorch's ".peak" statistics (max_memory_allocated)
	// so exact-peak mode keeps those free of garbage too.
	global map[Allocator]*Peak
}

// EventKind is the kind of a memory Event.
type EventKind int

const (
	EventAlloc        EventKind = iota // a block was handed out
	EventFree                          // a block was freed (reclaimed, released or by Close)
	EventSegmentAlloc                  // the caching allocator obtained a segment from the device
	EventSegmentFree                   // the caching allocator returned a segment to the device
	EventOOM                           // an allocation failed for lack of memory (after the reclaim and retry)
)

var eventNames = [...]string{"alloc", "free", "segment_alloc", "segment_free", "oom"}

// String returns PyTorch's memory-history action name: "alloc", "free",
// "segment_alloc", "segment_free" or "oom".
func (k EventKind) String() string { return eventNames[k] }

// Event is one change in device or host memory, as observers see it.
type Event struct {
	Kind      EventKind
	Device    string  // "cuda:0", "cpu"
	Addr      uintptr // block or segment address (0 for OOM and zero-size blocks)
	Size      uint64  // block size (rounded), segment size, or for OOM the requested bytes
	Requested uint64  // bytes asked for (alloc and free)
	Seq       uint64  // the allocation's sequence number (alloc and free)
	Allocated uint64  // the allocator's allocated bytes after the event
	Reserved  uint64  // the allocator's reserved bytes after the event
}

type observer struct{ f func(Event) }

// Observe registers f to be called synchronously for every memory event of
// every device, in order, until remove is called. f runs while the Manager
// is locked: it must not call the Manager's methods (it may read allocator
// figures and the Starlark thread's call stack).
func (m *Manager) Observe(f func(Event)) (remove func()) {
	m.mu.Lock()
	defer m.mu.Unlock()
	o := &observer{f}
	m.observers = append(m.observers, o)
	return func() {
		m.mu.Lock()
		defer m.mu.Unlock()
		// A new array, so the removed observer's closure is not kept
		// reachable by the old one.
		kept := make([]*observer, 0, len(m.observers))
		for _, x := range m.observers {
			if x != o {
				kept = append(kept, x)
			}
		}
		m.observers = kept
	}
}

func (m *Manager) emit(a Allocator, e Event) {
	if len(m.observers) == 0 {
		return
	}
	e.Device = a.Device().Name()
	e.Allocated, e.Reserved = a.Allocated(), a.Reserved()
	for _, o := range m.observers {
		o.f(e)
	}
}

// entry is the Manager's reference to one allocation. Its handle is held
// strongly (young) until the collector is to judge it: making a weak
// pointer costs a walk of a per-span list in the Go runtime, and most
// allocations are freed by a reach walk (or stay reachable) without a
// collection ever asking. settle makes the weak pointers before every
// runtime.GC() whose verdict the Manager reads.
type entry struct {
	handle weak.Pointer[Memory] // once settled
	young  *Memory              // until then
	rec    *record
}

// value returns the entry's handle, or nil when the collector found it
// unreachable.
func (e *entry) value() *Memory {
	if e.young != nil {
		return e.young
	}
	return e.handle.Value()
}

// settle turns every young entry's strong reference into a weak pointer,
// so that the next collection can tell which handles are unreachable, and
// makes the reach walk's caches let go of what they hold (SetForget).
func (m *Manager) settle() {
	if m.reach.forget != nil {
		m.reach.forget()
	}
	for i := range m.entries {
		if e := &m.entries[i]; e.young != nil {
			if !e.rec.freed {
				e.handle = weak.Make(e.young)
			}
			e.young = nil
		}
	}
}

// ManagerStats counts the Manager's reclaim work.
type ManagerStats struct {
	Reclaims       int           // reclaim passes run
	ReclaimedBytes uint64        // bytes (requested) freed by reclaim passes
	ReclaimTime    time.Duration // total time spent in reclaim passes
	PeakReclaims   int           // passes triggered by exact-peak mode
	ProvenReclaims int           // passes that proved without a GC that nothing was garbage
	WalkReclaims   int           // passes that freed garbage without a GC (the reach walk found it)
	OOMRetries     int           // passes triggered by an out-of-memory retry
	// FramesWalked counts the frames of running functions that reach
	// walks walked; FramesKept, those they did not walk because nothing
	// they reach can have changed since an earlier walk (Frames).
	FramesWalked, FramesKept int
	// ValuesKept counts the autograd nodes, tensors and modules that
	// walks did not look into because what they reach is credited to a
	// kept frame (Frames.Visit); ValuesWalked, the values (Starlark
	// values, tensors, autograd nodes) that walks looked into
	// (Walk.Visited).
	ValuesKept, ValuesWalked int
	// ReusedWalks counts the walks that reported what an earlier one
	// found in part of the roots instead of walking it (Walk.Reused).
	ReusedWalks int
	// StoppedReclaims counts the reclaims an interrupt stopped (their
	// walk was told to stop; no collection followed).
	StoppedReclaims int
	// RetriedWalks counts the walks made again, keeping nothing, because
	// a frame they kept stood for a value no longer reachable
	// (Walk.Retry).
	RetriedWalks int
}

// Collections returns the reclaim passes that a Go collection settled:
// those neither proven nor freed by the reach walk.
func (s ManagerStats) Collections() int {
	return s.Reclaims - s.ProvenReclaims - s.WalkReclaims
}

// Since returns the counts of s less those of before, an earlier
// snapshot: the work done in between.
func (s ManagerStats) Since(before ManagerStats) ManagerStats {
	return ManagerStats{
		Reclaims:        s.Reclaims - before.Reclaims,
		ReclaimedBytes:  s.ReclaimedBytes - before.ReclaimedBytes,
		ReclaimTime:     s.ReclaimTime - before.ReclaimTime,
		PeakReclaims:    s.PeakReclaims - before.PeakReclaims,
		ProvenReclaims:  s.ProvenReclaims - before.ProvenReclaims,
		WalkReclaims:    s.WalkReclaims - before.WalkReclaims,
		OOMRetries:      s.OOMRetries - before.OOMRetries,
		FramesWalked:    s.FramesWalked - before.FramesWalked,
		FramesKept:      s.FramesKept - before.FramesKept,
		ValuesKept:      s.ValuesKept - before.ValuesKept,
		ValuesWalked:    s.ValuesWalked - before.ValuesWalked,
		ReusedWalks:     s.ReusedWalks - before.ReusedWalks,
		RetriedWalks:    s.RetriedWalks - before.RetriedWalks,
		StoppedReclaims: s.StoppedReclaims - before.StoppedReclaims,
	}
}

// NewManager returns a Manager over the given allocators.
func NewManager(cfg Config) *Manager {
	p := cfg.Pacing
	if p == 0 {
		p = DefaultPacing
	}
	m := &Manager{gpus: cfg.GPUs, host: cfg.Host, peak: cfg.Peak, pacing: p, global: map[Allocator]*Peak{}}
	for _, a := range append(append([]Allocator(nil), cfg.GPUs...), cfg.Host) {
		if a == nil {
			continue
		}
		m.global[a] = a.Peaks().New(a.Allocated(), a.Reserved())
		if h, ok := a.(interface {
			SetSegmentHook(func(bool, uintptr, uint64))
		}); ok {
			a := a
			h.SetSegmentHook(func(alloc bool, ptr uintptr, size uint64) {
				k := EventSegmentFree
				if alloc {
					k = EventSegmentAlloc
				}
				m.emit(a, Event{Kind: k, Addr: ptr, Size: size})
			})
		}
	}
	return m
}

// PeakMode returns the Manager's peak mode.
func (m *Manager) PeakMode() PeakMode {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.peak
}

// SetPeakMode switches the peak mode and returns the previous one
// (sweep.max_fit's search="lazy" runs its search trials lazily and
// confirms the boundary in exact mode).
func (m *Manager) SetPeakMode(p PeakMode) PeakMode {
	m.mu.Lock()
	defer m.mu.Unlock()
	prev := m.peak
	m.peak = p
	return prev
}

// NumGPUs is the number of GPU devices.
func (m *Manager) NumGPUs() int { return len(m.gpus) }

// GPU returns the allocator of GPU i.
func (m *Manager) GPU(i int) Allocator { return m.gpus[i] }

// Host returns the host allocator.
func (m *Manager) Host() Allocator { return m.host }

// Current returns the current GPU ordinal (torch.cuda.current_device).
func (m *Manager) Current() int { return m.current }

// SetCurrent sets the current GPU ordinal.
func (m *Manager) SetCurrent(i int) error {
	if i < 0 || i >= len(m.gpus) {
		return fmt.Errorf("invalid device ordinal %d (%s)", i, m.gpuCountText())
	}
	m.current = i
	return nil
}

func (m *Manager) gpuCountText() string {
	switch len(m.gpus) {
	case 0:
		return "no CUDA devices available"
	case 1:
		return "1 CUDA device available"
	}
	return fmt.Sprintf("%d CUDA devices available", len(m.gpus))
}

// Canonical returns the canonical PyTorch name of a device string: "cpu",
// "cuda:N" ("cuda" means the current device).
func (m *Manager) Canonical(device string) (string, error) {
	a, err := m.Allocator(device)
	if err != nil {
		return "", err
	}
	return a.Device().Name(), nil
}

// Allocator resolves a PyTorch device string ("cpu", "cuda", "cuda:1") to
// its allocator.
func (m *Manager) Allocator(device string) (Allocator, error) {
	switch {
	case device == "cpu":
		if m.host == nil {
			return nil, fmt.Errorf("no host allocator")
		}
		return m.host, nil
	case device == "cuda":
		if len(m.gpus) == 0 {
			return nil, fmt.Errorf("invalid device %q: %s", device, m.gpuCountText())
		}
		return m.gpus[m.current], nil
	case strings.HasPrefix(device, "cuda:"):
		i, err := strconv.Atoi(device[len("cuda:"):])
		if err != nil || i < 0 || i >= len(m.gpus) || device[len("cuda:")] == '+' {
			return nil, fmt.Errorf("invalid device %q: %s", device, m.gpuCountText())
		}
		return m.gpus[i], nil
	}
	return nil, fmt.Errorf("invalid device %q: want \"cpu\", \"cuda\" or \"cuda:N\"", device)
}

// Alloc allocates nbytes on a device given as a PyTorch device string.
func (m *Manager) Alloc(device string, nbytes uint64) (*Memory, error) {
	a, err := m.Allocator(device)
	if err != nil {
		return nil, err
	}
	return m.AllocOn(a, nbytes)
}

// AllocOn allocates nbytes from allocator a, reclaiming first when the
// pacing threshold is passed or (exact mode) when the allocation would raise
// an open peak counter, and reclaiming then retrying once before reporting
// an *OOMError.
func (m *Manager) AllocOn(a Allocator, nbytes uint64) (*Memory, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.sinceReclaim+nbytes > m.pacing && storesData(a) {
		m.reclaimLocked()
	} else if m.peak == PeakLayout && nbytes > layoutMin && caching(a) && m.mayHaveGarbage() {
		m.reclaimLocked()
		m.layout.seen, m.layout.noted = m.layout.clock(), false
	} else if m.peak.Exact() && nbytes > 0 && m.wouldRaise(a, nbytes) && !m.layoutQuiet(a, nbytes) {
		m.stats.PeakReclaims++
		m.reclaimLocked()
	}
	b, err := a.TryMalloc(nbytes)
	if err != nil && IsOOM(err) {
		m.stats.OOMRetries++
		m.reclaimLocked()
		b, err = a.Malloc(nbytes)
	}
	if err != nil {
		if IsOOM(err) {
			m.emit(a, Event{Kind: EventOOM, Size: nbytes, Requested: nbytes})
		}
		return nil, err
	}
	m.seq++
	rec := &record{owner: m, alloc: a, block: b, device: a.Device().Name(), nbytes: nbytes, seq: m.seq}
	if m.reach.stamp != nil {
		rec.stamp = m.reach.stamp()
	}
	if debugReach {
		rec.pcs = make([]uintptr, 20)
		rec.pcs = rec.pcs[:runtime.Callers(2, rec.pcs)]
	}
	h := &Memory{rec: rec}
	m.entries = append(m.entries, entry{young: h, rec: rec})
	m.live++
	if storesData(a) {
		m.sinceReclaim += nbytes
	}
	if b.Size > 0 { // an empty tensor: PyTorch's allocator records nothing
		m.emit(a, Event{Kind: EventAlloc, Addr: b.Ptr, Size: b.Size, Requested: nbytes, Seq: rec.seq})
	}
	return h, nil
}

// layoutQuiet reports that layout mode's clock says nothing may have
// become garbage since its last reclaim (mayHaveGarbage), for an
// allocation of nbytes from a that the clock decides layout mode's
// reclaims for (over layoutMin, from the caching allocator): a reclaim
// for a peak would find nothing either (an optimizer's first step making
// its state). Smaller allocations still reclaim for a peak: Go code that
// drops a small temporary without a note (where's scalar_tensor(0) in its
// backward) leaves it to them.
func (m *Manager) layoutQuiet(a Allocator, nbytes uint64) bool {
	return m.peak == PeakLayout && nbytes > layoutMin && caching(a) && m.layout.clock != nil && !m.mayHaveGarbage()
}

// wouldRaise reports whether allocating nbytes from a would raise an open
// peak counter (allocated bytes) or obtain a new segment (reserved bytes).
func (m *Manager) wouldRaise(a Allocator, nbytes uint64) bool {
	if a.Peaks().WouldRaise(a.Allocated() + a.RoundSize(nbytes)) {
		return true
	}
	g, ok := a.(interface{ NeedsSegment(uint64) bool })
	return ok && g.NeedsSegment(nbytes)
}

// ResetPeakStats resets a's ".peak" statistics to the current figures, as
// torch.cuda.reset_peak_memory_stats does.
func (m *Manager) ResetPeakStats(a Allocator) {
	m.mu.Lock()
	defer m.mu.Unlock()
	a.ResetPeakStats()
	if p := m.global[a]; p != nil {
		p.Reset(a.Allocated(), a.Reserved())
	}
}

// ReclaimResult says what one reclaim pass did.
type ReclaimResult struct {
	Freed uint64        // requested bytes freed
	Count int           // allocations freed
	Time  time.Duration // wall time of the pass, GC included
	// Proven: the pass proved that nothing was garbage (every live
	// allocation reachable) without a Go collection (SetReach).
	Proven bool
}

// Reclaim frees every allocation whose handle is no longer reachable. It is
// synchronous and exact: it runs runtime.GC() and frees what the collector
// found unreachable, unless the reach walk (SetReach) proves first that
// every live allocation is reachable, in which case there is nothing to
// free and no collection is needed.
func (m *Manager) Reclaim() ReclaimResult {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.reclaimLocked()
}

// Collect is Reclaim with a Go collection always: gc(), like Python's
// gc.collect(), also lets what only the collector notices (weakly held
// values, cleanups) see the dropped values at once.
func (m *Manager) Collect() ReclaimResult {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.collectLocked(time.Now())
}

func (m *Manager) reclaimLocked() ReclaimResult {
	start := time.Now()
	res, ok, stopped := m.walkReclaim()
	if ok {
		m.dropFreedEntries()
		m.sinceReclaim = 0
		res.Time = time.Since(start)
		res.Proven = res.Count == 0
		if res.Count > 0 {
			m.stats.WalkReclaims++
		} else {
			m.stats.ProvenReclaims++
		}
		m.stats.Reclaims++
		m.stats.ReclaimedBytes += res.Freed
		m.stats.ReclaimTime += res.Time
		return res
	}
	if stopped {
		// Ctrl-C: the statement stops, and what it left is reclaimed
		// before the next (scope's Session.Settle); a collection would
		// hold the interrupt up for as long as it takes
		m.stats.StoppedReclaims++
		return ReclaimResult{Time: time.Since(start)}
	}
	return m.collectLocked(start)
}

func (m *Manager) collectLocked(start time.Time) ReclaimResult {
	gcStart := time.Now()
	m.settle()
	runtime.GC()
	var res ReclaimResult
	kept := m.entries[:0]
	for _, e := range m.entries {
		if e.rec.freed {
			continue
		}
		if e.value() == nil {
			m.freeLocked(e.rec)
			res.Freed += e.rec.nbytes
			res.Count++
			continue
		}
		kept = append(kept, e)
	}
	clear(m.entries[len(kept):])
	m.entries = kept
	m.sinceReclaim = 0
	res.Time = time.Since(start)
	m.reach.lastCollect = time.Since(gcStart)
	m.stats.Reclaims++
	m.stats.ReclaimedBytes += res.Freed
	m.stats.ReclaimTime += res.Time
	return res
}

// dropFreedEntries forgets the entries of freed allocations (released by
// an experiment's finish, or by Close) once they are most of the list: a
// collection drops them as it goes, a proven reclaim does it here, so the
// list follows the live allocations.
func (m *Manager) dropFreedEntries() {
	if len(m.entries) < 2*m.live+64 {
		return
	}
	kept := m.entries[:0]
	for _, e := range m.entries {
		if !e.rec.freed {
			kept = append(kept, e)
		}
	}
	clear(m.entries[len(kept):])
	m.entries = kept
}

func (m *Manager) freeLocked(r *record) {
	if r.freed {
		return
	}
	r.freed = true
	r.owner.reach.frames.freed(r)
	r.owner.live--
	if r.block != nil {
		addr, size := r.block.Ptr, r.block.Size
		r.alloc.Free(r.block)
		r.block = nil
		if size > 0 {
			m.emit(r.alloc, Event{Kind: EventFree, Addr: addr, Size: size, Requested: r.nbytes, Seq: r.seq})
		}
	}
}

// Release frees h's memory now, whoever still refers to it; later uses of
// the handle see Err() report reason (e.g. "released when experiment 'bs=16'
// finished"). Releasing twice does nothing.
func (m *Manager) Release(h *Memory, reason string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if h.rec.freed {
		return
	}
	h.rec.released = reason
	m.freeLocked(h.rec)
}

// Live calls f for every allocation whose handle is still reachable (or not
// yet collected) and not released, in allocation order, until f returns
// false. It does not run a GC: call Reclaim first for an exact view.
func (m *Manager) Live(f func(*Memory) bool) {
	m.mu.Lock()
	hs := make([]*Memory, 0, len(m.entries))
	for _, e := range m.entries {
		if e.rec.freed {
			continue
		}
		if h := e.value(); h != nil {
			hs = append(hs, h)
		}
	}
	m.mu.Unlock()
	for _, h := range hs {
		if !f(h) {
			return
		}
	}
}

// Seq returns the sequence number of the latest allocation; allocations made
// after this call have larger numbers.
func (m *Manager) Seq() uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.seq
}

// Stats returns the Manager's reclaim counters.
func (m *Manager) Stats() ManagerStats {
	m.mu.Lock()
	defer m.mu.Unlock()
	st := m.stats
	st.FramesWalked, st.FramesKept, st.ValuesKept = m.reach.frames.Walked, m.reach.frames.Kept, m.reach.frames.Skipped
	return st
}

// Close frees every allocation, reachable or not. The Manager must not be
// used afterwards; Memory handles report the memory as released.
func (m *Manager) Close() {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, e := range m.entries {
		if !e.rec.freed {
			e.rec.released = "released when the session closed"
			m.freeLocked(e.rec)
		}
	}
	m.entries = nil
	for _, a := range m.gpus {
		a.EmptyCache()
	}
}

// storesData reports whether a's device keeps data: a meta device
// (backend/sim with meta) holds none, so its allocations cost the process
// nothing and do not count toward the reclaim pacing, which exists to
// return garbage's host and device memory in time.
func storesData(a Allocator) bool {
	if d, ok := a.Device().(interface{ Meta() bool }); ok && d.Meta() {
		return false
	}
	return true
}
