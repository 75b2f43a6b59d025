package tensor

import "strings"

// A DType is a tensor element type. Its String is the plain name
// ("float32"); ParseDType reads a name back.
type DType uint8

// The dtypes. Int16 exists so that uint8 and int8 promote as in PyTorch
// (to int16); it is exposed as tensor.int16.
const (
	Bool DType = iota
	Uint8
	Int8
	Int16
	Int32
	Int64
	Float16
	BFloat16
	Float32
	Float64

	// NumDTypes is the number of dtypes: DType(0) ... NumDTypes-1.
	NumDTypes

	// Undefined is "no dtype": the default where a dtype argument is
	// optional, and the empty state of type promotion.
	Undefined DType = 255
)

const (
	numDTypes = NumDTypes
	undefined = Undefined
)

// DefaultFloat is the default floating-point dtype (torch.get_default_dtype()).
const DefaultFloat = Float32

type dtypeInfo struct {
	name  string
	size  int // bytes per element
	float bool
	ints  bool // an integer type (bool excluded)
	torch string
}

var dtypes = [numDTypes]dtypeInfo{
	Bool:     {name: "bool", size: 1, torch: "Bool"},
	Uint8:    {name: "uint8", size: 1, ints: true, torch: "Byte"},
	Int8:     {name: "int8", size: 1, ints: true, torch: "Char"},
	Int16:    {name: "int16", size: 2, ints: true, torch: "Short"},
	Int32:    {name: "int32", size: 4, ints: true, torch: "Int"},
	Int64:    {name: "int64", size: 8, ints: true, torch: "Long"},
	Float16:  {name: "float16", size: 2, float: true, torch: "Half"},
	BFloat16: {name: "bfloat16", size: 2, float: true, torch: "BFloat16"},
	Float32:  {name: "float32", size: 4, float: true, torch: "Float"},
	Float64:  {name: "float64", size: 8, float: true, torch: "Double"},
}

// dtypeAliases are the PyTorch alias names accepted as strings.
var dtypeAliases = map[string]DType{
	"half":   Float16,
	"float":  Float32,
	"double": Float64,
	"long":   Int64,
	"int":    Int32,
	"short":  Int16,
}

// ParseDType returns the dtype named s ("float32", "float16", ...; the
// PyTorch aliases "half", "float", "double", "long", "int", "short" and a
// "torch." prefix are accepted too).
func ParseDType(s string) (DType, bool) {
	s = strings.TrimPrefix(s, "torch.")
	s = strings.TrimPrefix(s, "tensor.")
	for i := range dtypes {
		if dtypes[i].name == s {
			return DType(i), true
		}
	}
	d, ok := dtypeAliases[s]
	return d, ok
}

// Size is the number of bytes per element.
func (d DType) Size() int { return dtypes[d].size }

// IsFloat reports whether d is a floating-point dtype.
func (d DType) IsFloat() bool { return dtypes[d].float }

// IsInt reports whether d is an integer dtype (bool is not).
func (d DType) IsInt() bool { return dtypes[d].ints }

// String returns the plain name, "float32".
func (d DType) String() string {
	if d >= numDTypes {
		return "undefined"
	}
	return dtypes[d].name
}

// IsSigned reports whether d can hold negative values (bool and uint8
// cannot).
func (d DType) IsSigned() bool { return d != Bool && d != Uint8 }

// category orders bool < integer < floating point.
func (d DType) category() int {
	switch {
	case d == Bool:
		return 0
	case d.IsInt():
		return 1
	}
	return 2
}

// PromoteTypes is torch.promote_types for memsh's dtypes (Undefined
// promotes to the other dtype).
func PromoteTypes(a, b DType) DType { return promoteTypes(a, b) }

func promoteTypes(a, b DType) DType {
	switch {
	case a == undefined:
		return b
	case b == undefined, a == b:
		return a
	case a == Bool:
		return b
	case b == Bool:
		return a
	}
	ca, cb := a.category(), b.category()
	if ca != cb {
		if ca > cb {
			return a
		}
		return b
	}
	if ca == 2 { // both floating point
		if (a == Float16 && b == BFloat16) || (a == BFloat16 && b == Float16) {
			return Float32
		}
		return max(a, b) // Float16, BFloat16 < Float32 < Float64
	}
	// both integers
	if a == Uint8 || b == Uint8 {
		o := a
		if a == Uint8 {
			o = b
		}
		if o == Int8 {
			return Int16
		}
		return o
	}
	return max(a, b)
}

// resultType is PyTorch's result-type state: dimensioned tensors, 0-dim
// tensors and wrapped Python (here Starlark) numbers promote in tiers, so a
// scalar or 0-dim operand changes the result dtype only if it is of a
// higher category (bool < integer < floating point).
type resultType struct {
	dim, zero, wrapped DType
}

func newResultType() resultType { return resultType{undefined, undefined, undefined} }

// addTensor records a tensor operand of the given rank.
func (r *resultType) addTensor(d DType, ndim int) {
	if ndim == 0 {
		r.zero = promoteTypes(r.zero, d)
	} else {
		r.dim = promoteTypes(r.dim, d)
	}
}

// addScalar records a Starlark number: int as int64, float as the default
// float dtype, bool as bool.
func (r *resultType) addScalar(d DType) { r.wrapped = promoteTypes(r.wrapped, d) }

// combineCategories is c10's combine_categories.
func combineCategories(higher, lower DType) DType {
	if higher != undefined && higher.IsFloat() {
		return higher
	}
	if higher == Bool || (lower != undefined && lower.IsFloat()) {
		return promoteTypes(higher, lower)
	}
	if higher != undefined {
		return higher
	}
	return lower
}

func (r resultType) result() DType {
	d := combineCategories(r.dim, combineCategories(r.zero, r.wrapped))
	if d == undefined {
		return DefaultFloat
	}
	return d
}

// canCast is torch.can_cast for the in-place ops: a result may not be
// stored in a lower category (float into an integer tensor, integer into
// bool).
func canCast(from, to DType) bool { return CanCast(from, to) }

// CanCast is torch.can_cast: whether a result of dtype from may be stored
// in a tensor of dtype to (not into a lower category).
func CanCast(from, to DType) bool { return from.category() <= to.category() }
