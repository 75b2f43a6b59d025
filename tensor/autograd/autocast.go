package autograd

import (
	"fmt"
	"strings"
	"weak"

	"github.com/memsh/memsh/tensor"
)

// Autocast (torch.autocast("cuda"), PyTorch 2.x): while it is enabled,
// each op on one of ATen's CUDA autocast lists (aten/src/ATen/
// autocast_mode.h: AT_FORALL_LOWER_PRECISION_FP, AT_FORALL_FP32,
// AT_FORALL_FP32_SET_OPT_DTYPE, AT_FORALL_PROMOTE; registered for CUDA in
// autocast_mode.cpp) first casts its eligible inputs — floating tensors on
// a CUDA device, float64 excepted — and then runs with autocast excluded,
// so that the ops it is made of do not cast again. The autocast dispatch
// key sits above autograd, so a cast of an input that requires grad is a
// recorded _to_copy (ToCopyBackward0) with its own allocation; a tensor
// already in the target dtype is passed as is. The casts are the
// wrapper's temporaries: freed when the op returns unless the graph saved
// them, except the lower-precision casts of float32 leaves that require
// grad (parameters), which cached_cast keeps in the Context's cast cache
// until the outermost autocast region is left.
//
// The ops of memsh on the lists, by policy:
//
//	lower_precision_fp: mm, addmm, bmm, matmul, linear, conv2d,
//	                    scaled_dot_product_attention
//	fp32:               exp, log, rsqrt, pow (Tensor_Scalar), layer_norm,
//	                    nll_loss, mse_loss
//	fp32_set_opt_dtype: softmax, log_softmax, sum (dtype=float32 when none
//	                    is given and the input is eligible)
//	promote:            none of memsh's ops (addcdiv, addcmul, atan2,
//	                    bilinear, cross, dot, vdot, grid_sampler,
//	                    index_put, tensordot, scatter_add; cat and stack
//	                    left the list when they learned type promotion)
//
// Ops off the lists run in whatever dtype their inputs have; composite
// ops off the lists reach the listed ops they are made of, which cast:
// cross_entropy is log_softmax(x, 1, dtype=x.dtype) — an explicit dtype,
// so a bf16 input stays bf16 there (LogSoftmaxBackward0 saves a bf16
// result) — then nll_loss, which casts the log-probabilities to float32
// (a recorded _to_copy that NllLossBackward0 saves).

// castPolicy is an autocast CastPolicy.
type castPolicy uint8

const (
	lowerPrecision castPolicy = iota // cast to the autocast dtype
	fp32                             // cast to float32
	promote                          // cast to the widest floating dtype among the inputs
)

func noRelease() {}

// autocastState returns the autocast state that applies to an op over ts:
// nil when autocast is off, or when a listed op's wrapper is already
// running.
func autocastState(ts ...*tensor.Tensor) *tensor.AutocastState {
	for _, t := range ts {
		if t == nil {
			continue
		}
		st := t.Context().Autocast
		if st == nil || !st.Enabled || st.Excluded {
			return nil
		}
		return st
	}
	return nil
}

// autocastEligible is at::autocast::is_eligible for CUDA: a floating
// tensor on a CUDA device, float64 excepted.
func autocastEligible(t *tensor.Tensor) bool {
	return t != nil && strings.HasPrefix(t.Device(), "cuda") && t.DType().IsFloat() && t.DType() != tensor.Float64
}

// castArgs is the autocast wrapper of a listed op, called first thing in
// the op: when autocast applies, it replaces each eligible argument by its
// cast to the policy's dtype (cached_cast), last argument first, and excludes autocast until
// release is called (the op defers it). release is never nil.
func castArgs(policy castPolicy, args ...**tensor.Tensor) (release func(), err error) {
	ts := make([]*tensor.Tensor, len(args))
	for i, a := range args {
		ts[i] = *a
	}
	st := autocastState(ts...)
	if st == nil {
		return noRelease, nil
	}
	to := st.DType
	switch policy {
	case fp32:
		to = tensor.Float32
	case promote:
		to = promoteType(st.DType, ts)
	}
	var ctx *tensor.Context
	unhold := noRelease // releases every cast held below (Hold nests)
	// Last argument first: PyTorch's wrapper casts its arguments in one
	// call expression, f(cached_cast(args)...), which its CUDA builds (GCC)
	// evaluate right to left. torch 2.11's allocator trace on an H100 shows
	// it: linear under bf16 autocast casts the bias, then the weight, then
	// the input. The order decides where the casts land in the allocator.
	for i := len(args) - 1; i >= 0; i-- {
		a := args[i]
		c, err := cachedCast(st, to, *a)
		if err != nil {
			unhold()
			return noRelease, err
		}
		if c != *a {
			// The casts are the op's arguments until it returns
			// (PyTorch's temporaries of the call expression).
			if ctx == nil {
				ctx = c.Context()
				unhold = ctx.Hold(c)
			} else {
				ctx.Hold(c)
			}
		}
		*a = c
	}
	st.Excluded = true
	return func() {
		st.Excluded = false
		unhold()
		if ctx != nil {
			// The casts not saved by the graph become garbage when the
			// op returns: exact mode looks for garbage before the next
			// allocation. Only this op held them.
			ctx.Manager.NoteHeldGarbage()
		}
	}, nil
}

// setOptDType is the fp32_set_opt_dtype policy (softmax, log_softmax,
// sum): when autocast applies, the first argument is eligible and no
// dtype was given, the op runs with dtype=float32. The wrapper excludes
// autocast like castArgs.
func setOptDType(first *tensor.Tensor, dt *tensor.DType) (release func()) {
	st := autocastState(first)
	if st == nil {
		return noRelease
	}
	if autocastEligible(first) && *dt == tensor.Undefined {
		*dt = tensor.Float32
	}
	st.Excluded = true
	return func() { st.Excluded = false }
}

// promoteType is at::autocast::promote_type: float32 when an eligible
// argument is float32, else the lower-precision dtype (float64 arguments
// are ignored).
func promoteType(lower tensor.DType, ts []*tensor.Tensor) tensor.DType {
	for _, t := range ts {
		if autocastEligible(t) && t.DType() == tensor.Float32 {
			return tensor.Float32
		}
	}
	return lower
}

// cachedCast is at::autocast::cached_cast: t itself unless it is eligible
// and of another dtype; a float32 leaf that requires grad cast to the
// lower-precision dtype is cached (a view is not).
func cachedCast(st *tensor.AutocastState, to tensor.DType, t *tensor.Tensor) (*tensor.Tensor, error) {
	if !autocastEligible(t) || t.DType() == to {
		return t, nil
	}
	canCache := to == st.DType && t.DType() == tensor.Float32 && RequiresGrad(t) && IsLeaf(t) && !t.IsView() && st.CacheEnabled
	if !canCache {
		return To(t, "", to, false)
	}
	key := weak.Make(t)
	if c, ok := st.Cache[key]; ok {
		return c, nil
	}
	c, err := To(t, "", to, false)
	if err != nil {
		return nil, err
	}
	st.AddCast(key, c)
	return c, nil
}

// AutocastDTypeOK checks an autocast dtype for device type "cuda": CUDA
// autocast runs in float16 or bfloat16.
func AutocastDTypeOK(dt tensor.DType) error {
	if dt != tensor.Float16 && dt != tensor.BFloat16 {
		return fmt.Errorf("In CUDA autocast, but the target dtype is not supported (torch.%s): CUDA Autocast only supports dtypes of torch.float16, torch.bfloat16", dt)
	}
	return nil
}

// Autocast runs f with autocast("cuda") set to enabled and dtype, as the
// torch.autocast context manager: the previous state comes back when f
// returns (also on an error), and leaving the outermost region clears the
// cast cache, so that the casts of parameters it held are freed unless the
// graph saved them.
func Autocast(ctx *tensor.Context, enabled bool, dt tensor.DType, f func() error) error {
	if enabled {
		if err := AutocastDTypeOK(dt); err != nil {
			return err
		}
	}
	st := ctx.AutocastOf()
	prevOn, prevDT, prevEx := st.Enabled, st.DType, st.Excluded
	st.Enabled, st.Excluded = enabled, false
	if enabled {
		st.DType = dt
	}
	st.Nesting++
	defer func() {
		st.Nesting--
		if st.Nesting == 0 {
			if len(st.Cache) > 0 {
				st.ClearCache()
				ctx.Manager.NoteHeldGarbage() // the Context held them
			}
			st.Owner = 0
		}
		st.Enabled, st.DType, st.Excluded = prevOn, prevDT, prevEx
	}()
	return f()
}

// AutocastCacheLen is the number of casts in ctx's autocast cache.
func AutocastCacheLen(ctx *tensor.Context) int {
	if ctx.Autocast == nil {
		return 0
	}
	return len(ctx.Autocast.Cache)
}
