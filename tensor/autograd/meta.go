package autograd

import (
	"errors"
	"slices"

	"github.com/memsh/memsh/tensor"
)

// A tensor's autograd state lives in its tensor.AutogradMeta (nil for a
// tensor that never took part in autograd). A leaf requires grad when its
// RequiresGrad flag is set; a non-leaf (the result of a recorded op) has a
// GradFn and always requires grad.

func metaOf(t *tensor.Tensor) *tensor.AutogradMeta { return t.Autograd() }

func metaFor(t *tensor.Tensor) *tensor.AutogradMeta {
	m := t.Autograd()
	if m == nil {
		m = &tensor.AutogradMeta{}
		t.SetAutograd(m)
	}
	return m
}

// RequiresGrad reports whether gradients will be computed for t
// (Tensor.requires_grad).
func RequiresGrad(t *tensor.Tensor) bool {
	m := metaOf(t)
	return m != nil && (m.RequiresGrad || m.GradFn != nil)
}

// IsLeaf reports whether t is a leaf: it was not made by a recorded op
// (Tensor.is_leaf).
func IsLeaf(t *tensor.Tensor) bool {
	m := metaOf(t)
	return m == nil || m.GradFn == nil
}

// GradFn returns the node that made t, or nil for a leaf (Tensor.grad_fn).
func GradFn(t *tensor.Tensor) *Node {
	if m := metaOf(t); m != nil && m.GradFn != nil {
		return m.GradFn.(*Node)
	}
	return nil
}

// Grad returns t's gradient, or nil (Tensor.grad).
func Grad(t *tensor.Tensor) *tensor.Tensor {
	if m := metaOf(t); m != nil {
		return m.Grad
	}
	return nil
}

// SetGrad replaces t's gradient (nil clears it), checking what PyTorch's
// Tensor.grad setter checks.
func SetGrad(t, g *tensor.Tensor) error {
	if g != nil {
		if g.DType() != t.DType() {
			return errors.New("assigned grad has data of a different type")
		}
		if g.Device() != t.Device() {
			return errors.New("assigned grad has data located on a different device")
		}
		if !sameShape(g.Shape(), t.Shape()) {
			return errors.New("assigned grad has data of a different size")
		}
	}
	if g == nil && metaOf(t) == nil {
		return nil
	}
	metaFor(t).Grad = g
	return nil
}

// SetRequiresGrad sets a leaf's requires_grad flag (Tensor.requires_grad_).
func SetRequiresGrad(t *tensor.Tensor, on bool) error {
	if !IsLeaf(t) {
		if on {
			return nil
		}
		return errors.New("you can only change requires_grad flags of leaf variables. If you want to use a computed variable in a subgraph that doesn't require differentiation use var_no_grad = var.detach().")
	}
	if on && !t.DType().IsFloat() {
		return errors.New("only Tensors of floating point dtype can require gradients")
	}
	if !on && metaOf(t) == nil {
		return nil
	}
	metaFor(t).RequiresGrad = on
	return nil
}

// RegisterPostAccumulateGradHook adds fn to t's post-accumulate-grad
// hooks (Tensor.register_post_accumulate_grad_hook): after a backward
// accumulated t's gradient into t.grad, fn is called with t; an error it
// returns ends the backward. held is what the layer above keeps for fn
// (the reach walk walks it). remove unregisters it. PyTorch's errors for
// a non-leaf and for a tensor that does not require grad.
func RegisterPostAccumulateGradHook(t *tensor.Tensor, fn func(*tensor.Tensor) error, held any) (remove func(), err error) {
	if !IsLeaf(t) {
		return nil, errors.New("post accumulate grad hooks cannot be registered on non-leaf tensors")
	}
	if !RequiresGrad(t) {
		return nil, errors.New("cannot register a hook on a tensor that doesn't require gradient")
	}
	m := metaFor(t)
	h := &tensor.PostAccumulateGradHook{Fn: fn, Held: held}
	m.PostAccumulateGradHooks = append(m.PostAccumulateGradHooks, h)
	t.ReachChanged()
	return func() {
		i := slices.Index(m.PostAccumulateGradHooks, h)
		if i < 0 {
			return
		}
		m.PostAccumulateGradHooks = slices.Delete(slices.Clone(m.PostAccumulateGradHooks), i, i+1)
		t.ReachChanged()
	}, nil
}

// preHook is a node's pre-hook and what the layer above keeps for it.
type preHook struct {
	fn   func() error
	held any
}

// RegisterPreHook adds fn to the hooks that run when the backward is
// about to run t's grad_fn — once its gradient is ready, before it is
// used (the point a tensor hook or torch.autograd.graph's
// register_multi_grad_hook fires: FSDP2's pre-backward). held is what
// the layer above keeps for fn (the reach walk walks it). remove
// unregisters it. t must have a grad_fn. first puts fn before the node's
// other pre-hooks (FSDP2's post-backward, which an autograd Function on
// the group's inputs runs before their producer's hooks).
func RegisterPreHook(t *tensor.Tensor, fn func() error, held any, first bool) (remove func(), err error) {
	n := GradFn(t)
	if n == nil {
		return nil, errors.New("cannot register a backward pre-hook on a tensor without grad_fn")
	}
	h := &preHook{fn: fn, held: held}
	if first {
		n.preHooks = append([]*preHook{h}, n.preHooks...)
	} else {
		n.preHooks = append(n.preHooks, h)
	}
	return func() {
		if i := slices.Index(n.preHooks, h); i >= 0 {
			n.preHooks = slices.Delete(slices.Clone(n.preHooks), i, i+1)
		}
	}, nil
}

// RetainGrad makes a non-leaf keep its gradient in .grad after backward
// (Tensor.retain_grad); a leaf keeps it anyway.
func RetainGrad(t *tensor.Tensor) error {
	if !RequiresGrad(t) {
		return errors.New("can't retain_grad on Tensor that has requires_grad=False")
	}
	m := metaOf(t)
	if m.GradFn == nil || m.RetainsGrad {
		return nil
	}
	m.RetainsGrad = true
	n := m.GradFn.(*Node)
	if n.retained == nil {
		n.retained = map[int]weakTensor{}
	}
	n.retained[m.OutputNr] = makeWeak(t)
	return nil
}

// RetainsGrad reports whether retain_grad() was called on a non-leaf.
func RetainsGrad(t *tensor.Tensor) bool {
	m := metaOf(t)
	return m != nil && m.RetainsGrad
}

// Detach returns a tensor sharing t's storage that is outside the graph
// (Tensor.detach).
func Detach(t *tensor.Tensor) *tensor.Tensor { return tensor.Alias(t) }

// gradEdge returns the edge through which t's gradient flows: its grad_fn,
// a leaf's AccumulateGrad, or no edge.
func gradEdge(t *tensor.Tensor) Edge {
	m := metaOf(t)
	switch {
	case m == nil:
		return Edge{}
	case m.GradFn != nil:
		return Edge{Node: m.GradFn.(*Node), Input: m.OutputNr}
	case m.RequiresGrad:
		return Edge{Node: accumulator(t, m)}
	}
	return Edge{}
}

// accumulator returns the leaf's AccumulateGrad node, made on first use.
func accumulator(t *tensor.Tensor, m *tensor.AutogradMeta) *Node {
	if a, ok := m.Accumulator.(*Node); ok && a != nil {
		return a
	}
	a := &Node{ctx: t.Context(), name: "AccumulateGrad", seq: accumulateSeq, variable: t, nOutputs: 1}
	a.apply = accumulateGrad
	a.noteScope()
	m.Accumulator = a
	return a
}

func sameShape(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
