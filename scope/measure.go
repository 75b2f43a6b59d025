package scope

import (
	"time"

	"github.com/memsh/memsh/backend"
	"github.com/memsh/memsh/backend/host"
	"github.com/memsh/memsh/env"
)

// meter holds the start figures and exact peak counters of one interval
// over host RAM and every GPU. It keeps no Starlark value.
type meter struct {
	start     time.Time
	hostStart uint64
	hostPeak  *host.RSSCounter // nil if the counter could not be opened
	hostAlloc *backend.Peak    // host tensors: opened so exact-peak mode reclaims before host allocations too
	gpuStart  []uint64
	gpuPeaks  []*backend.Peak
}

// startMeter opens peak counters at the current figures.
func (s *Session) startMeter() *meter {
	m := &meter{start: time.Now()}
	m.hostStart = s.hostUsed()
	if c, err := s.rss.New(); err == nil {
		m.hostPeak = c
	}
	if h := s.mgr.Host(); h != nil {
		m.hostAlloc = h.Peaks().New(h.Allocated(), h.Reserved())
	}
	for i := 0; i < s.mgr.NumGPUs(); i++ {
		a := s.mgr.GPU(i)
		m.gpuStart = append(m.gpuStart, a.Allocated())
		m.gpuPeaks = append(m.gpuPeaks, a.Peaks().New(a.Allocated(), a.Reserved()))
	}
	return m
}

// read returns the figures since the meter started; Reclaimed is 0.
func (s *Session) read(m *meter, name string) *env.Data {
	d := &env.Data{Name: name, Time: time.Since(m.start)}
	simRes := s.simResident()
	rss, _ := host.RSS()
	rss -= min(rss, simRes)
	hpeak := rss
	if m.hostPeak != nil {
		if p, err := m.hostPeak.Peak(); err == nil && p > simRes {
			hpeak = max(p-simRes, rss, m.hostStart)
		}
	}
	d.Host = makeFigures("host", m.hostStart, rss, hpeak, host.Available())
	for i, p := range m.gpuPeaks {
		a := s.mgr.GPU(i)
		free, _, _ := a.Device().MemGetInfo()
		d.GPUs = append(d.GPUs, makeFigures(a.Device().Name(), m.gpuStart[i], a.Allocated(), p.MaxAllocated, free))
	}
	if len(d.GPUs) > 0 {
		d.GPU = &d.GPUs[s.mgr.Current()]
	}
	return d
}

func (m *meter) close() {
	if m.hostPeak != nil {
		m.hostPeak.Close()
	}
	if m.hostAlloc != nil {
		m.hostAlloc.Close()
	}
	for _, p := range m.gpuPeaks {
		p.Close()
	}
}

func makeFigures(device string, start, used, peak, avail uint64) env.Figures {
	f := env.Figures{Device: device, Used: int64(used), Consumed: int64(used) - int64(start), Peak: int64(peak), Available: int64(avail)}
	f.Peaked = max(0, int64(peak)-int64(start)) - max(0, f.Consumed)
	f.Peaked = max(0, f.Peaked)
	return f
}

// residentDevice is implemented by devices whose memory lives in this
// process (the simulator).
type residentDevice interface{ Resident() uint64 }

// simResident is the host memory the simulated GPUs' data occupies.
func (s *Session) simResident() uint64 {
	var n uint64
	for _, d := range s.devices {
		if r, ok := d.(residentDevice); ok {
			n += r.Resident()
		}
	}
	return n
}

// hostUsed is the process RSS less the simulated GPUs' resident data.
func (s *Session) hostUsed() uint64 {
	rss, _ := host.RSS()
	return rss - min(rss, s.simResident())
}
