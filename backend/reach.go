package backend

import (
	"fmt"
	"os"
	"runtime"
	"slices"
)

// A reclaim frees what nothing reaches any more. The Go collector can
// find it — a full runtime.GC(), whose cost grows with the whole Go heap
// — but the reach walk usually answers first: the layer that knows the
// roots (the Session: globals, the frames of running functions with
// their arguments, loaded modules, and the values they hold, down to the
// tensors, the autograd graph and engine and the optimizer state)
// reports every allocation it reaches.
//
//   - It reached every allocation that is not freed: nothing can be
//     garbage, and the reclaim is done. This is sound whatever the walk
//     covers: it only follows pointers that exist from roots that are
//     live, so what it reaches the collector would find reachable too.
//   - The walk was Complete (it looked into every value it met) and every
//     allocation it did not reach was made before its Horizon (and
//     outside its Spans), so no running Go code can hold it: the reclaim
//     frees those itself. This relies on the walk seeing every holder —
//     the rules are in docs/architecture.md, "How memory is accounted".
//   - Otherwise the collector decides, as before.
//
// MEMSH_VERIFY_RECLAIM=1 checks both outcomes with a collection and
// panics on a contradiction; MEMSH_VERIFY_RECLAIM=collect-first also runs
// a Go collection before each walk (one that frees nothing itself), so
// that every weakly held value a walk resolves — a pinned list or dict,
// a fold's, the memo's once weakened — is already gone when it was
// dropped: the path a background collection's timing takes now and then
// (a collection right after each walk, as =1 runs, never lets a walk
// meet one). MEMSH_RECLAIM=gc leaves every freeing to
// the collector; MEMSH_DEBUG_REACH=1 prints why a walk did not settle a
// reclaim.

// ReachFunc walks the roots of a Session and calls visit for every
// allocation handle it reaches (repeats are fine). It has no deadline:
// a walk that gave up for time would leave the reclaim to the collector,
// whose verdict differs where Go code still holds what Python's reference
// counts let go (52 of the golden phases of starlib/nn when every walk
// gives up), so figures would depend on the machine's load; it gives up
// (Done false, Stopped) only when told to stop (an interrupt). It runs
// while the Manager is locked: it must not call the Manager's methods.
// Through frames it may keep what earlier walks found reachable from the
// frames of running functions that have not run since (Frames); a walk
// that does not use it calls frames.Keep(0) and never Enter, and every
// allocation is then credited to no frame.
type ReachFunc func(epoch uint64, visit func(*Memory), frames *Frames) Walk

// Walk is what a reach walk found out besides the allocations it reached.
type Walk struct {
	// Done: the walk visited every root.
	Done bool
	// Stopped: the walk was not Done because it was told to stop (an
	// interrupt).
	Stopped bool
	// Complete: the walk also looked into every value on its way that
	// can hold memory (it met no value of a type it does not know), and
	// every holder of memory outside it is one of the running Go code
	// the Horizon covers. Then an allocation it did not reach, made
	// before Horizon, is garbage: the reclaim frees it without a
	// collection.
	Complete bool
	// Horizon: allocations whose stamp (SetStampClock) is at least
	// Horizon may be held by Go code that is running now (a built-in
	// function, the instruction being executed), which no walk sees.
	Horizon uint64
	// Spans are more stamps that running Go code may hold, each from From
	// up to (not including) To: the autograd engine's running node
	// before a checkpoint's recomputation began, while the recomputation
	// runs (what the recomputation allocates, the node does not hold).
	Spans []Span
	// Why says what made the walk incomplete, and Holder names the
	// running code the Horizon comes from, for MEMSH_DEBUG_REACH.
	Why, Holder string
	// Reused: the walk reported what an earlier walk found in part of the
	// roots instead of walking it (scope's walks during backward), for
	// ManagerStats.ReusedWalks.
	Reused bool
	// Visited counts the values the walk looked into (Starlark values,
	// tensors), for ManagerStats.ValuesWalked.
	Visited int
	// Retry: the walk credited a frame it kept or walked for a value
	// the rest of the walk then did not meet (scope's pinned list no
	// longer reachable), so what it reached says nothing: the reclaim
	// walks again, keeping no frame.
	Retry bool
}

var debugReach = os.Getenv("MEMSH_DEBUG_REACH") == "1"

// Span is the stamps from From up to (not including) To.
type Span struct{ From, To uint64 }

// protects reports whether an allocation stamped s may be held by running
// Go code, by w.
func (w *Walk) protects(s uint64) bool {
	if s >= w.Horizon {
		return true
	}
	for _, sp := range w.Spans {
		if s >= sp.From && s < sp.To {
			return true
		}
	}
	return false
}

type reachState struct {
	f      ReachFunc
	forget func()        // SetForget
	stamp  func() uint64 // the clock allocations are stamped with
	epoch  uint64
	verify bool // MEMSH_VERIFY_RECLAIM: check each proof with a collection
	// MEMSH_VERIFY_RECLAIM=collect-first: and collect before each walk
	collectFirst bool
	off          bool // MEMSH_RECLAIM=gc: never free without a collection
	frames       Frames
}

// SetReach installs the reach walk (nil removes it).
func (m *Manager) SetReach(f ReachFunc) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.reach.f = f
	v := os.Getenv("MEMSH_VERIFY_RECLAIM")
	m.reach.verify, m.reach.collectFirst = v == "1" || v == "collect-first", v == "collect-first"
	m.reach.off = os.Getenv("MEMSH_RECLAIM") == "gc"
}

// SetForget installs f, which the Manager calls before each collection
// (while it is locked): the layer that walks keeps, between walks, what
// earlier walks found (scope's walks during backward), and must let go of
// it so that the collection judges only what the Session's values hold.
func (m *Manager) SetForget(f func()) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.reach.forget = f
}

// SetStampClock installs the clock each allocation is stamped with when
// it is made (scope: the Starlark thread's step count), against which a
// walk's Horizon is compared; nil stamps 0. Without it (or while it is
// nil) a walk frees nothing itself.
func (m *Manager) SetStampClock(clock func() uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.reach.stamp = clock
}

// walkReclaim runs the reach walk. It reports done when the walk settled
// the reclaim without the collector: every live allocation was reached
// (nothing is garbage), or the walk was Complete and every allocation it
// did not reach was made before its Horizon; those it frees (res). stopped
// reports a walk an interrupt stopped (Walk.Stopped).
func (m *Manager) walkReclaim() (res ReclaimResult, done, stopped bool) {
	if m.live == 0 {
		return res, true, false
	}
	if m.reach.f == nil {
		return res, false, false
	}
	fr := &m.reach.frames
	if m.reach.collectFirst {
		runtime.GC()
	}
	w, epoch, reached := m.walk()
	if w.Retry {
		// a frame it counted stood for a value no longer reachable:
		// once more, keeping nothing
		m.stats.RetriedWalks++
		fr.Reset()
		if w, epoch, reached = m.walk(); w.Retry {
			return res, false, false
		}
	}
	if !w.Done {
		// told to stop (an interrupt)
		return res, false, w.Stopped
	}
	m.stats.ValuesWalked += w.Visited
	if w.Reused {
		m.stats.ReusedWalks++
	}
	reached += fr.keptCount()
	if reached == m.live {
		if m.reach.verify {
			m.verifyProof()
		}
		return res, true, false
	}
	if !w.Complete || m.reach.off || m.reach.stamp == nil {
		if debugReach {
			fmt.Fprintf(os.Stderr, "reach: incomplete %s\n", w.Why)
		}
		return res, false, false
	}
	// What the walk did not reach is garbage unless Go code that is
	// running may hold it; if any such allocation is unreached, only the
	// collector can tell — unless it is empty: an allocation of 0 bytes
	// counts in no statistic (the allocators do not see it, as PyTorch
	// does not call its allocator for an empty tensor), so whether it is
	// garbage now changes no figure, and a later walk frees it (a
	// BatchNorm2d's empty reserve made ResNet-50's every batch norm a
	// collection).
	// The live allocations neither reached nor held by a kept frame are
	// m.live - reached: most are recent (temporaries), so the entries,
	// in allocation order, are looked at newest first until that many
	// are found (all of them, under MEMSH_VERIFY_RECLAIM, which checks
	// the count), and the garbage is freed oldest first.
	var garbage []*record
	unreached := m.live - reached
	found := 0
	for i := len(m.entries) - 1; i >= 0 && (found < unreached || m.reach.verify); i-- {
		r := m.entries[i].rec
		if r.freed || r.mark == epoch || fr.holds(r) {
			continue
		}
		found++
		if !r.dropped && w.protects(r.stamp) {
			if r.nbytes == 0 {
				continue
			}
			if debugReach {
				fmt.Fprintf(os.Stderr, "reach: %d bytes (stamp %d, horizon %d) may be held by %s\n", r.nbytes, r.stamp, w.Horizon, w.Holder)
				printSite(r)
			}
			return res, false, false
		}
		garbage = append(garbage, r)
	}
	slices.Reverse(garbage)
	if m.reach.verify {
		if found != unreached {
			panic(fmt.Sprintf("memsh: a reach walk counted %d allocations neither reached nor kept, and found %d", unreached, found))
		}
		m.verifyGarbage(garbage)
	}
	for _, r := range garbage {
		// If anything still used it, that is a memsh bug, and its
		// message says so instead of reading freed memory.
		r.released = "freed as unreachable by a reclaim that found no reference to it (a memsh bug if you see this: MEMSH_VERIFY_RECLAIM=1 finds where)"
		m.freeLocked(r)
		res.Freed += r.nbytes
		res.Count++
	}
	return res, true, false
}

// walk runs the reach walk numbered by the next epoch, crediting what it
// reaches to Frames, and returns it with its epoch and the allocations it
// reached that no kept frame held.
func (m *Manager) walk() (w Walk, epoch uint64, reached int) {
	m.reach.epoch++
	epoch = m.reach.epoch
	fr := &m.reach.frames
	fr.begin()
	w = m.reach.f(epoch, func(h *Memory) {
		if r := h.rec; r.mark != epoch && r.owner == m && !r.freed && !fr.holds(r) {
			r.mark = epoch
			fr.credit(r)
			reached++
		}
	}, fr)
	fr.close()
	return w, epoch, reached
}

// printSite prints where r was allocated (MEMSH_DEBUG_REACH=1 records
// it) to standard error.
func printSite(r *record) {
	fr := runtime.CallersFrames(r.pcs)
	for range 16 {
		f, more := fr.Next()
		fmt.Fprintf(os.Stderr, "   %s:%d\n", f.Function, f.Line)
		if !more {
			break
		}
	}
}

// verifyProof runs the collector after a proof and panics if it finds
// garbage: the walk reported an allocation the collector finds
// unreachable, which the walk's construction rules out.
func (m *Manager) verifyProof() {
	m.settle()
	runtime.GC()
	for _, e := range m.entries {
		if !e.rec.freed && e.value() == nil {
			panic(fmt.Sprintf("memsh: reach walk proved no garbage, but the allocation of %d bytes on %s (sequence number %d) is unreachable", e.rec.nbytes, e.rec.device, e.rec.seq))
		}
	}
}

// verifyGarbage runs the collector before a walk frees what it did not
// reach, and panics if any of it is still reachable: the walk missed a
// holder.
func (m *Manager) verifyGarbage(garbage []*record) {
	m.settle()
	runtime.GC()
	dead := map[*record]bool{}
	for _, e := range m.entries {
		if !e.rec.freed && e.value() == nil {
			dead[e.rec] = true
		}
	}
	for _, r := range garbage {
		if !dead[r] {
			if debugReach {
				fmt.Fprintf(os.Stderr, "reach: the allocation the walk missed was made at\n")
				printSite(r)
			}
			panic(fmt.Sprintf("memsh: reach walk would free the allocation of %d bytes on %s (sequence number %d, stamp %d), which is still reachable", r.nbytes, r.device, r.seq, r.stamp))
		}
	}
}
