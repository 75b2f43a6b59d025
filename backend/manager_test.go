package backend_test

import (
	"runtime"
	"strings"
	"testing"

	"github.com/memsh/memsh/backend"
	"github.com/memsh/memsh/backend/host"
	"github.com/memsh/memsh/backend/sim"
)

const mib = 1 << 20

func newManager(t *testing.T, spec string, mode backend.PeakMode) *backend.Manager {
	t.Helper()
	sp, err := sim.ParseSpec(spec)
	if err != nil {
		t.Fatal(err)
	}
	var gpus []backend.Allocator
	for i, d := range sim.New(sp) {
		gpus = append(gpus, backend.NewCachingAllocator(d, i))
	}
	m := backend.NewManager(backend.Config{GPUs: gpus, Host: host.NewAllocator(), Peak: mode})
	t.Cleanup(m.Close)
	return m
}

// alloc allocates in a separate frame so no stack slot keeps the handle.
//
//go:noinline
func allocDrop(t *testing.T, m *backend.Manager, dev string, n uint64) {
	if _, err := m.Alloc(dev, n); err != nil {
		t.Fatal(err)
	}
}

func TestReclaimFreesUnreachable(t *testing.T) {
	m := newManager(t, "1GiB", backend.PeakLazy) // exact mode would reclaim before each new segment
	keep, err := m.Alloc("cuda", 3*mib)
	if err != nil {
		t.Fatal(err)
	}
	allocDrop(t, m, "cuda", 5*mib)
	allocDrop(t, m, "cpu", 1*mib)
	a := m.GPU(0)
	if a.Allocated() != 8*mib {
		t.Fatalf("allocated %d before reclaim, want 8 MiB", a.Allocated())
	}
	r := m.Reclaim()
	if r.Count != 2 || r.Freed != 6*mib {
		t.Errorf("reclaim freed %d allocations, %d bytes; want 2, 6 MiB", r.Count, r.Freed)
	}
	if a.Allocated() != 3*mib || m.Host().Allocated() != 0 {
		t.Errorf("after reclaim: gpu %d host %d", a.Allocated(), m.Host().Allocated())
	}
	if r := m.Reclaim(); r.Count != 0 {
		t.Errorf("second reclaim freed %d", r.Count)
	}
	runtime.KeepAlive(keep)
}

func TestReleaseAndErr(t *testing.T) {
	m := newManager(t, "1GiB", backend.PeakExact)
	h, err := m.Alloc("cuda:0", 1000)
	if err != nil {
		t.Fatal(err)
	}
	if h.Err() != nil || len(h.Bytes()) != 1000 || h.BlockSize() != 1024 || h.Device() != "cuda:0" {
		t.Fatalf("fresh handle: err %v len %d block %d dev %s", h.Err(), len(h.Bytes()), h.BlockSize(), h.Device())
	}
	m.Release(h, "released when experiment \"x\" finished")
	if err := h.Err(); err == nil || !strings.Contains(err.Error(), "memory on cuda:0 was released when experiment \"x\" finished") {
		t.Errorf("Err after release = %v", err)
	}
	if h.Bytes() != nil || m.GPU(0).Allocated() != 0 {
		t.Errorf("released memory still visible: bytes %v allocated %d", h.Bytes() != nil, m.GPU(0).Allocated())
	}
	m.Release(h, "again") // no-op
	if r := m.Reclaim(); r.Count != 0 {
		t.Errorf("reclaim after release freed %d", r.Count)
	}
}

// In exact mode an allocation that would raise an open peak counter
// reclaims first, so garbage never counts; in lazy mode it may.
func TestExactPeak(t *testing.T) {
	for _, tc := range []struct {
		mode backend.PeakMode
		peak uint64
	}{{backend.PeakExact, 2 * mib}, {backend.PeakLazy, 5 * mib}} {
		m := newManager(t, "1GiB", tc.mode)
		a := m.GPU(0)
		p := a.Peaks().New(a.Allocated(), a.Reserved())
		var prev *backend.Memory
		for i := 0; i < 5; i++ {
			h, err := m.Alloc("cuda", mib)
			if err != nil {
				t.Fatal(err)
			}
			runtime.KeepAlive(prev) // prev is reachable during the allocation, then garbage
			prev = h
		}
		if p.MaxAllocated != tc.peak {
			t.Errorf("%s: peak %d, want %d", tc.mode, p.MaxAllocated, tc.peak)
		}
		runtime.KeepAlive(prev)
		p.Close()
	}
}

// Before reporting OOM the Manager reclaims and retries, and a failure
// counts once in num_ooms.
func TestOOMRetry(t *testing.T) {
	m := newManager(t, "64MiB", backend.PeakLazy)
	allocDrop(t, m, "cuda", 40*mib) // garbage
	h, err := m.Alloc("cuda", 40*mib)
	if err != nil {
		t.Fatalf("second 40 MiB on 64 MiB with the first unreachable: %v", err)
	}
	_, err = m.Alloc("cuda", 40*mib)
	if !backend.IsOOM(err) {
		t.Fatalf("err = %v, want OOM", err)
	}
	if !strings.HasPrefix(err.Error(), "CUDA out of memory. Tried to allocate 40.00 MiB. GPU 0 has a total capacity of 64.00 MiB") {
		t.Errorf("message: %v", err)
	}
	if n := m.GPU(0).Stats()["num_ooms"]; n != 1 {
		t.Errorf("num_ooms = %d, want 1", n)
	}
	runtime.KeepAlive(h)
}

func TestPacing(t *testing.T) {
	m := newManager(t, "4GiB", backend.PeakLazy)
	before := m.Stats().Reclaims
	for i := 0; i < 3; i++ {
		allocDrop(t, m, "cuda", 100*mib)
	}
	// 300 MiB since the last reclaim passes the 256 MiB pacing threshold
	// at the third allocation.
	if got := m.Stats().Reclaims - before; got != 1 {
		t.Errorf("reclaims = %d, want 1", got)
	}
}

func TestAllocatorResolution(t *testing.T) {
	m := newManager(t, "2x1GiB", backend.PeakExact)
	for _, tc := range []struct{ dev, want, err string }{
		{"cpu", "cpu", ""},
		{"cuda", "cuda:0", ""},
		{"cuda:1", "cuda:1", ""},
		{"cuda:2", "", `invalid device "cuda:2": 2 CUDA devices available`},
		{"cuda:-1", "", "invalid device"},
		{"cuda:+1", "", "invalid device"},
		{"gpu", "", `invalid device "gpu": want "cpu", "cuda" or "cuda:N"`},
	} {
		got, err := m.Canonical(tc.dev)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%q: err %v, want %q", tc.dev, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("%q: %q, %v; want %q", tc.dev, got, err, tc.want)
		}
	}
	if err := m.SetCurrent(1); err != nil || m.Current() != 1 {
		t.Errorf("SetCurrent(1): %v", err)
	}
	if got, _ := m.Canonical("cuda"); got != "cuda:1" {
		t.Errorf("cuda after SetCurrent(1) = %q", got)
	}
	if err := m.SetCurrent(5); err == nil {
		t.Errorf("SetCurrent(5) succeeded")
	}
}

func TestObserveEvents(t *testing.T) {
	m := newManager(t, "1GiB", backend.PeakLazy)
	var kinds []string
	remove := m.Observe(func(e backend.Event) { kinds = append(kinds, e.Kind.String()+":"+e.Device) })
	h, _ := m.Alloc("cuda", mib)
	m.Release(h, "test")
	// an empty tensor's allocation: no event, as PyTorch's allocator
	// records none for size 0
	z, _ := m.Alloc("cuda", 0)
	m.Release(z, "test")
	m.GPU(0).EmptyCache()
	_, _ = m.Alloc("cuda", 2<<30)
	remove()
	_, _ = m.Alloc("cuda", mib)
	want := "segment_alloc:cuda:0 alloc:cuda:0 free:cuda:0 segment_free:cuda:0 oom:cuda:0"
	if got := strings.Join(kinds, " "); got != want {
		t.Errorf("events:\n got %s\nwant %s", got, want)
	}
}

func TestCloseReleasesEverything(t *testing.T) {
	m := newManager(t, "1GiB", backend.PeakExact)
	h, _ := m.Alloc("cuda", mib)
	c, _ := m.Alloc("cpu", mib)
	m.Close()
	if h.Err() == nil || c.Err() == nil || m.GPU(0).Allocated() != 0 || m.GPU(0).Reserved() != 0 || m.Host().Allocated() != 0 {
		t.Errorf("after Close: %v %v gpu %d/%d host %d", h.Err(), c.Err(), m.GPU(0).Allocated(), m.GPU(0).Reserved(), m.Host().Allocated())
	}
}

// Exact-peak mode reclaims before every allocation that would raise a
// peak, also right after reclaims that found no garbage (pure growth): a
// small block dropped then does not count toward the peak, as PyTorch
// frees it at once (a 64 KiB window after a fruitless reclaim counted
// it); nor does a large one.
func TestExactPeakDuringGrowth(t *testing.T) {
	m := newManager(t, "1GiB", backend.PeakExact)
	a := m.GPU(0)
	base := a.Allocated()
	p := a.Peaks().New(a.Allocated(), a.Reserved())
	defer p.Close()
	var live []*backend.Memory
	before := m.Stats().PeakReclaims
	for i := 0; i < 256; i++ { // 256 × 512 B of growth, each raising the peak
		h, err := m.Alloc("cuda", 512)
		if err != nil {
			t.Fatal(err)
		}
		live = append(live, h)
	}
	if n := m.Stats().PeakReclaims - before; n != 256 {
		t.Errorf("%d peak reclaims for 256 peak-raising allocations, want 256", n)
	}
	live[0] = nil // garbage, after 255 fruitless reclaims
	h, err := m.Alloc("cuda", 512)
	if err != nil {
		t.Fatal(err)
	}
	if want := base + 256*512; p.MaxAllocated != want {
		t.Errorf("peak %d after dropping a 512 B block and allocating another, want %d (the garbage counted)", p.MaxAllocated, want)
	}
	runtime.KeepAlive(h)
	// Drop a large allocation, then allocate another: the garbage is
	// reclaimed first and does not count toward the peak.
	big, _ := m.Alloc("cuda", 100*mib)
	peakWithBig := p.MaxAllocated
	runtime.KeepAlive(big)
	big = nil
	if _, err := m.Alloc("cuda", 100*mib); err != nil {
		t.Fatal(err)
	}
	if p.MaxAllocated != peakWithBig {
		t.Errorf("peak %d after replacing a dropped 100 MiB block by another, want %d (garbage counted)", p.MaxAllocated, peakWithBig)
	}
	runtime.KeepAlive(live)
}

// Release frees a storage's memory and keeps its handle; Regrow gives
// the same handle a new allocation of its size (FSDP2's unsharded
// parameters): the allocator's figures follow, the handle works again,
// and a reclaim keeps what a reachable handle holds and frees it once
// the handle is dropped.
func TestReleaseRegrow(t *testing.T) {
	m := newManager(t, "1GiB", backend.PeakLazy)
	a := m.GPU(0)
	h, err := m.Alloc("cuda", 3*mib)
	if err != nil {
		t.Fatal(err)
	}
	seq := h.Seq()
	m.Release(h, "resized to 0 bytes")
	if a.Allocated() != 0 || h.Err() == nil || !strings.Contains(h.Err().Error(), "resized to 0 bytes") {
		t.Fatalf("after Release: allocated %d, err %v", a.Allocated(), h.Err())
	}
	if err := m.Regrow(h); err != nil {
		t.Fatal(err)
	}
	if a.Allocated() != 3*mib || h.Err() != nil || h.Size() != 3*mib || h.Seq() <= seq {
		t.Fatalf("after Regrow: allocated %d, err %v, size %d, seq %d (was %d)", a.Allocated(), h.Err(), h.Size(), h.Seq(), seq)
	}
	if err := m.Regrow(h); err != nil || a.Allocated() != 3*mib {
		t.Fatalf("Regrow of a live handle: %v, allocated %d", err, a.Allocated())
	}
	if r := m.Reclaim(); r.Count != 0 || a.Allocated() != 3*mib {
		t.Errorf("a reclaim freed the regrown memory of a live handle: %+v", r)
	}
	runtime.KeepAlive(h)
	h = nil
	if r := m.Reclaim(); r.Count != 1 || a.Allocated() != 0 {
		t.Errorf("after the handle is dropped: %+v, allocated %d", r, a.Allocated())
	}
}

// AllocDeferred makes a handle with no memory (a meta-device tensor's):
// nothing allocated, no data; Regrow materializes it; a reclaim frees an
// unreachable one without touching the allocator.
func TestAllocDeferred(t *testing.T) {
	m := newManager(t, "1GiB", backend.PeakLazy)
	a := m.GPU(0)
	h, err := m.AllocDeferred("cuda", 3*mib)
	if err != nil {
		t.Fatal(err)
	}
	if a.Allocated() != 0 || !h.Deferred() || h.HostAccessible() || h.Err() != nil || h.Size() != 3*mib {
		t.Fatalf("deferred: allocated %d, deferred %v, host %v, err %v", a.Allocated(), h.Deferred(), h.HostAccessible(), h.Err())
	}
	if err := m.Regrow(h); err != nil {
		t.Fatal(err)
	}
	if a.Allocated() != 3*mib || h.Deferred() || !h.HostAccessible() {
		t.Fatalf("materialized: allocated %d, deferred %v", a.Allocated(), h.Deferred())
	}
	runtime.KeepAlive(h)
	h = nil
	if _, err := m.AllocDeferred("cuda", 5*mib); err != nil {
		t.Fatal(err)
	}
	if r := m.Reclaim(); r.Count != 2 || a.Allocated() != 0 {
		t.Errorf("reclaim: %+v, allocated %d", r, a.Allocated())
	}
}
