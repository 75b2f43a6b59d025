package autograd

import (
	"fmt"

	"github.com/memsh/memsh/tensor"
)

// The entry points with the engine's signatures (package tensor), so a
// binding calls autograd where it called the engine: when nothing needs a
// gradient they run the engine op alone, with its allocations and errors;
// otherwise they also record the op's backward node.

// Binary is x op y for tensors and numbers (tensor.Binary): + - * / record
// Add/Sub/Mul/DivBackward0 between tensors and the ...Backward1 forms with
// a number; // and % are not differentiable (their results are outside
// the graph).
func Binary(op tensor.BinaryOp, x, y tensor.Operand) (*tensor.Tensor, error) {
	xt, xIsT := x.(*tensor.Tensor)
	yt, yIsT := y.(*tensor.Tensor)
	if !recording(asTensor(x), asTensor(y)) || op == tensor.OpFloorDivide || op == tensor.OpRemainder {
		return tensor.Binary(op, x, y)
	}
	switch {
	case xIsT && yIsT:
		switch op {
		case tensor.OpAdd:
			return Add(xt, yt)
		case tensor.OpSub:
			return Sub(xt, yt)
		case tensor.OpMul:
			return Mul(xt, yt)
		case tensor.OpDiv:
			return Div(xt, yt)
		}
	case xIsT:
		s := y.(tensor.Scalar)
		switch op {
		case tensor.OpAdd:
			return AddScalar(xt, s)
		case tensor.OpSub:
			return SubScalar(xt, s)
		case tensor.OpMul:
			return MulScalar(xt, s)
		case tensor.OpDiv:
			return DivScalar(xt, s)
		}
	case yIsT:
		s := x.(tensor.Scalar)
		switch op {
		case tensor.OpAdd:
			return AddScalar(yt, s)
		case tensor.OpSub:
			return RSubScalar(yt, s)
		case tensor.OpMul:
			return MulScalar(yt, s)
		case tensor.OpDiv:
			return RDivScalar(yt, s)
		}
	}
	return tensor.Binary(op, x, y)
}

func asTensor(o tensor.Operand) *tensor.Tensor {
	t, _ := o.(*tensor.Tensor)
	return t
}

// RDivScalar is s / a (ReciprocalBackward0 then MulBackward1 in PyTorch's
// __rtruediv__; here one node saving a: gradient -grad·s/a²).
func RDivScalar(a *tensor.Tensor, s tensor.Scalar) (*tensor.Tensor, error) {
	n := newNode("DivBackward0", a)
	var sa *SavedTensor
	if n != nil {
		sa = n.save(a)
	}
	out, err := tensor.Div(s, a)
	if err != nil || n == nil {
		return out, err
	}
	n.apply = func(n *Node, g []*tensor.Tensor) ([]*tensor.Tensor, error) {
		av, err := sa.Unpack()
		if err != nil {
			return nil, err
		}
		sq, err := mul(av, av)
		if err != nil {
			return nil, err
		}
		q, err := div(g[0], sq)
		if err != nil {
			return nil, err
		}
		r, err := mulScalar(q, tensor.Float(-s.Float64()))
		return []*tensor.Tensor{r}, err
	}
	n.setOutputs(out)
	return out, nil
}

// BinaryInPlace is self op= other (tensor.BinaryInPlace) with autograd's
// in-place rules: a leaf that requires grad cannot be modified while grad
// mode is on; otherwise self's history is rebased on the op's node.
func BinaryInPlace(op tensor.BinaryOp, self *tensor.Tensor, other tensor.Operand) (*tensor.Tensor, error) {
	ot := asTensor(other)
	if !GradEnabled(self.Context()) || (!RequiresGrad(self) && (ot == nil || !RequiresGrad(ot))) {
		return tensor.BinaryInPlace(op, self, other)
	}
	if err := checkInPlace(self); err != nil {
		return nil, err
	}
	var n *Node
	var sSelf, sOther *SavedTensor
	s, isScalar := other.(tensor.Scalar)
	switch op {
	case tensor.OpAdd, tensor.OpSub:
		name := "AddBackward0"
		if op == tensor.OpSub {
			name = "SubBackward0"
		}
		if isScalar {
			name = name[:len(name)-1] + "1"
			n = newNode(name, self)
		} else {
			n = newNode(name, self, ot)
		}
	case tensor.OpMul, tensor.OpDiv:
		name := "MulBackward0"
		if op == tensor.OpDiv {
			name = "DivBackward0"
		}
		if isScalar {
			name = name[:len(name)-1] + "1"
			n = newNode(name, self)
			break
		}
		n = newNode(name, self, ot)
		if n != nil {
			if op == tensor.OpDiv || n.needsGrad(0) {
				sOther = n.save(ot)
			}
			if n.needsGrad(1) {
				c, err := clone(self) // original_self
				if err != nil {
					return nil, err
				}
				sSelf = n.save(c)
			}
		}
	default:
		return nil, fmt.Errorf("%s: not differentiable in place", op)
	}
	if _, err := tensor.BinaryInPlace(op, self, other); err != nil {
		return nil, err
	}
	if n == nil {
		return self, nil
	}
	switch {
	case op == tensor.OpMul && !isScalar:
		n.apply = mulBackward(sSelf, sOther)
		rebase(n, self)
		return self, nil
	case op == tensor.OpDiv && !isScalar:
		n.apply = divBackward(sSelf, sOther)
		rebase(n, self)
		return self, nil
	}
	n.apply = func(n *Node, g []*tensor.Tensor) ([]*tensor.Tensor, error) {
		res := make([]*tensor.Tensor, len(n.next))
		gg := g[0]
		switch op {
		case tensor.OpAdd:
			res[0] = pick(n, 0, gg)
			if !isScalar {
				res[1] = pick(n, 1, gg)
			}
		case tensor.OpSub:
			res[0] = pick(n, 0, gg)
			if !isScalar && n.needsGrad(1) {
				r, err := neg(gg)
				if err != nil {
					return nil, err
				}
				res[1] = r
			}
		case tensor.OpMul:
			r, err := mulScalar(gg, s)
			return []*tensor.Tensor{r}, err
		case tensor.OpDiv:
			r, err := divScalar(gg, s)
			return []*tensor.Tensor{r}, err
		}
		return res, nil
	}
	rebase(n, self)
	return self, nil
}

// Unary is op(t) (tensor.Unary) with its backward node.
func Unary(op tensor.UnaryOp, t *tensor.Tensor) (*tensor.Tensor, error) {
	if !recording(t) && !((op == tensor.OpExp || op == tensor.OpLog) && autocastState(t) != nil) { // exp, log: autocast fp32
		return tensor.Unary(op, t)
	}
	switch op {
	case tensor.OpNeg:
		return Neg(t)
	case tensor.OpAbs:
		return Abs(t)
	case tensor.OpRelu:
		return Relu(t)
	case tensor.OpExp:
		return Exp(t)
	case tensor.OpLog:
		return Log(t)
	case tensor.OpSqrt:
		return Sqrt(t)
	case tensor.OpTanh:
		return Tanh(t)
	case tensor.OpSigmoid:
		return Sigmoid(t)
	}
	return tensor.Unary(op, t)
}
