package host

import (
	"testing"
	"time"
)

// spin burns CPU on this goroutine for about d of wall time.
func spin(d time.Duration) (x uint64) {
	for end := time.Now().Add(d); time.Now().Before(end); {
		for i := range 10000 {
			x += uint64(i) * x
		}
	}
	return x
}

func TestCPUTime(t *testing.T) {
	t0, err := CPUTime()
	if err != nil {
		t.Fatal(err)
	}
	spin(50 * time.Millisecond)
	t1, err := CPUTime()
	if err != nil {
		t.Fatal(err)
	}
	// Busy-looping for 50 ms of wall time uses CPU time; how much depends on
	// scheduling, so only its presence is checked.
	if t1 <= t0 {
		t.Errorf("CPUTime did not advance over a busy loop: %v then %v", t0, t1)
	}
}

// TestUsage checks the per-core arithmetic on made-up /proc/stat counters.
func TestUsage(t *testing.T) {
	a := []coreTimes{{busy: 100, total: 1000}, {busy: 0, total: 1000}, {busy: 5, total: 10}}
	b := []coreTimes{{busy: 150, total: 1100}, {busy: 100, total: 1100}, {busy: 5, total: 10}}
	per, mean := usage(a, b)
	want := []float64{50, 100, -1}
	for i := range want {
		if per[i] != want[i] {
			t.Errorf("core %d: %v%%, want %v%%", i, per[i], want[i])
		}
	}
	if mean != 75 {
		t.Errorf("mean = %v%%, want 75%%", mean)
	}
	if per, _ := usage(a, b[:2]); per != nil {
		t.Errorf("usage over a changed core count = %v, want nil", per)
	}
	// Counters going backwards count as no progress, not as a huge value.
	per, mean = usage([]coreTimes{{busy: 10, total: 20}}, []coreTimes{{busy: 5, total: 30}})
	if per[0] != 0 || mean != 0 {
		t.Errorf("backwards busy counter: %v, %v", per, mean)
	}
}

func TestReadCores(t *testing.T) {
	cores, err := readCores()
	if err != nil {
		t.Fatal(err)
	}
	if len(cores) == 0 {
		t.Fatal("no cores")
	}
	for i, c := range cores {
		if c.busy > c.total {
			t.Errorf("core %d: busy %d > total %d", i, c.busy, c.total)
		}
	}
}

// TestCPUMeter runs a meter over a busy loop long enough for several
// per-core samples. The figures depend on the machine's load, so the test
// checks their ranges and consistency, not their values (no timing
// assertions), and that the sampler goroutine stops with the meter.
func TestCPUMeter(t *testing.T) {
	for _, d := range []time.Duration{0, 20 * time.Millisecond, 350 * time.Millisecond} {
		m, err := StartCPUMeter()
		if err != nil {
			t.Fatal(err)
		}
		spin(d)
		u, err := m.Stop()
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("busy %v: %+v", d, u)
		select {
		case <-m.done:
		default:
			t.Error("sampler still running after Stop")
		}
		if u.Wall < d || u.CPU < 0 || u.ProcessPercent < 0 {
			t.Errorf("busy %v: %+v", d, u)
		}
		if d > 0 && (u.CPU == 0 || u.ProcessPercent == 0) {
			t.Errorf("busy %v: no process CPU measured: %+v", d, u)
		}
		for _, p := range []float64{u.SystemPercent, u.MaxCorePercent} {
			if p < 0 || p > 100 {
				t.Errorf("busy %v: percentage out of range: %+v", d, u)
			}
		}
		if d >= 350*time.Millisecond && u.MaxCorePercent == 0 {
			t.Errorf("busy %v: no core seen busy: %+v", d, u)
		}
		if _, err := m.Stop(); err == nil {
			t.Error("second Stop succeeded")
		}
	}
}
