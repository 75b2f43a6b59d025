package backend

// When garbage may exist: the layout clock (a reclaim before a GPU
// allocation only when something may have become garbage since the last
// one) and the notes Go code gives the Manager when it lets go of memory.

// layoutMin: exact mode reclaims before allocations larger than this
// only (PyTorch's small-pool limit, 1 MiB). Smaller ones come from 2 MiB
// small-pool segments, where which block a request gets moves reserved
// bytes by a segment at most; they skip the reclaim (half of a GPT-2
// step's allocations), and the next large allocation frees what they
// left.
const layoutMin = 1 << 20

// mayHaveGarbage reports, for exact mode, whether something may have
// become garbage since the last layout reclaim: the layout clock moved
// (Starlark code ran, or a call began or ended) or Go code noted garbage
// (NoteGarbage). Without a clock, always.
func (m *Manager) mayHaveGarbage() bool {
	return m.layout.clock == nil || m.layout.notes != m.layout.seenNotes || m.layout.clock() != m.layout.seen
}

// Quiet declares a region of Go code (an optimizer's step) that runs no
// Starlark and lets go of no memory without saying so (NoteGarbage,
// NoteHeldGarbage, Dropped and the like), until the returned function is
// called: in it exact mode's reclaim before an allocation that raises a
// peak runs only when something may have become garbage since the last
// reclaim (mayHaveGarbage), whatever the allocation's size or allocator
// — outside, small allocations reclaim for a peak whatever the clock
// says, because Go code may drop a small temporary without a note. A
// peak reclaim in the region counts as the last reclaim. Regions nest.
func (m *Manager) Quiet() (end func()) {
	m.mu.Lock()
	m.quiet++
	m.mu.Unlock()
	return func() {
		m.mu.Lock()
		m.quiet--
		m.mu.Unlock()
	}
}

// quietNow reports that a Quiet region runs and nothing may have become
// garbage since the last reclaim: a reclaim for a peak would find nothing.
func (m *Manager) quietNow() bool {
	return m.quiet > 0 && !m.mayHaveGarbage()
}

// layoutReclaimed records a reclaim that freed whatever was garbage: the
// clock and the notes mayHaveGarbage compares with from now on.
func (m *Manager) layoutReclaimed() {
	if m.layout.clock != nil {
		m.layout.seen, m.layout.seenNotes = m.layout.clock(), m.layout.notes
	}
}

// SetLayoutClock installs the clock exact mode consults (see
// mayHaveGarbage): a counter that moves whenever values the Manager's
// allocations hang off may have been dropped (scope: the Starlark
// thread's call counter). nil makes every allocation reclaim first.
func (m *Manager) SetLayoutClock(clock func() uint64) {
	m.mu.Lock()
	m.layout.clock = clock
	m.layout.notes++
	m.mu.Unlock()
}

// layoutState is exact mode's memory of its last reclaim.
type layoutState struct {
	clock func() uint64
	seen  uint64 // the clock at the last layout reclaim
	// notes counts the notes of garbage (NoteGarbage and the like);
	// seenNotes is the count at the last layout reclaim: they differ
	// when Go code noted garbage since
	notes, seenNotes uint64
}

// LayoutSeen returns the layout clock and the count of garbage notes at
// exact mode's last reclaim (a recorder of a trial's stream starts from
// them: Event.Clock, Event.Notes).
func (m *Manager) LayoutSeen() (clock, notes uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.layout.seen, m.layout.seenNotes
}

// layoutNow returns the layout clock (0 without one) and the count of
// garbage notes.
func (m *Manager) layoutNow() (clock, notes uint64, ok bool) {
	if m.layout.clock == nil {
		return 0, m.layout.notes, false
	}
	return m.layout.clock(), m.layout.notes, true
}

// caching reports whether a is a caching allocator, whose choice of block
// depends on which blocks are free (exact mode's reclaims for the layout).
func caching(a Allocator) bool {
	_, ok := a.(interface{ NeedsSegment(uint64) bool })
	return ok
}

// NoteGarbage tells the Manager that memory may just have become
// unreachable (an autograd node released its saved tensors, the backward
// engine dropped a gradient, an optimizer step's temporaries): layout
// mode looks for garbage before the next allocation. What earlier walks
// credited to the frames (Frames) is forgotten: a value those frames
// reach may no longer hold that memory.
func (m *Manager) NoteGarbage() { m.note((*Frames).Reset) }

// note is what the notes share: exact mode looks for garbage before its
// next allocation; forget, if not nil, drops the frames' credits that no
// longer hold.
func (m *Manager) note(forget func(*Frames)) {
	m.mu.Lock()
	m.layout.notes++
	if forget != nil {
		forget(&m.reach.frames)
	}
	m.mu.Unlock()
}

// NoteChanged tells the Manager that the value mk marks (an autograd
// node, a tensor) may reach other memory than when a walk last met it,
// though no callable that is not pure ran (starlark.Mutations): a
// checkpoint's holder was given its recomputed tensor or let go of it, a
// gradient was replaced (tensor.Tensor.ReachChanged). What earlier
// walks credited to the frame that met it, and to those above, is
// forgotten (a frame below that reaches it met it first, so none does);
// nil forgets every frame's credits.
func (m *Manager) NoteChanged(mk *Mark) {
	m.mu.Lock()
	m.reach.frames.changed(mk)
	m.mu.Unlock()
}

// NoteGrew tells the Manager that the value mk marks, v, reaches more
// memory than when a walk last met it, and none less, though no callable
// that is not pure ran: a leaf given its first gradient. If the frame
// that met it may grow (Frames.SetGrowable), the next walk that keeps
// that frame walks v again to extend it (Frames.Grown); otherwise it is
// NoteChanged.
func (m *Manager) NoteGrew(mk *Mark, v any) {
	m.mu.Lock()
	m.reach.frames.grew(mk, v)
	m.mu.Unlock()
}

// NoteGarbageAt is NoteGarbage for memory that the value mk marks let go
// of (an autograd node that released its saved tensors): only the credits
// of the frame a walk met it in and of those above are forgotten
// (NoteChanged), and those from frame from up (from < 0: none), for a
// frame that is gone.
func (m *Manager) NoteGarbageAt(mk *Mark, from int) {
	m.note(func(f *Frames) {
		f.changed(mk)
		if from >= 0 {
			f.truncate(from)
		}
	})
}

// NoteHeldGarbage is NoteGarbage for memory that only the calling Go code
// held (Context.Hold, its own variables), which no value changed to let
// go of: autocast's casts when the op that made them returns, an
// autograd node's unpacked tensors. What the frames reach is what it
// was, so their credits stand.
func (m *Manager) NoteHeldGarbage() { m.note(nil) }

// Dropped tells the Manager that the running Go code that made h no
// longer holds it: a reach walk that does not reach h may free it even
// though h was made after the walk's Horizon (which otherwise leaves h to
// the collector). The caller must hold no other handle to h's memory
// that the walk cannot see. Exact mode looks for garbage before its next
// allocation, as after NoteDropped; no value changed, so the frames'
// credits stand (NoteHeldGarbage).
func (m *Manager) Dropped(h *Memory) {
	m.mu.Lock()
	h.rec.dropped = true
	m.layout.notes++
	m.mu.Unlock()
}
