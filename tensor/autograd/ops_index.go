package autograd

import (
	"github.com/memsh/memsh/tensor"
)

// Narrow is Tensor.narrow (a view; SliceBackward0: the gradient is copied
// into zeros of the input's shape — one allocation of the input's size).
func Narrow(a *tensor.Tensor, dim, start, length int) (*tensor.Tensor, error) {
	in := a.Shape()
	dt := a.DType()
	return viewOp("SliceBackward0", a, func() (*tensor.Tensor, error) { return narrow(a, dim, start, length) },
		func(g *tensor.Tensor) (*tensor.Tensor, error) {
			z, err := zeros(g, in, dt)
			if err != nil {
				return nil, err
			}
			d := dim
			if d < 0 {
				d += len(in)
			}
			s := start
			if s < 0 {
				s += in[d]
			}
			dst, err := narrow(z, d, s, length)
			if err != nil {
				return nil, err
			}
			return z, copyInto(dst, g)
		})
}

// Select is Tensor.select (a view; SelectBackward0: zeros of the input's
// shape with the gradient copied in).
func Select(a *tensor.Tensor, dim, index int) (*tensor.Tensor, error) {
	in := a.Shape()
	dt := a.DType()
	return viewOp("SelectBackward0", a, func() (*tensor.Tensor, error) { return selectIndex(a, dim, index) },
		func(g *tensor.Tensor) (*tensor.Tensor, error) {
			z, err := zeros(g, in, dt)
			if err != nil {
				return nil, err
			}
			d := dim
			if d < 0 {
				d += len(in)
			}
			i := index
			if i < 0 {
				i += in[d]
			}
			dst, err := selectIndex(z, d, i)
			if err != nil {
				return nil, err
			}
			return z, copyInto(dst, g)
		})
}

// Cat concatenates along dim (CatBackward0: each input's gradient is a
// narrow view of the incoming one).
func Cat(ts []*tensor.Tensor, dim int) (*tensor.Tensor, error) {
	n := newNode("CatBackward0", ts...)
	out, err := cat(ts, dim)
	if err != nil || n == nil {
		return out, err
	}
	d := dim
	if d < 0 {
		d += out.Dim()
	}
	sizes := make([]int, len(ts))
	for i, t := range ts {
		if t.Dim() > d {
			sizes[i] = t.Shape()[d]
		}
	}
	n.apply = func(n *Node, g []*tensor.Tensor) ([]*tensor.Tensor, error) {
		res := make([]*tensor.Tensor, len(sizes))
		off := 0
		for i, s := range sizes {
			if n.needsGrad(i) && s > 0 {
				v, err := narrow(g[0], d, off, s)
				if err != nil {
					return nil, err
				}
				res[i] = v
			}
			off += s
		}
		return res, nil
	}
	n.setOutputs(out)
	return out, nil
}

// Stack stacks along a new dim (StackBackward0: each gradient is a select
// view of the incoming one).
func Stack(ts []*tensor.Tensor, dim int) (*tensor.Tensor, error) {
	n := newNode("StackBackward0", ts...)
	out, err := stack(ts, dim)
	if err != nil || n == nil {
		return out, err
	}
	d := dim
	if d < 0 {
		d += out.Dim()
	}
	k := len(ts)
	n.apply = func(n *Node, g []*tensor.Tensor) ([]*tensor.Tensor, error) {
		res := make([]*tensor.Tensor, k)
		for i := range k {
			if n.needsGrad(i) {
				v, err := selectIndex(g[0], d, i)
				if err != nil {
					return nil, err
				}
				res[i] = v
			}
		}
		return res, nil
	}
	n.setOutputs(out)
	return out, nil
}

// Abs is Tensor.abs (AbsBackward0: saves self; gradient grad * self.sgn()).
func Abs(a *tensor.Tensor) (*tensor.Tensor, error) {
	return unaryOp("AbsBackward0", a, false, func(t *tensor.Tensor) (*tensor.Tensor, error) { return unary("abs", t) },
		func(g, x *tensor.Tensor) (*tensor.Tensor, error) {
			s, err := unary("sign", x)
			if err != nil {
				return nil, err
			}
			return mul(g, s)
		})
}
