package tensor

import (
	"math"
	"runtime"
	"slices"
	"unsafe"

	"github.com/memsh/memsh/backend/cuda"
)

// The operations with GPU kernels (backend/cuda). Each native function
// handles only cases it is sure of — live, contiguous, non-empty operands
// of one float dtype on one GPU, simple broadcasting — and reports false
// for anything else, which then takes the staged CPU path with its exact
// semantics and errors. Results are bit-identical to the CPU kernels'
// except sums (float64 accumulation in another order) and matmul (cuBLAS).

// cudaDType maps a float dtype to the kernels' dtype.
func cudaDType(dt DType) (cuda.DType, bool) {
	switch dt {
	case Float32:
		return cuda.F32, true
	case Float16:
		return cuda.F16, true
	case BFloat16:
		return cuda.BF16, true
	case Float64:
		return cuda.F64, true
	}
	return 0, false
}

// devPtr is the device address of t's first element.
func devPtr(t *Tensor) uintptr { return t.mem.Ptr() + uintptr(t.offset*t.dtype.Size()) }

// kernelsOK reports whether memsh's kernels are loaded on dev.
func kernelsOK(dev *cuda.Device) bool {
	info, err := dev.Context()
	return err == nil && info.ModuleErr == nil
}

// nativeInput returns the GPU of a tensor fit for a kernel: on a GPU,
// live, contiguous and not empty, with a float dtype.
func nativeInput(t *Tensor) (*cuda.Device, cuda.DType, bool) {
	dev := onGPU(t)
	if dev == nil || t.mem.Err() != nil || !t.isContiguous() || t.Numel() == 0 {
		return nil, 0, false
	}
	cdt, ok := cudaDType(t.dtype)
	return dev, cdt, ok
}

// kernelOperand describes a binary operand for a result of shape: a
// number, or a contiguous tensor equal to the shape, a single element, a
// row repeated over leading dimensions, or a column repeated over
// trailing ones.
func kernelOperand(o operand, shape []int) (cuda.Operand, bool) {
	if o.t == nil {
		return cuda.Operand{Number: true, Value: o.f}, true
	}
	t := o.t
	p := devPtr(t)
	if numel(t.shape) == 1 {
		return cuda.Operand{Ptr: p, Div: 1, Mod: 1}, true
	}
	if slices.Equal(t.shape, shape) {
		return cuda.Operand{Ptr: p, Div: 1}, true
	}
	ta := make([]int, len(shape)) // t's shape aligned right, padded with 1
	for d := range ta {
		ta[d] = 1
	}
	copy(ta[len(shape)-len(t.shape):], t.shape)
	// a row: 1 ... 1, shape[j:]
	for j := range len(shape) + 1 {
		if allOnes(ta[:j]) && slices.Equal(ta[j:], shape[j:]) {
			return cuda.Operand{Ptr: p, Div: 1, Mod: uint64(numel(t.shape))}, true
		}
	}
	// a column: shape[:j], 1 ... 1
	for j := range len(shape) + 1 {
		if slices.Equal(ta[:j], shape[:j]) && allOnes(ta[j:]) {
			return cuda.Operand{Ptr: p, Div: uint64(numel(shape[j:]))}, true
		}
	}
	return cuda.Operand{}, false
}

func allOnes(s []int) bool {
	for _, x := range s {
		if x != 1 {
			return false
		}
	}
	return true
}

var cudaBinOps = [...]cuda.BinaryOp{OpAdd: cuda.Add, OpSub: cuda.Sub, OpMul: cuda.Mul, OpDiv: cuda.Div}

// nativeBinary computes x op y (+ - * /) on the GPU.
func nativeBinary(op BinaryOp, x, y operand) (*Tensor, bool, error) {
	if op > OpDiv || x.zeroDim || y.zeroDim {
		return nil, false, nil
	}
	var dev *cuda.Device
	var ref *Tensor
	for _, o := range []operand{x, y} {
		if o.t == nil {
			continue
		}
		d, _, ok := nativeInput(o.t)
		if !ok || (dev != nil && d != dev) || (ref != nil && o.t.dtype != ref.dtype) {
			return nil, false, nil
		}
		dev, ref = d, o.t
	}
	if ref == nil || promote(x, y) != ref.dtype || !kernelsOK(dev) {
		return nil, false, nil
	}
	cdt, _ := cudaDType(ref.dtype)
	shape, err := broadcastShapes("", x.shape(), y.shape())
	if err != nil {
		return nil, false, nil
	}
	a, okA := kernelOperand(x, shape)
	b, okB := kernelOperand(y, shape)
	if !okA || !okB {
		return nil, false, nil
	}
	fname := binOpNames[op]
	out, err := newTensor(ref.ctx, fname, ref.mem.Device(), ref.dtype, shape)
	if err != nil {
		return nil, true, err
	}
	if err := dev.Binary(cudaBinOps[op], cdt, devPtr(out), a, b, uint64(out.Numel())); err != nil {
		return nil, true, errorf(fname, "%w", err)
	}
	return out, true, nil
}

// nativeInplace computes self op= other on the GPU.
func nativeInplace(fname string, op BinaryOp, self *Tensor, other operand) (*Tensor, bool, error) {
	if op > OpDiv {
		return nil, false, nil
	}
	dev, cdt, ok := nativeInput(self)
	if !ok {
		return nil, false, nil
	}
	if o := other.t; o != nil {
		d, _, ok := nativeInput(o)
		if !ok || d != dev || o.dtype != self.dtype {
			return nil, false, nil
		}
		if o.mem == self.mem && !(o.offset == self.offset && slices.Equal(o.shape, self.shape) && slices.Equal(o.strides, self.strides)) {
			return nil, false, nil // overlapping: the staged path reports it
		}
		if b, err := broadcastShapes("", self.shape, o.shape); err != nil || !slices.Equal(b, self.shape) {
			return nil, false, nil
		}
	}
	if promote(operand{t: self}, other) != self.dtype || !kernelsOK(dev) {
		return nil, false, nil
	}
	b, ok := kernelOperand(other, self.shape)
	if !ok {
		return nil, false, nil
	}
	p := devPtr(self)
	if err := dev.Binary(cudaBinOps[op], cdt, p, cuda.Operand{Ptr: p, Div: 1}, b, uint64(self.Numel())); err != nil {
		return nil, true, errorf(fname, "%w", err)
	}
	return self, true, nil
}

var cudaUnaryOps = map[UnaryOp]cuda.UnaryOp{OpNeg: cuda.Neg, OpAbs: cuda.Abs, OpRelu: cuda.Relu, OpSqrt: cuda.Sqrt}

// nativeUnary computes op(t) (neg, abs, relu, sqrt) on the GPU.
func nativeUnary(fname string, op UnaryOp, t *Tensor) (*Tensor, bool, error) {
	cop, ok := cudaUnaryOps[op]
	if !ok {
		return nil, false, nil
	}
	dev, cdt, ok := nativeInput(t)
	if !ok || !kernelsOK(dev) {
		return nil, false, nil
	}
	out, err := newTensor(t.ctx, fname, t.mem.Device(), t.dtype, t.shape)
	if err != nil {
		return nil, true, err
	}
	if err := dev.Unary(cop, cdt, devPtr(out), devPtr(t), uint64(t.Numel())); err != nil {
		return nil, true, errorf(fname, "%w", err)
	}
	return out, true, nil
}

// nativeFill stores pattern (dt's bytes) into every element of a
// contiguous GPU tensor of any dtype.
func nativeFill(fname string, t *Tensor, pattern uint64) (*Tensor, bool, error) {
	dev := onGPU(t)
	if dev == nil || t.mem.Err() != nil || !t.isContiguous() || t.Numel() == 0 {
		return nil, false, nil
	}
	if err := fillDevice(dev, t, pattern); err != nil {
		return nil, true, errorf(fname, "%w", err)
	}
	return t, true, nil
}

// fillDevice fills a contiguous GPU tensor; an 8-byte pattern the driver's
// memset cannot write goes through the host when the kernels are missing.
func fillDevice(dev *cuda.Device, t *Tensor, pattern uint64) error {
	size := t.dtype.Size()
	n := uint64(t.Numel())
	if size == 8 && uint32(pattern) != uint32(pattern>>32) && !kernelsOK(dev) {
		return uploadFrom(dev, t, func(p unsafe.Pointer) {
			s := unsafe.Slice((*uint64)(p), n)
			for i := range s {
				s[i] = pattern
			}
		})
	}
	return dev.Fill(devPtr(t), size, pattern, n)
}

// uploadFrom fills host scratch of t's size with produce, then copies it
// to t (contiguous, on dev).
func uploadFrom(dev *cuda.Device, t *Tensor, produce func(p unsafe.Pointer)) error {
	n := uint64(t.NBytes())
	scratch, err := mapScratch(n)
	if err != nil {
		return err
	}
	defer unmapScratch(scratch)
	produce(unsafe.Pointer(&scratch[0]))
	return dev.CopyHtoD(devPtr(t), unsafe.Pointer(&scratch[0]), n)
}

// gpuInit initialises a new contiguous GPU tensor made by a creation
// function: a fill with pattern, or the generator's values at offset.
func gpuInit(t *Tensor, mode fillMode, fill bool, pattern, seed, offset uint64) error {
	dev := onGPU(t)
	switch {
	case fill:
		return fillDevice(dev, t, pattern)
	case mode == fillUniform || mode == fillNormal:
		n := t.Numel()
		cdt, ok := cudaDType(t.dtype)
		if ok && kernelsOK(dev) {
			return dev.Random(cdt, devPtr(t), uint64(n), seed, offset, mode == fillNormal)
		}
		return uploadFrom(dev, t, func(p unsafe.Pointer) { randomKernel(p, t.dtype, n, seed, offset, mode == fillNormal) })
	}
	return nil
}

// nativeSum is t.sum() over every element of a float GPU tensor.
func nativeSum(fname string, t *Tensor) (*Tensor, bool, error) {
	dev, cdt, ok := nativeInput(t)
	if !ok || !kernelsOK(dev) {
		return nil, false, nil
	}
	s, err := dev.Sum(cdt, devPtr(t), uint64(t.Numel()))
	if err != nil {
		return nil, true, errorf(fname, "%w", err)
	}
	out, err := newTensor(t.ctx, fname, t.mem.Device(), t.dtype, nil)
	if err != nil {
		return nil, true, err
	}
	var buf uint64
	storeF64[t.dtype](unsafe.Pointer(&buf), s)
	if err := dev.CopyHtoD(devPtr(out), unsafe.Pointer(&buf), uint64(t.dtype.Size())); err != nil {
		return nil, true, errorf(fname, "%w", err)
	}
	return out, true, nil
}

// blasOperand describes a 2-D tensor for cuBLAS (column-major): op applied
// to the matrix stored at ptr with leading dimension ld gives the tensor's
// transpose.
func blasOperand(t *Tensor) (ptr uintptr, ld int, trans, ok bool) {
	r, c := t.shape[0], t.shape[1]
	s0, s1 := t.strides[0], t.strides[1]
	if c == 1 {
		s1 = 1
	}
	if r == 1 {
		s0 = max(c, 1)
	}
	switch {
	case s1 == 1 && s0 >= max(c, 1):
		return devPtr(t), s0, false, true
	case s0 == 1 && s1 >= max(r, 1):
		return devPtr(t), s1, true, true
	}
	return 0, 0, false, false
}

// nativeMatmul is a @ b for 2-D float32 GPU tensors, through cuBLAS: the
// row-major product C = A·B is computed as the column-major Cᵀ = Bᵀ·Aᵀ.
func nativeMatmul(fname string, a, b *Tensor) (*Tensor, bool, error) {
	if len(a.shape) != 2 || len(b.shape) != 2 || a.dtype != Float32 || b.dtype != Float32 || a.shape[1] != b.shape[0] {
		return nil, false, nil
	}
	da := onGPU(a)
	if da == nil || da != onGPU(b) || a.mem.Err() != nil || b.mem.Err() != nil || a.Numel() == 0 || b.Numel() == 0 {
		return nil, false, nil
	}
	pa, lda, ta, okA := blasOperand(a)
	pb, ldb, tb, okB := blasOperand(b)
	if !okA || !okB {
		return nil, false, nil
	}
	if _, _, err := da.BLAS(); err != nil {
		return nil, false, nil // no cuBLAS: the CPU computes it
	}
	n, k, m := a.shape[0], a.shape[1], b.shape[1]
	for _, d := range []int{n, k, m, lda, ldb} {
		if d > math.MaxInt32 {
			return nil, false, nil // cuBLAS takes C ints: the staged path computes it
		}
	}
	out, err := newTensor(a.ctx, fname, a.mem.Device(), Float32, []int{n, m})
	if err != nil {
		return nil, true, err
	}
	if err := da.Sgemm(tb, ta, m, n, k, pb, ldb, pa, lda, devPtr(out), m); err != nil {
		return nil, true, errorf(fname, "%w", err)
	}
	runtime.KeepAlive(a)
	runtime.KeepAlive(b)
	return out, true, nil
}
