package replay

import (
	"github.com/memsh/memsh/backend"
)

// Recorder records a Manager's events into a Stream, from Record until
// Stop (a trial's).
type Recorder struct {
	m    *backend.Manager
	s    *Stream
	gpus map[string]int
	seq0 uint64   // the Manager's sequence number before the first allocation: allocation seq has ID seq-seq0-1
	high []uint64 // per GPU: the largest allocated bytes since the start
	// the last device name looked up, and its index
	lastDev string
	lastIdx int
	remove  func()
	// the layout clock and garbage notes at the last allocation (at the
	// start: at exact mode's last reclaim)
	clock, notes uint64
}

// Record starts recording m's events as the stream of a trial at size.
func Record(m *backend.Manager, size int) *Recorder {
	r := &Recorder{m: m, s: &Stream{Size: size}, gpus: map[string]int{}, seq0: m.Seq(), lastIdx: Host}
	r.s.start, r.s.Why = Snapshot(m)
	r.clock, r.notes = m.LayoutSeen()
	for i := 0; i < m.NumGPUs(); i++ {
		a := m.GPU(i)
		r.gpus[a.Device().Name()] = i
		r.high = append(r.high, a.Allocated())
		r.s.Peaks = append(r.s.Peaks, Peak{Allocated: a.Allocated(), Reserved: a.Reserved()})
	}
	r.remove = m.ObserveAll(r.observe)
	return r
}

// Stop ends the recording and returns the stream.
func (r *Recorder) Stop() *Stream {
	r.remove()
	for i := 0; i < r.m.NumGPUs(); i++ {
		if a, ok := r.m.GPU(i).(*backend.CachingAllocator); ok && a.StreamsUsed() {
			// the events carry no stream: which blocks an allocation
			// may reuse depends on it
			r.refuse("CUDA streams other than the default one were made")
		}
	}
	return r.s
}

func (r *Recorder) refuse(why string) {
	if r.s.Why == "" {
		r.s.Why = why
	}
}

func (r *Recorder) dev(name string) int {
	if name == r.lastDev {
		return r.lastIdx
	}
	i, ok := r.gpus[name]
	if !ok {
		i = Host
	}
	r.lastDev, r.lastIdx = name, i
	return i
}

func (r *Recorder) observe(e backend.Event) {
	s := r.s
	switch e.Kind {
	case backend.EventAlloc:
		dev := r.dev(e.Device)
		id := int32(len(s.Blocks))
		if e.Seq != r.seq0+uint64(id)+1 {
			// an allocation moved (Manager.Migrate keeps its number)
			r.refuse("the trial moves memory between devices")
			return
		}
		op := Op{Kind: Alloc, Dev: dev, ID: id, Size: e.Requested, Moved: !e.Clocked || e.Clock != r.clock || e.Notes != r.notes, Quiet: e.Quiet}
		r.clock, r.notes = e.Clock, e.Notes
		if e.Law != nil {
			s.Laws = append(s.Laws, LawCall{Law: e.Law, Args: append([]int64(nil), e.Args...)})
			op.Law = int32(len(s.Laws))
		}
		s.Ops = append(s.Ops, op)
		s.Blocks = append(s.Blocks, Block{Addr: e.Addr, Size: e.Size})
		if dev != Host {
			// AllocOn's peak test compared with the trial's own peak
			// counter, which a replay keeps (the largest allocated bytes
			// since the start), unless the trial opened or reset others
			if e.Floor != r.high[dev] {
				r.refuse("the trial opens or resets peak counters of its own (nn.track, experiments, reset_peak_memory_stats)")
			}
			r.high[dev] = max(r.high[dev], e.Allocated)
			r.peak(dev, e)
		}
	case backend.EventFree:
		if e.Seq <= r.seq0 || e.Seq > r.seq0+uint64(len(s.Blocks)) {
			r.refuse("the trial frees memory allocated before it")
			return
		}
		id := int32(e.Seq - r.seq0 - 1)
		s.Ops = append(s.Ops, Op{Kind: Free, Dev: r.dev(e.Device), ID: id})
	case backend.EventReclaim:
		if e.Trigger == backend.TriggerOOM {
			s.Retried = true
		}
		n := len(s.Ops)
		for i := n - e.Count; i < n; i++ {
			if i < 0 || s.Ops[i].Kind != Free {
				r.refuse("a reclaim's frees are not together")
				break
			}
		}
		s.Ops = append(s.Ops, Op{Kind: Reclaim, Trigger: e.Trigger, Count: int32(e.Count)})
	case backend.EventEmptyCache:
		if dev := r.dev(e.Device); dev != Host {
			s.Ops = append(s.Ops, Op{Kind: EmptyCache, Dev: dev})
		}
	case backend.EventDriver:
		if dev := r.dev(e.Device); dev != Host {
			s.Ops = append(s.Ops, Op{Kind: Driver, Dev: dev, Size: e.Size})
		}
	case backend.EventGuard:
		if dev := r.dev(e.Device); dev != Host {
			s.Laws = append(s.Laws, LawCall{Law: e.Law, Args: append([]int64(nil), e.Args...)})
			s.Ops = append(s.Ops, Op{Kind: Guard, Dev: dev, Size: e.Size, Count: int32(e.Requested), Law: int32(len(s.Laws))})
		}
	case backend.EventSegmentAlloc, backend.EventSegmentFree:
		if dev := r.dev(e.Device); dev != Host {
			s.Segments = append(s.Segments, Segment{Dev: dev, Alloc: e.Kind == backend.EventSegmentAlloc, Addr: e.Addr, Size: e.Size})
			r.peak(dev, e)
		}
	case backend.EventOOM:
		s.OOM = true
	}
}

func (r *Recorder) peak(dev int, e backend.Event) {
	p := &r.s.Peaks[dev]
	p.Allocated = max(p.Allocated, e.Allocated)
	p.Reserved = max(p.Reserved, e.Reserved)
}
