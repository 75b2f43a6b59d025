package autograd

import (
	"cmp"
	"container/heap"
	"errors"
	"fmt"
	"slices"
	"sync"
	"weak"

	"github.com/memsh/memsh/tensor"
)

type weakTensor = weak.Pointer[tensor.Tensor]

func makeWeak(t *tensor.Tensor) weakTensor { return weak.Make(t) }

// Backward computes the gradients of roots with respect to the leaves of
// their graph and accumulates them in the leaves' .grad
// (torch.autograd.backward). grads gives the gradient of each root; a nil
// entry is ones for a one-element root, as PyTorch's implicit gradient.
// Unless retainGraph, every node run releases its saved tensors.
//
// Memory follows PyTorch's engine: the implicit gradient is a tensor held
// for the whole call; nodes run in decreasing sequence number (leaves'
// AccumulateGrad as soon as ready); a node's incoming gradients are dropped
// after it ran and its outputs were reduced to its inputs' shapes, then its
// saved tensors; gradients meeting at one input are added in place when
// the buffer holds the only reference to the first, out of place
// otherwise; AccumulateGrad steals a gradient nobody else holds and copies
// one that is shared.
func Backward(roots, grads []*tensor.Tensor, retainGraph bool) error {
	if len(roots) == 0 {
		return errors.New("backward: no tensors")
	}
	ctx := roots[0].Context()
	defer beginGraphTask(ctx)()
	// The autograd engine's thread: its cuBLAS handle has a workspace of
	// its own (tensor/blas_workspace.go).
	defer ctx.EnterBackward()()
	e := &engine{refs: map[*tensor.Tensor]int{}, srefs: map[*tensor.Storage]int{}, buffers: map[*Node][]*tensor.Tensor{}, deps: map[*Node]int{}}
	// The engine is a root of the reclaim's reach walk while it runs
	// (Reach): what a node drops can be freed without a collection.
	e.region, e.ctx = ctx.Tick(), ctx
	defer ctx.Root(e)()
	defer setRunning(ctx, e)()
	rootEdges := make([]Edge, len(roots))
	rootGrads := make([]*tensor.Tensor, len(roots))
	for i, r := range roots {
		if !RequiresGrad(r) {
			return fmt.Errorf("element %d of tensors does not require grad and does not have a grad_fn", i)
		}
		var g *tensor.Tensor
		if i < len(grads) {
			g = grads[i]
		}
		if g == nil {
			if r.Numel() != 1 {
				return errors.New("grad can be implicitly created only for scalar outputs")
			}
			var err error
			if g, err = onesLike(r); err != nil {
				return err
			}
		} else if !sameShape(g.Shape(), r.Shape()) {
			return fmt.Errorf("Mismatch in shape: grad_output[%d] has a shape of %s and output[%d] has a shape of %s.", i, sizeString(g.Shape()), i, sizeString(r.Shape()))
		}
		rootEdges[i] = gradEdge(r)
		rootGrads[i] = g
		// The caller holds the root gradients for the whole call (Python's
		// grad_tensors tuple).
		e.pin(g)
	}
	prev := SetGradEnabled(ctx, false)
	defer SetGradEnabled(ctx, prev)

	if !retainGraph {
		e.run = &graphRun{active: true}
		defer func() { e.run.active = false }()
	}
	e.countDependencies(rootEdges)
	defer e.endFrames()
	for i, edge := range rootEdges {
		if err := e.add(edge, rootGrads[i]); err != nil {
			return err
		}
	}
	for _, edge := range rootEdges {
		if e.deps[edge.Node] == 0 && !e.queued[edge.Node] {
			e.push(edge.Node)
		}
	}
	obs := observerOf(ctx)
	for e.ready.Len() > 0 {
		if ctx != nil && ctx.Interrupted() {
			// Ctrl-C: stop between nodes. Nodes already run have
			// accumulated their gradients and (without retain_graph)
			// released their saved tensors, as in PyTorch.
			return &tensor.Error{Op: "autograd.backward", Err: tensor.ErrInterrupted}
		}
		n := heap.Pop(&e.ready).(readyItem).n
		if obs != nil && obs.NodeStart != nil {
			obs.NodeStart(n)
		}
		err := e.evaluate(n, retainGraph)
		if obs != nil && obs.NodeEnd != nil {
			obs.NodeEnd(n)
		}
		if err != nil {
			return err
		}
	}
	// the callbacks queued meanwhile (Engine::queue_callback), in order;
	// one may queue more
	for len(e.callbacks) > 0 {
		cb := e.callbacks[0]
		e.callbacks = e.callbacks[1:]
		if err := cb(); err != nil {
			return err
		}
	}
	return nil
}

var (
	runningMu sync.Mutex
	running   = map[*tensor.Context]*engine{}
)

// setRunning makes e the backward running on ctx until the function it
// returns is called.
func setRunning(ctx *tensor.Context, e *engine) (restore func()) {
	runningMu.Lock()
	prev := running[ctx]
	running[ctx] = e
	runningMu.Unlock()
	return func() {
		runningMu.Lock()
		if prev == nil {
			delete(running, ctx)
		} else {
			running[ctx] = prev
		}
		runningMu.Unlock()
	}
}

// QueueCallback queues fn to run when the backward running on ctx has run
// its last node (torch.autograd.Variable._execution_engine.queue_callback,
// which FSDP2's root uses for its final post-backward). It fails outside
// a backward.
func QueueCallback(ctx *tensor.Context, fn func() error) error {
	runningMu.Lock()
	e := running[ctx]
	runningMu.Unlock()
	if e == nil {
		return errors.New("Final callbacks can only be installed during backward pass.")
	}
	e.callbacks = append(e.callbacks, fn)
	return nil
}

// ctxOf returns the tensor context of the graph a node belongs to.
func ctxOf(n *Node) *tensor.Context { return n.ctx }

type engine struct {
	callbacks []func() error // QueueCallback's
	deps      map[*Node]int
	buffers   map[*Node][]*tensor.Tensor
	queued    map[*Node]bool
	ready     readyQueue
	order     uint64
	// refs counts the holders of each gradient the engine tracks: input
	// buffer slots, and the caller for root gradients (a use_count). srefs
	// counts tracked tensors alive per storage (a storage use_count).
	refs  map[*tensor.Tensor]int
	srefs map[*tensor.Storage]int
	// region is the stamp (tensor.Context.Tick) at which the running
	// node, cur (the last one run, between nodes), began: what was
	// allocated since, its Go code may hold.
	region uint64
	cur    *Node
	ctx    *tensor.Context // the roots' Context
	// outs are the running node's gradients on their way to the input
	// buffers (validated, then added).
	outs []*tensor.Tensor
	// run marks the nodes this backward ran and released (Node.doneIn);
	// doneAccs are the AccumulateGrad nodes run.
	run      *graphRun
	doneAccs []*Node
	// pending are the task's nodes not run yet, but AccumulateGrad's, by
	// ascending sequence number (a backward without retain_graph): the
	// reach walk's frames (tensor.FramedRoot: Frames, ReachFrame). The
	// ready queue runs the highest sequence number first, and a node is
	// ready once the nodes made after it that lead to it ran, so the one
	// run next is the last.
	pending []*Node
	framed  uint64 // the walk that walks the frames (BeginFrames)
	// frameBase: backend.Frames' number of frame 0 in that walk
	frameBase int
}

// graphRun is one backward pass without retain_graph, active while it
// runs. Its task is every node reachable from its roots
// (countDependencies), and it runs each of them once, so while it is
// active a node it ran has nothing below it that the walk must reach
// through it: the nodes not run yet are below the ready ones or the
// running one, and the variables of the AccumulateGrad nodes run are in
// doneAccs. engine.Reach reports those, and Node.Reach stops at a node
// the active run released (its saved tensors are gone too).
type graphRun struct{ active bool }

// Reach reports what the engine holds to the reclaim's reach walk
// (tensor.ReachRoot): every gradient it tracks (input buffers, the
// running node's arguments, the root gradients, its gradients on their
// way to the input buffers), and the running node's start as the horizon.
func (e *engine) Reach(r *tensor.Reacher) {
	for t := range e.refs {
		r.Tensor(t)
	}
	// the nodes not run yet are below these (graphRun)
	for _, it := range e.ready {
		r.Node(it.n)
	}
	if e.cur != nil {
		r.Node(e.cur) // running, or (between nodes) run and released
	}
	for _, n := range e.doneAccs {
		r.Node(n)
	}
	for _, t := range e.outs {
		if t != nil {
			r.Tensor(t)
		}
	}
	// The running node may hold what it made since it began, except
	// what a checkpoint's recomputation made on its behalf (Unheld).
	from := e.region
	if e.ctx != nil {
		for _, g := range e.ctx.Gaps(e.region) {
			r.Protect(from, g.From, e.runningName())
			if g.To == 0 {
				return
			}
			from = g.To
		}
	}
	r.Bound(from, e.runningName())
}

// runningName names the node the horizon comes from (cur), for
// MEMSH_DEBUG_REACH.
func (e *engine) runningName() string {
	if e.cur == nil {
		return ""
	}
	return e.cur.name
}

func (e *engine) hold(t *tensor.Tensor) {
	if e.refs[t] == 0 {
		e.srefs[t.Storage()]++
	}
	e.refs[t]++
}

func (e *engine) drop(t *tensor.Tensor) {
	if t == nil {
		return
	}
	e.refs[t]--
	if e.refs[t] <= 0 {
		delete(e.refs, t)
		if e.srefs[t.Storage()]--; e.srefs[t.Storage()] <= 0 {
			delete(e.srefs, t.Storage())
		}
	}
}

func (e *engine) pin(t *tensor.Tensor) { e.hold(t) }

// exclusive reports whether the engine's reference (count n) is the only
// one to t and to its storage (PyTorch's can_accumulate_inplace use counts).
func (e *engine) exclusive(t *tensor.Tensor, n int) bool {
	return e.refs[t] <= n && e.srefs[t.Storage()] <= 1
}

// countDependencies counts, for every node reachable from the roots, the
// edges that lead to it.
func (e *engine) countDependencies(roots []Edge) {
	e.queued = map[*Node]bool{}
	seen := map[*Node]bool{}
	var stack []*Node
	for _, r := range roots {
		if r.Node != nil && !seen[r.Node] {
			seen[r.Node] = true
			stack = append(stack, r.Node)
		}
	}
	for len(stack) > 0 {
		n := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		if e.run != nil && n.variable == nil && n.pendingOf == nil {
			e.pending = append(e.pending, n)
		}
		for _, next := range n.next {
			if next.Node == nil {
				continue
			}
			e.deps[next.Node]++
			if !seen[next.Node] {
				seen[next.Node] = true
				stack = append(stack, next.Node)
			}
		}
	}
	slices.SortFunc(e.pending, func(a, b *Node) int { return cmp.Compare(a.seq, b.seq) })
	for i, n := range e.pending {
		n.pendingOf, n.pendingAt = e, i
	}
}

// leavePending takes n, about to run, out of the pending frames; the
// credits of its frame and of those above go (their numbers change).
func (e *engine) leavePending(n *Node) {
	if n.pendingOf != e {
		return
	}
	i := n.pendingAt
	e.pending = slices.Delete(e.pending, i, i+1)
	for j := i; j < len(e.pending); j++ {
		e.pending[j].pendingAt = j
	}
	n.pendingOf = nil
	if m := ctxOf(n).Manager; m != nil {
		m.NoteGarbageAt(&n.mark, e.frameBase+i)
	}
}

// endFrames forgets the frames when the backward ends (run or not: an
// error leaves nodes pending).
func (e *engine) endFrames() {
	for _, n := range e.pending {
		n.pendingOf = nil
	}
	e.pending = nil
}

// Frames, BeginFrames and ReachFrame make the engine a tensor.FramedRoot:
// frame i is pending[i] — its saved tensors (or what hooks packed for
// them), and the nodes its edges lead to but those pending, which are
// frames of their own. What a node reaches changes only when it runs
// (leavePending, then its release: NoteGarbageAt), when a checkpoint's
// holder of its is given or lets go of a tensor (NoteChanged), or when a
// gradient it reaches through a leaf is replaced (Tensor.ReachChanged).
func (e *engine) Frames() int { return len(e.pending) }

// BeginFrames notes that the walk numbered epoch walks the frames: until
// the next, a pending node met on another path is not walked (Node.Mark).
func (e *engine) BeginFrames(epoch uint64, base int) { e.framed, e.frameBase = epoch, base }

// ReachFrame walks frame i.
func (e *engine) ReachFrame(r *tensor.Reacher, i int) {
	n := e.pending[i]
	if r.Visit(&n.mark) {
		n.Reach(r)
	}
}

// add puts gradient g into the input buffer of edge's node, accumulating
// as PyTorch's InputBuffer::add does.
func (e *engine) add(edge Edge, g *tensor.Tensor) error {
	if edge.Node == nil || g == nil {
		return nil
	}
	buf := e.buffers[edge.Node]
	if buf == nil {
		buf = make([]*tensor.Tensor, max(edge.Node.nOutputs, edge.Input+1))
		e.buffers[edge.Node] = buf
	}
	old := buf[edge.Input]
	if old == nil {
		buf[edge.Input] = g
		e.hold(g)
		return nil
	}
	if e.exclusive(old, 1) && old.IsNonOverlappingAndDense() {
		if err := addInPlace(old, g); err != nil {
			return err
		}
		return nil
	}
	sum, err := add(old, g)
	if err != nil {
		return err
	}
	e.drop(old)
	buf[edge.Input] = sum
	e.hold(sum)
	return nil
}

func (e *engine) push(n *Node) {
	e.order++
	e.queued[n] = true
	heap.Push(&e.ready, readyItem{n, e.order})
}

// evaluate runs node n (Engine::evaluate_function).
func (e *engine) evaluate(n *Node, retainGraph bool) error {
	e.leavePending(n)
	e.region, e.cur = ctxOf(n).Tick(), n
	grads := e.buffers[n]
	delete(e.buffers, n)
	if grads == nil {
		grads = make([]*tensor.Tensor, max(n.nOutputs, 1))
	}
	// retain_grad() hooks see the incoming gradient first.
	for i, w := range n.retained {
		if i < len(grads) && grads[i] != nil {
			if t := w.Value(); t != nil {
				if err := retainGradHook(t, grads[i]); err != nil {
					return err
				}
			}
		}
	}
	// The gradients leave the buffer: the node's argument list holds them
	// until it returns.
	for _, g := range grads {
		e.drop(g)
	}
	e.holdArgs(grads)
	for _, h := range slices.Clone(n.preHooks) {
		if err := h.fn(); err != nil {
			e.dropArgs(grads)
			return err
		}
	}
	// The running engine, for AccumulateGrad's use-count check; cleared
	// when the node returns, so a failed backward (an out-of-memory
	// error) leaves no engine — and no gradient of its buffers —
	// reachable. Kept on the node, not in a global: Sessions in one
	// process run backward independently.
	n.running = e
	// Tensors the node unpacks through saved-tensor hooks are held in
	// flight until it returns (SavedTensor.Unpack).
	releaseUnpacked := func() {}
	if n.ctx != nil {
		releaseUnpacked = n.ctx.Hold()
	}
	var outs []*tensor.Tensor
	var err error
	if anyDefined(grads) || n.variable != nil {
		outs, err = n.apply(n, grads)
	} else {
		// No incoming gradient is defined (an empty input's, say): the
		// node's gradients are undefined too, as PyTorch's generated
		// backward functions return when !any_grad_defined.
		outs = make([]*tensor.Tensor, len(n.next))
	}
	n.running = nil
	releaseUnpacked()
	if err != nil {
		return err
	}
	// What apply unpacked or computed and did not return is garbage now,
	// before the outputs are reduced to their inputs' shapes (PyTorch's
	// apply returns, its locals go, then validate_outputs runs).
	if n.variable == nil {
		ctxOf(n).Manager.NoteHeldGarbage()
	}
	// The node's gradients are the engine's until they reach the input
	// buffers (Reach walks them). apply has returned: its Go code holds
	// nothing any more, so the horizon moves here, and what it made and
	// did not return (or validate replaces) is garbage the reach walk
	// proves without a collection.
	e.outs = outs
	e.region = ctxOf(n).Tick()
	defer func() { e.outs = nil }()
	for i := range outs {
		if outs[i] == nil || i >= len(n.input) {
			continue
		}
		if outs[i], err = validate(n, i, &outs[i]); err != nil {
			return err
		}
	}
	e.dropArgs(grads)
	clear(grads)
	if !retainGraph {
		n.release()
		n.doneIn = e.run
		if n.variable != nil {
			e.doneAccs = append(e.doneAccs, n)
		}
	}
	// The node's incoming gradients and (unless retained) its saved
	// tensors may have become garbage: exact-peak mode must see them go.
	if n.variable == nil {
		ctxOf(n).Manager.NoteGarbageAt(&n.mark, -1)
	}
	for i, edge := range n.next {
		if edge.Node == nil {
			continue
		}
		var g *tensor.Tensor
		if i < len(outs) {
			g = outs[i]
		}
		// g stays in outs (reachable) while add allocates
		if err := e.add(edge, g); err != nil {
			return err
		}
		if i < len(outs) {
			outs[i] = nil
		}
		if e.deps[edge.Node]--; e.deps[edge.Node] == 0 && !e.queued[edge.Node] {
			e.push(edge.Node)
		}
	}
	return nil
}

// holdArgs and dropArgs count the node's argument list as a holder of its
// incoming gradients while it runs (AccumulateGrad steals only what nobody
// else holds).
func (e *engine) holdArgs(grads []*tensor.Tensor) {
	for _, g := range grads {
		if g != nil {
			e.hold(g)
		}
	}
}

func (e *engine) dropArgs(grads []*tensor.Tensor) {
	for _, g := range grads {
		e.drop(g)
	}
}

// validate makes output i of n match the input it is the gradient of
// (validate_outputs): broadcast gradients are summed to the input's shape,
// and cast to its dtype.
//
// slot holds g (the engine's outs, which the reach walk sees); the summed
// gradient replaces it there while it is cast.
func validate(n *Node, i int, slot **tensor.Tensor) (*tensor.Tensor, error) {
	g := *slot
	in := n.input[i]
	if in.shape == nil {
		return g, nil
	}
	var err error
	var summed *tensor.Tensor // sumTo's result, when it allocated one
	if !sameShape(g.Shape(), in.shape) {
		orig := g
		if g, err = sumTo(g, in.shape); err != nil {
			return nil, fmt.Errorf("Function %s returned an invalid gradient at index %d - got %s but expected shape compatible with %s", n.name, i, sizeString(orig.Shape()), sizeString(in.shape))
		}
		if g.Memory() != orig.Memory() {
			summed = g
		}
		*slot = g
	}
	if g.DType() != in.dtype {
		if g, err = toDType(g, "", in.dtype); err != nil {
			return nil, err
		}
		if summed != nil && g.Memory() != summed.Memory() {
			// The summed gradient was the engine's own temporary, which
			// the cast replaces: PyTorch frees it here (its last
			// reference goes), so memsh does too, without a reclaim.
			*slot = g
			summed.Context().Manager.Release(summed.Memory(), "freed by autograd after its cast")
		}
	}
	return g, nil
}

// sumTo reduces g to shape as at::sum_to: leading dimensions and dimensions
// where shape is 1 are summed (one allocation), then viewed as shape.
func sumTo(g *tensor.Tensor, shape []int) (*tensor.Tensor, error) {
	gs := g.Shape()
	lead := len(gs) - len(shape)
	if lead < 0 {
		return nil, errors.New("sum_to: bad shape")
	}
	var dims []int
	for d := range lead {
		dims = append(dims, d)
	}
	for i, s := range shape {
		if s == 1 && gs[lead+i] != 1 {
			dims = append(dims, lead+i)
		} else if s != gs[lead+i] {
			return nil, errors.New("sum_to: bad shape")
		}
	}
	var err error
	if len(dims) > 0 {
		if g, err = sum(g, dims, true); err != nil {
			return nil, err
		}
	}
	if lead > 0 {
		return view(g, shape)
	}
	return g, nil
}

// accumulateGrad is AccumulateGrad's apply: store or add a leaf's gradient.
func accumulateGrad(n *Node, grads []*tensor.Tensor) ([]*tensor.Tensor, error) {
	g := grads[0]
	if g == nil {
		return nil, nil
	}
	v := n.variable
	m := metaFor(v)
	if m.Grad == nil {
		if e := n.running; e != nil && e.exclusiveArg(g) && obeysLayout(g, v) {
			m.Grad = g
		} else {
			c, err := tensor.EmptyStridedLike(v)
			if err != nil {
				return nil, err
			}
			if err := copyInto(c, g); err != nil {
				return nil, err
			}
			m.Grad = c
		}
		v.ReachGrew() // it had no gradient: it lets go of nothing
		return nil, runPostAccumulateGradHooks(v, m)
	}
	if err := addInPlace(m.Grad, g); err != nil {
		return nil, err
	}
	return nil, runPostAccumulateGradHooks(v, m)
}

// runPostAccumulateGradHooks calls v's post-accumulate-grad hooks, in
// order, as AccumulateGrad's apply does once the gradient is in .grad;
// one that a hook removes meanwhile still runs this time (the list is
// copied first).
func runPostAccumulateGradHooks(v *tensor.Tensor, m *tensor.AutogradMeta) error {
	if len(m.PostAccumulateGradHooks) == 0 {
		return nil
	}
	for _, h := range slices.Clone(m.PostAccumulateGradHooks) {
		if err := h.Fn(v); err != nil {
			return err
		}
	}
	return nil
}

// exclusiveArg: the node's argument list is the only holder of g.
func (e *engine) exclusiveArg(g *tensor.Tensor) bool { return e.refs[g] <= 1 }

// obeysLayout is PyTorch's obeys_layout_contract: a gradient may become
// .grad as it is when its strides are the variable's (for a dense
// variable) or it is contiguous.
func obeysLayout(g, v *tensor.Tensor) bool {
	if v.IsNonOverlappingAndDense() {
		gs, vs := g.Strides(), v.Strides()
		shape := v.Shape()
		for i := range vs {
			if shape[i] != 1 && gs[i] != vs[i] {
				return false
			}
		}
		return true
	}
	return g.IsContiguous()
}

// retainGradHook stores a copy of g in a non-leaf that called retain_grad.
func retainGradHook(t, g *tensor.Tensor) error {
	m := metaFor(t)
	if m.Grad == nil {
		c, err := clone(g)
		if err != nil {
			return err
		}
		m.Grad = c
		t.ReachChanged()
		return nil
	}
	s, err := add(m.Grad, g)
	if err != nil {
		return err
	}
	m.Grad = s
	t.ReachChanged()
	return nil
}

func sizeString(s []int) string {
	out := "torch.Size(["
	for i, d := range s {
		if i > 0 {
			out += ", "
		}
		out += fmt.Sprint(d)
	}
	return out + "])"
}

type readyItem struct {
	n     *Node
	order uint64
}

// readyQueue is the engine's ready queue: the highest sequence number
// first; among equal ones, first come first.
type readyQueue []readyItem

func (q readyQueue) Len() int { return len(q) }
func (q readyQueue) Less(i, j int) bool {
	if q[i].n.seq != q[j].n.seq {
		return q[i].n.seq > q[j].n.seq
	}
	return q[i].order < q[j].order
}
func (q readyQueue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *readyQueue) Push(x any)   { *q = append(*q, x.(readyItem)) }
func (q *readyQueue) Pop() any {
	old := *q
	it := old[len(old)-1]
	*q = old[:len(old)-1]
	return it
}

// anyDefined reports whether some gradient of gs is defined (not nil).
func anyDefined(gs []*tensor.Tensor) bool {
	for _, g := range gs {
		if g != nil {
			return true
		}
	}
	return false
}
