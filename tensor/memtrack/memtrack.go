// Package memtrack breaks a device's memory down by what it holds, as
// PyTorch's MemTracker (torch.distributed._tools.mem_tracker) does:
// parameters, buffers, gradients, activations (tensors saved for
// backward), temporaries, optimizer states and other memory (allocations
// that were live before tracking began and are none of the former), at the
// peak, at the end, and per module: the peak during its forward and during
// its backward.
//
// The figures are exact, not sampled: the Tracker observes every
// allocation and free of its device through the Manager (backend
// Manager.Observe) and keeps the live total; whenever that total raises
// the tracked peak or the local peak of a running module, it categorises
// the live allocations at that very moment from the roles it knows:
//
//   - parameters and buffers of the registered modules (AddParams,
//     AddBuffers), and each parameter's .grad;
//   - the parameters, gradients and state tensors of registered
//     optimizers (AddOptimizer);
//   - the buffers of registered communication holders (AddComm: a DDP
//     reducer's gradient buckets), as Comm;
//   - the tensors autograd nodes saved while tracking and have not yet
//     released (autograd.Observer.Saved; a graph that became garbage stops
//     counting once the Go GC has collected it, which exact-peak mode makes
//     happen before every allocation that raises a tracked peak);
//
// an allocation with several roles counts once, in the first of
// Parameter, Buffer, Gradient, Optstate, Comm, Activation (a gradient that
// is a view into a DDP bucket counts as Gradient). The rest is Temp, or
// Other when it was allocated before Start or is a library's (the cuBLAS
// workspaces, which PyTorch's MemTracker does not see: they are no
// tensors). Totals are allocator block
// sizes (PyTorch's 512-byte rounding, as MemTracker's _calculate_mem_consumed
// and memory_allocated count them), so Total is memory_allocated.
//
// In exact-peak mode the Tracker keeps a peak counter open at the lowest
// of the levels it tracks, so the Manager reclaims garbage before any
// allocation that would raise one of them, and it reclaims when a module's forward or backward begins so
// the level it starts from is garbage-free.
//
// Differences from MemTracker, which tags storages when they are created:
// MemTracker counts every tensor made during a forward as Activation and
// every tensor made during backward as Temp, and everything made inside
// optimizer.step() (its temporaries included) as Optstate; memsh counts as
// Activation what autograd saved, the state that the optimizer holds as
// Optstate, and everything else made while tracking as Temp. MemTracker's
// peaks are taken after each operator; memsh's at every allocation.
package memtrack

import (
	"fmt"
	"weak"

	"github.com/memsh/memsh/backend"
	"github.com/memsh/memsh/tensor"
	"github.com/memsh/memsh/tensor/autograd"
	"github.com/memsh/memsh/tensor/optim"
)

// Category is what an allocation holds.
type Category int

// The categories, in MemTracker's _MemRefType order.
const (
	Parameter Category = iota
	Buffer
	Gradient
	Activation
	Temp
	Optstate
	// Comm is what communication keeps between collectives (a DDP
	// reducer's gradient buckets); not one of MemTracker's types.
	Comm
	Other
	NumCategories
)

var names = [NumCategories]string{"Parameter", "Buffer", "Gradient", "Activation", "Temp", "Optstate", "Comm", "Other"}

// String is MemTracker's name of the category ("Parameter", "Optstate").
func (c Category) String() string { return names[c] }

// rank orders roles: an allocation with several counts in the lowest.
var rank = [NumCategories]int{Parameter: 0, Buffer: 1, Gradient: 2, Optstate: 3, Comm: 4, Activation: 5, Temp: 6, Other: 7}

// Snapshot is a breakdown of the device's allocated bytes.
type Snapshot struct {
	Bytes [NumCategories]uint64 // by category
	Total uint64                // the sum: the device's allocated bytes
	// Library is the part of Bytes[Other] that is libraries' (the cuBLAS
	// workspaces), allocated while tracking or before.
	Library uint64
	// Phase is what was running when it was taken: "forward" (a module's
	// forward), "backward" (a node of the backward engine), "optimizer
	// step" (between StepBegin and StepEnd) or "other" (code outside
	// modules, such as a loss computed after the model returned).
	Phase string
}

// The phases of a Snapshot.
const (
	PhaseForward  = "forward"
	PhaseBackward = "backward"
	PhaseStep     = "optimizer step"
	PhaseOther    = "other"
)

// Module is one module's figures: the snapshot at the peak of its
// forward and of its backward (the highest over all its calls).
type Module struct {
	Name, Type        string
	Forward, Backward *Snapshot // nil when it did not run
}

// Report is what a Tracker measured.
type Report struct {
	Device    string
	Peak, End Snapshot
	Modules   []*Module // in the order they first ran
	// Failed is the breakdown when the tracked call failed (StopFailed):
	// what was still allocated when the failure returned, before any
	// reclaim — for an out-of-memory error, the live set the failed
	// allocation did not fit beside. nil after Stop.
	Failed *Snapshot
}

// frame is one running module: the forward stack, or a node's scope.
type frame struct {
	mod    *Module
	parent *frame
}

// Tracker tracks one device of a Context's Manager.
type Tracker struct {
	ctx    *tensor.Context
	mgr    *backend.Manager
	alloc  backend.Allocator
	device string
	exact  bool

	startSeq uint64
	live     map[uint64]*liveEntry // by seq, on the device
	total    uint64
	preTotal uint64 // live bytes allocated before Start

	// the registered roots, held weakly as PyTorch's MemTracker holds
	// them (WeakIdKeyDictionary): tracking keeps nothing alive, and a
	// reclaim walk need not look into them (a walk of every parameter,
	// gradient and state at each reclaim cost a tracked trial two to four
	// times an untracked one)
	params, buffers []weak.Pointer[tensor.Tensor]
	known           map[weak.Pointer[tensor.Tensor]]bool
	optims          []optimRef
	comms           []CommHolder
	saved           []savedRef

	// a snapshot's marks: epoch numbers the snapshots; the memos
	// remember, per role in the order snapshot visits them, the last
	// memory seen and its entry (parameters, gradients and buffers by
	// index, optimizer states in visiting order)
	epoch                   uint64
	paramMemo, gradMemo     []memo
	bufMemo, stateMemo      []memo
	commMemo                []memo
	commAt                  int
	markComm                func(*tensor.Tensor) // markCommTensor, for CommTensors
	cur                     Snapshot             // the snapshot being taken
	curSum, curPre, stateAt uint64
	markState               func(*tensor.Tensor) // markOptstate, for StateTensors
	markGrad                func(*tensor.Tensor) // markGradState, for GradTensors
	markParam               func(*tensor.Tensor) // markParamState, for ParamTensors

	peak    Snapshot
	modules []*Module
	fw      *frame // the forward stack's top
	bw      *frame // the scope of the node the engine runs
	lastBW  *frame

	// peakOnly: no per-module figures (PeakOnly); the phases are kept
	peakOnly bool

	// oom is the breakdown at the last out-of-memory error, after the
	// device's allocs-th allocation (StopFailed)
	oom               *Snapshot
	allocs, oomAllocs uint64

	guard     *backend.Peak
	stopObs   func()
	restoreAG func()
	started   bool
	inStep    int // nesting of StepBegin
}

// liveEntry is one live allocation of the tracked device.
type liveEntry struct {
	seq, size uint64
	freed     bool     // no longer live (a memo may still point at it)
	mark      uint64   // the epoch of the last snapshot that categorised it
	cat       Category // its category in that snapshot
}

// memo is a role's last memory, by sequence number (a pointer to the
// Memory would keep its handle from the collector, which reclaims read),
// and its entry (nil: it was not live then, and a seq never is again once
// freed).
type memo struct {
	seq uint64
	e   *liveEntry
}

// savedRef is a saved tensor (weakly: a graph that became garbage is
// collected) and its memo.
type savedRef struct {
	w weak.Pointer[autograd.SavedTensor]
	m memo
}

// New returns a Tracker of device ("cuda:0", "cpu") in ctx's Manager.
// Register roots with AddParams, AddBuffers and AddOptimizer (before or
// while tracking), then call Start.
func New(ctx *tensor.Context, device string) (*Tracker, error) {
	a, err := ctx.Manager.Allocator(device)
	if err != nil {
		return nil, err
	}
	return &Tracker{ctx: ctx, mgr: ctx.Manager, alloc: a, device: a.Device().Name(),
		exact: ctx.Manager.PeakMode().Exact(), live: map[uint64]*liveEntry{}, known: map[weak.Pointer[tensor.Tensor]]bool{}}, nil
}

// PeakOnly makes the Tracker keep the peak and end breakdowns only, not
// each module's forward and backward peaks (Report.Modules is empty; the
// peak's Phase is still known). A module's local peak raises with almost
// every allocation of its forward, each a snapshot and, in exact-peak
// mode, a reclaim first; without them a tracked call costs about what an
// untracked one does. Call it before Start.
func (t *Tracker) PeakOnly() { t.peakOnly = true }

// Device is the tracked device's name.
func (t *Tracker) Device() string { return t.device }

// AddParams registers parameters (their .grad counts as Gradient),
// weakly: a parameter no one else holds is freed as if it were not
// registered.
func (t *Tracker) AddParams(ps ...*tensor.Tensor) {
	for _, p := range ps {
		if p == nil {
			continue
		}
		if w := weak.Make(p); !t.known[w] {
			t.known[w] = true
			t.params = append(t.params, w)
		}
	}
}

// AddBuffers registers module buffers, weakly.
func (t *Tracker) AddBuffers(bs ...*tensor.Tensor) {
	for _, b := range bs {
		if b == nil {
			continue
		}
		if w := weak.Make(b); !t.known[w] {
			t.known[w] = true
			t.buffers = append(t.buffers, w)
		}
	}
}

// AddOptimizer registers an optimizer: its parameters, their gradients
// and its state; weakly when it is one of package optim's (optim.Weak),
// else strongly (a reclaim walk then walks it).
func (t *Tracker) AddOptimizer(o optim.Optimizer) {
	for _, x := range t.optims {
		if x.get() == o {
			return
		}
	}
	ref := optimRef{strong: o}
	if get := optim.Weak(o); get != nil {
		ref = optimRef{weak: get}
	}
	t.optims = append(t.optims, ref)
}

// optimRef is a registered optimizer: weak (optim.Weak's getter) or, for
// an optimizer optim.Weak does not know, strong.
type optimRef struct {
	weak   func() optim.Optimizer
	strong optim.Optimizer
}

// get returns the optimizer, or nil when it was collected.
func (r optimRef) get() optim.Optimizer {
	if r.weak != nil {
		return r.weak()
	}
	return r.strong
}

// CommHolder is what keeps communication buffers between collectives (a
// DDP reducer, tensor/dist): CommTensors calls fn with each, in a stable
// order; Reach reports them to a reclaim walk.
type CommHolder interface {
	CommTensors(fn func(*tensor.Tensor))
	Reach(r *tensor.Reacher)
}

// AddComm registers a communication holder: its buffers count as Comm.
func (t *Tracker) AddComm(c CommHolder) {
	for _, x := range t.comms {
		if x == c {
			return
		}
	}
	t.comms = append(t.comms, c)
}

// Reach reports what the Tracker holds strongly to a reclaim walk
// (tensor.Reacher): the optimizers optim.Weak does not know (an engine
// optimizer reports its state through a Reach(*tensor.Reacher) method)
// and the communication holders. The parameters, buffers and the
// package's optimizers it holds weakly. A caller that runs code under
// the Tracker walks it as a root and may then declare itself transparent
// to the walk.
func (t *Tracker) Reach(r *tensor.Reacher) {
	for _, o := range t.optims {
		if x, ok := o.strong.(interface{ Reach(*tensor.Reacher) }); ok {
			x.Reach(r)
		}
	}
	for _, c := range t.comms {
		c.Reach(r)
	}
}

// Start begins tracking: it reclaims garbage, counts what is live, and
// observes every allocation and free from then on.
func (t *Tracker) Start() {
	t.mgr.Reclaim()
	t.mgr.Live(func(h *backend.Memory) bool {
		if h.Device() == t.device {
			t.live[h.Seq()] = &liveEntry{seq: h.Seq(), size: h.BlockSize()}
			t.total += h.BlockSize()
		}
		return true
	})
	t.startSeq = t.mgr.Seq()
	t.preTotal = t.total
	t.stopObs = t.mgr.Observe(t.event)
	t.restoreAG = autograd.SetObserver(t.ctx, &autograd.Observer{
		Saved:     func(s *autograd.SavedTensor) { t.saved = append(t.saved, savedRef{w: weak.Make(s)}) },
		Scope:     func() any { return t.fw },
		NodeStart: t.nodeStart,
		NodeEnd:   func(*autograd.Node) { t.bw = nil; t.updateGuard() },
	})
	t.peak = t.snapshot()
	if t.exact {
		t.guard = t.alloc.Peaks().New(t.alloc.Allocated(), t.alloc.Reserved())
		t.updateGuard()
	}
	t.started = true
}

// StepBegin and StepEnd bracket an optimizer's step, so that a snapshot
// taken meanwhile has the phase "optimizer step".
func (t *Tracker) StepBegin() { t.inStep++ }

// StepEnd ends what StepBegin began.
func (t *Tracker) StepEnd() {
	if t.inStep > 0 {
		t.inStep--
	}
}

// StopFailed ends tracking after the tracked call failed: the report's
// Failed is the breakdown of what is still allocated now, taken before
// the reclaim of Stop — at the out-of-memory error itself when that was
// the failure (no allocation since): what is allocated is the same then,
// but the call's frames still hold what they held, so each allocation's
// role (a saved tensor, a gradient) is known; after the frames let go,
// a role's weak reference (savedRef, the registered parameters) may or
// may not have been cleared by a collection in between.
func (t *Tracker) StopFailed() *Report {
	if !t.started {
		return nil
	}
	f := t.oom
	if f == nil || t.allocs != t.oomAllocs {
		s := t.snapshot()
		f = &s
	}
	r := t.Stop()
	r.Failed = f
	return r
}

// Stop ends tracking and returns the report; the end snapshot is taken
// after a reclaim.
func (t *Tracker) Stop() *Report {
	if !t.started {
		return nil
	}
	t.mgr.Reclaim()
	end := t.snapshot()
	t.stopObs()
	t.restoreAG()
	if t.guard != nil {
		t.guard.Close()
	}
	t.started = false
	return &Report{Device: t.device, Peak: t.peak, End: end, Modules: t.modules}
}

// NewModule returns the record of a module named name (of class typ);
// pass it to Enter each time the module's forward runs.
func (t *Tracker) NewModule(name, typ string) *Module {
	m := &Module{Name: name, Type: typ}
	if !t.peakOnly {
		t.modules = append(t.modules, m)
	}
	return m
}

// Enter marks the start of m's forward (MemTracker's pre-forward hook):
// the level now (after a reclaim in exact mode) is a candidate for its
// forward peak, and the autograd nodes made until Exit are in its scope.
func (t *Tracker) Enter(m *Module) {
	t.lastBW = nil
	if !t.peakOnly {
		if t.exact {
			t.mgr.Reclaim()
		}
		s := t.snapshot()
		raise(&m.Forward, &s)
	}
	t.fw = &frame{mod: m, parent: t.fw}
	t.updateGuard()
}

// Exit marks the end of the innermost running forward.
func (t *Tracker) Exit() {
	if t.fw != nil {
		t.fw = t.fw.parent
	}
	t.updateGuard()
}

func (t *Tracker) nodeStart(n *autograd.Node) {
	f, _ := n.Scope().(*frame)
	var fresh []*Module
	for x := f; x != nil; x = x.parent {
		if !inChain(t.lastBW, x.mod) {
			fresh = append(fresh, x.mod)
		}
	}
	if len(fresh) > 0 && !t.peakOnly {
		if t.exact {
			t.mgr.Reclaim()
		}
		s := t.snapshot()
		for _, m := range fresh {
			raise(&m.Backward, &s)
		}
	}
	t.bw, t.lastBW = f, f
	t.updateGuard()
}

func inChain(f *frame, m *Module) bool {
	for ; f != nil; f = f.parent {
		if f.mod == m {
			return true
		}
	}
	return false
}

// raise replaces *p with a copy of s when s is higher.
func raise(p **Snapshot, s *Snapshot) {
	if *p == nil || s.Total > (*p).Total {
		c := *s
		*p = &c
	}
}

// event is the Manager observer.
func (t *Tracker) event(e backend.Event) {
	if e.Device != t.device {
		return
	}
	switch e.Kind {
	case backend.EventAlloc:
		t.allocs++
		t.live[e.Seq] = &liveEntry{seq: e.Seq, size: e.Size}
		t.total += e.Size
		if t.needSnapshot() {
			s := t.snapshot()
			if s.Total > t.peak.Total {
				t.peak = s
			}
			if t.peakOnly {
				t.updateGuard()
				return
			}
			for f := t.fw; f != nil; f = f.parent {
				raise(&f.mod.Forward, &s)
			}
			for f := t.bw; f != nil; f = f.parent {
				raise(&f.mod.Backward, &s)
			}
		}
		t.updateGuard()
	case backend.EventFree:
		le, ok := t.live[e.Seq]
		if !ok {
			return
		}
		delete(t.live, e.Seq)
		le.freed = true
		t.total -= le.size
		if e.Seq <= t.startSeq {
			t.preTotal -= le.size
		}
	case backend.EventOOM:
		s := t.snapshot()
		t.oom, t.oomAllocs = &s, t.allocs
	}
}

// level is the lowest of the tracked levels: the peak and the running
// modules' local peaks.
func (t *Tracker) level() uint64 {
	l := t.peak.Total
	if t.peakOnly {
		return l
	}
	for f := t.fw; f != nil; f = f.parent {
		if f.mod.Forward != nil {
			l = min(l, f.mod.Forward.Total)
		}
	}
	for f := t.bw; f != nil; f = f.parent {
		if f.mod.Backward != nil {
			l = min(l, f.mod.Backward.Total)
		} else {
			l = 0
		}
	}
	return l
}

func (t *Tracker) needSnapshot() bool { return t.total > t.level() }

// updateGuard keeps the exact-mode counter at the lowest tracked level,
// so an allocation that would raise any of them reclaims first.
func (t *Tracker) updateGuard() {
	if t.guard != nil {
		t.guard.Reset(t.level(), t.alloc.Reserved())
	}
}

// mark gives x's memory the category c in the snapshot being taken,
// unless a role of lower rank has it already. m is the role's memo: while
// the role's memory is the one it saw last, no map lookup is needed.
func (t *Tracker) mark(x *tensor.Tensor, c Category, m *memo) {
	if x == nil || x.Storage() == nil {
		return
	}
	mem := x.Storage().Memory()
	if mem == nil {
		return
	}
	if seq := mem.Seq(); m.seq != seq || seq == 0 {
		m.seq, m.e = seq, t.live[seq]
	}
	e := m.e
	if e == nil || e.freed {
		return
	}
	if e.mark == t.epoch {
		if rank[e.cat] <= rank[c] {
			return
		}
		t.cur.Bytes[e.cat] -= e.size
	} else {
		e.mark = t.epoch
		t.curSum += e.size
		if e.seq <= t.startSeq {
			t.curPre += e.size
		}
	}
	e.cat = c
	t.cur.Bytes[c] += e.size
}

// markOptstate marks x, the next optimizer state tensor the snapshot
// visits, as Optstate.
func (t *Tracker) markOptstate(x *tensor.Tensor) {
	t.stateMemo = grow(t.stateMemo, int(t.stateAt)+1)
	t.mark(x, Optstate, &t.stateMemo[t.stateAt])
	t.stateAt++
}

// markGradState marks x, a gradient an optimizer keeps apart from the
// parameters' .grad (a ZeRO-3 engine's gradient partitions), as Gradient.
func (t *Tracker) markGradState(x *tensor.Tensor) {
	t.stateMemo = grow(t.stateMemo, int(t.stateAt)+1)
	t.mark(x, Gradient, &t.stateMemo[t.stateAt])
	t.stateAt++
}

// markParamState marks x, parameters an engine keeps apart from the
// modules' (a ZeRO-3 engine's partitions), as Parameter.
func (t *Tracker) markParamState(x *tensor.Tensor) {
	t.stateMemo = grow(t.stateMemo, int(t.stateAt)+1)
	t.mark(x, Parameter, &t.stateMemo[t.stateAt])
	t.stateAt++
}

// markCommTensor marks x, the next communication buffer the snapshot
// visits, as Comm.
func (t *Tracker) markCommTensor(x *tensor.Tensor) {
	t.commMemo = grow(t.commMemo, t.commAt+1)
	t.mark(x, Comm, &t.commMemo[t.commAt])
	t.commAt++
}

// grow returns ms with at least n memos.
func grow(ms []memo, n int) []memo {
	if len(ms) < n {
		ms = append(ms, make([]memo, n-len(ms))...)
	}
	return ms
}

// snapshot categorises the live allocations now. Its cost is one visit
// of each role (parameters, gradients, buffers, optimizer states, saved
// tensors), without a map lookup for a role whose memory is unchanged
// since the last snapshot.
func (t *Tracker) snapshot() Snapshot {
	t.epoch++
	t.cur, t.curSum, t.curPre = Snapshot{}, 0, 0
	t.paramMemo = grow(t.paramMemo, len(t.params))
	t.gradMemo = grow(t.gradMemo, len(t.params))
	for i, w := range t.params {
		if p := w.Value(); p != nil {
			t.mark(p, Parameter, &t.paramMemo[i])
			t.mark(autograd.Grad(p), Gradient, &t.gradMemo[i])
		}
	}
	t.bufMemo = grow(t.bufMemo, len(t.buffers))
	for i, w := range t.buffers {
		if b := w.Value(); b != nil {
			t.mark(b, Buffer, &t.bufMemo[i])
		}
	}
	t.stateAt = 0
	if t.markState == nil {
		t.markState = t.markOptstate // made once: a method value allocates
	}
	for _, ref := range t.optims {
		o := ref.get()
		if o == nil {
			continue
		}
		for _, p := range o.Params() {
			// an optimizer's parameter outside the modules: its memo
			// is a state's (visited as often)
			t.stateMemo = grow(t.stateMemo, int(t.stateAt)+2)
			t.mark(p, Parameter, &t.stateMemo[t.stateAt])
			t.mark(autograd.Grad(p), Gradient, &t.stateMemo[t.stateAt+1])
			t.stateAt += 2
			o.StateTensors(p, t.markState)
		}
	}
	t.commAt = 0
	if t.markComm == nil {
		t.markComm = t.markCommTensor
	}
	for _, c := range t.comms {
		c.CommTensors(t.markComm)
		if st, ok := c.(interface{ StateTensors(func(*tensor.Tensor)) }); ok {
			// a holder that is also an optimizer (a ZeRO engine's master
			// weights and moments)
			st.StateTensors(t.markState)
		}
		if gt, ok := c.(interface{ GradTensors(func(*tensor.Tensor)) }); ok {
			if t.markGrad == nil {
				t.markGrad = t.markGradState
			}
			gt.GradTensors(t.markGrad)
		}
		if pt, ok := c.(interface{ ParamTensors(func(*tensor.Tensor)) }); ok {
			if t.markParam == nil {
				t.markParam = t.markParamState
			}
			pt.ParamTensors(t.markParam)
		}
	}
	kept := t.saved[:0]
	for _, r := range t.saved {
		if s := r.w.Value(); s != nil {
			if x := s.Tensor(); x != nil {
				kept = append(kept, r)
				t.mark(x, Activation, &kept[len(kept)-1].m)
			}
		}
	}
	clear(t.saved[len(kept):])
	t.saved = kept

	s := t.cur
	// library memory made while tracking (a cuBLAS workspace at the first
	// matrix product) is Other, as what was there before; Library is all
	// of it that is live, made before Start too (the workspaces an
	// earlier trial of the process allocated)
	var lib, libBefore uint64
	for _, m := range t.ctx.LibraryMemory() {
		if e, ok := t.live[m.Seq()]; ok && e.mark != t.epoch {
			if m.Seq() > t.startSeq {
				lib += e.size
			} else {
				libBefore += e.size
			}
		}
	}
	s.Bytes[Other] = t.preTotal - t.curPre + lib
	s.Library = lib + libBefore
	s.Bytes[Temp] = t.total - t.curSum - s.Bytes[Other]
	s.Total = t.total
	switch {
	case t.inStep > 0:
		s.Phase = PhaseStep
	case t.bw != nil:
		s.Phase = PhaseBackward
	case t.fw != nil:
		s.Phase = PhaseForward
	default:
		s.Phase = PhaseOther
	}
	return s
}

// Get returns the bytes of category c.
func (s *Snapshot) Get(c Category) uint64 { return s.Bytes[c] }

func (s Snapshot) String() string {
	out := ""
	for c := range NumCategories {
		out += fmt.Sprintf("%s=%d ", c, s.Bytes[c])
	}
	return out + fmt.Sprintf("Total=%d", s.Total)
}

// Current returns the breakdown now (MemTracker's "current" snapshot),
// after a reclaim in exact-peak mode.
func (t *Tracker) Current() Snapshot {
	if t.exact {
		t.mgr.Reclaim()
	}
	return t.snapshot()
}
