package host

import (
	"sync"
	"testing"
	"time"
)

// peakAtLeast fails unless c's peak is at least want - tolerance.
func peakAtLeast(t *testing.T, what string, c *RSSCounter, want uint64) uint64 {
	t.Helper()
	p, err := c.Peak()
	if err != nil {
		t.Fatal(err)
	}
	if p+tolerance < want {
		t.Errorf("%s peak = %.1f MiB, want at least %.1f MiB - %d MiB", what, mibs(p), mibs(want), tolerance>>20)
	}
	return p
}

// peakAtMost fails unless c's peak is at most want + tolerance.
func peakAtMost(t *testing.T, what string, c *RSSCounter, want uint64) uint64 {
	t.Helper()
	p, err := c.Peak()
	if err != nil {
		t.Fatal(err)
	}
	if p > want+tolerance {
		t.Errorf("%s peak = %.1f MiB, want at most %.1f MiB + %d MiB", what, mibs(p), mibs(want), tolerance>>20)
	}
	return p
}

// testTwoCounters runs the independent-counter scenario on p. hold is how
// long each transient allocation stays resident: 0 for exact counters (a
// blip freed at once must still count), several sampling periods for the
// sampler.
func testTwoCounters(t *testing.T, p *PeakRSS, hold time.Duration) {
	al := NewAllocator()
	settle()
	A, err := p.New()
	if err != nil {
		t.Fatal(err)
	}
	B, err := p.New()
	if err != nil {
		t.Fatal(err)
	}
	if p.Len() != 2 {
		t.Errorf("Len() = %d, want 2", p.Len())
	}
	start := rss(t)

	// A transient 128 MiB, freed before any reading, counts in both.
	transient(t, al, 128*mib, hold)
	peakAtLeast(t, "A after 128 MiB transient", A, start+128*mib)
	peakAtLeast(t, "B after 128 MiB transient", B, start+128*mib)

	// Resetting A forgets it for A only.
	if err := A.Reset(); err != nil {
		t.Fatal(err)
	}
	now := rss(t)
	peakAtMost(t, "A after its reset", A, now)
	peakAtLeast(t, "B after A's reset", B, start+128*mib)

	// A later, smaller transient shows in A; B keeps the larger one.
	transient(t, al, 64*mib, hold)
	peakAtLeast(t, "A after 64 MiB transient", A, now+64*mib)
	peakAtMost(t, "A after 64 MiB transient", A, now+64*mib)
	peakAtLeast(t, "B after 64 MiB transient", B, start+128*mib)

	// Resetting B folds the 64 MiB transient into A (the other direction).
	if err := B.Reset(); err != nil {
		t.Fatal(err)
	}
	now = rss(t)
	peakAtMost(t, "B after its reset", B, now)
	pa := peakAtLeast(t, "A after B's reset", A, now+64*mib)

	// Closed counters keep their final value and stop following.
	A.Close()
	transient(t, al, 128*mib, hold)
	if got, _ := A.Peak(); got != pa {
		t.Errorf("closed A's peak moved from %d to %d", pa, got)
	}
	peakAtLeast(t, "B after a second 128 MiB transient", B, now+128*mib)
	if err := A.Reset(); err == nil {
		t.Error("Reset of a closed counter succeeded")
	}
	A.Close() // idempotent
	B.Close()
	if p.Len() != 0 {
		t.Errorf("Len() = %d after closing all, want 0", p.Len())
	}
}

// TestPeakRSS tests the default PeakRSS: exact where clear_refs is
// writable, otherwise the sampler (logged).
func TestPeakRSS(t *testing.T) {
	p := NewPeakRSS()
	if p.Exact() {
		t.Log("/proc/self/clear_refs is writable: testing exact counters with transients freed at once")
		testTwoCounters(t, p, 0)
	} else {
		t.Log("/proc/self/clear_refs is NOT writable: NewPeakRSS fell back to the sampler; testing that")
		testTwoCounters(t, p, 20*SampleInterval)
	}
}

// TestPeakRSSSampled forces the fallback sampler and checks the same
// scenario (transients held for 20 sampling periods), and that the sampler
// goroutine runs only while a counter is open.
func TestPeakRSSSampled(t *testing.T) {
	p := newPeakRSS(true, SampleInterval)
	if p.Exact() {
		t.Fatal("forced sampled PeakRSS says Exact")
	}
	if p.sampling() {
		t.Error("sampler running with no counter open")
	}
	c, err := p.New()
	if err != nil {
		t.Fatal(err)
	}
	if !p.sampling() {
		t.Error("sampler not running with a counter open")
	}
	done := p.done
	c.Close()
	if p.sampling() {
		t.Error("sampler still running after the last counter closed")
	}
	select {
	case <-done:
	default:
		t.Error("sampler goroutine has not exited after Close returned")
	}
	testTwoCounters(t, p, 20*SampleInterval)
	if p.sampling() {
		t.Error("sampler still running after the scenario closed its counters")
	}
}

// TestPeakRSSIndependentSets checks that two PeakRSS (two Sessions) in one
// process share the kernel mark correctly: opening a counter in the second,
// which resets the mark, does not lose the first's transient.
func TestPeakRSSIndependentSets(t *testing.T) {
	p1, p2 := NewPeakRSS(), NewPeakRSS()
	if !p1.Exact() {
		t.Log("/proc/self/clear_refs is NOT writable: sets are independent samplers; checking them that way")
	}
	hold := time.Duration(0)
	if !p1.Exact() {
		hold = 20 * SampleInterval
	}
	al := NewAllocator()
	settle()
	c1, err := p1.New()
	if err != nil {
		t.Fatal(err)
	}
	defer c1.Close()
	start := rss(t)
	transient(t, al, 128*mib, hold)
	c2, err := p2.New()
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	peakAtLeast(t, "first set's counter", c1, start+128*mib)
	peakAtMost(t, "second set's counter", c2, start)
	if p1.Len() != 1 || p2.Len() != 1 {
		t.Errorf("Len() = %d, %d; want 1, 1", p1.Len(), p2.Len())
	}
}

// TestPeakRSSConcurrent exercises counters from several goroutines (run
// with -race).
func TestPeakRSSConcurrent(t *testing.T) {
	for _, p := range []*PeakRSS{NewPeakRSS(), newPeakRSS(true, time.Millisecond)} {
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(func() {
				c, err := p.New()
				if err != nil {
					t.Error(err)
					return
				}
				for range 20 {
					if _, err := c.Peak(); err != nil {
						t.Error(err)
					}
					if err := c.Reset(); err != nil {
						t.Error(err)
					}
				}
				c.Close()
			})
		}
		wg.Wait()
		if p.Len() != 0 {
			t.Errorf("Len() = %d after all closed", p.Len())
		}
	}
}
