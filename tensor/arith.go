package tensor

// The elementwise arithmetic ops, public API: out of place (a new
// tensor of the broadcast shape and the promoted dtype), into an existing
// tensor (Out: allocates nothing) and in place (the methods ending in "_":
// allocate nothing, return the receiver). Operands are tensors or Scalars
// (see Operand); at least one must be a tensor. Broadcasting and type
// promotion are PyTorch's; true division of integers gives float32.
// Errors are PyTorch's, prefixed with the op's name ("tensor.add: the
// size of tensor a (2) must match the size of tensor b (3) at
// non-singleton dimension 1").

var binOpNames = [...]string{
	OpAdd:         "tensor.add",
	OpSub:         "tensor.sub",
	OpMul:         "tensor.mul",
	OpDiv:         "tensor.div",
	OpFloorDivide: "tensor.floor_divide",
	OpRemainder:   "tensor.remainder",
}

var inplaceNames = [...]string{
	OpAdd:         "tensor.add_",
	OpSub:         "tensor.sub_",
	OpMul:         "tensor.mul_",
	OpDiv:         "tensor.div_",
	OpFloorDivide: "tensor.floor_divide_",
	OpRemainder:   "tensor.remainder_",
}

// String is the op's name as in error messages ("tensor.add").
func (op BinaryOp) String() string { return binOpNames[op] }

var unaryNames = [...]string{
	OpNeg:     "tensor.neg",
	OpAbs:     "tensor.abs",
	OpRelu:    "tensor.relu",
	OpExp:     "tensor.exp",
	OpLog:     "tensor.log",
	OpSqrt:    "tensor.sqrt",
	OpTanh:    "tensor.tanh",
	OpSigmoid: "tensor.sigmoid",
}

// String is the op's name as in error messages ("tensor.neg").
func (op UnaryOp) String() string { return unaryNames[op] }

// Binary is x op y into a new tensor.
func Binary(op BinaryOp, x, y Operand) (*Tensor, error) { return BinaryOut(op, x, y, nil) }

// BinaryOut is x op y into out (the out= parameter), or into a new tensor
// when out is nil. out must have the broadcast shape, be on the operands'
// device, and have a dtype the result type can be cast to (CanCast); it
// may be one of the operands (element for element) but not overlap one
// otherwise. With out nothing is allocated, and out's version is bumped.
func BinaryOut(op BinaryOp, x, y Operand, out *Tensor) (*Tensor, error) {
	fname := binOpNames[op]
	ox, oy := operandOf(x), operandOf(y)
	if ox.t == nil && oy.t == nil {
		return nil, errorf(fname, "at least one operand must be a tensor")
	}
	var r *Tensor
	var err error
	if anyOnGPU(ox.t, oy.t, out) {
		ok := false
		if out == nil {
			r, ok, err = nativeBinary(op, ox, oy)
		}
		if !ok {
			r, err = stagedTensor(contextOf(ox.t, oy.t, out), fname, []*Tensor{ox.t, oy.t, out}, func(s *staging) (*Tensor, error) {
				return binaryOut(op, s.shadowOp(ox), s.shadowOp(oy), s.shadowOf(out))
			})
		}
	} else {
		r, err = binaryOut(op, ox, oy, out)
	}
	if err != nil {
		return nil, err
	}
	if out != nil {
		out.st.BumpVersion()
	}
	return r, nil
}

// Add is torch.add: x + y.
func Add(x, y Operand) (*Tensor, error) { return Binary(OpAdd, x, y) }

// Sub is torch.sub: x - y (not for bool tensors).
func Sub(x, y Operand) (*Tensor, error) { return Binary(OpSub, x, y) }

// Mul is torch.mul: x * y.
func Mul(x, y Operand) (*Tensor, error) { return Binary(OpMul, x, y) }

// Div is torch.div: x / y, true division (a float result).
func Div(x, y Operand) (*Tensor, error) { return Binary(OpDiv, x, y) }

// FloorDivide is x // y (Python's floor division; integer division by
// zero is an error).
func FloorDivide(x, y Operand) (*Tensor, error) { return Binary(OpFloorDivide, x, y) }

// Remainder is torch.remainder: x % y with the sign of y.
func Remainder(x, y Operand) (*Tensor, error) { return Binary(OpRemainder, x, y) }

// BinaryInPlace is self op= other: the result is stored in self (whose
// dtype the promoted type must be castable to, and whose shape other must
// broadcast to). Nothing is allocated; self's version is bumped.
func BinaryInPlace(op BinaryOp, self *Tensor, other Operand) (*Tensor, error) {
	fname := inplaceNames[op]
	o := operandOf(other)
	var err error
	if anyOnGPU(self, o.t) {
		ok := false
		_, ok, err = nativeInplace(fname, op, self, o)
		if !ok {
			err = staged(contextOf(self, o.t), fname, []*Tensor{self, o.t}, func(s *staging) error {
				_, err := inplace(fname, op, s.shadowOf(self), s.shadowOp(o))
				return err
			})
		}
	} else {
		_, err = inplace(fname, op, self, o)
	}
	if err != nil {
		return nil, err
	}
	self.st.BumpVersion()
	return self, nil
}

// Add_ is Tensor.add_: t += other.
func (t *Tensor) Add_(other Operand) (*Tensor, error) { return BinaryInPlace(OpAdd, t, other) }

// Sub_ is Tensor.sub_: t -= other.
func (t *Tensor) Sub_(other Operand) (*Tensor, error) { return BinaryInPlace(OpSub, t, other) }

// Mul_ is Tensor.mul_: t *= other.
func (t *Tensor) Mul_(other Operand) (*Tensor, error) { return BinaryInPlace(OpMul, t, other) }

// Div_ is Tensor.div_: t /= other (t must be floating point).
func (t *Tensor) Div_(other Operand) (*Tensor, error) { return BinaryInPlace(OpDiv, t, other) }

// Unary is op(t) into a new tensor of t's shape: t's dtype, or float32
// for the float-only ops (exp, log, sqrt, tanh, sigmoid) of integer
// tensors. neg, abs and relu of bool tensors are errors.
func Unary(op UnaryOp, t *Tensor) (*Tensor, error) {
	fname := unaryNames[op]
	if onGPU(t) != nil {
		if r, ok, err := nativeUnary(fname, op, t); ok {
			return r, err
		}
		return stagedTensor(t.ctx, fname, []*Tensor{t}, func(s *staging) (*Tensor, error) {
			return unary(fname, op, s.shadowOf(t))
		})
	}
	return unary(fname, op, t)
}

// UnaryInPlace is op(t) written into t (Tensor.relu_ and the like): t's
// dtype must be one op produces (a float-only op of an integer tensor is
// an error, as PyTorch's "result type Float can't be cast to the desired
// output type"); nothing is allocated on a host or simulated device.
func UnaryInPlace(op UnaryOp, t *Tensor) (*Tensor, error) {
	fname := unaryNames[op] + "_"
	if op.floatOnly() && !t.dtype.IsFloat() {
		return nil, errorf(fname, "result type Float can't be cast to the desired output type %s", dtypes[t.dtype].torch)
	}
	return writeInPlace(fname, t, func(x *Tensor) error { return unaryInto(fname, op, x) })
}

// writeInPlace runs write on t — on a GPU, on its host staging shadow,
// copied back after — and bumps t's version: an in-place op's host path.
func writeInPlace(fname string, t *Tensor, write func(*Tensor) error) (*Tensor, error) {
	var err error
	if onGPU(t) != nil {
		err = staged(t.ctx, fname, []*Tensor{t}, func(s *staging) error { return write(s.shadowOf(t)) })
	} else {
		err = write(t)
	}
	if err != nil {
		return nil, err
	}
	t.st.BumpVersion()
	return t, nil
}

// Relu_ is Tensor.relu_: t = max(t, 0) in place.
func Relu_(t *Tensor) (*Tensor, error) { return UnaryInPlace(OpRelu, t) }

// Neg is torch.neg: -t.
func Neg(t *Tensor) (*Tensor, error) { return Unary(OpNeg, t) }

// Abs is torch.abs.
func Abs(t *Tensor) (*Tensor, error) { return Unary(OpAbs, t) }

// Relu is torch.relu: max(t, 0) (NaN stays NaN).
func Relu(t *Tensor) (*Tensor, error) { return Unary(OpRelu, t) }

// Exp is torch.exp.
func Exp(t *Tensor) (*Tensor, error) { return Unary(OpExp, t) }

// Log is torch.log.
func Log(t *Tensor) (*Tensor, error) { return Unary(OpLog, t) }

// Sqrt is torch.sqrt.
func Sqrt(t *Tensor) (*Tensor, error) { return Unary(OpSqrt, t) }

// Tanh is torch.tanh.
func Tanh(t *Tensor) (*Tensor, error) { return Unary(OpTanh, t) }

// Sigmoid is torch.sigmoid.
func Sigmoid(t *Tensor) (*Tensor, error) { return Unary(OpSigmoid, t) }

// Fill_ is Tensor.fill_: every element of t set to v (converted to t's
// dtype). Nothing is allocated; t's version is bumped.
func (t *Tensor) Fill_(v Scalar) (*Tensor, error) { return fill("tensor.fill_", t, v) }

// Zero_ is Tensor.zero_: Fill_(0).
func (t *Tensor) Zero_() (*Tensor, error) { return fill("tensor.zero_", t, Int(0)) }

func fill(fname string, t *Tensor, v Scalar) (*Tensor, error) {
	o := v.operand()
	if onGPU(t) != nil {
		if _, ok, err := nativeFill(fname, t, encodeValue(t.dtype, o)); ok {
			if err != nil {
				return nil, err
			}
			t.st.BumpVersion()
			return t, nil
		}
	}
	return writeInPlace(fname, t, func(x *Tensor) error { return fillInto(fname, x, o) })
}

// Copy_ is Tensor.copy_: src (broadcast to t's shape, any dtype, any
// device) copied into t. Nothing is allocated; t's version is bumped.
func (t *Tensor) Copy_(src *Tensor) (*Tensor, error) {
	const fname = "tensor.copy_"
	var err error
	if anyOnGPU(t, src) {
		var ok bool
		_, ok, err = nativeCopyInto(fname, t, src)
		if !ok {
			err = staged(contextOf(t, src), fname, []*Tensor{t, src}, func(s *staging) error {
				return copyInto(fname, s.shadowOf(t), s.shadowOf(src))
			})
		}
	} else {
		err = copyInto(fname, t, src)
	}
	if err != nil {
		return nil, err
	}
	t.st.BumpVersion()
	return t, nil
}
