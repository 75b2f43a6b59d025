package backend

import "slices"

// Frames keeps, between reach walks, which allocations each frame of the
// running call stack reached, so that a walk need not visit again the
// frames that have not run since the last one (a deep recursion would
// otherwise walk every frame at every reclaim: quadratic in its depth).
//
// Frames are numbered from the bottom of the stack: 0 is the outermost.
// A walk first says how many bottom frames it keeps (Keep) — those whose
// values cannot have changed since the last walk; the layer that knows the
// call stack decides (scope: the frames below the thread's low-water mark,
// when nothing that may change an existing value ran since) — then walks
// the others bottom-up, calling Enter before each, and Enter(-1) before
// the roots that are not frames. Each allocation a walk reaches is
// credited to the lowest frame that reached it; the allocations credited
// to kept frames count as reached without a visit. The credit of a frame
// lasts until the frame is walked again, until an allocation credited to
// it (or to a frame below) is freed, or until Go code notes that a value
// let go of memory (NoteGarbage; not NoteHeldGarbage or
// Dropped, for memory no value held): then the frames from there up are
// walked again at the next reclaim. The values many paths lead to
// (autograd nodes, tensors, modules) carry a Mark of the frame a walk met
// them in, and a walk that keeps that frame does not look into them
// again (Visit).
type Frames struct {
	gens []uint64 // gens[i]: the generation of frame i's credits (0: none)
	cum  []int    // cum[i]: the live allocations credited to frames 0..i
	kept int      // frames kept at the start of the running walk
	cur  int      // the frame being walked, -1 when none
	n    int      // allocations credited to cur so far
	next uint64   // the last generation handed out
	// extending: cur is a kept frame being extended (Extend); extended,
	// the allocations extensions credited in the running walk (counted
	// by the walk as it reaches them, not by keptCount); taken, the
	// lowest kept frame above cur whose credits or marks the extension
	// took over (len(gens) when none).
	extending       bool
	extended, taken int
	// growable: the bottom frames whose values may grow between walks
	// (SetGrowable); grown, the values noted grown since (NoteGrew)
	growable int
	grown    []growth
	// Walked counts the frames walked (Enter with i >= 0) over the
	// Manager's life; Kept, the frames a walk did not walk because it
	// kept their credits; Skipped, the values a walk did not look into
	// because a kept frame's credits hold what they reach (Visit).
	Walked, Kept, Skipped int
}

// growth is a value noted grown (Manager.NoteGrew), met by a walk in
// frame (of generation gen) that may grow.
type growth struct {
	frame int32
	gen   uint64
	v     any
}

// SetGrowable says that the n bottom frames may grow: a value a walk met
// in one of them that comes to reach more memory and none less (a leaf
// given its first gradient: Manager.NoteGrew) is noted, and the next walk
// that keeps the frame extends it by that value (Grown, Extend), instead
// of walking the frames from there up again. The layer that walks sets
// it at each walk (0 when its frames are numbered otherwise).
func (f *Frames) SetGrowable(n int) {
	f.growable = n
	// growth noted in a frame that may no longer grow: forget the frame
	for _, g := range f.grown {
		if int(g.frame) >= n && int(g.frame) < len(f.gens) && f.gens[g.frame] == g.gen {
			f.truncate(int(g.frame))
		}
	}
	f.grown = slices.DeleteFunc(f.grown, func(g growth) bool { return int(g.frame) >= n })
}

// Growing reports whether values were noted grown since the last walk
// that took them (Grown).
func (f *Frames) Growing() bool { return len(f.grown) > 0 }

// Grown returns the values noted grown in kept frame i since the last
// walk that took them, and forgets them: the walk extends frame i by
// them (Extend).
func (f *Frames) Grown(i int) []any {
	var out []any
	f.grown = slices.DeleteFunc(f.grown, func(g growth) bool {
		if int(g.frame) != i {
			return false
		}
		if i < f.kept && f.gens[i] == g.gen {
			out = append(out, g.v)
		}
		return true
	})
	return out
}

// letGo lets go of the values noted grown, for a collection that must
// not see them: the frames they grew are forgotten instead of extended.
func (f *Frames) letGo() {
	if len(f.grown) == 0 {
		return
	}
	n := len(f.gens)
	for _, g := range f.grown {
		n = min(n, int(g.frame))
	}
	f.truncate(n)
	f.grown = nil
}

// grew notes v, whose mark is mk, grown: extended at the next walk if the
// frame that met it may grow, else as changed.
func (f *Frames) grew(mk *Mark, v any) {
	if mk.gen == 0 || int(mk.frame) >= len(f.gens) || f.gens[mk.frame] != mk.gen {
		return // no frame's credits stand for it
	}
	if int(mk.frame) < f.growable {
		f.grown = append(f.grown, growth{mk.frame, mk.gen, v})
		return
	}
	f.truncate(int(mk.frame))
}

// Keep keeps the credits of the n bottom frames (or of as many as Frames
// has) for the walk that starts, and returns how many it kept.
func (f *Frames) Keep(n int) int {
	n = max(0, min(n, len(f.gens)))
	f.truncate(n)
	f.kept, f.cur, f.n = n, -1, 0
	f.Kept += n
	return n
}

// begin readies f for a walk that keeps nothing unless it calls Keep.
func (f *Frames) begin() { f.kept, f.cur, f.n, f.extending, f.extended = 0, -1, 0, false, 0 }

// Extend reopens kept frame i for more credits, before any frame is
// entered: what frame i reaches has only grown since the last walk (the
// list it stands for was appended to), and the walk visits what was added
// instead of walking the frame again. A value the extension reaches
// that a kept frame above i holds (an allocation credited to it, a
// value marked in it) is taken over by frame i — each allocation is
// credited to the lowest frame that reaches it — and EndExtend then
// forgets the credits from the lowest such frame up.
func (f *Frames) Extend(i int) {
	if i < 0 || i >= f.kept || f.cur >= 0 {
		panic("backend: Frames.Extend of a frame not kept")
	}
	f.cur, f.n, f.extending, f.taken = i, 0, true, len(f.gens)
}

// EndExtend ends the extension Extend began and returns the frames
// still kept: fewer when the extension took values over from a kept
// frame above.
func (f *Frames) EndExtend() int {
	f.close()
	if f.taken < f.kept {
		f.truncate(f.taken)
	}
	return f.kept
}

// Enter starts frame i (Keep's result, or one more than the frame entered
// before it), or, with i = -1, the roots that are not frames: the
// allocations visited from now on are credited to it.
func (f *Frames) Enter(i int) {
	f.close()
	if i < 0 {
		return
	}
	if i != len(f.gens) {
		panic("backend: Frames.Enter out of order")
	}
	f.next++
	f.gens = append(f.gens, f.next)
	f.cum = append(f.cum, f.below(i))
	f.cur, f.n = i, 0
	f.Walked++
}

// close ends the frame being walked: its credits join the running total.
func (f *Frames) close() {
	switch {
	case f.extending:
		for j := f.cur; j < len(f.cum); j++ {
			f.cum[j] += f.n
		}
		f.extended += f.n
		f.extending = false
	case f.cur >= 0:
		f.cum[f.cur] = f.below(f.cur) + f.n
	}
	f.cur, f.n = -1, 0
}

// below returns the allocations credited to the frames under i.
func (f *Frames) below(i int) int {
	if i == 0 {
		return 0
	}
	return f.cum[i-1]
}

// keptCount returns the live allocations credited to the kept frames
// before the walk (those extensions credited, the walk counted).
func (f *Frames) keptCount() int { return f.below(f.kept) - f.extended }

// truncate forgets the credits of frames n and up.
func (f *Frames) truncate(n int) {
	if n < len(f.gens) {
		f.gens, f.cum = f.gens[:n], f.cum[:n]
	}
	f.kept = min(f.kept, n)
	if len(f.grown) > 0 {
		f.grown = slices.DeleteFunc(f.grown, func(g growth) bool { return int(g.frame) >= n })
	}
}

// Drop forgets the credits of frames i and up: a walk cut short in frame
// i (stopped: an interrupt) calls it, and the next walk may keep the frames
// below.
func (f *Frames) Drop(i int) { f.cur, f.n, f.extending = -1, 0, false; f.truncate(i) }

// Reset forgets every frame's credits.
func (f *Frames) Reset() { f.truncate(0); f.cur, f.n, f.extending, f.extended = -1, 0, false, 0 }

// holds reports whether r is credited to a kept frame.
func (f *Frames) holds(r *record) bool {
	if r.gen == 0 || int(r.frame) >= f.kept || f.gens[r.frame] != r.gen {
		return false
	}
	if f.extending && int(r.frame) > f.cur {
		f.taken = min(f.taken, int(r.frame)) // taken over (Extend)
		return false
	}
	return true
}

// credit credits r, reached for the first time in this walk, to the
// frame being walked.
func (f *Frames) credit(r *record) {
	if f.cur < 0 {
		r.gen = 0
		return
	}
	r.frame, r.gen = int32(f.cur), f.gens[f.cur]
	f.n++
}

// freed forgets the credits from r's frame up when r, which is freed,
// was credited to a frame: the counts no longer hold.
func (f *Frames) freed(r *record) {
	if r.gen != 0 && int(r.frame) < len(f.gens) && f.gens[r.frame] == r.gen {
		f.truncate(int(r.frame))
	}
}

// Mark is where reach walks met a value that many paths lead to and that
// holds allocations in turn (an autograd node, a tensor, a module): the
// walk that last met it, and the frame it was credited to then (Visit).
// Its zero value is a value no walk has met.
type Mark struct {
	epoch uint64 // the walk that last met it
	gen   uint64 // the generation of the frame it was met in, 0 for none
	frame int32
}

// Visit reports whether the walk numbered epoch must look into the value
// that m marks, and marks it met: false when the walk has met it already,
// or when an earlier walk met it in a frame whose credits this walk keeps.
//
// A value met while walking frame k was reachable from frame k's values,
// and whatever it reached was credited to frame k or to a frame below
// (the allocations the walk had met before: a walk walks its frames
// before any root that is not one, and a part of it that credits
// nothing must leave the marks alone or run apart) — or, for what it
// skipped by this rule, to a frame below k that was kept then, and so is
// kept while k is. While k's credits are kept nothing that frame reaches
// has changed (Keep; Go code that changes what a value reaches says so:
// Manager.NoteChanged), so the value still reaches only allocations those
// frames hold: looking into it again would find nothing new. f may be nil
// (a walk that credits no frame): then only the walk's own marks count.
func (f *Frames) Visit(m *Mark, epoch uint64) bool {
	if m.epoch == epoch {
		return false
	}
	if f != nil && m.gen != 0 && int(m.frame) < f.kept && f.gens[m.frame] == m.gen {
		if !f.extending || int(m.frame) <= f.cur {
			f.Skipped++
			return false
		}
		f.taken = min(f.taken, int(m.frame)) // taken over (Extend)
	}
	m.epoch = epoch
	// A part of the walk that credits no frame (the roots that are not
	// frames, after them; f nil: a walk of its own, Walker.Apart) leaves
	// the mark's frame as it is: while that frame is kept, it is still
	// the lowest that reaches the value (NoteChanged relies on it).
	if f != nil && f.cur >= 0 {
		m.frame, m.gen = int32(f.cur), f.gens[f.cur]
	}
	return true
}

// changed forgets the credits of the frame a walk met the value m marks
// in, and of the frames above it: that value may now reach other memory.
// nil forgets every frame's.
func (f *Frames) changed(m *Mark) {
	if m == nil {
		f.Reset()
		return
	}
	if m.gen != 0 && int(m.frame) < len(f.gens) && f.gens[m.frame] == m.gen {
		f.truncate(int(m.frame))
	}
}
