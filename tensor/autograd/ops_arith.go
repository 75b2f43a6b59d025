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
	var sa, sb *SavedTensor
	if n != nil {
		if n.needsGrad(0) {
			sb = n.save(b)
		}
		if n.needsGrad(1) {
			sa = n.save(a)
		}
	}
	out, err := mul(a, b)
	if err != nil || n == nil {
		return out, err
	}
	n.apply = func(n *Node, g []*tensor.Tensor) ([]*tensor.Tensor, error) {
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
			if res[1], err = mul(g[0], av); err != nil {
				return nil, err
			}
		}
		return res, nil
	}
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
	n.apply = func(n *Node, g []*tensor.Tensor) ([]*tensor.Tensor, error) {
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
			// div_tensor_other_backward: -grad * ((self / other) / other)
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
	n.setOutputs(out)
	return out, nil
}

// AddScalar is a + s (add.Scalar, AddBackward1: the gradient passes through).
func AddScalar(a *tensor.Tensor, s tensor.Scalar) (*tensor.Tensor, error) {
	n := newNode("AddBackward1", a)
	out, err := addScalar(a, s)
	if err != nil || n == nil {
		return out, err
	}
	n.apply = func(n *Node, g []*tensor.Tensor) ([]*tensor.Tensor, error) { return []*tensor.Tensor{g[0]}, nil }
	n.setOutputs(out)
	return out, nil
}

// SubScalar is a - s (sub.Scalar, SubBackward1).
func SubScalar(a *tensor.Tensor, s tensor.Scalar) (*tensor.Tensor, error) {
	n := newNode("SubBackward1", a)
	out, err := subScalar(a, s)
	if err != nil || n == nil {
		return out, err
	}
	n.apply = func(n *Node, g []*tensor.Tensor) ([]*tensor.Tensor, error) { return []*tensor.Tensor{g[0]}, nil }
	n.setOutputs(out)
	return out, nil
}

// RSubScalar is s - a (rsub.Scalar, RsubBackward1: gradient -grad).
func RSubScalar(a *tensor.Tensor, s tensor.Scalar) (*tensor.Tensor, error) {
	n := newNode("RsubBackward1", a)
	out, err := rsubScalar(a, s)
	if err != nil || n == nil {
		return out, err
	}
	n.apply = func(n *Node, g []*tensor.Tensor) ([]*tensor.Tensor, error) {
		r, err := neg(g[0])
		return []*tensor.Tensor{r}, err
	}
	n.setOutputs(out)
	return out, nil
}

// MulScalar is a * s (mul.Scalar, MulBackward1: gradient grad * s).
func MulScalar(a *tensor.Tensor, s tensor.Scalar) (*tensor.Tensor, error) {
	n := newNode("MulBackward1", a)
	out, err := mulScalar(a, s)
	if err != nil || n == nil {
		return out, err
	}
	n.apply = func(n *Node, g []*tensor.Tensor) ([]*tensor.Tensor, error) {
		r, err := mulScalar(g[0], s)
		return []*tensor.Tensor{r}, err
	}
	n.setOutputs(out)
	return out, nil
}

// DivScalar is a / s (div.Scalar, DivBackward1: gradient grad / s).
func DivScalar(a *tensor.Tensor, s tensor.Scalar) (*tensor.Tensor, error) {
	n := newNode("DivBackward1", a)
	out, err := divScalar(a, s)
	if err != nil || n == nil {
		return out, err
	}
	n.apply = func(n *Node, g []*tensor.Tensor) ([]*tensor.Tensor, error) {
		r, err := divScalar(g[0], s)
		return []*tensor.Tensor{r}, err
	}
	n.setOutputs(out)
	return out, nil
}

// Neg is -a (NegBackward0: gradient -grad).
func Neg(a *tensor.Tensor) (*tensor.Tensor, error) {
	n := newNode("NegBackward0", a)
	out, err := neg(a)
	if err != nil || n == nil {
		return out, err
	}
	n.apply = func(n *Node, g []*tensor.Tensor) ([]*tensor.Tensor, error) {
		r, err := neg(g[0])
		return []*tensor.Tensor{r}, err
	}
	n.setOutputs(out)
	return out, nil
}

// AddInPlace is a += b (add_.Tensor): a must not be a leaf that requires
// grad; with grad mode on and a gradient needed, a's history is rebased on
// AddBackward0.
func AddInPlace(a, b *tensor.Tensor) error {
	if err := checkInPlace(a); err != nil {
		return err
	}
	n := newNode("AddBackward0", a, b)
	if err := addInPlace(a, b); err != nil {
		return err
	}
	if n != nil {
		n.apply = func(n *Node, g []*tensor.Tensor) ([]*tensor.Tensor, error) {
			return []*tensor.Tensor{pick(n, 0, g[0]), pick(n, 1, g[0])}, nil
		}
		rebase(n, a)
	}
	return nil
}

// MulInPlace is a *= b (mul_.Tensor, MulBackward0: saves b, and the
// original a when b needs a gradient — which PyTorch clones first).
func MulInPlace(a, b *tensor.Tensor) error {
	if err := checkInPlace(a); err != nil {
		return err
	}
	n := newNode("MulBackward0", a, b)
	var sa, sb *SavedTensor
	if n != nil {
		if n.needsGrad(1) {
			c, err := clone(a)
			if err != nil {
				return err
			}
			sa = n.save(c)
		}
		if n.needsGrad(0) {
			sb = n.save(b)
		}
	}
	if err := mulInPlace(a, b); err != nil {
		return err
	}
	if n != nil {
		n.apply = func(n *Node, g []*tensor.Tensor) ([]*tensor.Tensor, error) {
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
				if res[1], err = mul(g[0], av); err != nil {
					return nil, err
				}
			}
			return res, nil
		}
		rebase(n, a)
	}
	return nil
}

// MulScalarInPlace is a *= s (mul_.Scalar, MulBackward1).
func MulScalarInPlace(a *tensor.Tensor, s tensor.Scalar) error {
	if err := checkInPlace(a); err != nil {
		return err
	}
	n := newNode("MulBackward1", a)
	if err := mulScalarInPlace(a, s); err != nil {
		return err
	}
	if n != nil {
		n.apply = func(n *Node, g []*tensor.Tensor) ([]*tensor.Tensor, error) {
			r, err := mulScalar(g[0], s)
			return []*tensor.Tensor{r}, err
		}
		rebase(n, a)
	}
	return nil
}
