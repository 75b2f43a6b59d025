package tensor

import (
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"
	"unsafe"
)

// Fused ops that training needs and PyTorch runs as single kernels, so
// they make no device temporaries: optimizer updates (lerp_, addcmul_,
// addcdiv_, maximum_, add_ with alpha), addmm, the elementwise backward
// kernels of autograd (threshold_backward, tanh_backward,
// sigmoid_backward), and in-place random initialisation (uniform_,
// normal_). Each runs on host-accessible memory (CPU, simulator with data),
// does only its allocations on a meta device, and stages through host
// shadows on a real GPU.

// f32Loop computes o[lo:hi] from srcs[k][lo:hi] exactly as the f it
// stands for would (in float64, rounded to float32), without a call per
// element: the fast path of mapFloatK for the optimizers' in-place ops.
type f32Loop func(o []float32, srcs [][]float32, lo, hi int)

// mapFloat sets out[i] = f(ins[0][i], ...) over out's shape (ins broadcast
// to it), computing in float64 and rounding to out's dtype. Contiguous
// float32 operands of out's shape take a direct loop.
func mapFloat(out *Tensor, ins []*Tensor, f func(x []float64) float64) {
	mapFloatK(out, ins, f, nil)
}

// mapFloatK is mapFloat with loop, when not nil, as the direct loop over
// contiguous float32 operands.
func mapFloatK(out *Tensor, ins []*Tensor, f func(x []float64) float64, loop f32Loop) {
	if !out.hasData() || out.Numel() == 0 {
		return
	}
	if out.dtype == Float32 && out.isContiguous() && allContiguousF32(out.shape, ins) {
		o := unsafe.Slice((*float32)(unsafe.Add(out.mem.Pointer(), out.offset*4)), out.Numel())
		srcs := make([][]float32, len(ins))
		for k, in := range ins {
			srcs[k] = unsafe.Slice((*float32)(unsafe.Add(in.mem.Pointer(), in.offset*4)), in.Numel())
		}
		if loop != nil {
			parallelForStop(out.ctx.stopFlag(), len(o), parallelThreshold, interruptGrain/4, func(lo, hi int) { loop(o, srcs, lo, hi) })
			return
		}
		parallelForStop(out.ctx.stopFlag(), len(o), parallelThreshold, interruptGrain/4, func(lo, hi int) {
			xs := make([]float64, len(ins))
			for i := lo; i < hi; i++ {
				for k := range srcs {
					xs[k] = float64(srcs[k][i])
				}
				o[i] = float32(f(xs))
			}
		})
		return
	}
	ops := []strided{layoutOf(out, out.shape)}
	for _, in := range ins {
		ops = append(ops, layoutOf(in, out.shape))
	}
	it := newElemIter(out.shape, ops...)
	store := storeF64[out.dtype]
	loads := make([]func(unsafe.Pointer) float64, len(ins))
	for k, in := range ins {
		loads[k] = loadF64[in.dtype]
	}
	parallelForStop(it.stop, it.n, parallelThreshold, interruptGrain/4, func(lo, hi int) {
		xs := make([]float64, len(ins))
		q := make([]unsafe.Pointer, len(ops))
		it.runRange(lo, hi, func(p []unsafe.Pointer, n int) {
			copy(q, p)
			for range n {
				for k := range ins {
					xs[k] = loads[k](q[k+1])
				}
				store(q[0], f(xs))
				for k := range q {
					q[k] = unsafe.Add(q[k], it.inner[k])
				}
			}
		})
	})
}

func allContiguousF32(shape []int, ins []*Tensor) bool {
	for _, in := range ins {
		if in.dtype != Float32 || !in.isContiguous() || !slices.Equal(in.shape, shape) {
			return false
		}
	}
	return true
}

// checkSameDevice checks that every tensor is on dst's device.
func checkSameDevice(fname string, dst *Tensor, ts ...*Tensor) error {
	for _, t := range ts {
		if t.mem.Device() != dst.mem.Device() {
			return errorf(fname, "Expected all tensors to be on the same device, but found at least two devices, %s and %s!", dst.mem.Device(), t.mem.Device())
		}
	}
	return nil
}

// inPlace runs f elementwise into dst (reading dst and others broadcast to
// dst's shape), bumping dst's version; staged on a real GPU.
func inPlace(fname string, dst *Tensor, others []*Tensor, f func(x []float64) float64) error {
	return inPlaceK(fname, dst, others, f, nil)
}

// inPlaceK is inPlace with loop the direct loop for contiguous float32
// operands (mapFloatK).
func inPlaceK(fname string, dst *Tensor, others []*Tensor, f func(x []float64) float64, loop f32Loop) error {
	if err := dst.checkLive(fname); err != nil {
		return err
	}
	if err := checkSameDevice(fname, dst, others...); err != nil {
		return err
	}
	for _, o := range others {
		if _, err := broadcastTo(fname, o.shape, dst.shape); err != nil {
			return err
		}
	}
	ins := append([]*Tensor{dst}, others...)
	if anyOnGPU(ins...) {
		err := staged(dst.ctx, fname, ins, func(s *staging) error {
			sh := make([]*Tensor, len(ins))
			for k, t := range ins {
				sh[k] = s.shadowOf(t)
			}
			mapFloatK(sh[0], sh, f, loop)
			return nil
		})
		if err != nil {
			return err
		}
	} else {
		mapFloatK(dst, ins, f, loop)
	}
	dst.st.BumpVersion()
	return nil
}

// broadcastTo checks that shape broadcasts to target.
func broadcastTo(fname string, shape, target []int) ([]int, error) {
	if len(shape) > len(target) {
		return nil, errorf(fname, "output with shape %s doesn't match the broadcast shape", SizeString(target))
	}
	k := len(target) - len(shape)
	for i, s := range shape {
		if s != 1 && s != target[k+i] {
			return nil, errorf(fname, "The size of tensor a (%d) must match the size of tensor b (%d) at non-singleton dimension %d", target[k+i], s, k+i)
		}
	}
	return target, nil
}

// mapNew allocates a result of like's shape and dtype on like's device and
// fills it with f over ins (broadcast to like's shape).
func mapNew(fname string, like *Tensor, dt DType, ins []*Tensor, f func(x []float64) float64) (*Tensor, error) {
	for _, t := range ins {
		if err := t.checkLive(fname); err != nil {
			return nil, err
		}
	}
	out, err := newTensor(like.ctx, fname, like.mem.Device(), dt, slices.Clone(like.shape))
	if err != nil {
		return nil, err
	}
	if anyOnGPU(ins...) {
		all := append([]*Tensor{out}, ins...)
		err := staged(like.ctx, fname, all, func(s *staging) error {
			sh := make([]*Tensor, len(ins))
			for k, t := range ins {
				sh[k] = s.shadowOf(t)
			}
			mapFloat(s.shadowOf(out), sh, f)
			return nil
		})
		if err != nil {
			return nil, err
		}
		return out, nil
	}
	mapFloat(out, ins, f)
	return out, nil
}

// Lerp_ is a.lerp_(b, w): a += w·(b − a), in place.
func Lerp_(a, b *Tensor, w float64) error {
	return inPlaceK("tensor.lerp_", a, []*Tensor{b}, func(x []float64) float64 { return x[0] + w*(x[1]-x[0]) },
		func(o []float32, s [][]float32, lo, hi int) {
			a, b := s[0][lo:hi], s[1][lo:hi]
			for i, x := range a {
				y := float64(x)
				o[lo+i] = float32(y + w*(float64(b[i])-y))
			}
		})
}

// Addcmul_ is a.addcmul_(b, c, value=v): a += v·b·c, in place.
func Addcmul_(a, b, c *Tensor, v float64) error {
	return inPlaceK("tensor.addcmul_", a, []*Tensor{b, c}, func(x []float64) float64 { return x[0] + v*x[1]*x[2] },
		func(o []float32, s [][]float32, lo, hi int) {
			a, b, c := s[0][lo:hi], s[1][lo:hi], s[2][lo:hi]
			for i, x := range a {
				o[lo+i] = float32(float64(x) + v*float64(b[i])*float64(c[i]))
			}
		})
}

// Addcdiv_ is a.addcdiv_(b, c, value=v): a += v·b/c, in place.
func Addcdiv_(a, b, c *Tensor, v float64) error {
	return inPlaceK("tensor.addcdiv_", a, []*Tensor{b, c}, func(x []float64) float64 { return x[0] + v*x[1]/x[2] },
		func(o []float32, s [][]float32, lo, hi int) {
			a, b, c := s[0][lo:hi], s[1][lo:hi], s[2][lo:hi]
			for i, x := range a {
				o[lo+i] = float32(float64(x) + v*float64(b[i])/float64(c[i]))
			}
		})
}

// Maximum_ is torch.maximum(a, b, out=a): elementwise max, in place.
func Maximum_(a, b *Tensor) error {
	return inPlace("tensor.maximum_", a, []*Tensor{b}, func(x []float64) float64 {
		if math.IsNaN(x[0]) || math.IsNaN(x[1]) {
			return math.NaN()
		}
		return math.Max(x[0], x[1])
	})
}

// Add_ is a.add_(b, alpha=s): a += s·b, in place.
func Add_(a, b *Tensor, s float64) error {
	return inPlaceK("tensor.add_", a, []*Tensor{b}, func(x []float64) float64 { return x[0] + s*x[1] },
		func(o []float32, src [][]float32, lo, hi int) {
			a, b := src[0][lo:hi], src[1][lo:hi]
			for i, x := range a {
				o[lo+i] = float32(float64(x) + s*float64(b[i]))
			}
		})
}

// MulScalar_ is a.mul_(s).
func MulScalar_(a *Tensor, s float64) error {
	return inPlaceK("tensor.mul_", a, nil, func(x []float64) float64 { return x[0] * s },
		func(o []float32, src [][]float32, lo, hi int) {
			for i, x := range src[0][lo:hi] {
				o[lo+i] = float32(float64(x) * s)
			}
		})
}

// AddScalar_ is a.add_(s).
func AddScalar_(a *Tensor, s float64) error {
	return inPlaceK("tensor.add_", a, nil, func(x []float64) float64 { return x[0] + s },
		func(o []float32, src [][]float32, lo, hi int) {
			for i, x := range src[0][lo:hi] {
				o[lo+i] = float32(float64(x) + s)
			}
		})
}

// DivScalar_ is a.div_(s).
func DivScalar_(a *Tensor, s float64) error {
	return inPlaceK("tensor.div_", a, nil, func(x []float64) float64 { return x[0] / s },
		func(o []float32, src [][]float32, lo, hi int) {
			for i, x := range src[0][lo:hi] {
				o[lo+i] = float32(float64(x) / s)
			}
		})
}

// DivScalar is a / s, a new tensor of a's dtype.
func DivScalar(a *Tensor, s float64) (*Tensor, error) {
	return mapNew("tensor.div", a, a.dtype, []*Tensor{a}, func(x []float64) float64 { return x[0] / s })
}

// AddScaled is torch.add(a, b, alpha=s): a + s·b, a new tensor of a's
// shape and dtype (b broadcast to it).
func AddScaled(a, b *Tensor, s float64) (*Tensor, error) {
	if err := checkSameDevice("tensor.add", a, b); err != nil {
		return nil, err
	}
	if _, err := broadcastTo("tensor.add", b.shape, a.shape); err != nil {
		return nil, err
	}
	return mapNew("tensor.add", a, a.dtype, []*Tensor{a, b}, func(x []float64) float64 { return x[0] + s*x[1] })
}

// PowScalar is a.pow(e) for a floating-point a (a new tensor).
func PowScalar(a *Tensor, e float64) (*Tensor, error) {
	if !a.dtype.IsFloat() {
		return nil, errorf("tensor.pow", "pow of a %s tensor is not supported; convert it with .float()", a.dtype)
	}
	var f func(x []float64) float64
	switch e {
	case 2:
		f = func(x []float64) float64 { return x[0] * x[0] }
	case 3:
		f = func(x []float64) float64 { return x[0] * x[0] * x[0] }
	case 0.5:
		f = func(x []float64) float64 { return math.Sqrt(x[0]) }
	default:
		f = func(x []float64) float64 { return math.Pow(x[0], e) }
	}
	return mapNew("tensor.pow", a, a.dtype, []*Tensor{a}, f)
}

// Rsqrt is 1/√a.
func Rsqrt(a *Tensor) (*Tensor, error) {
	if !a.dtype.IsFloat() {
		return nil, errorf("tensor.rsqrt", "rsqrt of a %s tensor is not supported; convert it with .float()", a.dtype)
	}
	return mapNew("tensor.rsqrt", a, a.dtype, []*Tensor{a}, func(x []float64) float64 { return 1 / math.Sqrt(x[0]) })
}

// Sign is the elementwise sign (-1, 0 or 1; NaN stays NaN).
func Sign(a *Tensor) (*Tensor, error) {
	return mapNew("tensor.sign", a, a.dtype, []*Tensor{a}, func(x []float64) float64 {
		switch {
		case x[0] > 0:
			return 1
		case x[0] < 0:
			return -1
		}
		return x[0]
	})
}

// BackwardKernel runs one of ATen's elementwise backward kernels on the
// incoming gradient g and the saved y, returning a new tensor of g's
// shape: "threshold_backward" (g where y > 0, else 0: relu's),
// "tanh_backward" (g·(1 − y²)), "sigmoid_backward" (g·y·(1 − y)).
func BackwardKernel(op string, g, y *Tensor) (*Tensor, error) {
	var f func(x []float64) float64
	switch op {
	case "threshold_backward":
		f = func(x []float64) float64 {
			if x[1] <= 0 {
				return 0
			}
			return x[0]
		}
	case "tanh_backward":
		f = func(x []float64) float64 { return x[0] * (1 - x[1]*x[1]) }
	case "sigmoid_backward":
		f = func(x []float64) float64 { return x[0] * x[1] * (1 - x[1]) }
	default:
		return nil, fmt.Errorf("tensor: unknown backward kernel %q", op)
	}
	if err := checkSameDevice(op, g, y); err != nil {
		return nil, err
	}
	return mapNew(op, g, g.dtype, []*Tensor{g, y}, f)
}

// Addmm is bias + a @ b (torch.addmm with beta = alpha = 1): one
// allocation, the product, to which bias (broadcast) is added in place.
func Addmm(bias, a, b *Tensor) (*Tensor, error) {
	out, err := Matmul(a, b)
	if err != nil {
		return nil, Renamed(err, "tensor.addmm")
	}
	if _, err := BinaryInPlace(OpAdd, out, bias); err != nil {
		return nil, Renamed(err, "tensor.addmm")
	}
	if strings.HasPrefix(out.Device(), "cuda") && bias.Dim() == 1 && out.Dim() == 2 && out.dtype.IsFloat() {
		// PyTorch runs this addmm through cuBLASLt (gemm_and_bias), which
		// takes its own workspace the first time (blas_workspace.go).
		if err := out.ctx.blasWorkspace(out.Device(), true); err != nil {
			return nil, Renamed(err, "tensor.addmm")
		}
	}
	return out, nil
}

// Alias returns a new tensor sharing t's storage, shape and strides
// (Tensor.detach's data): no allocation.
func Alias(t *Tensor) *Tensor {
	a := t.viewOf(slices.Clone(t.shape), slices.Clone(t.strides), t.offset)
	a.view = t.view
	return a
}

// SetData makes t refer to src's storage, dtype, shape and strides (the
// param.data = src assignment Module.to uses), keeping t's identity.
func (t *Tensor) SetData(src *Tensor) {
	t.st, t.mem = src.st, src.mem
	t.reshaped()
	t.dtype = src.dtype
	t.shape, t.strides, t.offset = slices.Clone(src.shape), slices.Clone(src.strides), src.offset
}

// CanView reports whether t can be viewed as shape without a copy
// (Tensor.view would succeed; reshape would return a view).
func CanView(t *Tensor, shape []int) bool {
	if numel(shape) != t.Numel() {
		return false
	}
	return computeStride(t.shape, t.strides, shape) != nil
}

// IsNonOverlappingAndDense reports whether t's elements fill a contiguous
// block of its storage in some order of dimensions (any permutation of a
// contiguous tensor).
func (t *Tensor) IsNonOverlappingAndDense() bool {
	if t.isContiguous() {
		return true
	}
	idx := make([]int, len(t.shape))
	for i := range idx {
		idx[i] = i
	}
	sort.SliceStable(idx, func(i, j int) bool {
		if t.shape[idx[i]] < 2 || t.shape[idx[j]] < 2 {
			return t.shape[idx[i]] >= 2 && t.shape[idx[j]] < 2
		}
		return t.strides[idx[i]] < t.strides[idx[j]]
	})
	expected := 1
	for _, d := range idx {
		if t.shape[d] == 1 {
			continue
		}
		if t.strides[d] != expected {
			return false
		}
		expected *= t.shape[d]
	}
	return true
}

// EmptyStridedLike allocates a tensor with v's shape, dtype, device and, for
// a dense v, its strides (torch.empty_strided), as AccumulateGrad's copy
// of a gradient.
func EmptyStridedLike(v *Tensor) (*Tensor, error) {
	out, err := newTensor(v.ctx, "tensor.empty_strided", v.mem.Device(), v.dtype, slices.Clone(v.shape))
	if err != nil {
		return nil, err
	}
	if v.IsNonOverlappingAndDense() && !v.isContiguous() {
		out.strides = slices.Clone(v.strides)
	}
	return out, nil
}

// Uniform_ fills t in place from U(lo, hi) with the Context's Philox
// generator (Tensor.uniform_).
func Uniform_(t *Tensor, lo, hi float64) error {
	return randomFill("tensor.uniform_", t, false, func(x float64) float64 { return lo + (hi-lo)*x })
}

// Normal_ fills t in place from N(mean, std²) (Tensor.normal_).
func Normal_(t *Tensor, mean, std float64) error {
	return randomFill("tensor.normal_", t, true, func(x float64) float64 { return mean + std*x })
}

// randomFillChunk is how many values randomFill draws at a time.
const randomFillChunk = 1 << 16

func randomFill(fname string, t *Tensor, normal bool, scale func(float64) float64) error {
	if err := t.checkLive(fname); err != nil {
		return err
	}
	if !t.dtype.IsFloat() && fname != "tensor.randint_" {
		return errorf(fname, "%s expects a floating point tensor, got %s", fname, t.dtype)
	}
	n := t.Numel()
	seed, offset := t.ctx.draw(n)
	fill := func(dst *Tensor) {
		if !dst.hasData() || n == 0 {
			return
		}
		// the values of generator offsets offset+i, randomFillChunk at a
		// time: a fill's Go memory is bounded, not 8 bytes per element
		buf := make([]float64, min(n, randomFillChunk))
		i := 0
		forEachElem(dst, func(p elemPtr) bool {
			j := i % randomFillChunk
			if j == 0 {
				vals := buf[:min(randomFillChunk, n-i)]
				randomF64s(vals, seed, offset+uint64(i), normal)
				for k, v := range vals {
					vals[k] = scale(v)
				}
			}
			storeF64[dst.dtype](p, buf[j])
			i++
			return true
		})
	}
	_, err := writeInPlace(fname, t, func(x *Tensor) error {
		fill(x)
		return nil
	})
	return err
}

// Randint is torch.randint(low, high, shape): integers uniform in [low,
// high) from the Context's Philox generator, of dtype dt (Undefined:
// int64).
func Randint(c *Context, low, high int64, shape []int, dt DType, device string) (*Tensor, error) {
	const fname = "tensor.randint"
	if dt == Undefined {
		dt = Int64
	}
	if high <= low {
		return nil, errorf(fname, "random_ expects 'from' to be less than 'to', but got from=%d >= to=%d", low, high)
	}
	for _, s := range shape {
		if s < 0 {
			return nil, errorf(fname, "Trying to create tensor with negative dimension %d: %v", s, shape)
		}
	}
	t, err := newTensor(c, fname, device, dt, slices.Clone(shape))
	if err != nil {
		return nil, err
	}
	span := float64(high - low)
	if n := t.Numel(); dt == Int64 && t.hasData() && onGPU(t) == nil && n > 0 {
		// the common case in bulk: the values randomFill's would be
		seed, offset := c.draw(n)
		randintInt64s(c.stopFlag(), unsafe.Slice((*int64)(t.mem.Pointer()), n), seed, offset, low, span)
		if err := c.interrupted(fname); err != nil {
			return nil, err
		}
		t.st.BumpVersion() // as randomFill does
		return t, nil
	}
	if err := randomFill(fname+"_", t, false, func(x float64) float64 { return float64(low) + math.Floor(x*span) }); err != nil {
		return nil, err
	}
	return t, nil
}

// ScatterAdd_ is dst.scatter_add_(dim, index, src): for every position p
// of index (whose shape src shares), dst[p with p[dim] = index[p]] +=
// src[p]. index is int64; nothing is allocated on the device.
func ScatterAdd_(dst *Tensor, dim int, index, src *Tensor) error {
	const fname = "tensor.scatter_add_"
	if index.dtype != Int64 {
		return errorf(fname, "scatter_add_(): Expected dtype int64 for index")
	}
	if len(index.shape) != len(dst.shape) || !slices.Equal(index.shape, src.shape) {
		return errorf(fname, "Index tensor must have the same number of dimensions as self tensor")
	}
	if err := checkSameDevice(fname, dst, index, src); err != nil {
		return err
	}
	run := func(d, ix, s *Tensor) error {
		if !d.hasData() || ix.Numel() == 0 {
			return nil
		}
		idx, err := ix.ToFloat64s()
		if err != nil {
			return err
		}
		vals, err := s.ToFloat64s()
		if err != nil {
			return err
		}
		nd := len(ix.shape)
		pos := make([]int, nd)
		load, store := loadF64[d.dtype], storeF64[d.dtype]
		for k := range idx {
			off := d.offset
			for i := range nd {
				c := pos[i]
				if i == dim {
					c = int(idx[k])
					if c < 0 || c >= d.shape[i] {
						return errorf(fname, "index %d is out of bounds for dimension %d with size %d", c, i, d.shape[i])
					}
				}
				off += c * d.strides[i]
			}
			p := unsafe.Add(d.mem.Pointer(), off*d.dtype.Size())
			store(p, load(p)+vals[k])
			for i := nd - 1; i >= 0; i-- {
				pos[i]++
				if pos[i] < ix.shape[i] {
					break
				}
				pos[i] = 0
			}
		}
		return nil
	}
	var err error
	if anyOnGPU(dst, index, src) {
		err = staged(dst.ctx, fname, []*Tensor{dst, index, src}, func(s *staging) error {
			return run(s.shadowOf(dst), s.shadowOf(index), s.shadowOf(src))
		})
	} else {
		err = run(dst, index, src)
	}
	if err == nil {
		dst.st.BumpVersion()
	}
	return err
}

// AllFinite reports whether every element of t is finite (no inf, no
// NaN), reading the values in place: no copy, no allocation proportional
// to t's size (GradScaler's non-finite check). A meta tensor has no values
// and counts as finite.
func AllFinite(t *Tensor) (bool, error) {
	const fname = "tensor.isfinite"
	if err := t.checkLive(fname); err != nil {
		return false, err
	}
	if !t.dtype.IsFloat() {
		return true, nil
	}
	ok := true
	scan := func(s *Tensor) {
		if !s.hasData() {
			return
		}
		load := loadF64[s.dtype]
		forEachElem(s, func(p elemPtr) bool {
			v := load(p)
			if math.IsInf(v, 0) || math.IsNaN(v) {
				ok = false
				return false
			}
			return true
		})
	}
	if onGPU(t) != nil {
		err := staged(t.ctx, fname, []*Tensor{t}, func(s *staging) error {
			scan(s.shadowOf(t))
			return nil
		})
		return ok, err
	}
	scan(t)
	return ok, nil
}
