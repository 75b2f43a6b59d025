package tensor

import (
	"math"
	"runtime"
	"strings"
)

// Batch normalization as PyTorch 2.x dispatches it (at::batch_norm →
// _batch_norm_impl_index). On a CUDA device with weight and bias given,
// input dim ≥ 3 and a float32/float64 input (or float16 with float32
// parameters), it is cudnn_batch_norm: the input is made contiguous (a
// copy only when strided), then output (input-sized), save_mean and
// save_var ([C] each, the weight's dtype; save_var holds the inverse
// standard deviation) in training — 0-element ones in evaluation — and the
// reserve space (uint8). Otherwise (CPU, no affine parameters, 2-D input,
// bfloat16) it is native_batch_norm: a 0-element reserve, then output,
// save_mean and save_invstd ([C] each, accumulate dtype).
//
// Not modelled: cuDNN's forward/backward workspace and the reserve
// space's size, both queried from cuDNN at run time
// (cudnnGetBatchNormalization*WorkspaceSize/ReserveSpaceSize; for NCHW
// input PyTorch uses CUDNN_BATCHNORM_SPATIAL with CUDNN_BATCHNORM_OPS_BN,
// for which cuDNN reports no reserve space): memsh allocates the reserve
// with 0 bytes and no workspace. The native CUDA backward's per-channel
// reduction temporaries are not modelled either.

// BatchNormCudnn reports whether PyTorch would run batch norm on x with
// these parameters through cuDNN (_select_batch_norm_backend).
func BatchNormCudnn(x, w, b, rm, rv *Tensor, training bool) bool {
	if !strings.HasPrefix(x.Device(), "cuda") || w == nil || b == nil || len(x.shape) < 3 {
		return false
	}
	if x.dtype == BFloat16 || w.dtype == BFloat16 || x.dtype == Float16 && w.dtype != Float32 {
		return false
	}
	if !(rm != nil && rv != nil || rm == nil && rv == nil && training) {
		return false
	}
	return x.shape[0] <= 880801 && training || x.shape[0] <= 65535 && !training
}

func checkBatchNorm(fname string, x, w, b, rm, rv *Tensor, training bool) error {
	for _, t := range []*Tensor{x, w, b, rm, rv} {
		if t != nil {
			if err := t.checkLive(fname); err != nil {
				return err
			}
			if t.mem.Device() != x.mem.Device() {
				return errorf(fname, "Expected all tensors to be on the same device, but found at least two devices, %s and %s!", x.mem.Device(), t.mem.Device())
			}
		}
	}
	if len(x.shape) < 2 {
		return errorf(fname, "Expected 2D or higher input, but got input of size %s", SizeString(x.shape))
	}
	if !x.dtype.IsFloat() {
		return errorf(fname, "\"batch_norm\" not implemented for '%s'", dtypeTitle(x.dtype))
	}
	c := x.shape[1]
	names := []string{"running_mean", "running_var", "weight", "bias"}
	for i, t := range []*Tensor{rm, rv, w, b} {
		if t == nil {
			if i < 2 && !training {
				return errorf(fname, "%s must be defined in evaluation mode", names[i])
			}
			continue
		}
		if t.Numel() != c {
			return errorf(fname, "%s should contain %d elements not %d", names[i], c, t.Numel())
		}
	}
	if training {
		n := x.Numel() / max(c, 1)
		if n == 1 {
			return errorf(fname, "Expected more than 1 value per channel when training, got input size %s", sizeList(x.shape))
		}
	}
	return nil
}

// BatchNorm is batch_norm's forward (see above): out, save_mean, save_var
// (save_invstd on the native path) and reserve; in training the running
// statistics (when given) are updated in place: running_mean ← (1 −
// momentum)·running_mean + momentum·mean, running_var likewise with the
// unbiased variance.
func BatchNorm(x, w, b, rm, rv *Tensor, training bool, momentum, eps float64) (out, saveMean, saveVar, reserve *Tensor, err error) {
	const fname = "batch_norm"
	if anyOnGPU(x, w, b, rm, rv) {
		err = staged(contextOf(x, w, b, rm, rv), fname, []*Tensor{x, w, b, rm, rv}, func(s *staging) error {
			o, m, v, r, err := batchNorm(fname, s.shadowOf(x), s.shadowOf(w), s.shadowOf(b), s.shadowOf(rm), s.shadowOf(rv), training, momentum, eps, BatchNormCudnn(x, w, b, rm, rv, training))
			if err != nil {
				return err
			}
			for _, p := range []struct {
				dst **Tensor
				src *Tensor
			}{{&out, o}, {&saveMean, m}, {&saveVar, v}, {&reserve, r}} {
				if *p.dst, err = s.back(fname, p.src); err != nil {
					return err
				}
			}
			return nil
		})
	} else {
		out, saveMean, saveVar, reserve, err = batchNorm(fname, x, w, b, rm, rv, training, momentum, eps, BatchNormCudnn(x, w, b, rm, rv, training))
	}
	// The running statistics are updated in place without a version bump,
	// as ATen's batch_norm (they are not declared mutable arguments).
	return
}

func accDType(dt DType) DType {
	if dt == Float64 {
		return Float64
	}
	return Float32
}

func batchNorm(fname string, x, w, b, rm, rv *Tensor, training bool, momentum, eps float64, cudnn bool) (out, saveMean, saveVar, reserve *Tensor, err error) {
	if err = checkBatchNorm(fname, x, w, b, rm, rv, training); err != nil {
		return
	}
	c := x.shape[1]
	dev := x.mem.Device()
	xc := x
	statDT := accDType(x.dtype)
	// Each result is held from when it is made (made): a reclaim while the
	// next is allocated (one that would raise a peak) then reaches it
	// instead of asking the collector whether this op still holds it.
	defer x.ctx.Hold()()
	made := func(t *Tensor) { x.ctx.Hold(t) }
	if cudnn {
		if xc, err = Contiguous(x); err != nil {
			return nil, nil, nil, nil, Renamed(err, fname)
		}
		made(xc)
		statDT = w.dtype
		if out, err = newTensor(x.ctx, fname, dev, x.dtype, x.shape); err != nil {
			return
		}
		made(out)
		sc := 0
		if training {
			sc = c
		}
		if saveMean, err = newTensor(x.ctx, fname, dev, statDT, []int{sc}); err != nil {
			return
		}
		made(saveMean)
		if saveVar, err = newTensor(x.ctx, fname, dev, statDT, []int{sc}); err != nil {
			return
		}
		made(saveVar)
		if reserve, err = newTensor(x.ctx, fname, dev, Uint8, []int{0}); err != nil {
			return
		}
		made(reserve)
	} else {
		if reserve, err = newTensor(x.ctx, fname, dev, Uint8, []int{0}); err != nil {
			return
		}
		made(reserve)
		if out, err = newTensor(x.ctx, fname, dev, x.dtype, x.shape); err != nil {
			return
		}
		made(out)
		if saveMean, err = newTensor(x.ctx, fname, dev, statDT, []int{c}); err != nil {
			return
		}
		made(saveMean)
		if saveVar, err = newTensor(x.ctx, fname, dev, statDT, []int{c}); err != nil {
			return
		}
		made(saveVar)
	}
	if !out.hasData() {
		return
	}
	n := x.shape[0]
	sp := x.Numel() / max(n*c, 1)
	xs := readFloats[float64](xc)
	runtime.KeepAlive(xc)
	ws, bs := ones(c), make([]float64, c)
	if w != nil {
		ws = readFloats[float64](w)
	}
	if b != nil {
		bs = readFloats[float64](b)
	}
	mean, invstd := make([]float64, c), make([]float64, c)
	// Once interrupted, the results are dropped: before the running
	// statistics are updated, or with the output partly written.
	if training {
		cnt := float64(n * sp)
		varU := make([]float64, c)
		for ch := range c {
			if x.ctx.Interrupted() {
				return nil, nil, nil, nil, x.ctx.interrupted(fname)
			}
			s := 0.0
			for i := range n {
				for _, v := range xs[(i*c+ch)*sp:][:sp] {
					s += v
				}
			}
			m := s / cnt
			q := 0.0
			for i := range n {
				for _, v := range xs[(i*c+ch)*sp:][:sp] {
					q += (v - m) * (v - m)
				}
			}
			mean[ch], invstd[ch] = m, 1/math.Sqrt(q/cnt+eps)
			if cnt > 1 {
				varU[ch] = q / (cnt - 1)
			} else {
				varU[ch] = math.NaN()
			}
		}
		if rm != nil {
			r := readFloats[float64](rm)
			for ch := range r {
				r[ch] = (1-momentum)*r[ch] + momentum*mean[ch]
			}
			writeFloats(rm, r)
		}
		if rv != nil {
			r := readFloats[float64](rv)
			for ch := range r {
				r[ch] = (1-momentum)*r[ch] + momentum*varU[ch]
			}
			writeFloats(rv, r)
		}
		if saveMean.Numel() == c {
			writeFloats(saveMean, mean)
			writeFloats(saveVar, invstd)
		}
	} else {
		copy(mean, readFloats[float64](rm))
		for ch, v := range readFloats[float64](rv) {
			invstd[ch] = 1 / math.Sqrt(v+eps)
		}
	}
	res := make([]float64, len(xs))
	for i := range n {
		if x.ctx.Interrupted() {
			return nil, nil, nil, nil, x.ctx.interrupted(fname)
		}
		for ch := range c {
			k := (i*c + ch) * sp
			a := invstd[ch] * ws[ch]
			for j, v := range xs[k : k+sp] {
				res[k+j] = (v-mean[ch])*a + bs[ch]
			}
		}
	}
	writeFloats(out, res)
	return
}

func ones(n int) []float64 {
	s := make([]float64, n)
	for i := range s {
		s[i] = 1
	}
	return s
}

// BatchNormBackward is the backward of BatchNorm: cudnn_batch_norm_backward
// when cudnn and training (grad_output made contiguous, then grad_input,
// grad_weight, grad_bias, all three whatever mask says), else
// native_batch_norm_backward (each gradient allocated when mask asks for
// it, in that order). saveMean and saveVar are the forward's (inverse
// standard deviation in saveVar).
func BatchNormBackward(g, x, w, rm, rv, saveMean, saveVar *Tensor, training bool, eps float64, mask [3]bool, cudnn bool) (gi, gw, gb *Tensor, err error) {
	const fname = "batch_norm_backward"
	ins := []*Tensor{g, x, w, rm, rv, saveMean, saveVar}
	if anyOnGPU(ins...) {
		err = staged(contextOf(ins...), fname, ins, func(s *staging) error {
			a, bb, cc, err := batchNormBackward(fname, s.shadowOf(g), s.shadowOf(x), s.shadowOf(w), s.shadowOf(rm), s.shadowOf(rv), s.shadowOf(saveMean), s.shadowOf(saveVar), training, eps, mask, cudnn)
			if err != nil {
				return err
			}
			if gi, err = s.back(fname, a); err != nil {
				return err
			}
			if gw, err = s.back(fname, bb); err != nil {
				return err
			}
			gb, err = s.back(fname, cc)
			return err
		})
		return
	}
	return batchNormBackward(fname, g, x, w, rm, rv, saveMean, saveVar, training, eps, mask, cudnn)
}

func batchNormBackward(fname string, g, x, w, rm, rv, saveMean, saveVar *Tensor, training bool, eps float64, mask [3]bool, cudnn bool) (gi, gw, gb *Tensor, err error) {
	if !sameInts(g.shape, x.shape) {
		return nil, nil, nil, errorf(fname, "grad_output of size %s does not match the input's size %s", SizeString(g.shape), SizeString(x.shape))
	}
	c := x.shape[1]
	dev := x.mem.Device()
	pdt := accDType(x.dtype)
	if w != nil {
		pdt = w.dtype
	}
	// what it makes is held from when it is made (as in batchNorm)
	defer x.ctx.Hold()()
	gc := g
	if cudnn && training {
		if gc, err = Contiguous(g); err != nil {
			return nil, nil, nil, Renamed(err, fname)
		}
		x.ctx.Hold(gc)
		mask = [3]bool{true, true, true}
	}
	if mask[0] {
		if gi, err = newTensor(x.ctx, fname, dev, x.dtype, x.shape); err != nil {
			return
		}
		x.ctx.Hold(gi)
	}
	if mask[1] {
		if gw, err = newTensor(x.ctx, fname, dev, pdt, []int{c}); err != nil {
			return
		}
		x.ctx.Hold(gw)
	}
	if mask[2] {
		if gb, err = newTensor(x.ctx, fname, dev, pdt, []int{c}); err != nil {
			return
		}
	}
	if !x.hasData() {
		return
	}
	n := x.shape[0]
	sp := x.Numel() / max(n*c, 1)
	xs, gs := readFloats[float64](x), readFloats[float64](gc)
	runtime.KeepAlive(gc)
	ws := ones(c)
	if w != nil {
		ws = readFloats[float64](w)
	}
	var mean, invstd []float64
	if training {
		mean, invstd = readFloats[float64](saveMean), readFloats[float64](saveVar)
	} else {
		mean = readFloats[float64](rm)
		invstd = readFloats[float64](rv)
		for i, v := range invstd {
			invstd[i] = 1 / math.Sqrt(v+eps)
		}
	}
	cnt := float64(n * sp)
	dx := make([]float64, len(xs))
	dw, db := make([]float64, c), make([]float64, c)
	for ch := range c {
		if x.ctx.Interrupted() {
			return nil, nil, nil, x.ctx.interrupted(fname) // the gradients are dropped
		}
		sg, sgx := 0.0, 0.0
		for i := range n {
			k := (i*c + ch) * sp
			for j := range sp {
				sg += gs[k+j]
				sgx += gs[k+j] * (xs[k+j] - mean[ch]) * invstd[ch]
			}
		}
		db[ch], dw[ch] = sg, sgx
		for i := range n {
			k := (i*c + ch) * sp
			for j := range sp {
				if training {
					xh := (xs[k+j] - mean[ch]) * invstd[ch]
					dx[k+j] = ws[ch] * invstd[ch] * (gs[k+j] - sg/cnt - xh*sgx/cnt)
				} else {
					dx[k+j] = gs[k+j] * ws[ch] * invstd[ch]
				}
			}
		}
	}
	if gi != nil {
		writeFloats(gi, dx)
	}
	if gw != nil {
		writeFloats(gw, dw)
	}
	if gb != nil {
		writeFloats(gb, db)
	}
	return
}
