package nn

import (
	"fmt"
	"strings"

	"go.starlark.net/starlark"

	startensor "github.com/memsh/memsh/starlib/tensor"
	"github.com/memsh/memsh/tensor"
	"github.com/memsh/memsh/tensor/autograd"
)

// Activations and softmax (each float32/float16/bfloat16/float64; the
// result has the input's shape and dtype, numel × itemsize bytes):
//
//	nn.GELU(approximate="none")        gelu(x) = x·Φ(x), or the tanh approximation; saved as in
//	                                   PyTorch's derivatives.yaml for gelu: the input
//	nn.SiLU()                          x·σ(x); saves the input (silu)
//	nn.functional.gelu(input, approximate="none")  nn.functional.silu(input, inplace=False)
//	nn.functional.softmax(input, dim=None, dtype=None)   along dim; saves the result (_softmax)
//	nn.functional.log_softmax(input, dim=None, dtype=None)  saves the result (_log_softmax)
//
// Their backward kernels (gelu_backward, silu_backward,
// _softmax_backward_data, _log_softmax_backward_data) allocate one
// tensor of the input's size.
func init() {
	registerPure("GELU", newGELU)
	registerF("gelu", func(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
		var x starlark.Value
		approximate := "none"
		if err := starlark.UnpackArgs(b.Name(), args, kwargs, "input", &x, "approximate?", &approximate); err != nil {
			return nil, err
		}
		return gelu(b.Name(), x, approximate)
	})
	// inplace=True is accepted and computed out of place (x is not
	// rewritten): PyTorch's silu_ with grad saves a clone of the input
	// (original_self), so the memory is the same
	activation("SiLU", "silu", autograd.Silu, autograd.Silu)
	registerF("softmax", softmaxBuiltin(false))
	registerF("log_softmax", softmaxBuiltin(true))
}

// gelu checks approximate and runs the op.
func gelu(fname string, x starlark.Value, approximate string) (starlark.Value, error) {
	xt, err := tensorArg(fname, "input", x)
	if err != nil {
		return nil, err
	}
	if approximate != "none" && approximate != "tanh" {
		return nil, fmt.Errorf("%s: approximate argument must be either none or tanh.", fname)
	}
	return wrapAs(fname)(autograd.Gelu(xt, approximate))
}

// wrapAs wraps an engine result, naming an engine error after fname.
func wrapAs(fname string) func(*tensor.Tensor, error) (starlark.Value, error) {
	return func(t *tensor.Tensor, err error) (starlark.Value, error) {
		if err != nil {
			return nil, renameErr(err, fname)
		}
		return startensor.Wrap(t), nil
	}
}

// renameErr gives an engine error (its "tensor.op: " prefix) the name of
// the builtin; other errors get the name prefixed.
func renameErr(err error, fname string) error {
	if _, ok := err.(*tensor.Error); ok {
		return tensor.Renamed(err, fname)
	}
	if strings.HasPrefix(err.Error(), fname+": ") {
		return err
	}
	return fmt.Errorf("%s: %w", fname, err)
}

// newGELU is nn.GELU(approximate="none"); the approximate string is
// checked when the module runs, as PyTorch.
func newGELU(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	approximate := "none"
	if err := starlark.UnpackArgs(b.Name(), args, kwargs, "approximate?", &approximate); err != nil {
		return nil, err
	}
	m := newModule("GELU")
	m.set("approximate", starlark.String(approximate), kindAttr)
	m.extra = func(*Layer) string { return "approximate=" + pyRepr(approximate) }
	m.forward = func(thread *starlark.Thread, m *Layer, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
		var x starlark.Value
		if err := starlark.UnpackPositionalArgs("GELU", args, kwargs, 1, &x); err != nil {
			return nil, err
		}
		a, _ := starlark.AsString(m.entry("approximate"))
		return gelu("GELU", x, a)
	}
	return m, nil
}

// pyRepr quotes s as Python's repr of a str ('none').
func pyRepr(s string) string { return "'" + strings.ReplaceAll(s, "'", "\\'") + "'" }

// softmaxDim is F._get_softmax_dim: an explicit dim, or (deprecated
// implicit choice) 0 for 0-, 1- and 3-dimensional inputs, else 1.
func softmaxDim(dimV starlark.Value, ndim int) (int, error) {
	if dimV == nil || dimV == starlark.None {
		if ndim == 0 || ndim == 1 || ndim == 3 {
			return 0, nil
		}
		return 1, nil
	}
	var d int
	if err := starlark.AsInt(dimV, &d); err != nil {
		return 0, fmt.Errorf("for parameter dim: got %s, want int or None", dimV.Type())
	}
	return d, nil
}

// softmaxBuiltin is nn.functional.softmax / log_softmax(input, dim=None,
// _stacklevel=3, dtype=None).
func softmaxBuiltin(log bool) builtinFn {
	return func(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
		var x, dimV, dtV starlark.Value = nil, starlark.None, starlark.None
		if err := starlark.UnpackArgs(b.Name(), args, kwargs, "input", &x, "dim?", &dimV, "_stacklevel?", new(int), "dtype?", &dtV); err != nil {
			return nil, err
		}
		xt, err := tensorArg(b.Name(), "input", x)
		if err != nil {
			return nil, err
		}
		d, err := softmaxDim(dimV, xt.Dim())
		if err != nil {
			return nil, fmt.Errorf("%s: %w", b.Name(), err)
		}
		dt := tensor.Undefined
		if d, ok := dtV.(startensor.DType); ok {
			dt = tensor.DType(d)
		} else if _, dt, err = deviceDType(thread, b.Name(), nil, dtV); err != nil {
			return nil, err
		}
		return wrapAs(b.Name())(autograd.SoftmaxDType(xt, d, dt, log))
	}
}
