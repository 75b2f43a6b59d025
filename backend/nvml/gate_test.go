package nvml_test

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"

	"github.com/memsh/memsh/backend/nvml"
)

const gib = 1 << 30

// server returns go-nvml's DGX A100 mock with what it does not wire
// stubbed: the v2 memory query, processes, utilization, MIG device
// handles and process names. Device i has UUID GPU-0000000i-..., 40 GiB,
// 1 GiB used, of which (v2) 256 MiB reserved.
func server(t testing.TB) *dgxa100.Server {
	s := dgxa100.New()
	for i, d := range s.Devices {
		dev := d.(*dgxa100.Device)
		dev.UUID = uuidOf(i)
		dev.MemoryInfo = gonvml.Memory{Total: 40 * gib, Free: 39 * gib, Used: gib}
		dev.GetMemoryInfo_v2Func = func() (gonvml.Memory_v2, gonvml.Return) {
			return gonvml.Memory_v2{Total: 40 * gib, Free: 39 * gib, Reserved: 256 << 20, Used: gib - 256<<20}, gonvml.SUCCESS
		}
		dev.GetComputeRunningProcessesFunc = func() ([]gonvml.ProcessInfo, gonvml.Return) {
			return []gonvml.ProcessInfo{
				{Pid: uint32(os.Getpid()), UsedGpuMemory: 512 << 20},
				{Pid: 0, UsedGpuMemory: 1 << 20},       // dropped: no pid
				{Pid: 4242, UsedGpuMemory: ^uint64(0)}, // NVML_VALUE_NOT_AVAILABLE
				{Pid: 4343, UsedGpuMemory: 100 * gib},  // more than the device: unknown
				{Pid: 4444, UsedGpuMemory: 256 << 20},
			}, gonvml.SUCCESS
		}
		dev.GetUtilizationRatesFunc = func() (gonvml.Utilization, gonvml.Return) {
			return gonvml.Utilization{Gpu: 37, Memory: 12}, gonvml.SUCCESS
		}
		dev.GetMaxMigDeviceCountFunc = func() (int, gonvml.Return) { return 7, gonvml.SUCCESS }
		dev.GetMigDeviceHandleByIndexFunc = func(n int) (gonvml.Device, gonvml.Return) {
			if n > 1 {
				return nil, gonvml.ERROR_NOT_FOUND // slots 2..6 empty
			}
			m := &mock.Device{}
			m.GetUUIDFunc = func() (string, gonvml.Return) {
				return "MIG-" + strings.TrimPrefix(uuidOf(100+n), "GPU-"), gonvml.SUCCESS
			}
			m.GetNameFunc = func() (string, gonvml.Return) { return "", gonvml.ERROR_NOT_SUPPORTED }
			m.GetMemoryInfo_v2Func = func() (gonvml.Memory_v2, gonvml.Return) {
				return gonvml.Memory_v2{}, gonvml.ERROR_NOT_SUPPORTED
			}
			m.GetMemoryInfoFunc = func() (gonvml.Memory, gonvml.Return) {
				return gonvml.Memory{Total: 5 * gib, Free: 4 * gib, Used: gib}, gonvml.SUCCESS
			}
			return m, gonvml.SUCCESS
		}
	}
	s.SystemGetProcessNameFunc = func(pid int) (string, gonvml.Return) {
		if pid == os.Getpid() {
			return "memsh", gonvml.SUCCESS
		}
		return "", gonvml.ERROR_NOT_FOUND
	}
	return s
}

func uuidOf(i int) string {
	return "GPU-" + strings.Repeat("0", 7) + string(rune('0'+i%10)) + "-1111-2222-3333-44445555666" + string(rune('0'+i/100))
}

func TestGateDevices(t *testing.T) {
	s := server(t)
	g := nvml.New(s)
	if !g.Available() || g.Err() != nil {
		t.Fatalf("available %v, err %v", g.Available(), g.Err())
	}
	if v, err := g.DriverVersion(); err != nil || v != "550.54.15" {
		t.Errorf("driver %q, %v", v, err)
	}
	devs, err := g.Devices()
	if err != nil || len(devs) != 8 {
		t.Fatalf("%d devices, %v", len(devs), err)
	}
	d := devs[3]
	if d.Index != 3 || d.MIG != -1 || d.UUID != uuidOf(3) || d.Name != "Mock NVIDIA A100-SXM4-40GB" || d.Parent != nil {
		t.Errorf("device 3 = %+v", d)
	}
	if !g.HasMemoryV2() {
		t.Fatal("v2 expected: the mock has every symbol")
	}
	m, err := d.Memory()
	want := nvml.Memory{Total: 40 * gib, Free: 39 * gib, Used: gib - 256<<20, Reserved: 256 << 20, V2: true}
	if err != nil || m != want {
		t.Errorf("memory %+v, %v; want %+v", m, err, want)
	}
	if m.Total-m.Reserved-m.Free != m.Used {
		t.Errorf("v2 used %d != total - reserved - free", m.Used)
	}
	u, err := d.Utilization()
	if err != nil || u != (nvml.Utilization{GPU: 37, Memory: 12}) {
		t.Errorf("utilization %+v, %v", u, err)
	}
}

func TestGateProcesses(t *testing.T) {
	g := nvml.New(server(t))
	d, err := g.Device(0)
	if err != nil {
		t.Fatal(err)
	}
	ps, err := d.Processes()
	if err != nil {
		t.Fatal(err)
	}
	want := []nvml.Process{
		{PID: uint32(os.Getpid()), Used: 512 << 20, UsedKnown: true, Name: "memsh", Self: true},
		{PID: 4242},
		{PID: 4343},
		{PID: 4444, Used: 256 << 20, UsedKnown: true},
	}
	if len(ps) != len(want) {
		t.Fatalf("processes %+v", ps)
	}
	for i := range want {
		if ps[i] != want[i] {
			t.Errorf("process %d = %+v, want %+v", i, ps[i], want[i])
		}
	}
}

func TestGateMIGAndUUID(t *testing.T) {
	s := server(t)
	s.Devices[5].(*dgxa100.Device).MigMode = gonvml.DEVICE_MIG_ENABLE
	g := nvml.New(s)
	d5, _ := g.Device(5)
	migs, err := d5.MIGDevices()
	if err != nil || len(migs) != 2 {
		t.Fatalf("MIG devices %v, %v", migs, err)
	}
	m := migs[1]
	if m.Parent != d5 || m.MIG != 1 || m.Index != 5 || m.Name != "Mock NVIDIA A100-SXM4-40GB MIG" {
		t.Errorf("MIG device %+v", m)
	}
	// The MIG device has its own memory; v2 is not supported there, so v1
	// answers (and v1 from then on).
	mem, err := m.Memory()
	if err != nil || mem != (nvml.Memory{Total: 5 * gib, Free: 4 * gib, Used: gib}) {
		t.Errorf("MIG memory %+v, %v", mem, err)
	}
	d0, _ := g.Device(0)
	if migs0, err := d0.MIGDevices(); err != nil || len(migs0) != 0 {
		t.Errorf("GPU 0 not in MIG mode: %v, %v", migs0, err)
	}

	// ByUUID: CUDA spells UUIDs in upper or lower case; MIG devices match
	// without their prefix.
	got, err := g.ByUUID(strings.ToUpper(uuidOf(6)))
	if err != nil || got.Index != 6 {
		t.Errorf("ByUUID(GPU 6) = %v, %v", got, err)
	}
	got, err = g.ByUUID("GPU-" + strings.TrimPrefix(m.UUID, "MIG-"))
	if err != nil || got.UUID != m.UUID || got.Parent == nil {
		t.Errorf("ByUUID(MIG) = %v, %v", got, err)
	}
	if _, err := g.ByUUID("GPU-ffffffff-0000-0000-0000-000000000000"); err == nil {
		t.Error("ByUUID of an unknown UUID succeeded")
	}
}

// TestGateV1Only: without the v2 symbol, only v1 is ever called (the mock
// panics on a call to an unset function, so a v2 call would fail the test).
func TestGateV1Only(t *testing.T) {
	s := server(t)
	s.LookupSymbolFunc = func(sym string) error {
		if sym == "nvmlDeviceGetMemoryInfo_v2" {
			return errors.New("undefined symbol")
		}
		return nil
	}
	for _, d := range s.Devices {
		d.(*dgxa100.Device).GetMemoryInfo_v2Func = nil
	}
	g := nvml.New(s)
	if g.HasMemoryV2() {
		t.Fatal("HasMemoryV2 without the symbol")
	}
	d, _ := g.Device(1)
	m, err := d.Memory()
	if err != nil || m != (nvml.Memory{Total: 40 * gib, Free: 39 * gib, Used: gib}) {
		t.Errorf("memory %+v, %v", m, err)
	}
}

// TestGateClosedMakesNoCalls: when Init fails, nothing else is called;
// every query returns an error wrapping ErrUnavailable. The mock records
// calls, and panics on functions that are not set.
func TestGateClosedMakesNoCalls(t *testing.T) {
	for _, code := range []gonvml.Return{gonvml.ERROR_DRIVER_NOT_LOADED, gonvml.ERROR_LIBRARY_NOT_FOUND, gonvml.ERROR_NO_PERMISSION, gonvml.ERROR_UNKNOWN} {
		s := &mock.Interface{InitFunc: func() gonvml.Return { return code }}
		g := nvml.New(s)
		if g.Available() || !errors.Is(g.Err(), nvml.ErrUnavailable) {
			t.Fatalf("%v: available %v, err %v", code, g.Available(), g.Err())
		}
		if _, err := g.Count(); !errors.Is(err, nvml.ErrUnavailable) {
			t.Errorf("%v: Count err %v", code, err)
		}
		if _, err := g.Devices(); !errors.Is(err, nvml.ErrUnavailable) {
			t.Errorf("%v: Devices err %v", code, err)
		}
		if _, err := g.ByUUID("GPU-x"); !errors.Is(err, nvml.ErrUnavailable) {
			t.Errorf("%v: ByUUID err %v", code, err)
		}
		if _, err := g.DriverVersion(); err == nil {
			t.Errorf("%v: DriverVersion succeeded", code)
		}
		if g.ProcessName(1) != "" || g.HasMemoryV2() {
			t.Errorf("%v: closed gate answered", code)
		}
		g.Close() // no Shutdown after a failed Init
		if n := len(s.InitCalls()); n != 1 {
			t.Errorf("%v: %d Init calls", code, n)
		}
		if n := len(s.ShutdownCalls()) + len(s.DeviceGetCountCalls()) + len(s.ExtensionsCalls()); n != 0 {
			t.Errorf("%v: %d calls after a failed Init", code, n)
		}
	}
	if err := nvml.New(&mock.Interface{InitFunc: func() gonvml.Return { return gonvml.ERROR_DRIVER_NOT_LOADED }}).Err(); !strings.Contains(err.Error(), "driver is not loaded") {
		t.Errorf("reason %q", err)
	}
}

func TestGateCloseShutsDownOnce(t *testing.T) {
	s := server(t)
	g := nvml.New(s)
	d, _ := g.Device(0)
	g.Close()
	g.Close()
	if n := len(s.ShutdownCalls()); n != 1 {
		t.Errorf("%d Shutdown calls", n)
	}
	if _, err := d.Memory(); !errors.Is(err, nvml.ErrUnavailable) {
		t.Errorf("Memory after Close: %v", err)
	}
	if n := len(s.Devices[0].(*dgxa100.Device).GetMemoryInfo_v2Calls()); n != 0 {
		t.Errorf("%d memory queries after Close", n)
	}
}

// TestGateMissingLibrary loads NVML through go-nvml's real dynamic-loading
// path from a path that does not exist: unavailable, no crash.
func TestGateMissingLibrary(t *testing.T) {
	g := nvml.Open("/nonexistent/libnvidia-ml.so.1")
	if g.Available() {
		t.Fatal("available without a library")
	}
	if err := g.Err(); !errors.Is(err, nvml.ErrUnavailable) || !strings.Contains(err.Error(), "not found") {
		t.Errorf("err %v", err)
	}
	if _, err := g.Devices(); err == nil {
		t.Error("Devices succeeded")
	}
	g.Close()
}

// TestGateNotALibrary: a file that is not a shared library fails to load
// the same way.
func TestGateNotALibrary(t *testing.T) {
	p := t.TempDir() + "/libnvidia-ml.so.1"
	if err := os.WriteFile(p, []byte("not an ELF file"), 0o644); err != nil {
		t.Fatal(err)
	}
	g := nvml.Open(p)
	if g.Available() || g.Err() == nil {
		t.Fatalf("available %v err %v", g.Available(), g.Err())
	}
}

// TestGateLibraryWithoutSymbols: a real shared library that lacks NVML's
// entry points (a wrong MEMSH_LIBNVML, a broken install) leaves the gate
// unavailable without go-nvml ever calling into it (a call to a missing
// symbol would kill the process).
func TestGateLibraryWithoutSymbols(t *testing.T) {
	cc, err := exec.LookPath("cc")
	if err != nil {
		t.Skip("no C compiler to build a fake library")
	}
	dir := t.TempDir()
	for name, src := range map[string]string{
		"empty":    "int unrelated(void) { return 0; }\n",
		"initonly": "int nvmlInit_v2(void) { return 0; }\n",
		"noerrstr": "int nvmlInit_v2(void) { return 999; }\nint nvmlShutdown(void) { return 0; }\n",
	} {
		c := filepath.Join(dir, name+".c")
		so := filepath.Join(dir, "lib"+name+".so")
		if err := os.WriteFile(c, []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command(cc, "-shared", "-fPIC", "-o", so, c).CombinedOutput(); err != nil {
			t.Fatalf("cc: %v\n%s", err, out)
		}
		g := nvml.Open(so)
		if g.Available() || g.Err() == nil || !strings.Contains(g.Err().Error(), "has no nvml") {
			t.Errorf("%s: available %v err %v", name, g.Available(), g.Err())
		}
	}
}

func TestNormalizeUUID(t *testing.T) {
	for in, want := range map[string]string{
		"GPU-8C0B1E2A-1111-2222-3333-444455556666": "8c0b1e2a-1111-2222-3333-444455556666",
		"MIG-8c0b1e2a-1111-2222-3333-444455556666": "8c0b1e2a-1111-2222-3333-444455556666",
		" gpu-abc ": "abc",
	} {
		if got := nvml.NormalizeUUID(in); got != want {
			t.Errorf("NormalizeUUID(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestGateOldDriver: entry points an old driver lacks are never called
// (the mock panics on a call to an unset function); a missing required
// one makes the gate unavailable.
func TestGateOldDriver(t *testing.T) {
	s := server(t)
	old := map[string]bool{"nvmlDeviceGetMigMode": true, "nvmlDeviceGetMaxMigDeviceCount": true, "nvmlDeviceGetMigDeviceHandleByIndex": true,
		"nvmlDeviceGetComputeRunningProcesses": true, "nvmlDeviceGetUtilizationRates": true, "nvmlSystemGetProcessName": true,
		"nvmlSystemGetDriverVersion": true, "nvmlDeviceGetMemoryInfo_v2": true}
	s.LookupSymbolFunc = func(sym string) error {
		if old[sym] {
			return errors.New("undefined symbol " + sym)
		}
		return nil
	}
	s.SystemGetProcessNameFunc, s.SystemGetDriverVersionFunc = nil, nil
	for _, d := range s.Devices {
		dev := d.(*dgxa100.Device)
		dev.MigMode = gonvml.DEVICE_MIG_ENABLE
		dev.GetMigModeFunc, dev.GetComputeRunningProcessesFunc, dev.GetUtilizationRatesFunc, dev.GetMemoryInfo_v2Func = nil, nil, nil, nil
	}
	g := nvml.New(s)
	if !g.Available() {
		t.Fatal(g.Err())
	}
	d, _ := g.Device(2)
	if migs, err := d.MIGDevices(); err != nil || len(migs) != 0 {
		t.Errorf("MIG on a driver without MIG: %v, %v", migs, err)
	}
	if _, err := d.Processes(); !nvmlFunctionNotFound(err) {
		t.Errorf("Processes: %v", err)
	}
	if _, err := d.Utilization(); !nvmlFunctionNotFound(err) {
		t.Errorf("Utilization: %v", err)
	}
	if _, err := g.DriverVersion(); !nvmlFunctionNotFound(err) {
		t.Errorf("DriverVersion: %v", err)
	}
	if m, err := d.Memory(); err != nil || m.V2 {
		t.Errorf("Memory: %+v, %v", m, err)
	}

	s = server(t)
	s.LookupSymbolFunc = func(sym string) error {
		if sym == "nvmlDeviceGetUUID" {
			return errors.New("undefined symbol")
		}
		return nil
	}
	g = nvml.New(s)
	if g.Available() || !strings.Contains(g.Err().Error(), "the NVML library has no nvmlDeviceGetUUID") {
		t.Errorf("without a required symbol: %v", g.Err())
	}
	if _, err := g.Devices(); !errors.Is(err, nvml.ErrUnavailable) {
		t.Errorf("Devices: %v", err)
	}
}

func nvmlFunctionNotFound(err error) bool {
	var e *nvml.Error
	return errors.As(err, &e) && e.Code == nvml.ERROR_FUNCTION_NOT_FOUND
}
