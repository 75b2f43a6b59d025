package nn

import (
	"fmt"
	"math"
	"strings"

	"go.starlark.net/starlark"
	"go.starlark.net/starlarkstruct"

	startensor "github.com/memsh/memsh/starlib/tensor"
	"github.com/memsh/memsh/tensor"
	"github.com/memsh/memsh/tensor/optim"
)

// Utils is nn.utils, PyTorch's torch.nn.utils gradient clipping (PyTorch
// 2.x, torch/nn/utils/clip_grad.py; tensor/optim/clip_grad.go lists what
// each call allocates):
//
//	clip_grad_norm_(parameters, max_norm, norm_type=2.0, error_if_nonfinite=False, foreach=None)
//	get_total_norm(tensors, norm_type=2.0, error_if_nonfinite=False, foreach=None)
//	clip_grads_with_norm_(parameters, max_norm, total_norm, foreach=None)
//
// parameters and tensors are a tensor or an iterable of tensors
// (model.parameters()); norm_type is a number or "inf". clip_grad_norm_
// and get_total_norm return the total norm, a 0-dim tensor on the first
// gradient's device (one 512-byte block).
var Utils = &starlarkstruct.Module{Name: "nn.utils", Members: starlark.StringDict{
	"clip_grad_norm_":       starlark.NewBuiltin("nn.utils.clip_grad_norm_", clipGradNorm),
	"get_total_norm":        starlark.NewBuiltin("nn.utils.get_total_norm", getTotalNorm),
	"clip_grads_with_norm_": starlark.NewBuiltin("nn.utils.clip_grads_with_norm_", clipGradsWithNorm),
}}

func init() { Module.Members["utils"] = Utils }

// tensorsArg reads a tensor or an iterable of tensors.
func tensorsArg(fname, param string, v starlark.Value) ([]*tensor.Tensor, error) {
	if t, ok := v.(*startensor.Tensor); ok {
		return []*tensor.Tensor{t.Engine()}, nil
	}
	it, ok := v.(starlark.Iterable)
	if !ok {
		return nil, fmt.Errorf("%s: for parameter %s: got %s, want a tensor or an iterable of tensors", fname, param, v.Type())
	}
	iter := it.Iterate()
	defer iter.Done()
	var ts []*tensor.Tensor
	var x starlark.Value
	for iter.Next(&x) {
		t, ok := x.(*startensor.Tensor)
		if !ok {
			return nil, fmt.Errorf("%s: for parameter %s: an element is %s, want a tensor", fname, param, x.Type())
		}
		ts = append(ts, t.Engine())
	}
	return ts, nil
}

// normTypeArg reads norm_type: a number, or "inf" / "-inf" as float()
// reads them.
func normTypeArg(fname string, v starlark.Value) (float64, error) {
	if s, ok := v.(starlark.String); ok {
		switch strings.ToLower(string(s)) {
		case "inf", "+inf", "infinity":
			return math.Inf(1), nil
		case "-inf", "-infinity":
			return math.Inf(-1), nil
		}
		return 0, fmt.Errorf("%s: for parameter norm_type: could not convert string to float: %q", fname, string(s))
	}
	f, ok := starlark.AsFloat(v)
	if !ok {
		return 0, fmt.Errorf("%s: for parameter norm_type: got %s, want a number or \"inf\"", fname, v.Type())
	}
	return f, nil
}

// foreachOpt reads foreach: None or a bool.
func foreachOpt(fname string, v starlark.Value) (*bool, error) {
	switch v := v.(type) {
	case starlark.NoneType:
		return nil, nil
	case starlark.Bool:
		b := bool(v)
		return &b, nil
	}
	return nil, fmt.Errorf("%s: for parameter foreach: got %s, want bool or None", fname, v.Type())
}

func maxNormArg(fname string, v starlark.Value) (float64, error) {
	f, ok := starlark.AsFloat(v)
	if !ok {
		return 0, fmt.Errorf("%s: for parameter max_norm: got %s, want a number", fname, v.Type())
	}
	return f, nil
}

// normForeachArgs reads norm_type and foreach, as clip_grad_norm_ and
// get_total_norm take them.
func normForeachArgs(name string, normV, foreachV starlark.Value) (float64, *bool, error) {
	normType, err := normTypeArg(name, normV)
	if err != nil {
		return 0, nil, err
	}
	foreach, err := foreachOpt(name, foreachV)
	return normType, foreach, err
}

func clipGradNorm(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	var paramsV, maxNormV starlark.Value
	var normV starlark.Value = starlark.Float(2)
	var foreachV starlark.Value = starlark.None
	var nonfinite bool
	if err := starlark.UnpackArgs(b.Name(), args, kwargs, "parameters", &paramsV, "max_norm", &maxNormV,
		"norm_type?", &normV, "error_if_nonfinite?", &nonfinite, "foreach?", &foreachV); err != nil {
		return nil, err
	}
	ps, err := tensorsArg(b.Name(), "parameters", paramsV)
	if err != nil {
		return nil, err
	}
	maxNorm, err := maxNormArg(b.Name(), maxNormV)
	if err != nil {
		return nil, err
	}
	normType, foreach, err := normForeachArgs(b.Name(), normV, foreachV)
	if err != nil {
		return nil, err
	}
	total, err := optim.ClipGradNorm(ps, maxNorm, normType, nonfinite, foreach)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", b.Name(), err)
	}
	return startensor.Wrap(total), nil
}

func getTotalNorm(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	var tsV starlark.Value
	var normV starlark.Value = starlark.Float(2)
	var foreachV starlark.Value = starlark.None
	var nonfinite bool
	if err := starlark.UnpackArgs(b.Name(), args, kwargs, "tensors", &tsV, "norm_type?", &normV,
		"error_if_nonfinite?", &nonfinite, "foreach?", &foreachV); err != nil {
		return nil, err
	}
	ts, err := tensorsArg(b.Name(), "tensors", tsV)
	if err != nil {
		return nil, err
	}
	normType, foreach, err := normForeachArgs(b.Name(), normV, foreachV)
	if err != nil {
		return nil, err
	}
	if len(ts) == 0 {
		return nil, fmt.Errorf("%s: for parameter tensors: got no tensors (PyTorch returns torch.tensor(0.0))", b.Name())
	}
	total, err := optim.GetTotalNorm(ts, normType, nonfinite, foreach)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", b.Name(), err)
	}
	return startensor.Wrap(total), nil
}

func clipGradsWithNorm(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	var paramsV, maxNormV, totalV starlark.Value
	var foreachV starlark.Value = starlark.None
	if err := starlark.UnpackArgs(b.Name(), args, kwargs, "parameters", &paramsV, "max_norm", &maxNormV,
		"total_norm", &totalV, "foreach?", &foreachV); err != nil {
		return nil, err
	}
	ps, err := tensorsArg(b.Name(), "parameters", paramsV)
	if err != nil {
		return nil, err
	}
	maxNorm, err := maxNormArg(b.Name(), maxNormV)
	if err != nil {
		return nil, err
	}
	total, ok := totalV.(*startensor.Tensor)
	if !ok {
		return nil, fmt.Errorf("%s: for parameter total_norm: got %s, want a tensor", b.Name(), totalV.Type())
	}
	foreach, err := foreachOpt(b.Name(), foreachV)
	if err != nil {
		return nil, err
	}
	if err := optim.ClipGradsWithNorm(ps, maxNorm, total.Engine(), foreach); err != nil {
		return nil, fmt.Errorf("%s: %w", b.Name(), err)
	}
	return starlark.None, nil
}
