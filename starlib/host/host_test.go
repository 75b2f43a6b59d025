package host_test

import (
	"io"
	"testing"

	"go.starlark.net/starlark"

	bhost "github.com/memsh/memsh/backend/host"
	"github.com/memsh/memsh/scope"
)

const (
	mib = 1 << 20
	// Host RSS moves by a few MiB on its own (Go runtime, C allocator);
	// the allocations below are 16 times larger.
	tolerance = 16 * mib
)

func eval(t *testing.T, s *scope.Session, expr string) int64 {
	t.Helper()
	if err := s.Exec("t.star", "_v = "+expr); err != nil {
		t.Fatal(err)
	}
	n, ok := s.Get("_v").(starlark.Int).Int64()
	if !ok {
		t.Fatalf("%s is not an int64", expr)
	}
	return n
}

// TestPeakRSS: a 256 MiB host temporary freed within one statement raises
// peak_rss by 256 MiB (within the tolerance), exactly where the kernel's
// high-water mark can be reset; reset_peak restarts it at rss().
func TestPeakRSS(t *testing.T) {
	s, err := scope.New(scope.Options{Device: "sim:1GiB", Out: io.Discard, Err: io.Discard})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	eval(t, s, "host.reset_peak() or 0")
	before := eval(t, s, "host.rss()")
	eval(t, s, "tensor.ones([64, 1024, 1024]).numel()") // 256 MiB, every page written, then garbage
	eval(t, s, "gc()")
	peak := eval(t, s, "host.peak_rss()")
	rss := eval(t, s, "host.rss()")
	if !bhost.NewPeakRSS().Exact() {
		t.Logf("peak RSS is sampled on this machine (no writable /proc/self/clear_refs); a 5 ms sampler may miss part of the peak")
	}
	if peak-before < 256*mib-tolerance {
		t.Errorf("peak_rss rose by %d MiB over a 256 MiB temporary (rss before %d MiB, peak %d MiB)", (peak-before)/mib, before/mib, peak/mib)
	}
	if rss-before > tolerance {
		t.Errorf("rss %d MiB after freeing, was %d MiB", rss/mib, before/mib)
	}
	eval(t, s, "host.reset_peak() or 0")
	r := eval(t, s, "host.rss()")
	p := eval(t, s, "host.peak_rss()") // read after rss: a peak is never below an earlier rss
	if p-r > tolerance || p < r {
		t.Errorf("after reset_peak: peak %d MiB, rss %d MiB", p/mib, r/mib)
	}
}

// TestRSSExcludesSimulatorPages: data a simulated GPU holds is device
// memory; host.rss() leaves its resident pages out, as experiment figures do.
func TestRSSExcludesSimulatorPages(t *testing.T) {
	s, err := scope.New(scope.Options{Device: "sim:1GiB", Out: io.Discard, Err: io.Discard})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	before := eval(t, s, "host.rss()")
	eval(t, s, `len([tensor.ones([64, 1024, 1024], device="cuda")])`)
	if err := s.Exec("t.star", `g = tensor.ones([64, 1024, 1024], device="cuda")`); err != nil {
		t.Fatal(err)
	}
	after := eval(t, s, "host.rss()")
	raw, _ := bhost.RSS()
	if after-before > tolerance {
		t.Errorf("host.rss() grew by %d MiB with 256 MiB of simulated GPU data", (after-before)/mib)
	}
	if int64(raw)-after < 256*mib-tolerance {
		t.Errorf("process RSS %d MiB, host.rss() %d MiB: the simulator's 256 MiB are not the difference", raw/mib, after/mib)
	}
}
