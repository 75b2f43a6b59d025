package gpu_test

import (
	"bytes"
	"os"
	"testing"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
	"go.starlark.net/starlark"
	"go.starlark.net/starlarktest"

	"github.com/memsh/memsh/backend/cuda/cudatest"
	"github.com/memsh/memsh/backend/nvml"
	"github.com/memsh/memsh/scope"
)

const mib = 1 << 20

// nvmlOverStub is go-nvml's DGX A100 mock whose first GPUs are the stub
// driver's devices: same UUIDs, and memory and processes computed from
// what the stub has handed out, as a real NVML would see the driver's.
func nvmlOverStub(t *testing.T, s *cudatest.Stub, gpus int, total uint64) *nvml.Gate {
	srv := dgxa100.New()
	for i := range gpus {
		dev := srv.Devices[i].(*dgxa100.Device)
		dev.UUID = "GPU-5354b000-0000-4000-8000-00000000000" + string(rune('0'+i))
		dev.GetMemoryInfoFunc = func() (gonvml.Memory, gonvml.Return) {
			u := s.Used(i)
			return gonvml.Memory{Total: total, Free: total - u, Used: u}, gonvml.SUCCESS
		}
		dev.GetMemoryInfo_v2Func = func() (gonvml.Memory_v2, gonvml.Return) {
			u := s.Used(i)
			return gonvml.Memory_v2{Total: total, Free: total - u - 2*mib, Reserved: 2 * mib, Used: u}, gonvml.SUCCESS
		}
		dev.GetComputeRunningProcessesFunc = func() ([]gonvml.ProcessInfo, gonvml.Return) {
			if s.Used(i) == 0 {
				return nil, gonvml.SUCCESS
			}
			return []gonvml.ProcessInfo{{Pid: uint32(os.Getpid()), UsedGpuMemory: s.Used(i)}, {Pid: 77, UsedGpuMemory: ^uint64(0)}}, gonvml.SUCCESS
		}
		dev.GetUtilizationRatesFunc = func() (gonvml.Utilization, gonvml.Return) {
			return gonvml.Utilization{Gpu: 5, Memory: 1}, gonvml.SUCCESS
		}
	}
	srv.SystemGetProcessNameFunc = func(pid int) (string, gonvml.Return) { return "memsh.test", gonvml.SUCCESS }
	return nvml.New(srv)
}

// run executes Starlark statements in a Session over the stub's devices,
// with the assert module; each chunk's statements must all succeed.
func run(t *testing.T, gate *nvml.Gate, src string) {
	t.Helper()
	gpus, _, err := scope.OpenDevicesWith("cuda", scope.DeviceOptions{NVML: gate})
	if err != nil {
		t.Fatal(err)
	}
	assertMod, err := starlarktest.LoadAssertModule()
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	s, err := scope.NewWithDevices(scope.Options{Out: &out, Err: &out, Builtins: starlark.StringDict{"assert": assertMod["assert"]}}, gpus)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	starlarktest.SetReporter(s.Thread(), t)
	if err := s.Exec("gpu_test.star", src); err != nil {
		if ee, ok := err.(*starlark.EvalError); ok {
			t.Fatal(ee.Backtrace())
		}
		t.Fatal(err)
	}
}

func TestGPUModuleOnCUDAWithNVML(t *testing.T) {
	s := cudatest.New(t, cudatest.Config{GPUs: 2, Mem: 1 << 30, Ctx: 64 * mib})
	gate := nvmlOverStub(t, s, 2, 1<<30)
	run(t, gate, `
assert.eq(gpu.count(), 2)
# No context yet: NVML sees nothing used, and asking creates none.
m = gpu.mem()
assert.eq((m.total, m.free, m.used), (GiB, GiB - 2 * MiB, 2 * MiB))  # 2 MiB reserved by the driver
assert.eq(gpu.processes(), [])

p = gpu.preload()
assert.eq(p.device, "cuda:0")
assert.true(p.created)
assert.eq(p.bytes, 64 * MiB + 512 * KiB)   # the context and memsh's workspace
assert.eq(p.workspace, 512 * KiB)
assert.true(p.seconds >= 0)
assert.eq(p.source, "nvml: device free memory before and after")
assert.eq(gpu.preload().created, False)
assert.eq(gpu.preload(1).bytes, 64 * MiB + 512 * KiB)

# NVML's figures against the allocator's: a 30 MiB request is a 30 MiB
# segment. mem().used is total - free, so it includes the 2 MiB the mock
# driver reserves; info() has NVML's own used and reserved.
b = cuda.malloc(30 * MiB)
assert.eq(cuda.memory_reserved(), 30 * MiB)
ours = 64 * MiB + 512 * KiB + cuda.memory_reserved()
assert.eq(gpu.used(), ours + 2 * MiB)
procs = gpu.processes()
assert.eq(len(procs), 2)
assert.eq((procs[0].used, procs[0].name, procs[0].self), (ours, "memsh.test", True))
assert.eq((procs[1].pid, procs[1].used, procs[1].self), (77, None, False))

i = gpu.info(0)
assert.eq((i.id, i.device, i.name, i.backend, i.source), (0, "cuda:0", "Stub GPU 0", "cuda", "nvml"))
assert.eq(i.uuid, "GPU-5354b000-0000-4000-8000-000000000000")
assert.eq((i.compute_capability, i.driver, i.nvml_index), ("8.0", "12.4", 0))
assert.eq((i.reserved, i.nvml_used, i.used), (2 * MiB, ours, ours + 2 * MiB))
assert.eq(i.total - i.reserved - i.free, i.nvml_used)
assert.eq((i.utilization.gpu, i.utilization.memory), (5, 1))
assert.eq(i.context.workspace, 512 * KiB)
assert.eq(i.mig, [])

# leave_free: what NVML reports free ends within 2 MiB above the target.
buf = gpu.leave_free(100 * MiB)
f = gpu.free()
assert.true(f >= 100 * MiB and f < 102 * MiB, f)
assert.eq(gpu.with_max_free(), (1, GiB - 64 * MiB - 512 * KiB - 2 * MiB))
buf.free()
cuda.empty_cache()
assert.eq(gpu.used(), ours + 2 * MiB)
b.free()
cuda.empty_cache()
assert.eq(gpu.used(), 64 * MiB + 512 * KiB + 2 * MiB)
`)
}

func TestGPUModuleOnCUDAWithoutNVML(t *testing.T) {
	cudatest.New(t, cudatest.Config{GPUs: 1, Mem: 1 << 30, Ctx: 64 * mib})
	run(t, nvml.Open("/nonexistent/libnvidia-ml.so.1"), `
i = gpu.info()
assert.eq(i.source, "driver")      # cuMemGetInfo, which created the context
assert.eq(i.used, 64 * MiB + 512 * KiB)
assert.eq((i.reserved, i.nvml_used, i.utilization, i.nvml_index), (None, None, None, None))
assert.eq(i.context.workspace, 512 * KiB)
assert.fails(lambda: gpu.processes(), "gpu.processes: cuda:0: per-process figures need NVML: NVML unavailable")
p = gpu.preload()
assert.eq((p.created, p.bytes, p.source), (False, None, "already created"))
assert.fails(lambda: gpu.mem(1), "gpu.mem: for parameter id: invalid device ordinal 1 \\(1 devices\\)")
`)
}
