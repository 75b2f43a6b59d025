package host

import (
	"errors"
	"maps"
	"strings"
	"testing"

	"github.com/memsh/memsh/backend"
)

// TestAllocatorStats checks every statistic after a known sequence of
// allocations and frees: the values are exact.
func TestAllocatorStats(t *testing.T) {
	a := NewAllocator()
	if a.Device().Name() != "cpu" {
		t.Errorf("Device().Name() = %q", a.Device().Name())
	}
	for _, n := range []uint64{0, 1, 100, 513, 1 << 20} {
		if a.RoundSize(n) != n {
			t.Errorf("RoundSize(%d) = %d, want %d", n, a.RoundSize(n), n)
		}
	}
	peak := a.Peaks().New(a.Allocated(), a.Reserved())
	defer peak.Close()

	b100 := mustMalloc(t, a, 100)
	zero := mustMalloc(t, a, 0)
	b1000 := mustMalloc(t, a, 1000)
	b64k := mustMalloc(t, a, 64*kib)
	if zero.Size != 0 || zero.Requested != 0 || zero.Ptr != 0 || zero.Host != nil {
		t.Errorf("Malloc(0) = %+v, want a zero block", *zero)
	}
	if b1000.Size != 1000 || b1000.Requested != 1000 || len(b1000.Host) != 1000 || b1000.Ptr%Alignment != 0 {
		t.Errorf("Malloc(1000) = Size %d, Requested %d, len(Host) %d, Ptr %#x",
			b1000.Size, b1000.Requested, len(b1000.Host), b1000.Ptr)
	}
	a.Free(b1000)
	a.Free(zero)

	const cur, top = 100 + 64*kib, 100 + 1000 + 64*kib
	if a.Allocated() != cur || a.Reserved() != cur {
		t.Errorf("Allocated, Reserved = %d, %d; want %d, %d", a.Allocated(), a.Reserved(), cur, cur)
	}
	if peak.MaxAllocated != top || peak.MaxReserved != top {
		t.Errorf("peak counter = %d, %d; want %d, %d", peak.MaxAllocated, peak.MaxReserved, top, top)
	}
	want := map[string]int64{
		"num_alloc_retries": 0, "num_ooms": 0, "num_device_alloc": 3, "num_device_free": 1,
	}
	put := func(prefix string, current, peak, allocated, freed int64) {
		want[prefix+".current"] = current
		want[prefix+".peak"] = peak
		want[prefix+".allocated"] = allocated
		want[prefix+".freed"] = freed
	}
	for _, k := range []string{"allocation", "segment", "active"} {
		put(k+".all", 2, 3, 3, 1)
	}
	for _, k := range []string{"allocated_bytes", "reserved_bytes", "active_bytes", "requested_bytes"} {
		put(k+".all", cur, top, top, 1000)
	}
	put("inactive_split.all", 0, 0, 0, 0)
	put("inactive_split_bytes.all", 0, 0, 0, 0)
	if got := a.Stats(); !maps.Equal(got, want) {
		t.Errorf("Stats() = %v\nwant %v", got, want)
	}

	a.ResetPeakStats()
	s := a.Stats()
	if s["allocated_bytes.all.peak"] != cur || s["allocation.all.peak"] != 2 || s["reserved_bytes.all.peak"] != cur {
		t.Errorf("after ResetPeakStats: %v", s)
	}
	if peak.MaxAllocated != top {
		t.Errorf("ResetPeakStats moved an independent counter: %d", peak.MaxAllocated)
	}
	a.EmptyCache()
	if a.Allocated() != cur {
		t.Errorf("EmptyCache changed Allocated to %d", a.Allocated())
	}
	a.Free(b100)
	a.Free(b64k)
	if s := a.Stats(); a.Allocated() != 0 || s["allocation.all.current"] != 0 || s["num_device_free"] != 3 ||
		s["allocated_bytes.all.freed"] != top || s["allocated_bytes.all.allocated"] != top {
		t.Errorf("after freeing all: Allocated %d, Stats %v", a.Allocated(), s)
	}
	if len(a.live) != 0 {
		t.Errorf("%d blocks still tracked after freeing all", len(a.live))
	}
}

func mustMalloc(t *testing.T, a *Allocator, n uint64) *backend.Block {
	t.Helper()
	b, err := a.Malloc(n)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestAllocatorBadFree(t *testing.T) {
	a, other := NewAllocator(), NewAllocator()
	b := mustMalloc(t, a, 10)
	z := mustMalloc(t, a, 0)
	a.Free(b)
	a.Free(z)
	for name, f := range map[string]func(){
		"double free":           func() { a.Free(b) },
		"double free of zero":   func() { a.Free(z) },
		"other allocator block": func() { other.Free(mustMalloc(t, a, 10)) },
		"nil block":             func() { a.Free(nil) },
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: no panic", name)
				}
			}()
			f()
		}()
	}
}

// TestAllocatorOOM requests an impossible size: the result is an OOMError
// worded like PyTorch's, counted in num_ooms, and nothing is allocated or
// leaked.
func TestAllocatorOOM(t *testing.T) {
	a := NewAllocator()
	keep := mustMalloc(t, a, 4096)
	before := a.Stats()
	const huge = 1 << 62
	b, err := a.Malloc(huge)
	if b != nil {
		t.Errorf("Malloc(1<<62) returned a block %+v", *b)
	}
	var oom *backend.OOMError
	if !errors.As(err, &oom) || !backend.IsOOM(err) {
		t.Fatalf("Malloc(1<<62) error = %v (%T), want *backend.OOMError", err, err)
	}
	if oom.Device != "cpu" || oom.Index != -1 || oom.Requested != huge || oom.Allocated != 4096 ||
		oom.Reserved != 4096 || oom.Total != Total() || oom.Free == 0 {
		t.Errorf("OOMError = %+v", *oom)
	}
	if msg := err.Error(); !strings.HasPrefix(msg, "CPU out of memory. Tried to allocate 4294967296.00 GiB.") {
		t.Errorf("OOM message = %q", msg)
	}
	after := a.Stats()
	if after["num_ooms"] != 1 {
		t.Errorf("num_ooms = %d, want 1", after["num_ooms"])
	}
	delete(after, "num_ooms")
	delete(before, "num_ooms")
	if !maps.Equal(before, after) {
		t.Errorf("a failed Malloc changed statistics:\nbefore %v\nafter  %v", before, after)
	}
	if len(a.live) != 1 {
		t.Errorf("%d blocks tracked, want 1", len(a.live))
	}
	a.Free(keep)
}

// TestAllocatorReturnsLargeMemory allocates 256 MiB, touches every page
// (RSS rises by 256 MiB) and frees it (RSS falls back): the memory goes
// back to the operating system, not to a cache.
func TestAllocatorReturnsLargeMemory(t *testing.T) {
	a := NewAllocator()
	const size = 256 * mib
	settle()
	before := rss(t)
	b := mustMalloc(t, a, size)
	touch(b.Host)
	during := rss(t)
	a.Free(b)
	after := rss(t)
	t.Logf("RSS before %.1f MiB, with 256 MiB touched %.1f MiB, after free %.1f MiB",
		mibs(before), mibs(during), mibs(after))
	near(t, "RSS with the block touched", during, before+size)
	near(t, "RSS after free", after, before)
}

// TestAllocatorReturnsSmallMemory allocates 64 MiB as 16384 blocks of
// 4 KiB (below MmapThreshold, so from glibc's arenas, not mmap), touches
// them and frees them all, and RSS falls back. glibc alone would give the
// memory back only when the freed chunks coalesce into the top of their
// arena; in about one run in four here a chunk that the C runtime allocated
// meanwhile (when Go started a thread) pins the top and all 64 MiB stayed
// resident. The Allocator's paced Trim (every TrimPacing freed bytes)
// releases them either way.
func TestAllocatorReturnsSmallMemory(t *testing.T) {
	a := NewAllocator()
	const n, size = 16384, 4 * kib
	blocks := make([]*backend.Block, 0, n)
	settle()
	before := rss(t)
	for range n {
		b := mustMalloc(t, a, size)
		touch(b.Host)
		blocks = append(blocks, b)
	}
	during := rss(t)
	for _, b := range blocks {
		a.Free(b)
	}
	after := rss(t)
	t.Logf("RSS before %.1f MiB, with %d × 4 KiB touched %.1f MiB, after free %.1f MiB",
		mibs(before), n, mibs(during), mibs(after))
	if during < before+n*size-tolerance {
		t.Errorf("RSS with blocks touched = %.1f MiB, want at least %.1f MiB", mibs(during), mibs(before+n*size-tolerance))
	}
	near(t, "RSS after freeing every block", after, before)
}

// TestMetaAllocator: a meta host's blocks have distinct aligned
// addresses and no memory, and are counted as the real host's are.
func TestMetaAllocator(t *testing.T) {
	a := NewMetaAllocator()
	if m, ok := a.Device().(interface{ Meta() bool }); !ok || !m.Meta() {
		t.Fatal("the meta allocator's device is not meta")
	}
	if NewDevice().Meta() {
		t.Fatal("the host device is meta")
	}
	const huge = 1 << 40 // more than any host has: nothing is allocated
	b1, err := a.Malloc(huge)
	if err != nil {
		t.Fatal(err)
	}
	b2, err := a.Malloc(100)
	if err != nil {
		t.Fatal(err)
	}
	if b1.Host != nil || b2.Host != nil || b1.Ptr == 0 || b2.Ptr == b1.Ptr || b2.Ptr%Alignment != 0 {
		t.Errorf("blocks %#x (%d host bytes), %#x (%d): want distinct aligned addresses and no memory", b1.Ptr, len(b1.Host), b2.Ptr, len(b2.Host))
	}
	if got := a.Allocated(); got != huge+100 {
		t.Errorf("allocated %d, want %d", got, uint64(huge+100))
	}
	a.Free(b1)
	a.Free(b2)
	st := a.Stats()
	if a.Allocated() != 0 || st["allocated_bytes.all.peak"] != huge+100 || st["num_device_free"] != 2 {
		t.Errorf("after the frees: allocated %d, stats %v", a.Allocated(), st)
	}
}
