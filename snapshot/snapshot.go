// Package snapshot records the allocation history of a Session's GPUs and
// writes it as a PyTorch memory snapshot, the pickle that
// torch.cuda.memory._dump_snapshot writes and pytorch.org/memory_viz
// shows (cuda.record_memory_history and cuda.dump_snapshot).
//
// A snapshot is a dict:
//
//	memsh: Mark (first: memsh's own snapshots are proven by it, Verify)
//	segments: [{device, address, total_size, allocated_size, active_size,
//	            requested_size, stream, segment_type ("small"/"large"),
//	            segment_pool_id, is_expandable, frames,
//	            blocks: [{address, size, requested_size,
//	                      state ("active_allocated"/"active_pending_free"/"inactive"), frames}]}]
//	device_traces: one list per GPU ordinal of
//	            {action, addr, size, stream, time_us, frames}
//	            with action alloc, free_requested, free_completed,
//	            segment_alloc, segment_free, or oom (whose entry has
//	            device_free, the device's free bytes, instead of addr)
//
// from the caching allocators' segments (backend.CachingAllocator.Segments)
// and the Manager's memory events. Sizes are bytes, time_us microseconds
// since the Unix epoch. Frames are the Starlark call stack at the event,
// innermost first: {filename, line, name}. Streams are always 0. An
// alloc or free entry's size is the requested bytes (PyTorch's orig_size,
// before the 512-byte rounding), as PyTorch's trace records it; the block
// sizes are in segments' blocks.
//
// What a free records. PyTorch frees a block when its last reference
// drops, and records that moment's time and Python stack. memsh learns that
// a block is garbage only when it reclaims (a GC pass over the handles);
// the exact moment the last Starlark reference went away is not
// observable. So, while history is recorded, memsh reclaims at the end of
// every top-level statement (StatementEnd), and a free_requested /
// free_completed pair carries:
//
//   - for a block released explicitly (buffer.free(), an experiment's
//     finish releasing what it allocated): the time and Starlark stack of
//     that call — the free itself;
//   - for a block reclaimed during the statement in which it became
//     unreachable (by gc(), by exact-peak mode before an allocation that
//     would raise a peak, before an OOM, by dump_snapshot): the time and
//     stack of that reclaim, which is in the same statement, after the
//     last reference went;
//   - otherwise: the end of the top-level statement in which it became
//     unreachable, with one frame {filename, line, "<toplevel>"} naming
//     that statement's first line.
//
// Garbage made inside a function call is thus attributed to the top-level
// statement that made the call, at the latest at its end — never to a
// later statement's allocation.
package snapshot

import (
	"io"
	"sync"
	"time"

	"go.starlark.net/starlark"
	"go.starlark.net/syntax"

	"github.com/memsh/memsh/backend"
	"github.com/memsh/memsh/fsafe"
)

// DefaultMaxEntries is the default length of each device's history, as
// cuda.record_memory_history's max_entries.
const DefaultMaxEntries = 100_000

// Frame is one Starlark call site.
type Frame struct {
	Filename string
	Line     int
	Name     string
}

type entry struct {
	action     string
	addr       uintptr
	size       uint64
	deviceFree uint64 // oom only
	timeUS     int64
	frames     []Frame
}

// Recorder keeps the recent memory events of every GPU of a Manager, in a
// ring of MaxEntries entries per device (the oldest dropped first), with
// the Starlark frames of each; and the allocation frames of the blocks
// and segments live now.
type Recorder struct {
	mu         sync.Mutex
	mgr        *backend.Manager
	thread     *starlark.Thread
	maxEntries int
	remove     func()
	recording  bool
	site       []Frame // while StatementEnd reclaims: the frames its frees get

	ordinals    map[string]int // "cuda:0" -> 0
	traces      [][]entry      // per ordinal
	heads       []int          // per ordinal: the oldest entry once the ring is full
	blockFrames []map[uintptr][]Frame
	segFrames   []map[uintptr][]Frame
}

// New returns a Recorder over mgr's GPUs that records nothing yet.
func New(mgr *backend.Manager) *Recorder {
	r := &Recorder{mgr: mgr, ordinals: map[string]int{}}
	for i := 0; i < mgr.NumGPUs(); i++ {
		r.ordinals[mgr.GPU(i).Device().Name()] = i
	}
	r.reset()
	return r
}

func (r *Recorder) reset() {
	n := r.mgr.NumGPUs()
	r.traces = make([][]entry, n)
	r.heads = make([]int, n)
	r.blockFrames = make([]map[uintptr][]Frame, n)
	r.segFrames = make([]map[uintptr][]Frame, n)
	for i := range n {
		r.blockFrames[i] = map[uintptr][]Frame{}
		r.segFrames[i] = map[uintptr][]Frame{}
	}
}

// Enable starts recording afresh (earlier history is dropped), keeping at
// most maxEntries events per device; frames are read from thread's call
// stack, which must be the thread that allocates.
func (r *Recorder) Enable(thread *starlark.Thread, maxEntries int) {
	r.mu.Lock()
	r.thread, r.maxEntries = thread, max(maxEntries, 1)
	r.reset()
	r.recording = true
	r.mu.Unlock()
	if r.remove == nil {
		r.remove = r.mgr.Observe(r.observe)
	}
}

// Disable stops recording; what was recorded stays in later snapshots
// until Enable starts again. (The Recorder still forgets the frames of
// blocks and segments freed from now on, so a later block at the same
// address never shows another's frames.)
func (r *Recorder) Disable() {
	r.mu.Lock()
	r.recording = false
	r.mu.Unlock()
}

// Close stops observing the Manager.
func (r *Recorder) Close() {
	r.Disable()
	if r.remove != nil {
		r.remove()
		r.remove = nil
	}
}

// StatementEnd is called after each top-level statement (at pos) of the
// Session whose history this is: while recording, it reclaims, so the
// blocks that became garbage in the statement are freed now and their
// frees carry the statement's end time and a frame naming the statement
// (see the package doc). It does nothing while not recording.
func (r *Recorder) StatementEnd(pos syntax.Position) {
	r.mu.Lock()
	if !r.recording {
		r.mu.Unlock()
		return
	}
	r.site = []Frame{{Filename: pos.Filename(), Line: int(pos.Line), Name: "<toplevel>"}}
	r.mu.Unlock()
	r.mgr.Reclaim()
	r.mu.Lock()
	r.site = nil
	r.mu.Unlock()
}

// Enabled reports whether the Recorder is recording.
func (r *Recorder) Enabled() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.recording
}

// observe runs for every memory event, with the Manager locked, on the
// goroutine that allocates.
func (r *Recorder) observe(e backend.Event) {
	dev, ok := r.ordinals[e.Device]
	if !ok {
		return // host memory
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.recording {
		switch e.Kind {
		case backend.EventAlloc, backend.EventFree:
			delete(r.blockFrames[dev], e.Addr)
		case backend.EventSegmentAlloc, backend.EventSegmentFree:
			delete(r.segFrames[dev], e.Addr)
		}
		return
	}
	now := time.Now().UnixMicro()
	frames := r.frames()
	if r.site != nil {
		frames = r.site
	}
	switch e.Kind {
	case backend.EventAlloc:
		r.add(dev, entry{action: "alloc", addr: e.Addr, size: e.Requested, timeUS: now, frames: frames})
		r.blockFrames[dev][e.Addr] = frames
	case backend.EventFree:
		r.add(dev, entry{action: "free_requested", addr: e.Addr, size: e.Requested, timeUS: now, frames: frames})
		r.add(dev, entry{action: "free_completed", addr: e.Addr, size: e.Requested, timeUS: now, frames: frames})
		delete(r.blockFrames[dev], e.Addr)
	case backend.EventSegmentAlloc:
		r.add(dev, entry{action: "segment_alloc", addr: e.Addr, size: e.Size, timeUS: now, frames: frames})
		r.segFrames[dev][e.Addr] = frames
	case backend.EventSegmentFree:
		r.add(dev, entry{action: "segment_free", addr: e.Addr, size: e.Size, timeUS: now, frames: frames})
		delete(r.segFrames[dev], e.Addr)
	case backend.EventOOM:
		free, _, _ := r.mgr.GPU(dev).Device().MemGetInfo()
		r.add(dev, entry{action: "oom", size: e.Size, deviceFree: free, timeUS: now, frames: frames})
	}
}

func (r *Recorder) add(dev int, e entry) {
	t := r.traces[dev]
	if len(t) < r.maxEntries {
		r.traces[dev] = append(t, e)
		return
	}
	t[r.heads[dev]] = e
	r.heads[dev] = (r.heads[dev] + 1) % len(t)
}

// frames returns the Starlark call stack, innermost first.
func (r *Recorder) frames() []Frame {
	if r.thread == nil {
		return nil
	}
	cs := r.thread.CallStack()
	out := make([]Frame, len(cs))
	for i, f := range cs {
		out[len(cs)-1-i] = Frame{Filename: f.Pos.Filename(), Line: int(f.Pos.Line), Name: f.Name}
	}
	return out
}

// Snapshot returns the snapshot dict (see the package doc).
func (r *Recorder) Snapshot() Dict {
	r.mu.Lock()
	defer r.mu.Unlock()
	segments := []any{}
	for dev := 0; dev < r.mgr.NumGPUs(); dev++ {
		a, ok := r.mgr.GPU(dev).(interface{ Segments() []backend.SegmentInfo })
		if !ok {
			continue
		}
		for _, s := range a.Segments() {
			segments = append(segments, r.segment(dev, s))
		}
	}
	traces := make([]any, len(r.traces))
	for dev, t := range r.traces {
		l := make([]any, 0, len(t))
		for i := range t {
			e := t[(r.heads[dev]+i)%len(t)]
			d := Dict{{"action", e.action}}
			if e.action == "oom" {
				d = append(d, Item{"device_free", e.deviceFree})
			} else {
				d = append(d, Item{"addr", uint64(e.addr)})
			}
			d = append(d, Item{"size", e.size}, Item{"stream", 0}, Item{"time_us", e.timeUS}, Item{"frames", frameList(e.frames)})
			l = append(l, d)
		}
		traces[dev] = l
	}
	return Dict{{"memsh", Mark}, {"segments", segments}, {"device_traces", traces}}
}

func (r *Recorder) segment(dev int, s backend.SegmentInfo) Dict {
	var allocated, active, requested uint64
	blocks := make([]any, len(s.Blocks))
	for i, b := range s.Blocks {
		state := "inactive"
		var frames []Frame
		if b.Pending {
			// freed, waiting for another stream's event: still active
			state = "active_pending_free"
			active += b.Size
		}
		if b.Allocated {
			active += b.Size
			state = "active_allocated"
			allocated += b.Size
			requested += b.Requested
			if dev < len(r.blockFrames) {
				frames = r.blockFrames[dev][b.Ptr]
			}
		}
		blocks[i] = Dict{{"address", uint64(b.Ptr)}, {"size", b.Size}, {"requested_size", b.Requested},
			{"state", state}, {"frames", frameList(frames)}}
	}
	var frames []Frame
	if dev < len(r.segFrames) {
		frames = r.segFrames[dev][s.Ptr]
	}
	return Dict{
		{"device", dev}, {"address", uint64(s.Ptr)}, {"total_size", s.Size},
		{"allocated_size", allocated}, {"active_size", active}, {"requested_size", requested},
		{"stream", int(s.Stream)}, {"segment_type", s.Pool}, {"segment_pool_id", Tuple{0, 0}},
		{"is_expandable", false}, {"frames", frameList(frames)}, {"blocks", blocks},
	}
}

func frameList(fs []Frame) []any {
	l := make([]any, len(fs))
	for i, f := range fs {
		l[i] = Dict{{"filename", f.Filename}, {"line", f.Line}, {"name", f.Name}}
	}
	return l
}

// WriteFile writes the snapshot to path as a protocol 2 pickle, through
// fsafe (a file that is not a memsh snapshot is not replaced).
func (r *Recorder) WriteFile(path string) error {
	snap := r.Snapshot()
	return fsafe.WriteFile(path, fsafe.Snapshot, false, func(w io.Writer) error { return Pickle(w, snap) })
}
