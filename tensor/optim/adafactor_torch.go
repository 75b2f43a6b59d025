package optim

import (
	"fmt"
	"math"
	"slices"

	"github.com/memsh/memsh/tensor"
	"github.com/memsh/memsh/tensor/autograd"
)

// Adafactor is torch.optim.Adafactor (PyTorch 2.5+); adafactor.go's
// comment lists its memory.
type Adafactor struct {
	params                        []*tensor.Tensor
	LR, Beta2Decay, Eps1, Eps2, D float64 // Eps1 NaN: eps=(None, ...)
	WDecay                        float64
	Foreach, Maximize             bool
	state                         map[*tensor.Tensor]*adafactorState
	byIndex                       []*adafactorState
	marked
}

type adafactorState struct {
	step                     float64
	rowVar, colVar, variance *tensor.Tensor
}

// NewAdafactor checks the options as torch.optim.Adafactor does. eps1 NaN
// is None (the parameter dtype's machine epsilon). foreach false is the
// per-parameter loop, PyTorch's default for Adafactor (foreach=None).
func NewAdafactor(params []*tensor.Tensor, lr, beta2Decay, eps1, eps2, d, weightDecay float64, foreach, maximize bool) (*Adafactor, error) {
	const name = "Adafactor"
	switch {
	case !(lr >= 0):
		return nil, fmt.Errorf("%s: Learning rate should be >= 0 but is: %v", name, lr)
	case !(beta2Decay <= 0):
		return nil, fmt.Errorf("%s: beta2_decay should be <= 0 but is: %v", name, beta2Decay)
	case !math.IsNaN(eps1) && !(eps1 >= 0):
		return nil, fmt.Errorf("%s: epsilon1 should be >= 0 but is: %v", name, eps1)
	case !(eps2 >= 0):
		return nil, fmt.Errorf("%s: epsilon2 should be >= 0 but is: %v", name, eps2)
	case !(d >= 1):
		return nil, fmt.Errorf("%s: Clipping threshold d should be >= 1 but is: %v", name, d)
	case !(weightDecay >= 0):
		return nil, fmt.Errorf("%s: weight_decay should be >= 0 but is: %v", name, weightDecay)
	}
	if err := checkParams(name, params); err != nil {
		return nil, err
	}
	return &Adafactor{params: params, LR: lr, Beta2Decay: beta2Decay, Eps1: eps1, Eps2: eps2, D: d, WDecay: weightDecay,
		Foreach: foreach, Maximize: maximize, state: map[*tensor.Tensor]*adafactorState{}}, nil
}

func (o *Adafactor) Name() string             { return "Adafactor" }
func (o *Adafactor) Params() []*tensor.Tensor { return o.params }

// State: "step" (host), "row_var" and "col_var", or "variance".
func (o *Adafactor) State(p *tensor.Tensor) map[string]any {
	s := o.state[p]
	if s == nil {
		return nil
	}
	m := map[string]any{"step": s.step}
	for k, t := range map[string]*tensor.Tensor{"row_var": s.rowVar, "col_var": s.colVar, "variance": s.variance} {
		if t != nil {
			m[k] = t
		}
	}
	return m
}

// StateTensors implements Optimizer.
func (o *Adafactor) StateTensors(p *tensor.Tensor, fn func(*tensor.Tensor)) {
	if s := o.state[p]; s != nil {
		each(fn, s.rowVar, s.colVar, s.variance)
	}
}

// Reach passes the parameters and the state tensors to r.
func (o *Adafactor) Reach(r *tensor.Reacher) {
	if !o.visit(r) {
		return
	}
	for _, p := range o.params {
		r.Tensor(p)
	}
	for _, s := range o.byIndex {
		if s == nil {
			continue
		}
		for _, t := range []*tensor.Tensor{s.rowVar, s.colVar, s.variance} {
			r.Tensor(t) // nil-safe
		}
	}
}

// AdafactorStateBytes is the device state torch.optim.Adafactor gives a
// parameter of shape (float32 or the parameter's dtype of size elem), each
// tensor rounded by round: row_var and col_var for 2 or more dimensions,
// else variance ("step" is a host tensor).
func AdafactorStateBytes(shape []int, elem uint64, round func(uint64) uint64) uint64 {
	numel := uint64(1)
	for _, s := range shape {
		numel *= uint64(s)
	}
	if len(shape) < 2 {
		return round(elem * numel)
	}
	return round(elem*numel/uint64(shape[len(shape)-1])) + round(elem*numel/uint64(shape[len(shape)-2]))
}

// initGroup is Adafactor._init_group: state for every parameter with a
// gradient that has none yet, in parameter order.
func (o *Adafactor) initGroup(idx []int) error {
	for _, i := range idx {
		p := o.params[i]
		if o.state[p] != nil {
			continue
		}
		g := autograd.Grad(p)
		s := &adafactorState{}
		o.state[p] = s
		if o.byIndex == nil {
			o.byIndex = make([]*adafactorState, len(o.params))
		}
		o.byIndex[i] = s
		var err error
		shape := g.Shape()
		if len(shape) > 1 {
			row := slices.Clone(shape)
			row[len(row)-1] = 1
			if s.rowVar, err = tensor.Zeros(p.Context(), row, g.DType(), g.Device()); err != nil {
				return err
			}
			o.grew(p.Context(), s.rowVar)
			col := slices.Clone(shape)
			col[len(col)-2] = 1
			if s.colVar, err = tensor.Zeros(p.Context(), col, g.DType(), g.Device()); err != nil {
				return err
			}
			o.grew(p.Context(), s.colVar)
		} else if s.variance, err = tensor.ZerosLike(g, tensor.Undefined, ""); err != nil {
			return err
		} else {
			o.grew(p.Context(), s.variance)
		}
	}
	return nil
}

// Step performs one update of every parameter with a gradient.
func (o *Adafactor) Step() error {
	return noGrad(o.params, func() error {
		idx := withGrads(o.params)
		if err := o.initGroup(idx); err != nil {
			return err
		}
		if len(idx) == 0 {
			return nil
		}
		f := newFrame(o.params[0].Context())
		defer f.close()
		if o.Foreach {
			return o.stepForeach(f, idx)
		}
		return o.stepLoop(f, idx)
	})
}

// eps1 is eps[0], or the dtype's machine epsilon for None.
func (o *Adafactor) eps1(dt tensor.DType) float64 {
	if !math.IsNaN(o.Eps1) {
		return o.Eps1
	}
	switch dt {
	case tensor.Float16:
		return 0.0009765625
	case tensor.BFloat16:
		return 0.0078125
	case tensor.Float64:
		return 2.220446049250313e-16
	}
	return 1.1920928955078125e-07
}

// normValue is t.norm(2).item(): the 0-dim norm (freed at once) and its
// value (NaN on a meta device).
func normValue(f *frame, t *tensor.Tensor) (float64, error) {
	n, err := tensor.VectorNorm(t, 2, nil, false)
	if err != nil {
		return 0, err
	}
	f.set("(norm)", n, true)
	v := math.NaN()
	if n.NeedData("item") == nil {
		x, err := n.Item()
		if err != nil {
			return 0, err
		}
		v = x.Float64()
	}
	f.del("(norm)")
	return v, nil
}

// rowColMean is torch.linalg.vector_norm(grad, dim=dim,
// keepdim=True).square_().div_(grad.size(dim)).
func rowColMean(grad *tensor.Tensor, dim int) (*tensor.Tensor, error) {
	m, err := tensor.VectorNorm(grad, 2, []int{dim}, true)
	if err != nil {
		return nil, err
	}
	if err := tensor.Square_(m); err != nil {
		return nil, err
	}
	shape := grad.Shape()
	return m, tensor.DivScalar_(m, float64(shape[len(shape)+dim]))
}

// stepLoop is _single_tensor_adafactor.
func (o *Adafactor) stepLoop(f *frame, idx []int) error {
	for _, i := range idx {
		p := o.params[i]
		g := autograd.Grad(p)
		if o.Maximize {
			ng, err := tensor.Neg(g)
			if err != nil {
				return err
			}
			f.set("grad", ng, true)
		} else {
			f.set("grad", g, false)
		}
		grad := f.get("grad")
		s := o.state[p]
		eps1 := o.eps1(p.DType())
		s.step++
		oneMinusBeta2 := math.Pow(s.step, o.Beta2Decay)
		rho := math.Min(o.LR, 1/math.Sqrt(s.step))
		pn, err := normValue(f, p)
		if err != nil {
			return err
		}
		alpha := math.Max(o.Eps2, pn/math.Sqrt(float64(p.Numel()))) * rho
		if o.WDecay != 0 {
			if err := tensor.MulScalar_(p, 1-o.LR*o.WDecay); err != nil {
				return err
			}
		}
		if len(grad.Shape()) > 1 {
			rm, err := rowColMean(grad, -1)
			if err != nil {
				return err
			}
			f.set("row_mean", rm, true)
			if err := tensor.Lerp_(s.rowVar, rm, oneMinusBeta2); err != nil {
				return err
			}
			cm, err := rowColMean(grad, -2)
			if err != nil {
				return err
			}
			f.set("col_mean", cm, true)
			if err := tensor.Lerp_(s.colVar, cm, oneMinusBeta2); err != nil {
				return err
			}
			ve, err := tensor.Matmul(s.rowVar, s.colVar)
			if err != nil {
				return err
			}
			f.set("var_estimate", ve, true)
			m, err := tensor.Mean(s.rowVar, []int{-2}, true, tensor.Undefined)
			if err != nil {
				return err
			}
			f.set("(row_var mean)", m, true)
			if err := tensor.Clamp_(m, &eps1, nil); err != nil {
				return err
			}
			if _, err := tensor.BinaryInPlace(tensor.OpDiv, ve, m); err != nil {
				return err
			}
			f.del("(row_var mean)")
		} else {
			gs, err := tensor.Mul(grad, grad)
			if err != nil {
				return err
			}
			f.set("grad_squared", gs, true)
			if err := tensor.Lerp_(s.variance, gs, oneMinusBeta2); err != nil {
				return err
			}
			ve, err := tensor.Clone(s.variance)
			if err != nil {
				return err
			}
			f.set("var_estimate", ve, true)
		}
		// update = var_estimate.clamp_(min=eps1 * eps1).rsqrt_()
		ve := f.get("var_estimate")
		e2 := eps1 * eps1
		if err := tensor.Clamp_(ve, &e2, nil); err != nil {
			return err
		}
		if err := tensor.Rsqrt_(ve); err != nil {
			return err
		}
		f.set("update", ve, true)
		if _, err := tensor.BinaryInPlace(tensor.OpMul, ve, grad); err != nil {
			return err
		}
		un, err := normValue(f, ve)
		if err != nil {
			return err
		}
		denom := math.Max(1, un/(math.Sqrt(float64(ve.Numel()))*o.D))
		if err := tensor.Add_(p, ve, -alpha/denom); err != nil {
			return err
		}
	}
	return nil
}

// stepForeach is _multi_tensor_adafactor: per (device, dtype, matrix or
// vector) group, in the order the gradients first show each.
func (o *Adafactor) stepForeach(f *frame, idx []int) error {
	type key struct {
		dev    string
		dt     tensor.DType
		matrix bool
	}
	var order []key
	groups := map[key][]int{}
	for _, g := range group(sub(o.params, idx)) {
		for _, j := range g {
			i := idx[j]
			k := key{o.params[i].Device(), o.params[i].DType(), len(autograd.Grad(o.params[i]).Shape()) > 1}
			if _, ok := groups[k]; !ok {
				order = append(order, k)
			}
			groups[k] = append(groups[k], i)
		}
	}
	for _, k := range order {
		ids := groups[k]
		ps := make([]*tensor.Tensor, len(ids))
		ss := make([]*adafactorState, len(ids))
		for n, i := range ids {
			ps[n] = o.params[i]
			ss[n] = o.state[ps[n]]
		}
		// device_grads = the group's gradients (not made here: only
		// unbound later), the previous group's list let go; with maximize
		// then device_grads = torch._foreach_neg(device_grads)
		gs := make([]*tensor.Tensor, len(ps))
		for n, p := range ps {
			gs[n] = autograd.Grad(p)
		}
		f.building = gs
		f.setList("device_grads")
		if o.Maximize {
			for _, g := range gs {
				ng, err := tensor.Neg(g)
				if err != nil {
					return err
				}
				f.build(ng)
			}
			f.setList("device_grads")
		}
		grads := f.list("device_grads")
		eps1 := o.eps1(k.dt)
		omb := make([]float64, len(ps))
		alphas := make([]float64, len(ps))
		for n, s := range ss {
			s.step++
			omb[n] = math.Pow(s.step, o.Beta2Decay)
			rho := math.Min(o.LR, 1/math.Sqrt(s.step))
			pn, err := normValue(f, ps[n])
			if err != nil {
				return err
			}
			alphas[n] = math.Max(o.Eps2, pn/math.Sqrt(float64(ps[n].Numel()))) * rho
		}
		if o.WDecay != 0 {
			for _, p := range ps {
				if err := tensor.MulScalar_(p, 1-o.LR*o.WDecay); err != nil {
					return err
				}
			}
		}
		if k.matrix {
			for pass, dim := range []int{-1, -2} {
				name := []string{"row_means", "col_means"}[pass]
				for _, g := range grads {
					m, err := tensor.VectorNorm(g, 2, []int{dim}, true)
					if err != nil {
						return err
					}
					f.build(m)
				}
				ms := f.setList(name)
				for n, m := range ms {
					if err := tensor.Square_(m); err != nil {
						return err
					}
					sh := grads[n].Shape()
					if err := tensor.DivScalar_(m, float64(sh[len(sh)+dim])); err != nil {
						return err
					}
					st := ss[n].rowVar
					if pass == 1 {
						st = ss[n].colVar
					}
					if err := tensor.Lerp_(st, m, omb[n]); err != nil {
						return err
					}
				}
				f.del(name)
			}
			for _, s := range ss {
				ve, err := tensor.Matmul(s.rowVar, s.colVar)
				if err != nil {
					return err
				}
				f.build(ve)
			}
			ves := f.setList("var_estimates")
			for _, s := range ss {
				m, err := tensor.Mean(s.rowVar, []int{-2}, true, tensor.Undefined)
				if err != nil {
					return err
				}
				f.build(m)
			}
			rms := f.setList("row_var_means")
			for n, m := range rms {
				if err := tensor.Clamp_(m, &eps1, nil); err != nil {
					return err
				}
				if _, err := tensor.BinaryInPlace(tensor.OpDiv, ves[n], m); err != nil {
					return err
				}
			}
			f.del("row_var_means")
		} else {
			for _, g := range grads {
				sq, err := tensor.Mul(g, g)
				if err != nil {
					return err
				}
				f.build(sq)
			}
			sqs := f.setList("grads_squared")
			for n, s := range ss {
				if err := tensor.Lerp_(s.variance, sqs[n], omb[n]); err != nil {
					return err
				}
			}
			f.del("grads_squared")
			for _, s := range ss {
				c, err := tensor.Clone(s.variance)
				if err != nil {
					return err
				}
				f.build(c)
			}
			f.setList("var_estimates")
		}
		ves := f.list("var_estimates")
		e2 := eps1 * eps1
		for n, ve := range ves {
			if err := tensor.Clamp_(ve, &e2, nil); err != nil {
				return err
			}
			if err := tensor.Rsqrt_(ve); err != nil {
				return err
			}
			if _, err := tensor.BinaryInPlace(tensor.OpMul, ve, grads[n]); err != nil {
				return err
			}
		}
		f.aliasList("updates", "var_estimates")
		for n, u := range ves {
			un, err := normValue(f, u)
			if err != nil {
				return err
			}
			alphas[n] = -alphas[n] / math.Max(1, un/(math.Sqrt(float64(u.Numel()))*o.D))
		}
		for n, u := range ves {
			if err := tensor.MulScalar_(u, alphas[n]); err != nil {
				return err
			}
			if err := tensor.Add_(ps[n], u, 1); err != nil {
				return err
			}
		}
	}
	return nil
}
