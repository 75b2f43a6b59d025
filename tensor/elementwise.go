package tensor

import (
	"fmt"
	"runtime"
	"slices"
)

// Elementwise operations: + - * / // % (out of place and in place),
// unary functions, fill and copy.

// A Scalar is a number operand, PyTorch's wrapped number: it takes part
// in type promotion only by its category (bool < integer < floating
// point), so t + 1 keeps t's integer dtype and a float16 tensor times 2.5
// stays float16. Make one with Int, Float or Bool; Item returns one.
type Scalar struct {
	dt DType // Int64, Float32 (any float) or Bool; a tensor's dtype for Item
	f  float64
	i  int64
}

// Int is the integer scalar i.
func Int(i int64) Scalar { return Scalar{dt: Int64, i: i, f: float64(i)} }

// Float is the floating-point scalar f.
func Float(f float64) Scalar { return Scalar{dt: Float32, f: f, i: int64(f)} }

// BoolScalar is the bool scalar b.
func BoolScalar(b bool) Scalar {
	i := b2i(b)
	return Scalar{dt: Bool, i: i, f: float64(i)}
}

// DType is the scalar's dtype: the dtype of the tensor Item read it from,
// or int64, float32 or bool for Int, Float and BoolScalar.
func (s Scalar) DType() DType { return s.dt }

// IsFloat reports whether the scalar is a floating-point number.
func (s Scalar) IsFloat() bool { return s.dt.IsFloat() }

// IsBool reports whether the scalar is a bool.
func (s Scalar) IsBool() bool { return s.dt == Bool }

// Float64 is the value as a float64.
func (s Scalar) Float64() float64 { return s.f }

// Int64 is the value as an int64 (truncated for a float).
func (s Scalar) Int64() int64 { return s.i }

// Bool is the value as a bool (non-zero).
func (s Scalar) Bool() bool { return s.i != 0 || (s.dt.IsFloat() && s.f != 0) }

// wrapped is the scalar's dtype for promotion: its category's wrapped
// dtype.
func (s Scalar) wrapped() DType {
	switch {
	case s.dt == Bool:
		return Bool
	case s.dt.IsFloat():
		return Float32
	}
	return Int64
}

// An Operand of an elementwise op is a *Tensor or a Scalar.
type Operand interface{ operand() operand }

func (t *Tensor) operand() operand {
	if t == nil {
		return operand{}
	}
	return operand{t: t}
}

func (s Scalar) operand() operand { return operand{dt: s.wrapped(), f: s.f, i: s.i} }

// operand is an argument of an elementwise op: a tensor or a number.
type operand struct {
	t *Tensor // nil for a number
	// for a number: its wrapped dtype (int64, float32 or bool) and value
	dt DType
	f  float64
	i  int64
	// zeroDim: a number read from a 0-dim "cpu" tensor used with tensors on
	// another device; it promotes as a 0-dim tensor of dtype dt.
	zeroDim bool
}

func operandOf(o Operand) operand {
	if o == nil {
		return operand{}
	}
	return o.operand()
}

// dtype is the operand's dtype for promotion.
func (o operand) dtype() DType {
	if o.t != nil {
		return o.t.dtype
	}
	return o.dt
}

func (o operand) shape() []int {
	if o.t != nil {
		return o.t.shape
	}
	return nil
}

// scalarOf reads a 0-dim tensor's value as a number operand that promotes
// as a 0-dim tensor.
func scalarOf(fname string, t *Tensor) (operand, error) {
	if err := t.needData(fname); err != nil {
		return operand{}, err
	}
	p := elemAddr(t.mem.Pointer(), t.offset, t.dtype.Size())
	o := operand{dt: t.dtype, f: loadF64[t.dtype](p), i: loadI64[t.dtype](p), zeroDim: true}
	runtime.KeepAlive(t)
	return o, nil
}

// sameDevice checks that the tensor operands are on one device and returns
// it. A 0-dim "cpu" tensor may be combined with tensors on another device
// (as in PyTorch): it is read as a number.
func sameDevice(fname string, ops []operand) (string, error) {
	device := ""
	for _, o := range ops {
		if o.t == nil || (len(o.t.shape) == 0 && o.t.mem.Device() == "cpu") {
			continue
		}
		if d := o.t.mem.Device(); device == "" {
			device = d
		} else if d != device {
			return "", errorf(fname, "expected all tensors to be on the same device, but found at least two devices, %s and %s", device, d)
		}
	}
	if device == "" {
		device = "cpu"
	}
	for i, o := range ops {
		if o.t != nil && o.t.mem.Device() != device {
			s, err := scalarOf(fname, o.t)
			if err != nil && !o.t.hasData() && deviceIsMeta(o.t.ctx, device) {
				// a meta session's host holds no values either: the result,
				// on the meta device, computes none, so the number's value
				// is never read (1: no division by zero)
				s, err = operand{dt: o.t.dtype, f: 1, i: 1, zeroDim: true}, nil
			}
			if err != nil {
				return "", err
			}
			ops[i] = s
		}
	}
	return device, nil
}

// broadcastShapes returns the broadcast of the shapes or an error worded
// like PyTorch's (checked from the last dimension, naming the result's
// dimension).
func broadcastShapes(fname string, shapes ...[]int) ([]int, error) {
	var out []int
	for i, s := range shapes {
		if i == 0 {
			out = slices.Clone(s)
			continue
		}
		nd := max(len(out), len(s))
		res := make([]int, nd)
		for d := nd - 1; d >= 0; d-- {
			a, b := 1, 1
			if k := d - (nd - len(out)); k >= 0 {
				a = out[k]
			}
			if k := d - (nd - len(s)); k >= 0 {
				b = s[k]
			}
			switch {
			case a == b || b == 1:
				res[d] = a
			case a == 1:
				res[d] = b
			default:
				return nil, errorf(fname, "the size of tensor a (%d) must match the size of tensor b (%d) at non-singleton dimension %d", a, b, d)
			}
		}
		out = res
	}
	return out, nil
}

// promote returns the common dtype of the operands.
func promote(ops ...operand) DType {
	rt := newResultType()
	for _, o := range ops {
		switch {
		case o.t != nil:
			rt.addTensor(o.t.dtype, len(o.t.shape))
		case o.zeroDim:
			rt.addTensor(o.dt, 0)
		default:
			rt.addScalar(o.dt)
		}
	}
	return rt.result()
}

func checkSub(fname string, op BinaryOp, x, y operand) error {
	if op == OpSub && (x.dtype() == Bool || y.dtype() == Bool) {
		if x.dtype() == Bool && y.dtype() == Bool {
			return errorf(fname, "subtraction, the `-` operator, with two bool tensors is not supported")
		}
		return errorf(fname, "subtraction, the `-` operator, with a bool tensor is not supported")
	}
	return nil
}

// argOf makes a kernel argument of an operand.
func argOf(o operand, shape []int, common DType) binArg {
	if o.t == nil {
		return numberArg(o, common, len(shape))
	}
	return binArg{s: layoutOf(o.t, shape), dt: o.t.dtype}
}

// binaryOut computes x op y into dst (the out= parameter), or into a new
// tensor when dst is nil. dst must have the broadcast shape, be on the
// operands' device, and have a dtype the result type can be cast to; it
// may be one of the operands (element for element) but not overlap one
// otherwise. With dst nothing is allocated.
func binaryOut(op BinaryOp, x, y operand, dst *Tensor) (*Tensor, error) {
	fname := binOpNames[op]
	ops := []operand{x, y}
	for _, o := range ops {
		if o.t != nil {
			if err := o.t.checkLive(fname); err != nil {
				return nil, err
			}
		}
	}
	device, err := sameDevice(fname, ops)
	if err != nil {
		return nil, err
	}
	x, y = ops[0], ops[1]
	if err := checkSub(fname, op, x, y); err != nil {
		return nil, err
	}
	common := promote(x, y)
	if op == OpDiv && !common.IsFloat() {
		common = DefaultFloat
	}
	shape, err := broadcastShapes(fname, x.shape(), y.shape())
	if err != nil {
		return nil, err
	}
	var out *Tensor
	if dst != nil {
		if err := checkOut(fname, dst, device, common, shape, x.t, y.t); err != nil {
			return nil, err
		}
		out = dst
	} else {
		e := x.t
		if e == nil {
			e = y.t
		}
		if out, err = newTensor(e.ctx, fname, device, common, shape); err != nil {
			return nil, err
		}
		withStrides(out, iterStrides(shape, x.t, y.t))
	}
	if out.hasData() && out.Numel() > 0 {
		if binaryKernel(op, layoutOf(out, shape), out.dtype, argOf(x, shape, common), argOf(y, shape, common), common, shape) {
			return nil, errorf(fname, "ZeroDivisionError: integer division by zero")
		}
	}
	runtime.KeepAlive(x.t)
	runtime.KeepAlive(y.t)
	if err := out.ctx.interrupted(fname); err != nil {
		return nil, err
	}
	return out, nil
}

// checkOut checks an out= tensor for a result of the given device, dtype
// and shape computed from the tensors ins (nil entries are numbers).
func checkOut(fname string, dst *Tensor, device string, dt DType, shape []int, ins ...*Tensor) error {
	if err := dst.checkLive(fname); err != nil {
		return err
	}
	if d := dst.mem.Device(); d != device {
		return errorf(fname, "for parameter out: expected all tensors to be on the same device, but found at least two devices, %s and %s", device, d)
	}
	if !slices.Equal(dst.shape, shape) {
		return errorf(fname, "for parameter out: shape %s does not match the result's shape %s", fmtShape(dst.shape), fmtShape(shape))
	}
	if !canCast(dt, dst.dtype) {
		return errorf(fname, "for parameter out: result type %s can't be cast to the desired output type %s", dt, dst.dtype)
	}
	if err := internalOverlap(fname, dst); err != nil {
		return err
	}
	for _, t := range ins {
		if t != nil && overlaps(dst, t) {
			return errorf(fname, "unsupported operation: some elements of the input tensor and the written-to tensor refer to a single memory location")
		}
	}
	return nil
}

// inplace computes self op= other into self; nothing is allocated.
func inplace(fname string, op BinaryOp, self *Tensor, other operand) (*Tensor, error) {
	if err := self.checkLive(fname); err != nil {
		return nil, err
	}
	ops := []operand{{t: self}, other}
	if other.t != nil {
		if err := other.t.checkLive(fname); err != nil {
			return nil, err
		}
		if len(self.shape) == 0 && self.mem.Device() == "cpu" && other.t.mem.Device() != "cpu" {
			return nil, errorf(fname, "expected all tensors to be on the same device, but found at least two devices, cpu and %s", other.t.mem.Device())
		}
	}
	if _, err := sameDevice(fname, ops); err != nil {
		return nil, err
	}
	other = ops[1]
	if err := checkSub(fname, op, ops[0], other); err != nil {
		return nil, err
	}
	common := promote(ops[0], other)
	if op == OpDiv && !common.IsFloat() {
		common = DefaultFloat
	}
	if !canCast(common, self.dtype) {
		return nil, errorf(fname, "result type %s can't be cast to the desired output type %s", common, self.dtype)
	}
	if err := checkInplaceShape(fname, self, other.shape()); err != nil {
		return nil, err
	}
	if err := internalOverlap(fname, self); err != nil {
		return nil, err
	}
	if other.t != nil && overlaps(self, other.t) {
		return nil, errorf(fname, "unsupported operation: some elements of the input tensor and the written-to tensor refer to a single memory location")
	}
	if self.hasData() && self.Numel() > 0 {
		shape := self.shape
		if binaryKernel(op, layoutOf(self, shape), self.dtype, argOf(ops[0], shape, common), argOf(other, shape, common), common, shape) {
			return nil, errorf(fname, "ZeroDivisionError: integer division by zero")
		}
	}
	runtime.KeepAlive(other.t)
	if err := self.ctx.interrupted(fname); err != nil {
		return nil, err // self may be partly written
	}
	return self, nil
}

func checkInplaceShape(fname string, self *Tensor, shape []int) error {
	b, err := broadcastShapes(fname, self.shape, shape)
	if err != nil {
		return err
	}
	if !slices.Equal(b, self.shape) {
		return errorf(fname, "output with shape %s doesn't match the broadcast shape %s", fmtShape(self.shape), fmtShape(b))
	}
	return nil
}

// internalOverlap reports whether several elements of t share memory (an
// expanded view), which in-place ops reject as PyTorch does.
func internalOverlap(fname string, t *Tensor) error {
	for d, s := range t.shape {
		if s > 1 && t.strides[d] == 0 {
			return errorf(fname, "unsupported operation: more than one element of the written-to tensor refers to a single memory location; clone() the tensor first")
		}
	}
	return nil
}

// overlaps reports whether b reads memory that a writes, other than
// element for element (the same layout), which in-place ops reject as
// PyTorch does.
func overlaps(a, b *Tensor) bool {
	if a.mem != b.mem || a.Numel() == 0 || b.Numel() == 0 {
		return false
	}
	if a.offset == b.offset && slices.Equal(a.shape, b.shape) && slices.Equal(a.strides, b.strides) {
		return false
	}
	alo, ahi := a.span()
	blo, bhi := b.span()
	return alo <= bhi && blo <= ahi
}

// span is the range of element offsets the tensor touches.
func (t *Tensor) span() (lo, hi int) {
	lo, hi = t.offset, t.offset
	for d, s := range t.shape {
		if t.strides[d] > 0 {
			hi += (s - 1) * t.strides[d]
		} else {
			lo += (s - 1) * t.strides[d]
		}
	}
	return lo, hi
}

// unary computes op(t) into a new tensor.
func unary(fname string, op UnaryOp, t *Tensor) (*Tensor, error) {
	if err := t.checkLive(fname); err != nil {
		return nil, err
	}
	if t.dtype == Bool {
		switch op {
		case OpNeg:
			return nil, errorf(fname, "negation, the `-` operator, on a bool tensor is not supported")
		case OpAbs, OpRelu:
			return nil, errorf(fname, "not implemented for 'bool'")
		}
	}
	dt := t.dtype
	if op.floatOnly() && !dt.IsFloat() {
		dt = DefaultFloat
	}
	out, err := newTensor(t.ctx, fname, t.mem.Device(), dt, t.shape)
	if err != nil {
		return nil, err
	}
	withStrides(out, iterStrides(t.shape, t))
	if out.hasData() && out.Numel() > 0 {
		unaryKernel(op, layoutOf(out, out.shape), dt, layoutOf(t, out.shape), t.dtype, out.shape)
	}
	runtime.KeepAlive(t)
	if err := t.ctx.interrupted(fname); err != nil {
		return nil, err
	}
	return out, nil
}

// unaryInto computes op(t) into t itself, element by element at the same
// offsets (so a strided t is safe to alias).
func unaryInto(fname string, op UnaryOp, t *Tensor) error {
	if err := t.checkLive(fname); err != nil {
		return err
	}
	if t.dtype == Bool && (op == OpNeg || op == OpAbs || op == OpRelu) {
		return errorf(fname, "not implemented for 'bool'")
	}
	if err := internalOverlap(fname, t); err != nil {
		return err
	}
	if t.hasData() && t.Numel() > 0 {
		l := layoutOf(t, t.shape)
		unaryKernel(op, l, t.dtype, l, t.dtype, t.shape)
	}
	runtime.KeepAlive(t)
	return t.ctx.interrupted(fname) // t may be partly written
}

// copyInto copies src (broadcast to dst's shape, any dtype) into dst, as
// Tensor.copy_. Devices may differ. Nothing is allocated.
func copyInto(fname string, dst, src *Tensor) error {
	if err := dst.checkLive(fname); err != nil {
		return err
	}
	if err := src.checkLive(fname); err != nil {
		return err
	}
	if err := checkInplaceShape(fname, dst, src.shape); err != nil {
		return err
	}
	if err := internalOverlap(fname, dst); err != nil {
		return err
	}
	if overlaps(dst, src) {
		return errorf(fname, "unsupported operation: some elements of the input tensor and the written-to tensor refer to a single memory location")
	}
	if !dst.hasData() || dst.Numel() == 0 {
		return nil
	}
	if !src.hasData() { // from a meta device: the values are unknown
		return noDataError(src.ctx, fname, src.mem.Device())
	}
	copyKernel(layoutOf(dst, dst.shape), dst.dtype, layoutOf(src, dst.shape), src.dtype, dst.shape)
	runtime.KeepAlive(dst)
	runtime.KeepAlive(src)
	return dst.ctx.interrupted(fname) // dst may be partly written
}

// fillInto stores the number v into every element of dst, as Tensor.fill_.
func fillInto(fname string, dst *Tensor, o operand) error {
	if err := dst.checkLive(fname); err != nil {
		return err
	}
	if err := internalOverlap(fname, dst); err != nil {
		return err
	}
	if dst.hasData() && dst.Numel() > 0 {
		fillKernel(layoutOf(dst, dst.shape), dst.dtype, encodeValue(dst.dtype, o), dst.shape)
	}
	runtime.KeepAlive(dst)
	return dst.ctx.interrupted(fname) // dst may be partly written
}

// fmtShape prints a shape as PyTorch does in messages: [2, 3].
func fmtShape(shape []int) string {
	b := []byte{'['}
	for i, s := range shape {
		if i > 0 {
			b = append(b, ", "...)
		}
		b = fmt.Appendf(b, "%d", s)
	}
	return string(append(b, ']'))
}
