// Package tensor is memsh's "tensor" Starlark module: the binding of the
// tensor engine (package github.com/memsh/memsh/tensor) to Starlark, as
// PyTorch's Python binding is to ATen. Tensors' every byte lives in memory
// owned by the Session's backend.Manager (device memory of a GPU or the
// simulator, or C-heap memory for "cpu"), so that memory experiments
// account for it exactly.
//
// This package holds only the binding: the Starlark values (Tensor, DType,
// the max/min result pair), argument unpacking and conversion of Starlark
// numbers to engine Scalars, docstrings, and one engine tensor.Context per
// Session (kept in env.Values). Every op, its allocation behaviour, its
// errors and the GPU dispatch are the engine's; the binding renames an
// op's error to the builtin that called it ("tensor.float: ...").
//
// The package keeps no reference to any Memory or tensor of its own: when
// the last Starlark value referring to a storage becomes unreachable, the
// Manager's next reclaim frees it. Operations follow PyTorch's allocation
// behaviour: an out-of-place op allocates exactly its result (a*b+c
// allocates a temporary and a result), in-place ops and views allocate
// nothing, and t.to(d) returns t itself when nothing changes.
//
// Bad arguments are reported before anything is allocated, as
// "tensor.zeros: for parameter shape: negative dimension -3"; an
// out-of-memory error from the Manager is returned wrapped, so
// backend.IsOOM still recognises it. Memory that was released (for
// instance when an experiment finished) makes every data access fail with
// the release reason; on a meta device (sim "meta" mode) results are
// allocated with their exact sizes but hold no values: ops that need values
// (item, tolist, equal, allclose, "in") fail and printing shows "...".
package tensor

import (
	"fmt"
	"math"
	"slices"

	"go.starlark.net/starlark"
	"go.starlark.net/starlarkstruct"

	"github.com/memsh/memsh/env"
	"github.com/memsh/memsh/tensor"
	"github.com/memsh/memsh/tensor/autograd"
)

// Module is the "tensor" Starlark module. Its members:
//
// Creation (shape is a list or tuple of ints, or the ints themselves as
// in zeros(2, 3); dtype a dtype or its name, default float32; device a
// device string, default tensor.get_default_device(); every result is
// allocated on the device, numel × itemsize bytes):
//
//	zeros(*shape, dtype=None, device=None)         all zeros
//	ones(*shape, dtype=None, device=None)          all ones
//	empty(*shape, dtype=None, device=None)         uninitialised values
//	full(shape, fill_value, dtype=None, device=None)  every element fill_value (dtype from it by default)
//	rand(*shape, dtype=None, device=None)          uniform in [0, 1) (floating dtypes only)
//	randn(*shape, dtype=None, device=None)         standard normal (floating dtypes only)
//	arange(start, end=None, step=1, dtype=None, device=None)  start, start+step, ... < end (int64 for ints, else float32)
//	tensor(data, dtype=None, device=None)          from a number or nested lists of numbers
//	zeros_like(t, ...) ones_like(t, ...) empty_like(t, ...) full_like(t, v, ...) rand_like(t, ...) randn_like(t, ...)
//
// Operations (allocate their result; see the Tensor methods of the same
// name for details):
//
//	matmul(a, b, out=None)     matrix product: 1-D, 2-D and batched with broadcasting
//	mm(a, b)                   product of two 2-D tensors
//	addmm(input, mat1, mat2)   input + mat1 @ mat2 (beta = alpha = 1)
//	argmax(t, dim=None, keepdim=False)  int64 indices of the largest values
//	cat(tensors, dim=0)        concatenation along an existing dimension
//	stack(tensors, dim=0)      concatenation along a new dimension
//	relu(t) neg(t) abs(t) exp(t) log(t) sqrt(t) tanh(t) sigmoid(t)
//	add(a, b, out=None) sub(...) mul(...) div(...)   out= writes into an existing tensor, allocating nothing
//	eq(a, b) ne lt le gt ge    elementwise comparisons: bool tensors
//	equal(a, b)                True if same shape and elements (reads values)
//	allclose(a, b, rtol=1e-05, atol=1e-08, equal_nan=False)   (reads values)
//	sum(t, dim=None, keepdim=False) mean(...) max(t, dim=None, keepdim=False) min(...)
//	clone(t) reshape(t, *shape) transpose(t, d0, d1) t(t) permute(t, *dims)
//	flatten(t, start_dim=0, end_dim=-1) squeeze(t, dim=None) unsqueeze(t, dim) numel(t)
//	narrow(t, dim, start, length) select(t, dim, index)   views along any dimension
//
// Settings and the random generator (per Session):
//
//	is_tensor(obj)              whether obj is a tensor
//	set_default_device(device)  the device used when none is given ("cpu" initially)
//	get_default_device()        the default device string
//	manual_seed(seed)           reseed the generator (counter reset to 0)
//	initial_seed()              the current seed
//
// The random generator is Philox-4x32-10 keyed by the 64-bit seed: the
// k-th value drawn since manual_seed comes from the counter k, so values
// are the same on every device and do not depend on parallelism.
//
// Dtypes: float32 float16 bfloat16 float64 int64 int32 int16 int8 uint8
// bool (4 2 2 8 8 4 2 1 1 1 bytes per element), as constants
// (tensor.float16) or names (dtype="float16").
//
// Errors name the builtin and, for a bad argument, the parameter:
//
//	tensor.zeros: for parameter shape: got string, want list or tuple
//	tensor.zeros: for parameter shape: negative dimension -3
//	tensor.zeros: shape [1099511627776, 1099511627776] needs more than 2^62 bytes
//	tensor.zeros: unknown dtype "float17"
//	tensor.zeros: invalid device "cuda:3": 1 CUDA device available
//	tensor.zeros: CUDA out of memory. Tried to allocate ... (wraps *backend.OOMError)
//	tensor.add: expected all tensors to be on the same device, but found at least two devices, cpu and cuda:0
//	tensor.sum: memory on cuda:0 was released when experiment 'bs=16' finished
//	tensor.item: device cuda:0 is meta: values are not stored
//	tensor.add: for parameter out: shape [3, 2] does not match the result's shape [2, 3]
//
// Meta devices: every op allocates exactly what it would with data, and
// what needs values (item, tolist, equal, allclose, "in") fails with the
// meta error above; printing shows tensor(..., device='cuda:0',
// size=(...), meta=True), since str() cannot fail.
//
// The Tensor type's attributes and methods are listed on [Tensor] and in
// methods.go.
var Module = &starlarkstruct.Module{
	Name:    "tensor",
	Members: members(),
}

func members() starlark.StringDict {
	m := starlark.StringDict{
		"zeros":              starlark.NewBuiltin("tensor.zeros", createFn(tensor.Zeros)),
		"ones":               starlark.NewBuiltin("tensor.ones", createFn(tensor.Ones)),
		"empty":              starlark.NewBuiltin("tensor.empty", createFn(tensor.Empty)),
		"full":               starlark.NewBuiltin("tensor.full", full),
		"rand":               starlark.NewBuiltin("tensor.rand", createFn(tensor.Rand)),
		"randn":              starlark.NewBuiltin("tensor.randn", createFn(tensor.Randn)),
		"arange":             starlark.NewBuiltin("tensor.arange", arange),
		"tensor":             starlark.NewBuiltin("tensor.tensor", fromData),
		"zeros_like":         starlark.NewBuiltin("tensor.zeros_like", likeFn(tensor.Zeros)),
		"ones_like":          starlark.NewBuiltin("tensor.ones_like", likeFn(tensor.Ones)),
		"empty_like":         starlark.NewBuiltin("tensor.empty_like", likeFn(tensor.Empty)),
		"full_like":          starlark.NewBuiltin("tensor.full_like", fullLike),
		"rand_like":          starlark.NewBuiltin("tensor.rand_like", likeFn(tensor.Rand)),
		"randn_like":         starlark.NewBuiltin("tensor.randn_like", likeFn(tensor.Randn)),
		"cat":                starlark.NewBuiltin("tensor.cat", catStack(autograd.Cat)),
		"stack":              starlark.NewBuiltin("tensor.stack", catStack(autograd.Stack)),
		"set_default_device": starlark.NewBuiltin("tensor.set_default_device", setDefaultDevice),
		"get_default_device": starlark.NewBuiltin("tensor.get_default_device", getDefaultDevice),
		"manual_seed":        starlark.NewBuiltin("tensor.manual_seed", manualSeed),
		"initial_seed":       starlark.NewBuiltin("tensor.initial_seed", initialSeed),
		"is_tensor":          starlark.NewBuiltin("tensor.is_tensor", isTensor),
	}
	// Functions that are also Tensor methods: f(t, ...) is t.f(...).
	for _, name := range []string{
		"matmul", "mm", "addmm", "argmax", "relu", "neg", "abs", "exp", "log", "sqrt", "tanh", "sigmoid",
		"add", "sub", "mul", "div",
		"eq", "ne", "lt", "le", "gt", "ge", "equal", "allclose",
		"sum", "mean", "max", "min", "clone", "reshape", "transpose", "t", "permute",
		"flatten", "squeeze", "unsqueeze", "numel", "narrow", "select",
	} {
		m[name] = starlark.NewBuiltin("tensor."+name, methodAsFunction(name))
	}
	for d := range tensor.NumDTypes {
		m[d.String()] = DType(d)
	}
	return m
}

// methodAsFunction makes the module function f(input, ...) of method f.
func methodAsFunction(name string) func(*starlark.Thread, *starlark.Builtin, starlark.Tuple, []starlark.Tuple) (starlark.Value, error) {
	return func(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
		var input starlark.Value
		if len(args) > 0 {
			input, args = args[0], args[1:]
		} else {
			for i, kv := range kwargs {
				if kv[0].(starlark.String) == "input" {
					input = kv[1]
					kwargs = slices.Delete(slices.Clone(kwargs), i, i+1)
					break
				}
			}
		}
		if input == nil {
			return nil, fmt.Errorf("%s: missing argument for input", b.Name())
		}
		t, ok := input.(*Tensor)
		if !ok {
			return nil, fmt.Errorf("%s: for parameter input: got %s, want tensor", b.Name(), input.Type())
		}
		return methods[name](thread, b.Name(), t, args, kwargs)
	}
}

// contextKey is the env.Values key of the Session's engine Context.
const contextKey = "tensor"

// Context returns the Session's engine Context, made on first use.
func Context(e *env.Env) *tensor.Context {
	if c, ok := e.Values[contextKey].(*tensor.Context); ok {
		return c
	}
	c := tensor.NewContext(e.Manager)
	c.DefaultDevice = e.DefaultDevice
	if e.Values == nil {
		e.Values = map[string]any{}
	}
	e.Values[contextKey] = c
	return c
}

// contextOf returns the Context of the Session running thread.
func contextOf(thread *starlark.Thread, fname string) (*tensor.Context, error) {
	e, err := env.Of(thread, fname)
	if err != nil {
		return nil, err
	}
	return Context(e), nil
}

type createFunc func(c *tensor.Context, shape []int, dt tensor.DType, device string) (*tensor.Tensor, error)

// shapeFromArgs reads a shape given as one list/tuple argument, as ints
// (zeros(2, 3)), or as the keyword shape= (or size=).
func shapeFromArgs(fname string, args starlark.Tuple, kw starlark.Value) ([]int, error) {
	switch {
	case len(args) > 0 && kw != nil:
		return nil, fmt.Errorf("%s: got multiple values for parameter shape", fname)
	case kw != nil:
		return shapeArg(fname, "shape", kw)
	case len(args) == 1:
		if _, isInt := args[0].(starlark.Int); !isInt {
			return shapeArg(fname, "shape", args[0])
		}
	case len(args) == 0:
		return nil, fmt.Errorf("%s: missing argument for shape", fname)
	}
	return shapeArg(fname, "shape", args)
}

// createFn is zeros, ones, empty, rand, randn: (*shape, dtype=None,
// device=None).
func createFn(fn createFunc) func(*starlark.Thread, *starlark.Builtin, starlark.Tuple, []starlark.Tuple) (starlark.Value, error) {
	return func(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
		fname := b.Name()
		c, err := contextOf(thread, fname)
		if err != nil {
			return nil, err
		}
		var shapeV, sizeV, dtV, devV starlark.Value
		if err := starlark.UnpackArgs(fname, nil, kwargs, "shape?", &shapeV, "dtype?", &dtV, "device?", &devV, "size?", &sizeV); err != nil {
			return nil, err
		}
		if shapeV == nil {
			shapeV = sizeV
		}
		shape, err := shapeFromArgs(fname, args, shapeV)
		if err != nil {
			return nil, err
		}
		dt, err := dtypeArg(fname, dtV, tensor.DefaultFloat)
		if err != nil {
			return nil, err
		}
		device, err := deviceArg(c, fname, devV)
		if err != nil {
			return nil, err
		}
		return resultAs(fname)(fn(c, shape, dt, device))
	}
}

func full(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	fname := b.Name()
	c, err := contextOf(thread, fname)
	if err != nil {
		return nil, err
	}
	var shapeV, fillV, dtV, devV starlark.Value
	if err := starlark.UnpackArgs(fname, args, kwargs, "shape", &shapeV, "fill_value", &fillV, "dtype?", &dtV, "device?", &devV); err != nil {
		return nil, err
	}
	shape, err := shapeArg(fname, "shape", shapeV)
	if err != nil {
		return nil, err
	}
	return fullOn(c, fname, shape, fillV, dtV, devV)
}

func fullOn(c *tensor.Context, fname string, shape []int, fillV, dtV, devV starlark.Value) (starlark.Value, error) {
	v, err := scalarArg(fillV)
	if err != nil {
		return nil, fmt.Errorf("%s: for parameter fill_value: got %s, want number", fname, fillV.Type())
	}
	dt, err := dtypeArg(fname, dtV, tensor.Undefined)
	if err != nil {
		return nil, err
	}
	device, err := deviceArg(c, fname, devV)
	if err != nil {
		return nil, err
	}
	return resultAs(fname)(tensor.Full(c, shape, v, dt, device))
}

// likeArgs parses (input, [fill_value,] dtype=None, device=None) and
// returns the input, dtype and device of the new tensor.
func likeArgs(thread *starlark.Thread, fname string, args starlark.Tuple, kwargs []starlark.Tuple, fill *starlark.Value) (c *tensor.Context, t *Tensor, dt tensor.DType, device string, err error) {
	if c, err = contextOf(thread, fname); err != nil {
		return
	}
	var dtV, devV starlark.Value
	pairs := []any{"input", &t}
	if fill != nil {
		pairs = append(pairs, "fill_value", fill)
	}
	pairs = append(pairs, "dtype?", &dtV, "device?", &devV)
	if err = starlark.UnpackArgs(fname, args, kwargs, pairs...); err != nil {
		return
	}
	if dt, err = dtypeArg(fname, dtV, t.t.DType()); err != nil {
		return
	}
	if devV == nil || devV == starlark.None {
		devV = starlark.String(t.t.Device())
	}
	device, err = deviceArg(c, fname, devV)
	return
}

func likeFn(fn createFunc) func(*starlark.Thread, *starlark.Builtin, starlark.Tuple, []starlark.Tuple) (starlark.Value, error) {
	return func(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
		c, t, dt, device, err := likeArgs(thread, b.Name(), args, kwargs, nil)
		if err != nil {
			return nil, err
		}
		return resultAs(b.Name())(fn(c, t.t.Shape(), dt, device))
	}
}

func fullLike(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	var fill starlark.Value
	c, t, dt, device, err := likeArgs(thread, b.Name(), args, kwargs, &fill)
	if err != nil {
		return nil, err
	}
	return fullOn(c, b.Name(), t.t.Shape(), fill, DType(dt), starlark.String(device))
}

func arange(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	fname := b.Name()
	c, err := contextOf(thread, fname)
	if err != nil {
		return nil, err
	}
	var startV, endV, dtV, devV starlark.Value
	var stepV starlark.Value = starlark.MakeInt(1)
	if err := starlark.UnpackArgs(fname, args, kwargs, "start", &startV, "end?", &endV, "step?", &stepV, "dtype?", &dtV, "device?", &devV); err != nil {
		return nil, err
	}
	if endV == nil || endV == starlark.None {
		startV, endV = starlark.MakeInt(0), startV
	}
	var vals [3]tensor.Scalar
	for i, p := range []struct {
		name string
		v    starlark.Value
	}{{"start", startV}, {"end", endV}, {"step", stepV}} {
		s, err := scalarArg(p.v)
		if err != nil || s.IsBool() {
			return nil, fmt.Errorf("%s: for parameter %s: got %s, want int or float", fname, p.name, p.v.Type())
		}
		vals[i] = s
	}
	dt, err := dtypeArg(fname, dtV, tensor.Undefined)
	if err != nil {
		return nil, err
	}
	if dt == tensor.Bool {
		return nil, fmt.Errorf("%s: for parameter dtype: arange does not support bool", fname)
	}
	device, err := deviceArg(c, fname, devV)
	if err != nil {
		return nil, err
	}
	if vals[2].Float64() == 0 {
		return nil, fmt.Errorf("%s: for parameter step: step must be nonzero", fname)
	}
	for _, s := range vals[:2] {
		if f := s.Float64(); math.IsNaN(f) || math.IsInf(f, 0) {
			return nil, fmt.Errorf("%s: unsupported range: %v -> %v", fname, startV, endV)
		}
	}
	return resultAs(fname)(tensor.Arange(c, vals[0], vals[1], vals[2], dt, device))
}

// fromData is tensor.tensor(data, dtype=None, device=None): a new tensor
// holding a number (0-dim) or nested lists/tuples of numbers.
func fromData(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	fname := b.Name()
	c, err := contextOf(thread, fname)
	if err != nil {
		return nil, err
	}
	var data, dtV, devV starlark.Value
	if err := starlark.UnpackArgs(fname, args, kwargs, "data", &data, "dtype?", &dtV, "device?", &devV); err != nil {
		return nil, err
	}
	if src, ok := data.(*Tensor); ok {
		dt, err := dtypeArg(fname, dtV, src.t.DType())
		if err != nil {
			return nil, err
		}
		if devV == nil || devV == starlark.None {
			devV = starlark.String(src.t.Device())
		}
		device, err := deviceArg(c, fname, devV)
		if err != nil {
			return nil, err
		}
		return resultAs(fname)(autograd.To(src.t, device, dt, true))
	}
	// Walk the nested sequences: shape, values.
	var shape []int
	var flat []tensor.Scalar
	var walk func(v starlark.Value, depth int) error
	walk = func(v starlark.Value, depth int) error {
		if seq, ok := v.(starlark.Indexable); ok && v.Type() != "string" && v.Type() != "bytes" {
			n := seq.Len()
			if depth == len(shape) {
				if len(flat) > 0 {
					return fmt.Errorf("%s: expected a number at dim %d, got %s", fname, depth, v.Type())
				}
				shape = append(shape, n)
			} else if depth > len(shape) || shape[depth] != n {
				return fmt.Errorf("%s: expected sequence of length %d at dim %d (got %d)", fname, shape[min(depth, len(shape)-1)], depth, n)
			}
			for i := range n {
				if err := walk(seq.Index(i), depth+1); err != nil {
					return err
				}
			}
			return nil
		}
		s, err := scalarArg(v)
		if err != nil {
			return fmt.Errorf("%s: for parameter data: got %s, want number or list", fname, v.Type())
		}
		if depth != len(shape) {
			return fmt.Errorf("%s: expected sequence of length %d at dim %d (got %s)", fname, shape[depth], depth, v.Type())
		}
		flat = append(flat, s)
		return nil
	}
	if err := walk(data, 0); err != nil {
		return nil, err
	}
	dt, err := dtypeArg(fname, dtV, tensor.InferDType(flat))
	if err != nil {
		return nil, err
	}
	device, err := deviceArg(c, fname, devV)
	if err != nil {
		return nil, err
	}
	return resultAs(fname)(tensor.FromScalars(c, flat, shape, dt, device))
}

// catStack is cat and stack: (tensors, dim=0).
func catStack(fn func([]*tensor.Tensor, int) (*tensor.Tensor, error)) func(*starlark.Thread, *starlark.Builtin, starlark.Tuple, []starlark.Tuple) (starlark.Value, error) {
	return func(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
		fname := b.Name()
		var tv starlark.Value
		dim := 0
		if err := starlark.UnpackArgs(fname, args, kwargs, "tensors", &tv, "dim?", &dim); err != nil {
			return nil, err
		}
		ts, err := tensorList(fname, tv)
		if err != nil {
			return nil, err
		}
		return resultAs(fname)(fn(ts, dim))
	}
}

func setDefaultDevice(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	e, err := env.Of(thread, b.Name())
	if err != nil {
		return nil, err
	}
	var dev starlark.Value
	if err := starlark.UnpackArgs(b.Name(), args, kwargs, "device", &dev); err != nil {
		return nil, err
	}
	s := "cpu"
	if dev != starlark.None {
		str, ok := dev.(starlark.String)
		if !ok {
			return nil, fmt.Errorf("%s: for parameter device: got %s, want string", b.Name(), dev.Type())
		}
		s = string(str)
	}
	if err := Context(e).SetDefaultDevice(s); err != nil {
		return nil, fmt.Errorf("%s: %w", b.Name(), err)
	}
	e.DefaultDevice = s
	return starlark.None, nil
}

func getDefaultDevice(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	c, err := contextOf(thread, b.Name())
	if err != nil {
		return nil, err
	}
	if err := starlark.UnpackArgs(b.Name(), args, kwargs); err != nil {
		return nil, err
	}
	s := c.DefaultDevice
	if s == "" {
		s = "cpu"
	}
	return starlark.String(s), nil
}

func manualSeed(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	c, err := contextOf(thread, b.Name())
	if err != nil {
		return nil, err
	}
	var seed starlark.Int
	if err := starlark.UnpackArgs(b.Name(), args, kwargs, "seed", &seed); err != nil {
		return nil, err
	}
	var s uint64
	if i, ok := seed.Int64(); ok {
		s = uint64(i)
	} else if u, ok := seed.Uint64(); ok {
		s = u
	} else {
		return nil, fmt.Errorf("%s: for parameter seed: %s does not fit in 64 bits", b.Name(), seed)
	}
	c.ManualSeed(s)
	return starlark.None, nil
}

func initialSeed(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	c, err := contextOf(thread, b.Name())
	if err != nil {
		return nil, err
	}
	if err := starlark.UnpackArgs(b.Name(), args, kwargs); err != nil {
		return nil, err
	}
	return starlark.MakeUint64(c.InitialSeed()), nil
}

func isTensor(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	var x starlark.Value
	if err := starlark.UnpackArgs(b.Name(), args, kwargs, "obj", &x); err != nil {
		return nil, err
	}
	_, ok := x.(*Tensor)
	return starlark.Bool(ok), nil
}
