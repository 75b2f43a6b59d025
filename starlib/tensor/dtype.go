package tensor

import (
	"fmt"

	"go.starlark.net/starlark"
	"go.starlark.net/syntax"

	"github.com/memsh/memsh/tensor"
)

// A DType is the Starlark value of type "dtype": an engine tensor.DType.
// Its str() and repr() are the plain name ("float32"); the module exposes
// each as a constant (tensor.float32) and every dtype parameter also accepts
// the name as a string (dtype="float16").
//
// Dtypes support == and != (a dtype equals itself only) and are hashable.
// Attributes: itemsize (bytes per element), is_floating_point, is_signed.
type DType tensor.DType

var (
	_ starlark.Value      = DType(0)
	_ starlark.HasAttrs   = DType(0)
	_ starlark.Comparable = DType(0)
)

// Engine returns the engine dtype.
func (d DType) Engine() tensor.DType { return tensor.DType(d) }

// String returns the plain name, "float32".
func (d DType) String() string { return tensor.DType(d).String() }

// Type returns "dtype".
func (d DType) Type() string { return "dtype" }

// Freeze does nothing: a dtype is immutable.
func (d DType) Freeze() {}

// Truth returns True.
func (d DType) Truth() starlark.Bool { return true }

// Hash returns a hash of the dtype.
func (d DType) Hash() (uint32, error) { return 0x9e3779b9 ^ uint32(d), nil }

// CompareSameType implements == and != (other comparisons are errors).
func (d DType) CompareSameType(op syntax.Token, y starlark.Value, depth int) (bool, error) {
	e := y.(DType)
	switch op {
	case syntax.EQL:
		return d == e, nil
	case syntax.NEQ:
		return d != e, nil
	}
	return false, fmt.Errorf("%s %s %s not implemented", d.Type(), op, y.Type())
}

// Attr returns the dtype's attributes.
func (d DType) Attr(name string) (starlark.Value, error) {
	e := tensor.DType(d)
	switch name {
	case "itemsize":
		return starlark.MakeInt(e.Size()), nil
	case "is_floating_point":
		return starlark.Bool(e.IsFloat()), nil
	case "is_signed":
		return starlark.Bool(e.IsSigned()), nil
	}
	return nil, nil
}

// AttrNames lists the dtype's attributes.
func (d DType) AttrNames() []string { return []string{"is_floating_point", "is_signed", "itemsize"} }

// HoldsNoMemory implements env.Opaque: a dtype holds nothing the reclaim's
// reach walk looks for.
func (DType) HoldsNoMemory() {}
