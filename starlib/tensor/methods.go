package tensor

import (
	"fmt"
	"sort"

	"go.starlark.net/starlark"

	"github.com/memsh/memsh/tensor"
	"github.com/memsh/memsh/tensor/autograd"
)

// methodFn implements a Tensor method (and the module function of the same
// name where there is one); fname is the builtin's name for errors.
type methodFn func(thread *starlark.Thread, fname string, t *Tensor, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error)

// methods are the Tensor methods. Results are views (no allocation) where
// noted, otherwise newly allocated tensors of numel × itemsize bytes.
//
//	numel() element_size() dim() size(dim=None) data_ptr() is_contiguous()
//	to(device=None, dtype=None, copy=False)   t itself when nothing changes; also to("cuda"), to(tensor.float16), to(other)
//	cpu() cuda(device=None) float() double() half() bfloat16() long() int() bool()
//	clone() contiguous()                      contiguous returns t itself when already contiguous
//	view(*shape)                              view; -1 infers a size; fails when strides do not allow it
//	reshape(*shape) flatten(start_dim=0, end_dim=-1)  a view when possible, else a copy
//	transpose(d0, d1) t() permute(*dims) squeeze(dim=None) unsqueeze(dim) expand(*sizes)   views
//	sum(dim=None, keepdim=False, dtype=None) mean(...)   int/bool sums are int64; mean needs a float dtype
//	max(dim=None, keepdim=False) min(...)     without dim a 0-dim tensor, with dim a tuple (values, indices)
//	max(dim) and min(dim) return return_types.max/min: a (values, indices) pair with those attributes
//	item() tolist()                           Starlark numbers / nested lists
//	add(o, out=None) sub(o) mul(o) div(o) matmul(o, out=None)   out= writes into an existing tensor
//	relu() neg() abs() exp() log() sqrt() tanh() sigmoid()
//	eq(o) ne(o) lt(o) le(o) gt(o) ge(o)       elementwise comparisons: bool tensors
//	equal(o) allclose(o, rtol=1e-05, atol=1e-08, equal_nan=False)   Starlark bools (read values)
//	narrow(dim, start, length) select(dim, index)   views
//	add_(o) sub_(o) mul_(o) div_(o) relu_() zero_() fill_(v) copy_(src)   in place, allocate nothing, return t (relu_: ReluBackward0 saves t)
var methods map[string]methodFn

func init() {
	methods = map[string]methodFn{
		"numel":         noArgs(func(_ string, t *Tensor) (starlark.Value, error) { return starlark.MakeInt(t.t.Numel()), nil }),
		"element_size":  noArgs(func(_ string, t *Tensor) (starlark.Value, error) { return starlark.MakeInt(t.t.DType().Size()), nil }),
		"dim":           noArgs(func(_ string, t *Tensor) (starlark.Value, error) { return starlark.MakeInt(t.t.Dim()), nil }),
		"is_contiguous": noArgs(func(_ string, t *Tensor) (starlark.Value, error) { return starlark.Bool(t.t.IsContiguous()), nil }),
		"data_ptr": noArgs(func(_ string, t *Tensor) (starlark.Value, error) {
			return starlark.MakeUint64(t.t.DataPtr()), nil
		}),
		"size": methodSize,
		"to":   methodTo,
		"cpu": noArgs(func(f string, t *Tensor) (starlark.Value, error) {
			return resultAs(f)(autograd.To(t.t, "cpu", t.t.DType(), false))
		}),
		"cuda":       methodCuda,
		"float":      castTo(tensor.Float32),
		"double":     castTo(tensor.Float64),
		"half":       castTo(tensor.Float16),
		"bfloat16":   castTo(tensor.BFloat16),
		"long":       castTo(tensor.Int64),
		"int":        castTo(tensor.Int32),
		"bool":       castTo(tensor.Bool),
		"clone":      noArgs(func(f string, t *Tensor) (starlark.Value, error) { return resultAs(f)(autograd.Clone(t.t)) }),
		"contiguous": noArgs(func(f string, t *Tensor) (starlark.Value, error) { return resultAs(f)(autograd.Contiguous(t.t)) }),
		"view": func(_ *starlark.Thread, f string, t *Tensor, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
			return reshapeMethod(f, t, args, kwargs, autograd.View)
		},
		"reshape": func(_ *starlark.Thread, f string, t *Tensor, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
			return reshapeMethod(f, t, args, kwargs, autograd.Reshape)
		},
		"flatten":   methodFlatten,
		"transpose": methodTranspose,
		"t":         noArgs(func(f string, t *Tensor) (starlark.Value, error) { return resultAs(f)(autograd.T(t.t)) }),
		"permute":   methodPermute,
		"squeeze":   methodSqueeze,
		"unsqueeze": methodUnsqueeze,
		"expand":    methodExpand,
		"narrow": func(_ *starlark.Thread, f string, t *Tensor, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
			var dim, start, length int
			if err := starlark.UnpackArgs(f, args, kwargs, "dim", &dim, "start", &start, "length", &length); err != nil {
				return nil, err
			}
			return resultAs(f)(autograd.Narrow(t.t, dim, start, length))
		},
		"select": func(_ *starlark.Thread, f string, t *Tensor, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
			var dim, index int
			if err := starlark.UnpackArgs(f, args, kwargs, "dim", &dim, "index", &index); err != nil {
				return nil, err
			}
			return resultAs(f)(autograd.Select(t.t, dim, index))
		},
		"sum":      reduceMethod(autograd.Sum),
		"mean":     reduceMethod(autograd.Mean),
		"max":      extremeMethod("max", autograd.Max, autograd.MaxDim),
		"min":      extremeMethod("min", autograd.Min, autograd.MinDim),
		"item":     noArgs(item),
		"tolist":   noArgs(tolist),
		"add":      binaryMethod(tensor.OpAdd),
		"sub":      binaryMethod(tensor.OpSub),
		"mul":      binaryMethod(tensor.OpMul),
		"div":      binaryMethod(tensor.OpDiv),
		"add_":     inplaceMethod(tensor.OpAdd),
		"sub_":     inplaceMethod(tensor.OpSub),
		"mul_":     inplaceMethod(tensor.OpMul),
		"div_":     inplaceMethod(tensor.OpDiv),
		"matmul":   methodMatmul,
		"mm":       methodMm,
		"argmax":   methodArgmax,
		"addmm":    methodAddmm,
		"eq":       compareMethod(tensor.CmpEq),
		"ne":       compareMethod(tensor.CmpNe),
		"lt":       compareMethod(tensor.CmpLt),
		"le":       compareMethod(tensor.CmpLe),
		"gt":       compareMethod(tensor.CmpGt),
		"ge":       compareMethod(tensor.CmpGe),
		"equal":    methodEqual,
		"allclose": methodAllclose,
		"relu":     unaryMethod(tensor.OpRelu),
		"relu_": noArgs(func(fname string, t *Tensor) (starlark.Value, error) {
			if _, err := autograd.Relu_(t.t); err != nil {
				return nil, rename(err, fname)
			}
			return t, nil
		}),
		"neg":     unaryMethod(tensor.OpNeg),
		"abs":     unaryMethod(tensor.OpAbs),
		"exp":     unaryMethod(tensor.OpExp),
		"log":     unaryMethod(tensor.OpLog),
		"sqrt":    unaryMethod(tensor.OpSqrt),
		"tanh":    unaryMethod(tensor.OpTanh),
		"sigmoid": unaryMethod(tensor.OpSigmoid),
		"zero_": noArgs(func(f string, t *Tensor) (starlark.Value, error) {
			if _, err := t.t.Zero_(); err != nil {
				return nil, rename(err, f)
			}
			return t, nil
		}),
		"fill_": func(_ *starlark.Thread, f string, t *Tensor, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
			var v starlark.Value
			if err := starlark.UnpackArgs(f, args, kwargs, "value", &v); err != nil {
				return nil, err
			}
			if err := fillOrCopy(f, t.t, v, false); err != nil {
				return nil, err
			}
			return t, nil
		},
		"copy_": func(_ *starlark.Thread, f string, t *Tensor, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
			var src *Tensor
			nonBlocking := false
			if err := starlark.UnpackArgs(f, args, kwargs, "src", &src, "non_blocking?", &nonBlocking); err != nil {
				return nil, err
			}
			if _, err := t.t.Copy_(src.t); err != nil {
				return nil, rename(err, f)
			}
			return t, nil
		},
	}
	attrNames = []string{"T", "device", "dtype", "is_cuda", "is_view", "nbytes", "ndim", "shape", "storage_id", "storage_offset"}
	for k := range methods {
		attrNames = append(attrNames, k)
	}
	sort.Strings(attrNames)
}

func noArgs(fn func(fname string, t *Tensor) (starlark.Value, error)) methodFn {
	return func(_ *starlark.Thread, fname string, t *Tensor, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
		if err := starlark.UnpackArgs(fname, args, kwargs); err != nil {
			return nil, err
		}
		return fn(fname, t)
	}
}

func binaryMethod(op tensor.BinaryOp) methodFn {
	return func(_ *starlark.Thread, fname string, t *Tensor, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
		var v starlark.Value
		var out *Tensor
		if err := starlark.UnpackArgs(fname, args, kwargs, "other", &v, "out?", &out); err != nil {
			return nil, err
		}
		o, err := operandArg(v)
		if err != nil {
			return nil, fmt.Errorf("%s: for parameter other: got %s, want tensor or number", fname, v.Type())
		}
		var dst *tensor.Tensor
		if out != nil {
			dst = out.t
		}
		// Errors keep the op's name (tensor.add), as the operators' do.
		return result(autograd.BinaryOut(op, t.t, o, dst))
	}
}

func inplaceMethod(op tensor.BinaryOp) methodFn {
	return func(_ *starlark.Thread, fname string, t *Tensor, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
		var v starlark.Value
		if err := starlark.UnpackArgs(fname, args, kwargs, "other", &v); err != nil {
			return nil, err
		}
		o, err := operandArg(v)
		if err != nil {
			return nil, fmt.Errorf("%s: for parameter other: got %s, want tensor or number", fname, v.Type())
		}
		if _, err := autograd.BinaryInPlace(op, t.t, o); err != nil {
			return nil, rename(err, fname)
		}
		return t, nil
	}
}

func unaryMethod(op tensor.UnaryOp) methodFn {
	return noArgs(func(fname string, t *Tensor) (starlark.Value, error) { return resultAs(fname)(autograd.Unary(op, t.t)) })
}

func castTo(dt tensor.DType) methodFn {
	return noArgs(func(fname string, t *Tensor) (starlark.Value, error) {
		return resultAs(fname)(autograd.To(t.t, "", dt, false))
	})
}

func compareMethod(op tensor.CompareOp) methodFn {
	return func(_ *starlark.Thread, fname string, t *Tensor, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
		var v starlark.Value
		if err := starlark.UnpackArgs(fname, args, kwargs, "other", &v); err != nil {
			return nil, err
		}
		o, err := operandArg(v)
		if err != nil {
			return nil, fmt.Errorf("%s: for parameter other: got %s, want tensor or number", fname, v.Type())
		}
		return resultAs(fname)(tensor.Compare(op, t.t, o))
	}
}

// methodEqual is torch.equal: the same shape and equal elements.
func methodEqual(_ *starlark.Thread, fname string, t *Tensor, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	var other *Tensor
	if err := starlark.UnpackArgs(fname, args, kwargs, "other", &other); err != nil {
		return nil, err
	}
	ok, err := tensor.Equal(t.t, other.t)
	if err != nil {
		return nil, rename(err, fname)
	}
	return starlark.Bool(ok), nil
}

// methodAllclose is torch.allclose.
func methodAllclose(_ *starlark.Thread, fname string, t *Tensor, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	var other *Tensor
	var rtolV, atolV starlark.Value
	equalNaN := false
	if err := starlark.UnpackArgs(fname, args, kwargs, "other", &other, "rtol?", &rtolV, "atol?", &atolV, "equal_nan?", &equalNaN); err != nil {
		return nil, err
	}
	rtol, err := floatArg(fname, "rtol", rtolV, 1e-5)
	if err != nil {
		return nil, err
	}
	atol, err := floatArg(fname, "atol", atolV, 1e-8)
	if err != nil {
		return nil, err
	}
	ok, err := tensor.Allclose(t.t, other.t, rtol, atol, equalNaN)
	if err != nil {
		return nil, rename(err, fname)
	}
	return starlark.Bool(ok), nil
}

// reduceMethod is sum and mean: (dim=None, keepdim=False, dtype=None).
func reduceMethod(fn func(*tensor.Tensor, []int, bool, tensor.DType) (*tensor.Tensor, error)) methodFn {
	return func(_ *starlark.Thread, fname string, t *Tensor, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
		var dimV, dtV starlark.Value
		keepdim := false
		if err := starlark.UnpackArgs(fname, args, kwargs, "dim?", &dimV, "keepdim?", &keepdim, "dtype?", &dtV); err != nil {
			return nil, err
		}
		if err := t.t.CheckLive(fname); err != nil {
			return nil, err
		}
		dims, err := dimsArg(fname, dimV)
		if err != nil {
			return nil, err
		}
		dt, err := dtypeArg(fname, dtV, tensor.Undefined)
		if err != nil {
			return nil, err
		}
		return resultAs(fname)(fn(t.t, dims, keepdim, dt))
	}
}

// extremeMethod is max and min: with no dim, a 0-dim tensor; with dim,
// the pair (values, indices) as PyTorch's named tuple.
func extremeMethod(kind string, all func(*tensor.Tensor) (*tensor.Tensor, error), byDim func(*tensor.Tensor, int, bool) (*tensor.Tensor, *tensor.Tensor, error)) methodFn {
	return func(_ *starlark.Thread, fname string, t *Tensor, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
		var dimV starlark.Value
		keepdim := false
		if err := starlark.UnpackArgs(fname, args, kwargs, "dim?", &dimV, "keepdim?", &keepdim); err != nil {
			return nil, err
		}
		if err := t.t.CheckLive(fname); err != nil {
			return nil, err
		}
		if dimV == nil || dimV == starlark.None {
			return resultAs(fname)(all(t.t))
		}
		if _, ok := dimV.(starlark.Int); !ok {
			return nil, fmt.Errorf("%s: for parameter dim: got %s, want int", fname, dimV.Type())
		}
		var dim int
		if err := starlark.AsInt(dimV, &dim); err != nil {
			return nil, fmt.Errorf("%s: for parameter dim: %v", fname, err)
		}
		vals, idx, err := byDim(t.t, dim, keepdim)
		if err != nil {
			return nil, rename(err, fname)
		}
		return &valuesIndices{kind: kind, values: Wrap(vals), indices: Wrap(idx)}, nil
	}
}

func item(fname string, t *Tensor) (starlark.Value, error) {
	v, err := t.t.Item()
	if err != nil {
		return nil, rename(err, fname)
	}
	return scalarValue(v), nil
}

// tolistBytes is the Go heap a Starlark number in a list takes: the
// interface slot (16 bytes) and the boxed value (16 to 24 bytes).
const tolistBytes = 40

// tolist returns nested lists of numbers (a number for a 0-dim tensor).
func tolist(fname string, t *Tensor) (starlark.Value, error) {
	if err := t.t.NeedData(fname); err != nil {
		return nil, err
	}
	// The Go heap it takes: Values' result, then a boxed Starlark number
	// and its slot in a list per element (and the lists themselves).
	if err := tensor.CheckConversion(fname, t.t.Numel(), tensor.ScalarBytes+tolistBytes); err != nil {
		return nil, err
	}
	vals, err := t.t.Values()
	if err != nil {
		return nil, rename(err, fname)
	}
	shape := t.t.Shape()
	i := 0
	var rec func(d int) starlark.Value
	rec = func(d int) starlark.Value {
		if d == len(shape) {
			v := scalarValue(vals[i])
			i++
			return v
		}
		elems := make([]starlark.Value, shape[d])
		for j := range elems {
			elems[j] = rec(d + 1)
		}
		return starlark.NewList(elems)
	}
	return rec(0), nil
}

func methodSize(_ *starlark.Thread, fname string, t *Tensor, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	var dimV starlark.Value
	if err := starlark.UnpackArgs(fname, args, kwargs, "dim?", &dimV); err != nil {
		return nil, err
	}
	shape := t.t.Shape()
	if dimV == nil || dimV == starlark.None {
		return shapeTuple(shape), nil
	}
	var d int
	if err := starlark.AsInt(dimV, &d); err != nil {
		return nil, fmt.Errorf("%s: for parameter dim: got %s, want int", fname, dimV.Type())
	}
	if len(shape) == 0 {
		return nil, fmt.Errorf("%s: dimension specified as %d but tensor has no dimensions", fname, d)
	}
	n := len(shape)
	if d < -n || d >= n {
		return nil, fmt.Errorf("%s: dimension out of range (expected to be in range of [%d, %d], but got %d)", fname, -n, n-1, d)
	}
	if d < 0 {
		d += n
	}
	return starlark.MakeInt(shape[d]), nil
}

// methodTo is Tensor.to: positional arguments may be a device string, a
// dtype (or its name) or a tensor whose device and dtype are taken.
func methodTo(_ *starlark.Thread, fname string, t *Tensor, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	var devV, dtV starlark.Value
	copyFlag, nonBlocking := false, false
	if err := starlark.UnpackArgs(fname, nil, kwargs, "device?", &devV, "dtype?", &dtV, "copy?", &copyFlag, "non_blocking?", &nonBlocking); err != nil {
		return nil, err
	}
	if len(args) > 2 {
		return nil, fmt.Errorf("%s: got %d positional arguments, want at most 2", fname, len(args))
	}
	set := func(p *starlark.Value, v starlark.Value, name string) error {
		if *p != nil && *p != starlark.None {
			return fmt.Errorf("%s: got multiple values for %s", fname, name)
		}
		*p = v
		return nil
	}
	for _, a := range args {
		var err error
		switch a := a.(type) {
		case starlark.NoneType:
		case DType:
			err = set(&dtV, a, "dtype")
		case *Tensor:
			if err = set(&devV, starlark.String(a.t.Device()), "device"); err == nil {
				err = set(&dtV, DType(a.t.DType()), "dtype")
			}
		case starlark.String:
			if _, ok := tensor.ParseDType(string(a)); ok {
				err = set(&dtV, a, "dtype")
			} else {
				err = set(&devV, a, "device")
			}
		default:
			err = fmt.Errorf("%s: got %s, want device string, dtype or tensor", fname, a.Type())
		}
		if err != nil {
			return nil, err
		}
	}
	dt, err := dtypeArg(fname, dtV, t.t.DType())
	if err != nil {
		return nil, err
	}
	device := t.t.Device()
	if devV != nil && devV != starlark.None {
		if device, err = deviceArg(t.t.Context(), fname, devV); err != nil {
			return nil, err
		}
	}
	return resultAs(fname)(autograd.To(t.t, device, dt, copyFlag))
}

func methodCuda(_ *starlark.Thread, fname string, t *Tensor, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	var devV starlark.Value
	nonBlocking := false
	if err := starlark.UnpackArgs(fname, args, kwargs, "device?", &devV, "non_blocking?", &nonBlocking); err != nil {
		return nil, err
	}
	s := "cuda"
	switch v := devV.(type) {
	case nil, starlark.NoneType:
	case starlark.Int:
		s = fmt.Sprintf("cuda:%s", v)
	case starlark.String:
		s = string(v)
	default:
		return nil, fmt.Errorf("%s: for parameter device: got %s, want int or string", fname, devV.Type())
	}
	device, err := deviceArg(t.t.Context(), fname, starlark.String(s))
	if err != nil {
		return nil, err
	}
	return resultAs(fname)(autograd.To(t.t, device, t.t.DType(), false))
}

func reshapeMethod(fname string, t *Tensor, args starlark.Tuple, kwargs []starlark.Tuple, fn func(*tensor.Tensor, []int) (*tensor.Tensor, error)) (starlark.Value, error) {
	var shapeV starlark.Value
	if err := starlark.UnpackArgs(fname, nil, kwargs, "shape?", &shapeV); err != nil {
		return nil, err
	}
	if shapeV != nil {
		if len(args) > 0 {
			return nil, fmt.Errorf("%s: got multiple values for parameter shape", fname)
		}
		args = starlark.Tuple{shapeV}
	}
	if len(args) == 1 {
		switch args[0].(type) {
		case starlark.Int, starlark.Tuple, *starlark.List:
		default:
			return nil, fmt.Errorf("%s: for parameter shape: got %s, want list or tuple", fname, args[0].Type())
		}
	}
	shape, err := intsArg(fname, "shape", args, true)
	if err != nil {
		return nil, err
	}
	return resultAs(fname)(fn(t.t, shape))
}

func methodFlatten(_ *starlark.Thread, fname string, t *Tensor, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	start, end := 0, -1
	if err := starlark.UnpackArgs(fname, args, kwargs, "start_dim?", &start, "end_dim?", &end); err != nil {
		return nil, err
	}
	return resultAs(fname)(autograd.Flatten(t.t, start, end))
}

func methodTranspose(_ *starlark.Thread, fname string, t *Tensor, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	var d0, d1 int
	if err := starlark.UnpackArgs(fname, args, kwargs, "dim0", &d0, "dim1", &d1); err != nil {
		return nil, err
	}
	return resultAs(fname)(autograd.Transpose(t.t, d0, d1))
}

func methodPermute(_ *starlark.Thread, fname string, t *Tensor, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	var dimsV starlark.Value
	if err := starlark.UnpackArgs(fname, nil, kwargs, "dims?", &dimsV); err != nil {
		return nil, err
	}
	if dimsV != nil {
		args = starlark.Tuple{dimsV}
	}
	dims, err := intsArg(fname, "dims", args, true)
	if err != nil {
		return nil, err
	}
	return resultAs(fname)(autograd.Permute(t.t, dims))
}

func methodSqueeze(_ *starlark.Thread, fname string, t *Tensor, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	var dimV starlark.Value
	if err := starlark.UnpackArgs(fname, args, kwargs, "dim?", &dimV); err != nil {
		return nil, err
	}
	if err := t.t.CheckLive(fname); err != nil {
		return nil, err
	}
	dims, err := dimsArg(fname, dimV)
	if err != nil {
		return nil, err
	}
	if dims == nil && dimV != nil && dimV != starlark.None {
		dims = []int{} // an empty list: every dimension, as for None
	}
	if len(dims) == 0 {
		dims = nil
	}
	return resultAs(fname)(autograd.Squeeze(t.t, dims))
}

func methodUnsqueeze(_ *starlark.Thread, fname string, t *Tensor, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	var d int
	if err := starlark.UnpackArgs(fname, args, kwargs, "dim", &d); err != nil {
		return nil, err
	}
	return resultAs(fname)(autograd.Unsqueeze(t.t, d))
}

func methodExpand(_ *starlark.Thread, fname string, t *Tensor, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	if err := starlark.UnpackArgs(fname, nil, kwargs); err != nil {
		return nil, err
	}
	sizes, err := intsArg(fname, "sizes", args, true)
	if err != nil {
		return nil, err
	}
	return resultAs(fname)(autograd.Expand(t.t, sizes))
}

// methodArgmax is t.argmax(dim=None, keepdim=False): the int64 indices
// of the largest values along dim (of the flattened tensor without dim);
// only the indices are allocated.
func methodArgmax(_ *starlark.Thread, fname string, t *Tensor, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	var dimV starlark.Value = starlark.None
	keepdim := false
	if err := starlark.UnpackArgs(fname, args, kwargs, "dim?", &dimV, "keepdim?", &keepdim); err != nil {
		return nil, err
	}
	src, dim := t.t, 0
	if dimV == starlark.None {
		flat, err := tensor.Reshape(t.t, []int{-1})
		if err != nil {
			return nil, rename(err, fname)
		}
		src, keepdim = flat, false
	} else if err := starlark.AsInt(dimV, &dim); err != nil {
		return nil, fmt.Errorf("%s: for parameter dim: got %s, want int or None", fname, dimV.Type())
	}
	return resultAs(fname)(tensor.ArgMax(src, dim, keepdim))
}

// methodMm is t.mm(mat2): the product of two 2-D tensors (MmBackward0:
// mat2 saved when t needs a gradient, t when mat2 does).
func methodMm(_ *starlark.Thread, fname string, t *Tensor, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	var mat2 *Tensor
	if err := starlark.UnpackArgs(fname, args, kwargs, "mat2", &mat2); err != nil {
		return nil, err
	}
	return resultAs(fname)(autograd.Mm(t.t, mat2.t))
}

// methodAddmm is t.addmm(mat1, mat2, beta=1, alpha=1) (torch.addmm(input,
// mat1, mat2)): t + mat1 @ mat2, t broadcast to the product's shape
// (AddmmBackward0, saved as mm's; Hugging Face's Conv1D is this call).
// Only beta=1 and alpha=1 are modelled.
func methodAddmm(_ *starlark.Thread, fname string, t *Tensor, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	var mat1, mat2 *Tensor
	var beta, alpha starlark.Value = starlark.MakeInt(1), starlark.MakeInt(1)
	if err := starlark.UnpackArgs(fname, args, kwargs, "mat1", &mat1, "mat2", &mat2, "beta?", &beta, "alpha?", &alpha); err != nil {
		return nil, err
	}
	for _, p := range []struct {
		name string
		v    starlark.Value
	}{{"beta", beta}, {"alpha", alpha}} {
		if f, ok := starlark.AsFloat(p.v); !ok || f != 1 {
			return nil, fmt.Errorf("%s: for parameter %s: only 1 is supported, got %s", fname, p.name, p.v)
		}
	}
	return resultAs(fname)(autograd.Addmm(t.t, mat1.t, mat2.t))
}

func methodMatmul(_ *starlark.Thread, fname string, t *Tensor, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	var other, out *Tensor
	if err := starlark.UnpackArgs(fname, args, kwargs, "other", &other, "out?", &out); err != nil {
		return nil, err
	}
	var dst *tensor.Tensor
	if out != nil {
		dst = out.t
	}
	return resultAs(fname)(autograd.MatmulOut(t.t, other.t, dst))
}

// RegisterMethod adds a Tensor method defined in a package above this one
// (cuda's record_stream, whose argument is a cuda.Stream). It must be
// called from an init function.
func RegisterMethod(name string, fn func(thread *starlark.Thread, fname string, t *Tensor, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error)) {
	methods[name] = fn
	attrNames = append(attrNames, name)
	sort.Strings(attrNames)
}
