package autograd

import (
	"runtime"

	"github.com/memsh/memsh/tensor"
)

// Max and Min over all elements (MaxBackward1 / MinBackward1: save self
// and the result; evenly_distribute_backward on CUDA: a bool mask of the
// elements equal to the result — NaN-aware — and the gradient divided by
// their count, spread over the mask: mask * (grad / mask.sum())).
func Max(a *tensor.Tensor) (*tensor.Tensor, error) { return extremeAll("MaxBackward1", a, tensor.Max) }

// Min is Max for the minimum.
func Min(a *tensor.Tensor) (*tensor.Tensor, error) { return extremeAll("MinBackward1", a, tensor.Min) }

func extremeAll(name string, a *tensor.Tensor, fwd func(*tensor.Tensor) (*tensor.Tensor, error)) (*tensor.Tensor, error) {
	n := newNode(name, a)
	var sa *SavedTensor
	if n != nil {
		sa = n.save(a)
	}
	out, err := fwd(a)
	if err != nil || n == nil {
		return out, err
	}
	n.setOutputs(out)
	so := n.saveOutput(out, 0)
	n.apply = func(n *Node, g []*tensor.Tensor) ([]*tensor.Tensor, error) {
		x, err := sa.Unpack()
		if err != nil {
			return nil, err
		}
		v, err := so.Unpack()
		if err != nil {
			return nil, err
		}
		// input.isnan() & value.isnan(), (input == value) | that: the
		// temporaries of the expression stay alive to its end.
		xn, err := tensor.Ne(x, x)
		if err != nil {
			return nil, err
		}
		vn, err := tensor.Ne(v, v)
		if err != nil {
			return nil, err
		}
		both, err := tensor.Mul(xn, vn)
		if err != nil {
			return nil, err
		}
		mask, err := tensor.Eq(x, v)
		if err != nil {
			return nil, err
		}
		if _, err := mask.Add_(both); err != nil {
			return nil, err
		}
		cnt, err := tensor.Sum(mask, nil, false, tensor.Undefined)
		if err != nil {
			return nil, err
		}
		q, err := tensor.Div(g[0], cnt)
		if err != nil {
			return nil, err
		}
		r, err := tensor.Mul(mask, q)
		runtime.KeepAlive(xn)
		runtime.KeepAlive(both)
		return []*tensor.Tensor{r}, err
	}
	return out, nil
}

// MaxDim and MinDim reduce one dim and return values and int64 indices
// (MaxBackward0 / MinBackward0: save the indices; the gradient is scattered
// into zeros of the input's shape — value_selecting_reduction_backward).
func MaxDim(a *tensor.Tensor, dim int, keepdim bool) (values, indices *tensor.Tensor, err error) {
	return extremeDim("MaxBackward0", a, dim, keepdim, tensor.MaxDim)
}

// MinDim is MaxDim for the minimum.
func MinDim(a *tensor.Tensor, dim int, keepdim bool) (values, indices *tensor.Tensor, err error) {
	return extremeDim("MinBackward0", a, dim, keepdim, tensor.MinDim)
}

func extremeDim(name string, a *tensor.Tensor, dim int, keepdim bool, fwd func(*tensor.Tensor, int, bool) (*tensor.Tensor, *tensor.Tensor, error)) (*tensor.Tensor, *tensor.Tensor, error) {
	n := newNode(name, a)
	vals, idx, err := fwd(a, dim, keepdim)
	if err != nil || n == nil {
		return vals, idx, err
	}
	in := a.Shape()
	d := dim
	if d < 0 {
		d += len(in)
	}
	n.setOutputs(vals, nil)
	si := n.saveOutput(idx, 1)
	n.apply = func(n *Node, g []*tensor.Tensor) ([]*tensor.Tensor, error) {
		ix, err := si.Unpack()
		if err != nil {
			return nil, err
		}
		gg := g[0]
		if !keepdim && len(in) > 0 {
			if gg, err = unsqueeze(gg, d); err != nil {
				return nil, err
			}
			if ix, err = unsqueeze(ix, d); err != nil {
				return nil, err
			}
		}
		z, err := zeros(g[0], in, g[0].DType())
		if err != nil {
			return nil, err
		}
		if err := tensor.ScatterAdd_(z, d, ix, gg); err != nil {
			return nil, err
		}
		return []*tensor.Tensor{z}, nil
	}
	return vals, idx, nil
}

// TopK is torch.topk(a, k, dim, largest, sorted) (TopkBackward0: saves
// the indices, self's sizes and dim, as derivatives.yaml does for topk;
// backward value_selecting_reduction_backward with keepdim — zeros of
// self's sizes with the gradient scattered in at the indices, one
// allocation).
func TopK(a *tensor.Tensor, k, dim int, largest, sorted bool) (values, indices *tensor.Tensor, err error) {
	return topkNode(a, dim, func() (*tensor.Tensor, *tensor.Tensor, error) {
		return tensor.TopK(a, k, dim, largest, sorted)
	})
}

// RouteTopK is tensor.RouteTopK (memsh's topk whose indices follow a
// routing plan) with topk's node, TopkBackward0, over the last dim.
func RouteTopK(probs *tensor.Tensor, k int, plan string) (values, indices *tensor.Tensor, err error) {
	return topkNode(probs, -1, func() (*tensor.Tensor, *tensor.Tensor, error) {
		return tensor.RouteTopK(probs, k, plan)
	})
}

func topkNode(a *tensor.Tensor, dim int, fwd func() (*tensor.Tensor, *tensor.Tensor, error)) (*tensor.Tensor, *tensor.Tensor, error) {
	n := newNode("TopkBackward0", a)
	vals, idx, err := fwd()
	if err != nil || n == nil {
		return vals, idx, err
	}
	in := a.Shape()
	d := dim
	if d < 0 {
		d += max(len(in), 1)
	}
	n.setOutputs(vals, nil)
	si := n.saveOutput(idx, 1)
	n.apply = func(n *Node, g []*tensor.Tensor) ([]*tensor.Tensor, error) {
		ix, err := si.Unpack()
		if err != nil {
			return nil, err
		}
		z, err := zeros(g[0], in, g[0].DType())
		if err != nil {
			return nil, err
		}
		if len(in) == 0 {
			// a 0-dim input: k is 0 or 1, the gradient is the value's
			if ix.Numel() == 1 {
				err = copyInto(z, g[0])
			}
			return []*tensor.Tensor{z}, err
		}
		if err := tensor.ScatterAdd_(z, d, ix, g[0]); err != nil {
			return nil, err
		}
		return []*tensor.Tensor{z}, nil
	}
	return vals, idx, nil
}
