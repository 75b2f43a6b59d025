package sim

// cards are the presets' hardware figures: the CUDA compute capability
// (NVIDIA's CUDA GPUs table, developer.nvidia.com/cuda-gpus: what
// torch.cuda.get_device_capability() returns on the real card), and the
// streaming-multiprocessor count and resident threads per multiprocessor
// (NVIDIA's specifications and CUDA occupancy tables; the H100's 132 as
// torch reports multi_processor_count on the SXM card), which PyTorch's
// reduce kernel sizes its grid by.
var cards = map[string]struct {
	cc                [2]int
	sms, threadsPerSM int
}{
	"H100":      {[2]int{9, 0}, 132, 2048},
	"H200":      {[2]int{9, 0}, 132, 2048},
	"A100-80GB": {[2]int{8, 0}, 108, 2048},
	"A100-40GB": {[2]int{8, 0}, 108, 2048},
	"L4":        {[2]int{8, 9}, 58, 1536},
	"RTX4090":   {[2]int{8, 9}, 128, 1536},
	"T4":        {[2]int{7, 5}, 40, 1024},
	"V100-16GB": {[2]int{7, 0}, 80, 2048},
}

// DefaultCapability is the compute capability of a simulated GPU whose
// spec names no preset (sim:16GiB): an H100-class sm90 device, so that
// kernel choices that depend on the architecture (scaled_dot_product_
// attention's backends) follow a current data-centre GPU.
var DefaultCapability = [2]int{9, 0}

// ComputeCapability returns the device's major and minor compute
// capability: its preset's, or DefaultCapability without one.
func (d *Device) ComputeCapability() (major, minor int) {
	if c, ok := cards[d.spec.Preset]; ok {
		return c.cc[0], c.cc[1]
	}
	return DefaultCapability[0], DefaultCapability[1]
}

// PyTorch 2.x's default cuBLAS workspace (at::cuda::getChosenWorkspaceSize,
// CublasHandlePool.cpp): ":4096:8" (32 MiB) on sm90, ":4096:2:16:8"
// (8 MiB + 128 KiB) on other architectures; and its default cuBLASLt
// workspace (CUBLASLT_WORKSPACE_SIZE, 1024 KiB). torch 2.11 on an H100 and
// an H200 allocated exactly 33,554,432 and 1,048,576 bytes
// (bench/gpu/torch_fit.py context and trace).
const (
	cublasSM90    = 4096 * 8 * 1024
	cublasDefault = 4096*2*1024 + 16*8*1024
	cublasLt      = 1024 * 1024
)

// ComputeCapability returns the preset card's compute capability
// (major, minor).
func (p Preset) ComputeCapability() [2]int {
	if c, ok := cards[p.Key]; ok {
		return c.cc
	}
	return DefaultCapability
}

// workspaces returns PyTorch's default cuBLAS and cuBLASLt workspace sizes
// on the preset's card.
func (p Preset) workspaces() (cublas, lt uint64) {
	if cards[p.Key].cc == [2]int{9, 0} {
		return cublasSM90, cublasLt
	}
	return cublasDefault, cublasLt
}

// BLASWorkspaces returns the cuBLAS and cuBLASLt workspace sizes PyTorch
// would allocate per thread on the device (tensor.BLASWorkspaceDevice):
// the spec's (0 where none).
func (d *Device) BLASWorkspaces() (cublas, cublasLt uint64) {
	return d.spec.Cublas, d.spec.CublasLt
}

// Multiprocessors returns the preset card's multiprocessor count and
// resident threads per multiprocessor (tensor.ReduceDevice); ok is false
// without a preset (a plain sim:SIZE models no reduction scratch).
func (d *Device) Multiprocessors() (count, threadsPerSM int, ok bool) {
	c, ok := cards[d.spec.Preset]
	return c.sms, c.threadsPerSM, ok
}

// CuDNNAttention reports whether PyTorch tries cuDNN's fused attention
// first on the preset card (tensor.CuDNNAttentionDevice): PyTorch 2.11's
// CUDA 13 wheels, whose cuDNN is newer than 9.15.0, do on sm9x and sm10x
// (sdp_utils.cpp, check_prefer_cudnn_attention), as the H100 run of
// bench/gpu/models.sh showed. A plain sim:SIZE keeps flash first.
func (d *Device) CuDNNAttention() bool {
	c, ok := cards[d.spec.Preset]
	return ok && (c.cc[0] == 9 || c.cc[0] == 10)
}
