package profile

import (
	"slices"
	"strings"

	"go.starlark.net/starlark"

	"github.com/memsh/memsh/backend"
	"github.com/memsh/memsh/env"
)

// funcID identifies a Starlark function by name and the position of its
// def (or lambda), so every closure made from one def is one function.
type funcID struct {
	name      string
	file      string
	line, col int32
}

func idOf(fn *starlark.Function) funcID {
	p := fn.Position()
	return funcID{name: fn.Name(), file: p.Filename(), line: p.Line, col: p.Col}
}

// lineKey is one source line of one function, on one device.
type lineKey struct {
	fn   funcID
	dev  string
	line int32
}

// table is what one or more profiled calls recorded: per line and device
// the maxima across calls of each call's figures.
type table struct {
	top   funcID
	lines map[lineKey]*acc
	funcs []funcID            // in order of first appearance, top first
	devs  map[funcID][]string // each function's devices, in order of first event
	calls int
}

func newTable(top funcID) *table {
	return &table{top: top, lines: map[lineKey]*acc{}, funcs: []funcID{top}, devs: map[funcID][]string{}}
}

func (t *table) addFunc(fn funcID, dev string) {
	if !slices.Contains(t.funcs, fn) {
		t.funcs = append(t.funcs, fn)
	}
	if !slices.Contains(t.devs[fn], dev) {
		t.devs[fn] = append(t.devs[fn], dev)
	}
}

// add merges one call's figures: the maximum of each figure across calls.
func (t *table) add(r *run) {
	t.calls++
	for _, fn := range r.t.funcs {
		for _, dev := range r.t.devs[fn] {
			t.addFunc(fn, dev)
		}
	}
	for k, a := range r.t.lines {
		if b := t.lines[k]; b != nil {
			b.merge(a)
		} else {
			c := *a
			t.lines[k] = &c
		}
	}
}

// run records one call of a profiled function. It observes the Manager's
// memory events synchronously: for each event it reads the Session thread's
// call stack and attributes the event to the current line of every
// Starlark function frame inside the profiled call (so a line that calls a
// function gets what the callee allocated, and the callee has its own
// table). It holds no Starlark value.
type run struct {
	thread *starlark.Thread
	base   int // frames outside the profiled call
	levels map[string]*levels
	peaks  map[string]*backend.Peak // exact peak mode: reset at every event
	t      *table
	keys   []lineKey // scratch
}

// startRun prepares a call of top made from a builtin at the thread's
// current depth. In exact peak mode it opens a peak counter on every
// allocator and restarts it at every event, so every allocation in the call
// reclaims garbage first and no line's peak counts garbage (the figures of
// a reference-counted runtime, at a reclaim per allocation).
func startRun(e *env.Env, thread *starlark.Thread, top funcID) *run {
	m := e.Manager
	r := &run{thread: thread, base: thread.CallStackDepth(), levels: map[string]*levels{}, t: newTable(top)}
	allocs := []backend.Allocator{m.Host()}
	for i := 0; i < m.NumGPUs(); i++ {
		allocs = append(allocs, m.GPU(i))
	}
	if m.PeakMode().Exact() {
		r.peaks = map[string]*backend.Peak{}
	}
	for _, a := range allocs {
		if a == nil {
			continue
		}
		name := a.Device().Name()
		r.levels[name] = initLevels(a)
		if r.peaks != nil {
			r.peaks[name] = a.Peaks().New(a.Allocated(), a.Reserved())
		}
	}
	return r
}

func (r *run) close() {
	for _, p := range r.peaks {
		p.Close()
	}
}

// observe is the Manager observer.
func (r *run) observe(ev backend.Event) {
	if p := r.peaks[ev.Device]; p != nil {
		p.Reset(ev.Allocated, ev.Reserved)
	}
	lv := r.levels[ev.Device]
	n := r.thread.CallStackDepth()
	if lv == nil || n <= r.base {
		return
	}
	if ev.Size == 0 && (ev.Kind == backend.EventAlloc || ev.Kind == backend.EventFree) {
		return // zero-size blocks change no statistic
	}

	// The event's change to each statistic.
	var d levels
	var ooms int64
	caching := strings.HasPrefix(ev.Device, "cuda")
	pool := pLarge
	size := int64(ev.Size)
	switch ev.Kind {
	case backend.EventAlloc, backend.EventFree:
		if ev.Size <= 1<<20 {
			pool = pSmall
		}
		sign := int64(1)
		if ev.Kind == backend.EventFree {
			sign = -1
		}
		d[sAllocatedBytes][pAll] = sign * size
		d[sRequestedBytes][pAll] = sign * int64(ev.Requested)
		d[sAllocation][pAll] = sign
		if !caching { // each host block is its own device allocation
			d[sReservedBytes][pAll] = sign * size
			d[sSegment][pAll] = sign
		}
	case backend.EventSegmentAlloc, backend.EventSegmentFree:
		if ev.Size == 2<<20 {
			pool = pSmall // only the small pool uses 2 MiB segments
		}
		sign := int64(1)
		if ev.Kind == backend.EventSegmentFree {
			sign = -1
		}
		d[sReservedBytes][pAll] = sign * size
		d[sSegment][pAll] = sign
	case backend.EventOOM:
		ooms = 1
	}
	if caching {
		for s := range nStat {
			d[s][pool] = d[s][pAll]
		}
	}
	for s := range nStat {
		for p := range nPool {
			lv[s][p] += d[s][p]
		}
	}
	// The allocator's own figures are authoritative for the totals.
	lv[sAllocatedBytes][pAll] = int64(ev.Allocated)
	lv[sReservedBytes][pAll] = int64(ev.Reserved)
	raise := ev.Kind == backend.EventAlloc || ev.Kind == backend.EventSegmentAlloc

	// The current line of every Starlark function inside the call, each
	// once (a recursive function's line is not counted twice).
	keys := r.keys[:0]
	for j := n - r.base - 1; j >= 0; j-- {
		fr := r.thread.DebugFrame(j)
		fn, ok := fr.Callable().(*starlark.Function)
		if !ok {
			continue
		}
		k := lineKey{fn: idOf(fn), dev: ev.Device, line: fr.Position().Line}
		if slices.Contains(keys, k) {
			continue
		}
		keys = append(keys, k)
		r.t.addFunc(k.fn, k.dev)
		a := r.t.lines[k]
		if a == nil {
			a = &acc{}
			r.t.lines[k] = a
		}
		for s := range nStat {
			for p := range nPool {
				if v := d[s][p]; v > 0 {
					a.inc[s][p] += v
				} else {
					a.dec[s][p] -= v
				}
				a.cur[s][p] = lv[s][p]
				if raise {
					a.peak[s][p] = max(a.peak[s][p], lv[s][p])
				}
			}
		}
		a.ooms += ooms
		a.allocs = a.allocs || raise
	}
	r.keys = keys
}

// call runs fn(args, kwargs) under a new run and merges it into t.
func call(e *env.Env, thread *starlark.Thread, fn *starlark.Function, args starlark.Tuple, kwargs []starlark.Tuple, t *table) (starlark.Value, error) {
	r := startRun(e, thread, t.top)
	remove := e.Manager.Observe(r.observe)
	// Deferred: a checkpoint's recomputation stops early by unwinding
	// through fn (tensor/autograd.Checkpoint).
	defer func() {
		remove()
		r.close()
		t.add(r)
	}()
	// The run keeps figures only: what fn drops, the walk may free.
	thread.DeclareTransparent()
	return starlark.Call(thread, fn, args, kwargs)
}
