package autograd

import (
	"sync"
	"sync/atomic"
	"weak"

	"github.com/memsh/memsh/tensor"
)

// Saved-tensor hooks: PyTorch's torch.autograd.graph.saved_tensors_hooks.
// While hooks are installed for a Context, every tensor a node saves for
// its backward is given to Pack instead of being kept, and the node keeps
// only what Pack returned; when the backward unpacks it, Unpack turns that
// back into a tensor. Activation checkpointing (checkpoint.go) is built on
// them. Hooks are a stack per Context (PyTorch's are thread-local; a
// Context is one Session's); the innermost applies.

// SavedTensorHooks is a pair of pack/unpack hooks.
type SavedTensorHooks struct {
	// Pack is called with the tensor a node saves, when it saves it; the
	// node keeps its result instead of the tensor.
	Pack func(t *tensor.Tensor) any
	// Unpack returns the tensor for a packed value. It is called each time
	// the saved tensor is unpacked; its result is not cached.
	Unpack func(packed any) (*tensor.Tensor, error)
}

// hookState is a Context's hook stack and its current graph task.
type hookState struct {
	hooks []*SavedTensorHooks
	task  uint64 // the running Backward's graph task id; 0 outside Backward
}

var (
	hooksMu   sync.Mutex
	hookCtxs  = map[*tensor.Context]*hookState{}
	hooksUsed atomic.Int64 // installed hooks across all contexts: the fast path of save
	taskIDs   atomic.Uint64
)

func stateOf(ctx *tensor.Context) *hookState {
	st := hookCtxs[ctx]
	if st == nil {
		st = &hookState{}
		hookCtxs[ctx] = st
	}
	return st
}

func dropIfIdle(ctx *tensor.Context, st *hookState) {
	if len(st.hooks) == 0 && st.task == 0 {
		delete(hookCtxs, ctx)
	}
}

// WithSavedTensorHooks runs f with h installed for ctx (the `with
// saved_tensors_hooks(pack, unpack):` block) and removes them afterwards,
// also when f fails or panics.
func WithSavedTensorHooks(ctx *tensor.Context, h *SavedTensorHooks, f func() error) error {
	hooksMu.Lock()
	st := stateOf(ctx)
	st.hooks = append(st.hooks, h)
	hooksUsed.Add(1)
	hooksMu.Unlock()
	defer func() {
		hooksMu.Lock()
		st.hooks[len(st.hooks)-1] = nil // the backing array must not keep the hooks (and what they hold) alive
		st.hooks = st.hooks[:len(st.hooks)-1]
		hooksUsed.Add(-1)
		dropIfIdle(ctx, st)
		hooksMu.Unlock()
	}()
	return f()
}

// currentHooks returns the innermost hooks installed for ctx, or nil.
func currentHooks(ctx *tensor.Context) *SavedTensorHooks {
	if hooksUsed.Load() == 0 {
		return nil
	}
	hooksMu.Lock()
	defer hooksMu.Unlock()
	if st := hookCtxs[ctx]; st != nil && len(st.hooks) > 0 {
		return st.hooks[len(st.hooks)-1]
	}
	return nil
}

// beginGraphTask gives the Backward running on ctx a new graph task id
// (torch._C._current_graph_task_id) and returns the function that ends it.
func beginGraphTask(ctx *tensor.Context) (end func()) {
	id := taskIDs.Add(1)
	hooksMu.Lock()
	st := stateOf(ctx)
	prev := st.task
	st.task = id
	hooksMu.Unlock()
	return func() {
		hooksMu.Lock()
		st.task = prev
		dropIfIdle(ctx, st)
		hooksMu.Unlock()
	}
}

// currentGraphTask returns the id of the Backward running on ctx, or a
// fresh id outside a backward (PyTorch's checkpoint uses a uuid then).
func currentGraphTask(ctx *tensor.Context) uint64 {
	hooksMu.Lock()
	defer hooksMu.Unlock()
	if st := hookCtxs[ctx]; st != nil && st.task != 0 {
		return st.task
	}
	return taskIDs.Add(1)
}

// hookedSave is a saved tensor replaced by its pack hook's result, with
// the metadata PyTorch's SavedVariable keeps to rebuild the unpacked
// tensor's place in the graph (save_metadata).
type hookedSave struct {
	packed       any
	unpackFn     func(any) (*tensor.Tensor, error)
	gradFn       *Node // grad_fn of a saved non-leaf that is not the node's own output
	outputNr     int
	requiresGrad bool
	leaf         weak.Pointer[tensor.Tensor] // a saved leaf that requires grad (held weakly, as grad_accumulator_)
}

func packSaved(h *SavedTensorHooks, t *tensor.Tensor) *hookedSave {
	hs := &hookedSave{unpackFn: h.Unpack, requiresGrad: RequiresGrad(t)}
	if m := metaOf(t); m != nil {
		if m.GradFn != nil {
			hs.gradFn, hs.outputNr = m.GradFn.(*Node), m.OutputNr
		} else if m.RequiresGrad {
			hs.leaf = weak.Make(t)
		}
	}
	hs.packed = h.Pack(t)
	return hs
}

// unpack calls the unpack hook and gives its result the saved tensor's
// place in the graph, as SavedVariable::unpack does with hooks: the saved
// grad_fn (the node itself for a saved output), or a leaf's
// AccumulateGrad.
func (hs *hookedSave) unpack(s *SavedTensor) (*tensor.Tensor, error) {
	x, err := hs.unpackFn(hs.packed)
	if err != nil || x == nil || !hs.requiresGrad {
		return x, err
	}
	gradFn, nr := hs.gradFn, hs.outputNr
	if s.isOutput {
		gradFn, nr = s.node, s.output
	}
	a := tensor.Alias(x)
	switch {
	case gradFn != nil:
		a.SetAutograd(&tensor.AutogradMeta{GradFn: gradFn, OutputNr: nr})
	default:
		v := hs.leaf.Value()
		if v == nil {
			return nil, constErr("No grad accumulator for a saved leaf")
		}
		a.SetAutograd(&tensor.AutogradMeta{RequiresGrad: true, Accumulator: accumulator(v, metaFor(v))})
	}
	return a, nil
}
