package tensor

import (
	"math"
	"math/big"
	"slices"
	"strconv"
	"unsafe"
)

// Creation functions. Each allocates one contiguous tensor of numel ×
// itemsize bytes on device (a device string; "" is the Context's default
// device) through the Context's Manager. The shape is checked before
// anything is allocated: more than 2^62 bytes is an error, and an
// out-of-memory error from the Manager is returned wrapped (backend.IsOOM
// recognises it). On a meta device the result is allocated but holds no
// values; on a real GPU the values are made on the device (fills,
// rand/randn) or uploaded from the host (arange, data).

// fillMode says how a created tensor is initialised.
type fillMode int

const (
	fillNone    fillMode = iota // empty: uninitialised, as in PyTorch
	fillZeros                   // zeros
	fillOnes                    // ones
	fillUniform                 // rand
	fillNormal                  // randn
)

// maxBytes is the largest tensor size in bytes.
const maxBytes = 1 << 62

// checkSize returns the bytes a tensor of the shape and dtype needs, or an
// error if that is more than 2^62.
func checkSize(fname string, shape []int, dt DType) (uint64, error) {
	n := uint64(dt.Size())
	for _, s := range shape {
		if s < 0 {
			return 0, errorf(fname, "negative dimension %d", s)
		}
	}
	for _, s := range shape {
		if s == 0 {
			return 0, nil
		}
	}
	for _, s := range shape {
		if n > maxBytes/uint64(s) {
			return 0, errorf(fname, "shape %s needs more than 2^62 bytes", fmtShape(shape))
		}
		n *= uint64(s)
	}
	return n, nil
}

// newTensor allocates a contiguous tensor on device (canonical name). The
// shape is checked first, so nothing is allocated on error; an
// out-of-memory error is wrapped with the op's name.
func newTensor(c *Context, fname, device string, dt DType, shape []int) (*Tensor, error) {
	nbytes, err := checkSize(fname, shape, dt)
	if err != nil {
		return nil, err
	}
	alloc := c.Manager.Alloc
	if c.MetaInit > 0 {
		alloc = c.Manager.AllocDeferred
	}
	mem, err := alloc(device, nbytes)
	if err != nil {
		return nil, errorf(fname, "%w", err)
	}
	return newTensorOn(c, mem, dt, slices.Clone(shape), contiguousStrides(shape), 0), nil
}

// device canonicalises a device argument ("" is the default device).
func (c *Context) device(fname, device string) (string, error) {
	d, err := c.Device(device)
	if err != nil {
		return "", errorf(fname, "%w", err)
	}
	return d, nil
}

func orDefault(dt, def DType) DType {
	if dt == Undefined {
		return def
	}
	return dt
}

// Empty is torch.empty: a tensor of shape with uninitialised values;
// dt Undefined is float32.
func Empty(c *Context, shape []int, dt DType, device string) (*Tensor, error) {
	return create(c, "tensor.empty", shape, dt, device, fillNone)
}

// Zeros is torch.zeros: all zeros; dt Undefined is float32.
func Zeros(c *Context, shape []int, dt DType, device string) (*Tensor, error) {
	return create(c, "tensor.zeros", shape, dt, device, fillZeros)
}

// Ones is torch.ones: all ones; dt Undefined is float32.
func Ones(c *Context, shape []int, dt DType, device string) (*Tensor, error) {
	return create(c, "tensor.ones", shape, dt, device, fillOnes)
}

// Rand is torch.rand: uniform values in [0, 1) from the Context's
// generator (floating dtypes only; dt Undefined is float32). The generator
// advances by numel even on a meta device.
func Rand(c *Context, shape []int, dt DType, device string) (*Tensor, error) {
	return create(c, "tensor.rand", shape, dt, device, fillUniform)
}

// Randn is torch.randn: standard normal values (see Rand).
func Randn(c *Context, shape []int, dt DType, device string) (*Tensor, error) {
	return create(c, "tensor.randn", shape, dt, device, fillNormal)
}

// EmptyLike, ZerosLike, OnesLike, RandLike and RandnLike are the creation
// functions with t's shape; dt Undefined is t's dtype and device "" t's
// device.
func EmptyLike(t *Tensor, dt DType, device string) (*Tensor, error) {
	return createLike("tensor.empty_like", t, dt, device, fillNone)
}

// ZerosLike is torch.zeros_like (see EmptyLike).
func ZerosLike(t *Tensor, dt DType, device string) (*Tensor, error) {
	return createLike("tensor.zeros_like", t, dt, device, fillZeros)
}

// OnesLike is torch.ones_like (see EmptyLike).
func OnesLike(t *Tensor, dt DType, device string) (*Tensor, error) {
	return createLike("tensor.ones_like", t, dt, device, fillOnes)
}

// RandLike is torch.rand_like (see EmptyLike).
func RandLike(t *Tensor, dt DType, device string) (*Tensor, error) {
	return createLike("tensor.rand_like", t, dt, device, fillUniform)
}

// RandnLike is torch.randn_like (see EmptyLike).
func RandnLike(t *Tensor, dt DType, device string) (*Tensor, error) {
	return createLike("tensor.randn_like", t, dt, device, fillNormal)
}

func createLike(fname string, t *Tensor, dt DType, device string, mode fillMode) (*Tensor, error) {
	if device == "" {
		device = t.Device()
	}
	return create(t.ctx, fname, t.shape, orDefault(dt, t.dtype), device, mode)
}

func create(c *Context, fname string, shape []int, dt DType, device string, mode fillMode) (*Tensor, error) {
	dt = orDefault(dt, DefaultFloat)
	device, err := c.device(fname, device)
	if err != nil {
		return nil, err
	}
	return createOn(c, fname, shape, dt, device, mode)
}

// createOn allocates and initialises a tensor.
func createOn(c *Context, fname string, shape []int, dt DType, device string, mode fillMode) (*Tensor, error) {
	if (mode == fillUniform || mode == fillNormal) && !dt.IsFloat() {
		return nil, errorf(fname, "for parameter dtype: want a floating-point dtype, got %s", dt)
	}
	t, err := newTensor(c, fname, device, dt, shape)
	if err != nil {
		return nil, err
	}
	if err := initTensor(fname, t, mode); err != nil {
		return nil, err
	}
	return t, nil
}

// initTensor fills a new contiguous tensor according to mode. Random modes
// advance the generator by numel even on a meta device, so later draws do
// not depend on where earlier ones went.
func initTensor(fname string, t *Tensor, mode fillMode) error {
	n := t.Numel()
	var seed, offset uint64
	if mode == fillUniform || mode == fillNormal {
		seed, offset = t.ctx.draw(n)
	}
	if n == 0 {
		return nil
	}
	if !t.hasData() {
		if onGPU(t) == nil {
			return nil
		}
		var pattern uint64
		if mode == fillOnes {
			pattern = encodeValue(t.dtype, Int(1).operand())
		}
		if err := gpuInit(t, mode, mode == fillZeros || mode == fillOnes, pattern, seed, offset); err != nil {
			return errorf(fname, "%w", err)
		}
		return nil
	}
	lay := layoutOf(t, t.shape)
	switch mode {
	case fillZeros:
		fillKernel(lay, t.dtype, 0, t.shape)
	case fillOnes:
		fillKernel(lay, t.dtype, encodeValue(t.dtype, Int(1).operand()), t.shape)
	case fillUniform, fillNormal:
		randomKernelStop(t.ctx.stopFlag(), t.mem.Pointer(), t.dtype, n, seed, offset, mode == fillNormal)
	}
	return t.ctx.interrupted(fname) // the new tensor is dropped, partly written
}

// Full is torch.full: every element value; dt Undefined is the value's
// dtype (int64, float32 or bool).
func Full(c *Context, shape []int, value Scalar, dt DType, device string) (*Tensor, error) {
	return full(c, "tensor.full", shape, value, dt, device)
}

// FullLike is torch.full_like (see EmptyLike).
func FullLike(t *Tensor, value Scalar, dt DType, device string) (*Tensor, error) {
	if device == "" {
		device = t.Device()
	}
	return full(t.ctx, "tensor.full_like", t.shape, value, orDefault(dt, t.dtype), device)
}

func full(c *Context, fname string, shape []int, value Scalar, dt DType, device string) (*Tensor, error) {
	v := value.operand()
	dt = orDefault(dt, v.dt)
	device, err := c.device(fname, device)
	if err != nil {
		return nil, err
	}
	t, err := newTensor(c, fname, device, dt, shape)
	if err != nil {
		return nil, err
	}
	if t.Numel() == 0 {
		return t, nil
	}
	pattern := encodeValue(dt, v)
	switch {
	case t.hasData():
		fillKernel(layoutOf(t, t.shape), dt, pattern, t.shape)
	case onGPU(t) != nil:
		if err := gpuInit(t, fillNone, true, pattern, 0, 0); err != nil {
			return nil, errorf(fname, "%w", err)
		}
	}
	return t, nil
}

// storeValues writes a new contiguous tensor's values with produce (given
// the address of element 0): directly into host-accessible memory, through
// a host copy uploaded to a real GPU, not at all on a meta device.
func storeValues(fname string, t *Tensor, produce func(p unsafe.Pointer)) error {
	if t.Numel() == 0 {
		return nil
	}
	if t.hasData() {
		produce(t.mem.Pointer())
		return nil
	}
	if dev := onGPU(t); dev != nil {
		if err := uploadFrom(dev, t, produce); err != nil {
			return errorf(fname, "%w", err)
		}
	}
	return nil
}

// Arange is torch.arange: start, start+step, ... while < end (> end for a
// negative step). dt Undefined is int64 when all three are integers, else
// float32.
func Arange(c *Context, start, end, step Scalar, dt DType, device string) (*Tensor, error) {
	const fname = "tensor.arange"
	anyFloat := false
	for _, s := range []Scalar{start, end, step} {
		anyFloat = anyFloat || s.IsFloat()
	}
	def := Int64
	if anyFloat {
		def = DefaultFloat
	}
	dt = orDefault(dt, def)
	if dt == Bool {
		return nil, errorf(fname, "for parameter dtype: arange does not support bool")
	}
	device, err := c.device(fname, device)
	if err != nil {
		return nil, err
	}
	if step.f == 0 {
		return nil, errorf(fname, "for parameter step: step must be nonzero")
	}
	if math.IsNaN(start.f) || math.IsInf(start.f, 0) || math.IsNaN(end.f) || math.IsInf(end.f, 0) {
		return nil, errorf(fname, "unsupported range: %v -> %v", start, end)
	}
	if (step.f > 0 && end.f < start.f) || (step.f < 0 && end.f > start.f) {
		return nil, errorf(fname, "upper bound and larger bound inconsistent with step sign")
	}
	// The length, checked in float64 first so that huge ranges fail
	// cleanly, then computed exactly for integers.
	nf := math.Ceil((end.f - start.f) / step.f)
	if nf > maxBytes {
		return nil, errorf(fname, "shape [%.0f] needs more than 2^62 bytes", nf)
	}
	var n int
	if anyFloat {
		n = int(nf)
	} else {
		d := new(big.Int).Sub(big.NewInt(end.i), big.NewInt(start.i))
		d.Add(d, big.NewInt(step.i-sign(step.i)))
		n = int(d.Quo(d, big.NewInt(step.i)).Int64())
	}
	n = max(n, 0)
	t, err := newTensor(c, fname, device, dt, []int{n})
	if err != nil {
		return nil, err
	}
	err = storeValues(fname, t, func(p unsafe.Pointer) {
		size := dt.Size()
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
	})
	if err != nil {
		return nil, err
	}
	return t, nil
}

func sign(x int64) int64 {
	if x < 0 {
		return -1
	}
	return 1
}

// String formats the scalar as Starlark (and Python) print numbers:
// "3", "2.5", "+inf", "nan", "True".
func (s Scalar) String() string {
	switch {
	case s.dt == Bool:
		if s.i != 0 {
			return "True"
		}
		return "False"
	case s.dt.IsFloat():
		switch {
		case math.IsNaN(s.f):
			return "nan"
		case math.IsInf(s.f, 1):
			return "+inf"
		case math.IsInf(s.f, -1):
			return "-inf"
		}
		return strconv.FormatFloat(s.f, 'g', -1, 64)
	}
	return strconv.FormatInt(s.i, 10)
}

// InferDType is the dtype torch.tensor infers for values: the highest
// category among them as a wrapped number (bool, int64, float32); float32
// for none.
func InferDType(vals []Scalar) DType {
	inferred := Undefined
	for _, v := range vals {
		if d := v.wrapped(); inferred == Undefined || d.category() > inferred.category() {
			inferred = d
		}
	}
	if inferred == Undefined {
		return DefaultFloat
	}
	return inferred
}

// FromScalars is torch.tensor over flat values (row-major) of the given
// shape (numel(shape) == len(vals)); dt Undefined is InferDType(vals).
// Floats are stored converted (rounded) to dt, integers and bools too.
func FromScalars(c *Context, vals []Scalar, shape []int, dt DType, device string) (*Tensor, error) {
	const fname = "tensor.tensor"
	if numel(shape) != len(vals) {
		return nil, errorf(fname, "%d values for shape %s", len(vals), fmtShape(shape))
	}
	if dt == Undefined {
		dt = InferDType(vals)
	}
	device, err := c.device(fname, device)
	if err != nil {
		return nil, err
	}
	t, err := newTensor(c, fname, device, dt, shape)
	if err != nil {
		return nil, err
	}
	err = storeValues(fname, t, func(p unsafe.Pointer) {
		size := dt.Size()
		for i, o := range vals {
			if o.dt.IsFloat() {
				storeF64[dt](elemAddr(p, i, size), o.f)
			} else {
				storeI64[dt](elemAddr(p, i, size), o.i)
			}
		}
	})
	if err != nil {
		return nil, err
	}
	return t, nil
}

// FromFloat64s is FromScalars for float values (dt Undefined is float32).
func FromFloat64s(c *Context, vals []float64, shape []int, dt DType, device string) (*Tensor, error) {
	s := make([]Scalar, len(vals))
	for i, v := range vals {
		s[i] = Float(v)
	}
	return FromScalars(c, s, shape, dt, device)
}

// FromInt64s is FromScalars for integer values (dt Undefined is int64).
func FromInt64s(c *Context, vals []int64, shape []int, dt DType, device string) (*Tensor, error) {
	s := make([]Scalar, len(vals))
	for i, v := range vals {
		s[i] = Int(v)
	}
	return FromScalars(c, s, shape, dt, device)
}
