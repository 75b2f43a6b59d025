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

	// layout decides when exact mode needs to reclaim (mayHaveGarbage).
	layout layoutState

	// dense: reclaim before every allocation (SetDense)
	dense bool
	// quiet counts the open Quiet regions
	quiet int

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

	// The detail events below, and allocations and frees of zero bytes,
	// go only to observers registered with ObserveAll (a recorder of a
	// trial's stream for replay): PyTorch's memory history has no such
	// entries.

	EventReclaim    // a reclaim pass ended (Count: allocations it freed, just before; Trigger: why it ran)
	EventEmptyCache // empty_cache was called on the device's allocator (before its segment_free events)
	EventDriver     // Size bytes of the device were taken outside the allocator (a cuBLAS handle)
	EventGuard      // a kernel chose what to allocate by its shapes (Guard): Law, Args; Size the law's value, Requested 1 if it held
)

var eventNames = [...]string{"alloc", "free", "segment_alloc", "segment_free", "oom", "reclaim", "empty_cache", "driver", "guard"}

// Trigger says why a reclaim pass ran (EventReclaim).
type Trigger int

const (
	TriggerOther Trigger = iota // Reclaim or Collect was called
	TriggerAlloc                // AllocOn reclaimed before the allocation that follows (pacing, layout or peak)
	TriggerOOM                  // AllocOn's retry after the allocator ran out of memory
)

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

	// Floor (alloc) is the smallest maximum of the allocator's open peak
	// counters before the allocation, which AllocOn's peak test compares
	// with (NoFloor: none open). Count and Trigger describe an
	// EventReclaim.
	Floor   uint64
	Count   int
	Trigger Trigger
	// Law and Args (alloc, AllocLaw): the rule its size came from and
	// its arguments.
	Law  SizeLaw
	Args []int64
	// Clock and Notes (alloc): the layout clock and the count of garbage
	// notes when AllocOn began (what exact mode's mayHaveGarbage
	// compares with their values at its last reclaim, LayoutSeen);
	// Clocked: a layout clock is installed (without one exact mode
	// always reclaims first).
	Clock, Notes uint64
	Clocked      bool
	// Quiet (alloc): made in a Quiet region, where exact mode's reclaim
	// for a peak waits for something to have become garbage
	Quiet bool
}

// A SizeLaw gives an allocation's requested bytes from integer arguments
// (the shapes it depends on), for allocations whose size is not a simple
// product of shapes: a CUDA reduction's staging buffer, sized by its
// launch's arithmetic. A replay of a trial at another size (backend/
// replay) predicts the arguments and asks the law. Bytes returns 0 and
// false when the program would not allocate at all. A SizeLaw must be
// comparable with == (a struct of plain values).
type SizeLaw interface {
	Bytes(args []int64) (uint64, bool)
}

// NoFloor is Event.Floor when no peak counter is open.
const NoFloor = ^uint64(0)

type observer struct {
	f   func(Event)
	all bool // also the detail events (ObserveAll)
}

// Observe registers f to be called synchronously for every memory event of
// every device, in order, until remove is called. f runs while the Manager
// is locked: it must not call the Manager's methods (it may read allocator
// figures and the Starlark thread's call stack).
func (m *Manager) Observe(f func(Event)) (remove func()) { return m.observe(f, false) }

// ObserveAll is Observe for the detail events too: reclaims, empty_cache
// calls, device memory taken outside the allocator, and allocations and
// frees of zero bytes — what a replay of the stream needs (backend/replay).
func (m *Manager) ObserveAll(f func(Event)) (remove func()) { return m.observe(f, true) }

func (m *Manager) observe(f func(Event), all bool) (remove func()) {
	m.mu.Lock()
	defer m.mu.Unlock()
	o := &observer{f, all}
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
	detail := e.Kind >= EventReclaim || (e.Size == 0 && (e.Kind == EventAlloc || e.Kind == EventFree))
	for _, o := range m.observers {
		if o.all || !detail {
			o.f(e)
		}
	}
}

// emitReclaim tells the ObserveAll observers that a reclaim pass ended,
// having freed count allocations (whose free events came just before).
func (m *Manager) emitReclaim(t Trigger, count int) {
	for _, o := range m.observers {
		if o.all {
			o.f(Event{Kind: EventReclaim, Count: count, Trigger: t})
		}
	}
}

// reclaimFor is reclaimLocked, told to the ObserveAll observers.
func (m *Manager) reclaimFor(t Trigger) ReclaimResult {
	res := m.reclaimLocked()
	if len(m.observers) > 0 {
		m.emitReclaim(t, res.Count)
	}
	return res
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
	m.reach.frames.letGo()
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
		if h, ok := a.(interface{ SetEmptyCacheHook(func()) }); ok {
			a := a
			h.SetEmptyCacheHook(func() { m.emit(a, Event{Kind: EventEmptyCache}) })
		}
		if d, ok := a.Device().(interface{ SetDriverHook(func(uint64)) }); ok {
			a := a
			d.SetDriverHook(func(n uint64) {
				m.mu.Lock()
				defer m.mu.Unlock()
				m.emit(a, Event{Kind: EventDriver, Size: n})
			})
		}
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

// SetDense makes every allocation reclaim first (on), whatever its size
// and the peak mode (denseReclaim), and returns the previous setting: a
// trial run so finds every allocation garbage at the first allocation
// after it became garbage, which a replay of the trial at other sizes
// needs to know (backend/replay). Its figures are not a
// reference-counted run's.
func (m *Manager) SetDense(on bool) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	prev := m.dense
	m.dense = on
	return prev
}

// Guard tells the ObserveAll observers that code on allocator a chose
// what to allocate, or whether to, from shapes: law.Bytes(args) is the
// choice (a kernel's condition on its shapes: whether a layer norm's
// backward sums per-tile buffers, whether a reduction needs staging),
// which a replay of the trial at another size (backend/replay) evaluates
// again — a different choice means a different stream. It costs nothing
// without observers.
func (m *Manager) Guard(a Allocator, law SizeLaw, args ...int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.observers) == 0 {
		return
	}
	v, ok := law.Bytes(args)
	e := Event{Kind: EventGuard, Size: v, Law: law, Args: args}
	if ok {
		e.Requested = 1
	}
	m.emit(a, e)
}

// denseReclaim is SetDense's reclaim before an allocation: a reclaim
// when something may have become garbage (the layout clock and notes
// moved), else — Go code may have dropped a temporary without a note —
// the reach walk alone, which is told (an EventReclaim) only when it
// settles what is garbage without the collector: a collection between
// two allocations of one builtin would cost more than the trial.
func (m *Manager) denseReclaim() {
	if m.mayHaveGarbage() {
		m.reclaimFor(TriggerAlloc)
		m.layoutReclaimed()
		return
	}
	res, ok, _ := m.walkReclaim()
	if !ok {
		return
	}
	m.dropFreedEntries()
	m.stats.Reclaims++
	m.stats.ReclaimedBytes += res.Freed
	if res.Count > 0 {
		m.stats.WalkReclaims++
	} else {
		m.stats.ProvenReclaims++
	}
	if len(m.observers) > 0 {
		m.emitReclaim(TriggerAlloc, res.Count)
	}
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
	return m.allocOn(a, nbytes, nil, nil)
}

// AllocLaw is AllocOn of law.Bytes(args) bytes, telling observers the law
// and its arguments (Event.Law). It must not be called when the law says
// the program allocates nothing.
func (m *Manager) AllocLaw(a Allocator, law SizeLaw, args ...int64) (*Memory, error) {
	n, _ := law.Bytes(args)
	return m.allocOn(a, n, law, args)
}

func (m *Manager) allocOn(a Allocator, nbytes uint64, law SizeLaw, args []int64) (*Memory, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	floor := NoFloor
	var clock, notes uint64
	clocked := false
	if len(m.observers) > 0 {
		if f, ok := a.Peaks().Floor(); ok {
			floor = f
		}
		clock, notes, clocked = m.layoutNow()
	}
	if m.dense {
		m.denseReclaim()
	} else if m.sinceReclaim+nbytes > m.pacing && storesData(a) {
		m.reclaimFor(TriggerAlloc)
	} else if m.peak == PeakExact && nbytes > layoutMin && caching(a) && m.mayHaveGarbage() {
		m.reclaimFor(TriggerAlloc)
		m.layoutReclaimed()
	} else if m.peak.Exact() && nbytes > 0 && m.wouldRaise(a, nbytes) && !m.layoutQuiet(a, nbytes) && !m.quietNow() {
		m.stats.PeakReclaims++
		m.reclaimFor(TriggerAlloc)
		if m.quiet > 0 {
			m.layoutReclaimed()
		}
	}
	b, err := a.TryMalloc(nbytes)
	if err != nil && IsOOM(err) {
		m.stats.OOMRetries++
		m.reclaimFor(TriggerOOM)
		b, err = a.Malloc(nbytes)
	}
	if err != nil {
		if IsOOM(err) {
			m.emit(a, Event{Kind: EventOOM, Size: nbytes, Requested: nbytes})
		}
		return nil, err
	}
	h := m.handle(a, b, nbytes, false)
	rec := h.rec
	if storesData(a) {
		m.sinceReclaim += nbytes
	}
	// an empty tensor: PyTorch's allocator records nothing (a detail
	// event, for ObserveAll)
	m.emit(a, Event{Kind: EventAlloc, Addr: b.Ptr, Size: b.Size, Requested: nbytes, Seq: rec.seq, Floor: floor, Law: law, Args: args, Clock: clock, Notes: notes, Clocked: clocked, Quiet: m.quiet > 0})
	return h, nil
}

// layoutQuiet reports that the layout clock says nothing may have
// become garbage since its last reclaim (mayHaveGarbage), for an
// allocation of nbytes from a that the clock decides exact mode's
// reclaims for (over layoutMin, from the caching allocator): a reclaim
// for a peak would find nothing either (an optimizer's first step making
// its state). Smaller allocations still reclaim for a peak: Go code that
// drops a small temporary without a note (where's scalar_tensor(0) in its
// backward) leaves it to them.
func (m *Manager) layoutQuiet(a Allocator, nbytes uint64) bool {
	return m.peak == PeakExact && nbytes > layoutMin && caching(a) && m.layout.clock != nil && !m.mayHaveGarbage()
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
	return m.reclaimFor(TriggerOther)
}

// Collect is Reclaim with a Go collection always: gc(), like Python's
// gc.collect(), also lets what only the collector notices (weakly held
// values, cleanups) see the dropped values at once.
func (m *Manager) Collect() ReclaimResult {
	m.mu.Lock()
	defer m.mu.Unlock()
	res := m.collectLocked(time.Now())
	if len(m.observers) > 0 {
		m.emitReclaim(TriggerOther, res.Count)
	}
	return res
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
		m.emit(r.alloc, Event{Kind: EventFree, Addr: addr, Size: size, Requested: r.nbytes, Seq: r.seq})
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

// AllocDeferred makes a handle of nbytes on device that has no memory
// yet: a tensor made on PyTorch's meta device (torch.device("meta") as a
// context manager), which has a shape and a dtype but no storage, until
// Regrow materializes it (Module.to_empty). Nothing is allocated or
// counted; its values are not stored (HostAccessible is false).
func (m *Manager) AllocDeferred(device string, nbytes uint64) (*Memory, error) {
	a, err := m.Allocator(device)
	if err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.handle(a, nil, nbytes, true), nil
}

// handle makes the record of an allocation of nbytes from a (block b;
// nil and deferred for AllocDeferred's) and its handle, and keeps the
// handle among the entries. m.mu is held.
func (m *Manager) handle(a Allocator, b *Block, nbytes uint64, deferred bool) *Memory {
	m.seq++
	rec := &record{owner: m, alloc: a, block: b, device: a.Device().Name(), nbytes: nbytes, seq: m.seq, deferred: deferred}
	if m.reach.stamp != nil {
		rec.stamp = m.reach.stamp()
	}
	if debugReach {
		rec.pcs = make([]uintptr, 20)
		rec.pcs = rec.pcs[:runtime.Callers(3, rec.pcs)]
	}
	h := &Memory{rec: rec}
	m.entries = append(m.entries, entry{young: h, rec: rec})
	m.live++
	return h
}

// Regrow gives h, freed by Release (a storage resized to 0 bytes:
// FSDP2's unsharded parameters, tensor.FreeStorage) or made by
// AllocDeferred, a new
// allocation of its size on its allocator, as resize_ back to the full
// size (or Module.to_empty) does: every tensor viewing the storage sees
// it (the data is not kept). It is a new allocation for the allocator,
// the events and the peaks; the reach walk forgets what its kept frames
// found, which did not see the new allocation.
func (m *Manager) Regrow(h *Memory) error { return m.RegrowOn(h, nil) }

// RegrowOn is Regrow on allocator a (nil: h's own): a handle made by
// AllocDeferred gets its memory there, as Module.to_empty(device=...)
// makes a meta tensor's storage on the device it is given; a released
// one only on its own.
func (m *Manager) RegrowOn(h *Memory, a Allocator) error {
	old := h.rec
	if !old.freed && !old.deferred {
		return nil
	}
	if a == nil || !old.deferred {
		a = old.alloc
	}
	n, err := m.allocOn(a, old.nbytes, nil, nil)
	if err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	rec := n.rec
	rec.library = old.library
	if old.deferred {
		// the meta handle's record goes: it had no block
		old.freed = true
		m.reach.frames.freed(old)
		m.live--
	}
	h.rec = rec
	for i := len(m.entries) - 1; i >= 0; i-- {
		if e := &m.entries[i]; e.rec == rec {
			e.young, e.handle = h, weak.Pointer[Memory]{}
			break
		}
	}
	m.reach.frames.changed(nil)
	return nil
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
