package autograd

import (
	"github.com/memsh/memsh/tensor"
)

// Sum reduces over dims (all when dims is empty), in dtype dt (0: the
// input's, integers summed as int64): SumBackward0 for a full
// sum, SumBackward1 over dims; nothing saved; the gradient is the incoming
// one expanded back (a view).
func Sum(a *tensor.Tensor, dims []int, keepdim bool, dt tensor.DType) (*tensor.Tensor, error) {
	defer setOptDType(a, &dt)()
	name := "SumBackward1"
	if len(dims) == 0 {
		name = "SumBackward0"
	}
	in := a.Shape()
	n := newNode(name, a)
	out, err := tensor.Sum(a, dims, keepdim, dt)
	if err != nil || n == nil {
		return out, err
	}
	red := reducedDims(dims, len(in))
	n.apply = func(n *Node, g []*tensor.Tensor) ([]*tensor.Tensor, error) {
		r, err := expandBack(g[0], in, red, keepdim)
		return []*tensor.Tensor{r}, err
	}
	n.setOutputs(out)
	return out, nil
}

// Mean averages over dims (all when empty): MeanBackward0 / MeanBackward1;
// the gradient grad.expand(sizes) / count is one allocation.
func Mean(a *tensor.Tensor, dims []int, keepdim bool, dt tensor.DType) (*tensor.Tensor, error) {
	name := "MeanBackward1"
	if len(dims) == 0 {
		name = "MeanBackward0"
	}
	in := a.Shape()
	n := newNode(name, a)
	out, err := tensor.Mean(a, dims, keepdim, dt)
	if err != nil || n == nil {
		return out, err
	}
	red := reducedDims(dims, len(in))
	count := 1
	for d, r := range red {
		if r {
			count *= in[d]
		}
	}
	n.apply = func(n *Node, g []*tensor.Tensor) ([]*tensor.Tensor, error) {
		e, err := expandBack(g[0], in, red, keepdim)
		if err != nil {
			return nil, err
		}
		r, err := divScalar(e, tensor.Int(int64(count)))
		return []*tensor.Tensor{r}, err
	}
	n.setOutputs(out)
	return out, nil
}

// reducedDims marks the reduced dimensions (all for nil dims).
func reducedDims(dims []int, ndim int) []bool {
	red := make([]bool, ndim)
	for d := range red {
		red[d] = len(dims) == 0
	}
	for _, d := range dims {
		if d < 0 {
			d += ndim
		}
		if d >= 0 && d < ndim {
			red[d] = true
		}
	}
	return red
}

// expandBack is sum_backward: unsqueeze the reduced dims (unless keepdim)
// and expand to the input's shape — views only.
func expandBack(g *tensor.Tensor, in []int, red []bool, keepdim bool) (*tensor.Tensor, error) {
	var err error
	if !keepdim {
		for d, r := range red {
			if r {
				if g, err = unsqueeze(g, d); err != nil {
					return nil, err
				}
			}
		}
	}
	return expand(g, in)
}
