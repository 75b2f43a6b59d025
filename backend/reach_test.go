package backend_test

import (
	"runtime"
	"strings"
	"testing"

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
			m.SetReach(func(_ uint64, visit func(*backend.Memory), _ *backend.Frames) backend.Walk {
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

// TestStoppedWalkKeepsWalking: after a walk that did not finish (an
// interrupt stopped it, or a walk said it was not done) the next reclaim
// walks again: no reclaim is sent to the collector without a walk
// because an earlier one took long (ReachFunc has no deadline).
func TestStoppedWalkKeepsWalking(t *testing.T) {
	for _, stopped := range []bool{false, true} {
		m := newManager(t, "1GiB", backend.PeakLazy)
		h, err := m.Alloc("cuda:0", 4096)
		if err != nil {
			t.Fatal(err)
		}
		walks := 0
		m.SetReach(func(_ uint64, visit func(*backend.Memory), _ *backend.Frames) backend.Walk {
			walks++
			visit(h)
			return backend.Walk{Done: walks > 1, Stopped: stopped && walks == 1}
		})
		m.Reclaim() // the walk does not finish
		if r := m.Reclaim(); !r.Proven || walks != 2 {
			t.Errorf("stopped %v: the next reclaim walked %d times in all, proven %v; want 2, proven", stopped, walks, r.Proven)
		}
		runtime.KeepAlive(h)
	}
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
	m.SetReach(func(uint64, func(*backend.Memory), *backend.Frames) backend.Walk {
		return backend.Walk{Done: true}
	})
	if r := m.Collect(); r.Proven {
		t.Errorf("Collect proved instead of collecting: %+v", r)
	}
}

// TestWalkFrees: a complete walk frees what it did not reach itself, with
// no collection, when it was allocated before the walk's horizon — even
// an allocation Go code still holds, which shows that the walk, not the
// collector, decided (a real walk's completeness rules that out; see
// TestWalkFreeVerified). At or after the horizon, or after an incomplete
// walk, the collector decides.
func TestWalkFrees(t *testing.T) {
	t.Setenv("MEMSH_VERIFY_RECLAIM", "") // it frees what it holds on purpose
	for _, tc := range []struct {
		name     string
		complete bool
		horizon  uint64 // allocations are stamped 1 (kept) and 2 (unreached)
		stamped  bool   // a stamp clock is installed
		off      bool   // MEMSH_RECLAIM=gc
		freed    bool   // the unreached allocation is freed although held
	}{
		{name: "complete, before the horizon", complete: true, horizon: 3, stamped: true, freed: true},
		{name: "complete, at the horizon", complete: true, horizon: 2, stamped: true},
		{name: "incomplete", horizon: 3, stamped: true},
		{name: "no stamp clock", complete: true, horizon: 3},
		{name: "MEMSH_RECLAIM=gc", complete: true, horizon: 3, stamped: true, off: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.off {
				t.Setenv("MEMSH_RECLAIM", "gc")
			}
			m := newManager(t, "1GiB", backend.PeakLazy)
			clock := uint64(1)
			if tc.stamped {
				m.SetStampClock(func() uint64 { return clock })
			}
			kept := mustAlloc(t, m, 4096)
			clock = 2
			held := mustAlloc(t, m, 512)
			m.SetReach(func(_ uint64, visit func(*backend.Memory), _ *backend.Frames) backend.Walk {
				visit(kept)
				return backend.Walk{Done: true, Complete: tc.complete, Horizon: tc.horizon}
			})
			r := m.Reclaim()
			if got := held.Err() != nil; got != tc.freed {
				t.Fatalf("held allocation freed: %v, want %v (reclaim %+v)", got, tc.freed, r)
			}
			if tc.freed {
				if r.Count != 1 || r.Freed != 512 || r.Proven {
					t.Errorf("reclaim: %+v, want 1 allocation of 512 bytes freed", r)
				}
				if st := m.Stats(); st.WalkReclaims != 1 || st.ReclaimedBytes != 512 {
					t.Errorf("stats: %+v, want 1 walk reclaim of 512 bytes", st)
				}
				if got := m.GPU(0).Allocated(); got != 4096 {
					t.Errorf("allocated after the walk freed: %d, want 4096", got)
				}
				if want := "memory on cuda:0 was freed as unreachable by a reclaim"; !strings.HasPrefix(held.Err().Error(), want) {
					t.Errorf("error of the freed handle: %q", held.Err())
				}
			} else if r.Count != 0 {
				t.Errorf("reclaim freed %d allocations, want none (both are held)", r.Count)
			}
			runtime.KeepAlive(kept)
			runtime.KeepAlive(held)
		})
	}
}

// mustAlloc allocates n bytes on cuda:0 or fails the test.
func mustAlloc(t *testing.T, m *backend.Manager, n uint64) *backend.Memory {
	t.Helper()
	h, err := m.Alloc("cuda:0", n)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// An empty allocation that running Go code may hold (made at the horizon)
// and the walk did not reach leaves the reclaim to the walk: it counts in
// no statistic, so the walk frees the garbage it found without a
// collection and leaves the empty one for a later walk.
func TestWalkLeavesHeldEmpty(t *testing.T) {
	t.Setenv("MEMSH_VERIFY_RECLAIM", "") // it frees what it holds on purpose
	m := newManager(t, "1GiB", backend.PeakLazy)
	clock := uint64(1)
	m.SetStampClock(func() uint64 { return clock })
	kept, garbage := mustAlloc(t, m, 4096), mustAlloc(t, m, 512)
	clock = 2
	empty := mustAlloc(t, m, 0)
	horizon := uint64(2)
	m.SetReach(func(_ uint64, visit func(*backend.Memory), _ *backend.Frames) backend.Walk {
		visit(kept)
		return backend.Walk{Done: true, Complete: true, Horizon: horizon}
	})
	r := m.Reclaim()
	if st := m.Stats(); st.Collections() != 0 || r.Count != 1 || r.Freed != 512 {
		t.Fatalf("reclaim %+v, %d collections; want the 512 bytes freed by the walk, no collection", r, st.Collections())
	}
	if garbage.Err() == nil || empty.Err() != nil {
		t.Fatalf("garbage freed: %v, empty one freed: %v; want true, false", garbage.Err() != nil, empty.Err() != nil)
	}
	// once no running code can hold it, the walk frees it
	horizon = 3
	if r := m.Reclaim(); r.Count != 1 || r.Freed != 0 || empty.Err() == nil {
		t.Errorf("reclaim %+v: want the empty allocation freed", r)
	}
	if st := m.Stats(); st.Collections() != 0 {
		t.Errorf("%d collections, want none", st.Collections())
	}
	runtime.KeepAlive(kept)
	runtime.KeepAlive(garbage)
	runtime.KeepAlive(empty)
}

// TestWalkFreeVerified: with MEMSH_VERIFY_RECLAIM=1 a walk that would
// free an allocation the collector finds reachable panics instead.
func TestWalkFreeVerified(t *testing.T) {
	t.Setenv("MEMSH_VERIFY_RECLAIM", "1")
	m := newManager(t, "1GiB", backend.PeakLazy)
	m.SetStampClock(func() uint64 { return 1 })
	held, err := m.Alloc("cuda:0", 512)
	if err != nil {
		t.Fatal(err)
	}
	dropped, err := m.Alloc("cuda:0", 1024)
	if err != nil {
		t.Fatal(err)
	}
	_ = dropped
	m.SetReach(func(uint64, func(*backend.Memory), *backend.Frames) backend.Walk {
		return backend.Walk{Done: true, Complete: true, Horizon: 2}
	})
	defer func() {
		r := recover()
		if r == nil {
			t.Fatal("no panic: the walk freed a reachable allocation unchecked")
		}
		if s, _ := r.(string); !strings.Contains(s, "512 bytes") || !strings.Contains(s, "still reachable") {
			t.Errorf("panic %v, want one naming the 512-byte allocation", r)
		}
		runtime.KeepAlive(held)
	}()
	dropped = nil
	m.Reclaim()
}

// TestStoppedWalkCollectsNothing: a walk told to stop (Ctrl-C) ends its
// reclaim without a collection, which could hold the interrupt up for as
// long as it takes; the garbage stays for the next reclaim.
func TestStoppedWalkCollectsNothing(t *testing.T) {
	m := newManager(t, "1GiB", backend.PeakLazy)
	if _, err := m.Alloc("cuda:0", 4096); err != nil { // garbage at once
		t.Fatal(err)
	}
	stop := true
	m.SetReach(func(_ uint64, _ func(*backend.Memory), _ *backend.Frames) backend.Walk {
		return backend.Walk{Done: !stop, Stopped: stop}
	})
	before := m.Stats()
	if r := m.Reclaim(); r.Count != 0 {
		t.Errorf("a stopped walk's reclaim freed %d allocations, want none", r.Count)
	}
	st := m.Stats().Since(before)
	if st.StoppedReclaims != 1 || st.Collections() != 0 || m.GPU(0).Allocated() != 4096 {
		t.Errorf("stopped reclaim: %+v, %d bytes allocated; want one stopped, no collection, 4096 bytes", st, m.GPU(0).Allocated())
	}
	stop = false
	if r := m.Reclaim(); r.Count != 1 || m.GPU(0).Allocated() != 0 {
		t.Errorf("the next reclaim freed %d allocations, %d bytes left; want 1, 0", r.Count, m.GPU(0).Allocated())
	}
}

// A frame that may grow (Frames.SetGrowable) is extended by a value noted
// grown (Manager.NoteGrew) at the next walk that keeps it, and its credits
// then stand for what the value reaches too; noted grown in a frame that
// may not grow, or before a collection, the value makes the frame
// forgotten instead.
func TestFramesGrow(t *testing.T) {
	m := newManager(t, "1GiB", backend.PeakLazy)
	held := mustAlloc(t, m, 4096)
	var grad *backend.Memory
	var mark backend.Mark
	var keep, kept int
	var grown []any
	growable := 1
	m.SetReach(func(epoch uint64, visit func(*backend.Memory), frames *backend.Frames) backend.Walk {
		kept = frames.Keep(keep)
		grown = nil
		if kept > 0 {
			if grown = frames.Grown(0); len(grown) > 0 {
				frames.Extend(0)
				visit(grad)
				kept = frames.EndExtend()
			}
		} else {
			frames.Enter(0)
			frames.Visit(&mark, epoch)
			visit(held)
			if grad != nil {
				visit(grad)
			}
		}
		frames.SetGrowable(growable)
		frames.Enter(-1)
		return backend.Walk{Done: true}
	})
	reclaim := func(step string, wantKept int, wantGrown int) {
		t.Helper()
		r := m.Reclaim()
		if !r.Proven || kept != wantKept || len(grown) != wantGrown {
			t.Errorf("%s: reclaim %+v, %d frames kept, %d values grown; want proven, %d kept, %d grown", step, r, kept, len(grown), wantKept, wantGrown)
		}
	}
	reclaim("first walk", 0, 0)
	keep = 1
	reclaim("nothing changed", 1, 0)
	grad = mustAlloc(t, m, 512) // the value's new gradient
	m.NoteGrew(&mark, "grad")
	reclaim("grown", 1, 1)
	reclaim("extended", 1, 0) // the kept frame's credits hold the gradient: proven without a visit
	growable = 0
	reclaim("not growable from now on", 1, 0)
	m.NoteGrew(&mark, "grad")
	reclaim("grown where it may not grow", 0, 0)
	growable = 1
	reclaim("growable again", 1, 0)
	m.NoteGrew(&mark, "grad")
	m.Collect() // lets go of what was noted grown: the frame is forgotten
	reclaim("after a collection", 0, 0)
	runtime.KeepAlive(held)
	runtime.KeepAlive(grad)
}
