package autograd

import "github.com/memsh/memsh/tensor"

// Recording an op follows PyTorch's generated VariableType code: when grad
// mode is on and an input requires grad, the node is made before the
// forward runs (so sequence numbers follow execution order), with one next
// edge per input; inputs are saved before the forward, outputs after it.

// newNode returns the backward node for an op over inputs, or nil when no
// gradient is needed (grad mode off, or no input requires grad). Nil
// inputs are inputs that are not tensors (they get no edge).
func newNode(name string, inputs ...*tensor.Tensor) *Node {
	var ctx *tensor.Context
	any := false
	for _, in := range inputs {
		if in == nil {
			continue
		}
		ctx = in.Context()
		if RequiresGrad(in) {
			any = true
		}
	}
	if !any || !GradEnabled(ctx) {
		return nil
	}
	n := &Node{ctx: ctx, name: name, seq: seqCounter.Add(1), nOutputs: 1}
	n.noteScope()
	n.next = make([]Edge, len(inputs))
	n.input = make([]inputMeta, len(inputs))
	for i, in := range inputs {
		if in == nil {
			continue
		}
		n.next[i] = gradEdge(in)
		n.input[i] = inputMeta{shape: in.Shape(), dtype: in.DType(), device: in.Device()}
	}
	return n
}

// setOutputs makes outs the outputs of n (their grad_fn and output_nr).
func (n *Node) setOutputs(outs ...*tensor.Tensor) {
	n.nOutputs = len(outs)
	for i, t := range outs {
		if t == nil {
			continue
		}
		m := metaFor(t)
		m.GradFn, m.OutputNr, m.RequiresGrad = n, i, false
	}
}

// checkInPlace is PyTorch's check before an in-place op on t with grad mode
// on: a leaf that requires grad (or a view of one) cannot be modified.
func checkInPlace(t *tensor.Tensor) error {
	if GradEnabled(t.Context()) && IsLeaf(t) && RequiresGrad(t) {
		return errLeafInPlace
	}
	return nil
}

type constErr string

func (e constErr) Error() string { return string(e) }

const errLeafInPlace = constErr("a leaf Variable that requires grad is being used in an in-place operation.")

// rebase makes an in-place op's node the new grad_fn of t (rebase_history).
func rebase(n *Node, t *tensor.Tensor) {
	if n == nil {
		return
	}
	n.setOutputs(t)
}

// recording reports whether an op over ts would record a node: grad mode
// is on and one of them requires grad. Composite ops take their engine
// fast path otherwise.
func recording(ts ...*tensor.Tensor) bool {
	for _, t := range ts {
		if t != nil && RequiresGrad(t) {
			return GradEnabled(t.Context())
		}
	}
	return false
}
