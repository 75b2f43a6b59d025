package autograd

import (
	"fmt"
	"math"
	"strings"
	"sync/atomic"
	"weak"

	"github.com/memsh/memsh/backend"
	"github.com/memsh/memsh/tensor"
)

// A Node is a backward function of the graph: PyTorch's torch::autograd::Node.
// Its name is PyTorch's ("AddmmBackward0", "AccumulateGrad"); its next
// edges lead to the nodes of its differentiable inputs, in input order (an
// edge with a nil Node is an input that needs no gradient).
type Node struct {
	ctx   *tensor.Context
	name  string
	seq   uint64
	next  []Edge
	input []inputMeta // what each input looked like, for sum_to and casts
	saved []*SavedTensor
	// held are tensors a custom autograd.Function's ctx keeps as plain
	// attributes (bitsandbytes' MatMul4Bit: ctx.tensors, ctx.state), not
	// SavedVariables: no saved-tensor hooks pack them, no version check,
	// and the node keeps them until it is dropped, release or not.
	held []*tensor.Tensor

	// apply computes the gradients of the inputs from the gradients of the
	// outputs (one per output; nil where an output got no gradient). It
	// returns one gradient per next edge (nil where none is needed).
	apply func(n *Node, grads []*tensor.Tensor) ([]*tensor.Tensor, error)

	nOutputs int
	released bool // saved tensors freed by a backward without retain_graph
	// doneIn is the backward run that ran and released the node, if any:
	// while that run goes on, the reach walk leaves the node's edges to
	// the run (reach.go)
	doneIn *graphRun

	// preHooks run, in order, when the engine is about to run the node
	// (RegisterPreHook), before its gradients are used.
	preHooks []*preHook

	// retained holds the outputs that asked for retain_grad(), by output
	// number; held weakly as PyTorch's retains_grad hook does.
	retained map[int]weak.Pointer[tensor.Tensor]

	// variable is the leaf of an AccumulateGrad node.
	variable *tensor.Tensor

	// running is the engine evaluating the node, while it runs.
	running *engine

	// scope is the Observer's scope when the node was made (Scope).
	scope any

	// mark is where reach walks met the node (tensor.Reacher.Visit).
	mark backend.Mark
	// pendingOf is the engine whose task holds the node, not run yet, as
	// a frame of the reach walk (engine.pending, at pendingAt); nil when
	// none.
	pendingOf *engine
	pendingAt int
}

// Edge is a graph edge: the gradient of an input flows to input number
// Input of Node.
type Edge struct {
	Node  *Node
	Input int
}

type inputMeta struct {
	shape  []int
	dtype  tensor.DType
	device string
}

// seqCounter numbers nodes in creation order, as PyTorch's sequence_nr.
var seqCounter atomic.Uint64

// accumulateSeq is AccumulateGrad's sequence number: the highest, so a leaf's
// gradient is stored as soon as it is ready (PyTorch: UINT64_MAX).
const accumulateSeq = math.MaxUint64

// Name returns PyTorch's name of the node ("MulBackward0").
func (n *Node) Name() string { return n.name }

// NextFunctions returns the node's next edges (grad_fn.next_functions).
func (n *Node) NextFunctions() []Edge { return n.next }

// Variable returns the leaf of an AccumulateGrad node, or nil.
func (n *Node) Variable() *tensor.Tensor { return n.variable }

// SavedTensors returns the tensors the node keeps for its backward (nil
// entries after release, and for tensors a saved-tensor pack hook replaced).
func (n *Node) SavedTensors() []*tensor.Tensor {
	out := make([]*tensor.Tensor, len(n.saved))
	for i, s := range n.saved {
		out[i] = s.t
	}
	return out
}

// Released reports whether the node's saved tensors have been freed.
func (n *Node) Released() bool { return n.released }

// release frees the node's saved tensors (Node::release_variables).
func (n *Node) release() {
	for _, s := range n.saved {
		s.t = nil
		s.hooked = nil // SavedVariable::reset_data drops the hooks and the packed value
		s.released = true
	}
	n.released = true
}

// String describes the node as PyTorch prints a grad_fn.
func (n *Node) String() string { return fmt.Sprintf("<%s>", n.name) }

// needsGrad reports whether input i of the node needs a gradient.
func (n *Node) needsGrad(i int) bool { return i < len(n.next) && n.next[i].Node != nil }

// SavedTensor is a tensor a node keeps for its backward: PyTorch's
// SavedVariable. It remembers the storage version at save time; unpacking
// after an in-place write is PyTorch's error.
//
// While saved-tensor hooks are installed (WithSavedTensorHooks), the tensor
// is not kept: hooked holds what the pack hook returned and unpacking calls
// the unpack hook (PyTorch's SavedVariable with hooks_).
type SavedTensor struct {
	t        *tensor.Tensor
	hooked   *hookedSave
	version  uint64
	node     *Node
	output   int  // the output number when the saved tensor is an output of node
	isOutput bool // saved output of its own node (e.g. relu's result)
	released bool
}

// save records t for n's backward; nil saves nothing.
func (n *Node) save(t *tensor.Tensor) *SavedTensor {
	if t == nil {
		return nil
	}
	s := &SavedTensor{version: t.Version(), node: n}
	if h := currentHooks(t.Context()); h != nil {
		s.hooked = packSaved(h, t)
		if ch, ok := s.hooked.packed.(*ckptHolder); ok {
			ch.owner = n
		}
	} else {
		s.t = t
	}
	n.saved = append(n.saved, s)
	noteSaved(s)
	return s
}

// saveOutput records output number i of n (a tensor whose grad_fn is n).
func (n *Node) saveOutput(t *tensor.Tensor, i int) *SavedTensor {
	s := n.save(t)
	s.isOutput, s.output = true, i
	return s
}

// errFreed is PyTorch's message for a second backward through a graph whose
// saved tensors were released.
const errFreed = "Trying to backward through the graph a second time (or directly access saved tensors after they have already been freed). Saved intermediate values of the graph are freed when you call .backward() or autograd.grad(). Specify retain_graph=True if you need to backward through the graph a second time or if you need to access saved tensors after calling backward."

// Unpack returns the saved tensor, or PyTorch's error if it was released or
// modified in place since it was saved.
func (s *SavedTensor) Unpack() (*tensor.Tensor, error) {
	if s == nil {
		return nil, nil
	}
	if s.released {
		return nil, fmt.Errorf("%s", errFreed)
	}
	if s.hooked != nil {
		// No version check through hooks (PyTorch cannot track versions
		// through them either).
		t, err := s.hooked.unpack(s)
		if t != nil && s.node != nil && s.node.running != nil && s.node.ctx != nil {
			// What a hook returns only the running node holds, until it
			// returns (the engine releases the hold), as the generated
			// backward's local variable does; the reach walk sees it.
			s.node.ctx.Hold(t)
		}
		return t, err
	}
	if v := s.t.Version(); v != s.version {
		by := "is output 0 of " + s.node.name
		if !s.isOutput {
			if m := metaOf(s.t); m != nil && m.GradFn != nil {
				by = fmt.Sprintf("is output %d of %s", m.OutputNr, m.GradFn.Name())
			} else {
				by = "is a leaf"
			}
		} else {
			by = fmt.Sprintf("is output %d of %s", s.output, s.node.name)
		}
		return nil, fmt.Errorf("one of the variables needed for gradient computation has been modified by an inplace operation: [%s], which %s, is at version %d; expected version %d instead. Hint: the backtrace further above can point to the operation that failed to compute its gradient. The variable in question was changed in there or anywhere later. Good luck!",
			typeName(s.t), by, v, s.version)
	}
	return s.t, nil
}

// typeName is PyTorch's legacy type string with the shape: "torch.cuda.FloatTensor [64, 10]".
func typeName(t *tensor.Tensor) string {
	kind := map[string]string{
		"float32": "FloatTensor", "float64": "DoubleTensor", "float16": "HalfTensor", "bfloat16": "BFloat16Tensor",
		"int64": "LongTensor", "int32": "IntTensor", "int16": "ShortTensor", "int8": "CharTensor", "uint8": "ByteTensor", "bool": "BoolTensor",
	}[t.DType().String()]
	prefix := "torch."
	if strings.HasPrefix(t.Device(), "cuda") {
		prefix = "torch.cuda."
	}
	dims := make([]string, len(t.Shape()))
	for i, d := range t.Shape() {
		dims[i] = fmt.Sprint(d)
	}
	return prefix + kind + " [" + strings.Join(dims, ", ") + "]"
}
