package sim

// capabilities are the presets' CUDA compute capabilities (NVIDIA's CUDA
// GPUs table, developer.nvidia.com/cuda-gpus): what
// torch.cuda.get_device_capability() returns on the real card.
var capabilities = map[string][2]int{
	"H100":      {9, 0},
	"H200":      {9, 0},
	"A100-80GB": {8, 0},
	"A100-40GB": {8, 0},
	"L4":        {8, 9},
	"RTX4090":   {8, 9},
	"T4":        {7, 5},
	"V100-16GB": {7, 0},
}

// DefaultCapability is the compute capability of a simulated GPU whose
// spec names no preset (sim:16GiB): an H100-class sm90 device, so that
// kernel choices that depend on the architecture (scaled_dot_product_
// attention's backends) follow a current data-centre GPU.
var DefaultCapability = [2]int{9, 0}

// ComputeCapability returns the device's major and minor compute
// capability: its preset's, or DefaultCapability without one.
func (d *Device) ComputeCapability() (major, minor int) {
	if c, ok := capabilities[d.spec.Preset]; ok {
		return c[0], c[1]
	}
	return DefaultCapability[0], DefaultCapability[1]
}
