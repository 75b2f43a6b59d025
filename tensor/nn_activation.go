package tensor

import (
	"math"
	"runtime"
	"slices"
	"unsafe"
)

// Activation kernels that training needs as single ATen kernels: gelu and
// its backward (exact erf form or the tanh approximation), silu and its
// backward, softmax / log_softmax along one dimension and their backward
// (_softmax_backward_data, _log_softmax_backward_data). Each allocates one
// result of its first operand's shape (plus a contiguous copy of a
// non-contiguous operand, as CUDA's softmax kernels do); everything else is
// Go-heap scratch.

// checkFloatOp is the dtype check of ATen's floating-point-only kernels:
// `"name" not implemented for 'Long'`.
func checkFloatOp(fname, kernel string, ts ...*Tensor) error {
	for _, t := range ts {
		if err := t.checkLive(fname); err != nil {
			return err
		}
		if !t.dtype.IsFloat() {
			return errorf(fname, "\"%s\" not implemented for '%s'", kernel, dtypes[t.dtype].torch)
		}
	}
	return nil
}

const (
	geluSqrt2OverPi = 0.7978845608028654 // √(2/π)
	geluInvSqrt2Pi  = 0.3989422804014327 // 1/√(2π)
	geluCoeff       = 0.044715
)

// Gelu is torch.nn.functional.gelu(a, approximate): "none" is
// x·Φ(x) = ½x(1 + erf(x/√2)), "tanh" is ½x(1 + tanh(√(2/π)(x + 0.044715x³))).
// One allocation of a's shape and dtype.
func Gelu(a *Tensor, approximate string) (*Tensor, error) {
	const fname = "tensor.gelu"
	if err := checkFloatOp(fname, "GeluKernelImpl", a); err != nil {
		return nil, err
	}
	if approximate == "tanh" {
		if out, ok, err := actVectorised(fname, mathGeluTanh, a); ok {
			return out, err
		}
		return mapNew(fname, a, a.dtype, []*Tensor{a}, func(x []float64) float64 {
			// ½v(1 + tanh(u)) = v·σ(2u): no cancellation where tanh(u) ≈ -1
			v := x[0]
			return v / (1 + math.Exp(-2*geluSqrt2OverPi*(v+geluCoeff*v*v*v)))
		})
	}
	if out, ok, err := actVectorised(fname, mathGelu, a); ok {
		return out, err
	}
	return mapNew(fname, a, a.dtype, []*Tensor{a}, func(x []float64) float64 {
		// ½x(1 + erf(x/√2)) = ½x·erfc(-x/√2): no cancellation for x ≪ 0
		return 0.5 * x[0] * math.Erfc(-x[0]/math.Sqrt2)
	})
}

// actVectorised runs an activation (ins = [a], code a math kernel: mathSilu,
// mathGelu, ...) or its backward (ins = [grad, self], code a backward
// kernel: bwdSilu, ...) with kernels_math.c's vectorised loops, when the
// operands are contiguous, of one shape and one dtype — float32 or a half
// type (widened to float32, computed, rounded back) — with values on the
// host (CPU or a simulated GPU): one allocation of the first operand's
// shape and dtype, as mapNew makes. ok is false for every other case,
// which the caller computes with mapNew in float64.
func actVectorised(fname string, code int, ins ...*Tensor) (out *Tensor, ok bool, err error) {
	a := ins[0]
	for _, t := range ins {
		if !vectorisedDT(t.dtype) || t.dtype != a.dtype || !slices.Equal(t.shape, a.shape) || !t.hasData() || anyOnGPU(t) || !t.isContiguous() {
			return nil, false, nil
		}
	}
	for _, t := range ins {
		if err := t.checkLive(fname); err != nil {
			return nil, true, err
		}
	}
	if out, err = newTensor(a.ctx, fname, a.mem.Device(), a.dtype, slices.Clone(a.shape)); err != nil {
		return nil, true, err
	}
	size, isa := a.dtype.Size(), mathISA()
	at := func(t *Tensor, i int) unsafe.Pointer { return elemAddr(t.mem.Pointer(), t.offset+i, size) }
	parallelForStop(a.ctx.stopFlag(), a.Numel(), parallelThreshold, interruptGrain, func(lo, hi int) {
		switch {
		case len(ins) == 1:
			mathHalf(a.dtype, code, at(out, lo), at(a, lo), hi-lo, isa)
		case a.dtype == Float32:
			actBackwardF32(code, at(out, lo), at(a, lo), at(ins[1], lo), hi-lo, isa)
		default:
			var gb, xb [mathBlock]float32
			for i := lo; i < hi; i += mathBlock {
				m := min(mathBlock, hi-i)
				halfToF32s(a.dtype, unsafe.Pointer(&gb[0]), at(a, i), m)
				halfToF32s(a.dtype, unsafe.Pointer(&xb[0]), at(ins[1], i), m)
				actBackwardF32(code, unsafe.Pointer(&gb[0]), unsafe.Pointer(&gb[0]), unsafe.Pointer(&xb[0]), m, isa)
				f32ToHalfs(a.dtype, at(out, i), unsafe.Pointer(&gb[0]), m)
			}
		}
	})
	runtime.KeepAlive(ins)
	if err := a.ctx.interrupted(fname); err != nil {
		return nil, true, err // out is dropped
	}
	return out, true, nil
}

// GeluBackward is gelu_backward(grad, self, approximate): grad·gelu'(self),
// one allocation of grad's shape.
func GeluBackward(g, self *Tensor, approximate string) (*Tensor, error) {
	const fname = "tensor.gelu_backward"
	if err := checkFloatOp(fname, "GeluBackwardKernelImpl", g, self); err != nil {
		return nil, err
	}
	if err := checkSameDevice(fname, g, self); err != nil {
		return nil, err
	}
	code := bwdGelu
	if approximate == "tanh" {
		code = bwdGeluTanh
	}
	if out, ok, err := actVectorised(fname, code, g, self); ok {
		return out, err
	}
	if approximate == "tanh" {
		return mapNew(fname, g, g.dtype, []*Tensor{g, self}, func(x []float64) float64 {
			// ½(1 + tanh u) + ½v(1 − tanh²u)·u', with 1 + tanh u = 2σ(2u)
			// and 1 − tanh²u = 4σ(2u)σ(−2u): no cancellation for v ≪ 0
			v := x[1]
			u2 := 2 * geluSqrt2OverPi * (v + geluCoeff*v*v*v)
			sp, sn := 1/(1+math.Exp(-u2)), 1/(1+math.Exp(u2))
			return x[0] * (sp + 2*v*sp*sn*geluSqrt2OverPi*(1+3*geluCoeff*v*v))
		})
	}
	return mapNew(fname, g, g.dtype, []*Tensor{g, self}, func(x []float64) float64 {
		v := x[1]
		cdf := 0.5 * math.Erfc(-v/math.Sqrt2)
		pdf := geluInvSqrt2Pi * math.Exp(-0.5*v*v)
		return x[0] * (cdf + v*pdf)
	})
}

// Silu is torch.nn.functional.silu: x·σ(x), one allocation.
func Silu(a *Tensor) (*Tensor, error) {
	const fname = "tensor.silu"
	if err := checkFloatOp(fname, "silu", a); err != nil {
		return nil, err
	}
	if out, ok, err := actVectorised(fname, mathSilu, a); ok {
		return out, err
	}
	return mapNew(fname, a, a.dtype, []*Tensor{a}, func(x []float64) float64 {
		return x[0] / (1 + math.Exp(-x[0]))
	})
}

// SiluBackward is silu_backward(grad, self): grad·σ(x)(1 + x(1 − σ(x))),
// one allocation.
func SiluBackward(g, self *Tensor) (*Tensor, error) {
	const fname = "tensor.silu_backward"
	if err := checkFloatOp(fname, "silu_backward", g, self); err != nil {
		return nil, err
	}
	if err := checkSameDevice(fname, g, self); err != nil {
		return nil, err
	}
	if out, ok, err := actVectorised(fname, bwdSilu, g, self); ok {
		return out, err
	}
	return mapNew(fname, g, g.dtype, []*Tensor{g, self}, func(x []float64) float64 {
		s := 1 / (1 + math.Exp(-x[1]))
		return x[0] * s * (1 + x[1]*(1-s))
	})
}

// Softmax is torch.softmax(a, dim) (log: torch.log_softmax), the ATen
// _softmax / _log_softmax kernel: a new contiguous tensor of a's shape and
// dtype. A non-contiguous input is first copied contiguous (a temporary
// freed when the op returns), as CUDA's host_softmax does.
func Softmax(a *Tensor, dim int, log bool) (*Tensor, error) {
	fname, kernel := "tensor.softmax", "softmax"
	if log {
		fname, kernel = "tensor.log_softmax", "log_softmax"
	}
	if err := checkFloatOp(fname, kernel, a); err != nil {
		return nil, err
	}
	d, err := wrapDim(fname, dim, a.Dim())
	if err != nil {
		return nil, err
	}
	x, err := Contiguous(a)
	if err != nil {
		return nil, Renamed(err, fname)
	}
	out, err := newTensor(a.ctx, fname, a.mem.Device(), a.dtype, slices.Clone(a.shape))
	if err != nil {
		return nil, err
	}
	err = actHostKernel(a.ctx, fname, []*Tensor{out}, []*Tensor{x}, func(outs, ins []*Tensor) {
		softmaxRows(outs[0], ins[0], nil, d, log)
	})
	runtime.KeepAlive(x)
	if err != nil {
		return nil, err
	}
	return out, nil
}

// SoftmaxBackward is _softmax_backward_data(grad, output, dim) (log:
// _log_softmax_backward_data): grad_input = y·(g − Σg·y) for softmax,
// g − exp(y)·Σg for log_softmax; one allocation of grad's shape and dtype
// (after contiguous copies of non-contiguous grad and output).
func SoftmaxBackward(g, y *Tensor, dim int, log bool) (*Tensor, error) {
	fname, kernel := "tensor._softmax_backward_data", "softmax_backward"
	if log {
		fname, kernel = "tensor._log_softmax_backward_data", "log_softmax_backward"
	}
	if err := checkFloatOp(fname, kernel, g, y); err != nil {
		return nil, err
	}
	if err := checkSameDevice(fname, g, y); err != nil {
		return nil, err
	}
	if !slices.Equal(g.shape, y.shape) {
		return nil, errorf(fname, "grad and output must have the same shape, got %s and %s", SizeString(g.shape), SizeString(y.shape))
	}
	d, err := wrapDim(fname, dim, y.Dim())
	if err != nil {
		return nil, err
	}
	out, err := newTensor(g.ctx, fname, g.mem.Device(), g.dtype, slices.Clone(g.shape))
	if err != nil {
		return nil, err
	}
	defer g.ctx.Hold(out)()
	if !log {
		// PyTorch's CUDA softmax backward computes grad * output into a
		// temporary after allocating its result (softmax_backward_cuda_out;
		// torch 2.11's trace on an H100 shows it); its CPU kernel does not.
		release, err := cudaTemporary(g, uint64(g.Numel())*uint64(g.dtype.Size()), "softmax backward's grad * output")
		if err != nil {
			return nil, Renamed(err, fname)
		}
		defer release()
	}
	gc, err := Contiguous(g)
	if err != nil {
		return nil, Renamed(err, fname)
	}
	yc, err := Contiguous(y)
	if err != nil {
		return nil, Renamed(err, fname)
	}
	err = actHostKernel(g.ctx, fname, []*Tensor{out}, []*Tensor{gc, yc}, func(outs, ins []*Tensor) {
		softmaxRows(outs[0], ins[1], ins[0], d, log)
	})
	runtime.KeepAlive(gc)
	runtime.KeepAlive(yc)
	if err != nil {
		return nil, err
	}
	return out, nil
}

// softmaxRows computes along dim d of contiguous tensors: with g == nil the
// forward (out = softmax(x) or log_softmax(x)), else the backward with x
// the saved output.
func softmaxRows(out, x, g *Tensor, d int, log bool) {
	if !out.hasData() || out.Numel() == 0 {
		return
	}
	outer, n, inner := actSplitDim(x.shape, d)
	if inner == 1 && vectorisedDT(x.dtype) && x.dtype == out.dtype && (g == nil || g.dtype == x.dtype) {
		softmaxRowsVectorised(out, x, g, outer, n, log)
		return
	}
	xs := actReadF64(x)
	var gs []float64
	if g != nil {
		gs = actReadF64(g)
	}
	res := make([]float64, len(xs))
	parallelForStop(out.ctx.stopFlag(), outer*inner, parallelThreshold/max(n, 1), stopGrain(n), func(lo, hi int) {
		for r := lo; r < hi; r++ {
			o, i := r/inner, r%inner
			base := o*n*inner + i
			at := func(k int) int { return base + k*inner }
			if g == nil {
				m := math.Inf(-1)
				for k := range n {
					m = math.Max(m, xs[at(k)])
				}
				s := 0.0
				for k := range n {
					s += math.Exp(xs[at(k)] - m)
				}
				for k := range n {
					if log {
						res[at(k)] = xs[at(k)] - m - math.Log(s)
					} else {
						res[at(k)] = math.Exp(xs[at(k)]-m) / s
					}
				}
				continue
			}
			s := 0.0
			for k := range n {
				if log {
					s += gs[at(k)]
				} else {
					s += gs[at(k)] * xs[at(k)]
				}
			}
			for k := range n {
				if log {
					res[at(k)] = gs[at(k)] - math.Exp(xs[at(k)])*s
				} else {
					res[at(k)] = xs[at(k)] * (gs[at(k)] - s)
				}
			}
		}
	})
	actWriteF64(out, res)
}

// actSplitDim returns the sizes before, at and after dim d (1s for a 0-dim
// shape).
func actSplitDim(shape []int, d int) (outer, n, inner int) {
	if len(shape) == 0 {
		return 1, 1, 1
	}
	return numel(shape[:d]), shape[d], numel(shape[d+1:])
}

// halfRowsBlock is how many float32 elements of a half type's rows
// softmaxRowsVectorised converts at a time (32 KiB).
const halfRowsBlock = 8192

// softmaxRowsVectorised is softmaxRows along the last dimension with
// kernels_math.c's row kernels: the forward from x when g is nil, else
// the backward from g (the incoming gradient) and x (the forward's
// output). out, x and g hold rows of n contiguous elements of one dtype,
// float32 or a half type (a half-type row is widened to float32 first and
// rounded back after).
func softmaxRowsVectorised(out, x, g *Tensor, rows, n int, log bool) {
	size, isa := x.dtype.Size(), mathISA()
	row := func(t *Tensor, r int) unsafe.Pointer { return elemAddr(t.mem.Pointer(), t.offset+r*n, size) }
	kernel := func(o, xp, gp unsafe.Pointer, k int) { // k float32 rows
		if g == nil {
			softmaxRowsF32(o, xp, k, n, log, isa)
		} else {
			softmaxBackwardRowsF32(o, gp, xp, k, n, log, isa)
		}
	}
	parallelForStop(x.ctx.stopFlag(), rows, max(1, parallelThreshold/n), stopGrain(n), func(lo, hi int) {
		if x.dtype == Float32 {
			var gp unsafe.Pointer
			if g != nil {
				gp = row(g, lo)
			}
			kernel(row(out, lo), row(x, lo), gp, hi-lo)
			return
		}
		// A half type's rows go through float32 in blocks of about 32 KiB
		// of rows, three calls into C per block.
		k := max(1, min(hi-lo, halfRowsBlock/n))
		xb, ob, gb := make([]float32, k*n), make([]float32, k*n), []float32(nil)
		if g != nil {
			gb = make([]float32, k*n)
		}
		for r := lo; r < hi; r += k {
			m := min(k, hi-r)
			halfToF32s(x.dtype, unsafe.Pointer(&xb[0]), row(x, r), m*n)
			var gp unsafe.Pointer
			if g != nil {
				halfToF32s(x.dtype, unsafe.Pointer(&gb[0]), row(g, r), m*n)
				gp = unsafe.Pointer(&gb[0])
			}
			kernel(unsafe.Pointer(&ob[0]), unsafe.Pointer(&xb[0]), gp, m)
			f32ToHalfs(x.dtype, row(out, r), unsafe.Pointer(&ob[0]), m*n)
		}
	})
	runtime.KeepAlive(out)
	runtime.KeepAlive(x)
	runtime.KeepAlive(g)
}

// actReadF64 returns t's values in row-major order as float64 (Go-heap
// scratch).
//
// Once t's Context is interrupted it stops reading (the rest stays zero):
// the kernel that reads it stops too, and its op drops what it computed.
func actReadF64(t *Tensor) []float64 {
	n := t.Numel()
	vals := make([]float64, 0, n)
	load := loadF64[t.dtype]
	forEachElem(t, func(p elemPtr) bool {
		vals = append(vals, load(p))
		return goOn(t.ctx, len(vals))
	})
	return vals[:n]
}

// actStopEvery is how many elements actReadF64, actWriteF64 and
// readFloats move between two checks of the interrupt flag.
const actStopEvery = 1 << 16

// goOn is forEachElem's answer after the i-th element of a read or write
// that stops once c is interrupted: false only then, checked every
// actStopEvery elements.
func goOn(c *Context, i int) bool { return i%actStopEvery != 0 || !c.Interrupted() }

// actWriteF64 stores vals into t in row-major order, rounding to t's dtype.
// Once t's Context is interrupted it stops (t stays partly written).
func actWriteF64(t *Tensor, vals []float64) {
	store := storeF64[t.dtype]
	i := 0
	forEachElem(t, func(p elemPtr) bool {
		store(p, vals[i])
		i++
		return goOn(t.ctx, i)
	})
}

// actHostKernel runs compute over outs (already allocated) and ins on host
// memory: directly for CPU and simulator tensors, not at all on a meta
// device (allocations only), and through host shadows on a real GPU.
func actHostKernel(c *Context, fname string, outs, ins []*Tensor, compute func(outs, ins []*Tensor)) error {
	all := append(slices.Clone(outs), ins...)
	if anyOnGPU(all...) {
		return staged(c, fname, all, func(s *staging) error {
			so := make([]*Tensor, len(outs))
			for k, t := range outs {
				so[k] = s.shadowOf(t)
			}
			si := make([]*Tensor, len(ins))
			for k, t := range ins {
				si[k] = s.shadowOf(t)
			}
			compute(so, si)
			return c.interrupted(fname) // nothing is written back
		})
	}
	for _, t := range all {
		if t != nil && !t.hasData() {
			return nil
		}
	}
	compute(outs, ins)
	return c.interrupted(fname) // the kernels stop early once interrupted
}
