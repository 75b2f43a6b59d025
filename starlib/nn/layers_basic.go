package nn

import (
	"fmt"
	"math"
	"strings"

	"go.starlark.net/starlark"

	"github.com/memsh/memsh/env"
	startensor "github.com/memsh/memsh/starlib/tensor"
	"github.com/memsh/memsh/tensor"
	"github.com/memsh/memsh/tensor/autograd"
	tnn "github.com/memsh/memsh/tensor/nn"
)

func init() {
	registerPure("Linear", newLinear)
	registerPure("Sequential", newSequential)
	registerPure("ModuleList", newModuleList)
	registerPure("Parameter", newParameterBuiltin) // a new tensor (autograd.Detach's) over data's storage
	registerPure("Module", newUserModule)
	registerPure("Flatten", newFlatten)
	register("Identity", func(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
		return identityLayer(), nil
	})
}

// identityLayer is an nn.Identity module.
func identityLayer() *Layer {
	m := newModule("Identity")
	m.forward = func(thread *starlark.Thread, m *Layer, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
		var x starlark.Value
		if err := starlark.UnpackPositionalArgs("Identity", args, kwargs, 1, &x); err != nil {
			return nil, err
		}
		return x, nil
	}
	return m
}

// ctxOf returns the Session's tensor context.
func ctxOf(thread *starlark.Thread, fname string) (*tensor.Context, error) {
	e, err := env.Of(thread, fname)
	if err != nil {
		return nil, err
	}
	return startensor.Context(e), nil
}

// deviceDType reads device= and dtype= (None: the defaults).
func deviceDType(thread *starlark.Thread, fname string, devV, dtV starlark.Value) (string, tensor.DType, error) {
	device := ""
	if devV != nil && devV != starlark.None {
		s, ok := starlark.AsString(devV)
		if !ok {
			return "", tensor.Undefined, fmt.Errorf("%s: device: got %s, want str", fname, devV.Type())
		}
		device = s
	}
	dt := tensor.Undefined
	if dtV != nil && dtV != starlark.None {
		s, ok := starlark.AsString(dtV)
		if !ok {
			return "", tensor.Undefined, fmt.Errorf("%s: dtype: got %s, want str", fname, dtV.Type())
		}
		d, ok := tensor.ParseDType(strings.TrimPrefix(s, "torch."))
		if !ok {
			return "", tensor.Undefined, fmt.Errorf("%s: dtype: unknown dtype %q", fname, s)
		}
		dt = d
	}
	return device, dt, nil
}

// factory resolves device/dtype for a layer's parameters: the Session's
// default device and float32 unless given.
func factory(thread *starlark.Thread, fname string, devV, dtV starlark.Value) (*tensor.Context, string, tensor.DType, error) {
	c, err := ctxOf(thread, fname)
	if err != nil {
		return nil, "", tensor.Undefined, err
	}
	device, dt, err := deviceDType(thread, fname, devV, dtV)
	if err != nil {
		return nil, "", tensor.Undefined, err
	}
	if device, err = c.Device(device); err != nil {
		return nil, "", tensor.Undefined, fmt.Errorf("%s: %w", fname, err)
	}
	if dt == tensor.Undefined {
		dt = tensor.Float32
	}
	if !dt.IsFloat() {
		return nil, "", tensor.Undefined, fmt.Errorf("%s: only Tensors of floating point dtype can require gradients", fname)
	}
	return c, device, dt, nil
}

func positive(fname, param string, v int) error {
	if v <= 0 {
		return fmt.Errorf("%s: %s: must be positive, got %d", fname, param, v)
	}
	return nil
}

// tensorArg unpacks a tensor argument.
func tensorArg(fname, param string, v starlark.Value) (*tensor.Tensor, error) {
	t, ok := v.(*startensor.Tensor)
	if !ok {
		return nil, fmt.Errorf("%s: %s: got %s, want tensor", fname, param, v.Type())
	}
	return t.Engine(), nil
}

// optTensorArg unpacks a tensor or None.
func optTensorArg(fname, param string, v starlark.Value) (*tensor.Tensor, error) {
	if v == nil || v == starlark.None {
		return nil, nil
	}
	return tensorArg(fname, param, v)
}

func wrap(t *tensor.Tensor, err error) (starlark.Value, error) {
	if err != nil {
		return nil, err
	}
	return startensor.Wrap(t), nil
}

// newLinear is nn.Linear: weight [out_features, in_features] and bias
// [out_features], both initialised as PyTorch's reset_parameters
// (kaiming_uniform_ with a=√5, i.e. U(-1/√in, 1/√in), and the same bound
// for the bias).
func newLinear(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	var in, out int
	bias := true
	var devV, dtV starlark.Value = starlark.None, starlark.None
	if err := starlark.UnpackArgs(b.Name(), args, kwargs, "in_features", &in, "out_features", &out, "bias?", &bias, "device?", &devV, "dtype?", &dtV); err != nil {
		return nil, err
	}
	if in < 0 || out < 0 {
		return nil, fmt.Errorf("%s: in_features and out_features must be non-negative, got %d and %d", b.Name(), in, out)
	}
	c, device, dt, err := factory(thread, b.Name(), devV, dtV)
	if err != nil {
		return nil, err
	}
	w, bs, err := tnn.NewLinearParams(c, in, out, bias, device, dt)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", b.Name(), err)
	}
	return linearLayer(w, bs), nil
}

// linearLayer is an nn.Linear module over weight w [out, in] and bias bs
// (nil: bias=False).
func linearLayer(w, bs *tensor.Tensor) *Layer {
	out, in := w.Shape()[0], w.Shape()[1]
	m := newModule("Linear")
	m.param("weight", w)
	m.param("bias", bs)
	m.set("in_features", starlark.MakeInt(in), kindAttr)
	m.set("out_features", starlark.MakeInt(out), kindAttr)
	m.extra = func(m *Layer) string {
		return fmt.Sprintf("in_features=%d, out_features=%d, bias=%s", in, out, pyBool(m.tensorOf("bias") != nil))
	}
	m.forward = func(thread *starlark.Thread, m *Layer, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
		var x starlark.Value
		if err := starlark.UnpackPositionalArgs("Linear", args, kwargs, 1, &x); err != nil {
			return nil, err
		}
		xt, err := tensorArg("Linear", "input", x)
		if err != nil {
			return nil, err
		}
		if m.z3 != nil {
			// a ZeRO-3 model's F.linear: zero3_linear_wrap
			return wrap(autograd.LinearZeRO3(xt, m.tensorOf("weight"), m.tensorOf("bias")))
		}
		return wrap(autograd.Linear(xt, m.tensorOf("weight"), m.tensorOf("bias")))
	}
	return m
}

func pyBool(b bool) string {
	if b {
		return "True"
	}
	return "False"
}

// newSequential is nn.Sequential(*modules): children "0", "1", ...; calling
// it feeds each module's output to the next.
func newSequential(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	if len(kwargs) > 0 {
		return nil, fmt.Errorf("%s: unexpected keyword argument %s", b.Name(), kwargs[0][0])
	}
	m := newModule("Sequential")
	m.indexed = true
	for i, a := range args {
		c, ok := a.(*Layer)
		if !ok {
			return nil, fmt.Errorf("%s: %s is not a Module subclass", b.Name(), a.Type())
		}
		m.child(fmt.Sprint(i), c)
	}
	m.forward = func(thread *starlark.Thread, m *Layer, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
		var x starlark.Value
		if err := starlark.UnpackPositionalArgs("Sequential", args, kwargs, 1, &x); err != nil {
			return nil, err
		}
		thread.DeclareTransparent() // x is the argument of the child running
		for _, v := range m.vals {
			c, ok := v.(*Layer)
			if !ok {
				continue
			}
			var err error
			if x, err = starlark.Call(thread, c, starlark.Tuple{x}, nil); err != nil {
				return nil, err
			}
		}
		return x, nil
	}
	return m, nil
}

// newModuleList is nn.ModuleList(modules=None): an indexable list of
// modules registered as children "0", "1", ... (no forward).
func newModuleList(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	var mods starlark.Value = starlark.None
	if err := starlark.UnpackArgs(b.Name(), args, kwargs, "modules?", &mods); err != nil {
		return nil, err
	}
	m := newModule("ModuleList")
	m.indexed = true
	if mods != starlark.None {
		it, ok := mods.(starlark.Iterable)
		if !ok {
			return nil, fmt.Errorf("%s: modules: got %s, want an iterable of modules", b.Name(), mods.Type())
		}
		iter := it.Iterate()
		defer iter.Done()
		var v starlark.Value
		for i := 0; iter.Next(&v); i++ {
			c, ok := v.(*Layer)
			if !ok {
				return nil, fmt.Errorf("%s: %s is not a Module subclass", b.Name(), v.Type())
			}
			m.child(fmt.Sprint(i), c)
		}
	}
	return m, nil
}

// newParameterBuiltin is nn.Parameter(data, requires_grad=True): a leaf
// sharing data's storage, registered as a parameter when assigned to a
// module.
func newParameterBuiltin(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	var data starlark.Value
	requiresGrad := true
	if err := starlark.UnpackArgs(b.Name(), args, kwargs, "data", &data, "requires_grad?", &requiresGrad); err != nil {
		return nil, err
	}
	t, err := tensorArg(b.Name(), "data", data)
	if err != nil {
		return nil, err
	}
	p := autograd.Detach(t)
	if _, err := newParameter(p, requiresGrad); err != nil {
		return nil, fmt.Errorf("%s: %w", b.Name(), err)
	}
	return startensor.Wrap(p), nil
}

// newUserModule is nn.Module(forward, **children): a user-defined module
// whose forward(self, *args, **kwargs) receives the module; children
// (modules, parameters, tensors as buffers, other values as attributes)
// are reachable as attributes, in keyword order.
func newUserModule(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	if len(args) != 1 {
		return nil, fmt.Errorf("%s: want forward as the only positional argument, got %d", b.Name(), len(args))
	}
	fwd, ok := args[0].(starlark.Callable)
	if !ok {
		return nil, fmt.Errorf("%s: forward: got %s, want a function", b.Name(), args[0].Type())
	}
	m := newModule("Module")
	if f, ok := fwd.(*starlark.Function); ok {
		m.typ = f.Name()
		if m.typ == "forward" || m.typ == "lambda" {
			m.typ = "Module"
		}
	}
	m.userForward = fwd
	for _, kv := range kwargs {
		name := string(kv[0].(starlark.String))
		switch v := kv[1].(type) {
		case *Layer:
			m.child(name, v)
		case *startensor.Tensor:
			if isParameter(v.Engine()) {
				m.set(name, v, kindParam)
			} else {
				m.set(name, v, kindBuffer)
			}
		default:
			m.set(name, v, kindAttr)
		}
	}
	return m, nil
}

// newFlatten is nn.Flatten(start_dim=1, end_dim=-1).
func newFlatten(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	start, end := 1, -1
	if err := starlark.UnpackArgs(b.Name(), args, kwargs, "start_dim?", &start, "end_dim?", &end); err != nil {
		return nil, err
	}
	m := newModule("Flatten")
	m.extra = func(*Layer) string { return fmt.Sprintf("start_dim=%d, end_dim=%d", start, end) }
	m.forward = func(thread *starlark.Thread, m *Layer, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
		var x starlark.Value
		if err := starlark.UnpackPositionalArgs("Flatten", args, kwargs, 1, &x); err != nil {
			return nil, err
		}
		xt, err := tensorArg("Flatten", "input", x)
		if err != nil {
			return nil, err
		}
		return wrap(autograd.Flatten(xt, start, end))
	}
	return m, nil
}

// activation registers a parameterless layer and its functional form.
// activation registers nn.<name> and nn.functional.<fname>: f out of
// place; with inplace (nn.ReLU(inplace=True), F.relu(x, inplace=True))
// when inPlace is not nil, which rewrites the input and returns it. Without
// inPlace there is no inplace parameter (nn.Tanh(), nn.Sigmoid()).
func activation(name, fname string, f, inPlace func(*tensor.Tensor) (*tensor.Tensor, error)) {
	pick := func(inplace bool) func(*tensor.Tensor) (*tensor.Tensor, error) {
		if inplace {
			return inPlace
		}
		return f
	}
	register(name, func(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
		inplace := false
		var err error
		if inPlace != nil {
			err = starlark.UnpackArgs(b.Name(), args, kwargs, "inplace?", &inplace)
		} else {
			err = starlark.UnpackArgs(b.Name(), args, kwargs)
		}
		if err != nil {
			return nil, err
		}
		op := pick(inplace)
		m := newModule(name)
		m.forward = func(thread *starlark.Thread, m *Layer, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
			var x starlark.Value
			if err := starlark.UnpackPositionalArgs(name, args, kwargs, 1, &x); err != nil {
				return nil, err
			}
			xt, err := tensorArg(name, "input", x)
			if err != nil {
				return nil, err
			}
			if inplace {
				defer inPlaceCall(thread)()
			}
			return wrap(op(xt))
		}
		return m, nil
	})
	if fname != "" {
		registerF(fname, func(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
			var x starlark.Value
			inplace := false
			var err error
			if inPlace != nil {
				err = starlark.UnpackArgs(b.Name(), args, kwargs, "input", &x, "inplace?", &inplace)
			} else {
				err = starlark.UnpackArgs(b.Name(), args, kwargs, "input", &x)
			}
			if err != nil {
				return nil, err
			}
			xt, err := tensorArg(b.Name(), "input", x)
			if err != nil {
				return nil, err
			}
			if inplace {
				defer inPlaceCall(thread)()
			}
			return wrap(pick(inplace)(xt))
		})
	}
}

func init() {
	activation("ReLU", "relu", autograd.Relu, autograd.Relu_)
	activation("Tanh", "tanh", autograd.Tanh, nil)
	activation("Sigmoid", "sigmoid", autograd.Sigmoid, nil)
	registerF("linear", func(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
		var x, w starlark.Value
		var bias starlark.Value = starlark.None
		if err := starlark.UnpackArgs(b.Name(), args, kwargs, "input", &x, "weight", &w, "bias?", &bias); err != nil {
			return nil, err
		}
		xt, err := tensorArg(b.Name(), "input", x)
		if err != nil {
			return nil, err
		}
		wt, err := tensorArg(b.Name(), "weight", w)
		if err != nil {
			return nil, err
		}
		bt, err := optTensorArg(b.Name(), "bias", bias)
		if err != nil {
			return nil, err
		}
		return wrap(autograd.Linear(xt, wt, bt))
	})
	_ = math.Sqrt
}
