package tensor

import (
	"math"
	"runtime"
	"slices"
	"unsafe"
)

// Comparisons. Elementwise eq, ne, lt, le, gt, ge return bool tensors
// (broadcasting; operands compared in their promoted dtype, numbers
// converted to it as in PyTorch), allocated like any result and available
// on a meta device, where they hold no values. equal and allclose return a
// Go bool, so they read values and fail on a meta device.

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
func compare(fname string, op cmpOp, t *Tensor, other operand) (*Tensor, error) {
	ops := []operand{{t: t}, other}
	device, common, shape, err := prepareCompare(fname, ops)
	if err != nil {
		return nil, err
	}
	out, err := newTensor(t.ctx, fname, device, Bool, shape)
	if err != nil {
		return nil, err
	}
	if out.hasData() && out.Numel() > 0 {
		compareKernel(op, layoutOf(out, shape), cmpArgOf(ops[0], shape, common), cmpArgOf(ops[1], shape, common), shape)
	}
	runtime.KeepAlive(ops)
	if err := t.ctx.interrupted(fname); err != nil {
		return nil, err
	}
	return out, nil
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

// equal is torch.equal: the same shape and equal elements.
func equal(fname string, t, other *Tensor) (bool, error) {
	if err := t.checkLive(fname); err != nil {
		return false, err
	}
	if err := other.checkLive(fname); err != nil {
		return false, err
	}
	if !slices.Equal(t.shape, other.shape) {
		return false, nil
	}
	return allElements(fname, t, other, func(x, y float64) bool { return x == y }, func(x, y int64) bool { return x == y })
}

// allclose is torch.allclose: |t - other| <= atol + rtol·|other| for
// every element (broadcasting), NaNs equal only with equalNaN.
func allclose(fname string, t, other *Tensor, rtol, atol float64, equalNaN bool) (bool, error) {
	if rtol < 0 || atol < 0 {
		return false, errorf(fname, "rtol and atol must be non-negative, got rtol=%g atol=%g", rtol, atol)
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
	return allElements(fname, t, other, close, func(x, y int64) bool { return close(float64(x), float64(y)) })
}

// The comparison ops, public API. Eq ... Ge return a new bool tensor of
// the broadcast shape; other is a tensor or a Scalar.

// CompareOp is an elementwise comparison.
type CompareOp = cmpOp

// The comparisons.
const (
	CmpEq = cmpEq
	CmpNe = cmpNe
	CmpLt = cmpLt
	CmpLe = cmpLe
	CmpGt = cmpGt
	CmpGe = cmpGe
)

// Compare is t op other as a bool tensor.
func Compare(op CompareOp, t *Tensor, other Operand) (*Tensor, error) {
	fname := "tensor." + cmpNames[op]
	o := operandOf(other)
	if anyOnGPU(t, o.t) {
		return stagedTensor(contextOf(t, o.t), fname, []*Tensor{t, o.t}, func(s *staging) (*Tensor, error) {
			return compare(fname, op, s.shadowOf(t), s.shadowOp(o))
		})
	}
	return compare(fname, op, t, o)
}

// Eq is torch.eq: t == other elementwise.
func Eq(t *Tensor, other Operand) (*Tensor, error) { return Compare(CmpEq, t, other) }

// Ne is torch.ne.
func Ne(t *Tensor, other Operand) (*Tensor, error) { return Compare(CmpNe, t, other) }

// Lt is torch.lt.
func Lt(t *Tensor, other Operand) (*Tensor, error) { return Compare(CmpLt, t, other) }

// Le is torch.le.
func Le(t *Tensor, other Operand) (*Tensor, error) { return Compare(CmpLe, t, other) }

// Gt is torch.gt.
func Gt(t *Tensor, other Operand) (*Tensor, error) { return Compare(CmpGt, t, other) }

// Ge is torch.ge.
func Ge(t *Tensor, other Operand) (*Tensor, error) { return Compare(CmpGe, t, other) }

// Equal is torch.equal: the same shape and equal elements (reads values).
func Equal(a, b *Tensor) (bool, error) {
	const fname = "tensor.equal"
	if anyOnGPU(a, b) {
		var r bool
		err := staged(contextOf(a, b), fname, []*Tensor{a, b}, func(s *staging) error {
			var err error
			r, err = equal(fname, s.shadowOf(a), s.shadowOf(b))
			return err
		})
		return r, err
	}
	return equal(fname, a, b)
}

// Allclose is torch.allclose: |a - b| <= atol + rtol·|b| for every
// element (broadcasting); NaNs are equal only with equalNaN.
func Allclose(a, b *Tensor, rtol, atol float64, equalNaN bool) (bool, error) {
	const fname = "tensor.allclose"
	if anyOnGPU(a, b) {
		var r bool
		err := staged(contextOf(a, b), fname, []*Tensor{a, b}, func(s *staging) error {
			var err error
			r, err = allclose(fname, s.shadowOf(a), s.shadowOf(b), rtol, atol, equalNaN)
			return err
		})
		return r, err
	}
	return allclose(fname, a, b, rtol, atol, equalNaN)
}
