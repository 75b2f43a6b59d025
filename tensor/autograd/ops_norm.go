package autograd

import (
	"fmt"
	"math"
	"strings"

	"github.com/memsh/memsh/tensor"
)

// Normalisations: layer_norm as native_layer_norm (one node), rms_norm as
// PyTorch 2.x's CompositeImplicitAutograd decomposition (a chain of
// nodes).

// LayerNorm is layer_norm(x, normalized_shape, w, b, eps) =
// native_layer_norm's output: NativeLayerNormBackward0 saves input,
// weight, bias and the mean and rstd results; its backward
// (native_layer_norm_backward) allocates grad_input, grad_weight,
// grad_bias in that order, each only where needed. w and b may be nil.
// Without a node the mean and rstd are dropped when the op returns.
func LayerNorm(x *tensor.Tensor, normalized []int, w, b *tensor.Tensor, eps float64) (*tensor.Tensor, error) {
	release, err := castArgs(fp32, &x, &w, &b)
	if err != nil {
		return nil, err
	}
	defer release()
	n := newNode("NativeLayerNormBackward0", x, w, b)
	var sx, sw, sb, smean, srstd *SavedTensor
	if n != nil {
		sx, sw, sb = n.save(x), n.save(w), n.save(b)
	}
	out, mean, rstd, err := tensor.NativeLayerNorm(x, normalized, w, b, eps)
	if err != nil || n == nil {
		return out, err
	}
	n.setOutputs(out, mean, rstd)
	smean, srstd = n.saveOutput(mean, 1), n.saveOutput(rstd, 2)
	n.apply = func(n *Node, g []*tensor.Tensor) ([]*tensor.Tensor, error) {
		if g[0] == nil {
			return make([]*tensor.Tensor, 3), nil
		}
		vs, err := unpackAll(sx, sw, sb, smean, srstd)
		if err != nil {
			return nil, err
		}
		mask := [3]bool{n.needsGrad(0), n.needsGrad(1), n.needsGrad(2)}
		gx, gw, gb, err := tensor.NativeLayerNormBackward(g[0], vs[0], normalized, vs[3], vs[4], vs[1], vs[2], mask)
		if err != nil {
			return nil, err
		}
		return []*tensor.Tensor{gx, gw, gb}, nil
	}
	return out, nil
}

// RMSNormEps is rms_norm's default eps for an input of dtype dt: the
// machine epsilon of its opmath type (float32 for float16, bfloat16 and
// float32; float64 for float64).
func RMSNormEps(dt tensor.DType) float64 {
	if dt == tensor.Float64 {
		return math.Nextafter(1, 2) - 1
	}
	return float64(math.Nextafter32(1, 2) - 1)
}

// RMSNorm is rms_norm(x, normalized_shape, w, eps) as PyTorch 2.8+'s
// rms_norm_symint (aten/src/ATen/native/layer_norm.cpp) dispatches it. On
// a CUDA device, when w is nil or of x's dtype, it is the fused kernel
// (_fused_rms_norm: the output and rstd allocated, x, w and rstd saved as
// in derivatives.yaml; FusedRmsNormBackward0). Elsewhere — the CPU, whose
// _fused_rms_norm is the composite, or a w of another dtype, such as
// float32 weights under a bfloat16 input — it is the composite
// rms_norm_composite:
//
//	up = x.to(opmath)                       // float32 for half types: ToCopyBackward0
//	r = rsqrt(pow(up, 2).mean(dims, keepdim=True).add_(eps))
//	y = up.mul(r)                            // MulBackward0
//	y = y.mul(w)                             // when w is given
//	return y.type_as(x)
//
// dims are the normalised trailing dimensions, last first. The pow and
// mean results are C++ temporaries of the full expression: alive until
// rsqrt's result exists. eps nil is RMSNormEps.
func RMSNorm(x *tensor.Tensor, normalized []int, w *tensor.Tensor, eps *float64) (*tensor.Tensor, error) {
	const fname = "tensor.rms_norm"
	if err := x.CheckLive(fname); err != nil {
		return nil, err
	}
	if !x.DType().IsFloat() {
		return nil, &tensor.Error{Op: fname, Err: fmt.Errorf("\"rms_norm\" not implemented for '%s'", x.DType())}
	}
	if _, _, err := tensor.CheckNormInputs(fname, x, normalized, w, nil); err != nil {
		return nil, err
	}
	e := RMSNormEps(x.DType())
	if eps != nil {
		e = *eps
	}
	if strings.HasPrefix(x.Device(), "cuda") && (w == nil || w.DType() == x.DType()) {
		return fusedRMSNorm(x, normalized, w, e)
	}
	opmath := tensor.NormAccDType(x.DType())
	dims := make([]int, len(normalized))
	for i := range dims {
		dims[i] = x.Dim() - i - 1
	}
	// Each intermediate is held (Context.Hold) while the next ones are
	// made, and dropped (tensor.Dropped) where PyTorch's C++ lets go of
	// it: what autograd saved of them the reclaim's walk reaches; the
	// rest — all of them in a checkpointed region, whose saved tensors
	// are packed away — is garbage then. upcasted_input and rqrst_input
	// are locals of the dispatch lambda, gone before type_as.
	up, err := To(x, "", opmath, false)
	if err != nil {
		return nil, err
	}
	ctx := x.Context()
	locals := ctx.Hold(up)
	dropLocals := func(r *tensor.Tensor) {
		locals()
		tensor.Dropped(r)
		if up != x {
			tensor.Dropped(up)
		}
	}
	p, err := PowScalar(up, 2)
	if err != nil {
		dropLocals(nil)
		return nil, err
	}
	// pow's and mean's results are temporaries of rsqrt's full
	// expression: dropped once rsqrt's result exists
	exprEnd := ctx.Hold(p)
	m, err := Mean(p, dims, true, tensor.Undefined)
	if err == nil {
		ctx.Hold(m) // released with p's hold
		_, err = BinaryInPlace(tensor.OpAdd, m, tensor.Float(e))
	}
	var r *tensor.Tensor
	if err == nil {
		r, err = Rsqrt(m)
	}
	exprEnd()
	tensor.Dropped(p, m)
	if err != nil {
		dropLocals(nil)
		return nil, err
	}
	ctx.Hold(r) // released with up's hold
	y, err := Mul(up, r)
	if err == nil && w != nil {
		// upcasted_result = upcasted_result.mul(weight): the old result
		// dies at the assignment (autograd saved it outside a region)
		y0 := y
		rel := ctx.Hold(y0)
		y, err = Mul(y0, w)
		rel()
		tensor.Dropped(y0)
	}
	dropLocals(r)
	if err != nil {
		return nil, err
	}
	rel := ctx.Hold(y)
	out, err := To(y, "", x.DType(), false)
	rel()
	if out != y {
		tensor.Dropped(y)
	}
	return out, err
}

// fusedRMSNorm is _fused_rms_norm with its autograd node: x, w and rstd
// saved (derivatives.yaml), the backward _fused_rms_norm_backward.
func fusedRMSNorm(x *tensor.Tensor, normalized []int, w *tensor.Tensor, eps float64) (*tensor.Tensor, error) {
	n := newNode("FusedRmsNormBackward0", x, w)
	var sx, sw, srstd *SavedTensor
	if n != nil {
		sx, sw = n.save(x), n.save(w)
	}
	out, rstd, err := tensor.FusedRMSNorm(x, normalized, w, eps)
	if err != nil {
		return nil, err
	}
	// rstd is no Go code's once the op returns: what the node saved of it
	// the reclaim's walk reaches; unsaved (no grad), it is garbage then
	tensor.Dropped(rstd)
	if n == nil {
		return out, nil
	}
	n.setOutputs(out, rstd)
	srstd = n.saveOutput(rstd, 1)
	n.apply = func(n *Node, g []*tensor.Tensor) ([]*tensor.Tensor, error) {
		if g[0] == nil {
			return make([]*tensor.Tensor, 2), nil
		}
		vs, err := unpackAll(sx, sw, srstd)
		if err != nil {
			return nil, err
		}
		gx, gw, err := tensor.FusedRMSNormBackward(g[0], vs[0], normalized, vs[2], vs[1], [2]bool{n.needsGrad(0), n.needsGrad(1)})
		if err != nil {
			return nil, err
		}
		return []*tensor.Tensor{gx, gw}, nil
	}
	return out, nil
}
