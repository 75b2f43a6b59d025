package tensor

import (
	"fmt"
	"math"
	"runtime"
	"slices"
	"strings"
)

// Layer normalisation as ATen's CUDA native_layer_norm and
// native_layer_norm_backward: the statistics (mean and 1/σ, one per row of
// the normalised trailing dimensions) are float32 for float32, float16 and
// bfloat16 inputs (float64 for float64), shaped [M..., 1...] to broadcast
// against the input.

// normShapeString prints a normalized_shape as c10 prints an IntArrayRef:
// "[1024]", "[4, 8]".
func normShapeString(s []int) string {
	parts := make([]string, len(s))
	for i, v := range s {
		parts[i] = fmt.Sprint(v)
	}
	return "[" + strings.Join(parts, ", ") + "]"
}

// CheckNormInputs is _check_layer_norm_inputs: normalized_shape must be
// non-empty, weight and bias (nil: absent) of that shape, and the input's
// trailing dimensions equal to it. It returns M (rows) and N (elements per
// row).
func CheckNormInputs(fname string, x *Tensor, normalized []int, w, b *Tensor) (m, n int, err error) {
	if len(normalized) == 0 {
		return 0, 0, errorf(fname, "Expected normalized_shape to be at least 1-dimensional, i.e., containing at least one element, but got normalized_shape = []")
	}
	if w != nil && !slices.Equal(w.shape, normalized) {
		return 0, 0, errorf(fname, "Expected weight to be of same shape as normalized_shape, but got weight of shape %s and normalized_shape = %s",
			normShapeString(w.shape), normShapeString(normalized))
	}
	if b != nil && !slices.Equal(b.shape, normalized) {
		return 0, 0, errorf(fname, "Expected bias to be of same shape as normalized_shape, but got bias of shape %s and normalized_shape = %s",
			normShapeString(b.shape), normShapeString(normalized))
	}
	nd := len(x.shape) - len(normalized)
	if nd < 0 || !slices.Equal(x.shape[nd:], normalized) {
		var sb strings.Builder
		fmt.Fprintf(&sb, "Given normalized_shape=%s, expected input with shape [*", normShapeString(normalized))
		for _, s := range normalized {
			fmt.Fprintf(&sb, ", %d", s)
		}
		fmt.Fprintf(&sb, "], but got input of size%s", normShapeString(x.shape))
		return 0, 0, errorf(fname, "%s", sb.String())
	}
	return numel(x.shape[:nd]), numel(normalized), nil
}

// NormAccDType is the statistics dtype of a normalisation over dt on CUDA
// (at::toAccumulateType(dt, is_cuda=true)): float64 for float64, else
// float32.
func NormAccDType(dt DType) DType {
	if dt == Float64 {
		return Float64
	}
	return Float32
}

// NativeLayerNorm is native_layer_norm(x, normalized_shape, w, b, eps):
// allocates the output (x's shape and dtype), then mean and rstd ([M]
// floats, returned as views of shape [M..., 1...]). Non-contiguous x, w or
// b are first copied contiguous (temporaries freed when the op returns).
func NativeLayerNorm(x *Tensor, normalized []int, w, b *Tensor, eps float64) (out, mean, rstd *Tensor, err error) {
	const fname = "tensor.native_layer_norm"
	if err := checkFloatOp(fname, "LayerNormKernelImpl", x); err != nil {
		return nil, nil, nil, err
	}
	for _, t := range []*Tensor{w, b} {
		if t != nil {
			if err := t.checkLive(fname); err != nil {
				return nil, nil, nil, err
			}
			if err := checkSameDevice(fname, x, t); err != nil {
				return nil, nil, nil, err
			}
		}
	}
	m, n, err := CheckNormInputs(fname, x, normalized, w, b)
	if err != nil {
		return nil, nil, nil, err
	}
	xc, wc, bc, err := contiguous3(fname, x, w, b)
	if err != nil {
		return nil, nil, nil, err
	}
	// what it makes is held from when it is made, so that a reclaim while
	// it makes the next (one that would raise a peak) reaches it instead
	// of asking the collector whether this op still holds it
	defer x.ctx.Hold(xc, wc, bc)()
	dev := x.mem.Device()
	if out, err = newTensor(x.ctx, fname, dev, x.dtype, slices.Clone(x.shape)); err != nil {
		return nil, nil, nil, err
	}
	x.ctx.Hold(out)
	acc := NormAccDType(x.dtype)
	if mean, err = newTensor(x.ctx, fname, dev, acc, []int{m}); err != nil {
		return nil, nil, nil, err
	}
	x.ctx.Hold(mean)
	if rstd, err = newTensor(x.ctx, fname, dev, acc, []int{m}); err != nil {
		return nil, nil, nil, err
	}
	err = actHostKernel(x.ctx, fname, []*Tensor{out, mean, rstd}, []*Tensor{xc, wc, bc}, func(outs, ins []*Tensor) {
		layerNormForward(outs, ins, m, n, eps)
	})
	runtime.KeepAlive(xc)
	runtime.KeepAlive(wc)
	runtime.KeepAlive(bc)
	if err != nil {
		return nil, nil, nil, err
	}
	stat := statShape(x.shape, len(normalized))
	if mean, err = View(mean, stat); err != nil {
		return nil, nil, nil, err
	}
	if rstd, err = View(rstd, stat); err != nil {
		return nil, nil, nil, err
	}
	return out, mean, rstd, nil
}

// statShape is the input's leading dimensions followed by 1s.
func statShape(shape []int, nnorm int) []int {
	s := slices.Clone(shape)
	for i := len(s) - nnorm; i < len(s); i++ {
		s[i] = 1
	}
	return s
}

// contiguous3 is expect_contiguous on x, w and b (nil stays nil), in that
// order.
func contiguous3(fname string, x, w, b *Tensor) (xc, wc, bc *Tensor, err error) {
	if xc, err = Contiguous(x); err != nil {
		return nil, nil, nil, Renamed(err, fname)
	}
	if w != nil {
		if wc, err = Contiguous(w); err != nil {
			return nil, nil, nil, Renamed(err, fname)
		}
	}
	if b != nil {
		if bc, err = Contiguous(b); err != nil {
			return nil, nil, nil, Renamed(err, fname)
		}
	}
	return xc, wc, bc, nil
}

func layerNormForward(outs, ins []*Tensor, m, n int, eps float64) {
	if outs[0].Numel() == 0 && m == 0 {
		return
	}
	xs := actReadF64(ins[0])
	var ws, bs []float64
	if ins[1] != nil {
		ws = actReadF64(ins[1])
	}
	if ins[2] != nil {
		bs = actReadF64(ins[2])
	}
	ys := make([]float64, len(xs))
	means, rstds := make([]float64, m), make([]float64, m)
	parallelForStop(ins[0].ctx.stopFlag(), m, max(1, parallelThreshold/max(n, 1)), stopGrain(n), func(lo, hi int) {
		for r := lo; r < hi; r++ {
			row := xs[r*n : (r+1)*n]
			mu := 0.0
			for _, v := range row {
				mu += v
			}
			mu /= float64(max(n, 1))
			v2 := 0.0
			for _, v := range row {
				v2 += (v - mu) * (v - mu)
			}
			v2 /= float64(max(n, 1))
			rs := 1 / math.Sqrt(v2+eps)
			means[r], rstds[r] = mu, rs
			for k, v := range row {
				y := (v - mu) * rs
				if ws != nil {
					y *= ws[k]
				}
				if bs != nil {
					y += bs[k]
				}
				ys[r*n+k] = y
			}
		}
	})
	actWriteF64(outs[0], ys)
	actWriteF64(outs[1], means)
	actWriteF64(outs[2], rstds)
}

// NativeLayerNormBackward is native_layer_norm_backward(grad, x,
// normalized_shape, mean, rstd, w, b, mask): allocates grad_input (x's
// shape), grad_weight and grad_bias (w's and b's shapes), each only where
// mask asks for it, in that order; then a contiguous copy of a
// non-contiguous grad. Nothing else.
func NativeLayerNormBackward(g, x *Tensor, normalized []int, mean, rstd, w, b *Tensor, mask [3]bool) (gx, gw, gb *Tensor, err error) {
	const fname = "tensor.native_layer_norm_backward"
	if err := checkFloatOp(fname, "LayerNormBackwardKernelImpl", g, x, mean, rstd); err != nil {
		return nil, nil, nil, err
	}
	m, n, err := CheckNormInputs(fname, x, normalized, w, b)
	if err != nil {
		return nil, nil, nil, err
	}
	if !slices.Equal(g.shape, x.shape) {
		return nil, nil, nil, errorf(fname, "grad of shape %s does not match the input's %s", SizeString(g.shape), SizeString(x.shape))
	}
	xc, wc, bc, err := contiguous3(fname, x, w, b)
	if err != nil {
		return nil, nil, nil, err
	}
	dev := x.mem.Device()
	if mask[0] {
		if gx, err = newTensor(x.ctx, fname, dev, x.dtype, slices.Clone(x.shape)); err != nil {
			return nil, nil, nil, err
		}
	}
	// gx, gw and gb are reachable (for the reclaim's proof) while the
	// next ones and g's contiguous copy are allocated
	defer x.ctx.Hold(gx)()
	if mask[1] && w != nil {
		if gw, err = newGradParam(fname, wc, m); err != nil {
			return nil, nil, nil, err
		}
	}
	x.ctx.Hold(gw) // released with gx's hold
	if mask[2] && b != nil {
		if gb, err = newGradParam(fname, bc, m); err != nil {
			return nil, nil, nil, err
		}
	}
	x.ctx.Hold(gb)
	gc, err := Contiguous(g)
	if err != nil {
		return nil, nil, nil, Renamed(err, fname)
	}
	if gw != nil || gb != nil {
		release := x.ctx.Hold(gx, gw, gb, gc)
		gw, gb, err = gammaBetaBlocks(fname, x, m, n, gw, gb)
		release()
		if err != nil {
			return nil, nil, nil, err
		}
	}
	outs := []*Tensor{gx, gw, gb}
	err = actHostKernel(x.ctx, fname, outs, []*Tensor{gc, xc, mean, rstd, wc}, func(outs, ins []*Tensor) {
		layerNormBackward(outs, ins, m, n)
	})
	runtime.KeepAlive(xc)
	runtime.KeepAlive(bc)
	runtime.KeepAlive(gc)
	if err != nil {
		return nil, nil, nil, err
	}
	return gx, gw, gb, nil
}

// gammaBetaBlocks makes the memory of PyTorch's CUDA weight and bias
// gradients of a layer norm over many short rows (ATen's
// layer_norm_kernel.cu, LaunchGammaBetaBackwardCUDAKernel): when there are
// more than 65,536 rows (m) and n/32 is less than half the device's
// multiprocessors, each 32-row tile sums into a [blocks, n] buffer of the
// gradient's dtype (blocks = min(⌈m/32⌉, 32,768/⌈n/32⌉); one for the
// weight, then one for the bias), and each gradient is then that
// buffer's .sum(0): a new tensor, with the reduce kernel's staging
// (reduce_scratch.go), which replaces the gradient allocated first (freed
// then). The buffers are freed last. Other devices and shapes allocate
// nothing here. It returns the gradients to fill.
func gammaBetaBlocks(fname string, x *Tensor, m, n int, gw, gb *Tensor) (*Tensor, *Tensor, error) {
	a := presetAllocator(x)
	if a == nil {
		return gw, gb, nil
	}
	_, d := x.ctx.deviceOf(x.Device())
	sms, tpsm, _ := d.(ReduceDevice).Multiprocessors()
	tiles := tileLaw{sms: sms, dsize: 0}
	by := gammaBetaTiles(m, n, sms)
	if by == 0 {
		// at other sizes, maybe (a replay of the trial asks)
		x.ctx.Manager.Guard(a, tiles, int64(m), int64(n))
		return gw, gb, nil
	}
	var releases []func()
	defer func() {
		for i := len(releases) - 1; i >= 0; i-- {
			releases[i]()
		}
	}()
	for _, p := range []*Tensor{gw, gb} {
		if p == nil {
			continue
		}
		r, err := cudaTemporaryLaw(x, tileLaw{sms: sms, dsize: p.dtype.Size()}, []int64{int64(m), int64(n)}, 0, "layer norm backward's per-tile sums")
		if err != nil {
			return nil, nil, err
		}
		releases = append(releases, r)
	}
	sum := func(p *Tensor) (*Tensor, error) {
		if p == nil {
			return nil, nil
		}
		out, err := newTensor(x.ctx, fname, p.mem.Device(), p.dtype, slices.Clone(p.shape))
		if err != nil {
			return nil, err
		}
		release := x.ctx.Hold(out)
		err = takeReduceScratchLaw(x.ctx, a, reduceLaw{acc: reduceAccBytes(p.dtype), sms: sms, tpsm: tpsm, tiles: true}, int64(m), int64(n))
		release()
		if err != nil {
			x.ctx.Manager.Release(out.mem, "layer norm backward failed")
			return nil, err
		}
		x.ctx.Manager.Release(p.mem, "replaced by the sum of the per-tile sums")
		return out, nil
	}
	ngw, err := sum(gw)
	if err != nil {
		return nil, nil, err
	}
	release := x.ctx.Hold(ngw)
	defer release()
	ngb, err := sum(gb)
	if err != nil {
		if ngw != nil {
			x.ctx.Manager.Release(ngw.mem, "layer norm backward failed")
		}
		return nil, nil, err
	}
	return ngw, ngb, nil
}

// gammaBetaTiles is the number of 32-row tiles whose sums a layer norm
// backward over m rows of n keeps per gradient on a device with sms
// multiprocessors (gammaBetaBlocks), or 0 when it keeps none.
func gammaBetaTiles(m, n, sms int) int {
	if m <= 64*1024 || n/32 >= sms/2 {
		return 0
	}
	bx := (n + 31) / 32
	return min((m+31)/32, (64*1024/2)/bx)
}

// tileLaw is the size of a layer norm backward's per-tile sums of one
// gradient (dsize bytes per element; 0: whether there are any): args
// (m, n), the rows and columns.
type tileLaw struct {
	sms, dsize int
}

func (l tileLaw) Bytes(args []int64) (uint64, bool) {
	if len(args) != 2 {
		return 0, false
	}
	by := gammaBetaTiles(int(args[0]), int(args[1]), l.sms)
	if by == 0 {
		return 0, false
	}
	return uint64(by * int(args[1]) * l.dsize), true
}

// newGradParam allocates a gradient of p's shape (zero-filled when there
// are no rows, as ATen's zeros_like).
func newGradParam(fname string, p *Tensor, m int) (*Tensor, error) {
	if m == 0 {
		t, err := ZerosLike(p, p.dtype, p.mem.Device())
		return t, Renamed(err, fname)
	}
	return newTensor(p.ctx, fname, p.mem.Device(), p.dtype, slices.Clone(p.shape))
}

func layerNormBackward(outs, ins []*Tensor, m, n int) {
	if m == 0 || n == 0 {
		return
	}
	gs, xs := actReadF64(ins[0]), actReadF64(ins[1])
	means, rstds := actReadF64(ins[2]), actReadF64(ins[3])
	var ws []float64
	if ins[4] != nil {
		ws = actReadF64(ins[4])
	}
	if outs[0] != nil {
		gx := make([]float64, len(xs))
		parallelForStop(ins[0].ctx.stopFlag(), m, max(1, parallelThreshold/n), stopGrain(n), func(lo, hi int) {
			for r := lo; r < hi; r++ {
				mu, rs := means[r], rstds[r]
				var s1, s2 float64 // Σ dy·γ and Σ dy·γ·x̂
				for k := range n {
					dy := gs[r*n+k]
					if ws != nil {
						dy *= ws[k]
					}
					s1 += dy
					s2 += dy * (xs[r*n+k] - mu) * rs
				}
				s1 /= float64(n)
				s2 /= float64(n)
				for k := range n {
					dy := gs[r*n+k]
					if ws != nil {
						dy *= ws[k]
					}
					xh := (xs[r*n+k] - mu) * rs
					gx[r*n+k] = rs * (dy - s1 - xh*s2)
				}
			}
		})
		actWriteF64(outs[0], gx)
	}
	if outs[1] != nil || outs[2] != nil {
		gw, gb := make([]float64, n), make([]float64, n)
		for r := range m {
			for k := range n {
				dy := gs[r*n+k]
				gw[k] += dy * (xs[r*n+k] - means[r]) * rstds[r]
				gb[k] += dy
			}
		}
		if outs[1] != nil {
			actWriteF64(outs[1], gw)
		}
		if outs[2] != nil {
			actWriteF64(outs[2], gb)
		}
	}
}
