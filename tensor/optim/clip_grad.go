package optim

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/memsh/memsh/tensor"
	"github.com/memsh/memsh/tensor/autograd"
)

// Gradient clipping as PyTorch 2.x's torch/nn/utils/clip_grad.py does it,
// with its device memory on CUDA:
//
// clip_grad_norm_(parameters, max_norm, norm_type=2.0,
// error_if_nonfinite=False, foreach=None) is get_total_norm of the
// gradients followed by clip_grads_with_norm_:
//
//  1. per (device, dtype) group of gradients, the 0-dim norm of each:
//     torch._foreach_norm (foreach=None on a CUDA or CPU device, or
//     foreach=True), or torch.linalg.vector_norm one by one (foreach=False).
//     CUDA's fast path (norm_type 1, 2 or inf) first allocates its
//     output_per_tensor scratch, ntensors × ceil(largest numel / 65536)
//     floats (the op math type: float32 for float16, bfloat16 and float32
//     gradients), then the 0-dim results one after another, and frees the
//     scratch when it returns (PyTorch 2.x releases up to 2.9; its main
//     branch also allocates a [320] float32 global_output and a 0-dim
//     global norm there, freed at once: not modelled). Its slow path (CPU,
//     other orders) makes the 0-dim norms one by one;
//  2. total_norm = vector_norm(stack(norms), norm_type): the [n] stack, the
//     0-dim total, then the stack is freed, and the norms list when the
//     function returns (last norm first);
//  3. clip_coef = max_norm / (total_norm + 1e-6): the sum (0-dim), then
//     Tensor.__rtruediv__'s reciprocal and its product with max_norm (both
//     0-dim), the reciprocal and the sum freed after;
//     clip_coef_clamped = clamp(clip_coef, max=1.0) (0-dim);
//  4. per group, torch._foreach_mul_(grads, clip_coef_clamped) in place
//     (or grad.mul_ one by one; a group on another device multiplies by a
//     copy made there);
//  5. clip_coef and clip_coef_clamped are freed when the function returns;
//     total_norm is returned.
//
// So every 0-dim tensor is one 512-byte block of the caching allocator:
// with n gradients on one device, the peak is n + 2 blocks (the norms, the
// stack when n ≤ 128, the total) above the start, and the call ends one
// block (the returned total) above it.

// ClipGradNorm is torch.nn.utils.clip_grad_norm_: it scales the gradients
// of params (those that have one) in place so that their total norm is at
// most maxNorm, and returns the total norm before clipping (a 0-dim tensor
// of the first gradient's device and dtype; a 0-dim float32 on the host
// when no parameter has a gradient). foreach nil is PyTorch's None.
func ClipGradNorm(params []*tensor.Tensor, maxNorm, normType float64, errorIfNonfinite bool, foreach *bool) (*tensor.Tensor, error) {
	var grads []*tensor.Tensor
	for _, p := range params {
		if g := autograd.Grad(p); g != nil {
			grads = append(grads, g)
		}
	}
	if len(grads) == 0 {
		if len(params) == 0 {
			return nil, fmt.Errorf("clip_grad_norm_: no parameters (PyTorch returns torch.tensor(0.0): memsh needs a parameter's Context to make it)")
		}
		return tensor.Zeros(params[0].Context(), nil, tensor.Float32, "cpu")
	}
	total, err := GetTotalNorm(grads, normType, errorIfNonfinite, foreach)
	if err != nil {
		return nil, err
	}
	// the caller's `total_norm` variable: held while the clipping allocates
	defer total.Context().Hold(total)()
	if err := ClipGradsWithNorm(params, maxNorm, total, foreach); err != nil {
		return nil, err
	}
	return total, nil
}

// gradGroups groups ts by (device, dtype) in first-seen order
// (_group_tensors_by_device_and_dtype).
func gradGroups(ts []*tensor.Tensor) [][]*tensor.Tensor {
	var out [][]*tensor.Tensor
	for _, g := range group(ts) {
		out = append(out, sub(ts, g))
	}
	return out
}

// isCUDA reports whether device is a GPU (cuda:N, simulated or real).
func isCUDA(device string) bool { return strings.HasPrefix(device, "cuda") }

// foreachNormFast reports whether torch._foreach_norm takes CUDA's fast
// path for ts: a GPU group of floating-point dense tensors and an order of
// 1, 2 or inf.
func foreachNormFast(ts []*tensor.Tensor, ord float64) bool {
	if !isCUDA(ts[0].Device()) || !(ord == 1 || ord == 2 || math.IsInf(ord, 1)) {
		return false
	}
	for _, t := range ts {
		if !t.DType().IsFloat() || !t.IsNonOverlappingAndDense() {
			return false
		}
	}
	return true
}

// GetTotalNorm is torch.nn.utils.get_total_norm: the norm of the norms of
// ts (see the package's clipping comment for what it allocates). The
// result is a new 0-dim tensor on ts[0]'s device.
func GetTotalNorm(ts []*tensor.Tensor, normType float64, errorIfNonfinite bool, foreach *bool) (*tensor.Tensor, error) {
	if len(ts) == 0 {
		return nil, fmt.Errorf("get_total_norm: no tensors (PyTorch returns torch.tensor(0.0))")
	}
	ctx := ts[0].Context()
	f := newFrame(ctx)
	defer f.close()
	var norms []*tensor.Tensor
	bindNorm := func(t *tensor.Tensor) {
		f.set(fmt.Sprintf("norms[%d]", len(norms)), t, true)
		norms = append(norms, t)
	}
	for _, grp := range gradGroups(ts) {
		useForeach := foreach == nil || *foreach
		if !useForeach {
			for _, g := range grp {
				n, err := tensor.VectorNorm(g, normType, nil, false)
				if err != nil {
					return nil, err
				}
				bindNorm(n)
			}
			continue
		}
		if err := foreachNorm(f, grp, normType, bindNorm); err != nil {
			return nil, err
		}
	}
	// torch.stack([norm.to(first_device) for norm in norms]): the copies
	// live in the comprehension's list until stack returns
	first := ts[0].Device()
	moved := make([]*tensor.Tensor, len(norms))
	for i, n := range norms {
		moved[i] = n
		if n.Device() != first {
			c, err := tensor.To(n, first, tensor.Undefined, false)
			if err != nil {
				return nil, err
			}
			f.set(fmt.Sprintf("moved[%d]", i), c, true)
			moved[i] = c
		}
	}
	stacked, err := tensor.Stack(moved, 0)
	if err != nil {
		return nil, err
	}
	f.set("stacked", stacked, true)
	for i := range moved {
		f.del(fmt.Sprintf("moved[%d]", i))
	}
	total, err := tensor.VectorNorm(stacked, normType, nil, false)
	if err != nil {
		return nil, err
	}
	f.set("total_norm", total, false) // returned: never dropped here
	f.del("stacked")
	if errorIfNonfinite && total.NeedData("error_if_nonfinite") == nil {
		v, err := total.Item()
		if err != nil {
			return nil, err
		}
		if x := v.Float64(); math.IsNaN(x) || math.IsInf(x, 0) {
			return nil, fmt.Errorf("The total norm of order %s for gradients from `parameters` is non-finite, so it cannot be clipped. To disable this error and scale the gradients by the non-finite norm anyway, set `error_if_nonfinite=False`", pyFloat(normType))
		}
	}
	// the norms list is freed when the function returns, last norm first
	for i := len(norms) - 1; i >= 0; i-- {
		f.del(fmt.Sprintf("norms[%d]", i))
	}
	return total, nil
}

// foreachNorm is torch._foreach_norm(grp, ord): on CUDA's fast path the
// output_per_tensor scratch, then the 0-dim norms (empty tensors get a
// zeros({}) after them), the scratch and the unused results freed when it
// returns; otherwise the slow path, one vector_norm per tensor.
func foreachNorm(f *frame, grp []*tensor.Tensor, ord float64, bind func(*tensor.Tensor)) error {
	if !foreachNormFast(grp, ord) {
		for _, g := range grp {
			n, err := tensor.VectorNorm(g, ord, nil, false)
			if err != nil {
				return err
			}
			bind(n)
		}
		return nil
	}
	const chunk = 65536 // multi_tensor_apply's kChunkSize
	maxChunks := 0
	for _, g := range grp {
		maxChunks = max(maxChunks, (g.Numel()+chunk-1)/chunk)
	}
	opmath := tensor.Float32
	if grp[0].DType() == tensor.Float64 {
		opmath = tensor.Float64
	}
	ctx := grp[0].Context()
	dev := grp[0].Device()
	scratch, err := tensor.Zeros(ctx, []int{len(grp) * maxChunks}, opmath, dev)
	if err != nil {
		return err
	}
	f.set("output_per_tensor", scratch, true)
	res := make([]*tensor.Tensor, len(grp))
	for i := range grp {
		if res[i], err = tensor.Empty(ctx, nil, grp[0].DType(), dev); err != nil {
			return err
		}
		f.set(fmt.Sprintf("vec_res[%d]", i), res[i], true)
	}
	used := 0
	for _, g := range grp {
		var n *tensor.Tensor
		if g.Numel() != 0 {
			n = res[used]
			used++
		} else if n, err = tensor.Zeros(ctx, nil, grp[0].DType(), dev); err != nil {
			return err
		}
		if n.NeedData("norm") == nil && g.Numel() != 0 {
			if err := normInto(n, g, ord); err != nil {
				return err
			}
		}
		bind(n)
	}
	// the function's locals go: the scratch and the unused results
	f.del("output_per_tensor")
	for i := range grp {
		f.del(fmt.Sprintf("vec_res[%d]", i))
	}
	return nil
}

// pyFloat formats v as Python's repr of a float does ("2.0", "inf").
func pyFloat(v float64) string {
	switch {
	case math.IsInf(v, 1):
		return "inf"
	case math.IsInf(v, -1):
		return "-inf"
	case math.IsNaN(v):
		return "nan"
	}
	s := strconv.FormatFloat(v, 'g', -1, 64)
	if !strings.ContainsAny(s, ".eE") {
		s += ".0"
	}
	return s
}

// normInto writes g's ord-norm into the 0-dim out (the fast path's
// values), computed in place: no device memory.
func normInto(out, g *tensor.Tensor, ord float64) error {
	x, err := tensor.NormOf(g, ord)
	if err != nil {
		return err
	}
	_, err = out.Fill_(tensor.Float(x))
	return err
}

// ClipGradsWithNorm is torch.nn.utils.clip_grads_with_norm_: it multiplies
// the gradients of params in place by min(1, maxNorm / (total + 1e-6)).
func ClipGradsWithNorm(params []*tensor.Tensor, maxNorm float64, total *tensor.Tensor, foreach *bool) error {
	var grads []*tensor.Tensor
	for _, p := range params {
		if g := autograd.Grad(p); g != nil {
			grads = append(grads, g)
		}
	}
	if len(grads) == 0 {
		return nil
	}
	f := newFrame(total.Context())
	defer f.close()
	// clip_coef = max_norm / (total_norm + 1e-6)
	sum, err := tensor.Add(total, tensor.Float(1e-6))
	if err != nil {
		return err
	}
	f.set("(total_norm + 1e-6)", sum, true)
	// Tensor.__rtruediv__: self.reciprocal() * other
	rec, err := tensor.Reciprocal(sum)
	if err != nil {
		return err
	}
	f.set("reciprocal", rec, true)
	coef, err := tensor.Mul(rec, tensor.Float(maxNorm))
	if err != nil {
		return err
	}
	f.set("clip_coef", coef, true)
	f.del("reciprocal")
	f.del("(total_norm + 1e-6)")
	one := 1.0
	clamped, err := tensor.Clamp(coef, nil, &one)
	if err != nil {
		return err
	}
	f.set("clip_coef_clamped", clamped, true)
	for _, grp := range gradGroups(grads) {
		// foreach: _foreach_mul_(grads, clip_coef_clamped.to(device)), the
		// copy an argument freed after the call; the loop binds it to
		// clip_coef_clamped_device until the next group or the return
		useForeach := foreach == nil || *foreach
		c := clamped
		if dev := grp[0].Device(); dev != clamped.Device() {
			if c, err = tensor.To(clamped, dev, tensor.Undefined, false); err != nil {
				return err
			}
			f.set("clip_coef_clamped_device", c, true)
		}
		for _, g := range grp {
			if _, err := tensor.BinaryInPlace(tensor.OpMul, g, c); err != nil {
				return err
			}
		}
		if useForeach {
			f.del("clip_coef_clamped_device")
		}
	}
	return nil
}
