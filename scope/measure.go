package scope

import (
	"time"

	"go.starlark.net/starlark"
	"go.starlark.net/starlarkstruct"

	"github.com/memsh/memsh/backend"
	"github.com/memsh/memsh/backend/host"
)

// Figures are one resource's memory figures over an interval, in bytes, as
// DESIGN.md §5 defines them.
type Figures struct {
	// Device is "host" for host RAM, or the GPU's device string ("cuda:0").
	Device string
	// Used at the end of the interval: host process RSS, or the GPU
	// allocator's allocated bytes (allocated_bytes.all.current). A
	// simulated GPU keeps its data in this process's memory; those resident
	// pages (mincore) are not counted in host RSS, so host figures are the
	// host's own, as with a real GPU.
	Used int64
	// Consumed is used at the end minus used at the start.
	Consumed int64
	// Peak is the exact maximum of used during the interval (host: VmHWM
	// where the kernel lets memsh reset it, otherwise sampled). With a
	// simulated GPU holding data, the host peak is VmHWM less the
	// simulator's resident pages at the end, a lower bound when the
	// simulator touched new pages during the interval.
	Peak int64
	// Peaked is the transient blip above what was kept, as ipyexperiments,
	// its CellLogger and fastai's GPUMemTrace define it:
	// max(0, peak − start) − max(0, consumed).
	Peaked int64
	// Reclaimed is how much of consumed came back at finish; 0 until then.
	Reclaimed int64
	// Available is free memory now: device free (cuMemGetInfo, or the
	// simulator's), or the host's MemAvailable.
	Available int64
}

// Data is what an experiment measured: DESIGN.md §3's
// struct(name, time, host, gpu, gpus).
type Data struct {
	Name string
	Time time.Duration // elapsed wall time
	Host Figures
	GPU  *Figures // the current device's figures; nil without GPUs
	GPUs []Figures
}

// Value returns the data as the Starlark struct data() and finish() return:
// struct(name, time, host, gpu, gpus) with time in seconds and each figure
// struct(device, used, consumed, peak, peaked, reclaimed, available) in
// bytes; gpu is None without GPUs.
func (d *Data) Value() starlark.Value {
	gpus := make([]starlark.Value, len(d.GPUs))
	for i := range d.GPUs {
		gpus[i] = d.GPUs[i].value()
	}
	var gpu starlark.Value = starlark.None
	if d.GPU != nil {
		gpu = d.GPU.value()
	}
	return starlarkstruct.FromStringDict(starlarkstruct.Default, starlark.StringDict{
		"name": starlark.String(d.Name),
		"time": starlark.Float(d.Time.Seconds()),
		"host": d.Host.value(),
		"gpu":  gpu,
		"gpus": starlark.Tuple(gpus),
	})
}

func (f *Figures) value() starlark.Value {
	return starlarkstruct.FromStringDict(starlarkstruct.Default, starlark.StringDict{
		"device":    starlark.String(f.Device),
		"used":      starlark.MakeInt64(f.Used),
		"consumed":  starlark.MakeInt64(f.Consumed),
		"peak":      starlark.MakeInt64(f.Peak),
		"peaked":    starlark.MakeInt64(f.Peaked),
		"reclaimed": starlark.MakeInt64(f.Reclaimed),
		"available": starlark.MakeInt64(f.Available),
	})
}

// meter holds the start figures and exact peak counters of one interval
// over host RAM and every GPU. It keeps no Starlark value.
type meter struct {
	start     time.Time
	hostStart uint64
	hostPeak  *host.RSSCounter // nil if the counter could not be opened
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
	for i := 0; i < s.mgr.NumGPUs(); i++ {
		a := s.mgr.GPU(i)
		m.gpuStart = append(m.gpuStart, a.Allocated())
		m.gpuPeaks = append(m.gpuPeaks, a.Peaks().New(a.Allocated(), a.Reserved()))
	}
	return m
}

// read returns the figures since the meter started; Reclaimed is 0.
func (s *Session) read(m *meter, name string) *Data {
	d := &Data{Name: name, Time: time.Since(m.start)}
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
	for _, p := range m.gpuPeaks {
		p.Close()
	}
}

func makeFigures(device string, start, used, peak, avail uint64) Figures {
	f := Figures{Device: device, Used: int64(used), Consumed: int64(used) - int64(start), Peak: int64(peak), Available: int64(avail)}
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
