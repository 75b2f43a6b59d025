package tensor

import "slices"

// cuDNN's fused attention (_scaled_dot_product_cudnn_attention), with the
// allocations torch 2.11's allocator trace shows on an H100 (cuDNN 9.15+,
// bench/gpu/torch_fit.py trace --cpp, testdata/torchref/cuda/
// h100_trace_llama_b1_cpp.jsonl.gz: Llama 3.2 1B, batch 1, sequence 2048,
// 32 heads of 64).

// cudnnForwardWorkspace is what run_cudnn_SDP_fprop's execution plan
// asked for, allocated and freed around the kernel: 256 bytes in the
// trace (one shape measured).
const cudnnForwardWorkspace = 256

// cudnnBackwardWorkspace is what run_cudnn_SDP_bprop's plan asks for: a
// float32 dQ accumulator [B, H, L, E] and the row sums of dO∘O [B, H, L]
// float32, plus 256 bytes — 17,039,616 bytes at B=1, H=32, L=2048, E=64 in
// the trace (one shape measured; the formula is FlashAttention-2's
// backward workspace, which cuDNN's SDPA backward follows).
func cudnnBackwardWorkspace(B, H, L, E int) uint64 {
	return uint64(4*B*H*L*(E+1)) + 256
}

// CuDNNAttentionForward is _scaled_dot_product_cudnn_attention on q, k, v
// ([B, H, L, E], [B, H, S, E], [B, H, S, Ev]; E and Ev multiples of 8 and
// at most 128) with bias (an additive mask broadcastable to [B, H, L, S],
// or nil): the philox seed and offset as int64 tensors on the device (8
// bytes each, allocated even without dropout), the output [B, H, L, Ev]
// laid out in q's dimension order (alloc_with_matching_layout), the
// softmax statistics [B, H, L, 1] float32 when computeLSE (the backward
// needs them), then the plan's workspace, freed when the kernel returns.
// The seed and offset values are returned too (rs, ro: 0 without
// dropout), for the backward; dropout draws B·H·L·S values (memsh's
// count: the offset cuDNN's philox advances by is not measured).
func CuDNNAttentionForward(q, k, v, bias *Tensor, computeLSE bool, dropoutP float64, causal bool, scale float64) (out, lse, seed, offset *Tensor, rs, ro uint64, err error) {
	const fname = "aten::_scaled_dot_product_cudnn_attention"
	c := q.ctx
	dev := q.mem.Device()
	B, H, L, S, Ev := q.shape[0], q.shape[1], q.shape[2], k.shape[2], v.shape[3]
	if dropoutP > 0 {
		rs, ro = c.draw(B * H * L * S)
	}
	fail := func(err error) (out, lse, seed, offset *Tensor, rs, ro uint64, e error) {
		return nil, nil, nil, nil, 0, 0, err
	}
	// what is allocated is held (reachable) while the rest is; releasing
	// the empty first hold releases the later ones
	release := c.Hold()
	defer release()
	if seed, err = newTensor(c, fname, dev, Int64, []int{}); err != nil {
		return fail(err)
	}
	c.Hold(seed)
	if offset, err = newTensor(c, fname, dev, Int64, []int{}); err != nil {
		return fail(err)
	}
	c.Hold(offset)
	if out, err = allocMatchingLayout(fname, q, []int{B, H, L, Ev}); err != nil {
		return fail(err)
	}
	c.Hold(out)
	lseLen := 0
	if computeLSE {
		lseLen = L
	}
	if lse, err = newTensor(c, fname, dev, Float32, []int{B, H, lseLen, 1}); err != nil {
		return fail(err)
	}
	c.Hold(lse)
	done, err := cudaTemporary(q, cudnnForwardWorkspace, "freed when cuDNN's SDPA forward returned")
	if err != nil {
		return fail(errorf(fname, "%w", err))
	}
	spec := attnSpec{scale: scale, causal: causal, p: dropoutP, seed: rs, offset: ro, lseLen: lseLen}
	ins := []*Tensor{q, k, v}
	if bias != nil {
		if bias, err = Expand(bias, []int{B, H, L, S}); err != nil {
			done()
			return fail(err)
		}
		ins = append(ins, bias)
	}
	err = actHostKernel(c, fname, []*Tensor{out, lse}, ins, spec.forward)
	done()
	if err != nil {
		return fail(err) // an interrupted kernel's results are dropped
	}
	return out, lse, seed, offset, rs, ro, nil
}

// CuDNNAttentionBackward is _scaled_dot_product_cudnn_attention_backward:
// grad_q, grad_k and grad_v empty_strided with q's, k's and v's sizes and
// strides, then the plan's workspace (cudnnBackwardWorkspace), freed when
// the kernel returns. rs and ro are the forward's philox seed and offset.
func CuDNNAttentionBackward(g, q, k, v, bias *Tensor, dropoutP float64, causal bool, scale float64, rs, ro uint64) (gq, gk, gv *Tensor, err error) {
	const fname = "aten::_scaled_dot_product_cudnn_attention_backward"
	c := q.ctx
	B, H, L, S, E := q.shape[0], q.shape[1], q.shape[2], k.shape[2], q.shape[3]
	var d [3]*Tensor
	release := c.Hold() // as in the forward
	defer release()
	for i, t := range []*Tensor{q, k, v} {
		if d[i], err = emptyStrided(fname, t); err != nil {
			return nil, nil, nil, err
		}
		c.Hold(d[i])
	}
	done, err := cudaTemporary(q, cudnnBackwardWorkspace(B, H, L, E), "freed when cuDNN's SDPA backward returned")
	if err != nil {
		return nil, nil, nil, errorf(fname, "%w", err)
	}
	spec := attnSpec{scale: scale, causal: causal, p: dropoutP, seed: rs, offset: ro}
	ins := []*Tensor{g, q, k, v}
	if bias != nil {
		if bias, err = Expand(bias, []int{B, H, L, S}); err != nil {
			done()
			return nil, nil, nil, err
		}
		ins = append(ins, bias)
	}
	err = actHostKernel(c, fname, d[:], ins, spec.backward)
	done()
	if err != nil {
		return nil, nil, nil, err
	}
	return d[0], d[1], d[2], nil
}

// allocMatchingLayout is cuDNN's alloc_with_matching_layout: a new
// tensor of shape whose dimensions are laid out in the order of q's
// strides (the smallest stride innermost; equal strides keep the
// dimension order), dense.
func allocMatchingLayout(fname string, q *Tensor, shape []int) (*Tensor, error) {
	order := make([]int, len(shape))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return q.strides[a] - q.strides[b] })
	strides := make([]int, len(shape))
	st := 1
	for _, d := range order {
		strides[d] = st
		st *= shape[d]
	}
	out, err := newTensor(q.ctx, fname, q.mem.Device(), q.dtype, shape)
	if err != nil {
		return nil, err
	}
	out.strides = strides
	return out, nil
}
