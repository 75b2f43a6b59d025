package autograd

import "github.com/memsh/memsh/tensor"

// Function records a custom torch.autograd.Function of one tensor input
// and one output (DTensor's Redistribute, _FromTorchTensor, its
// embedding over a sharded vocabulary): forward computes the output with engine ops, which
// are not recorded; backward computes the input's gradient from the
// output's (nil: none). The node, called name, is made before forward
// runs, as THPFunction_apply makes it, so its sequence number comes
// before any node forward's callers record after it. When nothing needs
// a gradient forward runs alone. forward may return a itself (an
// identity in the forward): the output is then a new view of a, so that
// the node is its grad_fn and not a's. held are the tensors the node
// keeps for its backward as a ctx's attributes, until it is dropped (the
// closures keep none the reclaim's walk cannot see).
func Function(name string, a *tensor.Tensor, forward func() (*tensor.Tensor, error), backward func(g *tensor.Tensor) (*tensor.Tensor, error), held ...*tensor.Tensor) (*tensor.Tensor, error) {
	n := newNode(name, a)
	if n != nil {
		n.held = held
	}
	out, err := forward()
	if err != nil || n == nil {
		return out, err
	}
	if out == a {
		if out, err = tensor.View(a, a.Shape()); err != nil {
			return nil, err
		}
	}
	n.apply = func(n *Node, g []*tensor.Tensor) ([]*tensor.Tensor, error) {
		if g[0] == nil {
			return []*tensor.Tensor{nil}, nil
		}
		r, err := backward(g[0])
		return []*tensor.Tensor{r}, err
	}
	n.setOutputs(out)
	return out, nil
}
