package scope

import (
	"math"
	"os"
	"weak"

	"go.starlark.net/starlark"

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
// So a walk made while backward() is the innermost frame walks the frames
// and globals in frontier mode (tensor.Reacher.Frontier): it reports the
// storages it reaches and sets aside the tensors that have autograd state
// (parameters, the loss) instead of walking their gradients and graphs;
// then it walks what it set aside, and the Session's other roots (the
// engine among them), as any walk does. It keeps (walkMemo) the storages
// and the set-aside tensors. The next walk, if nothing that could change
// them happened since (memoKey), reports the kept storages and walks only
// the kept tensors' autograd state and the other roots. A collection
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
	tensors []*tensor.Tensor
	// weak: after a collection (weaken), mems and tensors are here instead
	weakMems    []weak.Pointer[backend.Memory]
	weakTensors []weak.Pointer[tensor.Tensor]
	weak        bool
	// the frames' bound on the horizon (walkFrame), the built-in that gave
	// it, and why the walk of the frames and globals was incomplete
	horizon  uint64
	who, why string
}

// memoKey is what must not have moved for a walkMemo to hold: no Starlark
// step ran and no call began or ended (the frames and globals hold the
// same values), no existing Starlark value was changed
// (starlark.Mutations), and no tensor gained or replaced its autograd
// state or storage (tensor.ReachShape).
type memoKey struct {
	steps, calls, mutations, shape uint64
	depth                          int
}

// memoKey returns the key of a walk that may use or make a walkMemo: one
// made while backward() (the built-in that reports what its engine holds,
// starlark.Thread.DeclareReported) is the innermost frame of the main
// thread, and no module is being loaded.
func (s *Session) memoKey() (memoKey, bool) {
	if s.memoOff || len(s.loading) > 0 || s.thread == nil {
		return memoKey{}, false
	}
	depth := s.thread.CallStackDepth()
	if depth == 0 || !s.thread.DebugFrame(0).Reported() {
		return memoKey{}, false
	}
	return memoKey{
		steps:     s.stepBase + s.thread.Steps,
		calls:     s.thread.Calls,
		mutations: starlark.Mutations(),
		shape:     tensor.ReachShape(),
		depth:     depth,
	}, true
}

// reachMemo walks the frames and globals for a walk made during
// backward(): from the memo when it holds (reused), else in frontier mode,
// keeping a new memo. It returns the horizon the frames give.
func (s *Session) reachMemo(w *env.Walker, key memoKey, visit func(*backend.Memory), frames *backend.Frames) (horizon uint64, reused bool) {
	// the engine's frames first: a part of a walk that credits no frame
	// comes after the frames (backend.Frames.Visit). The call stack's
	// frames are not credited: the memo stands for them while backward
	// runs.
	s.frames.usable = false // Frames' numbers above the engine's are the memo's walk's
	s.frames.pins.unpinAll()
	below := s.engineFrames(w, frames)
	n := 0
	if below.keepable {
		n = below.n
	}
	kept := frames.Keep(n)
	if below.n > 0 {
		below.walk(kept)
	}
	frames.Enter(-1)
	return s.reachMemoRoots(w, key, visit)
}

// reachMemoRoots walks the frames and globals from the memo when it
// holds (reused), else in frontier mode, keeping a new memo.
func (s *Session) reachMemoRoots(w *env.Walker, key memoKey, visit func(*backend.Memory)) (horizon uint64, reused bool) {
	if m := s.memo; m != nil && m.key == key && m.strengthen() {
		for _, h := range m.mems {
			visit(h)
		}
		for _, t := range m.tensors {
			w.Autograd(t)
		}
		if m.why != "" {
			w.Incomplete(m.why)
		}
		return s.framesHorizon(w, m.horizon, m.who), true
	}
	s.memo = nil
	var mems []*backend.Memory
	w.SetMemory(func(h *backend.Memory) {
		mems = append(mems, h)
		visit(h)
	})
	w.SetFrontier(true)
	// the memo must hold every tensor the frames and globals reach: none
	// is passed over because the engine's frames met it in this walk or
	// a kept one stands for it
	horizon, who := uint64(math.MaxUint64), ""
	var why string
	var ts []*tensor.Tensor
	var nodes []tensor.GradNode
	w.Apart(w.Epoch()|frontierEpoch, func() {
		depth := s.thread.CallStackDepth()
		for i := range depth {
			b, by := walkFrame(w, s.thread.DebugFrame(depth-1-i), i == depth-1)
			horizon, who = lowerBound(horizon, who, b, by)
		}
		s.reachGlobals(w)
		why = w.Why()
		ts, nodes = w.Frontier()
	})
	w.SetFrontier(false)
	w.SetMemory(visit)
	if !w.Stopped() && len(nodes) == 0 {
		s.memo = &walkMemo{key: key, mems: mems, tensors: ts, horizon: horizon, who: who, why: why}
	}
	for _, t := range ts {
		w.Autograd(t)
	}
	for _, n := range nodes {
		w.Node(n)
	}
	return s.framesHorizon(w, horizon, who), false
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
	if os.Getenv("MEMSH_VERIFY_RECLAIM") == "1" {
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
