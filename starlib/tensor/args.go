package tensor

import (
	"errors"
	"fmt"

	"go.starlark.net/starlark"

	"github.com/memsh/memsh/tensor"
)

// Conversions of Starlark arguments to engine values, and of engine
// results back.

// rename gives an engine error the name of the builtin that called the op.
func rename(err error, fname string) error { return tensor.Renamed(err, fname) }

// result converts an engine result (errors keep the engine op's name).
func result(t *tensor.Tensor, err error) (starlark.Value, error) {
	if err != nil {
		return nil, err
	}
	return Wrap(t), nil
}

// resultAs converts an engine result, renaming its error to fname.
func resultAs(fname string) func(*tensor.Tensor, error) (starlark.Value, error) {
	return func(t *tensor.Tensor, err error) (starlark.Value, error) {
		if err != nil {
			return nil, rename(err, fname)
		}
		return Wrap(t), nil
	}
}

var errNotOperand = errors.New("not a tensor or number")

// scalarArg converts a Starlark number (int, float or bool) to an engine
// Scalar.
func scalarArg(v starlark.Value) (tensor.Scalar, error) {
	switch v := v.(type) {
	case starlark.Int:
		i, ok := v.Int64()
		if !ok {
			return tensor.Scalar{}, fmt.Errorf("integer %s does not fit in int64", v)
		}
		return tensor.Int(i), nil
	case starlark.Float:
		return tensor.Float(float64(v)), nil
	case starlark.Bool:
		return tensor.BoolScalar(bool(v)), nil
	}
	return tensor.Scalar{}, errNotOperand
}

// operandArg converts a tensor or a number to an engine operand.
func operandArg(v starlark.Value) (tensor.Operand, error) {
	if t, ok := v.(*Tensor); ok {
		return t.t, nil
	}
	s, err := scalarArg(v)
	if err != nil {
		return nil, err
	}
	return s, nil
}

// scalarValue converts an engine scalar to a Starlark number.
func scalarValue(s tensor.Scalar) starlark.Value {
	switch {
	case s.IsBool():
		return starlark.Bool(s.Int64() != 0)
	case s.IsFloat():
		return starlark.Float(s.Float64())
	}
	return starlark.MakeInt64(s.Int64())
}

// dtypeArg converts a dtype argument (a dtype, a name, or None for def).
func dtypeArg(fname string, v starlark.Value, def tensor.DType) (tensor.DType, error) {
	switch v := v.(type) {
	case nil, starlark.NoneType:
		return def, nil
	case DType:
		return tensor.DType(v), nil
	case starlark.String:
		if d, ok := tensor.ParseDType(string(v)); ok {
			return d, nil
		}
		return 0, fmt.Errorf("%s: unknown dtype %q", fname, string(v))
	}
	return 0, fmt.Errorf("%s: for parameter dtype: got %s, want dtype or string", fname, v.Type())
}

// deviceArg converts a device argument (a device string, or None for the
// default device) to its canonical name.
func deviceArg(c *tensor.Context, fname string, v starlark.Value) (string, error) {
	var s string
	switch v := v.(type) {
	case nil, starlark.NoneType:
		s = c.DefaultDevice
		if s == "" {
			s = "cpu"
		}
	case starlark.String:
		s = string(v)
	default:
		return "", fmt.Errorf("%s: for parameter device: got %s, want string", fname, v.Type())
	}
	d, err := c.Manager.Canonical(s)
	if err != nil {
		return "", fmt.Errorf("%s: %w", fname, err)
	}
	return d, nil
}

// maxBytes is the largest tensor size in bytes.
const maxBytes = 1 << 62

// shapeArg converts a shape argument: a list or tuple of non-negative ints.
func shapeArg(fname, param string, v starlark.Value) ([]int, error) {
	var elems []starlark.Value
	switch v := v.(type) {
	case starlark.Tuple:
		elems = v
	case *starlark.List:
		for i := range v.Len() {
			elems = append(elems, v.Index(i))
		}
	default:
		return nil, fmt.Errorf("%s: for parameter %s: got %s, want list or tuple", fname, param, v.Type())
	}
	shape := make([]int, len(elems))
	for i, x := range elems {
		xi, ok := x.(starlark.Int)
		if !ok {
			return nil, fmt.Errorf("%s: for parameter %s: element %d: got %s, want int", fname, param, i, x.Type())
		}
		if xi.Sign() < 0 {
			return nil, fmt.Errorf("%s: for parameter %s: negative dimension %s", fname, param, xi)
		}
		n, ok := xi.Int64()
		if !ok || n > maxBytes {
			return nil, fmt.Errorf("%s: shape %s needs more than 2^62 bytes", fname, fmtShapeValues(elems))
		}
		shape[i] = int(n)
	}
	return shape, nil
}

func fmtShapeValues(elems []starlark.Value) string {
	b := []byte{'['}
	for i, x := range elems {
		if i > 0 {
			b = append(b, ", "...)
		}
		b = append(b, x.String()...)
	}
	return string(append(b, ']'))
}

// intsArg reads a list of ints given as one list/tuple or as varargs.
func intsArg(fname, param string, args starlark.Tuple, allowNegative bool) ([]int, error) {
	var elems []starlark.Value = args
	if len(args) == 1 {
		switch v := args[0].(type) {
		case starlark.Tuple:
			elems = v
		case *starlark.List:
			elems = nil
			for i := range v.Len() {
				elems = append(elems, v.Index(i))
			}
		}
	}
	out := make([]int, len(elems))
	for i, x := range elems {
		var n int
		if err := starlark.AsInt(x, &n); err != nil {
			return nil, fmt.Errorf("%s: for parameter %s: element %d: got %s, want int", fname, param, i, x.Type())
		}
		if n < 0 && !allowNegative {
			return nil, fmt.Errorf("%s: for parameter %s: negative dimension %d", fname, param, n)
		}
		out[i] = n
	}
	return out, nil
}

// dimsArg reads dim=None (nil: all dimensions), an int, or a list/tuple of
// ints (an empty one is all dimensions too).
func dimsArg(fname string, v starlark.Value) ([]int, error) {
	if v == nil || v == starlark.None {
		return nil, nil
	}
	switch v := v.(type) {
	case starlark.Int:
		var d int
		if err := starlark.AsInt(v, &d); err != nil {
			return nil, fmt.Errorf("%s: for parameter dim: %v", fname, err)
		}
		return []int{d}, nil
	case starlark.Tuple, *starlark.List:
		return intsArg(fname, "dim", starlark.Tuple{v}, true)
	}
	return nil, fmt.Errorf("%s: for parameter dim: got %s, want int, tuple of ints or None", fname, v.Type())
}

// tensorList reads a list or tuple of tensors (at least one).
func tensorList(fname string, v starlark.Value) ([]*tensor.Tensor, error) {
	var elems []starlark.Value
	switch v := v.(type) {
	case starlark.Tuple:
		elems = v
	case *starlark.List:
		for i := range v.Len() {
			elems = append(elems, v.Index(i))
		}
	default:
		return nil, fmt.Errorf("%s: for parameter tensors: got %s, want list or tuple of tensors", fname, v.Type())
	}
	if len(elems) == 0 {
		return nil, fmt.Errorf("%s: expected a non-empty list of tensors", fname)
	}
	ts := make([]*tensor.Tensor, len(elems))
	for i, x := range elems {
		t, ok := x.(*Tensor)
		if !ok {
			return nil, fmt.Errorf("%s: for parameter tensors: element %d: got %s, want tensor", fname, i, x.Type())
		}
		ts[i] = t.t
	}
	return ts, nil
}

// floatArg converts an int or float argument (def when absent).
func floatArg(fname, param string, v starlark.Value, def float64) (float64, error) {
	if v == nil {
		return def, nil
	}
	if _, isBool := v.(starlark.Bool); !isBool {
		if f, ok := starlark.AsFloat(v); ok {
			return f, nil
		}
	}
	return 0, fmt.Errorf("%s: for parameter %s: got %s, want float", fname, param, v.Type())
}
