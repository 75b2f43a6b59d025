package tensor

import (
	"fmt"
	"strings"

	"go.starlark.net/starlark"
	"go.starlark.net/syntax"

	"github.com/memsh/memsh/backend/cuda"
	"github.com/memsh/memsh/env"
)

// Tensors on real GPUs (backend/cuda): their memory is not host-accessible,
// so every operation that touches values goes through the dispatch here.
// An operation with a GPU kernel (gpu_native.go: contiguous float
// elementwise arithmetic, relu/neg/abs/sqrt, fills, rand/randn, sum over
// all elements, float32 matmul through cuBLAS, copies and float casts) runs
// on the device; every other one runs its CPU implementation on host copies
// (gpu_stage.go) and its results are moved back, with the same allocations
// on the device as a GPU implementation would make.
//
// The hooks: every Tensor method (wrapGPUMethods, called from methods.go),
// the module's creation functions, cat and stack (wrapGPUFunctions, called
// from module.go), the Tensor value's operators, item assignment, "in" and
// str (tensor.go), and copyTo (ops_shape.go), through which every device or
// dtype conversion goes.

// onGPU returns the real GPU a tensor is stored on, or nil (CPU, simulator,
// or a shadow made by staging).
func onGPU(t *Tensor) *cuda.Device {
	if t.mem.Size() > 0 && t.mem.HostAccessible() {
		return nil
	}
	d, _ := deviceOf(t.env, t.mem.Device())
	return d
}

// deviceOf returns the real GPU behind a device string of e's Manager.
func deviceOf(e *env.Env, device string) (*cuda.Device, bool) {
	a, err := e.Manager.Allocator(device)
	if err != nil {
		return nil, false
	}
	d, ok := a.Device().(*cuda.Device)
	return d, ok
}

// gpuMetadataMethods touch no values, or only through copyTo, which has
// its own GPU path.
var gpuMetadataMethods = map[string]bool{
	"numel": true, "element_size": true, "dim": true, "is_contiguous": true, "data_ptr": true, "size": true,
	"view": true, "reshape": true, "flatten": true, "transpose": true, "t": true, "permute": true,
	"squeeze": true, "unsqueeze": true, "expand": true, "narrow": true, "select": true,
	"to": true, "cpu": true, "cuda": true, "float": true, "double": true, "half": true, "bfloat16": true,
	"long": true, "int": true, "bool": true, "clone": true, "contiguous": true,
}

// wrapGPUMethods puts the GPU dispatch in front of every method that
// touches values (methods added later included).
func wrapGPUMethods(ms map[string]methodFn) {
	for name, fn := range ms {
		if !gpuMetadataMethods[name] {
			ms[name] = gpuMethod(name, fn)
		}
	}
}

func gpuMethod(name string, fn methodFn) methodFn {
	return func(thread *starlark.Thread, fname string, t *Tensor, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
		if onGPU(t) == nil && !anyGPU(args) && !anyGPUKw(kwargs) {
			return fn(thread, fname, t, args, kwargs)
		}
		if native := gpuNativeMethods[name]; native != nil {
			if r, ok, err := native(fname, t, args, kwargs); ok {
				return r, err
			}
		}
		return shadowCall(thread, t.env, fname, append(starlark.Tuple{t}, args...), kwargs,
			func(args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
				return fn(thread, fname, args[0].(*Tensor), args[1:], kwargs)
			})
	}
}

// anyGPU reports whether a value list holds a GPU tensor (directly or in a
// list or tuple).
func anyGPU(vs starlark.Tuple) bool {
	for _, v := range vs {
		switch v := v.(type) {
		case *Tensor:
			if onGPU(v) != nil {
				return true
			}
		case starlark.Tuple:
			if anyGPU(v) {
				return true
			}
		case *starlark.List:
			for i := range v.Len() {
				if t, ok := v.Index(i).(*Tensor); ok && onGPU(t) != nil {
					return true
				}
			}
		}
	}
	return false
}

func anyGPUKw(kwargs []starlark.Tuple) bool {
	for _, kv := range kwargs {
		if anyGPU(kv[1:]) {
			return true
		}
	}
	return false
}

// shadowCall runs call on the staged arguments with the shadow Env
// installed on thread (when not nil), and maps its result back.
func shadowCall(thread *starlark.Thread, e *env.Env, fname string, args starlark.Tuple, kwargs []starlark.Tuple, call func(starlark.Tuple, []starlark.Tuple) (starlark.Value, error)) (starlark.Value, error) {
	s := newStaging(e)
	defer s.close()
	var ts []*Tensor
	collectTensors(args, &ts)
	for _, kv := range kwargs {
		collectTensors(kv[1:], &ts)
	}
	if err := s.stageTensors(ts); err != nil {
		return nil, fmt.Errorf("%s: %w", fname, err)
	}
	sargs := s.replaceAll(args)
	skw := make([]starlark.Tuple, len(kwargs))
	for i, kv := range kwargs {
		skw[i] = starlark.Tuple{kv[0], s.replace(kv[1])}
	}
	if thread != nil {
		prev, _ := env.Of(thread, fname)
		env.Install(thread, s.shadow)
		defer env.Install(thread, prev)
	}
	r, err := call(sargs, skw)
	if err != nil {
		return nil, err
	}
	return s.finish(fname, r)
}

// finish maps the result back and writes back changed inputs.
func (s *staging) finish(fname string, r starlark.Value) (starlark.Value, error) {
	m, err := s.mapValue(r)
	if err == nil {
		err = s.writeBack()
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", fname, err)
	}
	return m, nil
}

func collectTensors(vs starlark.Tuple, out *[]*Tensor) {
	for _, v := range vs {
		switch v := v.(type) {
		case *Tensor:
			*out = append(*out, v)
		case starlark.Tuple:
			collectTensors(v, out)
		case *starlark.List:
			for i := range v.Len() {
				if t, ok := v.Index(i).(*Tensor); ok {
					*out = append(*out, t)
				}
			}
		}
	}
}

func (s *staging) replaceAll(vs starlark.Tuple) starlark.Tuple {
	out := make(starlark.Tuple, len(vs))
	for i, v := range vs {
		out[i] = s.replace(v)
	}
	return out
}

// replace returns v with staged tensors replaced by their shadows.
func (s *staging) replace(v starlark.Value) starlark.Value {
	switch v := v.(type) {
	case *Tensor:
		return s.shadowOf(v)
	case starlark.Tuple:
		return s.replaceAll(v)
	case *starlark.List:
		elems := make([]starlark.Value, v.Len())
		for i := range elems {
			elems[i] = s.replace(v.Index(i))
		}
		return starlark.NewList(elems)
	}
	return v
}

// creation functions whose result wrapGPUFunctions initialises on the GPU.
var gpuCreateModes = map[string]fillMode{
	"zeros": fillZeros, "ones": fillOnes, "empty": fillNone, "rand": fillUniform, "randn": fillNormal,
	"zeros_like": fillZeros, "ones_like": fillOnes, "empty_like": fillNone, "rand_like": fillUniform, "randn_like": fillNormal,
	"full": fillNone, "full_like": fillNone, // filled with their fill_value
}

// wrapGPUFunctions puts the GPU dispatch in front of the module functions
// that are not methods: creation functions, cat and stack.
func wrapGPUFunctions(m starlark.StringDict) {
	for name, v := range m {
		b, ok := v.(*starlark.Builtin)
		if !ok || b.Receiver() != nil {
			continue
		}
		if mode, ok := gpuCreateModes[name]; ok {
			m[name] = starlark.NewBuiltin(b.Name(), gpuCreate(name, mode, b))
		} else if name == "arange" || name == "tensor" || name == "cat" || name == "stack" {
			m[name] = starlark.NewBuiltin(b.Name(), gpuShadowFunction(name, b))
		}
	}
}

// targetsGPU reports whether a creation call involves a real GPU: a GPU
// tensor argument, a device argument naming a GPU, or (without a device
// argument, for functions with a default device) a GPU default device.
func targetsGPU(e *env.Env, args starlark.Tuple, kwargs []starlark.Tuple, useDefault bool) bool {
	if anyGPU(args) || anyGPUKw(kwargs) {
		return true
	}
	isGPU := func(v starlark.Value) bool {
		s, ok := v.(starlark.String)
		if !ok {
			return false
		}
		c, err := e.Manager.Canonical(string(s))
		if err != nil {
			return false
		}
		_, gpu := deviceOf(e, c)
		return gpu
	}
	for _, v := range args {
		if isGPU(v) {
			return true
		}
	}
	for _, kv := range kwargs {
		if string(kv[0].(starlark.String)) == "device" {
			return isGPU(kv[1])
		}
	}
	if !useDefault {
		return false
	}
	_, gpu := deviceOf(e, e.DefaultDevice)
	return gpu
}

func gpuCreate(name string, mode fillMode, orig *starlark.Builtin) func(*starlark.Thread, *starlark.Builtin, starlark.Tuple, []starlark.Tuple) (starlark.Value, error) {
	return func(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
		e, err := env.Of(thread, b.Name())
		if err != nil || !targetsGPU(e, args, kwargs, true) {
			return orig.CallInternal(thread, args, kwargs)
		}
		st := stateOf(e)
		seed, offset := st.seed, st.offset
		r, err := orig.CallInternal(thread, args, kwargs)
		if err != nil {
			return nil, err
		}
		t, ok := r.(*Tensor)
		if !ok || onGPU(t) == nil || t.Numel() == 0 {
			return r, nil
		}
		var pattern uint64
		if strings.HasPrefix(name, "full") {
			v := argOrKw(args, kwargs, 1, "fill_value")
			o, _ := asOperand(v)
			pattern = encodeValue(t.dtype, o)
		} else if mode == fillOnes {
			pattern = encodeValue(t.dtype, operand{dt: Int64, i: 1, f: 1})
		}
		fill := mode == fillZeros || mode == fillOnes || strings.HasPrefix(name, "full")
		if err := gpuInit(t, mode, fill, pattern, seed, offset); err != nil {
			return nil, fmt.Errorf("%s: %w", b.Name(), err)
		}
		return t, nil
	}
}

// argOrKw returns positional argument i or the keyword argument name.
func argOrKw(args starlark.Tuple, kwargs []starlark.Tuple, i int, name string) starlark.Value {
	if i < len(args) {
		return args[i]
	}
	for _, kv := range kwargs {
		if string(kv[0].(starlark.String)) == name {
			return kv[1]
		}
	}
	return starlark.None
}

func gpuShadowFunction(name string, orig *starlark.Builtin) func(*starlark.Thread, *starlark.Builtin, starlark.Tuple, []starlark.Tuple) (starlark.Value, error) {
	useDefault := name == "arange" || name == "tensor"
	return func(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
		e, err := env.Of(thread, b.Name())
		if err != nil || !targetsGPU(e, args, kwargs, useDefault) {
			return orig.CallInternal(thread, args, kwargs)
		}
		return shadowCall(thread, e, b.Name(), args, kwargs, func(args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
			return orig.CallInternal(thread, args, kwargs)
		})
	}
}

// The Tensor value's hooks (tensor.go). Each reports whether it handled
// the operation.

func binOpOf(op syntax.Token) (binOp, bool) {
	switch op {
	case syntax.PLUS:
		return opAdd, true
	case syntax.MINUS:
		return opSub, true
	case syntax.STAR:
		return opMul, true
	case syntax.SLASH:
		return opDiv, true
	case syntax.SLASHSLASH:
		return opFloorDiv, true
	case syntax.PERCENT:
		return opMod, true
	}
	return 0, false
}

// gpuBinaryHook handles t op y (or y op t) when a GPU tensor takes part.
func gpuBinaryHook(t *Tensor, op syntax.Token, y starlark.Value, side starlark.Side) (starlark.Value, bool, error) {
	yt, _ := y.(*Tensor)
	if onGPU(t) == nil && (yt == nil || onGPU(yt) == nil) {
		return nil, false, nil
	}
	bop, ok := binOpOf(op)
	if !ok {
		return nil, false, nil
	}
	if other, err := asOperand(y); err == nil {
		x, o := operand{t: t}, other
		if side == starlark.Right {
			x, o = other, x
		}
		if r, ok, err := nativeBinary(bop, x, o); ok {
			return r, true, err
		}
	}
	r, err := shadowCall(nil, t.env, binOpNames[bop], starlark.Tuple{t, y}, nil, func(a starlark.Tuple, _ []starlark.Tuple) (starlark.Value, error) {
		return a[0].(*Tensor).Binary(op, a[1], side)
	})
	return r, true, err
}

// gpuUnaryHook handles -t for a GPU tensor.
func gpuUnaryHook(t *Tensor, op syntax.Token) (starlark.Value, bool, error) {
	if op != syntax.MINUS || onGPU(t) == nil {
		return nil, false, nil
	}
	if r, ok, err := nativeUnary("tensor.neg", uNeg, t); ok {
		return r, true, err
	}
	r, err := shadowCall(nil, t.env, "tensor.neg", starlark.Tuple{t}, nil, func(a starlark.Tuple, _ []starlark.Tuple) (starlark.Value, error) {
		return a[0].(*Tensor).Unary(op)
	})
	return r, true, err
}

// gpuSetKeyHook handles t[k] = v when t or v is on a GPU.
func gpuSetKeyHook(t *Tensor, k, v starlark.Value) (bool, error) {
	vt, _ := v.(*Tensor)
	if onGPU(t) == nil && (vt == nil || onGPU(vt) == nil) {
		return false, nil
	}
	_, err := shadowCall(nil, t.env, "tensor.__setitem__", starlark.Tuple{t, v}, nil, func(a starlark.Tuple, _ []starlark.Tuple) (starlark.Value, error) {
		return starlark.None, a[0].(*Tensor).SetKey(k, a[1])
	})
	return true, err
}

// gpuHasHook handles "x in t" for a GPU tensor.
func gpuHasHook(t *Tensor, y starlark.Value) (bool, bool, error) {
	if onGPU(t) == nil {
		return false, false, nil
	}
	r, err := shadowCall(nil, t.env, "tensor.__contains__", starlark.Tuple{t}, nil, func(a starlark.Tuple, _ []starlark.Tuple) (starlark.Value, error) {
		found, err := a[0].(*Tensor).Has(y)
		return starlark.Bool(found), err
	})
	if err != nil {
		return false, true, err
	}
	return bool(r.(starlark.Bool)), true, nil
}

// gpuStringHook formats a GPU tensor from a host copy of its values.
func gpuStringHook(t *Tensor) (string, bool) {
	if onGPU(t) == nil || t.mem.Err() != nil {
		return "", false
	}
	s := newStaging(t.env)
	defer s.close()
	stage := func() error { return s.stageTensors([]*Tensor{t}) }
	if t.Numel() > printThreshold {
		stage = func() error { return s.stagePrinted(t) } // only what the summary shows
	}
	if err := stage(); err != nil {
		return "", false
	}
	return s.shadowOf(t).String(), true
}
