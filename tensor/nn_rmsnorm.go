package tensor

import (
	"math"
	"runtime"
	"slices"
)

// RMS normalisation as ATen's fused CUDA kernel (_fused_rms_norm and
// _fused_rms_norm_backward, PyTorch 2.8+, layer_norm_kernel.cu's RMS
// variant): y = x · rstd · w with rstd = 1/√(mean(x²) + eps) per row of the
// normalised trailing dimensions, computed in the opmath type (float32 for
// float16, bfloat16 and float32; float64 for float64) and kept, shaped
// [M..., 1...], for the backward. Unlike the composite rms_norm it makes no
// float32 copy of a half-type input and no intermediate x · rstd.

// FusedRMSNorm is _fused_rms_norm(x, normalized_shape, w, eps): allocates
// the output (x's shape and dtype), then rstd ([M] opmath floats, returned
// as a view of shape [M..., 1...]). w may be nil; a non-contiguous x or w
// is first copied contiguous (a temporary freed when the op returns).
// Errors: a non-float x, a normalized_shape that does not match x's
// trailing dimensions, a w of another shape or device.
func FusedRMSNorm(x *Tensor, normalized []int, w *Tensor, eps float64) (out, rstd *Tensor, err error) {
	const fname = "tensor._fused_rms_norm"
	if err := checkFloatOp(fname, "_fused_rms_norm", x); err != nil {
		return nil, nil, err
	}
	if w != nil {
		if err := w.checkLive(fname); err != nil {
			return nil, nil, err
		}
		if err := checkSameDevice(fname, x, w); err != nil {
			return nil, nil, err
		}
	}
	m, n, err := CheckNormInputs(fname, x, normalized, w, nil)
	if err != nil {
		return nil, nil, err
	}
	xc, wc, _, err := contiguous3(fname, x, w, nil)
	if err != nil {
		return nil, nil, err
	}
	dev := x.mem.Device()
	if out, err = newTensor(x.ctx, fname, dev, x.dtype, slices.Clone(x.shape)); err != nil {
		return nil, nil, err
	}
	release := x.ctx.Hold(out) // reachable while rstd is allocated
	rstd, err = newTensor(x.ctx, fname, dev, NormAccDType(x.dtype), []int{m})
	release()
	if err != nil {
		return nil, nil, err
	}
	err = actHostKernel(x.ctx, fname, []*Tensor{out, rstd}, []*Tensor{xc, wc}, func(outs, ins []*Tensor) {
		rmsNormForward(outs, ins, m, n, eps)
	})
	runtime.KeepAlive(xc)
	runtime.KeepAlive(wc)
	dropCopies(xc, x, wc, w)
	if err != nil {
		return nil, nil, err
	}
	if rstd, err = View(rstd, statShape(x.shape, len(normalized))); err != nil {
		return nil, nil, err
	}
	return out, rstd, nil
}

func rmsNormForward(outs, ins []*Tensor, m, n int, eps float64) {
	if m == 0 || n == 0 {
		return
	}
	xs := actReadF64(ins[0])
	var ws []float64
	if ins[1] != nil {
		ws = actReadF64(ins[1])
	}
	ys := make([]float64, len(xs))
	rstds := make([]float64, m)
	parallelForStop(ins[0].ctx.stopFlag(), m, max(1, parallelThreshold/n), stopGrain(n), func(lo, hi int) {
		for r := lo; r < hi; r++ {
			row := xs[r*n : (r+1)*n]
			ss := 0.0
			for _, v := range row {
				ss += v * v
			}
			rs := 1 / math.Sqrt(ss/float64(n)+eps)
			rstds[r] = rs
			for k, v := range row {
				y := v * rs
				if ws != nil {
					y *= ws[k]
				}
				ys[r*n+k] = y
			}
		}
	})
	actWriteF64(outs[0], ys)
	actWriteF64(outs[1], rstds)
}

// FusedRMSNormBackward is _fused_rms_norm_backward(grad, x,
// normalized_shape, rstd, w, mask): allocates grad_input (x's shape) and
// grad_weight (w's shape), each only where mask asks for it, in that
// order; then a contiguous copy of a non-contiguous grad. grad_weight over
// more than 65,536 short rows takes the per-tile buffers of the layer
// norm's backward (gammaBetaBlocks: the same CUDA kernel).
func FusedRMSNormBackward(g, x *Tensor, normalized []int, rstd, w *Tensor, mask [2]bool) (gx, gw *Tensor, err error) {
	const fname = "tensor._fused_rms_norm_backward"
	if err := checkFloatOp(fname, "_fused_rms_norm_backward", g, x, rstd); err != nil {
		return nil, nil, err
	}
	m, n, err := CheckNormInputs(fname, x, normalized, w, nil)
	if err != nil {
		return nil, nil, err
	}
	if !slices.Equal(g.shape, x.shape) {
		return nil, nil, errorf(fname, "grad of shape %s does not match the input's %s", SizeString(g.shape), SizeString(x.shape))
	}
	xc, wc, _, err := contiguous3(fname, x, w, nil)
	if err != nil {
		return nil, nil, err
	}
	dev := x.mem.Device()
	if mask[0] {
		if gx, err = newTensor(x.ctx, fname, dev, x.dtype, slices.Clone(x.shape)); err != nil {
			return nil, nil, err
		}
	}
	if mask[1] && w != nil {
		release := x.ctx.Hold(gx)
		gw, err = newGradParam(fname, wc, m)
		release()
		if err != nil {
			return nil, nil, err
		}
	}
	release := x.ctx.Hold(gx, gw)
	gc, err := Contiguous(g)
	release()
	if err != nil {
		return nil, nil, Renamed(err, fname)
	}
	if gw != nil {
		release := x.ctx.Hold(gx, gw, gc)
		gw, _, err = gammaBetaBlocks(fname, x, m, n, gw, nil)
		release()
		if err != nil {
			return nil, nil, err
		}
	}
	err = actHostKernel(x.ctx, fname, []*Tensor{gx, gw}, []*Tensor{gc, xc, rstd, wc}, func(outs, ins []*Tensor) {
		rmsNormBackward(outs, ins, m, n)
	})
	runtime.KeepAlive(xc)
	runtime.KeepAlive(gc)
	dropCopies(xc, x, wc, w, gc, g)
	if err != nil {
		return nil, nil, err
	}
	return gx, gw, nil
}

// rmsNormBackward: with x̂ = x·rstd and dŷ = dy·w, grad_input =
// rstd·(dŷ − x̂·mean(dŷ·x̂)) and grad_weight = Σ_rows dy·x̂.
func rmsNormBackward(outs, ins []*Tensor, m, n int) {
	if m == 0 || n == 0 {
		return
	}
	gs, xs, rstds := actReadF64(ins[0]), actReadF64(ins[1]), actReadF64(ins[2])
	var ws []float64
	if ins[3] != nil {
		ws = actReadF64(ins[3])
	}
	if outs[0] != nil {
		gx := make([]float64, len(xs))
		parallelForStop(ins[0].ctx.stopFlag(), m, max(1, parallelThreshold/n), stopGrain(n), func(lo, hi int) {
			for r := lo; r < hi; r++ {
				rs := rstds[r]
				s := 0.0 // Σ dŷ·x̂
				for k := range n {
					dy := gs[r*n+k]
					if ws != nil {
						dy *= ws[k]
					}
					s += dy * xs[r*n+k] * rs
				}
				s /= float64(n)
				for k := range n {
					dy := gs[r*n+k]
					if ws != nil {
						dy *= ws[k]
					}
					gx[r*n+k] = rs * (dy - xs[r*n+k]*rs*s)
				}
			}
		})
		actWriteF64(outs[0], gx)
	}
	if outs[1] != nil {
		gw := make([]float64, n)
		for r := range m {
			for k := range n {
				gw[k] += gs[r*n+k] * xs[r*n+k] * rstds[r]
			}
		}
		actWriteF64(outs[1], gw)
	}
}

// dropCopies tells the Manager that the contiguous copies an op made of
// its inputs (pairs: copy, original; a copy that is the original is no
// copy) are gone with the op (expect_contiguous's temporaries).
func dropCopies(pairs ...*Tensor) {
	for i := 0; i+1 < len(pairs); i += 2 {
		if c := pairs[i]; c != nil && c != pairs[i+1] {
			Dropped(c)
		}
	}
}
