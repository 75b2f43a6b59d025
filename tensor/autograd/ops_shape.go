package autograd

import (
	"github.com/memsh/memsh/tensor"
)

// View and layout ops. Views share their input's storage and save nothing;
// their backward reshapes or transposes the gradient (a view when it can).

// viewOp records a view-producing op whose backward maps the gradient back.
func viewOp(name string, a *tensor.Tensor, fwd func() (*tensor.Tensor, error), back func(g *tensor.Tensor) (*tensor.Tensor, error)) (*tensor.Tensor, error) {
	n := newNode(name, a)
	out, err := fwd()
	if err != nil || n == nil {
		return out, err
	}
	n.apply = func(n *Node, g []*tensor.Tensor) ([]*tensor.Tensor, error) {
		r, err := back(g[0])
		return []*tensor.Tensor{r}, err
	}
	n.setOutputs(out)
	return out, nil
}

// View is Tensor.view (ViewBackward0: grad.reshape(self.sizes())).
func View(a *tensor.Tensor, shape []int) (*tensor.Tensor, error) {
	in := a.Shape()
	return viewOp("ViewBackward0", a, func() (*tensor.Tensor, error) { return view(a, shape) },
		func(g *tensor.Tensor) (*tensor.Tensor, error) { return reshape(g, in) })
}

// Reshape is Tensor.reshape: a view when the strides allow one
// (ViewBackward0), else a contiguous copy viewed as shape (CloneBackward0
// and UnsafeViewBackward0), as ATen's reshape.
func Reshape(a *tensor.Tensor, shape []int) (*tensor.Tensor, error) {
	if canView(a, shape) {
		return View(a, shape)
	}
	c, err := Clone(a)
	if err != nil {
		return nil, err
	}
	in := c.Shape()
	return viewOp("UnsafeViewBackward0", c, func() (*tensor.Tensor, error) { return view(c, shape) },
		func(g *tensor.Tensor) (*tensor.Tensor, error) { return reshape(g, in) })
}

// Transpose is Tensor.transpose (TransposeBackward0).
func Transpose(a *tensor.Tensor, d0, d1 int) (*tensor.Tensor, error) {
	return viewOp("TransposeBackward0", a, func() (*tensor.Tensor, error) { return transpose(a, d0, d1) },
		func(g *tensor.Tensor) (*tensor.Tensor, error) { return transpose(g, d0, d1) })
}

// T is Tensor.t() of a matrix (TBackward0).
func T(a *tensor.Tensor) (*tensor.Tensor, error) {
	if a.Dim() < 2 {
		return viewOp("TBackward0", a, func() (*tensor.Tensor, error) { return tensor.Alias(a), nil },
			func(g *tensor.Tensor) (*tensor.Tensor, error) { return g, nil })
	}
	return viewOp("TBackward0", a, func() (*tensor.Tensor, error) { return transpose(a, 0, 1) },
		func(g *tensor.Tensor) (*tensor.Tensor, error) { return transpose(g, 0, 1) })
}

// Permute is Tensor.permute (PermuteBackward0: the inverse permutation).
func Permute(a *tensor.Tensor, dims []int) (*tensor.Tensor, error) {
	inv := make([]int, len(dims))
	for i, d := range dims {
		if d < 0 {
			d += len(dims)
		}
		if d >= 0 && d < len(dims) {
			inv[d] = i
		}
	}
	return viewOp("PermuteBackward0", a, func() (*tensor.Tensor, error) { return permute(a, dims) },
		func(g *tensor.Tensor) (*tensor.Tensor, error) { return permute(g, inv) })
}

// Expand is Tensor.expand (ExpandBackward0: sum_to the input's shape).
func Expand(a *tensor.Tensor, shape []int) (*tensor.Tensor, error) {
	in := a.Shape()
	return viewOp("ExpandBackward0", a, func() (*tensor.Tensor, error) { return expand(a, shape) },
		func(g *tensor.Tensor) (*tensor.Tensor, error) {
			if sameShape(g.Shape(), in) {
				return g, nil
			}
			return sumTo(g, in)
		})
}

// Unsqueeze is Tensor.unsqueeze (UnsqueezeBackward0).
func Unsqueeze(a *tensor.Tensor, dim int) (*tensor.Tensor, error) {
	in := a.Shape()
	return viewOp("UnsqueezeBackward0", a, func() (*tensor.Tensor, error) { return unsqueeze(a, dim) },
		func(g *tensor.Tensor) (*tensor.Tensor, error) { return view(g, in) })
}

// Squeeze is Tensor.squeeze(dim) (SqueezeBackward1).
func Squeeze(a *tensor.Tensor, dim int) (*tensor.Tensor, error) {
	in := a.Shape()
	return viewOp("SqueezeBackward1", a, func() (*tensor.Tensor, error) { return squeeze(a, dim) },
		func(g *tensor.Tensor) (*tensor.Tensor, error) { return reshape(g, in) })
}

// Clone is Tensor.clone (CloneBackward0: the gradient passes through).
func Clone(a *tensor.Tensor) (*tensor.Tensor, error) {
	return viewOp("CloneBackward0", a, func() (*tensor.Tensor, error) { return clone(a) },
		func(g *tensor.Tensor) (*tensor.Tensor, error) { return g, nil })
}

// Contiguous is Tensor.contiguous: a itself when contiguous, else Clone.
func Contiguous(a *tensor.Tensor) (*tensor.Tensor, error) {
	if a.IsContiguous() {
		return a, nil
	}
	return Clone(a)
}

// To converts a to dtype dt on device ("" and 0 keep a's): a itself when
// nothing changes, as Tensor.to; else _to_copy (ToCopyBackward0: the
// gradient converted back). A result of a non-floating dtype is outside
// the graph.
func To(a *tensor.Tensor, device string, dt tensor.DType) (*tensor.Tensor, error) {
	inDT, inDev := a.DType(), a.Device()
	if dt == 0 {
		dt = inDT
	}
	if device != "" {
		d, err := a.Context().Device(device)
		if err != nil {
			return nil, err
		}
		device = d
	} else {
		device = inDev
	}
	if dt == inDT && device == inDev {
		return a, nil
	}
	if !dt.IsFloat() {
		return toDType(a, device, dt)
	}
	return viewOp("ToCopyBackward0", a, func() (*tensor.Tensor, error) { return toDType(a, device, dt) },
		func(g *tensor.Tensor) (*tensor.Tensor, error) { return toDType(g, inDev, inDT) })
}
