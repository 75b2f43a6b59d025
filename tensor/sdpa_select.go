package tensor

import (
	"fmt"
	"math"
	"strings"

	"github.com/memsh/memsh/backend"
)

// scaled_dot_product_attention's backend choice, as PyTorch 2.x makes it
// for CUDA tensors (aten/src/ATen/native/transformers/cuda/sdp_utils.cpp,
// select_sdp_backend; the generic checks in sdp_utils_cpp.h): the first
// backend of the priority order whose constraints all hold, checked in
// PyTorch's order. The order is flash attention, memory-efficient
// attention, math — except on a device where PyTorch 2.11 puts cuDNN
// attention first (check_prefer_cudnn_attention: CUDA 13 wheels, whose
// cuDNN is newer than 9.15.0, on sm9x and sm10x): the simulator's H100
// and H200 presets (CuDNNAttentionDevice). A plain sim:SIZE device (sm90)
// and real GPUs keep flash first, the order of 2.2–2.8 and of builds
// without that cuDNN. CPU tensors use the math path (PyTorch ≥ 2.2 would
// pick its CPU flash kernel, _scaled_dot_product_flash_attention_for_cpu,
// for 4-D inputs without dropout; memsh does not model that kernel).

// SDPBackend is one of scaled_dot_product_attention's implementations.
type SDPBackend int

const (
	SDPMath      SDPBackend = iota // _scaled_dot_product_attention_math (composite)
	SDPFlash                       // _scaled_dot_product_flash_attention
	SDPEfficient                   // _scaled_dot_product_efficient_attention
	SDPCuDNN                       // _scaled_dot_product_cudnn_attention
)

var sdpNames = [...]string{"math", "flash", "efficient", "cudnn"}

func (b SDPBackend) String() string { return sdpNames[b] }

// ParseSDPBackend reads a backend's name: "math", "flash", "efficient" or
// "cudnn" (also PyTorch's enum names "MATH", "FLASH_ATTENTION",
// "EFFICIENT_ATTENTION", "CUDNN_ATTENTION").
func ParseSDPBackend(s string) (SDPBackend, bool) {
	switch strings.ToLower(s) {
	case "math":
		return SDPMath, true
	case "flash", "flash_attention":
		return SDPFlash, true
	case "efficient", "efficient_attention", "mem_efficient":
		return SDPEfficient, true
	case "cudnn", "cudnn_attention":
		return SDPCuDNN, true
	}
	return 0, false
}

// SDPBackends is a set of backends (bit 1<<b for backend b).
type SDPBackends uint8

// AllSDPBackends is every backend memsh models.
const AllSDPBackends = SDPBackends(1<<SDPMath | 1<<SDPFlash | 1<<SDPEfficient | 1<<SDPCuDNN)

// Has reports whether b is in the set.
func (s SDPBackends) Has(b SDPBackend) bool { return s&(1<<b) != 0 }

// With returns the set with b added.
func (s SDPBackends) With(b SDPBackend) SDPBackends { return s | 1<<b }

// SDPEnabled reports whether backend b may be chosen.
func (c *Context) SDPEnabled(b SDPBackend) bool { return !c.SDPDisabled.Has(b) }

// deviceOf returns the allocator of device (a device string of c's
// Manager) and the device behind it, the real one for a staging device;
// nils for an unknown device.
func (c *Context) deviceOf(device string) (backend.Allocator, backend.Device) {
	if c == nil || c.Manager == nil {
		return nil, nil
	}
	a, err := c.Manager.Allocator(device)
	if err != nil {
		return nil, nil
	}
	d := a.Device()
	if s, isStage := d.(*stageDevice); isStage {
		d = s.real
	}
	return a, d
}

type capabilityDevice interface {
	ComputeCapability() (major, minor int)
}

// ComputeCapability returns the compute capability of device (a GPU of
// c's Manager): the driver's for a real GPU, the preset's for a simulated
// one (sm90 without a preset: backend/sim.DefaultCapability). ok is false
// for the CPU.
func (c *Context) ComputeCapability(device string) (major, minor int, ok bool) {
	_, d := c.deviceOf(device)
	if cd, isCap := d.(capabilityDevice); isCap {
		major, minor = cd.ComputeCapability()
		return major, minor, true
	}
	return 0, 0, false
}

// CuDNNAttentionDevice is implemented by a device on which PyTorch tries
// cuDNN attention first (backend/sim presets of sm9x/sm10x cards).
type CuDNNAttentionDevice interface {
	CuDNNAttention() bool
}

// prefersCuDNN reports whether scaled_dot_product_attention tries cuDNN
// attention first on device.
func (c *Context) prefersCuDNN(device string) bool {
	_, d := c.deviceOf(device)
	cd, ok := d.(CuDNNAttentionDevice)
	return ok && cd.CuDNNAttention()
}

// SDPParams are the inputs the backend choice looks at (sdp::sdp_params).
type SDPParams struct {
	Q, K, V, Mask *Tensor
	Dropout       float64
	Causal        bool
	// RequiresGrad is input_requires_grad: grad mode on and an input
	// requiring grad.
	RequiresGrad bool
	// EnableGQA is scaled_dot_product_attention's enable_gqa: key and value
	// may have fewer heads than query (grouped-query attention), which
	// flash and cuDNN attention run natively and the math path by
	// repeating them (repeat_interleave).
	EnableGQA bool
}

// torchDType is a dtype as PyTorch's sdp warnings print a TypeMeta.
func torchDType(dt DType) string {
	switch dt {
	case Float32:
		return "float"
	case Float64:
		return "double"
	case Float16:
		return "c10::Half"
	case BFloat16:
		return "c10::BFloat16"
	}
	return dt.String()
}

// SelectSDPBackend is select_sdp_backend: the first backend of the
// device's priority order (cuDNN, flash, efficient, math where the device
// prefers cuDNN, else flash, efficient, math, cuDNN) that is enabled in
// the Context and can run p. When none can, the error is PyTorch's "No
// available kernel. Aborting execution." with the reasons PyTorch prints
// as warnings folded in.
func SelectSDPBackend(p SDPParams) (SDPBackend, error) {
	c := p.Q.ctx
	if c.SDPDisabled&AllSDPBackends == AllSDPBackends {
		return 0, fmt.Errorf("No viable backend for scaled_dot_product_attention was found. This is likely due to turning off both the math kernel and the fused kernels.")
	}
	major, minor, onGPU := c.ComputeCapability(p.Q.Device())
	if !onGPU {
		if c.SDPEnabled(SDPMath) {
			return SDPMath, nil
		}
		return 0, fmt.Errorf("No available kernel. Aborting execution. (memsh models only the math backend for CPU tensors: PyTorch's CPU flash kernel is not modelled)")
	}
	cudnnFirst := c.prefersCuDNN(p.Q.Device())
	if cudnnFirst && cudnnReason(p, major, minor) == "" {
		return SDPCuDNN, nil
	}
	flash := flashReason(p, major, minor)
	if flash == "" {
		return SDPFlash, nil
	}
	eff := efficientReason(p, major, minor)
	if eff == "" {
		return SDPEfficient, nil
	}
	if c.SDPEnabled(SDPMath) {
		return SDPMath, nil
	}
	if !cudnnFirst && cudnnReason(p, major, minor) == "" { // the default order's fourth
		return SDPCuDNN, nil
	}
	return 0, fmt.Errorf("No available kernel. Aborting execution. (Memory efficient kernel not used because: %s Flash attention kernel not used because: %s cuDNN attention kernel not used because: %s)", eff, flash, cudnnReason(p, major, minor))
}

// CanUseSDPBackend reports why backend b cannot run p ("" when it can),
// whatever the Context enables (sdp_utils' can_use_* with debug on).
func CanUseSDPBackend(p SDPParams, b SDPBackend) string {
	major, minor, onGPU := p.Q.ctx.ComputeCapability(p.Q.Device())
	if !onGPU && b != SDPMath {
		return "memsh models only the math backend for CPU tensors."
	}
	switch b {
	case SDPFlash:
		return flashReason(p, major, minor)
	case SDPEfficient:
		return efficientReason(p, major, minor)
	case SDPCuDNN:
		return cudnnReason(p, major, minor)
	}
	return ""
}

// cudnnReason is can_use_cudnn_attention's first failing constraint (its
// warning), or "", for dense inputs: PyTorch 2.11 with cuDNN 9.15+, whose
// head dimension limit is 128 (256 only with cuDNN after 9.22).
func cudnnReason(p SDPParams, major, minor int) string {
	c := p.Q.ctx
	q, k, v := p.Q, p.K, p.V
	if !c.SDPEnabled(SDPCuDNN) {
		return "cuDNN attention has been runtime disabled."
	}
	if r := checkShapes4(p); r != "" {
		return r
	}
	if r := checkLowPrecision(p, major); r != "" {
		return r
	}
	if !smIn(major, minor, 8, 0, 12, 1) {
		return fmt.Sprintf("cuDNN MHA only supports gpu architectures in the range [sm80, sm121]. Attempting to run on a sm %d.%d gpu.", major, minor)
	}
	if p.Dropout*16 != math.Floor(p.Dropout*16) {
		return "cuDNN dropout probability resolution is limited to 1/16.Use a dropout probability that is a multiple of 1/16 to select the cuDNN backend"
	}
	if r := checkNonzeroSeq(p); r != "" {
		return r
	}
	if r := checkLastStride(p, true); r != "" {
		return r
	}
	if r := checkBatchHeads(p, true, false); r != "" {
		return r
	}
	const maxDim = 65535
	if q.shape[0] > maxDim || q.shape[1] > maxDim {
		return fmt.Sprintf("cuDNN SDPA does not support batch size or num_heads greater than %d. Got batch size: %d, num_heads: %d", maxDim, q.shape[0], q.shape[1])
	}
	dqk, dv := q.shape[3], v.shape[3]
	if dqk > 128 || dv > 128 {
		return "head_dim should be no more than 128"
	}
	if dqk%8 != 0 || dv%8 != 0 {
		return "head_dim should be a multiple of 8"
	}
	if k.shape[2] == 1 {
		return "cudnn SDPA does not support key/value sequence length 1."
	}
	if p.Dropout != 0 && q.shape[2] == 1 {
		return "cudnn SDPA does not support query sequence length 1 with dropout."
	}
	return ""
}

func smIn(major, minor, loMaj, loMin, hiMaj, hiMin int) bool {
	ge := major > loMaj || (major == loMaj && minor >= loMin)
	le := major < hiMaj || (major == hiMaj && minor <= hiMin)
	return ge && le
}

// flashReason is can_use_flash_attention's first failing constraint (its
// warning), or "".
func flashReason(p SDPParams, major, minor int) string {
	c := p.Q.ctx
	q, k, v := p.Q, p.K, p.V
	if !c.SDPEnabled(SDPFlash) {
		return "Flash attention has been runtime disabled."
	}
	if r := checkShapes4(p); r != "" {
		return r
	}
	if p.Mask != nil {
		return "Flash Attention does not support non-null attn_mask."
	}
	qe, ke, ve := q.shape[3], k.shape[3], v.shape[3]
	if !(qe == ke && qe == ve && qe <= 256) {
		return fmt.Sprintf("Flash attention requires q,k,v to have the same last dimension and to be less than or equal to 256. Got Query.size(-1): %d, Key.size(-1): %d, Value.size(-1): %d instead.", qe, ke, ve)
	}
	if !smIn(major, minor, 8, 0, 9, 0) {
		return fmt.Sprintf("Flash attention only supports gpu architectures in the range [sm80, sm90]. Attempting to run on a sm %d.%d gpu.", major, minor)
	}
	if p.RequiresGrad && smIn(major, minor, 8, 6, 8, 9) {
		if !(qe <= 192 || (p.Dropout == 0 && qe > 224)) {
			return fmt.Sprintf("Flash attention currently doesn't support training with head_dim ∈ (192, 224] or (head_dim ∈ (224, 256] and dropout > 0.0) on gpu architectures in the range[sm86, sm89].Attempting to run with dropout set to: %gand head_dim: %d on a sm %d.%d gpu.", p.Dropout, qe, major, minor)
		}
	}
	if p.Causal && q.shape[2] != k.shape[2] {
		return fmt.Sprintf("Flash attention does not support the is_causal flag when seqlen_q != seqlen_k. Got seqlen_q: %d seqlen_k: %d. If you would like to use causal attention with non-square masks, please see CausalAttnMask.", q.shape[2], k.shape[2])
	}
	if r := checkLowPrecision(p, major); r != "" {
		return r
	}
	if r := checkBatchHeads(p, true, true); r != "" {
		return r
	}
	if r := checkNonzeroSeq(p); r != "" {
		return r
	}
	return checkLastStride(p, true)
}

// minimumGemmAlignment is sdp_utils.cpp's minimum_gemm_alignment.
func minimumGemmAlignment(dt DType, major int) int {
	half := dt == Float16 || dt == BFloat16
	useTC := major >= 8 || (major >= 7 && half)
	align := 1
	if major >= 8 {
		align = 4
	}
	bits := 32
	if half {
		bits = 16
	}
	if useTC {
		align = max(align, 128/bits)
	}
	return align
}

// efficientReason is can_use_mem_efficient_attention's first failing
// constraint, or "".
func efficientReason(p SDPParams, major, minor int) string {
	c := p.Q.ctx
	q, k, v := p.Q, p.K, p.V
	if !c.SDPEnabled(SDPEfficient) {
		return "Memory Efficient attention has been runtime disabled."
	}
	if !smIn(major, minor, 5, 0, 9, 0) {
		return fmt.Sprintf("Mem Efficient Attention only supports gpu architectures in the range [sm50, sm90]. Attempting to run on a sm %d.%d gpu.", major, minor)
	}
	if r := checkShapes4(p); r != "" {
		return r
	}
	align := minimumGemmAlignment(q.dtype, major)
	qe, ve := q.shape[3], v.shape[3]
	if !(qe == k.shape[3] && qe%align == 0 && qe > 0 && ve%align == 0 && ve > 0) {
		return fmt.Sprintf("Mem efficient attention requires last dimension of inputs to be divisible by %d. Got Query.size(-1): %d, Key.size(-1): %d, Value.size(-1): %d instead.", align, qe, k.shape[3], ve)
	}
	if r := checkNonzeroSeq(p); r != "" {
		return r
	}
	if r := checkLastStride(p, false); r != "" {
		return r
	}
	if r := checkBatchHeads(p, false, true); r != "" {
		return r
	}
	allowed := []DType{Float16, Float32, BFloat16}
	if major < 8 {
		allowed = []DType{Float16, Float32}
	}
	return checkDTypes(p, allowed)
}

// checkLowPrecision is check_dtypes_low_precision: float16 and bfloat16
// from sm80 on, float16 only before.
func checkLowPrecision(p SDPParams, major int) string {
	if major < 8 {
		return checkDTypes(p, []DType{Float16})
	}
	return checkDTypes(p, []DType{Float16, BFloat16})
}

func checkShapes4(p SDPParams) string {
	if p.Q.Dim() == 4 && p.K.Dim() == 4 && p.V.Dim() == 4 {
		return ""
	}
	return fmt.Sprintf("All fused kernels requires query, key and value to be 4 dimensional, but got Query dim: %d, Key dim: %d, Value dim: %d instead.", p.Q.Dim(), p.K.Dim(), p.V.Dim())
}

func checkDTypes(p SDPParams, allowed []DType) string {
	dt := p.Q.dtype
	ok := p.K.dtype == dt && p.V.dtype == dt
	found := false
	names := make([]string, len(allowed))
	for i, a := range allowed {
		names[i] = dtypes[a].torch
		found = found || a == dt
	}
	if ok && found {
		return ""
	}
	return fmt.Sprintf("Expected query, key and value to all be of dtype: {%s}. Got Query dtype: %s, Key dtype: %s, and Value dtype: %s instead.",
		strings.Join(names, ", "), torchDType(p.Q.dtype), torchDType(p.K.dtype), torchDType(p.V.dtype))
}

// checkBatchHeads is check_batch_size_and_num_heads_dense<supportsGQA,
// sameKVHeads>: with enable_gqa, a backend that supports grouped-query
// attention (flash and cuDNN; efficient attention does not in the
// PyTorch memsh models) accepts key and value heads that divide the
// query's (check_grouped_query_attention; flash also wants key and value
// to have as many heads as each other).
func checkBatchHeads(p SDPParams, supportsGQA, sameKVHeads bool) string {
	q, k, v := p.Q, p.K, p.V
	if !(q.shape[0] == k.shape[0] && q.shape[0] == v.shape[0]) {
		return fmt.Sprintf("For dense inputs, both fused kernels require query, key and value to have the same batch_size. Query.sizes(): %v, Key.sizes(): %v, Value.sizes(): %v instead. To broadcast dense inputs, try using unsqueeze and expand_to before passing them into the kernel.", q.shape, k.shape, v.shape)
	}
	if p.EnableGQA && supportsGQA {
		if sameKVHeads && k.shape[1] != v.shape[1] {
			return fmt.Sprintf("Both fused kernels require key and value to have the same num_heads and batch_size but got: Key sizes: %v, Value sizes: %v, Query sizes: %v instead.", k.shape, v.shape, q.shape)
		}
		if q.shape[1]%k.shape[1] != 0 || q.shape[1]%v.shape[1] != 0 {
			return fmt.Sprintf("The number of heads in key/value must divide number of heads in query.Got input Key sizes(): %d, Value sizes(): %d, Query sizes(): %d instead.", k.shape[1], v.shape[1], q.shape[1])
		}
		return ""
	}
	if !(q.shape[1] == k.shape[1] && q.shape[1] == v.shape[1]) {
		return fmt.Sprintf("For dense input, both fused kernels require query, key and value to have the same num_heads. Query.sizes(): %v, Key sizes(): %v, Value sizes(): %v instead. To broadcast dense inputs, try using unsqueeze and expand_to before passing them into the kernel.", q.shape, k.shape, v.shape)
	}
	return ""
}

func checkNonzeroSeq(p SDPParams) string {
	if p.Q.shape[2] == 0 || p.K.shape[2] == 0 {
		return "All fused kernels do not support zero seq_len_q or seq_len_kv."
	}
	return ""
}

func checkLastStride(p SDPParams, ignoreSingleton bool) string {
	q, k, v := p.Q, p.K, p.V
	ok := q.strides[3] == 1 && k.strides[3] == 1 && v.strides[3] == 1
	if ignoreSingleton {
		ok = ok || q.shape[3] == 1
	}
	maskOK := p.Mask == nil || p.Mask.Dim() == 0 || p.Mask.strides[p.Mask.Dim()-1] == 1
	if ok && maskOK {
		return ""
	}
	if p.Mask != nil && p.Mask.Dim() > 0 {
		return fmt.Sprintf("All fused kernels require the last dimension of the input to have stride 1. Got Query.stride(-1): %d, Key.stride(-1): %d, Value.stride(-1): %d, Attn_mask.stride(-1): %d instead.", q.strides[3], k.strides[3], v.strides[3], p.Mask.strides[p.Mask.Dim()-1])
	}
	return fmt.Sprintf("All fused kernels require the last dimension of the input to have stride 1. Got Query.stride(-1): %d, Key.stride(-1): %d, Value.stride(-1): %d instead.", q.strides[3], k.strides[3], v.strides[3])
}
