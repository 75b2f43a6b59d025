package autograd

import (
	"github.com/memsh/memsh/tensor"
)

// Differentiable elementwise arithmetic. Gradients of broadcast inputs are
// returned at the broadcast shape and summed to the input's shape by the
// engine (validate_outputs), as in PyTorch.

// Add is a + b (add.Tensor, AddBackward0: nothing saved; both gradients
// are the incoming gradient itself).
func Add(a, b *tensor.Tensor) (*tensor.Tensor, error) {
	n := newNode("AddBackward0", a, b)
	out, err := add(a, b)
	if err != nil || n == nil {
		return out, err
	}
	n.apply = func(n *Node, g []*tensor.Tensor) ([]*tensor.Tensor, error) {
		return []*tensor.Tensor{pick(n, 0, g[0]), pick(n, 1, g[0])}, nil
	}
	n.setOutputs(out)
	return out, nil
}

// pick returns g when input i needs a gradient, else nil.
func pick(n *Node, i int, g *tensor.Tensor) *tensor.Tensor {
	if n.needsGrad(i) {
		return g
	}
	return nil
}

// Sub is a - b (sub.Tensor, SubBackward0: b's gradient is -grad).
func Sub(a, b *tensor.Tensor) (*tensor.Tensor, error) {
	n := newNode("SubBackward0", a, b)
	out, err := sub(a, b)
	if err != nil || n == nil {
		return out, err
	}
	n.apply = func(n *Node, g []*tensor.Tensor) ([]*tensor.Tensor, error) {
		res := []*tensor.Tensor{pick(n, 0, g[0]), nil}
		if n.needsGrad(1) {
			ng, err := neg(g[0])
			if err != nil {
				return nil, err
			}
			res[1] = ng
		}
		return res, nil
	}
	n.setOutputs(out)
	return out, nil
}

// Mul is a * b (mul.Tensor, MulBackward0: saves b when a needs a gradient
// and a when b does; gradients grad * b and grad * a).
func Mul(a, b *tensor.Tensor) (*tensor.Tensor, error) {
	n := newNode("MulBackward0", a, b)
	sa, sb := saveProductOperands(n, 0, a, b)
	out, err := mul(a, b)
	if err != nil || n == nil {
		return out, err
	}
	n.apply = mulBackward(sa, sb)
	n.setOutputs(out)
	return out, nil
}

// Div is a / b (div.Tensor, DivBackward0: saves b, and a when b needs a
// gradient; gradients grad / b and -grad * a / b / b).
func Div(a, b *tensor.Tensor) (*tensor.Tensor, error) {
	n := newNode("DivBackward0", a, b)
	var sa, sb *SavedTensor
	if n != nil {
		sb = n.save(b)
		if n.needsGrad(1) {
			sa = n.save(a)
		}
	}
	out, err := div(a, b)
	if err != nil || n == nil {
		return out, err
	}
	n.apply = divBackward(sa, sb)
	n.setOutputs(out)
	return out, nil
}

// The ops with a number operand and negation save nothing; their nodes
// are recorded after the forward, as the view ops' (viewOp).

// AddScalar is a + s (add.Scalar, AddBackward1: the gradient passes through).
func AddScalar(a *tensor.Tensor, s tensor.Scalar) (*tensor.Tensor, error) {
	return viewOp("AddBackward1", a, func() (*tensor.Tensor, error) { return addScalar(a, s) }, passThrough)
}

// SubScalar is a - s (sub.Scalar, SubBackward1).
func SubScalar(a *tensor.Tensor, s tensor.Scalar) (*tensor.Tensor, error) {
	return viewOp("SubBackward1", a, func() (*tensor.Tensor, error) { return subScalar(a, s) }, passThrough)
}

// RSubScalar is s - a (rsub.Scalar, RsubBackward1: gradient -grad).
func RSubScalar(a *tensor.Tensor, s tensor.Scalar) (*tensor.Tensor, error) {
	return viewOp("RsubBackward1", a, func() (*tensor.Tensor, error) { return rsubScalar(a, s) }, neg)
}

// MulScalar is a * s (mul.Scalar, MulBackward1: gradient grad * s).
func MulScalar(a *tensor.Tensor, s tensor.Scalar) (*tensor.Tensor, error) {
	return viewOp("MulBackward1", a, func() (*tensor.Tensor, error) { return mulScalar(a, s) },
		func(g *tensor.Tensor) (*tensor.Tensor, error) { return mulScalar(g, s) })
}

// DivScalar is a / s (div.Scalar, DivBackward1: gradient grad / s).
func DivScalar(a *tensor.Tensor, s tensor.Scalar) (*tensor.Tensor, error) {
	return viewOp("DivBackward1", a, func() (*tensor.Tensor, error) { return divScalar(a, s) },
		func(g *tensor.Tensor) (*tensor.Tensor, error) { return divScalar(g, s) })
}

// Neg is -a (NegBackward0: gradient -grad).
func Neg(a *tensor.Tensor) (*tensor.Tensor, error) {
	return viewOp("NegBackward0", a, func() (*tensor.Tensor, error) { return neg(a) }, neg)
}

// passThrough is the backward of ops whose gradient is the incoming one.
func passThrough(g *tensor.Tensor) (*tensor.Tensor, error) { return g, nil }

// mulBackward is MulBackward0's formula: grad * b for a (b saved as sb),
// grad * a for b (a saved as sa).
func mulBackward(sa, sb *SavedTensor) func(n *Node, g []*tensor.Tensor) ([]*tensor.Tensor, error) {
	return func(n *Node, g []*tensor.Tensor) ([]*tensor.Tensor, error) {
		res := make([]*tensor.Tensor, 2)
		if n.needsGrad(0) {
			bv, err := sb.Unpack()
			if err != nil {
				return nil, err
			}
			if res[0], err = mul(g[0], bv); err != nil {
				return nil, err
			}
		}
		if n.needsGrad(1) {
			av, err := sa.Unpack()
			if err != nil {
				return nil, err
			}
			defer hold(res[0])() // reachable while the second is made
			if res[1], err = mul(g[0], av); err != nil {
				return nil, err
			}
		}
		return res, nil
	}
}

// divBackward is DivBackward0's formula: grad / b for a, and
// -grad * ((a / b) / b) for b (div_tensor_other_backward).
func divBackward(sa, sb *SavedTensor) func(n *Node, g []*tensor.Tensor) ([]*tensor.Tensor, error) {
	return func(n *Node, g []*tensor.Tensor) ([]*tensor.Tensor, error) {
		res := make([]*tensor.Tensor, 2)
		bv, err := sb.Unpack()
		if err != nil {
			return nil, err
		}
		if n.needsGrad(0) {
			if res[0], err = div(g[0], bv); err != nil {
				return nil, err
			}
		}
		if n.needsGrad(1) {
			av, err := sa.Unpack()
			if err != nil {
				return nil, err
			}
			q, err := div(av, bv)
			if err != nil {
				return nil, err
			}
			if q, err = div(q, bv); err != nil {
				return nil, err
			}
			ng, err := neg(g[0])
			if err != nil {
				return nil, err
			}
			if res[1], err = mul(ng, q); err != nil {
				return nil, err
			}
		}
		return res, nil
	}
}

// saveProductOperands saves what a product's backward needs, as
// derivatives.yaml's mul/mm/bmm entries: b when a (input off) needs a
// gradient, a when b (input off+1) does. n nil saves nothing.
func saveProductOperands(n *Node, off int, a, b *tensor.Tensor) (sa, sb *SavedTensor) {
	if n == nil {
		return nil, nil
	}
	if n.needsGrad(off) {
		sb = n.save(b)
	}
	if n.needsGrad(off + 1) {
		sa = n.save(a)
	}
	return sa, sb
}
