package optim

import (
	"fmt"

	"github.com/memsh/memsh/tensor"
	"github.com/memsh/memsh/tensor/autograd"
)

// SGD is torch.optim.SGD: stochastic gradient descent with optional
// momentum, dampening, weight decay and Nesterov momentum.
//
// Memory (PyTorch 2.x): a momentum buffer per parameter, a copy of its
// gradient made at the first step, when Momentum is not 0; with
// WeightDecay, the foreach path makes a parameter-sized temporary list
// (grads + wd·params) for the step, the per-parameter loop one temporary at
// a time; Nesterov adds another such list.
type SGD struct {
	params                          []*tensor.Tensor
	LR, Momentum, Dampening, WDecay float64
	Nesterov, Foreach               bool
	buf                             map[*tensor.Tensor]*tensor.Tensor
	marked
}

// NewSGD checks the hyper-parameters as PyTorch does and returns an SGD.
func NewSGD(params []*tensor.Tensor, lr, momentum, dampening, weightDecay float64, nesterov, foreach bool) (*SGD, error) {
	const name = "SGD"
	if err := checkNonNeg(name, "learning rate", lr); err != nil {
		return nil, err
	}
	if err := checkNonNeg(name, "momentum value", momentum); err != nil {
		return nil, err
	}
	if err := checkNonNeg(name, "weight_decay value", weightDecay); err != nil {
		return nil, err
	}
	if nesterov && (momentum <= 0 || dampening != 0) {
		return nil, fmt.Errorf("%s: Nesterov momentum requires a momentum and zero dampening", name)
	}
	if err := checkParams(name, params); err != nil {
		return nil, err
	}
	return &SGD{params: params, LR: lr, Momentum: momentum, Dampening: dampening, WDecay: weightDecay,
		Nesterov: nesterov, Foreach: foreach, buf: map[*tensor.Tensor]*tensor.Tensor{}}, nil
}

func (o *SGD) Name() string             { return "SGD" }
func (o *SGD) Params() []*tensor.Tensor { return o.params }

// State: "momentum_buffer" (a tensor, or None before the first step).
func (o *SGD) State(p *tensor.Tensor) map[string]any {
	if b := o.buf[p]; b != nil {
		return map[string]any{"momentum_buffer": b}
	}
	return nil
}

// StateTensors implements Optimizer.
func (o *SGD) StateTensors(p *tensor.Tensor, fn func(*tensor.Tensor)) {
	each(fn, o.buf[p])
}

// Step performs one SGD update.
func (o *SGD) Step() error {
	return noGrad(o.params, func() error {
		if o.Foreach {
			return o.stepForeach()
		}
		return o.stepLoop()
	})
}

// stepLoop is _single_tensor_sgd. The previous parameter's temporaries
// are told dropped (tensor.Dropped) as the next begins, where Python
// rebinds grad: a reclaim's walk frees them though the step's Go code is
// still running.
func (o *SGD) stepLoop() error {
	var temps []*tensor.Tensor
	for _, i := range withGrads(o.params) {
		p := o.params[i]
		tensor.Dropped(temps...)
		clear(temps)
		temps = temps[:0]
		dropped(p)
		g := autograd.Grad(p)
		var err error
		if o.WDecay != 0 {
			if g, err = tensor.AddScaled(g, p, o.WDecay); err != nil {
				return err
			}
			temps = append(temps, g)
		}
		if o.Momentum != 0 {
			b := o.buf[p]
			if b == nil {
				if b, err = tensor.Clone(g); err != nil {
					return err
				}
				o.buf[p] = b
				o.grew(p.Context(), b)
			} else {
				if err := tensor.MulScalar_(b, o.Momentum); err != nil {
					return err
				}
				if err := tensor.Add_(b, g, 1-o.Dampening); err != nil {
					return err
				}
			}
			if o.Nesterov {
				if g, err = tensor.AddScaled(g, b, o.Momentum); err != nil {
					return err
				}
				temps = append(temps, g)
			} else {
				g = b
			}
		}
		if err := tensor.Add_(p, g, -o.LR); err != nil {
			return err
		}
	}
	return nil
}

// stepForeach is _multi_tensor_sgd: the same arithmetic a list at a time,
// so temporaries of one list are alive together.
func (o *SGD) stepForeach() error {
	idx := withGrads(o.params)
	for _, grp := range group(sub(o.params, idx)) {
		ps := make([]*tensor.Tensor, len(grp))
		gs := make([]*tensor.Tensor, len(grp))
		for k, j := range grp {
			ps[k] = o.params[idx[j]]
			gs[k] = autograd.Grad(ps[k])
		}
		var err error
		if o.WDecay != 0 {
			if gs, err = foreachAddScaled(gs, ps, o.WDecay); err != nil {
				return err
			}
		}
		if o.Momentum != 0 {
			all := true
			for _, p := range ps {
				if o.buf[p] == nil {
					all = false
					break
				}
			}
			bufs := make([]*tensor.Tensor, len(ps))
			for k, p := range ps {
				b := o.buf[p]
				switch {
				case all:
					if err := tensor.MulScalar_(b, o.Momentum); err != nil {
						return err
					}
				case b == nil:
					if b, err = tensor.Clone(gs[k]); err != nil {
						return err
					}
					o.buf[p] = b
					o.grew(p.Context(), b)
				default:
					if err := tensor.MulScalar_(b, o.Momentum); err != nil {
						return err
					}
					if err := tensor.Add_(b, gs[k], 1-o.Dampening); err != nil {
						return err
					}
				}
				bufs[k] = b
			}
			if all {
				for k, b := range bufs {
					if err := tensor.Add_(b, gs[k], 1-o.Dampening); err != nil {
						return err
					}
				}
			}
			if o.Nesterov {
				if gs, err = foreachAddScaled(gs, bufs, o.Momentum); err != nil {
					return err
				}
			} else {
				gs = bufs
			}
		}
		for k, p := range ps {
			if err := tensor.Add_(p, gs[k], -o.LR); err != nil {
				return err
			}
		}
	}
	return nil
}

func sub(ts []*tensor.Tensor, idx []int) []*tensor.Tensor {
	out := make([]*tensor.Tensor, len(idx))
	for k, i := range idx {
		out[k] = ts[i]
	}
	return out
}

// foreachAddScaled is torch._foreach_add(a, b, alpha=s): a new list.
func foreachAddScaled(a, b []*tensor.Tensor, s float64) ([]*tensor.Tensor, error) {
	out := make([]*tensor.Tensor, len(a))
	for k := range a {
		r, err := tensor.AddScaled(a[k], b[k], s)
		if err != nil {
			return nil, err
		}
		out[k] = r
	}
	return out, nil
}
