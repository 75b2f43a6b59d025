package tensor

import (
	"fmt"
	"math"
	"slices"
)

// Loss kernels: the log_softmax that cross_entropy decomposes into, the
// nll_loss forward/backward pair, and mse_loss forward/backward. Each
// allocates exactly what ATen's CUDA kernel allocates (see the comments);
// values are computed on the host (hostCompute).

// Reduction is a loss's reduction: "none", "mean" or "sum".
type Reduction int

const (
	ReductionNone Reduction = iota
	ReductionMean
	ReductionSum
)

// ParseReduction reads PyTorch's reduction string.
func ParseReduction(s string) (Reduction, error) {
	switch s {
	case "none":
		return ReductionNone, nil
	case "mean":
		return ReductionMean, nil
	case "sum":
		return ReductionSum, nil
	}
	return 0, fmt.Errorf("%s is not a valid value for reduction", s)
}

// splitDim returns the sizes before, at and after dim.
func splitDim(shape []int, d int) (outer, n, inner int) {
	outer, inner = 1, 1
	for i, s := range shape {
		switch {
		case i < d:
			outer *= s
		case i > d:
			inner *= s
		}
	}
	n = 1
	if d < len(shape) {
		n = shape[d]
	}
	return
}

// CELogSoftmax is _log_softmax(x, dim, half_to_float=False): one
// allocation of x's shape and dtype (cross_entropy's first half; memsh's
// public log_softmax lives with the activations).
func CELogSoftmax(x *Tensor, dim int) (*Tensor, error) {
	const fname = "tensor.log_softmax"
	if err := x.checkLive(fname); err != nil {
		return nil, err
	}
	if !x.dtype.IsFloat() {
		return nil, errorf(fname, "\"log_softmax\" not implemented for '%s'", dtypeTitle(x.dtype))
	}
	d, err := wrapDim(fname, dim, len(x.shape))
	if err != nil {
		return nil, err
	}
	out, err := newTensor(x.ctx, fname, x.mem.Device(), x.dtype, slices.Clone(x.shape))
	if err != nil {
		return nil, err
	}
	err = hostCompute(fname, []*Tensor{out, x}, func(sh []*Tensor) {
		v := getF64(sh[1])
		outer, n, inner := splitDim(x.shape, d)
		for o := range outer {
			for i := range inner {
				m := math.Inf(-1)
				for c := range n {
					m = math.Max(m, v[(o*n+c)*inner+i])
				}
				s := 0.0
				for c := range n {
					s += math.Exp(v[(o*n+c)*inner+i] - m)
				}
				ls := m + math.Log(s)
				for c := range n {
					v[(o*n+c)*inner+i] -= ls
				}
			}
		}
		setF64(sh[0], v)
	})
	return out, err
}

// CELogSoftmaxBackward is _log_softmax_backward_data(grad, output, dim):
// grad − exp(output)·Σ_dim grad, one allocation of grad's shape.
func CELogSoftmaxBackward(g, y *Tensor, dim int) (*Tensor, error) {
	const fname = "tensor._log_softmax_backward_data"
	d, err := wrapDim(fname, dim, len(y.shape))
	if err != nil {
		return nil, err
	}
	out, err := newTensor(g.ctx, fname, g.mem.Device(), g.dtype, slices.Clone(g.shape))
	if err != nil {
		return nil, err
	}
	err = hostCompute(fname, []*Tensor{out, g, y}, func(sh []*Tensor) {
		gv, yv := getF64(sh[1]), getF64(sh[2])
		outer, n, inner := splitDim(y.shape, d)
		for o := range outer {
			for i := range inner {
				s := 0.0
				for c := range n {
					s += gv[(o*n+c)*inner+i]
				}
				for c := range n {
					k := (o*n+c)*inner + i
					gv[k] -= math.Exp(yv[k]) * s
				}
			}
		}
		setF64(sh[0], gv)
	})
	return out, err
}

// checkNll checks nll_loss's arguments as ATen's nll_loss_nd and
// nll_loss forward do.
func checkNll(fname string, x, target *Tensor) error {
	if len(x.shape) < 1 {
		return errorf(fname, "Expected 1 or more dimensions (got %d)", len(x.shape))
	}
	if len(x.shape) != 1 && (len(target.shape) == 0 || x.shape[0] != target.shape[0]) {
		tb := 0
		if len(target.shape) > 0 {
			tb = target.shape[0]
		}
		return errorf(fname, "Expected input batch_size (%d) to match target batch_size (%d).", x.shape[0], tb)
	}
	if target.dtype != Int64 {
		return errorf(fname, "expected scalar type Long but found %s", dtypeTitle(target.dtype))
	}
	if len(x.shape) > 2 {
		return errorf(fname, "input tensor should be 1D or 2D (inputs with spatial dimensions are not supported by memsh yet)")
	}
	if len(target.shape) > 1 {
		return errorf(fname, "0D or 1D target tensor expected, multi-target not supported")
	}
	if len(x.shape) == 1 && len(target.shape) != 0 {
		return errorf(fname, "size mismatch (got input: %s, target: %s)", SizeString(x.shape), SizeString(target.shape))
	}
	return checkSameDevice(fname, x, target)
}

// CheckNllLoss checks nll_loss's arguments (input, class-index target)
// without allocating.
func CheckNllLoss(x, target *Tensor) error { return checkNll("tensor.nll_loss", x, target) }

// NllLoss is nll_loss_forward(self, target, weight=None, reduction,
// ignore_index) on log-probabilities self [N, C] (or [C] with a 0-dim
// target): it returns (output, total_weight), both allocated by the
// structured kernel: output ([N] for "none", else 0-dim), then
// total_weight (0-dim, the count of targets not ignored), both of self's
// dtype.
func NllLoss(x, target *Tensor, red Reduction, ignoreIndex int64) (out, totalWeight *Tensor, err error) {
	const fname = "tensor.nll_loss"
	if err := x.checkLive(fname); err != nil {
		return nil, nil, err
	}
	if err := target.checkLive(fname); err != nil {
		return nil, nil, err
	}
	if err := checkNll(fname, x, target); err != nil {
		return nil, nil, err
	}
	outShape := []int{}
	if red == ReductionNone && len(x.shape) == 2 {
		outShape = []int{x.shape[0]}
	}
	if out, err = newTensor(x.ctx, fname, x.mem.Device(), x.dtype, outShape); err != nil {
		return nil, nil, err
	}
	defer x.ctx.Hold(out)() // reachable while total_weight is allocated
	if totalWeight, err = newTensor(x.ctx, fname, x.mem.Device(), x.dtype, []int{}); err != nil {
		return nil, nil, err
	}
	var bad error
	err = hostCompute(fname, []*Tensor{out, totalWeight, x, target}, func(sh []*Tensor) {
		xv, tv := getF64(sh[2]), getI64(sh[3])
		c := x.shape[len(x.shape)-1]
		losses := make([]float64, len(tv))
		sum, tw := 0.0, 0.0
		for i, t := range tv {
			if t == ignoreIndex {
				continue
			}
			if t < 0 || t >= int64(c) {
				bad = errorf(fname, "Target %d is out of bounds.", t)
				return
			}
			losses[i] = -xv[i*c+int(t)]
			sum += losses[i]
			tw++
		}
		setF64(sh[1], []float64{tw})
		switch red {
		case ReductionNone:
			setF64(sh[0], losses)
		case ReductionSum:
			setF64(sh[0], []float64{sum})
		case ReductionMean:
			setF64(sh[0], []float64{sum / tw})
		}
	})
	if err == nil {
		err = bad
	}
	if err != nil {
		return nil, nil, err
	}
	return out, totalWeight, nil
}

// NllLossBackward is nll_loss_backward(grad, self, target, weight=None,
// reduction, ignore_index, total_weight): one allocation, grad_input of
// self's shape, zero-filled, with −grad (÷ total_weight for "mean") at
// each target.
func NllLossBackward(g, x, target *Tensor, red Reduction, ignoreIndex int64, totalWeight *Tensor) (*Tensor, error) {
	const fname = "tensor.nll_loss_backward"
	out, err := newTensor(x.ctx, fname, x.mem.Device(), x.dtype, slices.Clone(x.shape))
	if err != nil {
		return nil, err
	}
	err = hostCompute(fname, []*Tensor{out, g, target, totalWeight}, func(sh []*Tensor) {
		gv, tv, tw := getF64(sh[1]), getI64(sh[2]), getF64(sh[3])[0]
		c := x.shape[len(x.shape)-1]
		res := make([]float64, x.Numel())
		for i, t := range tv {
			if t == ignoreIndex || t < 0 || t >= int64(c) {
				continue
			}
			switch red {
			case ReductionNone:
				res[i*c+int(t)] = -gv[i]
			case ReductionSum:
				res[i*c+int(t)] = -gv[0]
			case ReductionMean:
				res[i*c+int(t)] = -gv[0] / tw
			}
		}
		setF64(sh[0], res)
	})
	return out, err
}

// MseLoss is mse_loss(input, target, reduction) on operands of one shape
// (the binding broadcasts them first, as F.mse_loss does). The structured
// kernel's output is allocated at the input's shape and, for "mean" and
// "sum", resize_({})d: the 0-dim loss keeps an input-sized storage (also in
// PyTorch 2.x: pytorch/pytorch#185647). For "mean"/"sum" the impl computes
// the elementwise loss into a second input-sized temporary, reduces it into
// the output and frees it.
func MseLoss(a, b *Tensor, red Reduction) (*Tensor, error) {
	const fname = "tensor.mse_loss"
	for _, t := range []*Tensor{a, b} {
		if err := t.checkLive(fname); err != nil {
			return nil, err
		}
	}
	if err := checkSameDevice(fname, a, b); err != nil {
		return nil, err
	}
	if !slices.Equal(a.shape, b.shape) {
		return nil, errorf(fname, "The size of tensor a must match the size of tensor b (got %s and %s)", SizeString(a.shape), SizeString(b.shape))
	}
	dt := promoteTypes(a.dtype, b.dtype)
	if !dt.IsFloat() {
		return nil, errorf(fname, "\"mse_cuda\" not implemented for '%s'", dtypeTitle(dt))
	}
	full, err := newTensor(a.ctx, fname, a.mem.Device(), dt, slices.Clone(a.shape))
	if err != nil {
		return nil, err
	}
	sq := func(x []float64) float64 { d := x[0] - x[1]; return d * d }
	if red == ReductionNone {
		return full, hostCompute(fname, []*Tensor{full, a, b}, func(sh []*Tensor) { mapFloat(sh[0], sh[1:], sq) })
	}
	out := &Tensor{ctx: full.ctx, st: full.st, mem: full.mem, dtype: dt, shape: []int{}, strides: []int{}}
	if a.Numel() == 0 {
		// An empty input's storage holds no element: resize_({}) grows it
		// to one (PyTorch then returns nan for "mean", 0 for "sum").
		full = nil
		if out, err = newTensor(a.ctx, fname, a.mem.Device(), dt, []int{}); err != nil {
			return nil, err
		}
	}
	tmp, err := newTensor(a.ctx, fname, a.mem.Device(), dt, slices.Clone(a.shape))
	if err != nil {
		return nil, err
	}
	err = hostCompute(fname, []*Tensor{out, tmp, a, b}, func(sh []*Tensor) {
		mapFloat(sh[1], sh[2:], sq)
		s := 0.0
		for _, v := range getF64(sh[1]) {
			s += v
		}
		if red == ReductionMean {
			s /= float64(a.Numel())
		}
		setF64(sh[0], []float64{s})
	})
	return out, err
}

// MseLossBackward is mse_loss_backward(grad, input, target, reduction):
// grad_input = zeros_like(input) (one allocation), then norm·(input −
// target)·grad with norm 2/numel for "mean", else 2.
func MseLossBackward(g, a, b *Tensor, red Reduction) (*Tensor, error) {
	const fname = "tensor.mse_loss_backward"
	out, err := newTensor(a.ctx, fname, a.mem.Device(), a.dtype, slices.Clone(a.shape))
	if err != nil {
		return nil, err
	}
	norm := 2.0
	if red == ReductionMean {
		norm = 2 / float64(a.Numel())
	}
	err = hostCompute(fname, []*Tensor{out, a, b, g}, func(sh []*Tensor) {
		mapFloat(sh[0], []*Tensor{sh[1], sh[2], sh[3]}, func(x []float64) float64 { return norm * (x[0] - x[1]) * x[2] })
	})
	return out, err
}
