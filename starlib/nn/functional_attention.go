package nn

import (
	"fmt"

	"go.starlark.net/starlark"

	"github.com/memsh/memsh/tensor/autograd"
)

func init() {
	registerF("scaled_dot_product_attention", sdpa)
}

// sdpa is nn.functional.scaled_dot_product_attention(query, key, value,
// attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
// enable_gqa=False): query [..., Hq, L, E], key [..., Hk, S, E], value
// [..., Hk, S, Ev] → [..., Hq, L, Ev], on the backend PyTorch 2.x picks
// (tensor/autograd.ScaledDotProductAttention: cuDNN, flash, efficient or
// the math path, which materialises and saves the L×S scores).
// attn_mask is bool (True: attend) or additive of query's dtype.
// enable_gqa: key and value may have fewer heads (Hk dividing Hq).
func sdpa(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	var qV, kV, vV starlark.Value
	var maskV, scaleV starlark.Value = starlark.None, starlark.None
	dropoutP := 0.0
	isCausal, enableGQA := false, false
	if err := starlark.UnpackArgs(b.Name(), args, kwargs, "query", &qV, "key", &kV, "value", &vV,
		"attn_mask?", &maskV, "dropout_p?", &dropoutP, "is_causal?", &isCausal, "scale?", &scaleV, "enable_gqa?", &enableGQA); err != nil {
		return nil, err
	}
	q, err := tensorArg(b.Name(), "query", qV)
	if err != nil {
		return nil, err
	}
	k, err := tensorArg(b.Name(), "key", kV)
	if err != nil {
		return nil, err
	}
	v, err := tensorArg(b.Name(), "value", vV)
	if err != nil {
		return nil, err
	}
	mask, err := optTensorArg(b.Name(), "attn_mask", maskV)
	if err != nil {
		return nil, err
	}
	scale := 0.0
	if scaleV != starlark.None {
		f, ok := starlark.AsFloat(scaleV)
		if !ok || f <= 0 {
			return nil, fmt.Errorf("%s: for parameter scale: want a positive number or None", b.Name())
		}
		scale = f
	}
	out, err := autograd.ScaledDotProductAttention(q, k, v, mask, dropoutP, isCausal, scale, enableGQA)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", b.Name(), err)
	}
	return wrap(out, nil)
}
