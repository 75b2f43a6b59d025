package optim

import (
	"fmt"
	"math"
	"slices"

	"github.com/memsh/memsh/tensor"
	"github.com/memsh/memsh/tensor/autograd"
)

// Adafactor in its two common forms, each with the memory of its source
// on CUDA (the per-parameter arithmetic of either allocates only what is
// listed; every 0-dim tensor is one 512-byte block):
//
// HFAdafactor is transformers.optimization.Adafactor (what Trainer's
// optim="adafactor" builds, with scale_parameter=False and
// relative_step=False). State, made at a parameter's first step in this
// order: "exp_avg" (the parameter's shape, only when beta1 is set), then
// for a parameter of 2 or more dimensions the factored second moment
// "exp_avg_sq_row" (shape[:-1]) and "exp_avg_sq_col" (shape[:-2] +
// shape[-1:]), else "exp_avg_sq" (its shape), all float32; "step" (a
// number) and "RMS", the parameter's root mean square, a new 0-dim tensor
// each step (the norm, then its quotient; the old RMS freed when the new
// one replaces it). Each step, per parameter, in order: float32 copies of
// a float16/bfloat16 gradient and parameter (kept until the next
// parameter's); with scale_parameter, the bool 0-dim `RMS > eps[1]` (freed
// at once) and, when true, the learning rate as a 0-dim tensor (RMS × step
// size), kept until the next parameter's replaces it; update = grad**2 +
// eps[0] (the power, then the sum; the power freed), which is when the
// previous parameter's update is let go; factored: the row mean and the
// column mean of update (each freed after its in-place use), then
// _approx_sq_grad: the row mean (0-dim per row group), the row quotient,
// the column factor's rsqrt, their product (the new update, the
// parameter's shape; the quotient, the factor and the old update freed
// after); unfactored: exp_avg_sq.rsqrt() (the new update); the update's
// RMS (norm, quotient, quotient by clip_threshold: 0-dim temporaries);
// with beta1 the update becomes exp_avg (the product freed); with weight
// decay and a tensor learning rate, -weight_decay × lr (0-dim, freed);
// -update (the parameter's shape, freed after the add). So a 2-D
// parameter of P bytes peaks at about 2P (grad**2 and the sum) over the
// previous parameter's update, or the new product over the sum.
//
// Adafactor is torch.optim.Adafactor (PyTorch 2.5+,
// torch/optim/_adafactor.py). State, in order: "step" (a host tensor:
// no device memory), then "row_var" (shape with the last dimension 1) and
// "col_var" (shape with the second-to-last 1) for a parameter of 2 or more
// dimensions, else "variance" (its shape). The per-parameter loop
// (foreach=None, the default: PyTorch defaults Adafactor to it even on
// CUDA) makes, per parameter: the parameter's norm (0-dim, freed), the
// row mean and column mean (vector norms over the last and second-to-last
// dimension, kept until the next matrix parameter's replace them),
// var_estimate = row_var @ col_var (the parameter's shape; a vector
// parameter: grad*grad, kept, and variance.clone()) and the mean of
// row_var (freed); update is var_estimate, made in place; the update's
// norm (0-dim, freed). The previous parameter's var_estimate is freed
// when the next one's is bound. The foreach path (foreach=True) does the
// same a group (matrices, vectors, per device and dtype) at a time, so
// each group's temporaries are lists alive together, and a group's
// updates stay until the next group's are made.
type HFAdafactor struct {
	params                                   []*tensor.Tensor
	LR                                       float64 // NaN: lr=None
	Eps1, Eps2, ClipThreshold, DecayRate     float64
	Beta1                                    float64 // NaN: beta1=None
	WDecay                                   float64
	ScaleParameter, RelativeStep, WarmupInit bool
	state                                    map[*tensor.Tensor]*hfAdafactorState
	byIndex                                  []*hfAdafactorState
	marked
}

type hfAdafactorState struct {
	step                       float64
	expAvg, row, col, expAvgSq *tensor.Tensor
	rms                        *tensor.Tensor // nil: the initial RMS = 0
}

// NewHFAdafactor checks the options as transformers does. lr and beta1
// NaN mean None.
func NewHFAdafactor(params []*tensor.Tensor, lr, eps1, eps2, clipThreshold, decayRate, beta1, weightDecay float64,
	scaleParameter, relativeStep, warmupInit bool) (*HFAdafactor, error) {
	const name = "transformers.Adafactor"
	if !math.IsNaN(lr) && relativeStep {
		return nil, fmt.Errorf("%s: Cannot combine manual `lr` and `relative_step=True` options", name)
	}
	if warmupInit && !relativeStep {
		return nil, fmt.Errorf("%s: `warmup_init=True` requires `relative_step=True`", name)
	}
	if math.IsNaN(lr) && !relativeStep {
		// transformers accepts it and fails at the first step (None * float)
		return nil, fmt.Errorf("%s: lr=None needs relative_step=True (transformers fails at the first step: unsupported operand type(s) for *: 'float' and 'NoneType')", name)
	}
	if err := checkParams(name, params); err != nil {
		return nil, err
	}
	return &HFAdafactor{params: params, LR: lr, Eps1: eps1, Eps2: eps2, ClipThreshold: clipThreshold, DecayRate: decayRate,
		Beta1: beta1, WDecay: weightDecay, ScaleParameter: scaleParameter, RelativeStep: relativeStep, WarmupInit: warmupInit,
		state: map[*tensor.Tensor]*hfAdafactorState{}}, nil
}

func (o *HFAdafactor) Name() string             { return "transformers.Adafactor" }
func (o *HFAdafactor) Params() []*tensor.Tensor { return o.params }

// State: "step" and "RMS" (a number before the first step's RMS exists,
// then a 0-dim tensor), "exp_avg" with beta1, "exp_avg_sq_row" and
// "exp_avg_sq_col" or "exp_avg_sq".
func (o *HFAdafactor) State(p *tensor.Tensor) map[string]any {
	s := o.state[p]
	if s == nil {
		return nil
	}
	m := map[string]any{"step": s.step}
	if s.rms != nil {
		m["RMS"] = s.rms
	} else {
		m["RMS"] = 0.0
	}
	for k, t := range map[string]*tensor.Tensor{"exp_avg": s.expAvg, "exp_avg_sq_row": s.row, "exp_avg_sq_col": s.col, "exp_avg_sq": s.expAvgSq} {
		if t != nil {
			m[k] = t
		}
	}
	return m
}

// StateTensors implements Optimizer.
func (o *HFAdafactor) StateTensors(p *tensor.Tensor, fn func(*tensor.Tensor)) {
	if s := o.state[p]; s != nil {
		each(fn, s.rms, s.expAvg, s.row, s.col, s.expAvgSq)
	}
}

// Reach passes the parameters and the state tensors to r.
func (o *HFAdafactor) Reach(r *tensor.Reacher) {
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
		for _, t := range []*tensor.Tensor{s.expAvg, s.row, s.col, s.expAvgSq, s.rms} {
			r.Tensor(t) // nil-safe
		}
	}
}

func isHalf(dt tensor.DType) bool { return dt == tensor.Float16 || dt == tensor.BFloat16 }

// HFAdafactorStateBytes is the state a parameter of shape and dtype
// gets at its first step (before the RMS tensor), each tensor rounded by
// round: the factored row and column moments (float32) for 2 or more
// dimensions, else the full second moment, plus exp_avg with beta1.
func HFAdafactorStateBytes(shape []int, beta1 bool, round func(uint64) uint64) uint64 {
	numel := uint64(1)
	for _, s := range shape {
		numel *= uint64(s)
	}
	var n uint64
	if beta1 {
		n += round(4 * numel)
	}
	if len(shape) >= 2 {
		rows := numel / uint64(shape[len(shape)-1])
		cols := numel / uint64(shape[len(shape)-2])
		n += round(4*rows) + round(4*cols)
	} else {
		n += round(4 * numel)
	}
	return n
}

// Step performs one update of every parameter with a gradient.
func (o *HFAdafactor) Step() error {
	return noGrad(o.params, func() error {
		f := newFrame(o.params[0].Context())
		defer f.close()
		for i, p := range o.params {
			if err := o.stepParam(f, i, p); err != nil {
				return err
			}
		}
		return nil
	})
}

func (o *HFAdafactor) lr(s *hfAdafactorState) (relStep float64) {
	relStep = o.LR
	if o.RelativeStep {
		minStep := 1e-2
		if o.WarmupInit {
			minStep = 1e-6 * s.step
		}
		relStep = math.Min(minStep, 1/math.Sqrt(s.step))
	}
	return relStep
}

func (o *HFAdafactor) stepParam(f *frame, i int, p *tensor.Tensor) error {
	g := autograd.Grad(p)
	if g == nil {
		return nil
	}
	f.set("grad", g, false)
	if isHalf(g.DType()) {
		gf, err := tensor.To(g, "", tensor.Float32, false)
		if err != nil {
			return err
		}
		f.set("grad", gf, true)
	}
	grad := f.get("grad")
	shape := grad.Shape()
	factored := len(shape) >= 2
	first := !math.IsNaN(o.Beta1)
	s := o.state[p]
	if s == nil {
		s = &hfAdafactorState{}
		o.state[p] = s
		if o.byIndex == nil {
			o.byIndex = make([]*hfAdafactorState, len(o.params))
		}
		o.byIndex[i] = s
		var err error
		if first {
			if s.expAvg, err = tensor.ZerosLike(grad, tensor.Undefined, ""); err != nil {
				return err
			}
			o.grew(p.Context(), s.expAvg)
		}
		if factored {
			// torch.zeros(shape[:-1]).to(grad): on CUDA a host tensor copied
			// to the device (one device allocation)
			if s.row, err = tensor.Zeros(p.Context(), shape[:len(shape)-1], grad.DType(), grad.Device()); err != nil {
				return err
			}
			o.grew(p.Context(), s.row)
			colShape := append(slices.Clone(shape[:len(shape)-2]), shape[len(shape)-1])
			if s.col, err = tensor.Zeros(p.Context(), colShape, grad.DType(), grad.Device()); err != nil {
				return err
			}
			o.grew(p.Context(), s.col)
		} else if s.expAvgSq, err = tensor.ZerosLike(grad, tensor.Undefined, ""); err != nil {
			return err
		} else {
			o.grew(p.Context(), s.expAvgSq)
		}
	}
	f.set("p_data_fp32", p, false)
	if isHalf(p.DType()) {
		pf, err := tensor.To(p, "", tensor.Float32, false)
		if err != nil {
			return err
		}
		f.set("p_data_fp32", pf, true)
	}
	p32 := f.get("p_data_fp32")
	s.step++
	// state["RMS"] = self._rms(p_data_fp32): norm / numel**0.5
	rms, err := o.rms(f, p32)
	if err != nil {
		return err
	}
	old := s.rms
	s.rms = rms
	if old != nil {
		// state["RMS"] rebound: the old one is let go
		o.changed(p.Context())
		tensor.Dropped(old)
		dropped(p)
	} else {
		o.grew(p.Context(), rms)
	}
	// lr = self._get_lr(group, state)
	relStep := o.lr(s)
	lrT, lrF := (*tensor.Tensor)(nil), relStep
	if o.ScaleParameter {
		// max(eps[1], RMS): Python compares RMS > eps[1] (a bool tensor)
		gt, err := tensor.Gt(rms, tensor.Float(o.Eps2))
		if err != nil {
			return err
		}
		above := true // a meta device has no values: the RMS is taken as above eps[1]
		if gt.NeedData("item") == nil {
			v, err := gt.Item()
			if err != nil {
				return err
			}
			above = v.Float64() != 0
		}
		tensor.Dropped(gt)
		dropped(p)
		if above {
			if lrT, err = tensor.Mul(rms, tensor.Float(relStep)); err != nil {
				return err
			}
		} else {
			lrF = o.Eps2 * relStep
		}
	}
	f.set("lr", lrT, lrT != nil)
	beta2t := 1 - math.Pow(s.step, o.DecayRate)
	// update = (grad**2) + eps[0]
	sq, err := tensor.PowScalar(grad, 2)
	if err != nil {
		return err
	}
	f.set("(grad**2)", sq, true)
	u, err := tensor.Add(sq, tensor.Float(o.Eps1))
	if err != nil {
		return err
	}
	f.set("(update)", u, true)
	f.del("(grad**2)")
	f.set("update", u, true)
	f.del("(update)")
	if factored {
		for k, dim := range []int{-1, -2} {
			st := []*tensor.Tensor{s.row, s.col}[k]
			m, err := tensor.Mean(u, []int{dim}, false, tensor.Undefined)
			if err != nil {
				return err
			}
			if err := tensor.MulScalar_(st, beta2t); err != nil {
				return err
			}
			if err := tensor.Add_(st, m, 1-beta2t); err != nil {
				return err
			}
			tensor.Dropped(m)
			dropped(p)
		}
		approx, err := o.approxSqGrad(f, s.row, s.col)
		if err != nil {
			return err
		}
		f.set("update", approx, true)
		if _, err := tensor.BinaryInPlace(tensor.OpMul, approx, grad); err != nil {
			return err
		}
	} else {
		if err := tensor.MulScalar_(s.expAvgSq, beta2t); err != nil {
			return err
		}
		if err := tensor.Add_(s.expAvgSq, u, 1-beta2t); err != nil {
			return err
		}
		r, err := tensor.Rsqrt(s.expAvgSq)
		if err != nil {
			return err
		}
		if _, err := tensor.BinaryInPlace(tensor.OpMul, r, grad); err != nil {
			return err
		}
		f.set("update", r, true)
	}
	update := f.get("update")
	// update.div_((self._rms(update) / clip_threshold).clamp_(min=1.0))
	ur, err := o.rms(f, update)
	if err != nil {
		return err
	}
	f.set("(_rms(update))", ur, true)
	d, err := tensor.Div(ur, tensor.Float(o.ClipThreshold))
	if err != nil {
		return err
	}
	f.set("(clip)", d, true)
	f.del("(_rms(update))")
	one := 1.0
	if err := tensor.Clamp_(d, &one, nil); err != nil {
		return err
	}
	if _, err := tensor.BinaryInPlace(tensor.OpDiv, update, d); err != nil {
		return err
	}
	f.del("(clip)")
	// update.mul_(lr)
	if lrT != nil {
		_, err = tensor.BinaryInPlace(tensor.OpMul, update, lrT)
	} else {
		err = tensor.MulScalar_(update, lrF)
	}
	if err != nil {
		return err
	}
	if first {
		if err := tensor.MulScalar_(s.expAvg, o.Beta1); err != nil {
			return err
		}
		if err := tensor.Add_(s.expAvg, update, 1-o.Beta1); err != nil {
			return err
		}
		f.set("update", s.expAvg, false)
		update = s.expAvg
	}
	if o.WDecay != 0 {
		alpha := -o.WDecay * lrF
		if lrT != nil {
			// -weight_decay * lr: a 0-dim tensor, read as add_'s alpha (on
			// a meta device there is no value: the alpha is not used)
			t, err := tensor.Mul(lrT, tensor.Float(-o.WDecay))
			if err != nil {
				return err
			}
			f.set("(-wd*lr)", t, true)
			if t.NeedData("item") == nil {
				v, err := t.Item()
				if err != nil {
					return err
				}
				alpha = v.Float64()
			}
		}
		if err := tensor.Add_(p32, p32, alpha); err != nil {
			return err
		}
		f.del("(-wd*lr)")
	}
	// p_data_fp32.add_(-update)
	neg, err := tensor.Neg(update)
	if err != nil {
		return err
	}
	f.set("(-update)", neg, true)
	if err := tensor.Add_(p32, neg, 1); err != nil {
		return err
	}
	f.del("(-update)")
	if p32 != p {
		if _, err := p.Copy_(p32); err != nil {
			return err
		}
	}
	return nil
}

// rms is Adafactor._rms(t): t.norm(2) / t.numel()**0.5, the norm freed
// when the quotient is made.
func (o *HFAdafactor) rms(f *frame, t *tensor.Tensor) (*tensor.Tensor, error) {
	n, err := tensor.VectorNorm(t, 2, nil, false)
	if err != nil {
		return nil, err
	}
	f.set("(norm)", n, true)
	r, err := tensor.Div(n, tensor.Float(math.Sqrt(float64(t.Numel()))))
	if err != nil {
		return nil, err
	}
	f.set("(rms)", r, false) // the caller binds it
	f.del("(norm)")
	f.del("(rms)")
	return r, nil
}

// approxSqGrad is Adafactor._approx_sq_grad: r_factor =
// (row / row.mean(-1, keepdim)).rsqrt_().unsqueeze(-1), c_factor =
// col.unsqueeze(-2).rsqrt(), their product; r_factor and c_factor are freed
// when it returns (in that order), after the product exists.
func (o *HFAdafactor) approxSqGrad(f *frame, row, col *tensor.Tensor) (*tensor.Tensor, error) {
	m, err := tensor.Mean(row, []int{-1}, true, tensor.Undefined)
	if err != nil {
		return nil, err
	}
	f.set("(row mean)", m, true)
	q, err := tensor.Div(row, m)
	if err != nil {
		return nil, err
	}
	f.set("r_factor", q, true)
	f.del("(row mean)")
	if err := tensor.Rsqrt_(q); err != nil {
		return nil, err
	}
	rf, err := tensor.Unsqueeze(q, -1)
	if err != nil {
		return nil, err
	}
	f.set("r_factor", rf, true) // the view; q's storage stays with it
	cv, err := tensor.Unsqueeze(col, -2)
	if err != nil {
		return nil, err
	}
	cf, err := tensor.Rsqrt(cv)
	if err != nil {
		return nil, err
	}
	f.set("c_factor", cf, true)
	prod, err := tensor.Mul(rf, cf)
	if err != nil {
		return nil, err
	}
	f.set("(product)", prod, false)
	f.del("r_factor")
	f.del("c_factor")
	f.del("(product)")
	return prod, nil
}
