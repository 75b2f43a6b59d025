package scope

import (
	"math"
	"os"
	"weak"

	"github.com/memsh/memsh/backend"
	"github.com/memsh/memsh/env"
	"github.com/memsh/memsh/tensor"
)

// While backward() runs, no Starlark code runs (unless the engine calls
// back into it: a checkpointed region's recomputation, a hook) and the
// engine's Go code changes only autograd state — gradients, the graph's
// saved tensors, its own buffers — and makes new tensors. What the
// frames and globals reach outside autograd state is then what it was
// at the walk before: the same values, holding the same storages. Yet
// each of the hundreds of reclaims of a backward pass walked all of it
// again (the model's modules, the optimizer's state, the sweep's results)
// to reach the few allocations that change.
//
// So a walk made while backward() runs walks the frames up to its own and
// the globals in frontier mode (tensor.Reacher.Frontier): it reports the
// storages it reaches and sets aside the tensors that have autograd state
// (parameters, the loss) instead of walking their gradients and graphs;
// then it walks what it set aside, the frames above backward()'s (the
// Starlark code its engine called back), and the Session's other roots
// (the engine among them), as any walk does. It keeps (walkMemo) the
// storages and the set-aside tensors. The next walk, if nothing that
// could change them happened since (memoKey), keeps what they reach as
// backend.Frames' frame 0 (reachMemo) and walks only what changed. A collection
// must not see what the memo holds (a memo whose key moved may hold what
// is garbage now): before each one (backend.Manager.SetForget) the memo
// turns its pointers into weak ones, and the next walk that uses it
// makes them strong again. A weak pointer the collection cleared in a
// memo whose key still holds would mean the key missed a change: the walk
// starts over, and MEMSH_VERIFY_RECLAIM (which collects after every walk)
// panics.
//
// MEMSH_REACH_MEMO=0 turns it off (to compare).

// walkMemo is what a frontier walk of the frames and globals found.
type walkMemo struct {
	key     memoKey
	mems    []*backend.Memory
	tensors []*tensor.Tensor // the leaves first (isLeaf)
	leaves  int
	// weak: after a collection (weaken), mems and tensors are here instead
	weakMems    []weak.Pointer[backend.Memory]
	weakTensors []weak.Pointer[tensor.Tensor]
	weak        bool
	// the frames' bound on the horizon (walkFrame), the built-in that gave
	// it, and why the walk of the frames and globals was incomplete
	horizon  uint64
	who, why string
}

// memoKey is what must not have moved for a walkMemo to hold: the same
// call of backward() (its frame's stamp) with the same frames below it,
// which wait for it and so hold the same values; no existing Starlark
// value changed (the thread's Mutations, starlark.Thread.Mutations: a hook or a checkpointed region's
// recomputation, which run above backward(), may run Starlark code, but
// it changes what the frames below reach only by changing a value that
// exists); the same globals (globalsKey); and no tensor gained or
// replaced its autograd state or storage (tensor.Context.ReachShape).
type memoKey struct {
	call, mutations, shape uint64
	depth                  int // the frames the memo stands for, backward()'s the innermost
	globals                globalsKey
}

// memoKey returns the key of a walk that may use or make a walkMemo: one
// made while backward() (the built-in that reports what its engine holds,
// starlark.Thread.DeclareReported) runs on the main thread — the
// innermost frame, or, while its engine runs (tensor.Context.Framed),
// below the frames of the Starlark code it called back (above: how many
// there are) — and no module is being loaded.
func (s *Session) memoKey() (key memoKey, above int, ok bool) {
	if s.memoOff || len(s.loading) > 0 || s.thread == nil {
		return memoKey{}, 0, false
	}
	depth := s.thread.CallStackDepth()
	if depth == 0 {
		return memoKey{}, 0, false
	}
	above = -1
	if s.thread.DebugFrame(0).Reported() {
		above = 0
	} else if s.tctx.Framed() != nil {
		for i := 1; i < depth; i++ {
			if s.thread.DebugFrame(i).Reported() {
				above = i
				break
			}
		}
	}
	if above < 0 {
		return memoKey{}, 0, false
	}
	return memoKey{
		call:      s.thread.DebugFrame(above).Stamp(),
		mutations: s.thread.Mutations(),
		shape:     s.tctx.ReachShape(),
		depth:     depth - above,
		globals:   s.globalsKey(),
	}, above, true
}

// walkAbove walks the frames above the memo's (memoKey's above: a hook's,
// a checkpointed region's recomputation), credited to no frame, each
// walk, and returns the horizon bound that they and the memo's frames
// (horizon, given by who) give.
func (s *Session) walkAbove(w *env.Walker, above int, horizon uint64, who string) (uint64, string) {
	depth := s.thread.CallStackDepth()
	horizon, who = s.walkStack(w, depth-above, depth, horizon, who)
	w.Settle()
	return horizon, who
}

// walkStack walks the main thread's frames from..to-1, counted from the
// bottom, as walkFrame does (frame to-1 as the innermost), credited to
// whatever frame the walk is in, and returns the horizon bound lowered by
// theirs.
func (s *Session) walkStack(w *env.Walker, from, to int, horizon uint64, who string) (uint64, string) {
	depth := s.thread.CallStackDepth()
	for i := from; i < to && !w.Stopped(); i++ {
		b, by := walkFrame(w, s.thread.DebugFrame(depth-1-i), i == to-1)
		horizon, who = lowerBound(horizon, who, b, by)
	}
	return horizon, who
}

// reachMemo walks the frames and globals for a walk made during
// backward(), as backend.Frames' frame 0, below the engine's frames
// (numbered from 1 then): from the memo when it holds (reused), else in
// frontier mode, keeping a new memo. Frame 0 holds the storages the memo
// reached and the autograd state of the tensors it set aside that are
// leaves (the parameters: their gradients); it is kept while the memo
// holds and nothing noted a change to what it reaches. A leaf given its
// first gradient is noted grown (tensor.Tensor.ReachGrew): the next walk
// walks it again to extend frame 0 (backend.Frames.Grown), so that a
// backward pass walks each parameter's gradient once, not at each of
// its reclaims. The tensors set aside that are not leaves (the loss,
// whose graph the engine consumes) are walked at each walk, after the
// engine's frames, credited to no frame. It returns the horizon the
// frames give.
func (s *Session) reachMemo(w *env.Walker, key memoKey, above int, visit func(*backend.Memory), frames *backend.Frames) (horizon uint64, reused bool) {
	s.frames.usable, s.frames.castsOwner = false, 0 // Frames' numbers are the memo's walk's
	s.frames.pins.unpinAll()
	below := s.engineFrames(w, frames, 1)
	m := s.memo
	if m != nil && (m.key != key || !m.strengthen()) {
		s.memo, m = nil, nil
	}
	n := 0
	if m != nil && s.memoFramed && !s.keepOff {
		n = 1
		if below.keepable {
			n += below.n
		}
	}
	kept := frames.Keep(n)
	var rest []*tensor.Tensor
	var nodes []tensor.GradNode
	var who string
	if kept > 0 {
		var ok bool
		if kept, ok = extendGrown(w, frames, kept); !ok {
			// stopped while frame 0 took its growth in: it is dropped
			s.memoFramed = false
			frames.SetGrowable(0)
			return s.framesHorizon(w, m.horizon, m.who), true
		}
		if m.why != "" {
			w.Incomplete(m.why)
		}
		horizon, who, reused, rest = m.horizon, m.who, true, m.tensors[m.leaves:]
	} else {
		frames.Enter(0)
		horizon, who, reused, rest, nodes = s.memoFrame(w, key, visit)
		w.Settle()
		if w.Stopped() {
			frames.Drop(0)
			s.memoFramed = false
			frames.SetGrowable(0)
			return s.framesHorizon(w, horizon, who), reused
		}
		s.memoFramed = s.memo != nil
	}
	if s.memoFramed {
		frames.SetGrowable(1)
	} else {
		frames.SetGrowable(0)
	}
	if below.n > 0 {
		below.walk(max(0, kept-1))
	}
	frames.Enter(-1)
	horizon, who = s.walkAbove(w, above, horizon, who)
	for _, t := range rest {
		w.Autograd(t)
	}
	for _, n := range nodes {
		w.Node(n)
	}
	return s.framesHorizon(w, horizon, who), reused
}

// memoFrame walks what frame 0 of a walk during backward() stands for:
// the storages the frames and globals reach and the autograd state of
// the leaves among the tensors they reach that have autograd state —
// from the memo when it holds (reused), else by a frontier walk that
// keeps a new memo. It returns the frames' bound on the horizon and who
// gives it, and what the walk must walk outside any frame: the other
// tensors with autograd state and the nodes the frontier walk set aside
// (with nodes, it keeps no memo).
func (s *Session) memoFrame(w *env.Walker, key memoKey, visit func(*backend.Memory)) (horizon uint64, who string, reused bool, rest []*tensor.Tensor, nodes []tensor.GradNode) {
	if m := s.memo; m != nil {
		for _, h := range m.mems {
			visit(h)
		}
		for _, t := range m.tensors[:m.leaves] {
			w.Autograd(t)
		}
		if m.why != "" {
			w.Incomplete(m.why)
		}
		return m.horizon, m.who, true, m.tensors[m.leaves:], nil
	}
	var mems []*backend.Memory
	w.SetMemory(func(h *backend.Memory) {
		mems = append(mems, h)
		visit(h)
	})
	w.SetFrontier(true)
	// the memo must hold every tensor the frames and globals reach: none
	// is passed over because a kept frame stands for it
	horizon, who = uint64(math.MaxUint64), ""
	var why string
	var ts []*tensor.Tensor
	w.Apart(w.Epoch()|frontierEpoch, func() {
		// the frames up to backward()'s (key.depth of them, from the
		// bottom)
		horizon, who = s.walkStack(w, 0, key.depth, horizon, who)
		s.reachGlobals(w)
		why = w.Why()
		ts, nodes = w.Frontier()
	})
	w.SetFrontier(false)
	w.SetMemory(visit)
	// the leaves first: frame 0 walks them, the rest is walked at each walk
	var others []*tensor.Tensor
	leafFirst := make([]*tensor.Tensor, 0, len(ts))
	for _, t := range ts {
		if isLeaf(t) {
			leafFirst = append(leafFirst, t)
		} else {
			others = append(others, t)
		}
	}
	leaves := len(leafFirst)
	ts = append(leafFirst, others...)
	if !w.Stopped() && len(nodes) == 0 {
		s.memo = &walkMemo{key: key, mems: mems, tensors: ts, leaves: leaves, horizon: horizon, who: who, why: why}
	}
	for _, t := range ts[:leaves] {
		w.Autograd(t)
	}
	return horizon, who, false, ts[leaves:], nodes
}

// isLeaf reports whether t, which has autograd state, is a leaf (no
// grad_fn): what it reaches changes during backward only as the engine
// says (its gradient set, ReachGrew, or replaced, ReachChanged).
func isLeaf(t *tensor.Tensor) bool {
	ag := t.Autograd()
	return ag != nil && ag.GradFn == nil
}

// frontierEpoch marks the epoch of a memo's frontier walk, a walk of its
// own inside another (reachMemoRoots): no other walk has its number.
const frontierEpoch = 1 << 63

// weaken makes the memo's pointers weak, for a collection.
func (m *walkMemo) weaken() {
	if m.weak {
		return
	}
	m.weakMems = make([]weak.Pointer[backend.Memory], len(m.mems))
	for i, h := range m.mems {
		m.weakMems[i] = weak.Make(h)
	}
	m.weakTensors = make([]weak.Pointer[tensor.Tensor], len(m.tensors))
	for i, t := range m.tensors {
		m.weakTensors[i] = weak.Make(t)
	}
	m.mems, m.tensors, m.weak = nil, nil, true
}

// strengthen makes the memo's pointers strong again after weaken, and
// reports whether every one was still there.
func (m *walkMemo) strengthen() bool {
	if !m.weak {
		return true
	}
	m.mems = make([]*backend.Memory, len(m.weakMems))
	for i, p := range m.weakMems {
		if m.mems[i] = p.Value(); m.mems[i] == nil {
			return m.cleared()
		}
	}
	m.tensors = make([]*tensor.Tensor, len(m.weakTensors))
	for i, p := range m.weakTensors {
		if m.tensors[i] = p.Value(); m.tensors[i] == nil {
			return m.cleared()
		}
	}
	m.weakMems, m.weakTensors, m.weak = nil, nil, false
	return true
}

// cleared is strengthen's answer when a collection cleared a pointer of a
// memo whose key holds: what the memo reports would not all be reachable.
func (m *walkMemo) cleared() bool {
	if v := os.Getenv("MEMSH_VERIFY_RECLAIM"); v == "1" || v == "collect-first" {
		panic("memsh: a reach walk's memo (scope/reach_memo.go) held what a collection found unreachable, though nothing it watches changed")
	}
	return false
}

// framesHorizon turns the frames' bound on the horizon into the walk's
// (clampHorizon) and names who gives it.
func (s *Session) framesHorizon(w *env.Walker, horizon uint64, who string) uint64 {
	horizon, w.Outermost = clampHorizon(horizon, who, s.stamp())
	return horizon
}
