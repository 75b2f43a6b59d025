package autograd

import (
	"fmt"
	"math"
	"runtime"

	"github.com/memsh/memsh/tensor"
)

// ScaledDotProductAttention is torch.nn.functional.scaled_dot_product_
// attention: after PyTorch's input validation (validate_sdpa_input), the
// backend is chosen as PyTorch 2.x chooses it for the device
// (tensor.SelectSDPBackend: cuDNN first on the H100 and H200 presets, then
// flash → efficient → math, within the backends the Context enables) and
// run:
//
//   - math: the composite decomposition (sdpaMath), which materialises
//     and saves the L×S scores;
//   - flash: _scaled_dot_product_flash_attention on q, k, v padded to a
//     head dim multiple of 8 (pad_last_dim<8>), the output sliced back;
//     one ScaledDotProductFlashAttentionBackward0 node saving query, key,
//     value (the padded ones), output, logsumexp and the philox seed and
//     offset (derivatives.yaml);
//   - cudnn: _scaled_dot_product_cudnn_attention with the mask (bool turned
//     additive), the logsumexp computed when grad is needed; one
//     ScaledDotProductCudnnAttentionBackward0 node saving query, key,
//     value, output, logsumexp, philox seed and offset (on the device)
//     and attn_bias (derivatives.yaml);
//   - efficient: _scaled_dot_product_efficient_attention with the mask
//     (bool turned additive) padded if misaligned and expanded to
//     [B, H, L, S]; the logsumexp is computed when grad is needed; one
//     ScaledDotProductEfficientAttentionBackward0 node saving query, key,
//     value, attn_bias, output, logsumexp, seed and offset.
//
// Neither fused path allocates an L×S tensor. A gradient for attn_mask is
// not propagated through the efficient kernel (memsh gives the mask no
// edge).
//
// enableGQA (PyTorch 2.5+'s enable_gqa) lets key and value have fewer
// heads than query (grouped-query attention): flash and cuDNN attention
// take them as they are (flash's backward adds per-query-head dk and dv
// buffers), efficient attention cannot run them, and the math path
// repeats them to the query's heads first (repeat_interleave: a
// contiguous copy of the expanded heads, as
// pre_process_group_query_attention_input does).
func ScaledDotProductAttention(q, k, v, attnMask *tensor.Tensor, dropoutP float64, isCausal bool, scale float64, enableGQA bool) (*tensor.Tensor, error) {
	const fname = "scaled_dot_product_attention"
	// Autocast wraps the whole op (lower-precision list): q, k, v (and a
	// float mask) are cast before the backend is chosen.
	release, err := castArgs(lowerPrecision, &q, &k, &v, &attnMask)
	if err != nil {
		return nil, err
	}
	defer release()
	if q.DType() != k.DType() || q.DType() != v.DType() {
		return nil, fmt.Errorf("%s: Expected query, key, and value to have the same dtype, but got query.dtype: %s key.dtype: %s and value.dtype: %s instead.", fname, q.DType(), k.DType(), v.DType())
	}
	if q.Device() != k.Device() || q.Device() != v.Device() {
		return nil, fmt.Errorf("%s: Expected query, key, and value to have the same device type, but got query.device: %s key.device: %s and value.device: %s instead.", fname, q.Device(), k.Device(), v.Device())
	}
	if q.Dim() < 2 || k.Dim() < 2 || v.Dim() < 2 {
		return nil, fmt.Errorf("%s: Expected query, key, and value to all be  at least 2 dimensional, but got query.dim: %d key.dim: %d and value.dim: %d instead.", fname, q.Dim(), k.Dim(), v.Dim())
	}
	if attnMask != nil && attnMask.DType() != tensor.Bool && attnMask.DType() != q.DType() {
		return nil, fmt.Errorf("%s: Expected attn_mask dtype to be bool or float or to match query dtype, but got attn_mask.dtype: %s and  query.dtype: %s instead.", fname, attnMask.DType(), q.DType())
	}
	reqGrad := GradEnabled(q.Context()) && (RequiresGrad(q) || RequiresGrad(k) || RequiresGrad(v))
	backend, serr := tensor.SelectSDPBackend(tensor.SDPParams{Q: q, K: k, V: v, Mask: attnMask, Dropout: dropoutP, Causal: isCausal, RequiresGrad: reqGrad, EnableGQA: enableGQA})
	if serr != nil {
		return nil, fmt.Errorf("%s: %w", fname, serr)
	}
	switch backend {
	case tensor.SDPFlash:
		return sdpaFlash(q, k, v, dropoutP, isCausal, scale)
	case tensor.SDPEfficient:
		return sdpaEfficient(q, k, v, attnMask, reqGrad, dropoutP, isCausal, scale)
	case tensor.SDPCuDNN:
		return sdpaCuDNN(q, k, v, attnMask, reqGrad, dropoutP, isCausal, scale)
	}
	if enableGQA {
		var err error
		if k, v, err = repeatGQA(q, k, v); err != nil {
			return nil, fmt.Errorf("%s: %w", fname, err)
		}
	}
	return sdpaMath(q, k, v, attnMask, dropoutP, isCausal, scale)
}

// repeatGQA is pre_process_group_query_attention_input: key and value
// repeated to query's heads (dim -3) with repeat_interleave, which for an
// int repeat count is unsqueeze, expand, a contiguous clone and flatten
// (CloneBackward0 and ExpandBackward0 in the graph). Equal heads return
// k and v unchanged.
func repeatGQA(q, k, v *tensor.Tensor) (*tensor.Tensor, *tensor.Tensor, error) {
	if q.Dim() < 3 || k.Dim() < 3 || v.Dim() < 3 {
		return k, v, nil
	}
	hq, hk, hv := q.Shape()[q.Dim()-3], k.Shape()[k.Dim()-3], v.Shape()[v.Dim()-3]
	if hk == 0 || hv == 0 || hq%hk != 0 || hq%hv != 0 {
		return nil, nil, fmt.Errorf("Number of heads in key and value must divide the number of heads in query")
	}
	rep := func(t *tensor.Tensor, n int) (*tensor.Tensor, error) {
		if n == 1 {
			return t, nil
		}
		d := t.Dim() - 3
		u, err := Unsqueeze(t, d+1)
		if err != nil {
			return nil, err
		}
		shape := u.Shape()
		shape[d+1] = n
		e, err := Expand(u, shape)
		if err != nil {
			return nil, err
		}
		c, err := Contiguous(e)
		if err != nil {
			return nil, err
		}
		return Flatten(c, d, d+1)
	}
	rk, err := rep(k, hq/hk)
	if err != nil {
		return nil, nil, err
	}
	rv, err := rep(v, hq/hv)
	return rk, rv, err
}

// SDPBackendFor returns the backend scaled_dot_product_attention would
// run for these inputs (torch._fused_sdp_choice).
func SDPBackendFor(q, k, v, attnMask *tensor.Tensor, dropoutP float64, isCausal, enableGQA bool) (tensor.SDPBackend, error) {
	reqGrad := GradEnabled(q.Context()) && (RequiresGrad(q) || RequiresGrad(k) || RequiresGrad(v))
	return tensor.SelectSDPBackend(tensor.SDPParams{Q: q, K: k, V: v, Mask: attnMask, Dropout: dropoutP, Causal: isCausal, RequiresGrad: reqGrad, EnableGQA: enableGQA})
}

func sdpaScale(q *tensor.Tensor, scale float64) float64 {
	if scale > 0 {
		return scale
	}
	return 1 / math.Sqrt(float64(q.Shape()[q.Dim()-1]))
}

// sdpaFlash is the flash branch of scaled_dot_product_attention.
func sdpaFlash(q, k, v *tensor.Tensor, dropoutP float64, causal bool, scale float64) (*tensor.Tensor, error) {
	s := sdpaScale(q, scale) // from the original head dim
	E := q.Shape()[3]
	var pads [3]*tensor.Tensor
	for i, t := range []*tensor.Tensor{q, k, v} {
		p, err := tensor.PadLastDim(t, 8)
		if err != nil {
			return nil, err
		}
		pads[i] = p
	}
	n := newNode("ScaledDotProductFlashAttentionBackward0", q, k, v)
	var sq, sk, sv, sout, slse, sseed, soff *SavedTensor
	if n != nil {
		sq, sk, sv = n.save(pads[0]), n.save(pads[1]), n.save(pads[2])
	}
	out, lse, seed, off, err := tensor.FlashAttentionForward(pads[0], pads[1], pads[2], dropoutP, causal, s)
	if err != nil {
		return nil, err
	}
	if n != nil {
		n.setOutputs(out)
		sout, slse, sseed, soff = n.saveOutput(out, 0), n.save(lse), n.save(seed), n.save(off)
		rs, ro := philoxValues(seed, off, dropoutP)
		n.apply = func(n *Node, g []*tensor.Tensor) ([]*tensor.Tensor, error) {
			if g[0] == nil {
				return make([]*tensor.Tensor, 3), nil
			}
			vs, err := unpackAll(sq, sk, sv, sout, slse, sseed, soff)
			if err != nil {
				return nil, err
			}
			gq, gk, gv, err := tensor.FlashAttentionBackward(g[0], vs[0], vs[1], vs[2], vs[3], vs[4], dropoutP, causal, s, rs, ro)
			if err != nil {
				return nil, err
			}
			grads := []*tensor.Tensor{gq, gk, gv}
			for i, gr := range grads {
				if gr.Shape()[3] != E { // ConstantPadNdBackward0: a slice
					if grads[i], err = tensor.Narrow(gr, 3, 0, E); err != nil {
						return nil, err
					}
				}
			}
			return grads, nil
		}
	}
	runtime.KeepAlive(lse)
	if out.Shape()[3] != E { // post_process_flash_output
		return Narrow(out, 3, 0, E)
	}
	return out, nil
}

// sdpaEfficient is the efficient branch of scaled_dot_product_attention.
func sdpaEfficient(q, k, v, mask *tensor.Tensor, computeLSE bool, dropoutP float64, causal bool, scale float64) (*tensor.Tensor, error) {
	s := sdpaScale(q, scale)
	var bias *tensor.Tensor
	if mask != nil {
		var err error
		bias = mask
		if mask.DType() == tensor.Bool {
			if bias, err = additiveMask(mask, q.DType()); err != nil {
				return nil, err
			}
		}
		if bias, err = tensor.PadBias(bias); err != nil {
			return nil, err
		}
		qs, ks := q.Shape(), k.Shape()
		if bias, err = tensor.Expand(bias, []int{qs[0], qs[1], qs[2], ks[2]}); err != nil {
			return nil, err
		}
		// the mask is sdpa's local (or saved by a node not reachable yet)
		// while the kernel allocates
		defer hold(bias)()
	}
	return sdpaBiased("ScaledDotProductEfficientAttentionBackward0", q, k, v, bias,
		func() (out, lse, seed, off *tensor.Tensor, rs, ro uint64, err error) {
			if out, lse, seed, off, err = tensor.EfficientAttentionForward(q, k, v, bias, computeLSE, dropoutP, causal, s); err == nil {
				rs, ro = philoxValues(seed, off, dropoutP)
			}
			return
		},
		func(g, q, k, v, bias *tensor.Tensor, rs, ro uint64) (*tensor.Tensor, *tensor.Tensor, *tensor.Tensor, error) {
			return tensor.EfficientAttentionBackward(g, q, k, v, bias, dropoutP, causal, s, rs, ro)
		})
}

// sdpaCuDNN is the cuDNN branch of scaled_dot_product_attention.
func sdpaCuDNN(q, k, v, mask *tensor.Tensor, computeLSE bool, dropoutP float64, causal bool, scale float64) (*tensor.Tensor, error) {
	s := sdpaScale(q, scale)
	bias := mask
	if mask != nil && mask.DType() == tensor.Bool { // convert_boolean_attn_mask_cudnn
		var err error
		if bias, err = additiveMask(mask, q.DType()); err != nil {
			return nil, err
		}
		defer hold(bias)()
	}
	// the seed and offset are kept on the device as PyTorch keeps them;
	// their values travel in rs, ro (a meta device holds no data)
	return sdpaBiased("ScaledDotProductCudnnAttentionBackward0", q, k, v, bias,
		func() (out, lse, seed, off *tensor.Tensor, rs, ro uint64, err error) {
			return tensor.CuDNNAttentionForward(q, k, v, bias, computeLSE, dropoutP, causal, s)
		},
		func(g, q, k, v, bias *tensor.Tensor, rs, ro uint64) (*tensor.Tensor, *tensor.Tensor, *tensor.Tensor, error) {
			return tensor.CuDNNAttentionBackward(g, q, k, v, bias, dropoutP, causal, s, rs, ro)
		})
}

// sdpaBiased runs a fused kernel that takes an additive bias (efficient,
// cuDNN) under one node named name, which saves query, key, value,
// attn_bias, output, logsumexp and the philox seed and offset, as
// derivatives.yaml has both; rs, ro are the seed's and offset's values.
func sdpaBiased(name string, q, k, v, bias *tensor.Tensor,
	forward func() (out, lse, seed, off *tensor.Tensor, rs, ro uint64, err error),
	backward func(g, q, k, v, bias *tensor.Tensor, rs, ro uint64) (*tensor.Tensor, *tensor.Tensor, *tensor.Tensor, error)) (*tensor.Tensor, error) {
	n := newNode(name, q, k, v)
	var sq, sk, sv, sb, sout, slse, sseed, soff *SavedTensor
	if n != nil {
		sq, sk, sv, sb = n.save(q), n.save(k), n.save(v), n.save(bias)
	}
	out, lse, seed, off, rs, ro, err := forward()
	if err != nil {
		return nil, err
	}
	if n != nil {
		n.setOutputs(out)
		sout, slse, sseed, soff = n.saveOutput(out, 0), n.save(lse), n.save(seed), n.save(off)
		n.apply = func(n *Node, g []*tensor.Tensor) ([]*tensor.Tensor, error) {
			if g[0] == nil {
				return make([]*tensor.Tensor, 3), nil
			}
			vs, err := unpackAll(sq, sk, sv, sb, sout, slse, sseed, soff)
			if err != nil {
				return nil, err
			}
			gq, gk, gv, err := backward(g[0], vs[0], vs[1], vs[2], vs[3], rs, ro)
			if err != nil {
				return nil, err
			}
			return []*tensor.Tensor{gq, gk, gv}, nil
		}
	}
	runtime.KeepAlive(lse)
	runtime.KeepAlive(seed)
	runtime.KeepAlive(off)
	return out, nil
}

// philoxValues reads back the seed and offset the forward recorded (0-dim
// int64 CPU tensors, values only with dropout).
func philoxValues(seed, off *tensor.Tensor, dropoutP float64) (uint64, uint64) {
	if dropoutP <= 0 {
		return 0, 0
	}
	a, _ := seed.Item()
	b, _ := off.Item()
	return uint64(a.Int64()), uint64(b.Int64())
}

func unpackAll(ss ...*SavedTensor) ([]*tensor.Tensor, error) {
	out := make([]*tensor.Tensor, len(ss))
	for i, s := range ss {
		if s == nil {
			continue
		}
		t, err := s.Unpack()
		if err != nil {
			return nil, err
		}
		out[i] = t
	}
	return out, nil
}
