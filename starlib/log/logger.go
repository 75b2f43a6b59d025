package log

import (
	"fmt"
	"io"
	"time"

	"go.starlark.net/syntax"

	"github.com/memsh/memsh/backend"
	bhost "github.com/memsh/memsh/backend/host"
	"github.com/memsh/memsh/env"
	"github.com/memsh/memsh/starlib/host"
)

// Record is what the logger measured over one top-level statement (or REPL
// input).
type Record struct {
	// Statement is the statement's position, "file:line" ("<stdin-3>:1" in
	// the REPL).
	Statement string
	// Data holds the wall time and the figures of host RAM and each GPU:
	// used at the end, consumed, exact peak and peaked (docs/starlark.md, the figures).
	Data env.Data
	// CPU is the CPU use during the statement: SystemPercent is the mean
	// busy % of all cores, MaxCorePercent the busiest core's (both
	// system-wide, as ipython_memory_usage's "system mean cpu" and "single
	// max cpu"), ProcessPercent this process's CPU time over wall time.
	CPU bhost.CPUUsage
	// Perf holds the hardware/software counters' counts over the input,
	// when the logger counts any (log.start(perf=...)).
	Perf []PerfCount
}

// PerfCount is one counter's count over an input.
type PerfCount struct {
	Event string
	Count uint64
}

// PerSecond is the count per second of the input's wall time.
func (c PerfCount) PerSecond(wall time.Duration) float64 {
	if wall <= 0 {
		return 0
	}
	return float64(c.Count) / wall.Seconds()
}

// Logger measures every top-level statement of a Session and prints a line
// (or a compact line) after each. Its peaks come from counters that are
// exact: one backend.Peak per GPU allocator (updated on every allocation)
// and one peak-RSS counter on the kernel's high-water mark, so a temporary
// of any size and duration counts; there is no sampling thread for memory.
// CPU % is sampled (backend/host's CPUMeter). The Logger holds no Starlark
// value.
type Logger struct {
	env     *env.Env
	compact bool
	remove  func()
	out     io.Writer // where the lines go; nil: env.Out

	hostPeak *bhost.RSSCounter // nil if it could not be opened
	gpuPeaks []*backend.Peak

	// the statement being measured
	active    bool
	pos       string
	t0        time.Time
	cpu       *bhost.CPUMeter
	hostStart uint64
	gpuStart  []uint64

	perf      *bhost.PerfCounters // nil: no counters
	perfStart []uint64
}

// setPerf replaces the logger's counters (nil: none).
func (l *Logger) setPerf(p *bhost.PerfCounters) {
	if l.perf != nil {
		l.perf.Close()
	}
	l.perf, l.perfStart = p, nil
	if p != nil && l.active {
		_ = p.Refresh()
		l.perfStart, _ = p.Read()
	}
}

func newLogger(e *env.Env, compact bool) *Logger {
	l := &Logger{env: e, compact: compact}
	if c, err := host.PeakRSS(e).New(); err == nil {
		l.hostPeak = c
	}
	m := e.Manager
	for i := 0; i < m.NumGPUs(); i++ {
		a := m.GPU(i)
		l.gpuPeaks = append(l.gpuPeaks, a.Peaks().New(a.Allocated(), a.Reserved()))
	}
	l.gpuStart = make([]uint64, m.NumGPUs())
	return l
}

// onStatement is the Session hook.
// onStatement measures each input: from its first statement's start to its
// last statement's end (one REPL input, or one top-level script statement).
func (l *Logger) onStatement(ev env.StatementEvent) {
	if ev.Start {
		if ev.First {
			if s := stateOf(l.env); s.seed != nil && l.env.Seed != nil {
				l.env.Seed(*s.seed) // CellLogger's cl_set_seed
			}
			l.begin(ev.Pos)
		}
		return
	}
	if ev.Last && l.active {
		l.print(l.end())
	}
}

// begin starts measuring at the current figures. The previous statement's
// end reclaimed, so no garbage is counted in them.
func (l *Logger) begin(pos syntax.Position) {
	if l.active && l.cpu != nil {
		_, _ = l.cpu.Stop()
	}
	l.active = true
	l.pos = position(pos)
	l.hostStart = host.Used(l.env.Manager)
	if l.hostPeak != nil {
		_ = l.hostPeak.Reset()
	}
	m := l.env.Manager
	for i, p := range l.gpuPeaks {
		a := m.GPU(i)
		l.gpuStart[i] = a.Allocated()
		p.Reset(a.Allocated(), a.Reserved())
	}
	l.cpu, _ = bhost.StartCPUMeter() // nil on error: no CPU figures
	if l.perf != nil {
		_ = l.perf.Refresh() // threads started since
		l.perfStart, _ = l.perf.Read()
	}
	l.t0 = time.Now()
}

// end finishes the measurement: wall time and CPU first (so the reclaim
// that follows is not counted), then a reclaim so garbage does not count as
// used, as in a reference-counted runtime. The reclaim (a full GC) is most
// of the logger's cost; it is skipped when nothing is allocated at all.
func (l *Logger) end() *Record {
	wall := time.Since(l.t0)
	r := &Record{Statement: l.pos}
	if l.perf != nil && l.perfStart != nil {
		if now, err := l.perf.Read(); err == nil {
			for i, ev := range l.perf.Events() {
				r.Perf = append(r.Perf, PerfCount{Event: ev.Name, Count: now[i] - l.perfStart[i]})
			}
		}
	}
	if l.cpu != nil {
		r.CPU, _ = l.cpu.Stop()
		l.cpu = nil
	}
	r.CPU.Wall = wall
	l.active = false
	m := l.env.Manager
	if holdsMemory(m) { // with nothing allocated there is nothing to reclaim
		m.Reclaim()
	}
	d := &r.Data
	d.Name, d.Time = l.pos, wall
	hf := host.Read(m, l.hostPeak, l.hostStart)
	d.Host = figures("host", l.hostStart, hf.Used, hf.Peak, bhost.Available())
	for i, p := range l.gpuPeaks {
		a := m.GPU(i)
		free, _, _ := a.Device().MemGetInfo()
		d.GPUs = append(d.GPUs, figures(a.Device().Name(), l.gpuStart[i], a.Allocated(), p.MaxAllocated, free))
	}
	if len(d.GPUs) > 0 {
		d.GPU = &d.GPUs[m.Current()]
	}
	stateOf(l.env).last = r
	return r
}

// holdsMemory reports whether any allocator has bytes allocated.
func holdsMemory(m *backend.Manager) bool {
	if h := m.Host(); h != nil && h.Allocated() > 0 {
		return true
	}
	for i := 0; i < m.NumGPUs(); i++ {
		if m.GPU(i).Allocated() > 0 {
			return true
		}
	}
	return false
}

// close stops the logger: the hook, the CPU meter and the counters.
func (l *Logger) close() {
	if l.remove != nil {
		l.remove()
		l.remove = nil
	}
	if l.cpu != nil {
		_, _ = l.cpu.Stop()
		l.cpu = nil
	}
	l.active = false
	l.setPerf(nil)
	if l.hostPeak != nil {
		l.hostPeak.Close()
	}
	for _, p := range l.gpuPeaks {
		p.Close()
	}
}

// figures computes the figures (docs/starlark.md) of one resource.
func figures(device string, start, used, peak, avail uint64) env.Figures {
	f := env.Figures{Device: device, Used: int64(used), Consumed: int64(used) - int64(start),
		Peak: int64(max(peak, used)), Available: int64(avail)}
	f.Peaked = max(0, max(0, f.Peak-int64(start))-max(0, f.Consumed))
	return f
}

func position(p syntax.Position) string {
	if !p.IsValid() {
		return ""
	}
	return fmt.Sprintf("%s:%d", p.Filename(), p.Line)
}
