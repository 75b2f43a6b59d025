package nn

import (
	"fmt"
	"strings"

	"go.starlark.net/starlark"

	startensor "github.com/memsh/memsh/starlib/tensor"
	"github.com/memsh/memsh/tensor"
	"github.com/memsh/memsh/tensor/optim"
)

type moduleMethod func(thread *starlark.Thread, fname string, m *Layer, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error)

var moduleMethods map[string]moduleMethod

func init() {
	moduleMethods = map[string]moduleMethod{
		"parameters":       tensorsMethod(kindParam, false),
		"named_parameters": tensorsMethod(kindParam, true),
		"buffers":          tensorsMethod(kindBuffer, false),
		"named_buffers":    tensorsMethod(kindBuffer, true),
		"children":         childrenMethod(false),
		"named_children":   childrenMethod(true),
		"modules":          modulesMethod(false),
		"named_modules":    modulesMethod(true),
		"train":            methodTrain,
		"eval": func(thread *starlark.Thread, f string, m *Layer, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
			if err := starlark.UnpackArgs(f, args, kwargs); err != nil {
				return nil, err
			}
			return setTraining(m, false), nil
		},
		"to":             methodTo,
		"requires_grad_": methodRequiresGrad,
		"num_parameters": methodNumParameters,
		"enable_input_require_grads": func(thread *starlark.Thread, f string, m *Layer, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
			return starlark.None, setInputRequireGrads(f, m, args, kwargs, true)
		},
		"disable_input_require_grads": func(thread *starlark.Thread, f string, m *Layer, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
			return starlark.None, setInputRequireGrads(f, m, args, kwargs, false)
		},
		"gradient_checkpointing_enable": func(thread *starlark.Thread, f string, m *Layer, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
			return starlark.None, setGradientCheckpointing(f, m, args, kwargs, true)
		},
		"gradient_checkpointing_disable": func(thread *starlark.Thread, f string, m *Layer, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
			return starlark.None, setGradientCheckpointing(f, m, args, kwargs, false)
		},
		"zero_grad":       methodZeroGrad,
		"to_empty":        methodToEmpty,
		"register_buffer": methodRegisterBuffer,
		"forward": func(thread *starlark.Thread, f string, m *Layer, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
			return m.CallInternal(thread, args, kwargs)
		},
	}
}

// pureMethods are the module methods that only read the module (they
// make new lists and tuples of what it holds): declared pure
// (starlark.Builtin.DeclarePure), so that calling them keeps the reclaim's
// kept frames.
var pureMethods = map[string]bool{
	"parameters": true, "named_parameters": true, "buffers": true, "named_buffers": true,
	"children": true, "named_children": true, "modules": true, "named_modules": true,
	"num_parameters": true,
}

// tensorsMethod is parameters()/named_parameters()/buffers()/named_buffers():
// a list of tensors, or of (name, tensor) tuples with PyTorch's dotted names.
func tensorsMethod(kind entryKind, named bool) moduleMethod {
	return func(thread *starlark.Thread, f string, m *Layer, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
		prefix, recurse := "", true
		if named {
			if err := starlark.UnpackArgs(f, args, kwargs, "prefix?", &prefix, "recurse?", &recurse); err != nil {
				return nil, err
			}
			if prefix != "" {
				prefix += "."
			}
		} else if err := starlark.UnpackArgs(f, args, kwargs, "recurse?", &recurse); err != nil {
			return nil, err
		}
		names, ts := m.namedTensors(kind, prefix, recurse)
		out := make([]starlark.Value, len(ts))
		for i, t := range ts {
			if named {
				out[i] = starlark.Tuple{starlark.String(names[i]), t}
			} else {
				out[i] = t
			}
		}
		return starlark.NewList(out), nil
	}
}

func childrenMethod(named bool) moduleMethod {
	return func(thread *starlark.Thread, f string, m *Layer, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
		if err := starlark.UnpackArgs(f, args, kwargs); err != nil {
			return nil, err
		}
		var out []starlark.Value
		seen := map[*Layer]bool{}
		for _, n := range m.names {
			if m.kinds[n] != kindModule {
				continue
			}
			c := m.entry(n).(*Layer)
			if seen[c] {
				continue
			}
			seen[c] = true
			if named {
				out = append(out, starlark.Tuple{starlark.String(n), c})
			} else {
				out = append(out, c)
			}
		}
		return starlark.NewList(out), nil
	}
}

func modulesMethod(named bool) moduleMethod {
	return func(thread *starlark.Thread, f string, m *Layer, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
		if err := starlark.UnpackArgs(f, args, kwargs); err != nil {
			return nil, err
		}
		names, mods := m.modulesPreorder("")
		out := make([]starlark.Value, len(mods))
		for i, c := range mods {
			if named {
				out[i] = starlark.Tuple{starlark.String(names[i]), c}
			} else {
				out[i] = c
			}
		}
		return starlark.NewList(out), nil
	}
}

func methodTrain(thread *starlark.Thread, f string, m *Layer, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	mode := true
	if err := starlark.UnpackArgs(f, args, kwargs, "mode?", &mode); err != nil {
		return nil, err
	}
	return setTraining(m, mode), nil
}

func setTraining(m *Layer, mode bool) *Layer {
	_, mods := m.modulesPreorder("")
	for _, c := range mods {
		c.training = mode
	}
	return m
}

// methodTo is Module.to(device=None, dtype=None): every parameter and
// buffer is converted in place (the same tensor objects, so optimizers and
// tied weights follow); gradients move with their parameters; only
// floating-point tensors change dtype.
func methodTo(thread *starlark.Thread, f string, m *Layer, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	var devV, dtV starlark.Value = starlark.None, starlark.None
	if err := starlark.UnpackArgs(f, args, kwargs, "device?", &devV, "dtype?", &dtV); err != nil {
		return nil, err
	}
	device, dt, err := deviceDType(thread, f, devV, dtV)
	if err != nil {
		return nil, err
	}
	for _, kind := range []entryKind{kindParam, kindBuffer} {
		_, ts := m.namedTensors(kind, "", true)
		for _, t := range ts {
			if err := convertInPlace(t.Engine(), device, dt); err != nil {
				return nil, fmt.Errorf("%s: %w", f, err)
			}
		}
	}
	return m, nil
}

// convertInPlace replaces t's data with a converted copy (param.data = ...).
func convertInPlace(t *tensor.Tensor, device string, dt tensor.DType) error {
	target := dt
	if target == tensor.Undefined || !t.DType().IsFloat() {
		target = t.DType()
	}
	c, err := tensor.To(t, device, target, false)
	if err != nil {
		return err
	}
	if c != t {
		// the old data is garbage unless something else holds it (which
		// the reclaim's walk reaches): this Go code holds it no more
		old := t.Memory()
		t.SetData(c)
		if old != nil {
			t.Context().Manager.Dropped(old)
		}
	}
	if g := t.Autograd(); g != nil && g.Grad != nil {
		gc, err := tensor.To(g.Grad, device, target, false)
		if err != nil {
			return err
		}
		if old := g.Grad; gc != old {
			g.Grad = gc
			tensor.Dropped(old)
		}
	}
	return nil
}

// methodToEmpty is Module.to_empty(device=None, recurse=True): the
// parameters and buffers made on the meta device (tensor.meta_device) get
// memory on their device, uninitialized — children first, then each
// module's parameters and buffers, as nn.Module._apply goes; a module
// fully_shard sharded materializes its shards. A meta tensor gets its
// memory on device (the one it was made for when None); moving a tensor
// that has memory to another device is not modelled.
func methodToEmpty(thread *starlark.Thread, f string, m *Layer, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	var devV starlark.Value = starlark.None
	recurse := true
	if err := starlark.UnpackArgs(f, args, kwargs, "device?", &devV, "recurse?", &recurse); err != nil {
		return nil, err
	}
	want := ""
	if devV != starlark.None {
		s, ok := starlark.AsString(devV)
		if !ok {
			return nil, fmt.Errorf("%s: device: got %s, want str", f, devV.Type())
		}
		want = s
	}
	// A Quiet region (backend.Manager.Quiet): it runs no Starlark and
	// lets go of nothing, so exact mode reclaims before a peak only when
	// something may have become garbage, not at each parameter.
	c, err := ctxOf(thread, f)
	if err != nil {
		return nil, err
	}
	if c.Manager != nil {
		defer c.Manager.Quiet()()
	}
	var walk func(x *Layer)
	walk = func(x *Layer) {
		for i, n := range x.names {
			if c, ok := x.vals[i].(*Layer); ok && x.kinds[n] == kindModule && recurse && err == nil {
				walk(c)
			}
		}
		for i, n := range x.names {
			if k := x.kinds[n]; (k != kindParam && k != kindBuffer) || err != nil {
				continue
			}
			t, ok := x.vals[i].(*startensor.Tensor)
			if !ok {
				continue
			}
			e := t.Engine()
			if want != "" && !tensor.Deferred(e) && !strings.HasPrefix(e.Device(), strings.TrimSuffix(want, ":0")) {
				err = fmt.Errorf("%s: moving %s from %s to %s is not modelled (make it on that device under tensor.meta_device)", f, n, e.Device(), want)
				return
			}
			if err = tensor.MaterializeOn(e, want); err != nil {
				err = fmt.Errorf("%s: %w", f, err)
			}
		}
	}
	walk(m)
	if err != nil {
		return nil, err
	}
	return m, nil
}

func methodZeroGrad(thread *starlark.Thread, f string, m *Layer, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	setToNone := true
	if err := starlark.UnpackArgs(f, args, kwargs, "set_to_none?", &setToNone); err != nil {
		return nil, err
	}
	return starlark.None, optim.ZeroGrad(m.Parameters(), setToNone)
}

func methodRegisterBuffer(thread *starlark.Thread, f string, m *Layer, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	var name string
	var v starlark.Value
	if err := starlark.UnpackArgs(f, args, kwargs, "name", &name, "tensor", &v); err != nil {
		return nil, err
	}
	switch v := v.(type) {
	case *startensor.Tensor:
		m.set(name, v, kindBuffer)
	case starlark.NoneType:
		m.set(name, v, kindBuffer)
	default:
		return nil, fmt.Errorf("%s: cannot assign '%s' object to buffer '%s' (torch Tensor or None required)", f, v.Type(), name)
	}
	return starlark.None, nil
}
