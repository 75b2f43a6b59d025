package host

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// CPUTime returns the CPU time this process has used, user plus system, over
// all its threads (getrusage(RUSAGE_SELF); microsecond resolution, finer than
// the 10 ms ticks of /proc/self/stat).
func CPUTime() (time.Duration, error) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, fmt.Errorf("host: getrusage: %w", err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), nil
}

// coreTimes is one core's line of /proc/stat, in clock ticks.
type coreTimes struct {
	busy, total uint64
}

// readCores returns the per-core times of /proc/stat ("cpuN ..." lines),
// in core order. Busy is everything but idle and iowait; guest time is
// already part of user time and is not added again.
func readCores() ([]coreTimes, error) {
	f, err := os.Open("/proc/stat")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var cores []coreTimes
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Bytes()
		if !bytes.HasPrefix(line, []byte("cpu")) {
			break // the cpu lines come first
		}
		fields := bytes.Fields(line)
		if string(fields[0]) == "cpu" {
			continue // the all-cores line
		}
		// user nice system idle iowait irq softirq steal [guest guest_nice]
		var v [8]uint64
		for i := 0; i < len(v) && i+1 < len(fields); i++ {
			v[i], err = strconv.ParseUint(string(fields[i+1]), 10, 64)
			if err != nil {
				return nil, fmt.Errorf("host: cannot parse /proc/stat line %q", line)
			}
		}
		total := v[0] + v[1] + v[2] + v[3] + v[4] + v[5] + v[6] + v[7]
		cores = append(cores, coreTimes{busy: total - v[3] - v[4], total: total})
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(cores) == 0 {
		return nil, errors.New("host: no per-core lines in /proc/stat")
	}
	return cores, nil
}

// usage returns each core's busy % between a and b (-1 for a core whose
// counters did not advance) and the mean busy % over all cores.
func usage(a, b []coreTimes) (perCore []float64, mean float64) {
	if len(a) != len(b) { // a core went on- or offline
		return nil, 0
	}
	perCore = make([]float64, len(a))
	var busy, total uint64
	for i := range a {
		db, dt := sub(b[i].busy, a[i].busy), sub(b[i].total, a[i].total)
		busy += db
		total += dt
		if dt == 0 {
			perCore[i] = -1
			continue
		}
		perCore[i] = min(100, 100*float64(db)/float64(dt))
	}
	if total > 0 {
		mean = min(100, 100*float64(busy)/float64(total))
	}
	return perCore, mean
}

// sub is a - b, or 0 when the kernel's counter went backwards.
func sub(a, b uint64) uint64 {
	if a < b {
		return 0
	}
	return a - b
}

// CPUInterval is the sampling period of CPUMeter's per-core sampler.
const CPUInterval = 100 * time.Millisecond

// CPUUsage is what a CPUMeter measured.
type CPUUsage struct {
	Wall time.Duration // wall-clock time between Start and Stop
	CPU  time.Duration // this process's user+system CPU time in that interval
	// ProcessPercent is CPU / Wall * 100, the mean CPU use of this process;
	// above 100 when several threads ran at once.
	ProcessPercent float64
	// SystemPercent is the mean busy % of all cores, all processes
	// (ipython_memory_usage's "system mean cpu").
	SystemPercent float64
	// MaxCorePercent is the busiest single core's busy % over any sampling
	// period (CPUInterval, or the whole interval when shorter), all
	// processes (ipython_memory_usage's "single max cpu"). /proc/stat counts
	// in 10 ms ticks, so intervals of a few ticks give coarse values.
	MaxCorePercent float64
}

// CPUMeter measures CPU use over an interval. While a meter runs, a
// goroutine samples the per-core counters of /proc/stat every CPUInterval to
// find the busiest core; it stops with the meter.
type CPUMeter struct {
	start    time.Time
	cpu0     time.Duration
	first    []coreTimes
	stop     chan struct{}
	done     chan struct{}
	stopOnce sync.Once

	mu      sync.Mutex
	last    []coreTimes // cores at the last sample
	lastAt  time.Time
	maxCore float64
}

// StartCPUMeter starts a meter.
func StartCPUMeter() (*CPUMeter, error) {
	cores, err := readCores()
	if err != nil {
		return nil, err
	}
	// Wall time brackets CPU time (start before, stop after) so that a
	// single busy thread never reads above 100%.
	now := time.Now()
	cpu0, err := CPUTime()
	if err != nil {
		return nil, err
	}
	m := &CPUMeter{
		start: now, cpu0: cpu0, first: cores, last: cores, lastAt: now,
		stop: make(chan struct{}), done: make(chan struct{}),
	}
	go m.sample()
	return m, nil
}

func (m *CPUMeter) sample() {
	defer close(m.done)
	t := time.NewTicker(CPUInterval)
	defer t.Stop()
	for {
		select {
		case <-m.stop:
			return
		case <-t.C:
		}
		cores, err := readCores()
		if err != nil {
			continue
		}
		m.mu.Lock()
		m.fold(cores)
		m.mu.Unlock()
	}
}

// fold records the per-core % since the last sample (m.mu held).
func (m *CPUMeter) fold(cores []coreTimes) {
	per, _ := usage(m.last, cores)
	for _, p := range per {
		m.maxCore = max(m.maxCore, p)
	}
	m.last, m.lastAt = cores, time.Now()
}

var errStopped = errors.New("host: CPUMeter already stopped")

// Stop stops the meter and its sampler and returns what it measured. A
// second Stop returns an error.
func (m *CPUMeter) Stop() (CPUUsage, error) {
	stopped := true
	m.stopOnce.Do(func() {
		stopped = false
		close(m.stop)
	})
	if stopped {
		return CPUUsage{}, errStopped
	}
	<-m.done
	cpu1, err := CPUTime()
	if err != nil {
		return CPUUsage{}, err
	}
	wall := time.Since(m.start)
	cores, err := readCores()
	if err != nil {
		return CPUUsage{}, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	// The last, partial period counts when it is at least half a period
	// long, or when it is the whole interval; shorter tails hold too few
	// ticks to mean anything.
	if time.Since(m.lastAt) >= CPUInterval/2 || m.lastAt.Equal(m.start) {
		m.fold(cores)
	}
	_, mean := usage(m.first, cores)
	u := CPUUsage{
		Wall:           wall,
		CPU:            cpu1 - m.cpu0,
		SystemPercent:  mean,
		MaxCorePercent: max(m.maxCore, 0),
	}
	if wall > 0 {
		u.ProcessPercent = 100 * float64(u.CPU) / float64(wall)
	}
	return u, nil
}
