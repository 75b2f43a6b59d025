package autograd

import (
	"fmt"

	"github.com/memsh/memsh/tensor"
)

// bitsandbytes' 4-bit linear layer (QLoRA), as bitsandbytes 0.45–0.49
// runs it on CUDA: bitsandbytes/nn/modules.py Linear4bit.forward and
// bitsandbytes/autograd/_functions.py matmul_4bit / MatMul4Bit (written
// from them). The dequantized weight is a temporary of each forward and
// of each backward; nothing of the input is saved (the packed weight and
// its quantization state are the node's ctx attributes, which cost
// nothing: they are the layer's).

// MatMul4Bit is bitsandbytes' matmul_4bit(A, W.t(), quant_state, bias):
// A [..., in] times the dequantized weight [out, in] transposed, plus
// bias. One row that needs no gradient (A.numel() == in, A not requiring
// grad, in a multiple of the block size) takes gemv_4bit: the output only
// (tensor.Gemv4bit), then bias added in place. Otherwise it is the
// autograd.Function MatMul4Bit: its node MatMul4BitBackward when grad
// mode is on and A or bias requires grad; its forward, with grad mode off,
// makes the weight (tensor.Dequantize4bit, in the dtype it was quantized
// from), casts it to A's dtype when they differ (the first freed when the
// cast exists), runs F.linear(A, W, bias) — under autocast if it is on —
// and frees the weight. Its backward makes the bias's gradient first
// (grad.sum(0) in the bias's dtype; the engine sums it to the bias's
// shape), then A's: the weight made again (and cast to the gradient's
// dtype), grad @ W, the weight freed. The weight gets no gradient.
func MatMul4Bit(a, packed *tensor.Tensor, qs *tensor.QuantState, bias *tensor.Tensor) (*tensor.Tensor, error) {
	if qs == nil || len(qs.Shape) != 2 {
		return nil, fmt.Errorf("matmul_4bit: a 2-D weight's quant_state is required")
	}
	outF, inF := qs.Shape[0], qs.Shape[1]
	if a.Dim() == 0 || a.Shape()[a.Dim()-1] != inF {
		return nil, fmt.Errorf("matmul_4bit: A's last dimension must be %d (in_features), got shape %v", inF, a.Shape())
	}
	if a.Numel() == inF && !RequiresGrad(a) && inF%qs.Blocksize == 0 {
		out, err := tensor.Gemv4bit(a, packed, qs)
		if err != nil || bias == nil {
			return out, err
		}
		return out, NoGrad(a.Context(), func() error {
			_, err := BinaryInPlace(tensor.OpAdd, out, bias)
			return err
		})
	}
	n := newNode("MatMul4BitBackward", a, packed, bias)
	ctx := a.Context()
	var out *tensor.Tensor
	if a.Numel() == 0 {
		shape := append(append([]int{}, a.Shape()[:a.Dim()-1]...), outF)
		var err error
		if out, err = tensor.Empty(ctx, shape, a.DType(), a.Device()); err != nil {
			return nil, err
		}
	} else if err := NoGrad(ctx, func() error {
		w, err := dequantTo(packed, qs, a.DType())
		if err != nil {
			return err
		}
		defer ctx.Hold(w)()
		if out, err = Linear(a, w, bias); err != nil {
			return err
		}
		tensor.Dropped(w)
		return nil
	}); err != nil {
		return nil, err
	}
	if n == nil {
		return out, nil
	}
	// ctx.tensors = (None, B) when A or B needs a gradient, and ctx.state
	if n.needsGrad(0) || n.needsGrad(1) {
		n.held = append(n.held, packed)
	}
	n.held = append(n.held, qs.Tensors()...)
	var biasDT tensor.DType
	if bias != nil {
		biasDT = bias.DType()
	}
	// the closure keeps no tensor: what the node needs it holds (held)
	empty := a.Numel() == 0
	aShape, aDT, aDev := a.Shape(), a.DType(), a.Device()
	n.apply = func(n *Node, g []*tensor.Tensor) ([]*tensor.Tensor, error) {
		res := make([]*tensor.Tensor, 3)
		if g[0] == nil {
			return res, nil
		}
		if empty {
			if n.needsGrad(0) {
				z, err := tensor.Zeros(ctxOf(n), aShape, aDT, aDev)
				if err != nil {
					return nil, err
				}
				res[0] = z
			}
			return res, nil
		}
		if n.needsGrad(2) {
			gb, err := tensor.Sum(g[0], []int{0}, false, biasDT)
			if err != nil {
				return nil, err
			}
			res[2] = gb
		}
		if n.needsGrad(0) {
			defer ctxOf(n).Hold(res[2])()
			w, err := dequantTo(packed, qs, g[0].DType())
			if err != nil {
				return nil, err
			}
			defer ctxOf(n).Hold(w)()
			ga, err := tensor.Matmul(g[0], w)
			if err != nil {
				return nil, err
			}
			tensor.Dropped(w)
			res[0] = ga
		}
		return res, nil
	}
	n.setOutputs(out)
	return out, nil
}

// dequantTo is F.dequantize_4bit(B, state).to(dt): the weight [out, in],
// the dequantized one freed once its cast exists.
func dequantTo(packed *tensor.Tensor, qs *tensor.QuantState, dt tensor.DType) (*tensor.Tensor, error) {
	w, err := tensor.Dequantize4bit(packed, qs)
	if err != nil || w.DType() == dt {
		return w, err
	}
	defer w.Context().Hold(w)()
	wc, err := tensor.To(w, "", dt, false)
	if err != nil {
		return nil, err
	}
	tensor.Dropped(w)
	return wc, nil
}

// Linear4bit is bitsandbytes' Linear4bit.forward(x) after its bias
// check: x cast to compute (when not Undefined and different: a recorded
// ToCopyBackward0), bias cast to compute likewise, matmul_4bit, and the
// result cast back to x's dtype; the casts and matmul_4bit's result are
// freed when it returns (bitsandbytes' locals), after the result's cast
// is made.
func Linear4bit(x, packed *tensor.Tensor, qs *tensor.QuantState, bias *tensor.Tensor, compute tensor.DType) (*tensor.Tensor, error) {
	ctx := x.Context()
	inDT := x.DType()
	var made []*tensor.Tensor
	defer func() { tensor.Dropped(made...) }()
	hold := func(t, of *tensor.Tensor) {
		if t != of {
			made = append(made, t)
			ctx.Hold(t)
		}
	}
	defer ctx.Hold()()
	xc, bc := x, bias
	var err error
	if compute != tensor.Undefined {
		if xc, err = To(x, "", compute, false); err != nil {
			return nil, err
		}
		hold(xc, x)
		if bias != nil {
			if bc, err = To(bias, "", compute, false); err != nil {
				return nil, err
			}
			hold(bc, bias)
		}
	}
	out, err := MatMul4Bit(xc, packed, qs, bc)
	if err != nil {
		return nil, err
	}
	if out.DType() == inDT {
		return out, nil
	}
	hold(out, nil)
	return To(out, "", inDT, false)
}
