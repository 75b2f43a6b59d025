package optim

import (
	"fmt"

	"go.starlark.net/starlark"

	startensor "github.com/memsh/memsh/starlib/tensor"
	"github.com/memsh/memsh/tensor/optim"
)

func init() {
	Module.Members["GradScaler"] = starlark.NewBuiltin("optim.GradScaler", newGradScaler)
}

// newGradScaler is optim.GradScaler(device="cuda", init_scale=65536.0,
// growth_factor=2.0, backoff_factor=0.5, growth_interval=2000,
// enabled=True), torch.amp.GradScaler: scale(outputs) multiplies a tensor
// (or each tensor of a list or tuple) by the scale, a 0-dim float32 on the
// output's device made on first use with the int32 growth tracker (512
// bytes each); unscale_(optimizer) divides the gradients in place and
// records a 0-dim float32 found_inf per device (kept until update());
// step(optimizer) unscales if needed and skips optimizer.step() when a
// gradient was inf or NaN; update() grows or backs off the scale;
// get_scale() returns it as a float. Float32 parameters are the normal
// case (PyTorch accepts them); float16 gradients fail with PyTorch's
// "Attempting to unscale FP16 gradients.".
func newGradScaler(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	device := "cuda"
	initScale, growth, backoff := 65536.0, 2.0, 0.5
	interval := 2000
	enabled := true
	if err := starlark.UnpackArgs(b.Name(), args, kwargs, "device?", &device, "init_scale?", &initScale, "growth_factor?", &growth,
		"backoff_factor?", &backoff, "growth_interval?", &interval, "enabled?", &enabled); err != nil {
		return nil, err
	}
	if device != "cuda" {
		return nil, fmt.Errorf("%s: for parameter device: only \"cuda\" is modelled, got %q", b.Name(), device)
	}
	s, err := optim.NewGradScaler(initScale, growth, backoff, interval, enabled)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", b.Name(), err)
	}
	return &GradScaler{s: s}, nil
}

// GradScaler is the Starlark value of a GradScaler.
type GradScaler struct{ s *optim.GradScaler }

var _ starlark.HasAttrs = (*GradScaler)(nil)

func (g *GradScaler) String() string        { return "GradScaler(...)" }
func (g *GradScaler) Type() string          { return "optim.GradScaler" }
func (g *GradScaler) Freeze()               {}
func (g *GradScaler) Truth() starlark.Bool  { return true }
func (g *GradScaler) Hash() (uint32, error) { return 0, fmt.Errorf("unhashable: %s", g.Type()) }

func (g *GradScaler) AttrNames() []string {
	return []string{"get_scale", "is_enabled", "scale", "step", "unscale_", "update"}
}

func (g *GradScaler) method(name string, fn func(b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error)) starlark.Value {
	return starlark.NewBuiltin("GradScaler."+name, func(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
		v, err := fn(b, args, kwargs)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", b.Name(), err)
		}
		return v, nil
	}).BindReceiver(g) // the receiver, for the reclaim's reach walk
}

func optimizerArg(b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (*Optimizer, error) {
	var v starlark.Value
	if err := starlark.UnpackArgs(b.Name(), args, kwargs, "optimizer", &v); err != nil {
		return nil, err
	}
	o, ok := v.(*Optimizer)
	if !ok {
		return nil, fmt.Errorf("for parameter optimizer: got %s, want an optimizer", v.Type())
	}
	return o, nil
}

func (g *GradScaler) Attr(name string) (starlark.Value, error) {
	switch name {
	case "scale":
		return g.method(name, func(b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
			var v starlark.Value
			if err := starlark.UnpackArgs(b.Name(), args, kwargs, "outputs", &v); err != nil {
				return nil, err
			}
			return g.scale(v)
		}), nil
	case "unscale_":
		return g.method(name, func(b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
			o, err := optimizerArg(b, args, kwargs)
			if err != nil {
				return nil, err
			}
			return starlark.None, g.s.Unscale(o.o)
		}), nil
	case "step":
		return starlark.NewBuiltin("GradScaler."+name, func(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
			o, err := optimizerArg(b, args, kwargs)
			if err != nil {
				return nil, err
			}
			// optimizer.step()'s hooks (nn.track's) run around the step
			// itself, as PyTorch's do when GradScaler.step calls it
			var hook func() func()
			if h, ok := thread.Local(StepHookKey).(StepHook); ok {
				hook = func() func() { return h(o.o) }
			}
			if _, err := g.s.StepHooked(o.o, hook); err != nil {
				return nil, fmt.Errorf("%s: %w", b.Name(), err)
			}
			return starlark.None, nil
		}).BindReceiver(g), nil // the receiver, for the reclaim's reach walk
	case "update":
		return g.method(name, func(b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
			var ns starlark.Value = starlark.None
			if err := starlark.UnpackArgs(b.Name(), args, kwargs, "new_scale?", &ns); err != nil {
				return nil, err
			}
			f := 0.0
			if ns != starlark.None {
				v, ok := starlark.AsFloat(ns)
				if !ok || v <= 0 {
					return nil, fmt.Errorf("for parameter new_scale: want a positive number or None")
				}
				f = v
			}
			return starlark.None, g.s.Update(f)
		}), nil
	case "get_scale":
		return g.method(name, func(b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
			if err := starlark.UnpackArgs(b.Name(), args, kwargs); err != nil {
				return nil, err
			}
			v, err := g.s.GetScale()
			return starlark.Float(v), err
		}), nil
	case "is_enabled":
		return g.method(name, func(b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
			return starlark.Bool(g.s.Enabled()), starlark.UnpackArgs(b.Name(), args, kwargs)
		}), nil
	}
	return nil, nil
}

// scale multiplies a tensor, or each tensor of a list or tuple.
func (g *GradScaler) scale(v starlark.Value) (starlark.Value, error) {
	switch v := v.(type) {
	case *startensor.Tensor:
		t, err := g.s.Scale(v.Engine())
		if err != nil {
			return nil, err
		}
		return startensor.Wrap(t), nil
	case *starlark.List, starlark.Tuple:
		seq := v.(starlark.Indexable)
		out := make([]starlark.Value, seq.Len())
		for i := range out {
			r, err := g.scale(seq.Index(i))
			if err != nil {
				return nil, err
			}
			out[i] = r
		}
		if _, ok := v.(starlark.Tuple); ok {
			return starlark.Tuple(out), nil
		}
		return starlark.NewList(out), nil
	}
	return nil, fmt.Errorf("outputs must be a Tensor or an iterable of Tensors, got %s", v.Type())
}

// References lets reports and leak paths see the scaler's tensors.
func (g *GradScaler) References(edge func(suffix string, v starlark.Value)) {
	if t := g.s.ScaleTensor(); t != nil {
		edge("._scale", startensor.Wrap(t))
	}
	if t := g.s.GrowthTracker(); t != nil {
		edge("._growth_tracker", startensor.Wrap(t))
	}
}
