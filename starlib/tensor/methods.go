package tensor

import (
	"fmt"
	"slices"
	"sort"

	"go.starlark.net/starlark"
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
//	add_(o) sub_(o) mul_(o) div_(o) zero_() fill_(v) copy_(src)   in place, allocate nothing, return t
var methods map[string]methodFn

func init() {
	methods = map[string]methodFn{
		"numel":         noArgs(func(_ string, t *Tensor) (starlark.Value, error) { return starlark.MakeInt(t.Numel()), nil }),
		"element_size":  noArgs(func(_ string, t *Tensor) (starlark.Value, error) { return starlark.MakeInt(t.dtype.Size()), nil }),
		"dim":           noArgs(func(_ string, t *Tensor) (starlark.Value, error) { return starlark.MakeInt(len(t.shape)), nil }),
		"is_contiguous": noArgs(func(_ string, t *Tensor) (starlark.Value, error) { return starlark.Bool(t.isContiguous()), nil }),
		"data_ptr": noArgs(func(_ string, t *Tensor) (starlark.Value, error) {
			return starlark.MakeUint64(uint64(t.mem.Ptr()) + uint64(t.offset*t.dtype.Size())), nil
		}),
		"size":       methodSize,
		"to":         methodTo,
		"cpu":        noArgs(func(f string, t *Tensor) (starlark.Value, error) { return convert(f, t, "cpu", t.dtype) }),
		"cuda":       methodCuda,
		"float":      castTo(Float32),
		"double":     castTo(Float64),
		"half":       castTo(Float16),
		"bfloat16":   castTo(BFloat16),
		"long":       castTo(Int64),
		"int":        castTo(Int32),
		"bool":       castTo(Bool),
		"clone":      noArgs(func(f string, t *Tensor) (starlark.Value, error) { return copyTo(f, t, t.mem.Device(), t.dtype) }),
		"contiguous": noArgs(methodContiguous),
		"view": func(_ *starlark.Thread, f string, t *Tensor, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
			return reshapeMethod(f, t, args, kwargs, false)
		},
		"reshape": func(_ *starlark.Thread, f string, t *Tensor, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
			return reshapeMethod(f, t, args, kwargs, true)
		},
		"flatten":   methodFlatten,
		"transpose": methodTranspose,
		"t":         noArgs(methodT),
		"permute":   methodPermute,
		"squeeze":   methodSqueeze,
		"unsqueeze": methodUnsqueeze,
		"expand":    methodExpand,
		"narrow": func(_ *starlark.Thread, f string, t *Tensor, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
			var dim, start, length int
			if err := starlark.UnpackArgs(f, args, kwargs, "dim", &dim, "start", &start, "length", &length); err != nil {
				return nil, err
			}
			return narrowed(f, t, dim, start, length)
		},
		"select": func(_ *starlark.Thread, f string, t *Tensor, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
			var dim, index int
			if err := starlark.UnpackArgs(f, args, kwargs, "dim", &dim, "index", &index); err != nil {
				return nil, err
			}
			return selected(f, t, dim, index)
		},
		"sum": func(_ *starlark.Thread, f string, t *Tensor, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
			return reduce(redSum, f, t, args, kwargs)
		},
		"mean": func(_ *starlark.Thread, f string, t *Tensor, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
			return reduce(redMean, f, t, args, kwargs)
		},
		"max": func(_ *starlark.Thread, f string, t *Tensor, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
			return extreme(redMax, f, t, args, kwargs)
		},
		"min": func(_ *starlark.Thread, f string, t *Tensor, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
			return extreme(redMin, f, t, args, kwargs)
		},
		"item":     noArgs(item),
		"tolist":   noArgs(tolist),
		"add":      binaryMethod(opAdd),
		"sub":      binaryMethod(opSub),
		"mul":      binaryMethod(opMul),
		"div":      binaryMethod(opDiv),
		"add_":     inplaceMethod(opAdd),
		"sub_":     inplaceMethod(opSub),
		"mul_":     inplaceMethod(opMul),
		"div_":     inplaceMethod(opDiv),
		"matmul":   methodMatmul,
		"eq":       compareMethod(cmpEq),
		"ne":       compareMethod(cmpNe),
		"lt":       compareMethod(cmpLt),
		"le":       compareMethod(cmpLe),
		"gt":       compareMethod(cmpGt),
		"ge":       compareMethod(cmpGe),
		"equal":    methodEqual,
		"allclose": methodAllclose,
		"relu":     unaryMethod(uRelu),
		"neg":      unaryMethod(uNeg),
		"abs":      unaryMethod(uAbs),
		"exp":      unaryMethod(uExp),
		"log":      unaryMethod(uLog),
		"sqrt":     unaryMethod(uSqrt),
		"tanh":     unaryMethod(uTanh),
		"sigmoid":  unaryMethod(uSigmoid),
		"zero_": noArgs(func(f string, t *Tensor) (starlark.Value, error) {
			if err := fillInto(f, t, starlark.MakeInt(0)); err != nil {
				return nil, err
			}
			return t, nil
		}),
		"fill_": func(_ *starlark.Thread, f string, t *Tensor, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
			var v starlark.Value
			if err := starlark.UnpackArgs(f, args, kwargs, "value", &v); err != nil {
				return nil, err
			}
			if err := fillInto(f, t, v); err != nil {
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
			if err := copyInto(f, t, src); err != nil {
				return nil, err
			}
			return t, nil
		},
	}
	attrNames = []string{"T", "device", "dtype", "is_cuda", "is_view", "nbytes", "ndim", "shape", "storage_id", "storage_offset"}
	for k := range methods {
		attrNames = append(attrNames, k)
	}
	sort.Strings(attrNames)
	wrapGPUMethods(methods) // gpu_dispatch.go: real GPUs
}

func noArgs(fn func(fname string, t *Tensor) (starlark.Value, error)) methodFn {
	return func(_ *starlark.Thread, fname string, t *Tensor, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
		if err := starlark.UnpackArgs(fname, args, kwargs); err != nil {
			return nil, err
		}
		return fn(fname, t)
	}
}

func binaryMethod(op binOp) methodFn {
	return func(_ *starlark.Thread, fname string, t *Tensor, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
		var v starlark.Value
		var out *Tensor
		if err := starlark.UnpackArgs(fname, args, kwargs, "other", &v, "out?", &out); err != nil {
			return nil, err
		}
		o, err := asOperand(v)
		if err != nil {
			return nil, fmt.Errorf("%s: for parameter other: got %s, want tensor or number", fname, v.Type())
		}
		return binaryOut(op, operand{t: t}, o, out)
	}
}

func inplaceMethod(op binOp) methodFn {
	return func(_ *starlark.Thread, fname string, t *Tensor, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
		var v starlark.Value
		if err := starlark.UnpackArgs(fname, args, kwargs, "other", &v); err != nil {
			return nil, err
		}
		return inplace(fname, op, t, v)
	}
}

func unaryMethod(op unaryOp) methodFn {
	return noArgs(func(fname string, t *Tensor) (starlark.Value, error) { return unary(fname, op, t) })
}

func castTo(dt DType) methodFn {
	return noArgs(func(fname string, t *Tensor) (starlark.Value, error) { return convert(fname, t, t.mem.Device(), dt) })
}

// convert returns t on device (canonical) with dtype dt: t itself when
// nothing changes, otherwise a copy.
func convert(fname string, t *Tensor, device string, dt DType) (starlark.Value, error) {
	if err := t.checkLive(fname); err != nil {
		return nil, err
	}
	if device == t.mem.Device() && dt == t.dtype {
		return t, nil
	}
	return copyTo(fname, t, device, dt)
}

func methodSize(_ *starlark.Thread, fname string, t *Tensor, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	var dimV starlark.Value
	if err := starlark.UnpackArgs(fname, args, kwargs, "dim?", &dimV); err != nil {
		return nil, err
	}
	if dimV == nil || dimV == starlark.None {
		return shapeTuple(t.shape), nil
	}
	var d int
	if err := starlark.AsInt(dimV, &d); err != nil {
		return nil, fmt.Errorf("%s: for parameter dim: got %s, want int", fname, dimV.Type())
	}
	if len(t.shape) == 0 {
		return nil, fmt.Errorf("%s: dimension specified as %d but tensor has no dimensions", fname, d)
	}
	w, err := wrapDim(fname, d, len(t.shape))
	if err != nil {
		return nil, err
	}
	return starlark.MakeInt(t.shape[w]), nil
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
			if err = set(&devV, starlark.String(a.mem.Device()), "device"); err == nil {
				err = set(&dtV, a.dtype, "dtype")
			}
		case starlark.String:
			if _, ok := ParseDType(string(a)); ok {
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
	dt, err := dtypeArg(fname, dtV, t.dtype)
	if err != nil {
		return nil, err
	}
	device := t.mem.Device()
	if devV != nil && devV != starlark.None {
		if device, err = deviceArg(t.env, fname, devV); err != nil {
			return nil, err
		}
	}
	if copyFlag {
		return copyTo(fname, t, device, dt)
	}
	return convert(fname, t, device, dt)
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
	device, err := deviceArg(t.env, fname, starlark.String(s))
	if err != nil {
		return nil, err
	}
	return convert(fname, t, device, t.dtype)
}

func methodContiguous(fname string, t *Tensor) (starlark.Value, error) {
	if err := t.checkLive(fname); err != nil {
		return nil, err
	}
	if t.isContiguous() {
		return t, nil
	}
	return copyTo(fname, t, t.mem.Device(), t.dtype)
}

func reshapeMethod(fname string, t *Tensor, args starlark.Tuple, kwargs []starlark.Tuple, copyOK bool) (starlark.Value, error) {
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
	return viewAs(fname, t, shape, copyOK)
}

func methodFlatten(_ *starlark.Thread, fname string, t *Tensor, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	start, end := 0, -1
	if err := starlark.UnpackArgs(fname, args, kwargs, "start_dim?", &start, "end_dim?", &end); err != nil {
		return nil, err
	}
	if err := t.checkLive(fname); err != nil {
		return nil, err
	}
	if len(t.shape) == 0 {
		return viewAs(fname, t, []int{1}, true)
	}
	s, err := wrapDim(fname, start, len(t.shape))
	if err != nil {
		return nil, err
	}
	e, err := wrapDim(fname, end, len(t.shape))
	if err != nil {
		return nil, err
	}
	if s > e {
		return nil, fmt.Errorf("%s: start_dim cannot come after end_dim", fname)
	}
	if s == e {
		return t, nil
	}
	shape := slices.Clone(t.shape[:s])
	shape = append(shape, numel(t.shape[s:e+1]))
	shape = append(shape, t.shape[e+1:]...)
	return viewAs(fname, t, shape, true)
}

func methodTranspose(_ *starlark.Thread, fname string, t *Tensor, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	var d0, d1 int
	if err := starlark.UnpackArgs(fname, args, kwargs, "dim0", &d0, "dim1", &d1); err != nil {
		return nil, err
	}
	return transposed(fname, t, d0, d1)
}

func methodT(fname string, t *Tensor) (starlark.Value, error) {
	if len(t.shape) > 2 {
		return nil, fmt.Errorf("%s: t() expects a tensor with <= 2 dimensions, but self is %dD", fname, len(t.shape))
	}
	if len(t.shape) < 2 {
		if err := t.checkLive(fname); err != nil {
			return nil, err
		}
		return t.viewOf(slices.Clone(t.shape), slices.Clone(t.strides), t.offset), nil
	}
	return transposed(fname, t, 0, 1)
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
	return permuted(fname, t, dims)
}

func methodSqueeze(_ *starlark.Thread, fname string, t *Tensor, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	var dimV starlark.Value
	if err := starlark.UnpackArgs(fname, args, kwargs, "dim?", &dimV); err != nil {
		return nil, err
	}
	if err := t.checkLive(fname); err != nil {
		return nil, err
	}
	drop := make([]bool, len(t.shape))
	if dimV == nil || dimV == starlark.None {
		for d, s := range t.shape {
			drop[d] = s == 1
		}
	} else {
		red, err := dimsArg(fname, dimV, len(t.shape))
		if err != nil {
			return nil, err
		}
		for d, r := range red {
			drop[d] = r && t.shape[d] == 1
		}
	}
	var shape, strides []int
	for d, s := range t.shape {
		if !drop[d] {
			shape, strides = append(shape, s), append(strides, t.strides[d])
		}
	}
	return t.viewOf(shape, strides, t.offset), nil
}

func methodUnsqueeze(_ *starlark.Thread, fname string, t *Tensor, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	var d int
	if err := starlark.UnpackArgs(fname, args, kwargs, "dim", &d); err != nil {
		return nil, err
	}
	if err := t.checkLive(fname); err != nil {
		return nil, err
	}
	w, err := wrapDim(fname, d, len(t.shape)+1)
	if err != nil {
		return nil, err
	}
	return unsqueezed(t, w), nil
}

func methodExpand(_ *starlark.Thread, fname string, t *Tensor, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	if err := starlark.UnpackArgs(fname, nil, kwargs); err != nil {
		return nil, err
	}
	sizes, err := intsArg(fname, "sizes", args, true)
	if err != nil {
		return nil, err
	}
	return expanded(fname, t, sizes)
}

func methodMatmul(_ *starlark.Thread, fname string, t *Tensor, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	var other, out *Tensor
	if err := starlark.UnpackArgs(fname, args, kwargs, "other", &other, "out?", &out); err != nil {
		return nil, err
	}
	return matmulOut(fname, t, other, out)
}
