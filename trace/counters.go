package trace

// A counter track keeps its samples in windows of res nanoseconds. While
// the trace is within its budget res is 0 and every sample is its own
// window (exact); past the budget res doubles and neighbouring windows
// merge, keeping each window's maximum (with its time) and its last value.
// So a trace of any length stays bounded and never loses a peak: it only
// loses the exact time and order of samples within one window.

// window is the samples of one track in [idx·res, (idx+1)·res).
type window struct {
	first  int64     // time of the first sample
	maxTs  int64     // time of the sample with the largest first value
	max    [2]uint64 // largest value of each series in the window
	lastTs int64     // time of the last sample
	last   [2]uint64 // the last sample's values
}

// track is one counter ("cuda:0 memory" with the series allocated,
// "cuda:0 reserved" with reserved, "host memory" with rss).
type track struct {
	name    string
	keys    []string // series names, at most 2
	windows []window
}

// counters is every counter track with a shared window budget.
type counters struct {
	tracks     []*track
	byName     map[string]*track
	res        int64 // window length in ns; 0 = every sample exact
	n          int   // windows over all tracks
	maxWindows int
}

func newCounters(maxWindows int) *counters {
	return &counters{byName: map[string]*track{}, maxWindows: max(maxWindows, 16)}
}

func (c *counters) track(name string, keys ...string) *track {
	if t := c.byName[name]; t != nil {
		return t
	}
	t := &track{name: name, keys: keys}
	c.byName[name] = t
	c.tracks = append(c.tracks, t)
	return t
}

// add records a sample of t at time ts (ns since the trace started; ts
// never decreases for one track).
func (c *counters) add(t *track, ts int64, v0, v1 uint64) {
	if n := len(t.windows); n > 0 && c.res > 0 {
		w := &t.windows[n-1]
		if w.first/c.res == ts/c.res {
			if v0 > w.max[0] {
				w.max[0], w.maxTs = v0, ts
			}
			w.max[1] = max(w.max[1], v1)
			w.lastTs, w.last = ts, [2]uint64{v0, v1}
			return
		}
	}
	t.windows = append(t.windows, window{first: ts, maxTs: ts, max: [2]uint64{v0, v1}, lastTs: ts, last: [2]uint64{v0, v1}})
	c.n++
	if c.n > c.maxWindows {
		c.coarsen()
	}
}

// coarsen doubles the window length until the windows fit in three
// quarters of the budget.
func (c *counters) coarsen() {
	if c.res == 0 {
		var span int64
		for _, t := range c.tracks {
			if n := len(t.windows); n > 0 {
				span = max(span, t.windows[n-1].lastTs-t.windows[0].first)
			}
		}
		c.res = max(1000, span/int64(c.maxWindows)) // at least 1 µs
	}
	for c.n > c.maxWindows*3/4 {
		c.res *= 2
		c.n = 0
		for _, t := range c.tracks {
			t.windows = merge(t.windows, c.res)
			c.n += len(t.windows)
		}
	}
}

// merge combines consecutive windows that fall in the same window of
// length res.
func merge(ws []window, res int64) []window {
	out := ws[:0]
	for _, w := range ws {
		if n := len(out); n > 0 && out[n-1].first/res == w.first/res {
			o := &out[n-1]
			if w.max[0] > o.max[0] {
				o.max[0], o.maxTs = w.max[0], w.maxTs
			}
			o.max[1] = max(o.max[1], w.max[1])
			o.lastTs, o.last = w.lastTs, w.last
			continue
		}
		out = append(out, w)
	}
	clear(ws[len(out):])
	return out
}

// events returns the number of counter events the tracks write.
func (c *counters) events() int {
	n := 0
	for _, t := range c.tracks {
		for _, w := range t.windows {
			n += w.points()
		}
	}
	return n
}

// points is how many counter events a window writes: its maximum, and its
// last value when that differs.
func (w *window) points() int {
	if w.lastTs != w.maxTs || w.last != w.max {
		return 2
	}
	return 1
}
