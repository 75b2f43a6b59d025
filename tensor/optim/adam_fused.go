package optim

import (
	"fmt"
	"math"

	"github.com/memsh/memsh/tensor"
	"github.com/memsh/memsh/tensor/autograd"
)

// The fused path of torch.optim.Adam and AdamW (fused=True, PyTorch 2.x,
// torch/optim/adam.py _fused_adam): state at a parameter's first step, in
// order, "step" as torch.zeros((), dtype=float32, device=p.device) (a
// device tensor, 512 bytes, where the other paths keep a host scalar),
// "exp_avg" and "exp_avg_sq" (and "max_exp_avg_sq" with amsgrad); then,
// per (device, dtype) group, torch._foreach_add_(state_steps, 1) and one
// torch._fused_adam_ / _fused_adamw_ kernel that updates the parameters
// and moments in place: no temporaries at all, so a step's peak is its
// start (its end after the first step's state). Under a GradScaler the
// kernel takes grad_scale (it unscales each gradient in registers and
// writes it back) and found_inf (it skips the update when set), and
// torch._foreach_sub_(state_steps, [found_inf] * n) undoes the step
// count: in place too (GradScaler.Step makes the two 0-dim tensors it
// passes, grad_scaler.go).

// SetFused makes the optimizer take the fused path (fused=True), checking
// it as PyTorch's constructor does.
func (o *Adam) SetFused(differentiable bool) error {
	name := o.Name()
	if differentiable {
		return fmt.Errorf("%s: `fused` does not support `differentiable`", name)
	}
	for _, p := range o.params {
		if !p.DType().IsFloat() {
			return fmt.Errorf("%s: `fused=True` requires all the params to be floating point Tensors of supported devices: ['mps', 'cuda', 'xpu', 'hpu', 'cpu', 'privateuseone'].", name)
		}
	}
	o.Fused = true
	o.Foreach = false
	return nil
}

// SupportsAMPScaling is _step_supports_amp_scaling: a fused optimizer
// takes the GradScaler's scale and found_inf itself.
func (o *Adam) SupportsAMPScaling() bool { return o.Fused }

// StepScaled is step() with the GradScaler's grad_scale (nil: None) and
// found_inf set on the optimizer (the fused path only).
func (o *Adam) StepScaled(gradScale, foundInf *tensor.Tensor) error {
	return noGrad(o.params, func() error {
		idx := withGrads(o.params)
		if err := o.initState(idx); err != nil {
			return err
		}
		return o.stepFused(idx, gradScale, foundInf)
	})
}

// scalarOr reads a 0-dim tensor's value (def on a meta device or for nil).
func scalarOr(t *tensor.Tensor, def float64) (float64, error) {
	if t == nil {
		return def, nil
	}
	return itemOr(t, def)
}

// stepFused is _fused_adam: per (device, dtype) group, the step counts
// (in place), then the fused kernel's arithmetic, in place.
func (o *Adam) stepFused(idx []int, gradScale, foundInf *tensor.Tensor) error {
	inf, err := scalarOr(foundInf, 0)
	if err != nil {
		return err
	}
	scale, err := scalarOr(gradScale, 1)
	if err != nil {
		return err
	}
	for _, grp := range group(sub(o.params, idx)) {
		for _, j := range grp {
			p := o.params[idx[j]]
			s := o.state[p]
			s.step++
			if _, err := s.stepT.Fill_(tensor.Float(s.step)); err != nil {
				return err
			}
			if err := o.fusedParam(p, s, scale, inf != 0); err != nil {
				return err
			}
			if inf != 0 {
				// torch._foreach_sub_(state_steps, [found_inf] * n)
				s.step -= inf
				if _, err := s.stepT.Fill_(tensor.Float(s.step)); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// fusedParam is one parameter's share of the fused kernel: in-place
// passes over the gradient, the moments and the parameter, no allocation.
func (o *Adam) fusedParam(p *tensor.Tensor, s *adamState, scale float64, skip bool) error {
	if skip {
		return nil // the kernel returns when found_inf is set
	}
	g := autograd.Grad(p)
	if scale != 1 {
		if err := tensor.DivScalar_(g, scale); err != nil {
			return err
		}
	}
	b1, b2, wd := o.Beta1, o.Beta2, o.WDecay
	l2 := wd
	if o.Decoupled {
		if err := tensor.MulScalar_(p, 1-o.LR*wd); err != nil {
			return err
		}
		l2 = 0
	}
	// the gradient the moments see: grad + weight_decay * param (Adam)
	in := []*tensor.Tensor{g, p}
	if err := tensor.MapInPlace("_fused_adam_", s.expAvg, in, func(x []float64) float64 {
		return x[0] + (1-b1)*(x[1]+l2*x[2]-x[0])
	}); err != nil {
		return err
	}
	if err := tensor.MapInPlace("_fused_adam_", s.expAvgSq, in, func(x []float64) float64 {
		gg := x[1] + l2*x[2]
		return b2*x[0] + (1-b2)*gg*gg
	}); err != nil {
		return err
	}
	sq := s.expAvgSq
	if o.AMSGrad {
		if err := tensor.Maximum_(s.maxExpSq, s.expAvgSq); err != nil {
			return err
		}
		sq = s.maxExpSq
	}
	bc1 := 1 - math.Pow(b1, s.step)
	bc2 := math.Sqrt(1 - math.Pow(b2, s.step))
	lr, eps := o.LR, o.Eps
	return tensor.MapInPlace("_fused_adam_", p, []*tensor.Tensor{s.expAvg, sq}, func(x []float64) float64 {
		return x[0] - lr/bc1*x[1]/(math.Sqrt(x[2])/bc2+eps)
	})
}
