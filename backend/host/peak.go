package host

import (
	"errors"
	"os"
	"sync"
	"time"
)

// Linux keeps one high-water mark of RSS per process (VmHWM in
// /proc/self/status) and lets the process reset it to the current RSS by
// writing "5" to /proc/self/clear_refs. PeakRSS builds any number of
// independent counters on that single mark:
//
//   - each open counter c keeps a folded maximum m_c;
//   - peak(c) = max(m_c, VmHWM), where VmHWM covers the time since the last
//     kernel reset;
//   - resetting (or opening) c first folds the current VmHWM into m_d for
//     every other open counter d, then resets the kernel mark, then sets
//     m_c to the current RSS.
//
// Every kernel reset happens at or after the start of every open counter,
// and every counter's m holds the maxima of all the kernel epochs between its
// start and the last kernel reset, so every counter stays exact. The kernel
// mark is per process, so the bookkeeping below is too: all exact counters of
// all PeakRSS values share it, and two PeakRSS (two Sessions) in one process
// do not disturb each other.
//
// The kernel updates its mark before any page is unmapped (munmap, madvise
// DONTNEED, exit), so a transient allocation freed before the reading still
// counts, however short it lived. The one gap is the few microseconds
// between reading VmHWM and resetting it: a spike that another thread both
// makes and frees within that window is lost to the other counters.
var kernel struct {
	mu        sync.Mutex
	probe     sync.Once
	clearRefs *os.File                 // nil when /proc/self/clear_refs is not writable
	open      map[*RSSCounter]struct{} // open exact counters, of all PeakRSS
}

// probeClearRefs reports whether the kernel high-water mark can be reset,
// keeping /proc/self/clear_refs open for the resets. It resets the mark once,
// before any exact counter exists.
func probeClearRefs() bool {
	kernel.probe.Do(func() {
		f, err := os.OpenFile("/proc/self/clear_refs", os.O_WRONLY, 0)
		if err != nil {
			return
		}
		if _, err := f.Write([]byte("5")); err != nil {
			f.Close()
			return
		}
		kernel.clearRefs = f
		kernel.open = make(map[*RSSCounter]struct{})
	})
	return kernel.clearRefs != nil
}

// SampleInterval is how often the fallback sampler reads RSS.
const SampleInterval = 5 * time.Millisecond

// PeakRSS hands out independent peak-RSS counters ([RSSCounter]). Where the
// kernel's high-water mark can be reset (Linux with a writable
// /proc/self/clear_refs) every counter is exact: any transient allocation
// counts, however short. Otherwise a sampler goroutine reads RSS every
// SampleInterval while at least one counter is open, and peaks shorter than
// that can be missed; Exact reports which. A PeakRSS and its counters are
// safe for use by multiple goroutines.
type PeakRSS struct {
	exact    bool
	interval time.Duration

	// sampled mode only
	mu   sync.Mutex
	open map[*RSSCounter]struct{}
	stop chan struct{} // closed to stop the running sampler; nil when none runs
	done chan struct{} // closed by the sampler when it has stopped
}

// RSSCounter is one peak-RSS counter: the maximum RSS since it was opened or
// last reset.
type RSSCounter struct {
	p      *PeakRSS
	max    uint64 // exact mode: folded maximum of earlier kernel epochs; sampled: maximum seen
	closed bool
}

// NewPeakRSS returns a PeakRSS, exact when this process may reset its
// kernel high-water mark.
func NewPeakRSS() *PeakRSS {
	return newPeakRSS(false, SampleInterval)
}

// newPeakRSS returns a PeakRSS in sampled mode when sampled is set (for
// tests) or the kernel mark cannot be reset, otherwise in exact mode.
func newPeakRSS(sampled bool, interval time.Duration) *PeakRSS {
	if !sampled && !probeClearRefs() {
		sampled = true
	}
	p := &PeakRSS{exact: !sampled, interval: interval}
	if sampled {
		p.open = make(map[*RSSCounter]struct{})
	}
	return p
}

// Exact reports whether the counters are exact (kernel high-water mark)
// rather than sampled.
func (p *PeakRSS) Exact() bool { return p.exact }

// Len is the number of open counters of p.
func (p *PeakRSS) Len() int {
	n := 0
	if p.exact {
		kernel.mu.Lock()
		for c := range kernel.open {
			if c.p == p {
				n++
			}
		}
		kernel.mu.Unlock()
		return n
	}
	p.mu.Lock()
	n = len(p.open)
	p.mu.Unlock()
	return n
}

func (p *PeakRSS) lock() *sync.Mutex {
	if p.exact {
		return &kernel.mu
	}
	return &p.mu
}

var errClosed = errors.New("host: peak RSS counter is closed")

// New opens a counter whose peak starts at the current RSS.
func (p *PeakRSS) New() (*RSSCounter, error) {
	c := &RSSCounter{p: p}
	mu := p.lock()
	mu.Lock()
	defer mu.Unlock()
	if p.exact {
		if err := c.resetExact(); err != nil {
			return nil, err
		}
		kernel.open[c] = struct{}{}
		return c, nil
	}
	rss, err := RSS()
	if err != nil {
		return nil, err
	}
	c.max = rss
	p.open[c] = struct{}{}
	if p.stop == nil {
		p.stop, p.done = make(chan struct{}), make(chan struct{})
		go p.sample(p.stop, p.done)
	}
	return c, nil
}

// resetExact restarts c (kernel.mu held): fold the current kernel mark into
// every other open counter, reset the mark, start c at the current RSS.
func (c *RSSCounter) resetExact() error {
	others := len(kernel.open)
	if _, ok := kernel.open[c]; ok {
		others--
	}
	if others > 0 {
		h, err := hwm()
		if err != nil {
			return err
		}
		for d := range kernel.open {
			if d != c {
				d.max = max(d.max, h)
			}
		}
	}
	if _, err := kernel.clearRefs.Write([]byte("5")); err != nil {
		return err
	}
	// After the reset VmHWM is the current RSS, so m_c = RSS is implied;
	// recording it keeps the counter right if the RSS cannot be read.
	rss, _ := RSS()
	c.max = rss
	return nil
}

// Peak returns the maximum RSS since the counter was opened or last reset
// (including now). After Close it returns the peak at the time of Close.
func (c *RSSCounter) Peak() (uint64, error) {
	mu := c.p.lock()
	mu.Lock()
	defer mu.Unlock()
	return c.peakLocked()
}

func (c *RSSCounter) peakLocked() (uint64, error) {
	if c.closed {
		return c.max, nil
	}
	var now uint64
	var err error
	if c.p.exact {
		now, err = hwm()
	} else {
		now, err = RSS()
	}
	if err != nil {
		return 0, err
	}
	if !c.p.exact {
		c.max = max(c.max, now)
	}
	return max(c.max, now), nil
}

// Reset restarts the counter at the current RSS, without disturbing any
// other counter.
func (c *RSSCounter) Reset() error {
	mu := c.p.lock()
	mu.Lock()
	defer mu.Unlock()
	if c.closed {
		return errClosed
	}
	if c.p.exact {
		return c.resetExact()
	}
	rss, err := RSS()
	if err != nil {
		return err
	}
	c.max = rss
	return nil
}

// Close stops the counter; Peak keeps returning its final value. Closing the
// last counter of a sampled PeakRSS stops its sampler. Close is idempotent.
func (c *RSSCounter) Close() {
	p := c.p
	mu := p.lock()
	mu.Lock()
	if c.closed {
		mu.Unlock()
		return
	}
	if pk, err := c.peakLocked(); err == nil {
		c.max = pk
	}
	c.closed = true
	if p.exact {
		delete(kernel.open, c)
		mu.Unlock()
		return
	}
	delete(p.open, c)
	var done chan struct{}
	if len(p.open) == 0 && p.stop != nil {
		close(p.stop)
		done = p.done
		p.stop, p.done = nil, nil
	}
	mu.Unlock()
	if done != nil {
		<-done
	}
}

// sample is the fallback sampler: every p.interval it raises the maximum of
// every open counter to the current RSS, until stop is closed.
func (p *PeakRSS) sample(stop, done chan struct{}) {
	defer close(done)
	t := time.NewTicker(p.interval)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		rss, err := RSS()
		p.mu.Lock()
		select {
		case <-stop:
			p.mu.Unlock()
			return
		default:
		}
		if err == nil {
			for c := range p.open {
				c.max = max(c.max, rss)
			}
		}
		p.mu.Unlock()
	}
}

// sampling reports whether p's sampler goroutine is running (for tests).
func (p *PeakRSS) sampling() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stop != nil
}
