package optim

import (
	"fmt"
	"math"

	"go.starlark.net/starlark"
	"go.starlark.net/starlarkstruct"

	"github.com/memsh/memsh/tensor/optim"
)

// Transformers is optim.transformers, the optimizers of Hugging Face
// transformers (transformers.optimization) that memsh models:
//
//	Adafactor(params, lr=None, eps=(1e-30, 1e-3), clip_threshold=1.0, decay_rate=-0.8, beta1=None,
//	          weight_decay=0.0, scale_parameter=True, relative_step=True, warmup_init=False)
var Transformers = &starlarkstruct.Module{Name: "optim.transformers", Members: starlark.StringDict{
	"Adafactor": starlark.NewBuiltin("optim.transformers.Adafactor", newHFAdafactor),
}}

func init() {
	Module.Members["Adafactor"] = starlark.NewBuiltin("optim.Adafactor", newAdafactor)
	Module.Members["transformers"] = Transformers
}

// optNumber is a number or None (NaN).
type optNumber float64

func (n *optNumber) Unpack(v starlark.Value) error {
	if v == starlark.None {
		*n = optNumber(math.NaN())
		return nil
	}
	f, ok := starlark.AsFloat(v)
	if !ok {
		return fmt.Errorf("got %s, want a number or None", v.Type())
	}
	*n = optNumber(f)
	return nil
}

// numberOrNone is n as a Starlark value (None for NaN).
func numberOrNone(n float64) starlark.Value {
	if math.IsNaN(n) {
		return starlark.None
	}
	return starlark.Float(n)
}

// epsPair reads eps=(eps1, eps2): eps1 may be None when noneFirst.
func epsPair(fname string, t starlark.Tuple, noneFirst bool) (float64, float64, error) {
	if len(t) != 2 {
		return 0, 0, fmt.Errorf("%s: for parameter eps: want a pair, got %d values", fname, len(t))
	}
	e1 := math.NaN()
	if !(noneFirst && t[0] == starlark.None) {
		f, ok := starlark.AsFloat(t[0])
		if !ok {
			return 0, 0, fmt.Errorf("%s: for parameter eps: want two numbers, got %s", fname, t[0].Type())
		}
		e1 = f
	}
	e2, ok := starlark.AsFloat(t[1])
	if !ok {
		return 0, 0, fmt.Errorf("%s: for parameter eps: want two numbers, got %s", fname, t[1].Type())
	}
	return e1, e2, nil
}

// newAdafactor is optim.Adafactor(params, lr=1e-2, beta2_decay=-0.8,
// eps=(None, 1e-3), d=1.0, weight_decay=0.0, foreach=None, maximize=False):
// torch.optim.Adafactor. foreach=None is the per-parameter loop (PyTorch's
// default for Adafactor, even on CUDA), foreach=True the multi-tensor one.
func newAdafactor(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	var paramsV starlark.Value
	lr, decay, d, wd := number(1e-2), number(-0.8), number(1), number(0)
	eps := starlark.Tuple{starlark.None, starlark.Float(1e-3)}
	var foreachV starlark.Value = starlark.None
	var maximize bool
	if err := starlark.UnpackArgs(b.Name(), args, kwargs, "params", &paramsV, "lr?", &lr, "beta2_decay?", &decay, "eps?", &eps,
		"d?", &d, "weight_decay?", &wd, "foreach?", &foreachV, "maximize?", &maximize); err != nil {
		return nil, err
	}
	e1, e2, err := epsPair(b.Name(), eps, true)
	if err != nil {
		return nil, err
	}
	foreach := false
	switch v := foreachV.(type) {
	case starlark.NoneType:
	case starlark.Bool:
		foreach = bool(v)
	default:
		return nil, fmt.Errorf("%s: for parameter foreach: got %s, want bool or None", b.Name(), foreachV.Type())
	}
	vals, ps, err := paramsArg(b.Name(), paramsV)
	if err != nil {
		return nil, err
	}
	o, err := optim.NewAdafactor(ps, float64(lr), float64(decay), e1, e2, float64(d), float64(wd), foreach, maximize)
	if err != nil {
		return nil, err
	}
	return &Optimizer{o: o, params: vals, group: starlark.StringDict{
		"lr": starlark.Float(lr), "beta2_decay": starlark.Float(decay), "eps": eps, "d": starlark.Float(d),
		"weight_decay": starlark.Float(wd), "foreach": foreachV, "maximize": starlark.Bool(maximize),
	}}, nil
}

// newHFAdafactor is optim.transformers.Adafactor: transformers'
// Adafactor, with its defaults (lr=None with relative_step=True; Trainer's
// optim="adafactor" passes lr, scale_parameter=False and
// relative_step=False).
func newHFAdafactor(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	var paramsV starlark.Value
	lr, beta1 := optNumber(math.NaN()), optNumber(math.NaN())
	clip, decay, wd := number(1), number(-0.8), number(0)
	eps := starlark.Tuple{starlark.Float(1e-30), starlark.Float(1e-3)}
	scale, relative, warmup := true, true, false
	if err := starlark.UnpackArgs(b.Name(), args, kwargs, "params", &paramsV, "lr?", &lr, "eps?", &eps, "clip_threshold?", &clip,
		"decay_rate?", &decay, "beta1?", &beta1, "weight_decay?", &wd, "scale_parameter?", &scale,
		"relative_step?", &relative, "warmup_init?", &warmup); err != nil {
		return nil, err
	}
	e1, e2, err := epsPair(b.Name(), eps, false)
	if err != nil {
		return nil, err
	}
	vals, ps, err := paramsArg(b.Name(), paramsV)
	if err != nil {
		return nil, err
	}
	o, err := optim.NewHFAdafactor(ps, float64(lr), e1, e2, float64(clip), float64(decay), float64(beta1), float64(wd), scale, relative, warmup)
	if err != nil {
		return nil, err
	}
	return &Optimizer{o: o, params: vals, group: starlark.StringDict{
		"lr": numberOrNone(float64(lr)), "eps": eps, "clip_threshold": starlark.Float(clip), "decay_rate": starlark.Float(decay),
		"beta1": numberOrNone(float64(beta1)), "weight_decay": starlark.Float(wd), "scale_parameter": starlark.Bool(scale),
		"relative_step": starlark.Bool(relative), "warmup_init": starlark.Bool(warmup),
	}}, nil
}
