package nn

import (
	"fmt"
	"strings"

	"go.starlark.net/starlark"

	"github.com/memsh/memsh/tensor"
	"github.com/memsh/memsh/tensor/autograd"
	tnn "github.com/memsh/memsh/tensor/nn"
)

// Normalisation layers over the trailing normalized_shape dimensions:
//
//	nn.LayerNorm(normalized_shape, eps=1e-05, elementwise_affine=True, bias=True, device=None, dtype=None)
//	    weight ones, bias zeros (normalized_shape each)
//	nn.functional.layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-05)
//	    native_layer_norm: output (input's shape and dtype) plus mean and rstd (float32 for
//	    float32/float16/bfloat16 inputs, one per row: 4 bytes × rows each), saved as in
//	    PyTorch's derivatives.yaml for native_layer_norm (input, weight, bias, mean, rstd)
//	nn.RMSNorm(normalized_shape, eps=None, elementwise_affine=True, device=None, dtype=None)
//	    weight ones
//	nn.functional.rms_norm(input, normalized_shape, weight=None, eps=None)
//	    PyTorch 2.x's decomposition: pow(2), mean(keepdim), add_(eps), rsqrt, mul, mul(weight)
//	    in the input's opmath dtype (float32 for half types), each node saving what
//	    derivatives.yaml saves; eps=None is the opmath dtype's machine epsilon
//
// normalized_shape is an int or a list/tuple of ints.
func init() {
	registerPure("LayerNorm", newLayerNorm)
	registerPure("RMSNorm", newRMSNorm)
	registerF("layer_norm", func(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
		var x, ns starlark.Value
		var wV, bV starlark.Value = starlark.None, starlark.None
		eps := 1e-05
		if err := starlark.UnpackArgs(b.Name(), args, kwargs, "input", &x, "normalized_shape", &ns, "weight?", &wV, "bias?", &bV, "eps?", &eps); err != nil {
			return nil, err
		}
		xt, err := tensorArg(b.Name(), "input", x)
		if err != nil {
			return nil, err
		}
		shape, err := normalizedShapeArg(b.Name(), ns)
		if err != nil {
			return nil, err
		}
		wt, err := optTensorArg(b.Name(), "weight", wV)
		if err != nil {
			return nil, err
		}
		bt, err := optTensorArg(b.Name(), "bias", bV)
		if err != nil {
			return nil, err
		}
		return wrapAs(b.Name())(autograd.LayerNorm(xt, shape, wt, bt, eps))
	})
	registerF("rms_norm", func(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
		var x, ns starlark.Value
		var wV, epsV starlark.Value = starlark.None, starlark.None
		if err := starlark.UnpackArgs(b.Name(), args, kwargs, "input", &x, "normalized_shape", &ns, "weight?", &wV, "eps?", &epsV); err != nil {
			return nil, err
		}
		xt, err := tensorArg(b.Name(), "input", x)
		if err != nil {
			return nil, err
		}
		shape, err := normalizedShapeArg(b.Name(), ns)
		if err != nil {
			return nil, err
		}
		wt, err := optTensorArg(b.Name(), "weight", wV)
		if err != nil {
			return nil, err
		}
		eps, err := optEps(b.Name(), epsV)
		if err != nil {
			return nil, err
		}
		return wrapAs(b.Name())(autograd.RMSNorm(xt, shape, wt, eps))
	})
}

// normalizedShapeArg reads an int or a list/tuple of ints (each >= 0).
func normalizedShapeArg(fname string, v starlark.Value) ([]int, error) {
	if i, ok := v.(starlark.Int); ok {
		n, ok := i.Int64()
		if !ok || n < 0 {
			return nil, fmt.Errorf("%s: normalized_shape: invalid size %s", fname, i)
		}
		return []int{int(n)}, nil
	}
	var elems []starlark.Value
	switch s := v.(type) {
	case starlark.Tuple:
		elems = s
	case *starlark.List:
		for i := range s.Len() {
			elems = append(elems, s.Index(i))
		}
	default:
		return nil, fmt.Errorf("%s: normalized_shape: got %s, want int, list or tuple of ints", fname, v.Type())
	}
	shape := make([]int, len(elems))
	for k, e := range elems {
		i, ok := e.(starlark.Int)
		if !ok {
			return nil, fmt.Errorf("%s: normalized_shape: element %d: got %s, want int", fname, k, e.Type())
		}
		n, ok := i.Int64()
		if !ok || n < 0 {
			return nil, fmt.Errorf("%s: normalized_shape: invalid size %s", fname, i)
		}
		shape[k] = int(n)
	}
	return shape, nil
}

// optEps reads eps=None or a number.
func optEps(fname string, v starlark.Value) (*float64, error) {
	if v == nil || v == starlark.None {
		return nil, nil
	}
	f, ok := starlark.AsFloat(v)
	if !ok {
		return nil, fmt.Errorf("%s: eps: got %s, want float or None", fname, v.Type())
	}
	return &f, nil
}

// shapeTuple prints a shape as Python's tuple repr: "(1024,)", "(4, 8)".
func shapeTuple(s []int) string {
	parts := make([]string, len(s))
	for i, v := range s {
		parts[i] = fmt.Sprint(v)
	}
	if len(s) == 1 {
		return "(" + parts[0] + ",)"
	}
	return "(" + strings.Join(parts, ", ") + ")"
}

// normParams makes a norm layer's weight (ones) and, with bias, its bias
// (zeros), both parameters of shape.
func normParams(thread *starlark.Thread, fname string, shape []int, affine, bias bool, devV, dtV starlark.Value) (w, b *tensor.Tensor, err error) {
	c, device, dt, err := factory(thread, fname, devV, dtV)
	if err != nil {
		return nil, nil, err
	}
	if !affine {
		return nil, nil, nil
	}
	if w, err = tnn.Filled(c, shape, 1, device, dt, true); err != nil {
		return nil, nil, fmt.Errorf("%s: %w", fname, err)
	}
	defer c.Hold(w)() // reachable while the bias is allocated
	if bias {
		if b, err = tnn.Filled(c, shape, 0, device, dt, true); err != nil {
			return nil, nil, fmt.Errorf("%s: %w", fname, err)
		}
	}
	return w, b, nil
}

// newLayerNorm is nn.LayerNorm: parameters weight and bias (None when
// elementwise_affine=False; bias None when bias=False).
func newLayerNorm(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	var ns starlark.Value
	eps, affine, bias := 1e-05, true, true
	var devV, dtV starlark.Value = starlark.None, starlark.None
	if err := starlark.UnpackArgs(b.Name(), args, kwargs, "normalized_shape", &ns, "eps?", &eps, "elementwise_affine?", &affine,
		"bias?", &bias, "device?", &devV, "dtype?", &dtV); err != nil {
		return nil, err
	}
	shape, err := normalizedShapeArg(b.Name(), ns)
	if err != nil {
		return nil, err
	}
	w, bs, err := normParams(thread, b.Name(), shape, affine, bias, devV, dtV)
	if err != nil {
		return nil, err
	}
	m := newModule("LayerNorm")
	m.param("weight", w)
	m.param("bias", bs)
	m.set("normalized_shape", shapeValue(shape), kindAttr)
	m.set("eps", starlark.Float(eps), kindAttr)
	m.set("elementwise_affine", starlark.Bool(affine), kindAttr)
	m.extra = func(*Layer) string {
		return fmt.Sprintf("%s, eps=%s, elementwise_affine=%s", shapeTuple(shape), pyFloatRepr(eps), pyBool(affine))
	}
	m.forward = func(thread *starlark.Thread, m *Layer, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
		var x starlark.Value
		if err := starlark.UnpackPositionalArgs("LayerNorm", args, kwargs, 1, &x); err != nil {
			return nil, err
		}
		xt, err := tensorArg("LayerNorm", "input", x)
		if err != nil {
			return nil, err
		}
		return wrapAs("LayerNorm")(autograd.LayerNorm(xt, shape, m.tensorOf("weight"), m.tensorOf("bias"), eps))
	}
	return m, nil
}

// newRMSNorm is nn.RMSNorm: parameter weight (None when
// elementwise_affine=False).
func newRMSNorm(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	var ns starlark.Value
	var epsV starlark.Value = starlark.None
	affine := true
	var devV, dtV starlark.Value = starlark.None, starlark.None
	if err := starlark.UnpackArgs(b.Name(), args, kwargs, "normalized_shape", &ns, "eps?", &epsV, "elementwise_affine?", &affine,
		"device?", &devV, "dtype?", &dtV); err != nil {
		return nil, err
	}
	shape, err := normalizedShapeArg(b.Name(), ns)
	if err != nil {
		return nil, err
	}
	eps, err := optEps(b.Name(), epsV)
	if err != nil {
		return nil, err
	}
	w, _, err := normParams(thread, b.Name(), shape, affine, false, devV, dtV)
	if err != nil {
		return nil, err
	}
	m := newModule("RMSNorm")
	m.param("weight", w)
	m.set("normalized_shape", shapeValue(shape), kindAttr)
	m.set("eps", epsV, kindAttr)
	m.set("elementwise_affine", starlark.Bool(affine), kindAttr)
	m.extra = func(*Layer) string {
		e := "None"
		if eps != nil {
			e = pyFloatRepr(*eps)
		}
		return fmt.Sprintf("%s, eps=%s, elementwise_affine=%s", shapeTuple(shape), e, pyBool(affine))
	}
	m.forward = func(thread *starlark.Thread, m *Layer, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
		var x starlark.Value
		if err := starlark.UnpackPositionalArgs("RMSNorm", args, kwargs, 1, &x); err != nil {
			return nil, err
		}
		xt, err := tensorArg("RMSNorm", "input", x)
		if err != nil {
			return nil, err
		}
		return wrapAs("RMSNorm")(autograd.RMSNorm(xt, shape, m.tensorOf("weight"), eps))
	}
	return m, nil
}

// shapeValue is a shape as a Starlark tuple of ints.
func shapeValue(s []int) starlark.Tuple {
	t := make(starlark.Tuple, len(s))
	for i, v := range s {
		t[i] = starlark.MakeInt(v)
	}
	return t
}
