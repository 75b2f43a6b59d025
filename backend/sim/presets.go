package sim

import (
	"sort"
	"strings"
)

// Preset is a real GPU the simulator can stand in for: --device sim:H100
// gives a device named and sized as PyTorch sees that card.
type Preset struct {
	Key   string // the spec word: "H100"
	Name  string // what torch.cuda.get_device_name() returns: "NVIDIA H100 80GB HBM3"
	Total uint64 // bytes the driver reports (cuDeviceTotalMem; torch's total_memory and mem_get_info()[1])
	Ctx   uint64 // default ctx=: the memory a PyTorch process's CUDA context takes on the card
	// Handle is what each cuBLAS handle takes outside the allocator (a
	// thread's first matrix product creates one); 0 where not measured.
	Handle uint64
	// The cuBLAS workspaces follow from the card's compute capability
	// (Preset.workspaces).
	// Source says where Total was published; CtxSource where Ctx was
	// (docs/gpu.md has the full references).
	Source, CtxSource string
}

const mib = 1 << 20

// Context sizes. They vary with the driver, the CUDA version, the card and
// CUDA_MODULE_LOADING; these are documented typical figures of PyTorch with
// CUDA >= 11.7 and lazy module loading (its default since 1.13).
const (
	ctxPreAmpere = 300 * mib // ptrblck, pytorch/pytorch#107667: "~300MB"; #86509 measured 287,047,680 B
	ctxAmpere    = 400 * mib // ptrblck, pytorch/pytorch#109888: "around 400MB if CUDA >= 11.7 ... lazy"
	// ctxHopper was measured: what a PyTorch process holds on the card
	// outside its caching allocator before its first matrix product (the
	// CUDA context and the kernels loaded lazily), total - free -
	// memory_reserved(), on an H100 80GB HBM3 (driver 580.159.04, CUDA 13.0,
	// torch 2.11.0+cu130, 2026-11-26; bench/gpu/torch_fit.py phases): it
	// read 720,175,104 bytes after the first forward and 787,283,968 after
	// the first backward, each step one cuBLAS handle more (handleHopper:
	// the Python thread's, then the autograd engine's). Right after the
	// context was created it was 552,402,944 bytes on the H100 and an H200
	// alike.
	ctxHopper    = 787283968 - 2*handleHopper
	handleHopper = 64 * mib
)

var presets = []Preset{
	{"H100", "NVIDIA H100 80GB HBM3", 85017493504, ctxHopper, handleHopper,
		"torch total_memory measured on the card, driver 580.159.04 (nvidia-smi's 81559 MiB counts the driver's reservation)", "measured: a training process's memory outside the allocator"},
	{"H200", "NVIDIA H200", 150109880320, ctxHopper, handleHopper,
		"torch total_memory measured on the card, driver 580.159.04 (nvidia-smi's 143771 MiB counts the driver's reservation)", "H100's (same software; equal at context creation)"},
	{"A100-80GB", "NVIDIA A100-SXM4-80GB", 85899345920, ctxAmpere, 0,
		"81920 MiB: torch total_memory=81920MB, nvidia-smi (modal-labs/modal-client#2797)", "pytorch/pytorch#109888"},
	{"A100-40GB", "NVIDIA A100-SXM4-40GB", 42505273344, ctxAmpere, 0,
		"40536.19 MiB: paddle total_memory=40536MB, cuda-samples matrixMulDrv", "pytorch/pytorch#109888"},
	{"L4", "NVIDIA L4", 24152899584, ctxAmpere, 0,
		"23034 MiB: nvidia-smi (modal-labs/modal-client#2797), NVML/DCGM total bytes", "pytorch/pytorch#109888"},
	{"RTX4090", "NVIDIA GeForce RTX 4090", 25757220864, ctxAmpere, 0,
		"24564 MiB: ComfyUI torch_vram_total (torch.cuda.mem_get_info)", "pytorch/pytorch#109888"},
	{"T4", "Tesla T4", 15843721216, ctxPreAmpere, 0,
		"15109.75 MiB: cuda-samples deviceQuery, torch total_memory", "pytorch/pytorch#107667"},
	{"V100-16GB", "Tesla V100-SXM2-16GB", 16945512448, ctxPreAmpere, 0,
		"16160.5 MiB: cuda-samples deviceQuery, cudaMemGetInfo total", "pytorch/pytorch#107667"},
}

// Presets returns the GPU presets, in the order `memsh devices --presets`
// lists them.
func Presets() []Preset { return append([]Preset(nil), presets...) }

// LookupPreset finds a preset by its key, ignoring case ("h100", "rtx4090").
func LookupPreset(key string) (Preset, bool) {
	for _, p := range presets {
		if strings.EqualFold(p.Key, key) {
			return p, true
		}
	}
	return Preset{}, false
}

// presetKeys lists the known keys for an error message.
func presetKeys() string {
	keys := make([]string, len(presets))
	for i, p := range presets {
		keys[i] = p.Key
	}
	sort.Strings(keys)
	return strings.Join(keys, ", ")
}
