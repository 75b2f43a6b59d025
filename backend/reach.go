package backend

import (
	"fmt"
	"os"
	"runtime"
	"time"
)

// A reclaim frees what nothing reaches any more, and the Go collector is
// what finds it: a full runtime.GC(), whose cost grows with the whole Go
// heap. Most reclaims find nothing (a measurement, a peak-raising
// allocation while every tensor is still in use): 1,798 of the first
// 2,500 reclaims of `memsh fit gpt2-xl` freed nothing, measured before
// the walk existed. The reach walk answers that case without a
// collection: the layer that knows the roots (the Session: globals, the
// frames of running functions, loaded modules, and the values they hold,
// down to the tensors, the autograd graph and the optimizer state)
// reports every allocation it reaches. When it reaches every allocation
// that is not freed, nothing can be garbage, and the reclaim is done.
// Otherwise the collector decides, as before.
//
// The proof is sound whatever the walk covers: the walk only follows
// pointers that really exist from roots that really are live, so what it
// reaches the collector would also find reachable; a value it cannot
// look into (an unknown type, a Go-only holder, a list held only by a
// running for loop's iterator) leaves allocations unreached, which sends the reclaim to
// the collector. Coverage decides how often a reclaim is cheap, never
// whether it is right. MEMSH_VERIFY_RECLAIM=1 checks every proof with a
// collection anyway and panics if the collector frees anything.

// ReachFunc walks the roots of a Session and calls visit for every
// allocation handle it reaches (repeats are fine). It returns false to
// give up, as it should once deadline has passed (twice what the last
// collection took); the reclaim then runs the collector. It runs
// while the Manager is locked: it must not call the Manager's methods.
type ReachFunc func(epoch uint64, deadline time.Time, visit func(*Memory)) bool

type reachState struct {
	f           ReachFunc
	epoch       uint64
	verify      bool          // MEMSH_VERIFY_RECLAIM: check each proof with a collection
	lastCollect time.Duration // how long the last collection took
	// skip is the number of reclaims that go straight to the collector
	// after walks that ran out of time (doubling, up to maxSkip); a
	// walk that completes sets it back to 0.
	skip, backoff int
}

const maxSkip = 64

// minWalk is the least time a walk is given (before the first collection,
// and when collections are quicker than that); otherwise it gets twice
// what the last collection took.
const minWalk = time.Millisecond

// SetReach installs the reach walk (nil removes it).
func (m *Manager) SetReach(f ReachFunc) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.reach.f = f
	m.reach.verify = os.Getenv("MEMSH_VERIFY_RECLAIM") == "1"
}

// proveNoGarbage reports whether every live allocation is reachable, by
// the reach walk. With no live allocation there is nothing to free.
func (m *Manager) proveNoGarbage() bool {
	if m.live == 0 {
		return true
	}
	if m.reach.f == nil {
		return false
	}
	if m.reach.skip > 0 {
		m.reach.skip--
		return false
	}
	m.reach.epoch++
	epoch := m.reach.epoch
	reached := 0
	ok := m.reach.f(epoch, time.Now().Add(max(2*m.reach.lastCollect, minWalk)), func(h *Memory) {
		r := h.rec
		if r.owner == m && !r.freed && r.mark != epoch {
			r.mark = epoch
			reached++
		}
	})
	if !ok {
		// out of time: the roots hold more than a walk can cover in a
		// collection's time; try again later, less often each time
		m.reach.backoff = min(2*m.reach.backoff+1, maxSkip)
		m.reach.skip = m.reach.backoff
		return false
	}
	m.reach.backoff = 0
	if reached != m.live {
		return false
	}
	if m.reach.verify {
		m.verifyProof()
	}
	return true
}

// verifyProof runs the collector after a proof and panics if it finds
// garbage: the walk reported an allocation the collector finds
// unreachable, which the walk's construction rules out.
func (m *Manager) verifyProof() {
	runtime.GC()
	for _, e := range m.entries {
		if !e.rec.freed && e.handle.Value() == nil {
			panic(fmt.Sprintf("memsh: reach walk proved no garbage, but the allocation of %d bytes on %s (sequence number %d) is unreachable", e.rec.nbytes, e.rec.device, e.rec.seq))
		}
	}
}
