package autograd

import (
	"github.com/memsh/memsh/tensor"
)

// unaryOp records a one-input op whose backward is formula(grad, saved).
// saveResult says whether the op saves its result (exp, tanh, sigmoid,
// sqrt, rsqrt, relu) or its input (log, gelu, silu, pow).
func unaryOp(name string, a *tensor.Tensor, saveResult bool, fwd func(*tensor.Tensor) (*tensor.Tensor, error),
	formula func(g, saved *tensor.Tensor) (*tensor.Tensor, error)) (*tensor.Tensor, error) {
	n := newNode(name, a)
	var s *SavedTensor
	if n != nil && !saveResult {
		s = n.save(a)
	}
	out, err := fwd(a)
	if err != nil || n == nil {
		return out, err
	}
	n.setOutputs(out)
	if saveResult {
		s = n.saveOutput(out, 0)
	}
	n.apply = func(n *Node, g []*tensor.Tensor) ([]*tensor.Tensor, error) {
		v, err := s.Unpack()
		if err != nil {
			return nil, err
		}
		r, err := formula(g[0], v)
		return []*tensor.Tensor{r}, err
	}
	return out, nil
}

// Exp: ExpBackward0, saves the result; gradient grad * result.
func Exp(a *tensor.Tensor) (*tensor.Tensor, error) {
	release, err := castArgs(fp32, &a)
	if err != nil {
		return nil, err
	}
	defer release()
	return unaryOp("ExpBackward0", a, true, func(t *tensor.Tensor) (*tensor.Tensor, error) { return unary("exp", t) }, mul)
}

// Log: LogBackward0, saves the input; gradient grad / self.
func Log(a *tensor.Tensor) (*tensor.Tensor, error) {
	release, err := castArgs(fp32, &a)
	if err != nil {
		return nil, err
	}
	defer release()
	return unaryOp("LogBackward0", a, false, func(t *tensor.Tensor) (*tensor.Tensor, error) { return unary("log", t) }, div)
}

// Tanh: TanhBackward0, saves the result; tanh_backward(grad, result) =
// grad * (1 - result²), one allocation.
func Tanh(a *tensor.Tensor) (*tensor.Tensor, error) {
	return unaryOp("TanhBackward0", a, true, func(t *tensor.Tensor) (*tensor.Tensor, error) { return unary("tanh", t) },
		func(g, y *tensor.Tensor) (*tensor.Tensor, error) { return backwardKernel("tanh_backward", g, y) })
}

// Sigmoid: SigmoidBackward0, saves the result; sigmoid_backward(grad,
// result) = grad * result * (1 - result), one allocation.
func Sigmoid(a *tensor.Tensor) (*tensor.Tensor, error) {
	return unaryOp("SigmoidBackward0", a, true, func(t *tensor.Tensor) (*tensor.Tensor, error) { return unary("sigmoid", t) },
		func(g, y *tensor.Tensor) (*tensor.Tensor, error) { return backwardKernel("sigmoid_backward", g, y) })
}

// Relu: ReluBackward0, saves the result; threshold_backward(grad, result,
// 0), one allocation.
func Relu(a *tensor.Tensor) (*tensor.Tensor, error) {
	return unaryOp("ReluBackward0", a, true, func(t *tensor.Tensor) (*tensor.Tensor, error) { return unary("relu", t) },
		func(g, y *tensor.Tensor) (*tensor.Tensor, error) { return backwardKernel("threshold_backward", g, y) })
}

// Relu_ is t.relu_(): in place, ReluBackward0 becomes t's grad_fn and
// saves the result — t itself, at its version after the op — as
// torch.relu_ does (torchvision's nn.ReLU(inplace=True)); nothing is
// allocated in the forward.
func Relu_(a *tensor.Tensor) (*tensor.Tensor, error) {
	if !recording(a) {
		return tensor.Relu_(a)
	}
	if err := checkInPlace(a); err != nil {
		return nil, err
	}
	n := newNode("ReluBackward0", a)
	if _, err := tensor.Relu_(a); err != nil {
		return nil, err
	}
	rebase(n, a)
	s := n.saveOutput(a, 0)
	n.apply = func(n *Node, g []*tensor.Tensor) ([]*tensor.Tensor, error) {
		v, err := s.Unpack()
		if err != nil {
			return nil, err
		}
		r, err := backwardKernel("threshold_backward", g[0], v)
		return []*tensor.Tensor{r}, err
	}
	return a, nil
}

// Sqrt: SqrtBackward0, saves the result; gradient grad / (2 * result): two
// allocations, the temporary freed at once.
func Sqrt(a *tensor.Tensor) (*tensor.Tensor, error) {
	return unaryOp("SqrtBackward0", a, true, func(t *tensor.Tensor) (*tensor.Tensor, error) { return unary("sqrt", t) },
		func(g, y *tensor.Tensor) (*tensor.Tensor, error) {
			t2, err := mulScalar(y, tensor.Float(2))
			if err != nil {
				return nil, err
			}
			return div(g, t2)
		})
}

// Rsqrt: RsqrtBackward0, saves the result; gradient -0.5 * grad *
// result.pow(3), evaluated left to right as in C++.
func Rsqrt(a *tensor.Tensor) (*tensor.Tensor, error) {
	release, err := castArgs(fp32, &a)
	if err != nil {
		return nil, err
	}
	defer release()
	return unaryOp("RsqrtBackward0", a, true, func(t *tensor.Tensor) (*tensor.Tensor, error) { return unary("rsqrt", t) },
		func(g, y *tensor.Tensor) (*tensor.Tensor, error) {
			h, err := mulScalar(g, tensor.Float(-0.5))
			if err != nil {
				return nil, err
			}
			defer hold(h)()
			p, err := powScalar(y, 3)
			if err != nil {
				return nil, err
			}
			defer hold(p)()
			return mul(h, p)
		})
}

// PowScalar is a ** e (pow.Tensor_Scalar, PowBackward0: saves self;
// gradient grad * (e * self.pow(e - 1)), or zeros for e == 0).
func PowScalar(a *tensor.Tensor, e float64) (*tensor.Tensor, error) {
	release, err := castArgs(fp32, &a)
	if err != nil {
		return nil, err
	}
	defer release()
	return unaryOp("PowBackward0", a, false, func(t *tensor.Tensor) (*tensor.Tensor, error) { return powScalar(t, e) },
		func(g, x *tensor.Tensor) (*tensor.Tensor, error) {
			if e == 0 {
				return zerosLike(x)
			}
			// C++ temporaries live to the end of the full expression: all
			// three are alive when the last is allocated.
			p, err := powScalar(x, e-1)
			if err != nil {
				return nil, err
			}
			defer hold(p)()
			q, err := mulScalar(p, tensor.Float(e))
			if err != nil {
				return nil, err
			}
			defer hold(q)()
			return mul(g, q)
		})
}
