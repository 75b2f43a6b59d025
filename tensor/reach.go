package tensor

import (
	"slices"
	"sync/atomic"

	"github.com/memsh/memsh/backend"
)

// Reacher walks what holds device memory, for the Manager's proof that a
// reclaim would find nothing (backend.ReachFunc): the layer above starts
// it at its roots, calls Tensor for every tensor it reaches, and Drain at
// the end. It only follows references that exist; what it cannot look
// into it skips, which leaves that memory unreached and sends the reclaim
// to the collector.
type Reacher struct {
	// Epoch identifies this walk: autograd nodes and tensors remember the
	// epoch they were walked in (Visit), so a graph is walked once however
	// many tensors share it.
	Epoch uint64
	// Frames, if not nil, are the credits of the frames the walk keeps
	// (backend.Frames.Visit): a node or tensor an earlier walk met in a
	// frame whose credits this walk keeps is not looked into again.
	Frames *backend.Frames
	// Looked counts the nodes and tensors the walk looked into (Visit).
	Looked int
	// Memory is called for every allocation reached.
	Memory func(*backend.Memory)
	// Other, if not nil, is called for values the engine keeps for the
	// layer above (what saved-tensor hooks packed).
	Other func(any)

	// Horizon is the lowest stamp a root gave Bound (when Bounded).
	Horizon    uint64
	BoundBy    string         // who gave Horizon
	Spans      []backend.Span // closed stretches roots protect (Protect)
	bounded    bool
	incomplete bool // a value could not be walked (Value)

	pending []GradNode

	// Frontier, while set (SetFrontier), keeps the walk out of autograd
	// state: Tensor reports a tensor's memory and, instead of walking its
	// gradient, grad_fn and accumulator, appends the tensor to
	// FrontierTensors; Node appends the node to FrontierNodes. What such a
	// walk reaches cannot change while no Starlark code runs and
	// ReachShape does not move (scope's walks during backward reuse it);
	// Autograd and Node walk the frontier later.
	frontier        bool
	FrontierTensors []*Tensor
	FrontierNodes   []GradNode
}

// reachShape moves whenever a tensor a Frontier walk reached gains or
// replaces its autograd state or its storage (reshaped) and the tensor
// has no Context; each Context's moves with those of its own (goRoots).
var reachShape atomic.Uint64

// ReachShape returns a counter that moves whenever a tensor of c (or of
// no Context) that a Frontier walk reached gains or replaces its autograd
// state, or is made to refer to other storage, or Go code notes a change
// to what an engine object of c holds (NoteHeld, NoteGrew): what a
// Frontier walk reached from values that did not change is what it was
// while the counter stands still. Contexts made apart (one per Session)
// share no tensors, so what one's tensors do moves no other's counter.
func (c *Context) ReachShape() uint64 {
	n := reachShape.Load()
	if c != nil && c.roots != nil {
		n += c.roots.shape.Load()
	}
	return n
}

// shapeMoved moves c's ReachShape (the shared counter when c is nil).
func (c *Context) shapeMoved() {
	if c == nil || c.roots == nil {
		reachShape.Add(1)
		return
	}
	c.roots.shape.Add(1)
}

// NoteHeld tells the reclaim that Go code changed what the values
// marked by marks hold — an engine object a walk reaches (FSDP2's
// buffers, a DDP reducer's buckets, a ZeRO engine's), or a module whose
// parameters Go code swapped: the kept frames that met them are walked
// again (backend.Manager.NoteChanged), and ReachShape moves, so a
// Frontier walk's findings no longer stand.
func NoteHeld(c *Context, marks ...*backend.Mark) {
	c.shapeMoved()
	if c == nil || c.Manager == nil {
		return
	}
	for _, mk := range marks {
		c.Manager.NoteChanged(mk)
	}
}

// Grown is what NoteGrew hands the reclaim: the tensors an engine value
// came to hold, which the next walk that keeps the frame that met the
// value walks to extend that frame (backend.Frames.Grown).
type Grown []*Tensor

// Reach passes the tensors to r (tensor.ReachRoot).
func (g Grown) Reach(r *Reacher) {
	for _, t := range g {
		r.Tensor(t)
	}
}

// NoteGrew tells the reclaim that the engine value mk marks (an
// optimizer that made a parameter's state) came to hold ts besides what
// it held when a walk last met it, and let go of nothing: the next walk
// that keeps the frame that met it walks only ts, to extend that frame
// (backend.Manager.NoteGrew), instead of walking the frame again; nil
// tensors are skipped. ReachShape moves, as for NoteHeld: a Frontier
// walk's findings no longer stand.
func NoteGrew(c *Context, mk *backend.Mark, ts ...*Tensor) {
	c.shapeMoved()
	if c == nil || c.Manager == nil {
		return
	}
	var g Grown
	for _, t := range ts {
		if t != nil {
			g = append(g, t)
		}
	}
	if len(g) > 0 {
		c.Manager.NoteGrew(mk, g)
	}
}

// reshaped notes that t's autograd state or storage changed (SetAutograd,
// EnsureAutograd, SetData).
func (t *Tensor) reshaped() {
	if t.memoed {
		t.ctx.shapeMoved()
	}
}

// Visit reports whether the walk must look into the value m marks, and
// marks it met (backend.Frames.Visit).
func (r *Reacher) Visit(m *backend.Mark) bool {
	if r.Frames.Visit(m, r.Epoch) {
		r.Looked++
		return true
	}
	return false
}

// SetFrontier turns frontier mode on or off (Frontier).
func (r *Reacher) SetFrontier(on bool) { r.frontier = on }

// Autograd walks what t's autograd state holds (its gradient, grad_fn and
// accumulator), t itself counting as met: for a tensor a Frontier walk
// set aside.
func (r *Reacher) Autograd(t *Tensor) {
	r.Visit(&t.mark)
	ag := t.ag
	if ag == nil {
		return
	}
	r.node(ag.GradFn, nil)
	r.node(ag.Accumulator, t)
	r.hooks(ag)
	r.Tensor(ag.Grad)
}

// hooks walks what ag's hooks keep for the layer above.
func (r *Reacher) hooks(ag *AutogradMeta) {
	for _, h := range ag.PostAccumulateGradHooks {
		if h.Held != nil {
			r.Value(h.Held)
		}
	}
}

// ReachNode is implemented by autograd nodes (package tensor/autograd):
// Reach calls r.Tensor for each tensor the node keeps alive (saved
// tensors, an AccumulateGrad node's variable) and r.Node for the nodes its
// edges lead to. Mark marks the node as walked in epoch and reports
// whether Reach has anything left to report: false when the walk need not
// look into it (Reacher.Visit), or when all it holds is from, the tensor
// whose gradient accumulator it is (which the walk is visiting).
type ReachNode interface {
	Reach(r *Reacher)
	Mark(r *Reacher, from *Tensor) bool
}

// Tensor walks t: its memory, and its gradient, grad_fn and gradient
// accumulator when it has autograd state (nodes are walked by Drain).
func (r *Reacher) Tensor(t *Tensor) {
	for t != nil {
		if !r.Visit(&t.mark) {
			return
		}
		if t.mem != nil {
			r.Memory(t.mem)
		}
		if r.frontier {
			t.memoed = true
		}
		ag := t.ag
		if ag == nil {
			return
		}
		if r.frontier {
			r.FrontierTensors = append(r.FrontierTensors, t)
			return
		}
		r.node(ag.GradFn, nil)
		r.node(ag.Accumulator, t)
		r.hooks(ag)
		t = ag.Grad
	}
}

// Value passes v, a value the layer above gave the engine to keep, to
// Other; without Other the walk is incomplete (Complete).
func (r *Reacher) Value(v any) {
	if r.Other == nil {
		r.incomplete = true
		return
	}
	r.Other(v)
}

// Complete reports whether the walk could look into every value the
// engine keeps for the layer above (Value).
func (r *Reacher) Complete() bool { return !r.incomplete }

// Node queues an autograd node for Drain, unless the walk has met it
// already.
func (r *Reacher) Node(n GradNode) {
	if r.frontier {
		if n != nil {
			r.FrontierNodes = append(r.FrontierNodes, n)
		}
		return
	}
	r.node(n, nil)
}

func (r *Reacher) node(n GradNode, from *Tensor) {
	if n != nil && n.Mark(r, from) {
		r.pending = append(r.pending, n)
	}
}

// Drain walks the queued nodes and all they lead to.
func (r *Reacher) Drain() {
	for len(r.pending) > 0 {
		n := r.pending[len(r.pending)-1]
		r.pending = r.pending[:len(r.pending)-1]
		n.Reach(r)
	}
}

// Context walks what the Context itself keeps alive — the tensors held in
// flight (Hold) and the cuBLAS workspaces — but the autocast cast cache
// (casts of parameters, held until the outermost autocast region ends),
// which the walk walks apart (Casts, CastsFrom).
func (r *Reacher) Context(c *Context) {
	if c == nil {
		return
	}
	for _, t := range c.inFlight {
		r.Tensor(t)
	}
	for _, m := range c.inFlightMem {
		r.Memory(m)
	}
	if c.roots != nil {
		for _, x := range c.roots.roots {
			(*x).Reach(r)
		}
	}
	if c.blas != nil {
		for _, m := range c.blas.ws {
			r.Memory(m)
		}
	}
}

// CastsFrom walks the casts of c's autocast cache from the i-th on
// (Casts).
func (r *Reacher) CastsFrom(c *Context, i int) {
	casts, _, _ := Casts(c)
	for _, t := range casts[min(i, len(casts)):] {
		r.Tensor(t)
	}
}

// Hold keeps ts reachable from the Context until the returned release is
// called: for tensors that Go code computes with while it allocates more,
// which only its local variables hold (the Go collector sees those; the
// reclaim proof does not). Calls nest: release in the reverse order;
// releasing a hold also releases the holds made after it.
func (c *Context) Hold(ts ...*Tensor) (release func()) {
	n := len(c.inFlight)
	c.inFlight = append(c.inFlight, ts...)
	return func() {
		clear(c.inFlight[n:])
		c.inFlight = c.inFlight[:n]
	}
}

// ReachRoot is Go code that holds tensors across allocations of its own
// (the autograd engine's input buffers): it reports them to the walk, and
// bounds the walk's horizon (Bound) below what it may hold unreported.
type ReachRoot interface {
	Reach(r *Reacher)
}

// FramedRoot is a ReachRoot that reports part of what it holds as frames
// of their own (backend.Frames), each kept until what it reaches changes:
// the autograd engine, whose frames are the nodes of its graph not run
// yet, which change only when one runs. A walk that walks them calls
// BeginFrames with its epoch and the number backend.Frames gives its
// frame 0 (frame i is base+i there: what it tells the Manager names
// those), then ReachFrame for each frame not kept, before any other
// root; Reach reports the rest, and the frames' values met on other
// paths are not looked into again (the frame does it).
type FramedRoot interface {
	ReachRoot
	Frames() int
	BeginFrames(epoch uint64, base int)
	ReachFrame(r *Reacher, i int)
}

// Framed returns the innermost of the Context's roots that is a
// FramedRoot, or nil.
func (c *Context) Framed() FramedRoot {
	if c == nil || c.roots == nil {
		return nil
	}
	for i := len(c.roots.roots) - 1; i >= 0; i-- {
		if f, ok := (*c.roots.roots[i]).(FramedRoot); ok {
			return f
		}
	}
	return nil
}

// ReachChanged tells t's Manager that t may reach other memory than when
// a walk last met it, its gradient having been replaced
// (backend.Manager.NoteChanged): the credits of the frame that met it go.
func (t *Tensor) ReachChanged() {
	if t.ctx != nil && t.ctx.Manager != nil {
		t.ctx.Manager.NoteChanged(&t.mark)
	}
}

// ReachGrew tells t's Manager that t reaches more memory than when a walk
// last met it, and none less: it was given its first gradient
// (backend.Manager.NoteGrew).
func (t *Tensor) ReachGrew() {
	if t.ctx != nil && t.ctx.Manager != nil {
		t.ctx.Manager.NoteGrew(&t.mark, t)
	}
}

// goRoots are the Context's ReachRoots and its tick count, shared with
// staging contexts.
type goRoots struct {
	// shape is the Context's part of ReachShape
	shape atomic.Uint64
	roots []*ReachRoot
	ticks uint64
	stamp func() uint64
	// gaps are the stretches of stamps in which Go code ran Starlark
	// code whose allocations it does not hold (Unheld), the last one
	// still open (To 0) while that code runs.
	gaps []backend.Span
}

// Unheld opens a stretch in which the running Go code (an autograd node
// recomputing a checkpointed region) runs code whose allocations it does
// not hold itself: a ReachRoot that bounds the walk (the engine) leaves
// that stretch out of what it protects (Gaps). done closes it.
func (c *Context) Unheld() (done func()) {
	g := c.goRoots()
	from := c.Tick() // unique: each Tick moves the clock
	g.gaps = append(g.gaps, backend.Span{From: from})
	return func() {
		// found by its start: Gaps may have dropped older ones meanwhile
		for i := range g.gaps {
			if g.gaps[i].From == from {
				g.gaps[i].To = c.Tick()
				return
			}
		}
	}
}

// Gaps returns the stretches opened by Unheld since stamp from (To 0 for
// one still open), oldest first, and forgets those that closed before it.
func (c *Context) Gaps(from uint64) []backend.Span {
	if c.roots == nil {
		return nil
	}
	g := c.roots
	kept := g.gaps[:0]
	for _, s := range g.gaps {
		if s.To == 0 || s.To >= from {
			kept = append(kept, s)
		}
	}
	clear(g.gaps[len(kept):])
	g.gaps = kept
	i := 0
	for i < len(kept) && kept[i].From < from {
		i++
	}
	return kept[i:]
}

// Root makes x a root of the reach walk (Reacher.Context) until release
// is called.
func (c *Context) Root(x ReachRoot) (release func()) {
	g := c.goRoots()
	p := &x
	g.roots = append(g.roots, p)
	return func() {
		for i, q := range g.roots {
			if q == p {
				g.roots = slices.Delete(g.roots, i, i+1) // clears the vacated slot
				break
			}
		}
	}
}

// SetStampClock gives the Context the clock allocations are stamped with
// (backend.Manager.SetStampClock): the layer above's clock plus Ticks.
func (c *Context) SetStampClock(clock func() uint64) { c.goRoots().stamp = clock }

// Tick advances the Context's tick count, which the stamp clock includes,
// and returns the stamp clock's value after it: allocations made from now
// on have at least that stamp (a ReachRoot's horizon, Reacher.Bound).
func (c *Context) Tick() uint64 {
	g := c.goRoots()
	g.ticks++
	if g.stamp == nil {
		return 0
	}
	return g.stamp()
}

// Ticks returns the Context's tick count.
func (c *Context) Ticks() uint64 {
	if c == nil || c.roots == nil {
		return 0
	}
	return c.roots.ticks
}

func (c *Context) goRoots() *goRoots {
	if c.roots == nil {
		c.roots = &goRoots{}
	}
	return c.roots
}

// Bound lowers the walk's horizon to stamp: what was allocated at or
// after it may be held by running Go code that the walk does not see
// (who names that code, for MEMSH_DEBUG_REACH).
func (r *Reacher) Bound(stamp uint64, who string) {
	if !r.bounded || stamp < r.Horizon {
		r.Horizon, r.bounded, r.BoundBy = stamp, true, who
	}
}

// Protect adds the stamps from from up to (not including) to to what
// running Go code may hold (who names it, for MEMSH_DEBUG_REACH).
func (r *Reacher) Protect(from, to uint64, who string) {
	if from < to {
		r.Spans = append(r.Spans, backend.Span{From: from, To: to})
		if r.BoundBy == "" {
			r.BoundBy = who
		}
	}
}

// Bounded reports whether a root called Bound; Horizon is then the
// lowest stamp it gave.
func (r *Reacher) Bounded() bool { return r.bounded }

// Dropped tells the Manager that the calling Go code no longer holds ts
// (temporaries of a composite op, such as rms_norm's pow and mean, that a
// reference-counted runtime frees when the expression ends): a reclaim's
// walk that does not reach them frees them without a collection. The
// caller must hold no other tensor over their storage; what autograd
// saved of them the walk reaches, and keeps.
func Dropped(ts ...*Tensor) {
	for _, t := range ts {
		if t != nil && t.mem != nil && t.ctx != nil && t.ctx.Manager != nil {
			t.ctx.Manager.Dropped(t.mem)
		}
	}
}

// holdMemory is Hold for a raw allocation.
func (c *Context) holdMemory(m *backend.Memory) (release func()) {
	n := len(c.inFlightMem)
	c.inFlightMem = append(c.inFlightMem, m)
	return func() {
		clear(c.inFlightMem[n:])
		c.inFlightMem = c.inFlightMem[:n]
	}
}
