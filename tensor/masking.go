package tensor

import "slices"

// Masking kernels: masked_fill (out of place and in place), triu/tril,
// where and scalar_tensor. One allocation each for the out-of-place ones
// (masked_fill: the clone of self that masked_fill_ then fills).

func checkBoolMask(fname string, mask *Tensor) error {
	if mask.dtype != Bool {
		return errorf(fname, "%s only supports boolean masks, but got mask with dtype %s", fname[len("tensor."):], mask.dtype)
	}
	return nil
}

// MaskedFill is t.masked_fill(mask, value): a copy of t (broadcast with
// mask) with value where mask is true. One allocation.
func MaskedFill(t, mask *Tensor, value Scalar) (*Tensor, error) {
	const fname = "tensor.masked_fill"
	for _, x := range []*Tensor{t, mask} {
		if err := x.checkLive(fname); err != nil {
			return nil, err
		}
	}
	if err := checkBoolMask(fname, mask); err != nil {
		return nil, err
	}
	if err := checkSameDevice(fname, t, mask); err != nil {
		return nil, err
	}
	shape, err := broadcastShapes(fname, t.shape, mask.shape)
	if err != nil {
		return nil, err
	}
	out, err := newTensor(t.ctx, fname, t.mem.Device(), t.dtype, shape)
	if err != nil {
		return nil, err
	}
	v := value.f
	if !value.IsFloat() {
		v = float64(value.i)
	}
	err = hostCompute(fname, []*Tensor{out, t, mask}, func(sh []*Tensor) {
		mapFloat(sh[0], []*Tensor{sh[1], sh[2]}, func(x []float64) float64 {
			if x[1] != 0 {
				return v
			}
			return x[0]
		})
	})
	return out, err
}

// MaskedFill_ is t.masked_fill_(mask, value), in place (mask broadcast to
// t's shape); no allocation.
func MaskedFill_(t, mask *Tensor, value Scalar) error {
	const fname = "tensor.masked_fill_"
	if err := checkBoolMask(fname, mask); err != nil {
		return err
	}
	v := value.f
	if !value.IsFloat() {
		v = float64(value.i)
	}
	return inPlace(fname, t, []*Tensor{mask}, func(x []float64) float64 {
		if x[1] != 0 {
			return v
		}
		return x[0]
	})
}

// Triangle is t.triu(k) (upper true) or t.tril(k) over the last two
// dimensions: one allocation.
func Triangle(t *Tensor, k int, upper bool) (*Tensor, error) {
	fname := "tensor.tril"
	if upper {
		fname = "tensor.triu"
	}
	if err := t.checkLive(fname); err != nil {
		return nil, err
	}
	if t.Dim() < 2 {
		return nil, errorf(fname, "%s: input tensor must have at least 2 dimensions", fname[len("tensor."):])
	}
	out, err := newTensor(t.ctx, fname, t.mem.Device(), t.dtype, slices.Clone(t.shape))
	if err != nil {
		return nil, err
	}
	err = hostCompute(fname, []*Tensor{out, t}, func(sh []*Tensor) {
		v := getF64(sh[1])
		r, c := t.shape[len(t.shape)-2], t.shape[len(t.shape)-1]
		for i := range v {
			col := i % c
			row := (i / c) % r
			keep := col-row <= k
			if upper {
				keep = col-row >= k
			}
			if !keep {
				v[i] = 0
			}
		}
		setF64(sh[0], v)
	})
	return out, err
}

// Where is torch.where(cond, a, b): a where cond, else b, broadcast
// together, in a and b's promoted dtype. One allocation.
func Where(cond, a, b *Tensor) (*Tensor, error) {
	const fname = "tensor.where"
	for _, x := range []*Tensor{cond, a, b} {
		if err := x.checkLive(fname); err != nil {
			return nil, err
		}
	}
	if cond.dtype != Bool {
		return nil, errorf(fname, "where expected condition to be a boolean tensor, but got a tensor with dtype %s", dtypeTitle(cond.dtype))
	}
	if err := checkSameDevice(fname, a, cond, b); err != nil {
		return nil, err
	}
	shape, err := broadcastShapes(fname, cond.shape, a.shape, b.shape)
	if err != nil {
		return nil, err
	}
	out, err := newTensor(a.ctx, fname, a.mem.Device(), promoteTypes(a.dtype, b.dtype), shape)
	if err != nil {
		return nil, err
	}
	err = hostCompute(fname, []*Tensor{out, cond, a, b}, func(sh []*Tensor) {
		mapFloat(sh[0], sh[1:], func(x []float64) float64 {
			if x[0] != 0 {
				return x[1]
			}
			return x[2]
		})
	})
	return out, err
}

// ScalarTensor is at::scalar_tensor(v, dtype, device): a 0-dim tensor on
// device (one allocation, 512 bytes on a GPU).
func ScalarTensor(c *Context, v Scalar, dt DType, device string) (*Tensor, error) {
	return full(c, "tensor.scalar_tensor", []int{}, v, dt, device)
}
