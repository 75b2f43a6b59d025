package tensor

import (
	"fmt"
	"math"
	"runtime"
	"slices"
	"unsafe"

	"go.starlark.net/starlark"
	"go.starlark.net/syntax"
)

// Comparisons. Elementwise eq, ne, lt, le, gt, ge return bool tensors
// (broadcasting; operands compared in their promoted dtype, numbers
// converted to it as in PyTorch), allocated like any result and available
// on a meta device, where they hold no values. equal and allclose return a
// Starlark bool, so they read values and fail on a meta device. Starlark's
// own == and != on tensors compare identity (they cannot return a tensor),
// and < <= > >= are errors that point to these methods.

type cmpOp uint8

const (
	cmpEq cmpOp = iota
	cmpNe
	cmpLt
	cmpLe
	cmpGt
	cmpGe
)

var cmpNames = [...]string{cmpEq: "eq", cmpNe: "ne", cmpLt: "lt", cmpLe: "le", cmpGt: "gt", cmpGe: "ge"}

// cmpValues applies op to x and y (float64 for floating dtypes, int64 for
// the others).
func cmpValues[T int64 | float64](op cmpOp, x, y T) bool {
	switch op {
	case cmpEq:
		return x == y
	case cmpNe:
		return x != y
	case cmpLt:
		return x < y
	case cmpLe:
		return x <= y
	case cmpGt:
		return x > y
	}
	return x >= y
}

// cmpLoader returns how to read an operand as the common dtype: floats as
// float64 (rounded to a half common dtype's precision), integers as int64.
type cmpLoader struct {
	f func(unsafe.Pointer) float64
	i func(unsafe.Pointer) int64
}

func loaderFor(src, common DType) cmpLoader {
	if !common.IsFloat() {
		return cmpLoader{i: loadI64[src]}
	}
	if common == Float64 {
		return cmpLoader{f: loadF64[src]}
	}
	l := loaderF32(src, common)
	return cmpLoader{f: func(p unsafe.Pointer) float64 { return float64(l(p)) }}
}

// cmpArg is an operand of a comparison kernel.
type cmpArg struct {
	s strided
	l cmpLoader
}

// cmpArgOf makes the kernel argument of o: a number is converted to the
// common dtype (and rounded to it) and stored as a stride-0 operand.
func cmpArgOf(o operand, shape []int, common DType) cmpArg {
	if o.t != nil {
		return cmpArg{s: layoutOf(o.t, shape), l: loaderFor(o.t.dtype, common)}
	}
	var buf [8]byte
	p := unsafe.Pointer(&buf[0])
	if common.IsFloat() {
		storeF64[Float64](p, o.f)
		if common != Float64 {
			storeF64[Float64](p, float64(roundF32(common, float32(o.f))))
		}
		return cmpArg{s: strided{base: p, size: 8, st: make([]int, len(shape))}, l: cmpLoader{f: loadF64[Float64]}}
	}
	storeI64[Int64](p, o.i)
	return cmpArg{s: strided{base: p, size: 8, st: make([]int, len(shape))}, l: cmpLoader{i: loadI64[Int64]}}
}

// compareKernel stores a op b as bool into out over shape.
func compareKernel(op cmpOp, out strided, a, b cmpArg, shape []int) {
	it := newElemIter(shape, out, a.s, b.s)
	so, sa, sb := it.inner[0], it.inner[1], it.inner[2]
	it.run(func(p []unsafe.Pointer, n int) {
		o, x, y := p[0], p[1], p[2]
		for range n {
			var r bool
			if a.l.f != nil {
				r = cmpValues(op, a.l.f(x), b.l.f(y))
			} else {
				r = cmpValues(op, a.l.i(x), b.l.i(y))
			}
			st(o, uint8(b2i(r)))
			o, x, y = unsafe.Add(o, so), unsafe.Add(x, sa), unsafe.Add(y, sb)
		}
	})
}

// prepareCompare checks the operands and returns the device, common dtype
// and broadcast shape.
func prepareCompare(fname string, ops []operand) (string, DType, []int, error) {
	for _, o := range ops {
		if o.t != nil {
			if err := o.t.checkLive(fname); err != nil {
				return "", 0, nil, err
			}
		}
	}
	device, err := sameDevice(fname, ops)
	if err != nil {
		return "", 0, nil, err
	}
	shape, err := broadcastShapes(fname, ops[0].shape(), ops[1].shape())
	if err != nil {
		return "", 0, nil, err
	}
	return device, promote(ops[0], ops[1]), shape, nil
}

// compare computes the bool tensor t op other.
func compare(fname string, op cmpOp, t *Tensor, otherV starlark.Value) (starlark.Value, error) {
	other, err := asOperand(otherV)
	if err != nil {
		return nil, fmt.Errorf("%s: for parameter other: got %s, want tensor or number", fname, otherV.Type())
	}
	ops := []operand{{t: t}, other}
	device, common, shape, err := prepareCompare(fname, ops)
	if err != nil {
		return nil, err
	}
	out, err := newTensor(t.env, fname, device, Bool, shape)
	if err != nil {
		return nil, err
	}
	if out.hasData() && out.Numel() > 0 {
		compareKernel(op, layoutOf(out, shape), cmpArgOf(ops[0], shape, common), cmpArgOf(ops[1], shape, common), shape)
	}
	runtime.KeepAlive(ops)
	return out, nil
}

func compareMethod(op cmpOp) methodFn {
	return func(_ *starlark.Thread, fname string, t *Tensor, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
		var v starlark.Value
		if err := starlark.UnpackArgs(fname, args, kwargs, "other", &v); err != nil {
			return nil, err
		}
		return compare(fname, op, t, v)
	}
}

// allElements reports whether pred holds for every pair of elements of a
// and b broadcast together (read as float64, or int64 when both are
// integer or bool), without allocating tensor memory.
func allElements(fname string, a, b *Tensor, predF func(x, y float64) bool, predI func(x, y int64) bool) (bool, error) {
	ops := []operand{{t: a}, {t: b}}
	if _, _, _, err := prepareCompare(fname, ops); err != nil {
		return false, err
	}
	if err := a.needData(fname); err != nil {
		return false, err
	}
	if err := b.needData(fname); err != nil {
		return false, err
	}
	shape, _ := broadcastShapes(fname, a.shape, b.shape)
	it := newElemIter(shape, layoutOf(a, shape), layoutOf(b, shape))
	sa, sb := it.inner[0], it.inner[1]
	ints := !a.dtype.IsFloat() && !b.dtype.IsFloat()
	la, lb := loadF64[a.dtype], loadF64[b.dtype]
	ia, ib := loadI64[a.dtype], loadI64[b.dtype]
	ok := true
	if it.n > 0 {
		it.runRange(0, it.n, func(p []unsafe.Pointer, n int) {
			x, y := p[0], p[1]
			for range n {
				if !ok {
					return
				}
				if ints {
					ok = predI(ia(x), ib(y))
				} else {
					ok = predF(la(x), lb(y))
				}
				x, y = unsafe.Add(x, sa), unsafe.Add(y, sb)
			}
		})
	}
	runtime.KeepAlive(a)
	runtime.KeepAlive(b)
	return ok, nil
}

// methodEqual is torch.equal: the same shape and equal elements.
func methodEqual(_ *starlark.Thread, fname string, t *Tensor, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	var other *Tensor
	if err := starlark.UnpackArgs(fname, args, kwargs, "other", &other); err != nil {
		return nil, err
	}
	if err := t.checkLive(fname); err != nil {
		return nil, err
	}
	if err := other.checkLive(fname); err != nil {
		return nil, err
	}
	if !slices.Equal(t.shape, other.shape) {
		return starlark.False, nil
	}
	ok, err := allElements(fname, t, other, func(x, y float64) bool { return x == y }, func(x, y int64) bool { return x == y })
	return starlark.Bool(ok), err
}

// methodAllclose is torch.allclose: |t - other| <= atol + rtol·|other|
// for every element (broadcasting), NaNs equal only with equal_nan.
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
	if rtol < 0 || atol < 0 {
		return nil, fmt.Errorf("%s: rtol and atol must be non-negative, got rtol=%g atol=%g", fname, rtol, atol)
	}
	close := func(x, y float64) bool {
		switch {
		case math.IsNaN(x) || math.IsNaN(y):
			return equalNaN && math.IsNaN(x) && math.IsNaN(y)
		case x == y:
			return true
		}
		return math.Abs(x-y) <= atol+rtol*math.Abs(y)
	}
	ok, err := allElements(fname, t, other, close, func(x, y int64) bool { return close(float64(x), float64(y)) })
	return starlark.Bool(ok), err
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

// CompareSameType implements == and != as identity (PyTorch's elementwise
// == cannot return a tensor in Starlark); ordering comparisons fail with a
// pointer to the elementwise methods.
func (t *Tensor) CompareSameType(op syntax.Token, y starlark.Value, depth int) (bool, error) {
	switch op {
	case syntax.EQL:
		return t == y, nil
	case syntax.NEQ:
		return t != y, nil
	}
	return false, fmt.Errorf("tensor %s tensor: not supported: use t.lt(other), t.le, t.gt, t.ge, t.eq, t.ne for elementwise comparisons, or t.equal(other)", op)
}
