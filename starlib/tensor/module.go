// Package tensor is memsh's "tensor" Starlark module: PyTorch-style tensors
// whose every byte lives in memory owned by the Session's backend.Manager
// (device memory of a GPU or the simulator, or C-heap memory for "cpu"),
// so that memory experiments account for it exactly.
//
// A tensor's storage is one *backend.Memory; views (indexing, slicing,
// view, reshape without copy, transpose, permute, t, expand) share it. The
// package keeps no reference to any Memory or tensor of its own: when the
// last Starlark value referring to a storage becomes unreachable, the
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
//
// The kernels run on the CPU (for "cpu" tensors and for the simulated GPU,
// whose memory is host-accessible), in parallel across cores for large
// tensors, with vectorised C loops (AVX-512/AVX2/SSE2, chosen at load
// time) for the contiguous float cases. float32/float64 matmul goes
// through OpenBLAS when libopenblas is installed (loaded at run time,
// never needed to build) and gonum's BLAS otherwise; see blas.go and the
// MEMSH_BLAS environment variable. float16 and bfloat16 compute in float32
// and round to nearest even on store.
package tensor

import (
	"fmt"
	"slices"

	"go.starlark.net/starlark"
	"go.starlark.net/starlarkstruct"

	"github.com/memsh/memsh/env"
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
		"zeros":              starlark.NewBuiltin("tensor.zeros", zeros),
		"ones":               starlark.NewBuiltin("tensor.ones", ones),
		"empty":              starlark.NewBuiltin("tensor.empty", empty),
		"full":               starlark.NewBuiltin("tensor.full", full),
		"rand":               starlark.NewBuiltin("tensor.rand", rand),
		"randn":              starlark.NewBuiltin("tensor.randn", randn),
		"arange":             starlark.NewBuiltin("tensor.arange", arange),
		"tensor":             starlark.NewBuiltin("tensor.tensor", fromData),
		"zeros_like":         starlark.NewBuiltin("tensor.zeros_like", zerosLike),
		"ones_like":          starlark.NewBuiltin("tensor.ones_like", onesLike),
		"empty_like":         starlark.NewBuiltin("tensor.empty_like", emptyLike),
		"full_like":          starlark.NewBuiltin("tensor.full_like", fullLike),
		"rand_like":          starlark.NewBuiltin("tensor.rand_like", randLike),
		"randn_like":         starlark.NewBuiltin("tensor.randn_like", randnLike),
		"cat":                starlark.NewBuiltin("tensor.cat", cat),
		"stack":              starlark.NewBuiltin("tensor.stack", stack),
		"set_default_device": starlark.NewBuiltin("tensor.set_default_device", setDefaultDevice),
		"get_default_device": starlark.NewBuiltin("tensor.get_default_device", getDefaultDevice),
		"manual_seed":        starlark.NewBuiltin("tensor.manual_seed", manualSeed),
		"initial_seed":       starlark.NewBuiltin("tensor.initial_seed", initialSeed),
		"is_tensor":          starlark.NewBuiltin("tensor.is_tensor", isTensor),
	}
	// Functions that are also Tensor methods: f(t, ...) is t.f(...).
	for _, name := range []string{
		"matmul", "relu", "neg", "abs", "exp", "log", "sqrt", "tanh", "sigmoid",
		"add", "sub", "mul", "div",
		"eq", "ne", "lt", "le", "gt", "ge", "equal", "allclose",
		"sum", "mean", "max", "min", "clone", "reshape", "transpose", "t", "permute",
		"flatten", "squeeze", "unsqueeze", "numel", "narrow", "select",
	} {
		m[name] = starlark.NewBuiltin("tensor."+name, methodAsFunction(name))
	}
	for d := range numDTypes {
		m[d.String()] = d
	}
	wrapGPUFunctions(m) // gpu_dispatch.go: real GPUs
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

// state is the module's per-Session state, kept in env.Values.
type state struct {
	seed   uint64 // Philox key
	offset uint64 // counter of the next value
}

// defaultSeed is PyTorch's default CPU seed.
const defaultSeed = 67280421310721

func stateOf(e *env.Env) *state {
	if s, ok := e.Values["tensor"].(*state); ok {
		return s
	}
	s := &state{seed: defaultSeed}
	if e.Values == nil {
		e.Values = map[string]any{}
	}
	e.Values["tensor"] = s
	return s
}

// dtypeArg converts a dtype argument (a dtype, a name, or None for def).
func dtypeArg(fname string, v starlark.Value, def DType) (DType, error) {
	switch v := v.(type) {
	case nil, starlark.NoneType:
		return def, nil
	case DType:
		return v, nil
	case starlark.String:
		if d, ok := ParseDType(string(v)); ok {
			return d, nil
		}
		return 0, fmt.Errorf("%s: unknown dtype %q", fname, string(v))
	}
	return 0, fmt.Errorf("%s: for parameter dtype: got %s, want dtype or string", fname, v.Type())
}

// deviceArg converts a device argument (a device string, or None for the
// default device) to its canonical name.
func deviceArg(e *env.Env, fname string, v starlark.Value) (string, error) {
	var s string
	switch v := v.(type) {
	case nil, starlark.NoneType:
		s = e.DefaultDevice
		if s == "" {
			s = "cpu"
		}
	case starlark.String:
		s = string(v)
	default:
		return "", fmt.Errorf("%s: for parameter device: got %s, want string", fname, v.Type())
	}
	c, err := e.Manager.Canonical(s)
	if err != nil {
		return "", fmt.Errorf("%s: %w", fname, err)
	}
	return c, nil
}

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

// maxBytes is the largest tensor size in bytes.
const maxBytes = 1 << 62

// checkSize returns the bytes a tensor of the shape and dtype needs, or an
// error if that is more than 2^62.
func checkSize(fname string, shape []int, dt DType) (uint64, error) {
	n := uint64(dt.Size())
	for _, s := range shape {
		if s == 0 {
			return 0, nil
		}
	}
	for _, s := range shape {
		if n > maxBytes/uint64(s) {
			return 0, fmt.Errorf("%s: shape %s needs more than 2^62 bytes", fname, fmtShape(shape))
		}
		n *= uint64(s)
	}
	return n, nil
}

// newTensor allocates a contiguous tensor on device (canonical name). The
// shape is checked first, so nothing is allocated on error; an
// out-of-memory error is wrapped with the builtin's name.
func newTensor(e *env.Env, fname, device string, dt DType, shape []int) (*Tensor, error) {
	nbytes, err := checkSize(fname, shape, dt)
	if err != nil {
		return nil, err
	}
	mem, err := e.Manager.Alloc(device, nbytes)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", fname, err)
	}
	return &Tensor{env: e, mem: mem, dtype: dt, shape: slices.Clone(shape), strides: contiguousStrides(shape)}, nil
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
	if _, err := e.Manager.Canonical(s); err != nil {
		return nil, fmt.Errorf("%s: %w", b.Name(), err)
	}
	e.DefaultDevice = s
	return starlark.None, nil
}

func getDefaultDevice(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	e, err := env.Of(thread, b.Name())
	if err != nil {
		return nil, err
	}
	if err := starlark.UnpackArgs(b.Name(), args, kwargs); err != nil {
		return nil, err
	}
	s := e.DefaultDevice
	if s == "" {
		s = "cpu"
	}
	return starlark.String(s), nil
}

func manualSeed(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	e, err := env.Of(thread, b.Name())
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
	st := stateOf(e)
	st.seed, st.offset = s, 0
	return starlark.None, nil
}

func initialSeed(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	e, err := env.Of(thread, b.Name())
	if err != nil {
		return nil, err
	}
	if err := starlark.UnpackArgs(b.Name(), args, kwargs); err != nil {
		return nil, err
	}
	return starlark.MakeUint64(stateOf(e).seed), nil
}

func isTensor(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	var x starlark.Value
	if err := starlark.UnpackArgs(b.Name(), args, kwargs, "obj", &x); err != nil {
		return nil, err
	}
	_, ok := x.(*Tensor)
	return starlark.Bool(ok), nil
}
