package backend_test

import (
	"runtime"
	"testing"
	"time"

	"github.com/memsh/memsh/backend"
)

// TestReachProof: a reclaim skips the collection exactly when the reach
// walk reports every live allocation of its own Manager, and otherwise
// collects and frees the garbage.
func TestReachProof(t *testing.T) {
	other := newManager(t, "1GiB", backend.PeakLazy)
	foreign, err := other.Alloc("cuda:0", 1024)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name       string
		report     func(kept, dropped *backend.Memory) []*backend.Memory
		giveUp     bool
		dropSecond bool
		proven     bool
		freed      int
	}{
		{name: "all reached", report: func(k, d *backend.Memory) []*backend.Memory { return []*backend.Memory{k, d, k} }, proven: true},
		{name: "one unreached but held", report: func(k, d *backend.Memory) []*backend.Memory { return []*backend.Memory{k} }},
		{name: "one unreached and dropped", report: func(k, _ *backend.Memory) []*backend.Memory { return []*backend.Memory{k} }, dropSecond: true, freed: 1},
		{name: "walk gave up", report: func(k, d *backend.Memory) []*backend.Memory { return []*backend.Memory{k, d} }, giveUp: true},
		{name: "another Manager's memory does not count", report: func(k, _ *backend.Memory) []*backend.Memory { return []*backend.Memory{k, foreign} }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := newManager(t, "1GiB", backend.PeakLazy)
			kept, err := m.Alloc("cuda:0", 4096)
			if err != nil {
				t.Fatal(err)
			}
			second, err := m.Alloc("cuda:0", 512)
			if err != nil {
				t.Fatal(err)
			}
			reported := tc.report(kept, second)
			if tc.dropSecond {
				reported = append([]*backend.Memory(nil), reported...)
				second = nil
			}
			m.SetReach(func(_ uint64, _ time.Time, visit func(*backend.Memory)) backend.Walk {
				for _, h := range reported {
					visit(h)
				}
				return backend.Walk{Done: !tc.giveUp}
			})
			r := m.Reclaim()
			if r.Proven != tc.proven || r.Count != tc.freed {
				t.Errorf("reclaim: proven %v, freed %d; want proven %v, freed %d", r.Proven, r.Count, tc.proven, tc.freed)
			}
			if st := m.Stats(); (st.ProvenReclaims == 1) != tc.proven {
				t.Errorf("stats: %d proven reclaims", st.ProvenReclaims)
			}
			runtime.KeepAlive(kept)
			runtime.KeepAlive(second)
		})
	}
	runtime.KeepAlive(foreign)
}

// TestReachNothingLive: with nothing allocated there is nothing to free,
// walk or not.
func TestReachNothingLive(t *testing.T) {
	m := newManager(t, "1GiB", backend.PeakLazy)
	if r := m.Reclaim(); !r.Proven {
		t.Errorf("reclaim of an empty Manager: %+v, want proven", r)
	}
	h, err := m.Alloc("cuda:0", 1)
	if err != nil {
		t.Fatal(err)
	}
	m.Release(h, "test")
	if r := m.Reclaim(); !r.Proven {
		t.Errorf("reclaim after the only allocation was released: %+v, want proven", r)
	}
}

// TestCollectAlwaysCollects: Collect (gc()) runs the collector even when
// a proof is at hand.
func TestCollectAlwaysCollects(t *testing.T) {
	m := newManager(t, "1GiB", backend.PeakLazy)
	m.SetReach(func(uint64, time.Time, func(*backend.Memory)) backend.Walk { return backend.Walk{Done: true} })
	if r := m.Collect(); r.Proven {
		t.Errorf("Collect proved instead of collecting: %+v", r)
	}
}
