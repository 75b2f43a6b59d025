package replay

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/memsh/memsh/backend"
	"github.com/memsh/memsh/backend/sim"
)

// layoutMin is backend's: exact mode reclaims before an allocation of
// more than this when something may have become garbage (and only then).
const layoutMin = 1 << 20

// Start is the state of a Manager's GPUs at the start of a trial: copies
// of their devices and caching allocators.
type Start struct {
	devs   []*sim.Device
	allocs []*backend.CachingAllocator
}

// Snapshot copies m's GPUs as they stand, or says why it cannot: a replay
// needs meta simulated GPUs (sim:...,meta) under caching allocators — a
// device that holds data reclaims when enough bytes were allocated
// (backend.DefaultPacing), which depends on the sizes.
func Snapshot(m *backend.Manager) (*Start, string) {
	st := &Start{}
	if m.NumGPUs() == 0 {
		return nil, "no GPU"
	}
	for i := 0; i < m.NumGPUs(); i++ {
		a, ok := m.GPU(i).(*backend.CachingAllocator)
		if !ok {
			return nil, "the GPU has no caching allocator"
		}
		d, ok := a.Device().(*sim.Device)
		if !ok {
			return nil, "a real GPU"
		}
		if a.StreamsUsed() {
			return nil, "CUDA streams other than the default one were made"
		}
		c := d.Clone()
		if c == nil {
			return nil, "the simulated GPU holds data (replay needs sim:...,meta)"
		}
		st.devs = append(st.devs, c)
		st.allocs = append(st.allocs, a.Clone(c))
	}
	return st, ""
}

// clone returns a copy of st (a Replay uses its Start up).
func (st *Start) clone() *Start {
	c := &Start{}
	for i, d := range st.devs {
		cd := d.Clone()
		c.devs = append(c.devs, cd)
		c.allocs = append(c.allocs, st.allocs[i].Clone(cd))
	}
	return c
}

// Outcome is a replayed trial's result.
type Outcome struct {
	Status string // "ok" or "oom"
	Err    error  // the *backend.OOMError (possibly wrapped) of an "oom"
	// Per GPU: the peaks of allocated and reserved bytes, the allocated
	// bytes at the end (once the trial's memory is freed) and the device's
	// free memory then.
	Peaks     []Peak
	Allocated []uint64
	Free      []uint64
	// Blocks and Segments are where the replay put each allocation, and
	// the segments it took and released (to check against a recording).
	Blocks   []Block
	Segments []Segment
	host     []bool // per allocation: on the host (not replayed)
}

// Unsafe is the error Replay returns when what it would report might not
// be what a full trial reports.
type Unsafe struct{ Why string }

func (u *Unsafe) Error() string { return "replay unsafe: " + u.Why }

// Plan is a program to replay with what the recordings tell about
// reclaims (Model.Predict).
type Plan struct {
	Ops []Op // the program's events (program)
	// Pre, per event: whether AllocOn reclaimed before an Alloc in
	// every recording (1), none (0) or some (-1): what a replay follows
	// for a host allocation, whose reclaims do not depend on the size
	Pre []int8
	// Alive and Dead, per allocation: the last moment it was found live,
	// the first it was found garbage (never: not by a reclaim)
	Alive, Dead []int64
	// Keep, per allocation: it outlives the trial (a library's
	// workspace), also one that runs out of memory
	Keep []bool
	// expect, if set, is the recording's own reclaims (Verify): a replay
	// that decides otherwise fails
	expect []bool
	// Assume, for an estimate only, what a reclaim does with an
	// allocation the recordings cannot tell is garbage yet: Unsafe
	// (refuse: the default), or take it for live or for garbage
	Assume Assumption
}

// Assumption is Plan.Assume.
type Assumption int

const (
	AssumeNothing Assumption = iota // refuse (Unsafe): a replay to report
	AssumeLive                      // an estimate: the allocation is live
	AssumeGarbage                   // an estimate: the allocation is garbage
)

// Replay runs p from st (which it uses up) in peak mode mode: each
// allocation as AllocOn would make it — the reclaim first when AllocOn
// would reclaim, freeing what was garbage by then — and returns the
// outcome, or an *Unsafe error when a reclaim would run at a moment where
// the recordings do not tell whether some allocation was garbage.
func Replay(st *Start, p *Plan, mode backend.PeakMode) (*Outcome, error) {
	if mode == backend.PeakLazy {
		return nil, &Unsafe{"lazy peak mode"}
	}
	layout := mode == backend.PeakExact // exact mode's reclaims for the layout
	n := len(st.allocs)
	o := &Outcome{Status: "ok", Peaks: make([]Peak, n), Allocated: make([]uint64, n), Free: make([]uint64, n)}
	high := make([]uint64, n)
	start := make([]uint64, n)
	for i, a := range st.allocs {
		high[i] = a.Allocated()
		start[i] = a.Allocated()
		o.Peaks[i] = Peak{a.Allocated(), a.Reserved()}
		dev := i
		a.SetSegmentHook(func(alloc bool, ptr uintptr, size uint64) {
			o.Segments = append(o.Segments, Segment{Dev: dev, Alloc: alloc, Addr: ptr, Size: size})
		})
	}
	ids := len(p.Dead)
	o.Blocks = make([]Block, ids)
	o.host = make([]bool, ids)
	blocks := make([]*backend.Block, ids)
	devOf := make([]int, ids)
	live := &liveSet{plan: p}
	free := func(id int32) {
		if b := blocks[id]; b != nil {
			st.allocs[devOf[id]].Free(b)
			blocks[id] = nil
		}
		live.drop(id)
	}
	// reclaim frees what was garbage at moment at, or fails when the
	// recordings cannot tell of some allocation
	reclaim := func(at int64) error {
		for {
			id, ok := live.deadBy(at)
			if !ok {
				break
			}
			free(id)
		}
		for {
			id, ok := live.unknownAt(at)
			if !ok {
				return nil
			}
			switch p.Assume {
			case AssumeLive:
				return nil
			case AssumeGarbage:
				free(id)
				continue
			}
			return &Unsafe{fmt.Sprintf("a full trial reclaims where allocation #%d may or may not be garbage", id)}
		}
	}
	observe := func(dev int) {
		a := st.allocs[dev]
		pk := &o.Peaks[dev]
		pk.Allocated = max(pk.Allocated, a.Allocated())
		pk.Reserved = max(pk.Reserved, a.Reserved())
		high[dev] = max(high[dev], a.Allocated())
	}
	dirty := false // exact mode's mayHaveGarbage
	for i, op := range p.Ops {
		switch op.Kind {
		case Alloc:
			at := 2*int64(i) - 1 // AllocOn's reclaim, if any
			var decide bool
			dirty = dirty || op.Moved
			if op.Dev == Host {
				// the host's reclaims do not depend on the size
				if p.Pre[i] < 0 {
					return nil, &Unsafe{fmt.Sprintf("the recordings differ on the reclaim before host allocation #%d", op.ID)}
				}
				o.host[op.ID] = true
				if p.Pre[i] == 1 {
					if err := reclaim(at); err != nil {
						return nil, err
					}
				}
				continue
			}
			a := st.allocs[op.Dev]
			size := op.Size
			if layout && size > layoutMin {
				// exact mode: a reclaim whenever something may have
				// become garbage since its last one (and then none for
				// a peak: nothing can be garbage)
				decide = dirty
				dirty = false
			} else {
				// AllocOn's peak test: the trial's peak counter, a new
				// segment; in a Quiet region only when something may
				// have become garbage, and then a reclaim like a
				// layout one
				decide = size > 0 && (a.Allocated()+a.RoundSize(size) > high[op.Dev] || a.NeedsSegment(size))
				if op.Quiet {
					decide = decide && dirty
					if decide {
						dirty = false
					}
				}
			}
			if p.expect != nil && decide != p.expect[i] {
				return nil, fmt.Errorf("replay: before allocation #%d the recording reclaimed: %v, the replay: %v", op.ID, p.expect[i], decide)
			}
			if decide {
				if err := reclaim(at); err != nil {
					return nil, err
				}
			}
			b, err := a.TryMalloc(size)
			if err != nil && backend.IsOOM(err) {
				// AllocOn's retry after a reclaim
				if err := reclaim(at); err != nil {
					return nil, err
				}
				b, err = a.Malloc(size)
			}
			if err != nil {
				if !backend.IsOOM(err) {
					return nil, err
				}
				return o.oom(st, p, blocks, devOf, start, err), nil
			}
			blocks[op.ID] = b
			devOf[op.ID] = op.Dev
			o.Blocks[op.ID] = Block{Addr: b.Ptr, Size: b.Size}
			live.add(op.ID)
			observe(op.Dev)
		case Free:
			if op.Dev != Host {
				free(op.ID)
			}
		case Reclaim:
			if err := reclaim(2 * int64(i)); err != nil {
				return nil, err
			}
		case EmptyCache:
			st.allocs[op.Dev].EmptyCache()
		case Driver:
			d := st.devs[op.Dev]
			if err := d.TakeDriverMemory(op.Size); err != nil {
				// as tensor's blasWorkspaceOf reports it
				a := st.allocs[op.Dev]
				free, total, _ := d.MemGetInfo()
				idx, _ := strconv.Atoi(strings.TrimPrefix(d.Name(), "cuda:"))
				e := fmt.Errorf("creating a cuBLAS handle (CUBLAS_STATUS_ALLOC_FAILED): %w", &backend.OOMError{
					Device: d.Name(), Index: idx, Requested: op.Size, Total: total, Free: free,
					Allocated: a.Allocated(), Reserved: a.Reserved()})
				return o.oom(st, p, blocks, devOf, start, e), nil
			}
		}
	}
	for i, a := range st.allocs {
		o.Allocated[i] = a.Allocated()
		o.Free[i], _, _ = st.devs[i].MemGetInfo()
	}
	return o, nil
}

// oom ends a replay that ran out of memory: the trial's allocations are
// freed as the error unwinds it (no segment goes back to the device), but
// those that outlive it (a library's workspace).
func (o *Outcome) oom(st *Start, p *Plan, blocks []*backend.Block, devOf []int, start []uint64, err error) *Outcome {
	o.Status, o.Err = "oom", err
	copy(o.Allocated, start)
	for id, b := range blocks {
		if b != nil && p.Keep[id] {
			o.Allocated[devOf[id]] += b.Size
		}
	}
	for i := range st.allocs {
		o.Free[i], _, _ = st.devs[i].MemGetInfo()
	}
	return o
}

// OOMError returns the *backend.OOMError of an "oom" outcome.
func (o *Outcome) OOMError() *backend.OOMError {
	var e *backend.OOMError
	if errors.As(o.Err, &e) {
		return e
	}
	return nil
}

// liveSet is a replay's live GPU allocations, by the moments that tell
// when they became garbage: two heaps with lazy deletion.
type liveSet struct {
	plan        *Plan
	in          []bool
	byDead      idHeap // by Dead
	byAlive     idHeap // by Alive
	initialized bool
}

func (l *liveSet) add(id int32) {
	if !l.initialized {
		l.in = make([]bool, len(l.plan.Dead))
		l.byDead.key, l.byAlive.key = l.plan.Dead, l.plan.Alive
		l.initialized = true
	}
	l.in[id] = true
	if l.plan.Dead[id] != never {
		l.byDead.push(id)
	}
	l.byAlive.push(id)
}

func (l *liveSet) drop(id int32) {
	if l.initialized {
		l.in[id] = false
	}
}

// deadBy returns a live allocation found garbage by moment at.
func (l *liveSet) deadBy(at int64) (int32, bool) {
	h := &l.byDead
	for len(h.ids) > 0 {
		id := h.ids[0]
		if !l.in[id] {
			h.pop()
			continue
		}
		if h.key[id] <= at {
			h.pop()
			return id, true
		}
		break
	}
	return 0, false
}

// unknownAt returns a live allocation not known to be live at moment at
// (deadBy has taken those known garbage).
func (l *liveSet) unknownAt(at int64) (int32, bool) {
	h := &l.byAlive
	for len(h.ids) > 0 {
		id := h.ids[0]
		if !l.in[id] {
			h.pop()
			continue
		}
		return id, h.key[id] < at
	}
	return 0, false
}

// idHeap is a min-heap of allocation IDs by key[id].
type idHeap struct {
	ids []int32
	key []int64
}

func (h *idHeap) push(id int32) {
	h.ids = append(h.ids, id)
	i := len(h.ids) - 1
	k := h.key[id]
	for i > 0 {
		p := (i - 1) / 2
		if h.key[h.ids[p]] <= k {
			break
		}
		h.ids[i] = h.ids[p]
		i = p
	}
	h.ids[i] = id
}

func (h *idHeap) pop() {
	n := len(h.ids) - 1
	last := h.ids[n]
	h.ids = h.ids[:n]
	if n == 0 {
		return
	}
	k := h.key[last]
	i := 0
	for {
		c := 2*i + 1
		if c >= n {
			break
		}
		if c+1 < n && h.key[h.ids[c+1]] < h.key[h.ids[c]] {
			c++
		}
		if h.key[h.ids[c]] >= k {
			break
		}
		h.ids[i] = h.ids[c]
		i = c
	}
	h.ids[i] = last
}
