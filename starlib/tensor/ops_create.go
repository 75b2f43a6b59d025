package tensor

import (
	"fmt"
	"math"
	"math/big"

	"go.starlark.net/starlark"

	"github.com/memsh/memsh/env"
)

// Creation functions.

// fillMode says how a created tensor is initialised.
type fillMode int

const (
	fillNone    fillMode = iota // empty: uninitialised, as in PyTorch
	fillZeros                   // zeros
	fillOnes                    // ones
	fillUniform                 // rand
	fillNormal                  // randn
)

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

// createArgs parses (*shape, dtype=None, device=None).
func createArgs(thread *starlark.Thread, fname string, args starlark.Tuple, kwargs []starlark.Tuple) (e *env.Env, shape []int, dt DType, device string, err error) {
	e, err = env.Of(thread, fname)
	if err != nil {
		return
	}
	var shapeV, sizeV, dtV, devV starlark.Value
	if err = starlark.UnpackArgs(fname, nil, kwargs, "shape?", &shapeV, "dtype?", &dtV, "device?", &devV, "size?", &sizeV); err != nil {
		return
	}
	if shapeV == nil {
		shapeV = sizeV
	}
	if shape, err = shapeFromArgs(fname, args, shapeV); err != nil {
		return
	}
	if dt, err = dtypeArg(fname, dtV, DefaultFloat); err != nil {
		return
	}
	device, err = deviceArg(e, fname, devV)
	return
}

func zeros(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	return create(thread, b.Name(), args, kwargs, fillZeros)
}

func ones(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	return create(thread, b.Name(), args, kwargs, fillOnes)
}

func empty(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	return create(thread, b.Name(), args, kwargs, fillNone)
}

func rand(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	return create(thread, b.Name(), args, kwargs, fillUniform)
}

func randn(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	return create(thread, b.Name(), args, kwargs, fillNormal)
}

func create(thread *starlark.Thread, fname string, args starlark.Tuple, kwargs []starlark.Tuple, mode fillMode) (starlark.Value, error) {
	e, shape, dt, device, err := createArgs(thread, fname, args, kwargs)
	if err != nil {
		return nil, err
	}
	return createOn(e, fname, shape, dt, device, mode)
}

// createOn allocates and initialises a tensor.
func createOn(e *env.Env, fname string, shape []int, dt DType, device string, mode fillMode) (*Tensor, error) {
	if (mode == fillUniform || mode == fillNormal) && !dt.IsFloat() {
		return nil, fmt.Errorf("%s: for parameter dtype: want a floating-point dtype, got %s", fname, dt)
	}
	t, err := newTensor(e, fname, device, dt, shape)
	if err != nil {
		return nil, err
	}
	initTensor(t, mode)
	return t, nil
}

// initTensor fills a new contiguous tensor according to mode. Random modes
// advance the generator by numel even on a meta device, so later draws do
// not depend on where earlier ones went.
func initTensor(t *Tensor, mode fillMode) {
	n := t.Numel()
	var seed, offset uint64
	if mode == fillUniform || mode == fillNormal {
		st := stateOf(t.env)
		seed, offset = st.seed, st.offset
		st.offset += uint64(n)
	}
	if !t.hasData() || n == 0 {
		return
	}
	lay := layoutOf(t, t.shape)
	switch mode {
	case fillZeros:
		fillKernel(lay, t.dtype, 0, t.shape)
	case fillOnes:
		fillKernel(lay, t.dtype, encodeValue(t.dtype, operand{dt: Int64, i: 1, f: 1}), t.shape)
	case fillUniform, fillNormal:
		randomKernel(t.mem.Pointer(), t.dtype, n, seed, offset, mode == fillNormal)
	}
}

func full(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	fname := b.Name()
	e, err := env.Of(thread, fname)
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
	return fullOn(e, fname, shape, fillV, dtV, devV)
}

func fullOn(e *env.Env, fname string, shape []int, fillV, dtV, devV starlark.Value) (*Tensor, error) {
	v, err := asOperand(fillV)
	if err != nil || v.t != nil {
		return nil, fmt.Errorf("%s: for parameter fill_value: got %s, want number", fname, fillV.Type())
	}
	dt, err := dtypeArg(fname, dtV, v.dt)
	if err != nil {
		return nil, err
	}
	device, err := deviceArg(e, fname, devV)
	if err != nil {
		return nil, err
	}
	t, err := newTensor(e, fname, device, dt, shape)
	if err != nil {
		return nil, err
	}
	if t.hasData() && t.Numel() > 0 {
		fillKernel(layoutOf(t, t.shape), dt, encodeValue(dt, v), t.shape)
	}
	return t, nil
}

// likeArgs parses (input, [fill_value,] dtype=None, device=None) and
// returns the shape, dtype and device of the new tensor.
func likeArgs(thread *starlark.Thread, fname string, args starlark.Tuple, kwargs []starlark.Tuple, fill *starlark.Value) (e *env.Env, t *Tensor, dt DType, device string, err error) {
	if e, err = env.Of(thread, fname); err != nil {
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
	if dt, err = dtypeArg(fname, dtV, t.dtype); err != nil {
		return
	}
	if devV == nil || devV == starlark.None {
		devV = starlark.String(t.mem.Device())
	}
	device, err = deviceArg(e, fname, devV)
	return
}

func likeFn(mode fillMode) func(*starlark.Thread, *starlark.Builtin, starlark.Tuple, []starlark.Tuple) (starlark.Value, error) {
	return func(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
		e, t, dt, device, err := likeArgs(thread, b.Name(), args, kwargs, nil)
		if err != nil {
			return nil, err
		}
		return createOn(e, b.Name(), t.shape, dt, device, mode)
	}
}

var (
	zerosLike = likeFn(fillZeros)
	onesLike  = likeFn(fillOnes)
	emptyLike = likeFn(fillNone)
	randLike  = likeFn(fillUniform)
	randnLike = likeFn(fillNormal)
)

func fullLike(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	var fill starlark.Value
	e, t, dt, device, err := likeArgs(thread, b.Name(), args, kwargs, &fill)
	if err != nil {
		return nil, err
	}
	return fullOn(e, b.Name(), t.shape, fill, dt, starlark.String(device))
}

func arange(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	fname := b.Name()
	e, err := env.Of(thread, fname)
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
	var vals [3]operand
	anyFloat := false
	for i, p := range []struct {
		name string
		v    starlark.Value
	}{{"start", startV}, {"end", endV}, {"step", stepV}} {
		o, err := asOperand(p.v)
		if err != nil || o.t != nil || o.dt == Bool {
			return nil, fmt.Errorf("%s: for parameter %s: got %s, want int or float", fname, p.name, p.v.Type())
		}
		vals[i] = o
		anyFloat = anyFloat || o.dt.IsFloat()
	}
	def := Int64
	if anyFloat {
		def = DefaultFloat
	}
	dt, err := dtypeArg(fname, dtV, def)
	if err != nil {
		return nil, err
	}
	if dt == Bool {
		return nil, fmt.Errorf("%s: for parameter dtype: arange does not support bool", fname)
	}
	device, err := deviceArg(e, fname, devV)
	if err != nil {
		return nil, err
	}
	start, end, step := vals[0], vals[1], vals[2]
	if step.f == 0 {
		return nil, fmt.Errorf("%s: for parameter step: step must be nonzero", fname)
	}
	if math.IsNaN(start.f) || math.IsInf(start.f, 0) || math.IsNaN(end.f) || math.IsInf(end.f, 0) {
		return nil, fmt.Errorf("%s: unsupported range: %v -> %v", fname, startV, endV)
	}
	if (step.f > 0 && end.f < start.f) || (step.f < 0 && end.f > start.f) {
		return nil, fmt.Errorf("%s: upper bound and larger bound inconsistent with step sign", fname)
	}
	// The length, checked in float64 first so that huge ranges fail
	// cleanly, then computed exactly for integers.
	nf := math.Ceil((end.f - start.f) / step.f)
	if nf > maxBytes {
		return nil, fmt.Errorf("%s: shape [%.0f] needs more than 2^62 bytes", fname, nf)
	}
	var n int
	if anyFloat {
		n = int(nf)
	} else {
		d := new(big.Int).Sub(big.NewInt(end.i), big.NewInt(start.i))
		d.Add(d, big.NewInt(step.i-sign(step.i)))
		n = int(d.Quo(d, big.NewInt(step.i)).Int64())
	}
	shape := []int{max(n, 0)}
	t, err := newTensor(e, fname, device, dt, shape)
	if err != nil {
		return nil, err
	}
	if t.hasData() && n > 0 {
		p, size := t.mem.Pointer(), dt.Size()
		if anyFloat || dt.IsFloat() {
			store := storeF64[dt]
			for i := range n {
				store(elemAddr(p, i, size), start.f+float64(i)*step.f)
			}
		} else {
			store := storeI64[dt]
			for i := range n {
				store(elemAddr(p, i, size), start.i+int64(i)*step.i)
			}
		}
	}
	return t, nil
}

func sign(x int64) int64 {
	if x < 0 {
		return -1
	}
	return 1
}

// fromData is tensor.tensor(data, dtype=None, device=None): a new tensor
// holding a number (0-dim) or nested lists/tuples of numbers.
func fromData(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	fname := b.Name()
	e, err := env.Of(thread, fname)
	if err != nil {
		return nil, err
	}
	var data, dtV, devV starlark.Value
	if err := starlark.UnpackArgs(fname, args, kwargs, "data", &data, "dtype?", &dtV, "device?", &devV); err != nil {
		return nil, err
	}
	if src, ok := data.(*Tensor); ok {
		dt, err := dtypeArg(fname, dtV, src.dtype)
		if err != nil {
			return nil, err
		}
		if devV == nil || devV == starlark.None {
			devV = starlark.String(src.mem.Device())
		}
		device, err := deviceArg(e, fname, devV)
		if err != nil {
			return nil, err
		}
		return copyTo(fname, src, device, dt)
	}
	// Walk the nested sequences: shape, values, inferred dtype.
	var shape []int
	var flat []operand
	inferred := undefined
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
		o, err := asOperand(v)
		if err != nil || o.t != nil {
			return fmt.Errorf("%s: for parameter data: got %s, want number or list", fname, v.Type())
		}
		if depth != len(shape) {
			return fmt.Errorf("%s: expected sequence of length %d at dim %d (got %s)", fname, shape[depth], depth, v.Type())
		}
		flat = append(flat, o)
		if inferred == undefined || o.dt.category() > inferred.category() {
			inferred = o.dt
		}
		return nil
	}
	if err := walk(data, 0); err != nil {
		return nil, err
	}
	if inferred == undefined {
		inferred = DefaultFloat
	}
	dt, err := dtypeArg(fname, dtV, inferred)
	if err != nil {
		return nil, err
	}
	device, err := deviceArg(e, fname, devV)
	if err != nil {
		return nil, err
	}
	t, err := newTensor(e, fname, device, dt, shape)
	if err != nil {
		return nil, err
	}
	if t.hasData() && len(flat) > 0 {
		p, size := t.mem.Pointer(), dt.Size()
		for i, o := range flat {
			if o.dt.IsFloat() {
				storeF64[dt](elemAddr(p, i, size), o.f)
			} else {
				storeI64[dt](elemAddr(p, i, size), o.i)
			}
		}
	}
	return t, nil
}
