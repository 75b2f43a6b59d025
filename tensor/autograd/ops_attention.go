package autograd

import (
	"fmt"
	"math"
	"runtime"

	"github.com/memsh/memsh/tensor"
)

// sdpaMath is torch.nn.functional.scaled_dot_product_attention
// on PyTorch's math backend (aten::_scaled_dot_product_attention_math), as
// a composite of autograd ops so that the graph and its saved tensors are
// PyTorch's: q·√s and kᵀ·√s (s = scale, default 1/√E), their product (the
// L×S score matrix, materialised: batched matmul saves contiguous copies of
// non-contiguous operands), the mask added in place (a causal mask is built
// as ones(L, S, bool).tril() turned into an additive float mask of 0 and
// -inf; a bool attn_mask likewise), softmax over the last dim (saving its
// result), dropout when dropoutP > 0, and the product with v.
//
// Shapes: q [..., L, E], k [..., S, E], v [..., S, Ev] → [..., L, Ev];
// attnMask broadcastable to [..., L, S], bool (True: attend) or of q's
// dtype (added). scale <= 0 means the default.
func sdpaMath(q, k, v, attnMask *tensor.Tensor, dropoutP float64, isCausal bool, scale float64) (*tensor.Tensor, error) {
	const fname = "scaled_dot_product_attention"
	release, err := castArgs(lowerPrecision, &q, &k, &v, &attnMask)
	if err != nil {
		return nil, err
	}
	defer release()
	if q.Dim() < 2 || k.Dim() < 2 || v.Dim() < 2 {
		return nil, fmt.Errorf("%s: query, key and value must have at least 2 dimensions", fname)
	}
	qs, ks, vs := q.Shape(), k.Shape(), v.Shape()
	E := qs[len(qs)-1]
	if ks[len(ks)-1] != E {
		return nil, fmt.Errorf("%s: Expected query and key to have the same last dimension, got %d and %d", fname, E, ks[len(ks)-1])
	}
	if ks[len(ks)-2] != vs[len(vs)-2] {
		return nil, fmt.Errorf("%s: Expected key and value to have the same sequence length, got %d and %d", fname, ks[len(ks)-2], vs[len(vs)-2])
	}
	if q.DType() != k.DType() || q.DType() != v.DType() {
		return nil, fmt.Errorf("%s: Expected query, key, and value to have the same dtype, but got query.dtype: %s key.dtype: %s and value.dtype: %s instead.", fname, q.DType(), k.DType(), v.DType())
	}
	if dropoutP < 0 || dropoutP > 1 {
		return nil, fmt.Errorf("%s: dropout probability has to be between 0 and 1, but got %v", fname, dropoutP)
	}
	if isCausal && attnMask != nil {
		return nil, fmt.Errorf("_scaled_dot_product_attention: Explicit attn_mask should not be set when is_causal=True")
	}
	// scaled_dot_product_attention turns a bool mask into an additive one
	// before dispatching (convert_boolean_attn_mask).
	if attnMask != nil && attnMask.DType() == tensor.Bool {
		if attnMask, err = additiveMask(attnMask, q.DType()); err != nil {
			return nil, err
		}
	}
	s := scale
	if s <= 0 {
		s = 1 / math.Sqrt(float64(E))
	}
	sf := tensor.Float(math.Sqrt(s))
	query, err := MulScalar(q, sf)
	if err != nil {
		return nil, err
	}
	if isCausal {
		L, S := qs[len(qs)-2], ks[len(ks)-2]
		ones, err := tensor.Ones(q.Context(), []int{L, S}, tensor.Bool, q.Device())
		if err != nil {
			return nil, err
		}
		tri, err := Triangle(ones, 0, false)
		if err != nil {
			return nil, err
		}
		runtime.KeepAlive(ones) // a temporary of the tril expression
		ones = nil
		if attnMask, err = additiveMask(tri, q.DType()); err != nil {
			return nil, err
		}
	}
	kt, err := Transpose(k, -2, -1)
	if err != nil {
		return nil, err
	}
	kts, err := MulScalar(kt, sf)
	if err != nil {
		return nil, err
	}
	attn, err := Matmul(query, kts)
	if err != nil {
		return nil, err
	}
	kts = nil
	if attnMask != nil {
		if attn, err = BinaryInPlace(tensor.OpAdd, attn, attnMask); err != nil {
			return nil, err
		}
	}
	if attn, err = Softmax(attn, -1); err != nil {
		return nil, err
	}
	if dropoutP > 0 {
		if attn, err = Dropout(attn, dropoutP, true); err != nil {
			return nil, err
		}
	}
	out, err := Matmul(attn, v)
	runtime.KeepAlive(query)
	runtime.KeepAlive(attnMask)
	return out, err
}

// additiveMask is convert_boolean_attn_mask: zeros of dtype dt with -inf
// where mask is False (a temporary logical_not of mask on the way).
func additiveMask(mask *tensor.Tensor, dt tensor.DType) (*tensor.Tensor, error) {
	z, err := tensor.ZerosLike(mask, dt, mask.Device())
	if err != nil {
		return nil, err
	}
	defer hold(z)()
	not, err := tensor.Eq(mask, tensor.BoolScalar(false))
	if err != nil {
		return nil, err
	}
	if err := MaskedFill_(z, not, tensor.Float(math.Inf(-1))); err != nil {
		return nil, err
	}
	tensor.Dropped(not) // the expression's temporary: freed as it ends
	return z, nil
}
