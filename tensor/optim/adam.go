package optim

import (
	"fmt"
	"math"

	"github.com/memsh/memsh/tensor"
	"github.com/memsh/memsh/tensor/autograd"
)

// Adam is torch.optim.Adam, and torch.optim.AdamW when Decoupled.
//
// Memory (PyTorch 2.x on CUDA): at the first step, exp_avg and exp_avg_sq
// (and max_exp_avg_sq with AMSGrad) are zeros of each parameter's size,
// made parameter by parameter in order; "step" is a host scalar. The
// foreach path (_multi_tensor_adam) makes one parameter-sized temporary
// list (the square roots of the second moments) during the update, plus,
// for Adam with weight_decay, the list grads + wd·params, freed before the
// square roots are taken. The per-parameter loop (_single_tensor_adam)
// makes, for each parameter, sqrt(exp_avg_sq) and its quotient by the bias
// correction (the previous parameter's denominator still alive until it is
// replaced, as Python rebinds `denom`). The fused path (fused=True,
// adam_fused.go) keeps "step" as a 0-dim float32 on the parameter's device
// and makes no temporaries.
type Adam struct {
	params                        []*tensor.Tensor
	LR, Beta1, Beta2, Eps, WDecay float64
	AMSGrad, Decoupled, Foreach   bool
	// Fused is fused=True: _fused_adam(w) (adam_fused.go); set by SetFused
	Fused bool
	state map[*tensor.Tensor]*adamState
	// byIndex[i] is params[i]'s state (nil while it has none): the reach
	// walk's order, without a map iteration per walk
	byIndex []*adamState
	marked
}

type adamState struct {
	step                       float64
	expAvg, expAvgSq, maxExpSq *tensor.Tensor
	stepT                      *tensor.Tensor // fused: state["step"], a 0-dim float32 on the device
}

// NewAdam checks the hyper-parameters as PyTorch does and returns an Adam
// (decoupled: AdamW).
func NewAdam(params []*tensor.Tensor, lr, beta1, beta2, eps, weightDecay float64, amsgrad, decoupled, foreach bool) (*Adam, error) {
	name := "Adam"
	if decoupled {
		name = "AdamW"
	}
	if err := checkNonNeg(name, "learning rate", lr); err != nil {
		return nil, err
	}
	if err := checkNonNeg(name, "epsilon value", eps); err != nil {
		return nil, err
	}
	if beta1 < 0 || beta1 >= 1 {
		return nil, fmt.Errorf("%s: Invalid beta parameter at index 0: %v", name, beta1)
	}
	if beta2 < 0 || beta2 >= 1 {
		return nil, fmt.Errorf("%s: Invalid beta parameter at index 1: %v", name, beta2)
	}
	if err := checkNonNeg(name, "weight_decay value", weightDecay); err != nil {
		return nil, err
	}
	if err := checkParams(name, params); err != nil {
		return nil, err
	}
	return &Adam{params: params, LR: lr, Beta1: beta1, Beta2: beta2, Eps: eps, WDecay: weightDecay,
		AMSGrad: amsgrad, Decoupled: decoupled, Foreach: foreach, state: map[*tensor.Tensor]*adamState{}}, nil
}

func (o *Adam) Name() string {
	if o.Decoupled {
		return "AdamW"
	}
	return "Adam"
}

func (o *Adam) Params() []*tensor.Tensor { return o.params }

// State: "step" (float, host), "exp_avg", "exp_avg_sq" and with AMSGrad
// "max_exp_avg_sq".
func (o *Adam) State(p *tensor.Tensor) map[string]any {
	s := o.state[p]
	if s == nil {
		return nil
	}
	m := map[string]any{"step": s.step, "exp_avg": s.expAvg, "exp_avg_sq": s.expAvgSq}
	if s.stepT != nil {
		m["step"] = s.stepT
	}
	if s.maxExpSq != nil {
		m["max_exp_avg_sq"] = s.maxExpSq
	}
	return m
}

// StateTensors implements Optimizer.
func (o *Adam) StateTensors(p *tensor.Tensor, fn func(*tensor.Tensor)) {
	if s := o.state[p]; s != nil {
		each(fn, s.expAvg, s.expAvgSq, s.maxExpSq, s.stepT)
	}
}

// setIndex records s as the state of params[i] for the reach walk.
func (o *Adam) setIndex(i int, s *adamState) {
	if o.byIndex == nil {
		o.byIndex = make([]*adamState, len(o.params))
	}
	o.byIndex[i] = s
}

// initState is Adam._init_group: state for every parameter with a
// gradient that has none yet, in parameter order.
func (o *Adam) initState(idx []int) error {
	for _, i := range idx {
		p := o.params[i]
		if o.state[p] != nil {
			continue
		}
		// in the state map from the start, where the reclaim's walk (Reach)
		// sees the moments already made while the next one is allocated;
		// taken out again if one of them cannot be made
		s := &adamState{}
		o.state[p] = s
		o.setIndex(i, s)
		// each tensor noted as soon as it is made: the walk of the next
		// one's allocation keeps the frame that holds the optimizer
		var err error
		made := func(t **tensor.Tensor, f func() (*tensor.Tensor, error)) {
			if err == nil {
				if *t, err = f(); err == nil {
					o.grew(p.Context(), *t)
				}
			}
		}
		zeros := func() (*tensor.Tensor, error) { return tensor.ZerosLike(p, p.DType(), p.Device()) }
		if o.Fused {
			// torch.zeros((), dtype=_get_scalar_dtype(is_fused=True), device=p.device)
			made(&s.stepT, func() (*tensor.Tensor, error) { return tensor.Zeros(p.Context(), nil, tensor.Float32, p.Device()) })
		}
		made(&s.expAvg, zeros)
		made(&s.expAvgSq, zeros)
		if o.AMSGrad {
			made(&s.maxExpSq, zeros)
		}
		if err != nil {
			delete(o.state, p)
			o.setIndex(i, nil)
			o.changed(p.Context())
			return err
		}
	}
	return nil
}

// Step performs one Adam/AdamW update.
func (o *Adam) Step() error {
	return noGrad(o.params, func() error {
		idx := withGrads(o.params)
		if err := o.initState(idx); err != nil {
			return err
		}
		if o.Fused {
			return o.stepFused(idx, nil, nil)
		}
		if o.Foreach {
			return o.stepForeach(idx)
		}
		return o.stepLoop(idx)
	})
}

// stepLoop is _single_tensor_adam.
//
// What its Go code holds across an allocation (the previous parameter's
// denominator, a weight-decayed gradient, the root) is held in the
// Context (tensor.Context.Hold) and told dropped (tensor.Dropped) where
// Python lets go of it, so that a reclaim's walk sees what is alive and
// frees what is not though the step's Go code is still running.
func (o *Adam) stepLoop(idx []int) error {
	var denom, decayed *tensor.Tensor // alive until the next parameter's are made
	for _, i := range idx {
		tensor.Dropped(decayed) // the previous parameter's grad: rebound
		decayed = nil
		if err := o.stepOne(o.params[i], &denom, &decayed); err != nil {
			return err
		}
	}
	return nil
}

// stepOne is the loop's body for parameter p: denom is the previous
// parameter's denominator, replaced by p's; decayed is set to p's
// weight-decayed gradient, if one is made.
func (o *Adam) stepOne(p *tensor.Tensor, denom, decayed **tensor.Tensor) error {
	dropped(p) // the previous parameter's temporaries
	defer p.Context().Hold(*denom)()
	g := autograd.Grad(p)
	s := o.state[p]
	s.step++
	var err error
	if o.WDecay != 0 {
		if o.Decoupled {
			if err := tensor.MulScalar_(p, 1-o.LR*o.WDecay); err != nil {
				return err
			}
		} else if g, err = tensor.AddScaled(g, p, o.WDecay); err != nil {
			return err
		} else {
			*decayed = g
			p.Context().Hold(g) // released with the denominator's hold
		}
	}
	if err := tensor.Lerp_(s.expAvg, g, 1-o.Beta1); err != nil {
		return err
	}
	if err := tensor.MulScalar_(s.expAvgSq, o.Beta2); err != nil {
		return err
	}
	if err := tensor.Addcmul_(s.expAvgSq, g, g, 1-o.Beta2); err != nil {
		return err
	}
	bc1 := 1 - math.Pow(o.Beta1, s.step)
	bc2 := 1 - math.Pow(o.Beta2, s.step)
	stepSize := o.LR / bc1
	sq := s.expAvgSq
	if o.AMSGrad {
		if err := tensor.Maximum_(s.maxExpSq, s.expAvgSq); err != nil {
			return err
		}
		sq = s.maxExpSq
	}
	// Python rebinds denom only after the new one is computed: the
	// previous parameter's denominator is alive meanwhile.
	r, err := tensor.Sqrt(sq)
	if err != nil {
		return err
	}
	p.Context().Hold(r)
	d, err := tensor.DivScalar(r, math.Sqrt(bc2))
	if err != nil {
		return err
	}
	tensor.Dropped(*denom, r)
	dropped(p) // the previous denominator and r
	*denom = d
	if err := tensor.AddScalar_(d, o.Eps); err != nil {
		return err
	}
	return tensor.Addcdiv_(p, s.expAvg, d, -stepSize)
}

// stepForeach is _multi_tensor_adam.
func (o *Adam) stepForeach(idx []int) error {
	for _, grp := range group(sub(o.params, idx)) {
		ps := make([]*tensor.Tensor, len(grp))
		gs := make([]*tensor.Tensor, len(grp))
		ss := make([]*adamState, len(grp))
		for k, j := range grp {
			ps[k] = o.params[idx[j]]
			gs[k] = autograd.Grad(ps[k])
			ss[k] = o.state[ps[k]]
			ss[k].step++
		}
		var err error
		if o.WDecay != 0 {
			if o.Decoupled {
				for _, p := range ps {
					if err := tensor.MulScalar_(p, 1-o.LR*o.WDecay); err != nil {
						return err
					}
				}
			} else if gs, err = foreachAddScaled(gs, ps, o.WDecay); err != nil {
				return err
			}
		}
		for k, s := range ss {
			if err := tensor.Lerp_(s.expAvg, gs[k], 1-o.Beta1); err != nil {
				return err
			}
		}
		for _, s := range ss {
			if err := tensor.MulScalar_(s.expAvgSq, o.Beta2); err != nil {
				return err
			}
		}
		for k, s := range ss {
			if err := tensor.Addcmul_(s.expAvgSq, gs[k], gs[k], 1-o.Beta2); err != nil {
				return err
			}
		}
		gs = nil // `del device_grads`
		dropped(ps[0])
		if err := o.rootsStep(ps, ss); err != nil {
			return err
		}
	}
	return nil
}

// rootsStep is the end of the foreach step: the list of the second
// moments' roots, bias-corrected, then each parameter's addcdiv_. The
// list is held while it is filled and used (the reclaim's reach walk
// sees it), and dropped when the step returns.
func (o *Adam) rootsStep(ps []*tensor.Tensor, ss []*adamState) (err error) {
	roots := make([]*tensor.Tensor, len(ss))
	defer ps[0].Context().Hold()()
	// exp_avg_sq_sqrt is _multi_tensor_adam's local: freed as it returns
	defer func() { tensor.Dropped(roots...) }()
	for k, s := range ss {
		sq := s.expAvgSq
		if o.AMSGrad {
			if err := tensor.Maximum_(s.maxExpSq, s.expAvgSq); err != nil {
				return err
			}
			sq = s.maxExpSq
		}
		if roots[k], err = tensor.Sqrt(sq); err != nil {
			return err
		}
		ps[0].Context().Hold(roots[k]) // released by the deferred release
	}
	for k, s := range ss {
		bc1 := 1 - math.Pow(o.Beta1, s.step)
		bc2 := 1 - math.Pow(o.Beta2, s.step)
		if err := tensor.DivScalar_(roots[k], math.Sqrt(bc2)); err != nil {
			return err
		}
		if err := tensor.AddScalar_(roots[k], o.Eps); err != nil {
			return err
		}
		if err := tensor.Addcdiv_(ps[k], s.expAvg, roots[k], -(o.LR / bc1)); err != nil {
			return err
		}
	}
	return nil
}
