// Package host is the Starlark module `host`: host RAM and CPU figures of
// the memsh process, from backend/host. It also offers the host readings
// that memsh's other tools (the per-statement logger) share: Used, Read and
// the per-session PeakRSS.
package host

import (
	"fmt"
	"time"

	"github.com/shirou/gopsutil/v3/cpu"
	"go.starlark.net/starlark"
	"go.starlark.net/starlarkstruct"

	"github.com/memsh/memsh/backend"
	bhost "github.com/memsh/memsh/backend/host"
	"github.com/memsh/memsh/env"
	"github.com/memsh/memsh/starlib/numarg"
)

// Module is the host module. All sizes are in bytes.
//
//	rss()              the process's resident set size now, less simulated
//	                   GPUs' resident pages (what memsh reports as host
//	                   "used" everywhere)
//	peak_rss()         the exact maximum of rss() since reset_peak(), or
//	                   since the first host call of the session (kernel
//	                   high-water mark VmHWM; sampled every 5 ms where
//	                   /proc/self/clear_refs is not writable)
//	reset_peak()       restart peak_rss() at rss(); other peak counters
//	                   (experiments, the logger) are not disturbed
//	total()            the host's RAM (MemTotal)
//	available()        RAM available without swapping (MemAvailable)
//	memory_allocated() the bytes of live "cpu" tensors, as the host
//	                   allocator counts them (what is requested; on a
//	                   meta session's host, where RSS sees nothing, the
//	                   only figure)
//	max_memory_allocated()
//	                   its peak since the session began or
//	                   reset_peak_memory_stats()
//	reset_peak_memory_stats()
//	                   restart max_memory_allocated() at memory_allocated()
//	heap_live()        the Go heap's live bytes after a reclaim (a full GC):
//	                   the interpreter's own memory, not tensors
//	cpu_percent(interval=0.1, percpu=False)
//	                   system-wide CPU busy % over interval seconds, as
//	                   psutil.cpu_percent: a float, or a list of floats (one
//	                   per core) with percpu=True; interval=0 compares with
//	                   this session's previous call (the first returns 0.0)
var Module = &starlarkstruct.Module{
	Name: "host",
	Members: starlark.StringDict{
		"rss":                     starlark.NewBuiltin("host.rss", rss),
		"peak_rss":                starlark.NewBuiltin("host.peak_rss", peakRSS),
		"reset_peak":              starlark.NewBuiltin("host.reset_peak", resetPeak),
		"total":                   starlark.NewBuiltin("host.total", total),
		"available":               starlark.NewBuiltin("host.available", available),
		"heap_live":               starlark.NewBuiltin("host.heap_live", heapLive),
		"memory_allocated":        starlark.NewBuiltin("host.memory_allocated", allocatorStat("allocated_bytes.all.current")),
		"max_memory_allocated":    starlark.NewBuiltin("host.max_memory_allocated", allocatorStat("allocated_bytes.all.peak")),
		"reset_peak_memory_stats": starlark.NewBuiltin("host.reset_peak_memory_stats", resetPeakMemoryStats),
		"cpu_percent":             starlark.NewBuiltin("host.cpu_percent", cpuPercent),
	},
}

// noArgs unpacks no arguments and returns the thread's Env. Every host
// call starts peak_rss's session counter if it is not running yet (a
// counter that cannot be opened shows up as peak_rss's error).
func noArgs(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (*env.Env, error) {
	e, err := env.NoArgs(thread, b, args, kwargs)
	if err != nil {
		return nil, err
	}
	_, _ = stateOf(e).sessionPeak()
	return e, nil
}

func rss(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	e, err := noArgs(thread, b, args, kwargs)
	if err != nil {
		return nil, err
	}
	return starlark.MakeUint64(Used(e.Manager)), nil
}

func peakRSS(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	e, err := noArgs(thread, b, args, kwargs)
	if err != nil {
		return nil, err
	}
	c, err := stateOf(e).sessionPeak()
	if err != nil {
		return nil, fmt.Errorf("%s: %v", b.Name(), err)
	}
	return starlark.MakeUint64(Read(e.Manager, c, 0).Peak), nil
}

func resetPeak(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	e, err := noArgs(thread, b, args, kwargs)
	if err != nil {
		return nil, err
	}
	c, err := stateOf(e).sessionPeak()
	if err == nil {
		err = c.Reset()
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %v", b.Name(), err)
	}
	return starlark.None, nil
}

func total(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	if _, err := noArgs(thread, b, args, kwargs); err != nil {
		return nil, err
	}
	return starlark.MakeUint64(bhost.Total()), nil
}

func available(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	if _, err := noArgs(thread, b, args, kwargs); err != nil {
		return nil, err
	}
	return starlark.MakeUint64(bhost.Available()), nil
}

// hostAllocator is the Session's "cpu" allocator after a reclaim, for the
// allocator figures (env.NoArgs: they need no RSS counter, which noArgs
// starts).
func hostAllocator(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (*env.Env, backend.Allocator, error) {
	e, err := env.NoArgs(thread, b, args, kwargs)
	if err != nil {
		return nil, nil, err
	}
	a, err := e.Manager.Allocator("cpu")
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", b.Name(), err)
	}
	e.Manager.Reclaim()
	return e, a, nil
}

// allocatorStat returns a builtin giving the host allocator's statistic
// key (memory_stats' names).
func allocatorStat(key string) func(*starlark.Thread, *starlark.Builtin, starlark.Tuple, []starlark.Tuple) (starlark.Value, error) {
	return func(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
		_, a, err := hostAllocator(thread, b, args, kwargs)
		if err != nil {
			return nil, err
		}
		return starlark.MakeInt64(a.Stats()[key]), nil
	}
}

func resetPeakMemoryStats(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	e, a, err := hostAllocator(thread, b, args, kwargs)
	if err != nil {
		return nil, err
	}
	e.Manager.ResetPeakStats(a)
	return starlark.None, nil
}

func heapLive(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	e, err := noArgs(thread, b, args, kwargs)
	if err != nil {
		return nil, err
	}
	e.Manager.Collect() // the figure is the last collection's: make it current
	return starlark.MakeUint64(bhost.HeapLive()), nil
}

// maxInterval bounds cpu_percent's blocking wait.
const maxInterval = 60.0

func cpuPercent(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	interval := starlark.Value(starlark.Float(0.1))
	percpu := false
	if err := starlark.UnpackArgs(b.Name(), args, kwargs, "interval?", &interval, "percpu?", &percpu); err != nil {
		return nil, err
	}
	secs, err := numarg.Finite(b.Name(), "interval", interval)
	if err != nil {
		return nil, err
	}
	if secs < 0 || secs > maxInterval {
		return nil, fmt.Errorf("%s: for parameter interval: %v is not between 0 and %v seconds", b.Name(), secs, maxInterval)
	}
	e, err := env.Of(thread, b.Name())
	if err != nil {
		return nil, err
	}
	s := stateOf(e)
	_, _ = s.sessionPeak()
	var before []cpuTimes
	if secs == 0 {
		s.mu.Lock()
		before = s.lastCPU
		s.mu.Unlock()
	} else {
		if before, err = readCPU(); err != nil {
			return nil, fmt.Errorf("%s: %v", b.Name(), err)
		}
		time.Sleep(time.Duration(secs * float64(time.Second)))
	}
	after, err := readCPU()
	if err != nil {
		return nil, fmt.Errorf("%s: %v", b.Name(), err)
	}
	s.mu.Lock()
	s.lastCPU = after
	s.mu.Unlock()
	per := busyPercent(before, after)
	if percpu {
		l := make([]starlark.Value, len(per)-1)
		for i, p := range per[1:] {
			l[i] = starlark.Float(p)
		}
		return starlark.NewList(l), nil
	}
	return starlark.Float(per[0]), nil
}

// cpuTimes is one line of /proc/stat: busy and total time in seconds.
type cpuTimes struct{ busy, total float64 }

// readCPU returns the all-cores times followed by each core's.
func readCPU() ([]cpuTimes, error) {
	all, err := cpu.Times(false)
	if err != nil {
		return nil, err
	}
	per, err := cpu.Times(true)
	if err != nil {
		return nil, err
	}
	out := make([]cpuTimes, 0, 1+len(per))
	for _, t := range append(all[:1:1], per...) {
		// Guest time is already part of user time on Linux.
		tot := t.User + t.Nice + t.System + t.Idle + t.Iowait + t.Irq + t.Softirq + t.Steal
		out = append(out, cpuTimes{busy: tot - t.Idle - t.Iowait, total: tot})
	}
	return out, nil
}

// busyPercent returns the busy % of each entry between a and b (0 where
// there is no earlier reading or the counters did not advance), as psutil
// computes cpu_percent.
func busyPercent(a, b []cpuTimes) []float64 {
	out := make([]float64, len(b))
	if len(a) != len(b) {
		return out
	}
	for i := range b {
		dt := b[i].total - a[i].total
		db := b[i].busy - a[i].busy
		if dt <= 0 || db <= 0 {
			continue
		}
		out[i] = min(100, 100*db/dt)
	}
	return out
}
