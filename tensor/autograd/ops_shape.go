package autograd

import (
	"github.com/memsh/memsh/tensor"
)

// View and layout ops. Views share their input's storage and save nothing;
// their backward reshapes or transposes the gradient (a view when it can).

// viewOp runs a view or layout op (which saves nothing) and, when its
// input needs a gradient, records its node after the fact — the op's
// errors and allocations are the engine's own. A result that is the input
// itself (nothing to do) gets no node.
func viewOp(name string, a *tensor.Tensor, fwd func() (*tensor.Tensor, error), back func(g *tensor.Tensor) (*tensor.Tensor, error), nameAfter ...*string) (*tensor.Tensor, error) {
	out, err := fwd()
	if err != nil || out == a {
		return out, err
	}
	if len(nameAfter) > 0 {
		name = *nameAfter[0]
	}
	n := newNode(name, a)
	if n == nil {
		return out, nil
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
// (ViewBackward0), else a contiguous copy viewed as shape — ATen's
// _unsafe_view of a clone (UnsafeViewBackward0; the clone's node passes
// the gradient through, so it is folded into this one).
func Reshape(a *tensor.Tensor, shape []int) (*tensor.Tensor, error) {
	in := a.Shape()
	st := a.Storage()
	var name string
	return viewOp("", a, func() (*tensor.Tensor, error) {
		out, err := tensor.Reshape(a, shape)
		if err == nil && out != a {
			name = "ViewBackward0"
			if out.Storage() != st {
				name = "UnsafeViewBackward0"
			}
		}
		return out, err
	}, func(g *tensor.Tensor) (*tensor.Tensor, error) { return reshape(g, in) }, &name)
}

// Transpose is Tensor.transpose (TransposeBackward0).
func Transpose(a *tensor.Tensor, d0, d1 int) (*tensor.Tensor, error) {
	return viewOp("TransposeBackward0", a, func() (*tensor.Tensor, error) { return transpose(a, d0, d1) },
		func(g *tensor.Tensor) (*tensor.Tensor, error) { return transpose(g, d0, d1) })
}

// T is Tensor.t() of a tensor of at most 2 dims (TBackward0).
func T(a *tensor.Tensor) (*tensor.Tensor, error) {
	return viewOp("TBackward0", a, func() (*tensor.Tensor, error) { return tensor.T(a) },
		func(g *tensor.Tensor) (*tensor.Tensor, error) { return tensor.T(g) })
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

// Squeeze is Tensor.squeeze(dims) (nil: every size-1 dim;
// SqueezeBackward0/1/2: the gradient reshaped back).
func Squeeze(a *tensor.Tensor, dims []int) (*tensor.Tensor, error) {
	in := a.Shape()
	name := "SqueezeBackward0"
	switch {
	case len(dims) == 1:
		name = "SqueezeBackward1"
	case len(dims) > 1:
		name = "SqueezeBackward2"
	}
	return viewOp(name, a, func() (*tensor.Tensor, error) { return tensor.Squeeze(a, dims) },
		func(g *tensor.Tensor) (*tensor.Tensor, error) { return reshape(g, in) })
}

// Clone is Tensor.clone (CloneBackward0: the gradient passes through).
func Clone(a *tensor.Tensor) (*tensor.Tensor, error) {
	return viewOp("CloneBackward0", a, func() (*tensor.Tensor, error) { return clone(a) },
		passThrough)
}

// Contiguous is Tensor.contiguous: a itself when contiguous, else
// clone(memory_format=torch.contiguous_format) (CloneBackward0).
func Contiguous(a *tensor.Tensor) (*tensor.Tensor, error) {
	if a.IsContiguous() {
		return a, nil
	}
	return viewOp("CloneBackward0", a, func() (*tensor.Tensor, error) { return tensor.Contiguous(a) },
		passThrough)
}

// To converts a to dtype dt on device ("" and 0 keep a's): a itself when
// nothing changes, as Tensor.to; else _to_copy (ToCopyBackward0: the
// gradient converted back). A result of a non-floating dtype is outside
// the graph.
func To(a *tensor.Tensor, device string, dt tensor.DType, copy bool) (*tensor.Tensor, error) {
	inDT, inDev := a.DType(), a.Device()
	if copy {
		if !RequiresGrad(a) || !GradEnabled(a.Context()) {
			return tensor.To(a, device, dt, true)
		}
		if dt == tensor.Undefined {
			dt = inDT
		}
		return viewOp("ToCopyBackward0", a, func() (*tensor.Tensor, error) { return tensor.To(a, device, dt, true) },
			func(g *tensor.Tensor) (*tensor.Tensor, error) { return toDType(g, inDev, inDT) })
	}
	if dt == tensor.Undefined {
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

// Flatten is torch.flatten(a, start, end): a reshape merging dims
// start..end (ViewBackward0, or UnsafeViewBackward0 for a copy; a itself
// when there is nothing to merge).
func Flatten(a *tensor.Tensor, start, end int) (*tensor.Tensor, error) {
	in := a.Shape()
	st := a.Storage()
	var name string
	return viewOp("", a, func() (*tensor.Tensor, error) {
		out, err := tensor.Flatten(a, start, end)
		if err == nil && out != a {
			name = "ViewBackward0"
			if out.Storage() != st {
				name = "UnsafeViewBackward0"
			}
		}
		return out, err
	}, func(g *tensor.Tensor) (*tensor.Tensor, error) { return reshape(g, in) }, &name)
}
