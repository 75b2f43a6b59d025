package tensor

import (
	"math"
	"runtime"
	"slices"
)

// The fused attention kernels of PyTorch 2.x on CUDA (2.2–2.6 sources:
// aten/src/ATen/native/transformers/cuda/attention.cu,
// attention_backward.cu, flash_attn/flash_api.cpp). Their values are the
// math path's (computed here in float64 on host memory, one (batch, head)
// at a time, with Go-heap scratch); their device allocations are the
// kernels': no L×S matrix is ever allocated.
//
// Inputs are [B, H, L, E] (query), [B, H, S, E] (key), [B, H, S, Ev]
// (value), as scaled_dot_product_attention passes them; the kernels see
// them transposed to [B, L, H, E] (views).

// FlashAttentionForward is _scaled_dot_product_flash_attention (E a
// multiple of 8, E == Ev ≤ 256: the caller pads): mha_fwd allocates the
// output as empty_like(query.transpose(1, 2)) — the strides of that view
// when it is dense, else contiguous [B, L, H, E] — then the logsumexp
// [B, H, L] float32; the philox seed and offset are 0-dim int64 CPU
// tensors (scalar_tensor with dropout, empty without; eager mode, not
// CUDA-graph capture). The output is returned as the [B, H, L, E] view.
// Dropout draws B·H·32 values from the generator (flash's counter offset).
func FlashAttentionForward(q, k, v *Tensor, dropoutP float64, causal bool, scale float64) (out, lse, seed, offset *Tensor, err error) {
	const fname = "aten::_scaled_dot_product_flash_attention"
	c := q.ctx
	B, H, L := q.shape[0], q.shape[1], q.shape[2]
	qt, err := Transpose(q, 1, 2)
	if err != nil {
		return nil, nil, nil, nil, err
	}
	o, err := emptyLikeDense(fname, qt, v.shape[3])
	if err != nil {
		return nil, nil, nil, nil, err
	}
	release := c.Hold(o) // reachable while the rest is allocated
	if lse, err = newTensor(c, fname, q.mem.Device(), Float32, []int{B, H, L}); err != nil {
		release()
		return nil, nil, nil, nil, err
	}
	c.Hold(lse) // released with o's hold
	var rs, ro uint64
	if dropoutP > 0 {
		rs, ro = c.draw(B * H * 32)
	}
	seed, offset, err = philoxTensors(c, dropoutP > 0, rs, ro)
	release()
	if err != nil {
		return nil, nil, nil, nil, err
	}
	if out, err = Transpose(o, 1, 2); err != nil {
		return nil, nil, nil, nil, err
	}
	spec := attnSpec{scale: scale, causal: causal, p: dropoutP, seed: rs, offset: ro, lseLen: L}
	if err = actHostKernel(c, fname, []*Tensor{out, lse}, []*Tensor{q, k, v}, spec.forward); err != nil {
		return nil, nil, nil, nil, err // an interrupted kernel's results are dropped
	}
	return out, lse, seed, offset, nil
}

// FlashAttentionBackward is _scaled_dot_product_flash_attention_backward:
// _flash_attention_backward makes contiguous copies of grad_out and out
// seen as [B, L, H, E] (copies only when those views are not contiguous),
// then mha_bwd allocates dq, dk, dv (empty_like of the transposed q, k, v),
// softmax_d [B, H, roundup(L, 128)] float32 and dq_accum [B, roundup(L,
// 128), H, roundup(E, E ≤ 128 ? 32 : 64)] float32; dq_accum is freed when
// mha_bwd returns, softmax_d and the copies when _flash_attention_backward
// does; with fewer key than query heads (grouped-query attention) also
// dk_expanded and dv_expanded (below). The gradients are returned as
// [B, H, ·, ·] views.
func FlashAttentionBackward(g, q, k, v, out, lse *Tensor, dropoutP float64, causal bool, scale float64, seed, offset uint64) (gq, gk, gv *Tensor, err error) {
	const fname = "aten::_scaled_dot_product_flash_attention_backward"
	c := q.ctx
	dev := q.mem.Device()
	B, H, L, E := q.shape[0], q.shape[1], q.shape[2], q.shape[3]
	var ts [5]*Tensor
	for i, t := range []*Tensor{g, out, q, k, v} {
		if ts[i], err = Transpose(t, 1, 2); err != nil {
			return nil, nil, nil, err
		}
	}
	gc, err := Contiguous(ts[0])
	if err != nil {
		return nil, nil, nil, err
	}
	oc, err := Contiguous(ts[1])
	if err != nil {
		return nil, nil, nil, err
	}
	defer c.Hold(gc, oc)() // reachable while the rest is made
	var d [3]*Tensor
	for i := range d {
		t := ts[2+i]
		if d[i], err = emptyLikeDense(fname, t, t.shape[3]); err != nil {
			return nil, nil, nil, err
		}
		c.Hold(d[i]) // released with gc's hold
	}
	roundUp := func(x, m int) int { return (x + m - 1) / m * m }
	Lr := roundUp(L, 128)
	er := 32
	if E > 128 {
		er = 64
	}
	softmaxD, err := newTensor(c, fname, dev, Float32, []int{B, H, Lr})
	if err != nil {
		return nil, nil, nil, err
	}
	c.Hold(softmaxD)
	dqAccum, err := newTensor(c, fname, dev, Float32, []int{B, Lr, H, roundUp(E, er)})
	if err != nil {
		return nil, nil, nil, err
	}
	c.Hold(dqAccum)
	// Grouped-query attention (fewer key heads): mha_bwd computes dk and
	// dv per query head into dk_expanded and dv_expanded [B, S, H, ·] of
	// q's dtype, sums each group into dk and dv (at::sum_out) and frees
	// them when it returns.
	var dkExp, dvExp *Tensor
	if Hk := k.shape[1]; Hk != H {
		S := k.shape[2]
		if dkExp, err = newTensor(c, fname, dev, q.dtype, []int{B, S, H, k.shape[3]}); err != nil {
			return nil, nil, nil, err
		}
		c.Hold(dkExp)
		if dvExp, err = newTensor(c, fname, dev, q.dtype, []int{B, S, H, v.shape[3]}); err != nil {
			return nil, nil, nil, err
		}
	}
	var views [3]*Tensor
	for i := range views {
		if views[i], err = Transpose(d[i], 1, 2); err != nil {
			return nil, nil, nil, err
		}
	}
	spec := attnSpec{scale: scale, causal: causal, p: dropoutP, seed: seed, offset: offset}
	err = actHostKernel(c, fname, views[:], []*Tensor{g, q, k, v}, spec.backward)
	runtime.KeepAlive(dkExp) // freed when mha_bwd returns
	runtime.KeepAlive(dvExp)
	dkExp, dvExp = nil, nil
	runtime.KeepAlive(dqAccum) // freed when mha_bwd returns
	dqAccum = nil
	runtime.KeepAlive(softmaxD)
	runtime.KeepAlive(oc)
	runtime.KeepAlive(gc)
	if err != nil {
		return nil, nil, nil, err
	}
	return views[0], views[1], views[2], nil
}

// EfficientAttentionForward is _scaled_dot_product_efficient_attention:
// _efficient_attention_forward allocates the output contiguous
// [B, L, H, Ev] (returned as the [B, H, L, Ev] view), then the logsumexp
// [B, H, ceil(L/32)·32] float32 (kAlignLSE = 32; [B, H, 0], no memory,
// when computeLSE is false), then, for float16/bfloat16 with Ev > 128
// (the kernel that does not keep the output in registers,
// kNeedsOutputAccumulatorBuffer), a float32 [B, L, H, Ev] accumulator
// freed when it returns. The philox seed and offset are 0-dim int64 CPU
// tensors; dropout draws B·H·L·S values. bias, when not nil, is the
// additive mask expanded to [B, H, L, S].
func EfficientAttentionForward(q, k, v, bias *Tensor, computeLSE bool, dropoutP float64, causal bool, scale float64) (out, lse, seed, offset *Tensor, err error) {
	const fname = "aten::_scaled_dot_product_efficient_attention"
	c := q.ctx
	dev := q.mem.Device()
	B, H, L, S, Ev := q.shape[0], q.shape[1], q.shape[2], k.shape[2], v.shape[3]
	var rs, ro uint64
	if dropoutP > 0 {
		rs, ro = c.draw(B * H * L * S)
	}
	if seed, offset, err = philoxTensors(c, dropoutP > 0, rs, ro); err != nil {
		return nil, nil, nil, nil, err
	}
	defer c.Hold(seed, offset)() // each reachable while the next is made
	o, err := newTensor(c, fname, dev, q.dtype, []int{B, L, H, Ev})
	if err != nil {
		return nil, nil, nil, nil, err
	}
	c.Hold(o) // released with the seed's hold
	lseLen := 0
	if computeLSE {
		lseLen = (L + 31) / 32 * 32
	}
	if lse, err = newTensor(c, fname, dev, Float32, []int{B, H, lseLen}); err != nil {
		return nil, nil, nil, nil, err
	}
	c.Hold(lse)
	var accum *Tensor
	if (q.dtype == Float16 || q.dtype == BFloat16) && Ev > 128 {
		if accum, err = newTensor(c, fname, dev, Float32, []int{B, L, H, Ev}); err != nil {
			return nil, nil, nil, nil, err
		}
	}
	if out, err = Transpose(o, 1, 2); err != nil {
		return nil, nil, nil, nil, err
	}
	spec := attnSpec{scale: scale, causal: causal, p: dropoutP, seed: rs, offset: ro, lseLen: lseLen}
	ins := []*Tensor{q, k, v}
	if bias != nil {
		ins = append(ins, bias)
	}
	err = actHostKernel(c, fname, []*Tensor{out, lse}, ins, spec.forward)
	runtime.KeepAlive(accum)
	if err != nil {
		return nil, nil, nil, nil, err // an interrupted kernel's results are dropped
	}
	return out, lse, seed, offset, nil
}

// EfficientAttentionBackward is _scaled_dot_product_efficient_attention_
// backward: _efficient_attention_backward allocates the gradients —
// one [B, L, 3, H, E] chunk when q, k and v share a storage (and L == S,
// E == Ev: the q, k, v of a fused projection), else one [B, S, 2, H, Ev]
// chunk for k and v when they share one (and E == Ev) plus grad_q, else
// grad_q, grad_k, grad_v each empty_strided with its input's sizes and
// strides (all seen as [B, ·, H, ·]). The kernel's workspace (a float32
// staging buffer for dq/dk/dv when the kernel accumulates in float32:
// kernel_backward.h workspace_size) is not modelled.
func EfficientAttentionBackward(g, q, k, v, bias *Tensor, dropoutP float64, causal bool, scale float64, seed, offset uint64) (gq, gk, gv *Tensor, err error) {
	const fname = "aten::_scaled_dot_product_efficient_attention_backward"
	c := q.ctx
	dev := q.mem.Device()
	B, H, L, S, E, Ev := q.shape[0], q.shape[1], q.shape[2], k.shape[2], q.shape[3], v.shape[3]
	var ts [3]*Tensor
	for i, t := range []*Tensor{q, k, v} {
		if ts[i], err = Transpose(t, 1, 2); err != nil {
			return nil, nil, nil, err
		}
	}
	var d [3]*Tensor
	switch {
	case L == S && E == Ev && q.st == k.st && q.st == v.st:
		chunk, err := newTensor(c, fname, dev, q.dtype, []int{B, L, 3, H, E})
		if err != nil {
			return nil, nil, nil, err
		}
		for i := range d {
			if d[i], err = Select(chunk, 2, i); err != nil {
				return nil, nil, nil, err
			}
		}
	case E == Ev && k.st == v.st:
		chunk, err := newTensor(c, fname, dev, q.dtype, []int{B, S, 2, H, Ev})
		if err != nil {
			return nil, nil, nil, err
		}
		for i := 1; i < 3; i++ {
			if d[i], err = Select(chunk, 2, i-1); err != nil {
				return nil, nil, nil, err
			}
		}
		if d[0], err = emptyStrided(fname, ts[0]); err != nil {
			return nil, nil, nil, err
		}
	default:
		for i := range d {
			if d[i], err = emptyStrided(fname, ts[i]); err != nil {
				return nil, nil, nil, err
			}
		}
	}
	var views [3]*Tensor
	for i := range views {
		if views[i], err = Transpose(d[i], 1, 2); err != nil {
			return nil, nil, nil, err
		}
	}
	spec := attnSpec{scale: scale, causal: causal, p: dropoutP, seed: seed, offset: offset}
	ins := []*Tensor{g, q, k, v}
	if bias != nil {
		ins = append(ins, bias)
	}
	err = actHostKernel(c, fname, views[:], ins, spec.backward)
	if err != nil {
		return nil, nil, nil, err
	}
	return views[0], views[1], views[2], nil
}

// PadLastDim is pad_last_dim<8, false> of scaled_dot_product_attention's
// flash branch: t itself when its last dimension is a multiple of to, else
// a zero-padded contiguous copy (at::pad, constant_pad_nd).
func PadLastDim(t *Tensor, to int) (*Tensor, error) {
	n := t.shape[len(t.shape)-1]
	if n%to == 0 {
		return t, nil
	}
	return padLast(t, to-n%to)
}

// PadBias is the efficient branch's preprocess_mask before its expand: a
// mask whose strides are not multiples of 8 (or whose last stride is not
// 1) is padded by 8 − S%8 (pad_bias<8>: a zero-padded copy) and sliced
// back to S; an aligned mask is returned as it is.
func PadBias(t *Tensor) (*Tensor, error) {
	d := len(t.shape)
	aligned := t.strides[d-1] == 1
	for i := 0; i < d-1; i++ {
		aligned = aligned && t.strides[i]%8 == 0
	}
	if aligned {
		return t, nil
	}
	n := t.shape[d-1]
	p, err := padLast(t, 8-n%8)
	if err != nil {
		return nil, err
	}
	return Narrow(p, d-1, 0, n)
}

func padLast(t *Tensor, count int) (*Tensor, error) {
	n := t.shape[len(t.shape)-1]
	shape := slices.Clone(t.shape)
	shape[len(shape)-1] = n + count
	out, err := newTensor(t.ctx, "aten::constant_pad_nd", t.mem.Device(), t.dtype, shape)
	if err != nil {
		return nil, err
	}
	inner, err := Narrow(out, len(shape)-1, 0, n)
	if err != nil {
		return nil, err
	}
	err = actHostKernel(t.ctx, "aten::constant_pad_nd", []*Tensor{out, inner}, []*Tensor{t}, func(outs, ins []*Tensor) {
		actWriteF64(outs[0], make([]float64, outs[0].Numel()))
		actWriteF64(outs[1], actReadF64(ins[0]))
	})
	return out, err
}

// emptyLikeDense is at::empty_like(t) with the last dimension set to
// last: t's strides when t is non-overlapping and dense (and keeps its
// last dimension), else contiguous.
func emptyLikeDense(fname string, t *Tensor, last int) (*Tensor, error) {
	shape := slices.Clone(t.shape)
	same := shape[len(shape)-1] == last
	shape[len(shape)-1] = last
	out, err := newTensor(t.ctx, fname, t.mem.Device(), t.dtype, shape)
	if err != nil {
		return nil, err
	}
	if same && t.IsNonOverlappingAndDense() && !t.isContiguous() {
		out.strides = slices.Clone(t.strides)
	}
	return out, nil
}

// emptyStrided is at::empty_strided(t.sizes(), t.strides()): storage for
// every element those strides reach.
func emptyStrided(fname string, t *Tensor) (*Tensor, error) {
	n := 1
	for i, s := range t.shape {
		if s == 0 {
			n = 0
			break
		}
		n += (s - 1) * t.strides[i]
	}
	mem, err := t.ctx.Manager.Alloc(t.mem.Device(), uint64(n*t.dtype.Size()))
	if err != nil {
		return nil, errorf(fname, "%w", err)
	}
	return newTensorOn(t.ctx, mem, t.dtype, slices.Clone(t.shape), slices.Clone(t.strides), 0), nil
}

// philoxTensors makes the seed and offset tensors: 0-dim int64 on the CPU
// (at::scalar_tensor with dropout, at::empty without).
func philoxTensors(c *Context, dropout bool, seed, offset uint64) (*Tensor, *Tensor, error) {
	if !dropout {
		s, err := Empty(c, []int{}, Int64, "cpu")
		if err != nil {
			return nil, nil, err
		}
		defer c.Hold(s)() // reachable while the offset is allocated
		o, err := Empty(c, []int{}, Int64, "cpu")
		return s, o, err
	}
	s, err := ScalarTensor(c, Int(int64(seed)), Int64, "cpu")
	if err != nil {
		return nil, nil, err
	}
	defer c.Hold(s)() // reachable while the offset is allocated
	o, err := ScalarTensor(c, Int(int64(offset)), Int64, "cpu")
	return s, o, err
}

// attnSpec is what the value kernels need besides the tensors.
type attnSpec struct {
	scale        float64
	causal       bool
	p            float64
	seed, offset uint64
	lseLen       int
}

// keep reports whether dropout keeps score (bh, i, j) of a head of L×S:
// a uniform from a hash of the seed and the counter (the kernels' philox
// stream is not reproduced: values with dropout differ from PyTorch's).
func (s *attnSpec) keep(bh, i, j, L, S int) bool {
	x := s.seed ^ (s.offset+uint64((bh*L+i)*S+j))*0x9E3779B97F4A7C15
	x ^= x >> 30
	x *= 0xBF58476D1CE4E5B9
	x ^= x >> 27
	x *= 0x94D049BB133111EB
	x ^= x >> 31
	return float64(x>>11)/(1<<53) >= s.p
}

// probs computes row i of head bh's attention probabilities into p (S
// values, before dropout) and returns the row's logsumexp; kbh is the
// key's (batch, head) row: bh's, or with grouped-query attention the key
// head its group shares.
func (s *attnSpec) probs(p, q, k, bias []float64, bh, kbh, i, L, S, E int) float64 {
	qi := q[(bh*L+i)*E : (bh*L+i+1)*E]
	m := math.Inf(-1)
	for j := 0; j < S; j++ {
		if s.causal && j > i {
			p[j] = math.Inf(-1)
			continue
		}
		kj := k[(kbh*S+j)*E : (kbh*S+j+1)*E]
		dot := 0.0
		for e, qv := range qi {
			dot += qv * kj[e]
		}
		x := dot * s.scale
		if bias != nil {
			x += bias[(bh*L+i)*S+j]
		}
		p[j] = x
		m = max(m, x)
	}
	sum := 0.0
	for j := range p {
		p[j] = math.Exp(p[j] - m)
		sum += p[j]
	}
	for j := range p {
		p[j] /= sum
	}
	return m + math.Log(sum)
}

// forward: outs {out [B,H,L,Ev], lse [B,H,lseLen]}, ins {q, k, v, bias}.
// Key and value may have Hk heads dividing H (grouped-query attention):
// query head h reads key head h/(H/Hk), as repeat_interleave lays them
// out.
func (s *attnSpec) forward(outs, ins []*Tensor) {
	q, k, v := ins[0], ins[1], ins[2]
	B, H, L, E, S, Ev, Hk := q.shape[0], q.shape[1], q.shape[2], q.shape[3], k.shape[2], v.shape[3], k.shape[1]
	G := H / Hk
	qs, ks, vs := actReadF64(q), actReadF64(k), actReadF64(v)
	var bias []float64
	if len(ins) > 3 {
		bias = actReadF64(ins[3])
	}
	o := make([]float64, B*H*L*Ev)
	lse := make([]float64, B*H*s.lseLen)
	parallelForStop(q.ctx.stopFlag(), B*H, 1, stopGrain(L*S*max(E, Ev)), func(lo, hi int) {
		p := make([]float64, S)
		for bh := lo; bh < hi; bh++ {
			kbh := bh/H*Hk + bh%H/G
			for i := 0; i < L; i++ {
				l := s.probs(p, qs, ks, bias, bh, kbh, i, L, S, E)
				if i < s.lseLen {
					lse[bh*s.lseLen+i] = l
				}
				oi := o[(bh*L+i)*Ev : (bh*L+i+1)*Ev]
				for j, pj := range p {
					if s.p > 0 {
						if !s.keep(bh, i, j, L, S) {
							continue
						}
						pj /= 1 - s.p
					}
					vj := vs[(kbh*S+j)*Ev : (kbh*S+j+1)*Ev]
					for e := range oi {
						oi[e] += pj * vj[e]
					}
				}
			}
		}
	})
	actWriteF64(outs[0], o)
	actWriteF64(outs[1], lse)
}

// backward: outs {dq, dk, dv} ([B,H,·,·] views; dk and dv of Hk heads
// under grouped-query attention), ins {grad, q, k, v, bias}: dV =
// Pdᵀ·dO, dP = dO·Vᵀ (dropped and rescaled as Pd), dS = P∘(dP −
// rowsum(P∘dP)), dQ = scale·dS·K, dK = scale·dSᵀ·Q, a key head's
// gradients summed over the query heads of its group. Work is split by
// key head, so that no two workers write one key row.
func (s *attnSpec) backward(outs, ins []*Tensor) {
	g, q, k, v := ins[0], ins[1], ins[2], ins[3]
	B, H, L, E, S, Ev, Hk := q.shape[0], q.shape[1], q.shape[2], q.shape[3], k.shape[2], v.shape[3], k.shape[1]
	G := H / Hk
	gs, qs, ks, vs := actReadF64(g), actReadF64(q), actReadF64(k), actReadF64(v)
	var bias []float64
	if len(ins) > 4 {
		bias = actReadF64(ins[4])
	}
	dq := make([]float64, B*H*L*E)
	dk := make([]float64, B*Hk*S*E)
	dv := make([]float64, B*Hk*S*Ev)
	parallelForStop(q.ctx.stopFlag(), B*Hk, 1, stopGrain(G*L*S*max(E, Ev)), func(lo, hi int) {
		p := make([]float64, S)
		dp := make([]float64, S)
		for kbh := lo; kbh < hi; kbh++ {
			for gi := 0; gi < G; gi++ {
				bh := kbh/Hk*H + kbh%Hk*G + gi
				s.backwardHead(p, dp, gs, qs, ks, vs, bias, dq, dk, dv, bh, kbh, L, S, E, Ev)
			}
		}
	})
	actWriteF64(outs[0], dq)
	actWriteF64(outs[1], dk)
	actWriteF64(outs[2], dv)
}

// backwardHead adds query head bh's share of the gradients (see backward).
func (s *attnSpec) backwardHead(p, dp, gs, qs, ks, vs, bias, dq, dk, dv []float64, bh, kbh, L, S, E, Ev int) {
	for i := 0; i < L; i++ {
		s.probs(p, qs, ks, bias, bh, kbh, i, L, S, E)
		gi := gs[(bh*L+i)*Ev : (bh*L+i+1)*Ev]
		dsum := 0.0
		for j := range p {
			scaleKeep := 1.0
			if s.p > 0 {
				scaleKeep = 0
				if s.keep(bh, i, j, L, S) {
					scaleKeep = 1 / (1 - s.p)
				}
			}
			vj := vs[(kbh*S+j)*Ev : (kbh*S+j+1)*Ev]
			dvj := dv[(kbh*S+j)*Ev : (kbh*S+j+1)*Ev]
			dot := 0.0
			for e, ge := range gi {
				dot += ge * vj[e]
				dvj[e] += p[j] * scaleKeep * ge
			}
			dp[j] = dot * scaleKeep
			dsum += p[j] * dp[j]
		}
		qi := qs[(bh*L+i)*E : (bh*L+i+1)*E]
		dqi := dq[(bh*L+i)*E : (bh*L+i+1)*E]
		for j := range p {
			ds := p[j] * (dp[j] - dsum) * s.scale
			if ds == 0 {
				continue
			}
			kj := ks[(kbh*S+j)*E : (kbh*S+j+1)*E]
			dkj := dk[(kbh*S+j)*E : (kbh*S+j+1)*E]
			for e := range dqi {
				dqi[e] += ds * kj[e]
				dkj[e] += ds * qi[e]
			}
		}
	}
}
