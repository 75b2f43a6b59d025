package tensor

import (
	"math"
	"runtime"
	"unsafe"
)

// The ops that optimizers and gradient clipping need beyond the fused
// updates of fused.go: torch.linalg.vector_norm (the 0-dim norms of
// clip_grad_norm_ and the row and column norms of Adafactor), clamp and
// clamp_, and the in-place rsqrt_ and square_. Each allocates exactly what
// its ATen op allocates on CUDA: its result (the out-of-place ones) or
// nothing (the in-place ones). A CUDA full reduction's block-staging
// scratch is not modelled (reduce_scratch.go: "their staging is small or
// absent").

// VectorNorm is torch.linalg.vector_norm(t, ord, dim=dims, keepdim=keepdim)
// for a floating-point t: a new tensor of t's dtype with the reduced shape
// (0-dim when dims is empty), the ord-norm of the reduced elements (ord 0
// counts the non-zeros, ±Inf takes the largest or smallest magnitude),
// accumulated in float64.
func VectorNorm(t *Tensor, ord float64, dims []int, keepdim bool) (*Tensor, error) {
	const fname = "tensor.linalg.vector_norm"
	if err := t.checkLive(fname); err != nil {
		return nil, err
	}
	if !t.dtype.IsFloat() {
		return nil, errorf(fname, "Expected a floating point or complex tensor as input. Got %s", dtypes[t.dtype].torch)
	}
	if math.IsNaN(ord) {
		return nil, errorf(fname, "ord must be a number, got nan")
	}
	red, err := dimSet(fname, dims, len(t.shape))
	if err != nil {
		return nil, err
	}
	if ord < 0 || math.IsInf(ord, 1) {
		for d, r := range red {
			if r && t.shape[d] == 0 {
				return nil, errorf(fname, "Expected a non-empty input when ord is negative or inf, got a tensor of shape %s", SizeString(t.shape))
			}
		}
	}
	if onGPU(t) != nil {
		return stagedTensor(t.ctx, fname, []*Tensor{t}, func(s *staging) (*Tensor, error) {
			return vectorNorm(fname, s.shadowOf(t), ord, red, keepdim)
		})
	}
	return vectorNorm(fname, t, ord, red, keepdim)
}

func vectorNorm(fname string, t *Tensor, ord float64, red []bool, keepdim bool) (*Tensor, error) {
	out, err := newTensor(t.ctx, fname, t.mem.Device(), t.dtype, reducedShape(t.shape, red, keepdim))
	if err != nil {
		return nil, err
	}
	if out.hasData() && out.Numel() > 0 {
		normKernel(t, red, ord, out)
	}
	runtime.KeepAlive(t)
	if err := t.ctx.interrupted(fname); err != nil {
		return nil, err
	}
	return out, nil
}

// normKernel writes the ord-norm of each kept position's reduced elements
// into out (contiguous, row-major over the kept dimensions).
func normKernel(in *Tensor, red []bool, ord float64, out *Tensor) {
	store := storeF64[out.dtype]
	outSize := out.dtype.Size()
	eachNorm(in, red, ord, func(o int, v float64) { store(elemAddr(out.mem.Pointer(), o, outSize), v) })
}

// eachNorm calls set(o, norm) for each kept position o (row-major over the
// kept dimensions) with the ord-norm of its reduced elements.
func eachNorm(in *Tensor, red []bool, ord float64, set func(o int, v float64)) {
	var oShape, oSt, iShape, iSt []int
	for d, s := range in.shape {
		if red[d] {
			iShape, iSt = append(iShape, s), append(iSt, in.strides[d])
		} else {
			oShape, oSt = append(oShape, s), append(oSt, in.strides[d])
		}
	}
	nOut, nIn := numel(oShape), numel(iShape)
	inner := newElemIter(iShape, strided{base: in.mem.Pointer(), size: in.dtype.Size(), st: iSt})
	stride := inner.inner[0]
	load := loadF64[in.dtype]
	stop := in.ctx.stopFlag()
	parallelFor(nOut, max(1, parallelThreshold/max(nIn, 1)), func(lo, hi int) {
		sc := inner.scratch()
		base := []int{0}
		for o := lo; o < hi; o++ {
			if stop != nil && stop.Load() {
				return
			}
			off, r := in.offset, o
			for d := len(oShape) - 1; d >= 0; d-- {
				off += (r % oShape[d]) * oSt[d]
				r /= oShape[d]
			}
			base[0] = off
			var acc float64
			if math.IsInf(ord, -1) {
				acc = math.Inf(1)
			}
			inner.runRangeWith(sc, base, 0, nIn, func(p []unsafe.Pointer, n int) {
				q := p[0]
				for range n {
					a := math.Abs(load(q))
					switch {
					case ord == 2:
						acc += a * a
					case ord == 1:
						acc += a
					case ord == 0:
						if a != 0 {
							acc++
						}
					case math.IsInf(ord, 1):
						if a > acc || a != a {
							acc = a
						}
					case math.IsInf(ord, -1):
						if a < acc || a != a {
							acc = a
						}
					default:
						acc += math.Pow(a, ord)
					}
					q = unsafe.Add(q, stride)
				}
			})
			switch {
			case ord == 2:
				acc = math.Sqrt(acc)
			case ord == 1, ord == 0, math.IsInf(ord, 0):
			default:
				acc = math.Pow(acc, 1/ord)
			}
			set(o, acc)
		}
	})
}

// NormOf returns the ord-norm of all of t's elements as a number, read in
// place: no allocation on any device (for an op whose result tensor is
// made separately, as a fused kernel's). t must hold data (not meta).
func NormOf(t *Tensor, ord float64) (float64, error) {
	const fname = "tensor.norm"
	if err := t.checkLive(fname); err != nil {
		return 0, err
	}
	if err := t.needData(fname); err != nil {
		return 0, err
	}
	if onGPU(t) != nil {
		var v float64
		err := staged(t.ctx, fname, []*Tensor{t}, func(s *staging) error {
			var err error
			v, err = NormOf(s.shadowOf(t), ord)
			return err
		})
		return v, err
	}
	red, _ := dimSet(fname, nil, len(t.shape))
	var v float64
	if t.Numel() > 0 {
		eachNorm(t, red, ord, func(_ int, x float64) { v = x })
	}
	runtime.KeepAlive(t)
	return v, nil
}

// clampFunc is clamp's elementwise rule: NaN stays NaN, then min, then max
// (max wins when min > max, as in PyTorch).
func clampFunc(lo, hi *float64) func(x []float64) float64 {
	return func(x []float64) float64 {
		v := x[0]
		if v != v {
			return v
		}
		if lo != nil && v < *lo {
			v = *lo
		}
		if hi != nil && v > *hi {
			v = *hi
		}
		return v
	}
}

func checkClamp(fname string, t *Tensor, lo, hi *float64) error {
	if err := t.checkLive(fname); err != nil {
		return err
	}
	if lo == nil && hi == nil {
		return errorf(fname, "At least one of 'min' or 'max' must not be None")
	}
	if !t.dtype.IsFloat() {
		return errorf(fname, "clamp of a %s tensor is not supported; convert it with .float()", t.dtype)
	}
	return nil
}

// Clamp is torch.clamp(t, min=lo, max=hi) (nil: no bound) for a
// floating-point t: a new tensor.
func Clamp(t *Tensor, lo, hi *float64) (*Tensor, error) {
	if err := checkClamp("tensor.clamp", t, lo, hi); err != nil {
		return nil, err
	}
	return mapNew("tensor.clamp", t, t.dtype, []*Tensor{t}, clampFunc(lo, hi))
}

// Clamp_ is Tensor.clamp_(min=lo, max=hi), in place.
func Clamp_(t *Tensor, lo, hi *float64) error {
	if err := checkClamp("tensor.clamp_", t, lo, hi); err != nil {
		return err
	}
	return inPlace("tensor.clamp_", t, nil, clampFunc(lo, hi))
}

// Rsqrt_ is Tensor.rsqrt_(): t = 1/√t in place.
func Rsqrt_(t *Tensor) error {
	if !t.dtype.IsFloat() {
		return errorf("tensor.rsqrt_", "result type Float can't be cast to the desired output type %s", dtypes[t.dtype].torch)
	}
	return inPlace("tensor.rsqrt_", t, nil, func(x []float64) float64 { return 1 / math.Sqrt(x[0]) })
}

// Square_ is Tensor.square_(): t = t·t in place.
func Square_(t *Tensor) error {
	return inPlace("tensor.square_", t, nil, func(x []float64) float64 { return x[0] * x[0] })
}

// Reciprocal is torch.reciprocal(t) for a floating-point t: a new tensor.
func Reciprocal(t *Tensor) (*Tensor, error) {
	if !t.dtype.IsFloat() {
		return nil, errorf("tensor.reciprocal", "reciprocal of a %s tensor is not supported; convert it with .float()", t.dtype)
	}
	return mapNew("tensor.reciprocal", t, t.dtype, []*Tensor{t}, func(x []float64) float64 { return 1 / x[0] })
}

// MapInPlace sets dst[i] = f(dst[i], others[0][i], ...) in place (the
// others broadcast to dst's shape, on dst's device), computing in
// float64: the arithmetic of a fused kernel that reads several tensors and
// writes one (a fused optimizer's update), with no allocation.
func MapInPlace(fname string, dst *Tensor, others []*Tensor, f func(x []float64) float64) error {
	return inPlace(fname, dst, others, f)
}

// SetFloat64s writes vals (row-major, one per element, rounded to t's
// dtype) into t in place: no allocation on any device. For an op whose
// arithmetic runs on the host over a copy of the values (ToFloat64s), as
// the simulator's share of a fused kernel with block-wise state (the 8-bit
// optimizers). t must hold data.
func (t *Tensor) SetFloat64s(vals []float64) error {
	const fname = "tensor.set_values"
	if err := t.checkLive(fname); err != nil {
		return err
	}
	if len(vals) != t.Numel() {
		return errorf(fname, "got %d values for a tensor of %d elements", len(vals), t.Numel())
	}
	if err := t.needData(fname); err != nil {
		return err
	}
	if onGPU(t) != nil {
		return staged(t.ctx, fname, []*Tensor{t}, func(s *staging) error { return s.shadowOf(t).SetFloat64s(vals) })
	}
	store := storeF64[t.dtype]
	i := 0
	forEachElem(t, func(p elemPtr) bool {
		store(p, vals[i])
		i++
		return true
	})
	runtime.KeepAlive(t)
	t.st.BumpVersion()
	return nil
}
