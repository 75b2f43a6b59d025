package backend

import "fmt"

// PeakSet is the set of independent peak counters of one Allocator. Each
// counter is exact: the allocator reports every increase of its allocated and
// reserved bytes through Observe, so no transient allocation is missed,
// however short-lived. Any number of counters may be open at once and each
// is reset independently (PyTorch has one global counter; pytorch#16266
// asked for this).
type PeakSet struct {
	open []*Peak
	// minAllocated is the smallest MaxAllocated among open counters; an
	// allocation that keeps allocated bytes at or below it raises none.
	minAllocated uint64
}

// Peak is one counter: the maximum allocated and reserved bytes seen since it
// was started or last reset.
type Peak struct {
	set          *PeakSet
	MaxAllocated uint64 // exact maximum of allocated bytes since the last reset
	MaxReserved  uint64 // exact maximum of reserved bytes since the last reset
}

// New opens a counter starting at the current figures.
func (s *PeakSet) New(allocated, reserved uint64) *Peak {
	p := &Peak{set: s, MaxAllocated: allocated, MaxReserved: reserved}
	s.open = append(s.open, p)
	s.recompute()
	return p
}

// Observe records the allocator's current figures in every open counter.
// Allocators call it after every increase.
func (s *PeakSet) Observe(allocated, reserved uint64) {
	if allocated <= s.minAllocated && len(s.open) > 0 {
		// Fast path: only reserved can have raised a counter.
		for _, p := range s.open {
			if reserved > p.MaxReserved {
				p.MaxReserved = reserved
			}
		}
		return
	}
	for _, p := range s.open {
		if allocated > p.MaxAllocated {
			p.MaxAllocated = allocated
		}
		if reserved > p.MaxReserved {
			p.MaxReserved = reserved
		}
	}
	s.recompute()
}

// WouldRaise reports whether allocated bytes reaching allocated would raise
// some open counter.
func (s *PeakSet) WouldRaise(allocated uint64) bool {
	return len(s.open) > 0 && allocated > s.minAllocated
}

// Floor is the smallest maximum allocated bytes among the open counters:
// an allocation raises one when allocated bytes pass it. ok is false when
// none is open.
func (s *PeakSet) Floor() (floor uint64, ok bool) {
	return s.minAllocated, len(s.open) > 0
}

// Len is the number of open counters.
func (s *PeakSet) Len() int { return len(s.open) }

func (s *PeakSet) recompute() {
	if len(s.open) == 0 {
		s.minAllocated = 0
		return
	}
	m := s.open[0].MaxAllocated
	for _, p := range s.open[1:] {
		m = min(m, p.MaxAllocated)
	}
	s.minAllocated = m
}

// Reset restarts the counter at the given current figures.
func (p *Peak) Reset(allocated, reserved uint64) {
	p.MaxAllocated, p.MaxReserved = allocated, reserved
	if p.set != nil {
		p.set.recompute()
	}
}

// Close removes the counter from its set; its last values stay readable.
func (p *Peak) Close() {
	s := p.set
	if s == nil {
		return
	}
	for i, q := range s.open {
		if q == p {
			s.open = append(s.open[:i], s.open[i+1:]...)
			break
		}
	}
	p.set = nil
	s.recompute()
}

// PeakMode says when an allocation reclaims garbage first.
type PeakMode int

const (
	// PeakExact, the default, gives PyTorch's allocator state: every
	// garbage block is free before the next allocation that its being
	// free could change, as in a reference-counted runtime, so the
	// caching allocator picks the blocks PyTorch's picks, and allocated
	// bytes, peaks, reserved bytes, fragmentation and out-of-memory
	// errors are PyTorch's. An allocation reclaims first when something
	// may have become garbage since the last such reclaim
	// (mayHaveGarbage: Starlark code ran, a call began or ended, Go code
	// noted garbage) and it is over layoutMin from a caching allocator
	// (which blocks it gets depends on which are free), or when it would
	// raise an open peak counter or need a new segment (so no garbage
	// counts toward a peak); over layoutMin it does not reclaim for a
	// peak when the clock says nothing can have become garbage
	// (layoutQuiet).
	//
	// Until 2026-11 this was layout mode (--peak layout, still accepted),
	// and exact mode reclaimed only for a peak or a segment: its peaks
	// had no garbage, but a garbage block still held could change which
	// block the allocator picked, and with it reserved bytes, a large
	// block's unsplit remainder (allocated bytes) and the batch that runs
	// out of memory.
	PeakExact PeakMode = iota
	// PeakLazy reclaims only before an out-of-memory retry and every
	// DefaultPacing bytes of data: faster, but garbage the tracing GC has
	// not found yet may count toward peaks and take blocks PyTorch would
	// have reused. Reports say so.
	PeakLazy
)

func (m PeakMode) String() string {
	if m == PeakLazy {
		return "lazy"
	}
	return "exact"
}

// Exact reports whether m is PeakExact: peaks without garbage, the
// allocator's blocks PyTorch's.
func (m PeakMode) Exact() bool { return m != PeakLazy }

// ParsePeakMode parses "exact" (or "layout", its former name) or "lazy".
func ParsePeakMode(s string) (PeakMode, error) {
	switch s {
	case "exact", "layout", "":
		return PeakExact, nil
	case "lazy":
		return PeakLazy, nil
	}
	return 0, fmt.Errorf("unknown peak mode %q (want exact or lazy; layout is exact's former name)", s)
}
