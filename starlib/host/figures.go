package host

import (
	"sync"

	"github.com/memsh/memsh/backend"
	bhost "github.com/memsh/memsh/backend/host"
	"github.com/memsh/memsh/env"
)

// residentDevice is implemented by GPU devices whose memory lives in this
// process (the simulator).
type residentDevice interface{ Resident() uint64 }

// SimResident returns the host memory that simulated GPUs' data occupies
// (pages of their mappings resident in RAM).
func SimResident(m *backend.Manager) uint64 {
	var n uint64
	for i := 0; i < m.NumGPUs(); i++ {
		if r, ok := m.GPU(i).Device().(residentDevice); ok {
			n += r.Resident()
		}
	}
	return n
}

// Used returns host memory in use as memsh reports it everywhere
// (docs/starlark.md, the figures): the process's resident set size less the pages of simulated GPUs'
// memory, which stands in for device memory. Without a simulator holding
// data it is the process RSS.
func Used(m *backend.Manager) uint64 {
	used, _ := usedAndResident(m)
	return used
}

func usedAndResident(m *backend.Manager) (used, simRes uint64) {
	rss, _ := bhost.RSS()
	simRes = SimResident(m)
	return rss - min(rss, simRes), simRes
}

// Figures is a host reading: used now and the peak of a counter, both with
// simulated GPUs' resident pages taken out.
type Figures struct {
	Used, Peak uint64
}

// Read returns the host figures now, with the peak of c (which may be nil:
// then the peak is the current figure). The peak is the counter's exact
// RSS peak less the simulator's resident pages now, never below used or
// floor (the figure at the counter's start): with a simulated GPU that
// touched new pages during the interval it is a lower bound, as in
// experiment reports.
func Read(m *backend.Manager, c *bhost.RSSCounter, floor uint64) Figures {
	used, simRes := usedAndResident(m)
	f := Figures{Used: used, Peak: max(used, floor)}
	if c != nil {
		if p, err := c.Peak(); err == nil && p > simRes {
			f.Peak = max(p-simRes, f.Peak)
		}
	}
	return f
}

// state is the module's per-session state (in env.Values).
type state struct {
	mu      sync.Mutex
	rss     *bhost.PeakRSS
	peak    *bhost.RSSCounter // host.peak_rss's counter; nil until first use
	lastCPU []cpuTimes        // cpu_percent(interval=0)'s previous reading
}

const valuesKey = "host"

func stateOf(e *env.Env) *state {
	if s, ok := e.Values[valuesKey].(*state); ok {
		return s
	}
	s := &state{rss: bhost.NewPeakRSS()}
	e.Values[valuesKey] = s
	return s
}

// PeakRSS returns the session's peak-RSS counter factory: the per-session
// bhost.PeakRSS that the host module, the logger and other tools open
// their independent counters on.
func PeakRSS(e *env.Env) *bhost.PeakRSS { return stateOf(e).rss }

// sessionPeak returns the session counter of peak_rss, opening it on first
// use.
func (s *state) sessionPeak() (*bhost.RSSCounter, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.peak == nil {
		c, err := s.rss.New()
		if err != nil {
			return nil, err
		}
		s.peak = c
	}
	return s.peak, nil
}
