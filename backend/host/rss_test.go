package host

import (
	"runtime"
	"testing"

	"github.com/shirou/gopsutil/v3/mem"
)

// TestRSS compares RSS (statm) with VmRSS from /proc/self/status and checks
// that repeated readings through the kept-open descriptor follow changes.
func TestRSS(t *testing.T) {
	r1 := rss(t)
	vm, err := statusField("VmRSS")
	if err != nil {
		t.Fatal(err)
	}
	near(t, "RSS()", r1, vm)
	if r1 == 0 || r1%pageSize != 0 {
		t.Errorf("RSS() = %d, want a positive multiple of the page size %d", r1, pageSize)
	}

	a := NewAllocator()
	settle()
	before := rss(t)
	b := mustMalloc(t, a, 128*mib)
	touch(b.Host)
	near(t, "RSS() with 128 MiB touched", rss(t), before+128*mib)
	a.Free(b)
	near(t, "RSS() after free", rss(t), before)

	h, err := hwm()
	if err != nil {
		t.Fatal(err)
	}
	if cur := rss(t); h+tolerance < cur {
		t.Errorf("VmHWM %d below RSS %d", h, cur)
	}
}

func TestHeapLive(t *testing.T) {
	keep := make([]byte, 32*mib)
	runtime.GC()
	if got := HeapLive(); got < 32*mib {
		t.Errorf("HeapLive() = %d with a live 32 MiB slice, want at least %d", got, 32*mib)
	}
	runtime.KeepAlive(keep)
}

// TestMemInfo compares memInfo's MemTotal and MemAvailable (read with
// kBField through the kept-open /proc/meminfo) with gopsutil's reading:
// the total exactly, the available figure within 64 MiB (other processes
// allocate meanwhile).
func TestMemInfo(t *testing.T) {
	a, tot, err := memInfo()
	if err != nil {
		t.Fatal(err)
	}
	v, err := mem.VirtualMemory()
	if err != nil {
		t.Fatal(err)
	}
	if tot != v.Total {
		t.Errorf("MemTotal %d, gopsutil %d", tot, v.Total)
	}
	if d := int64(a) - int64(v.Available); d > 64<<20 || d < -64<<20 {
		t.Errorf("MemAvailable %d, gopsutil %d", a, v.Available)
	}
	if _, err := kBField(&meminfo, "NoSuchField"); err == nil {
		t.Error("kBField found a field /proc/meminfo does not have")
	}
}
