package nvml_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/memsh/memsh/backend/nvml"
)

// fakeNVML is a C stand-in for libnvidia-ml with nvml.h's signatures and
// struct layouts: two GPUs, the second without the v2 memory query's
// support, three processes on GPU 0 (the count query answers
// INSUFFICIENT_SIZE first, as NVML does).
const fakeNVML = `
#include <string.h>
typedef struct { unsigned long long total, free, used; } mem_t;
typedef struct { unsigned int version; unsigned long long total, reserved, free, used; } mem2_t;
typedef struct { unsigned int pid; unsigned long long used; unsigned int gi, ci; } proc_t;
typedef struct { unsigned int gpu, memory; } util_t;
static int inited;
int nvmlInit_v2(void) { inited = 1; return 0; }
int nvmlShutdown(void) { inited = 0; return 0; }
const char *nvmlErrorString(int r) { return "err"; }
int nvmlSystemGetDriverVersion(char *b, unsigned n) { strncpy(b, "555.42.06", n); return 0; }
int nvmlSystemGetProcessName(unsigned pid, char *b, unsigned n) { if (pid != 4242) return 6; strncpy(b, "python", n); return 0; }
int nvmlDeviceGetCount_v2(unsigned *n) { *n = 2; return inited ? 0 : 1; }
int nvmlDeviceGetHandleByIndex_v2(unsigned i, void **d) { if (i > 1) return 2; *d = (void *)(long)(0x100 + i); return 0; }
int nvmlDeviceGetUUID(void *d, char *b, unsigned n) { strncpy(b, d == (void *)0x100 ? "GPU-aaaa" : "GPU-bbbb", n); return 0; }
int nvmlDeviceGetName(void *d, char *b, unsigned n) { strncpy(b, "Fake H100", n); return 0; }
int nvmlDeviceGetMemoryInfo(void *d, mem_t *m) { m->total = 80ULL << 30; m->free = 70ULL << 30; m->used = 10ULL << 30; return 0; }
int nvmlDeviceGetMemoryInfo_v2(void *d, mem2_t *m) {
	if (d != (void *)0x100) return 3;
	if (m->version != (sizeof(mem2_t) | 2 << 24)) return 25;
	m->total = 80ULL << 30; m->reserved = 512ULL << 20; m->free = 70ULL << 30; m->used = (10ULL << 30) - (512ULL << 20); return 0;
}
int nvmlDeviceGetComputeRunningProcesses_v3(void *d, unsigned *n, proc_t *p) {
	if (*n < 3) { *n = 3; return 7; }
	*n = 3;
	p[0].pid = 4242; p[0].used = 1ULL << 30;
	p[1].pid = 0; p[1].used = 5;
	p[2].pid = 77; p[2].used = ~0ULL;
	return 0;
}
int nvmlDeviceGetComputeRunningProcesses(void *d, unsigned *n, void *p) { return 999; } /* v1: not to be called */
int nvmlDeviceGetUtilizationRates(void *d, util_t *u) { u->gpu = 37; u->memory = 12; return 0; }
int nvmlDeviceGetMigMode(void *d, unsigned *c, unsigned *p) { *c = 0; *p = 0; return 0; }
int nvmlDeviceGetMaxMigDeviceCount(void *d, unsigned *n) { *n = 0; return 0; }
int nvmlDeviceGetMigDeviceHandleByIndex(void *d, unsigned i, void **m) { return 6; }
`

// TestGateDlopen calls a fake libnvidia-ml through the real purego path:
// strings, struct layouts (v1 and versioned v2 memory, 24-byte process
// records), the INSUFFICIENT_SIZE retry and the v1 fallback.
func TestGateDlopen(t *testing.T) {
	cc, err := exec.LookPath("cc")
	if err != nil {
		t.Skip("no C compiler to build a fake library")
	}
	dir := t.TempDir()
	c, so := filepath.Join(dir, "fake.c"), filepath.Join(dir, "libnvidia-ml.so.1")
	if err := os.WriteFile(c, []byte(fakeNVML), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(cc, "-shared", "-fPIC", "-o", so, c).CombinedOutput(); err != nil {
		t.Fatalf("cc: %v\n%s", err, out)
	}
	g := nvml.Open(so)
	defer g.Close()
	if !g.Available() {
		t.Fatal(g.Err())
	}
	if v, err := g.DriverVersion(); err != nil || v != "555.42.06" {
		t.Errorf("driver %q %v", v, err)
	}
	devs, err := g.Devices()
	if err != nil || len(devs) != 2 {
		t.Fatalf("devices %v %v", devs, err)
	}
	if devs[0].UUID != "GPU-aaaa" || devs[1].UUID != "GPU-bbbb" || devs[0].Name != "Fake H100" {
		t.Errorf("devices %+v %+v", devs[0], devs[1])
	}
	m, err := devs[0].Memory()
	if err != nil || !m.V2 || m.Total != 80<<30 || m.Reserved != 512<<20 || m.Used != 10<<30-512<<20 || m.Free != 70<<30 {
		t.Errorf("v2 memory %+v %v", m, err)
	}
	m, err = devs[1].Memory()
	if err != nil || m.V2 || m.Total != 80<<30 || m.Used != 10<<30 {
		t.Errorf("v1 memory %+v %v", m, err)
	}
	ps, err := devs[0].Processes()
	if err != nil || len(ps) != 2 {
		t.Fatalf("processes %+v %v", ps, err)
	}
	if ps[0].PID != 4242 || !ps[0].UsedKnown || ps[0].Used != 1<<30 || ps[0].Name != "python" || ps[1].PID != 77 || ps[1].UsedKnown {
		t.Errorf("processes %+v", ps)
	}
	if u, err := devs[0].Utilization(); err != nil || u.GPU != 37 || u.Memory != 12 {
		t.Errorf("utilization %+v %v", u, err)
	}
	if migs, err := devs[0].MIGDevices(); err != nil || len(migs) != 0 {
		t.Errorf("migs %v %v", migs, err)
	}
}
