package scope_test

import (
	"bytes"
	"os"
	"regexp"
	"strings"
	"testing"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"

	"github.com/memsh/memsh/backend"
	"github.com/memsh/memsh/backend/cuda"
	"github.com/memsh/memsh/backend/cuda/cudatest"
	"github.com/memsh/memsh/backend/nvml"
	"github.com/memsh/memsh/scope"
)

// stubUUID is the UUID of the stub driver's device i.
func stubUUID(i int) string { return "GPU-5354b000-0000-4000-8000-00000000000" + string(rune('0'+i)) }

// mockNVML is go-nvml's DGX A100 mock whose first GPUs carry the stub's
// UUIDs, each 40 GiB with 1 GiB used.
func mockNVML(t *testing.T, stubGPUs int) *nvml.Gate {
	s := dgxa100.New()
	for i, d := range s.Devices {
		dev := d.(*dgxa100.Device)
		if i < stubGPUs {
			dev.UUID = stubUUID(i)
		}
		dev.MemoryInfo = gonvml.Memory{Total: 40 << 30, Free: 39 << 30, Used: 1 << 30}
		dev.GetMemoryInfo_v2Func = func() (gonvml.Memory_v2, gonvml.Return) {
			return gonvml.Memory_v2{Total: 40 << 30, Free: 39 << 30, Used: 1<<30 - 64<<20, Reserved: 64 << 20}, gonvml.SUCCESS
		}
	}
	g := nvml.New(s)
	if !g.Available() {
		t.Fatal(g.Err())
	}
	return g
}

func TestOpenDevicesAutoPicksCUDA(t *testing.T) {
	cudatest.New(t, cudatest.Config{GPUs: 2})
	gpus, notice, err := scope.OpenDevicesWith("auto", scope.DeviceOptions{NVML: mockNVML(t, 2)})
	if err != nil || notice != "" || len(gpus) != 2 {
		t.Fatalf("%d gpus, notice %q, err %v", len(gpus), notice, err)
	}
	d, ok := gpus[1].(*cuda.Device)
	if !ok || d.Kind() != "cuda" || d.Name() != "cuda:1" {
		t.Fatalf("device %T %v", gpus[1], gpus[1])
	}
	if v := d.NVML(); v == nil || v.UUID != stubUUID(1) || v.Index != 1 {
		t.Errorf("NVML view %v", v)
	}
	// OpenDevices uses the system's NVML, absent here: no view, still usable.
	gpus, notice, err = scope.OpenDevices("cuda")
	if err != nil || notice != "" || len(gpus) != 2 {
		t.Fatalf("cuda: %d gpus, notice %q, err %v", len(gpus), notice, err)
	}
}

func TestOpenDevicesWithoutDriver(t *testing.T) {
	t.Setenv(cuda.LibraryEnv, "/nonexistent/libcuda.so.1")
	gpus, notice, err := scope.OpenDevices("auto")
	if err != nil || len(gpus) != 1 || gpus[0].Kind() != "sim" {
		t.Fatalf("auto: %v %v", gpus, err)
	}
	want := regexp.MustCompile(`^memsh: no usable NVIDIA GPU \(CUDA driver unavailable: /nonexistent/libcuda.so.1 not found\); using the simulator \(--device sim:16GiB\)$`)
	if !want.MatchString(notice) || strings.Contains(notice, "\n") {
		t.Errorf("notice %q", notice)
	}
	_, _, err = scope.OpenDevices("cuda")
	if err == nil || !strings.HasPrefix(err.Error(), "--device cuda: CUDA driver unavailable: /nonexistent/libcuda.so.1") {
		t.Errorf("cuda: %v", err)
	}
	// A driver that loads but has no device.
	cudatest.New(t, cudatest.Config{Visible: new("")})
	_, notice, _ = scope.OpenDevices("auto")
	if !strings.Contains(notice, `no CUDA-capable device is detected (CUDA_ERROR_NO_DEVICE) (CUDA_VISIBLE_DEVICES="")`) {
		t.Errorf("notice %q", notice)
	}
}

func TestDeviceTable(t *testing.T) {
	cudatest.New(t, cudatest.Config{GPUs: 4, Visible: new("1,3")})
	gpus, _, err := scope.OpenDevicesWith("cuda", scope.DeviceOptions{NVML: mockNVML(t, 4)})
	if err != nil {
		t.Fatal(err)
	}
	table := scope.DeviceTable(gpus)
	lines := strings.Split(strings.TrimRight(table, "\n"), "\n")
	if len(lines) != 1+2+6+1 {
		t.Fatalf("table:\n%s", table)
	}
	for _, re := range []string{
		`^INDEX +DEVICE +NAME +UUID +TOTAL +FREE +USED +BACKEND$`,
		`^0 +cuda:0 +Stub GPU 1 +GPU-5354b000-0000-4000-8000-000000000001 +40.00 GiB +39.00 GiB +1.00 GiB +cuda 12.4, NVML$`,
		`^1 +cuda:1 +Stub GPU 3 +GPU-5354b000-0000-4000-8000-000000000003 +40.00 GiB +39.00 GiB +1.00 GiB +cuda 12.4, NVML$`,
		`^- +- +Mock NVIDIA A100-SXM4-40GB +GPU-5354b000-0000-4000-8000-000000000000 +40.00 GiB +39.00 GiB +1.00 GiB +nvml only \(hidden by CUDA_VISIBLE_DEVICES=1,3\)$`,
		`^- +- +Mock NVIDIA A100-SXM4-40GB +GPU-5354b000-0000-4000-8000-000000000002 .*nvml only`,
		`^- +cpu +host RAM +- `,
	} {
		if !regexp.MustCompile(`(?m)` + re).MatchString(table) {
			t.Errorf("table lacks a line matching %s:\n%s", re, table)
		}
	}
	// NVML answered: no CUDA context was created to list the devices.
	for _, d := range gpus {
		if d.(*cuda.Device).HasContext() {
			t.Errorf("%s got a context", d.Name())
		}
	}

	// Without NVML the driver's figures are used (the context is created).
	gpus, _, _ = scope.OpenDevicesWith("cuda", scope.DeviceOptions{NVML: nvml.Open("/nonexistent/libnvidia-ml.so.1")})
	table = scope.DeviceTable(gpus[:1])
	if !regexp.MustCompile(`(?m)^0 +cuda:0 +Stub GPU 1 +GPU-\S+ +1.00 GiB +\S+ MiB +\S+ MiB +cuda 12.4$`).MatchString(table) {
		t.Errorf("table without NVML:\n%s", table)
	}
}

// TestSessionOnCUDA: a Session over the stub's devices allocates through
// the caching allocator on cuMemAlloc.
func TestSessionOnCUDA(t *testing.T) {
	s := cudatest.New(t, cudatest.Config{GPUs: 1, Mem: 256 << 20, Ctx: 16 << 20})
	var out bytes.Buffer
	sess, err := scope.New(scope.Options{Device: "auto", Out: &out, Err: &out})
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	err = sess.Exec("cuda.star", `
b = cuda.malloc(3 * MiB)
print(cuda.is_available(), cuda.device_count(), cuda.get_device_name(), cuda.memory_allocated(), cuda.memory_reserved())
free, total = cuda.mem_get_info()
print(total, total - free)
`)
	if err != nil {
		t.Fatal(err)
	}
	// The 3 MiB block sits in a 20 MiB segment; the device holds the
	// context (16 MiB), memsh's workspace (512 KiB) and the segment.
	want := "True 1 Stub GPU 0 3145728 20971520\n268435456 38273024\n"
	if out.String() != want {
		t.Errorf("output %q, want %q", out.String(), want)
	}
	if s.LiveAllocs() != 2 {
		t.Errorf("%d live allocations", s.LiveAllocs())
	}
	sess.Close()
	if s.LiveAllocs() != 1 { // the workspace lives as long as the context
		t.Errorf("%d live allocations after Close", s.LiveAllocs())
	}
}

// TestGPUCheckScript runs scripts/gpu_check.star — the end-to-end check
// meant for a real GPU — against the stub driver, with and without NVML.
func TestGPUCheckScript(t *testing.T) {
	for _, withNVML := range []bool{false, true} {
		var out bytes.Buffer
		_, sess := stubSession(t, withNVML, scope.Options{Out: &out, Err: &out, Argv: []string{"8"}})
		err := sess.Exec("../scripts/gpu_check.star", nil)
		sess.Close()
		if err != nil {
			t.Fatalf("NVML %v: %v\n%s", withNVML, err, out.String())
		}
		want := regexp.MustCompile(`\n(\d+) of (\d+) checks passed on cuda:0 \(Stub GPU 0\)\n$`)
		m := want.FindStringSubmatch(out.String())
		if m == nil || m[1] != m[2] || strings.Contains(out.String(), "FAIL") {
			t.Errorf("NVML %v: output:\n%s", withNVML, out.String())
		}
		for _, line := range []string{"context: device memory", "memsh's kernels loaded (PTX JIT)                     ok", "randn: the CPU's values, bit for bit                 ok"} {
			if !strings.Contains(out.String(), line) {
				t.Errorf("NVML %v: no line %q in:\n%s", withNVML, line, out.String())
			}
		}
		t.Logf("NVML %v:\n%s", withNVML, out.String())
		if withNVML && !strings.Contains(out.String(), "NVML lists this process") {
			t.Errorf("the NVML checks did not run:\n%s", out.String())
		}
	}
}

// stubSession opens a Session on one stub GPU of 512 MiB (32 MiB of
// context), with NVML over the stub or without NVML.
func stubSession(t *testing.T, withNVML bool, opts scope.Options) (*cudatest.Stub, *scope.Session) {
	t.Helper()
	s := cudatest.New(t, cudatest.Config{GPUs: 1, Mem: 512 << 20, Ctx: 32 << 20})
	gate := nvml.Open("/nonexistent/libnvidia-ml.so.1")
	if withNVML {
		gate = nvmlOverStub(t, s, 512<<20)
	}
	gpus, _, err := scope.OpenDevicesWith("cuda", scope.DeviceOptions{NVML: gate})
	if err != nil {
		t.Fatal(err)
	}
	sess, err := scope.NewWithDevices(opts, gpus)
	if err != nil {
		t.Fatal(err)
	}
	return s, sess
}

// nvmlOverStub is an NVML mock whose first GPU is the stub's device 0, with
// memory and processes computed from the stub's.
func nvmlOverStub(t *testing.T, s *cudatest.Stub, total uint64) *nvml.Gate {
	srv := dgxa100.New()
	dev := srv.Devices[0].(*dgxa100.Device)
	dev.UUID = stubUUID(0)
	dev.GetMemoryInfo_v2Func = func() (gonvml.Memory_v2, gonvml.Return) {
		u := s.Used(0)
		return gonvml.Memory_v2{Total: total, Free: total - u - 1<<20, Reserved: 1 << 20, Used: u}, gonvml.SUCCESS
	}
	dev.GetComputeRunningProcessesFunc = func() ([]gonvml.ProcessInfo, gonvml.Return) {
		return []gonvml.ProcessInfo{{Pid: uint32(os.Getpid()), UsedGpuMemory: s.Used(0)}}, gonvml.SUCCESS
	}
	dev.GetUtilizationRatesFunc = func() (gonvml.Utilization, gonvml.Return) { return gonvml.Utilization{}, gonvml.SUCCESS }
	srv.SystemGetProcessNameFunc = func(int) (string, gonvml.Return) { return "memsh", gonvml.SUCCESS }
	return nvml.New(srv)
}

// A simulated device with data larger than host RAM is announced on the
// session's stderr when the session creates it; a meta device is not.
func TestSimHostBackingWarning(t *testing.T) {
	for _, tc := range []struct {
		spec string
		warn bool
	}{
		{"sim:64TiB", true},
		{"sim:2x64TiB,ctx=1GiB", true},
		{"sim:64TiB,meta", false},
		{"sim:1GiB", false},
	} {
		var stdout, stderr bytes.Buffer
		s, err := scope.New(scope.Options{Device: tc.spec, Out: &stdout, Err: &stderr})
		if err != nil {
			t.Fatalf("%s: %v", tc.spec, err)
		}
		s.Close()
		got := stderr.String()
		if tc.warn != strings.Contains(got, "more than this machine's") || tc.warn && !strings.HasPrefix(got, "memsh: warning: ") {
			t.Errorf("%s: stderr %q, want warning %v", tc.spec, got, tc.warn)
		}
		if !tc.warn && got != "" {
			t.Errorf("%s: stderr %q", tc.spec, got)
		}
		if stdout.Len() > 0 {
			t.Errorf("%s: stdout %q", tc.spec, stdout.String())
		}
	}
}

// An out-of-memory error on a real GPU says how much memory this process
// uses when NVML lists it, as PyTorch's does ("Including non-PyTorch
// memory, this process has ... memory in use"), and leaves the sentence
// out without NVML, as PyTorch does. On a real H100 memsh's message lacked
// it before (testdata/torchref/cuda/h100_oom.txt).
func TestOOMProcessMemory(t *testing.T) {
	for _, withNVML := range []bool{false, true} {
		var out bytes.Buffer
		s, sess := stubSession(t, withNVML, scope.Options{Out: &out, Err: &out})
		err := sess.Exec("oom.star", `a = tensor.empty([64 * MiB], dtype = "uint8", device = "cuda")
b = tensor.empty([GiB], dtype = "uint8", device = "cuda")`)
		used := s.Used(0)
		sess.Close()
		if err == nil {
			t.Fatalf("NVML %v: no out-of-memory error", withNVML)
		}
		sentence := "Including non-memsh memory, this process has " + backend.FormatSize(used) + " memory in use."
		if got := strings.Contains(err.Error(), sentence); got != withNVML {
			t.Errorf("NVML %v: %q in %q: %v", withNVML, sentence, err, got)
		}
	}
}
