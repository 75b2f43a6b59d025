package optim

import (
	"errors"
	"fmt"
	"math"
	"slices"

	"github.com/memsh/memsh/tensor"
	"github.com/memsh/memsh/tensor/autograd"
)

// GradScaler is torch.amp.GradScaler("cuda") (PyTorch 2.x,
// torch/amp/grad_scaler.py) with its device memory: the scale (a 0-dim
// float32 tensor) and the growth tracker (0-dim int32) are made on the
// device of the first scaled output and live as long as the scaler (512
// bytes each after the caching allocator's rounding); unscale_ makes the
// inverse scale (scale.double().reciprocal().float(): two 0-dim
// temporaries on the way, the result freed when unscale_ returns) and one
// found_inf (0-dim float32) per device, kept until update().
//
// Errors follow PyTorch's. A scaler does not refuse float32 parameters
// (PyTorch does not: mixed precision keeps float32 master weights, and
// that is the normal use); what it refuses, with PyTorch's
// "Attempting to unscale FP16 gradients.", is float16 gradients, i.e.
// parameters that are themselves float16 — the one "GradScaler with the
// wrong parameters" case PyTorch reports.
type GradScaler struct {
	initScale, growthFactor, backoffFactor float64
	growthInterval                         int
	enabled                                bool

	scale, growthTracker *tensor.Tensor
	states               map[Optimizer]*scalerState
}

// The per-optimizer stages (OptState).
const (
	stageReady = iota
	stageUnscaled
	stageStepped
)

type scalerState struct {
	stage    int
	foundInf []*tensor.Tensor // one per device, in first-seen order
}

// NewGradScaler checks the factors as PyTorch does (growth_factor > 1,
// backoff_factor < 1, growth_interval > 0 are asserted in __init__).
func NewGradScaler(initScale, growthFactor, backoffFactor float64, growthInterval int, enabled bool) (*GradScaler, error) {
	if enabled {
		if growthFactor <= 1 {
			return nil, fmt.Errorf("The growth factor must be > 1.0.")
		}
		if backoffFactor >= 1 {
			return nil, fmt.Errorf("The backoff factor must be < 1.0.")
		}
		if growthInterval <= 0 {
			return nil, fmt.Errorf("growth_interval must be a positive integer")
		}
	}
	return &GradScaler{initScale: initScale, growthFactor: growthFactor, backoffFactor: backoffFactor,
		growthInterval: growthInterval, enabled: enabled, states: map[Optimizer]*scalerState{}}, nil
}

// Enabled is is_enabled().
func (s *GradScaler) Enabled() bool { return s.enabled }

// ScaleTensor returns the scale tensor (nil before the first Scale).
func (s *GradScaler) ScaleTensor() *tensor.Tensor { return s.scale }

// GrowthTracker returns the growth tracker tensor (nil before the first
// Scale).
func (s *GradScaler) GrowthTracker() *tensor.Tensor { return s.growthTracker }

// Scale is scale(outputs) for one tensor: outputs * scale (MulBackward0,
// saving the scale), creating the scale and the growth tracker on the
// output's device on first use. Disabled, it returns outputs.
func (s *GradScaler) Scale(out *tensor.Tensor) (*tensor.Tensor, error) {
	if !s.enabled {
		return out, nil
	}
	if s.scale == nil {
		if err := s.lazyInit(out.Context(), out.Device()); err != nil {
			return nil, err
		}
	}
	sc, err := tensor.To(s.scale, out.Device(), tensor.Undefined, false)
	if err != nil {
		return nil, err
	}
	return autograd.Mul(out, sc)
}

func (s *GradScaler) lazyInit(c *tensor.Context, device string) error {
	sc, err := tensor.Full(c, nil, tensor.Float(s.initScale), tensor.Float32, device)
	if err != nil {
		return err
	}
	gt, err := tensor.Full(c, nil, tensor.Int(0), tensor.Int32, device)
	if err != nil {
		return err
	}
	s.scale, s.growthTracker = sc, gt
	return nil
}

func (s *GradScaler) check(fn string) error {
	if s.scale == nil {
		return fmt.Errorf("Attempted %s but _scale is None.  This may indicate your script did not use scaler.scale(loss or outputs) earlier in the iteration.", fn)
	}
	return nil
}

func (s *GradScaler) state(o Optimizer) *scalerState {
	st := s.states[o]
	if st == nil {
		st = &scalerState{}
		s.states[o] = st
	}
	return st
}

// Unscale is unscale_(optimizer): divides the optimizer's gradients by the
// scale in place (_amp_foreach_non_finite_check_and_unscale_, one call per
// device and dtype, no device allocation) and records whether any was
// inf or NaN in found_inf.
func (s *GradScaler) Unscale(o Optimizer) error {
	if !s.enabled {
		return nil
	}
	if err := s.check("unscale_"); err != nil {
		return err
	}
	st := s.state(o)
	switch st.stage {
	case stageUnscaled:
		return errors.New("unscale_() has already been called on this optimizer since the last update().")
	case stageStepped:
		return errors.New("unscale_() is being called after step().")
	}
	// Checked before anything is allocated (PyTorch raises it in
	// _unscale_grads_, after making inv_scale and found_inf, which it
	// then frees).
	for _, p := range o.Params() {
		if g := autograd.Grad(p); g != nil && g.DType() == tensor.Float16 {
			return errors.New("Attempting to unscale FP16 gradients.")
		}
	}
	// inv_scale = self._scale.double().reciprocal().float(): each
	// temporary of the expression is held while the next is made, and
	// freed once it is
	ctx := s.scale.Context()
	d, err := tensor.To(s.scale, "", tensor.Float64, false)
	if err != nil {
		return err
	}
	release := ctx.Hold(d)
	rec, err := tensor.Div(tensor.Float(1), d)
	release()
	if err != nil {
		return err
	}
	tensor.Dropped(d)
	release = ctx.Hold(rec)
	inv, err := tensor.To(rec, "", tensor.Float32, false)
	release()
	if err != nil {
		return err
	}
	tensor.Dropped(rec)
	defer ctx.Hold(inv)() // and each tensor held below (Hold nests)
	found, err := tensor.Full(ctx, nil, tensor.Float(0), tensor.Float32, s.scale.Device())
	if err != nil {
		return err
	}
	ctx.Hold(found)
	founds, invs := newReplicator(found), newReplicator(inv)
	for _, p := range o.Params() {
		g := autograd.Grad(p)
		if g == nil {
			continue
		}
		f, err := founds.get(g.Device())
		if err != nil {
			return err
		}
		iv, err := invs.get(g.Device())
		if err != nil {
			return err
		}
		if err := nonFiniteCheckAndUnscale(g, f, iv); err != nil {
			return err
		}
	}
	// inv_scale and its replicas are unscale_'s locals: freed as it
	// returns; so is found_inf when no gradient is on the scale's device
	tensor.Dropped(inv)
	tensor.Dropped(invs.order...)
	devOrder := founds.order
	if !slices.Contains(devOrder, found) {
		tensor.Dropped(found)
	}
	st.foundInf = devOrder
	st.stage = stageUnscaled
	return nil
}

// replicator is _MultiDeviceReplicator: a master tensor, itself on its
// own device and a copy made once on any other. The copies are held
// (Context.Hold) while the caller's hold stands.
type replicator struct {
	master *tensor.Tensor
	per    map[string]*tensor.Tensor
	order  []*tensor.Tensor // by the device's first get
}

func newReplicator(master *tensor.Tensor) *replicator {
	return &replicator{master: master, per: map[string]*tensor.Tensor{}}
}

// get returns the master's replica on dev.
func (r *replicator) get(dev string) (*tensor.Tensor, error) {
	if t, ok := r.per[dev]; ok {
		return t, nil
	}
	t, err := tensor.To(r.master, dev, tensor.Undefined, false)
	if err != nil {
		return nil, err
	}
	r.master.Context().Hold(t)
	r.per[dev] = t
	r.order = append(r.order, t)
	return t, nil
}

// nonFiniteCheckAndUnscale is one gradient's share of
// _amp_foreach_non_finite_check_and_unscale_: found = 1 when g has an inf
// or a NaN; g *= inv in place. No device memory, and no copy of the
// values (they are scanned in place; a meta tensor has none and counts as
// finite).
func nonFiniteCheckAndUnscale(g, found, inv *tensor.Tensor) error {
	finite, err := tensor.AllFinite(g)
	if err != nil {
		return err
	}
	if !finite {
		if _, err := found.Fill_(tensor.Float(1)); err != nil {
			return err
		}
	}
	_, err = tensor.BinaryInPlace(tensor.OpMul, g, inv)
	return err
}

// itemOr reads a 0-dim tensor's value, or def on a meta device.
func itemOr(t *tensor.Tensor, def float64) (float64, error) {
	if t.NeedData("item") != nil {
		return def, nil
	}
	v, err := t.Item()
	if err != nil {
		return 0, err
	}
	return v.Float64(), nil
}

// Step is step(optimizer): unscales first unless unscale_ was called, then
// runs optimizer.step() unless a gradient was inf or NaN. It reports
// whether the step ran.
func (s *GradScaler) Step(o Optimizer) (bool, error) { return s.StepHooked(o, nil) }

// StepHooked is Step with hook called around optimizer.step() itself
// (when it runs), as PyTorch's optimizer step hooks are: hook() before,
// the function it returns after; the unscaling and the inf checks run
// outside it. A nil hook is none.
func (s *GradScaler) StepHooked(o Optimizer, hook func() func()) (bool, error) {
	step := func(f func() error) error {
		if hook != nil {
			defer hook()()
		}
		return f()
	}
	if !s.enabled {
		return true, step(o.Step)
	}
	if err := s.check("step"); err != nil {
		return false, err
	}
	st := s.state(o)
	if st.stage == stageStepped {
		return false, errors.New("step() has already been called since the last update().")
	}
	if a, ok := o.(AMPScalingOptimizer); ok && a.SupportsAMPScaling() {
		return s.stepScaling(a, st, step)
	}
	if st.stage == stageReady {
		if err := s.Unscale(o); err != nil {
			return false, err
		}
	}
	if len(st.foundInf) == 0 {
		return false, errors.New("No inf checks were recorded for this optimizer.")
	}
	sum := 0.0
	for _, f := range st.foundInf {
		v, err := itemOr(f, 0)
		if err != nil {
			return false, err
		}
		sum += v
	}
	ran := false
	if sum == 0 {
		if err := step(o.Step); err != nil {
			return false, err
		}
		ran = true
	}
	st.stage = stageStepped
	return ran, nil
}

// Update is update(): _amp_update_scale_ with the found_inf of every
// optimizer since the last update (summed into the first, in place), then
// forgets the per-optimizer states (their found_inf tensors are freed).
// newScale > 0 sets the scale instead (scale.fill_(new_scale)).
func (s *GradScaler) Update(newScale float64) error {
	if !s.enabled {
		return nil
	}
	if err := s.check("update"); err != nil {
		return err
	}
	defer func() { s.states = map[Optimizer]*scalerState{} }()
	if newScale > 0 {
		_, err := s.scale.Fill_(tensor.Float(newScale))
		return err
	}
	var founds []*tensor.Tensor
	for _, st := range s.states {
		for _, f := range st.foundInf {
			f, err := tensor.To(f, s.scale.Device(), tensor.Undefined, false)
			if err != nil {
				return err
			}
			founds = append(founds, f)
		}
	}
	if len(founds) == 0 {
		return errors.New("No inf checks were recorded prior to update.")
	}
	combined := founds[0]
	for _, f := range founds[1:] {
		if _, err := tensor.BinaryInPlace(tensor.OpAdd, combined, f); err != nil {
			return err
		}
	}
	if s.scale.NeedData("update") != nil {
		return nil // meta: no values to update
	}
	sc, err := itemOr(s.scale, 0)
	if err != nil {
		return err
	}
	gt, err := itemOr(s.growthTracker, 0)
	if err != nil {
		return err
	}
	fi, err := itemOr(combined, 0)
	if err != nil {
		return err
	}
	// _amp_update_scale_cuda_kernel, in float32 arithmetic.
	if fi != 0 {
		sc = float64(float32(sc) * float32(s.backoffFactor))
		gt = 0
	} else {
		successful := gt + 1
		if int(successful) == s.growthInterval {
			ns := float32(sc) * float32(s.growthFactor)
			if !math.IsInf(float64(ns), 0) && !math.IsNaN(float64(ns)) {
				sc = float64(ns)
			}
			gt = 0
		} else {
			gt = successful
		}
	}
	if _, err := s.scale.Fill_(tensor.Float(sc)); err != nil {
		return err
	}
	_, err = s.growthTracker.Fill_(tensor.Int(int64(gt)))
	return err
}

// GetScale is get_scale(): the scale as a number (init_scale before the
// first scale(); 1.0 when disabled).
func (s *GradScaler) GetScale() (float64, error) {
	if !s.enabled {
		return 1, nil
	}
	if s.scale == nil {
		return s.initScale, nil
	}
	return itemOr(s.scale, s.initScale)
}

// AMPScalingOptimizer is an optimizer whose step takes the scaler's scale
// and found_inf itself (PyTorch's _step_supports_amp_scaling: the fused
// Adam and AdamW).
type AMPScalingOptimizer interface {
	Optimizer
	SupportsAMPScaling() bool
	// StepScaled is step() with optimizer.grad_scale (nil: None) and
	// optimizer.found_inf set.
	StepScaled(gradScale, foundInf *tensor.Tensor) error
}

// stepScaling is GradScaler.step for an optimizer that supports AMP
// scaling (torch/amp/grad_scaler.py, PyTorch 2.x): before an unscale_,
// _check_inf_per_device makes a dummy inverse scale of 1.0 and a found_inf
// (0-dim float32 each; the dummy freed when it returns, found_inf kept
// until update()) and checks the gradients in place; then found_inf =
// sum(found_infs) (0 + t: a new 0-dim tensor) and, unless unscale_ ran,
// grad_scale = scale * 1 (another), both set on the optimizer for its step
// and freed when step() returns. The step runs even when a gradient is
// inf: the fused kernel itself skips the update.
func (s *GradScaler) stepScaling(o AMPScalingOptimizer, st *scalerState, step func(func() error) error) (bool, error) {
	ctx := s.scale.Context()
	f := newFrame(ctx)
	defer func() { f.close() }()
	unscaled := st.stage == stageUnscaled
	if st.stage == stageReady {
		dummy, err := tensor.Full(ctx, nil, tensor.Float(1), tensor.Float32, s.scale.Device())
		if err != nil {
			return false, err
		}
		f.set("dummy_inv_scale", dummy, true)
		found, err := tensor.Full(ctx, nil, tensor.Float(0), tensor.Float32, s.scale.Device())
		if err != nil {
			return false, err
		}
		st.foundInf = []*tensor.Tensor{found} // in the scaler's state from the start
		perDev := map[string]*tensor.Tensor{s.scale.Device(): found}
		for _, p := range o.Params() {
			g := autograd.Grad(p)
			if g == nil {
				continue
			}
			dev := g.Device()
			fd, ok := perDev[dev]
			if !ok {
				if fd, err = tensor.To(found, dev, tensor.Undefined, false); err != nil {
					return false, err
				}
				perDev[dev] = fd
				st.foundInf = append(st.foundInf, fd)
			}
			iv, err := tensor.To(dummy, dev, tensor.Undefined, false)
			if err != nil {
				return false, err
			}
			if iv != dummy {
				f.set("(inv_scale on "+dev+")", iv, true)
			}
			if err := nonFiniteCheckAndUnscale(g, fd, iv); err != nil {
				return false, err
			}
		}
		f.close() // _check_inf_per_device returns: its dummy inverse scale is freed
		f = newFrame(ctx)
	}
	// found_inf = sum(t.to(scale.device) for t in found_inf_per_device.values())
	var sum *tensor.Tensor
	for k, t := range st.foundInf {
		moved, err := tensor.To(t, s.scale.Device(), tensor.Undefined, false)
		if err != nil {
			return false, err
		}
		if moved != t {
			f.set(fmt.Sprintf("(found_inf %d)", k), moved, true)
		}
		var next *tensor.Tensor
		if sum == nil {
			next, err = tensor.Add(tensor.Int(0), moved)
		} else {
			next, err = tensor.Add(sum, moved)
		}
		if err != nil {
			return false, err
		}
		f.set("found_inf", next, true)
		f.del(fmt.Sprintf("(found_inf %d)", k))
		sum = next
	}
	if sum == nil {
		return false, errors.New("No inf checks were recorded for this optimizer.")
	}
	var gradScale *tensor.Tensor
	if !unscaled {
		gs, err := tensor.Mul(s.scale, tensor.Int(1))
		if err != nil {
			return false, err
		}
		f.set("optimizer.grad_scale", gs, true)
		gradScale = gs
	}
	if err := step(func() error { return o.StepScaled(gradScale, sum) }); err != nil {
		return false, err
	}
	st.stage = stageStepped
	f.del("optimizer.grad_scale") // del optimizer.grad_scale, del optimizer.found_inf
	inf, err := itemOr(sum, 0)
	if err != nil {
		return false, err
	}
	return inf == 0, nil
}
