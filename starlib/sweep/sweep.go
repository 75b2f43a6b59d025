// Package sweep is the Starlark module `sweep`: searches and grids over a
// workload's parameters in which every point is a trial (docs/starlark.md: trials): an
// out-of-memory error is data, memory is verified back at its baseline
// between points, and each point is recorded (--out), resumable, and
// assigned to a shard (--shard) by package record.
package sweep

import (
	"fmt"
	"strings"

	"go.starlark.net/starlark"
	"go.starlark.net/starlarkstruct"

	"github.com/memsh/memsh/backend"
	"github.com/memsh/memsh/backend/replay"
	"github.com/memsh/memsh/env"
	"github.com/memsh/memsh/env/refpath"
	"github.com/memsh/memsh/record"
	stensor "github.com/memsh/memsh/starlib/tensor"
)

// Module is the sweep module:
//
//	max_fit(fn, low=1, high=None, mode="power", margin=0.0, max_trials=25, name="", search="exact", confirm=None, fresh=False, replay=False)
//	    the largest int n in [low, high] for which fn(n) does not run out of
//	    memory, PyTorch Lightning's batch-size finder: "power" doubles n from
//	    low until the first OOM; "binsearch" then bisects between the last
//	    fit and the first OOM down to the exact boundary; "interpolate"
//	    bounds the boundary by the line through two trials' peaks on each
//	    GPU (above: where the allocated bytes pass what the allocator
//	    could hold, reserved plus free; below: where the reserved bytes
//	    reach it), doubles while the bound above is past the next
//	    doubling and then bisects between the bounds (interpolate.go):
//	    binsearch's boundary wherever the sizes that train are an
//	    interval, in fewer trials; at most max_trials calls. Returns
//	    struct(best, fit, oom, trials, skipped): fit is the largest n
//	    that ran, oom the smallest above it that ran out of memory (None if
//	    none did), best is floor(fit × (1 − margin)) but not below low (None
//	    when nothing fits), trials the points in the order run, skipped
//	    True when another shard runs this search. fn's first parameter
//	    names the swept value; name names the sweep (default: fn's name).
//	    search="lazy" runs the search trials in lazy peak mode (fast: no
//	    reclaim before each peak-raising allocation, so their peaks may
//	    include garbage) and then confirms the boundary with trials in
//	    exact peak mode (params confirm=True) — fit runs and fit+1 does
//	    not, with the allocator's layout (and so its fragmentation and
//	    OOMs) that of a reference-counted run, moving the boundary with
//	    more such trials if exact mode disagrees. search="exact" (the
//	    default) runs the trials in the session's mode (exact: PyTorch's
//	    allocator state, unless --peak lazy); search="layout" (exact
//	    mode's former name) in exact mode whatever the session's. confirm
//	    (default: True for search="lazy", else False) confirms the
//	    boundary of a search not in exact mode with exact-mode trials as
//	    above; where fragmentation makes the sizes that train not an
//	    interval, that can be another boundary than an exact search's,
//	    whose trials are the ones PyTorch's own search makes. fresh=True starts every
//	    trial as in a fresh process: the cuBLAS and cuBLASLt workspaces
//	    are freed first (torch._C._cuda_clearCublasWorkspaces()), so the
//	    trial's first matrix products allocate them again where the
//	    allocator then puts them, and no trial's outcome depends on the
//	    trials before it; the table says so, and its peaks are above what
//	    a trial started with. fresh="search" does that before the
//	    search's first trial only: the trials after it keep the
//	    workspaces it allocated, as the trials of one PyTorch process
//	    do. replay=True (search "exact" or "layout",
//	    simulated meta GPUs) records each full trial's memory events and,
//	    once three ok trials have the same program but for the sizes,
//	    fits each allocation's size as a polynomial of degree 2 at most
//	    in n (verified by a trial at a fourth size, run with a reclaim
//	    before every allocation, which is no point of the sweep), then
//	    answers the trials that replay runs without running out of
//	    memory by replaying the predicted events through a copy of the
//	    caching allocator (backend/replay): no Starlark runs. Trials that
//	    run out of memory, and those a replay cannot answer as a full
//	    trial would, run in full. The boundary (fit) and each model's
//	    largest replayed trial are confirmed by full trials; one that
//	    disagrees turns replay off and every replayed trial runs again in
//	    full. Replayed trials are marked (replayed) in the table, have
//	    value None and host figures of zero, are not recorded (--out), and
//	    leave the allocators' statistics as they were; the points of a
//	    replay=True search have two more fields: replayed (bool) and
//	    reserved (each GPU's peak reserved bytes).
//	grid(fn, **values)
//	    runs fn(**point) for every combination of the given lists of
//	    values (the last parameter varying fastest). Returns struct(trials).
//	    The sweep is named after fn.
//
// Each point of either is a trial: struct(name, params, status, error,
// value, data, resumed), with status "ok", "oom" or "error" and data as
// trial() gives it. A sweep empties the allocators' caches when it
// starts, before each point (as Lightning's garbage_collection_cuda does)
// and when it ends. After each point every allocator's allocated bytes
// must be back at their figure from before the sweep, otherwise the sweep
// stops with an error naming what still holds the memory (fn should return
// plain values, not tensors). A point that fails with an error other than
// out of memory stops the sweep with that error (it is recorded as
// "error", never taken for an OOM). Both print a summary table
// (parameters, status, peak per device above its figure before the sweep,
// time) and show a progress bar on stderr while they run, when stderr is
// a terminal.
//
// With --out FILE.jsonl, points that an earlier run recorded there as "ok"
// or "oom" are not run again (marked resumed); points are recognised by the
// sweep's name and their parameters. With --shard i/n only this shard's
// units run: each grid point is a unit, and a whole max_fit search is one
// unit; other shards' points are left out of the results.
var Module = &starlarkstruct.Module{
	Name: "sweep",
	Members: starlark.StringDict{
		"max_fit": starlark.NewBuiltin("sweep.max_fit", maxFit),
		"grid":    starlark.NewBuiltin("sweep.grid", grid),
	},
}

// point is one sweep point, run or resumed.
type point struct {
	name    string
	keys    []string // parameter names, in order
	params  starlark.StringDict
	pidx    []int32 // the params as indices into the runner's stored values (grid), or nil
	status  string  // "ok", "oom", "error"
	err     string
	value   starlark.Value
	data    *env.Data
	resumed bool
	// max_fit(replay=True): answered by replaying a recorded stream; the
	// GPUs' peak reserved bytes (non-nil: the point shows its replay
	// fields); the stream recorded while it ran in full
	replayed bool
	reserved []uint64
	stream   *replay.Stream
	// peakReserved, peakAllocated and budget: the GPUs' peak reserved
	// and allocated bytes in the trial (a replayed trial's too) and what
	// their allocators could hold (reserved + free after it), when the
	// runner measures them (runner.measurePeaks), for
	// max_fit(mode="interpolate")
	peakReserved, peakAllocated, budget []uint64
	// unrecorded: its record could not be written to --out (the table
	// says so; the sweep fails)
	unrecorded bool
}

// Value returns struct(name, params, status, error, value, data, resumed).
func (p *point) Value() starlark.Value {
	params := starlark.NewDict(len(p.keys))
	for _, k := range p.keys {
		_ = params.SetKey(starlark.String(k), p.params[k])
	}
	var errv starlark.Value = starlark.None
	if p.err != "" {
		errv = starlark.String(p.err)
	}
	value := p.value
	if value == nil {
		value = starlark.None
	}
	fields := starlark.StringDict{
		"name":    starlark.String(p.name),
		"params":  params,
		"status":  starlark.String(p.status),
		"error":   errv,
		"value":   value,
		"data":    p.data.Value(),
		"resumed": starlark.Bool(p.resumed),
	}
	if p.reserved != nil {
		fields["replayed"] = starlark.Bool(p.replayed)
		res := make(starlark.Tuple, len(p.reserved))
		for i, v := range p.reserved {
			res[i] = starlark.MakeUint64(v)
		}
		fields["reserved"] = res
	}
	return starlarkstruct.FromStringDict(starlarkstruct.Default, fields)
}

// runner runs the points of one sweep.
type runner struct {
	thread  *starlark.Thread
	env     *env.Env
	rec     *record.State
	builtin string // "sweep.max_fit"
	sweep   string // the sweep's name
	fn      starlark.Callable
	allocs  []backend.Allocator // every GPU, then the host
	base    []uint64            // their allocated bytes before the sweep
	points  points
	bar     *progress
	libSeq  uint64 // the Manager's sequence number up to which library memory is in base
	release func() // ends the runner's being a root of the reach walk
	fresh   bool   // each trial starts as in a fresh process (freshStart)
	// freshSearch: the first trial starts as in a fresh process, the
	// others keep what it made (fresh="search")
	freshSearch bool
	// freshBase is the GPUs' allocated bytes at the start of the last
	// fresh trial (what its peaks are above), nil before one
	freshBase []uint64
	// replayFields: the points show their replay fields (replayed,
	// reserved): max_fit(replay=True), or every sweep under a test's
	// ShowReplayFields
	replayFields bool
	// measurePeaks: each point's peakReserved and budget are measured
	// (max_fit(mode="interpolate") predicts from them)
	measurePeaks bool
}

// showReplayFields makes every sweep's points show their replay fields
// (a test comparing searches with and without replay sets it).
var showReplayFields bool

// Reach walks what the runner keeps across trials (env.Reacher): fn, the
// parameter values and what the trials returned.
func (r *runner) Reach(w *env.Walker) {
	w.Value(r.fn)
	for _, v := range r.points.pvals {
		w.Value(v)
	}
	for _, v := range r.points.values {
		w.Value(v)
	}
}

// close ends the sweep's holding of its values as a root.
func (r *runner) close() { r.release() }

func newRunner(thread *starlark.Thread, builtin, sweep string, fn starlark.Callable) (*runner, error) {
	e, err := env.Of(thread, builtin)
	if err != nil {
		return nil, err
	}
	if e.Session == nil {
		return nil, fmt.Errorf("%s: no memsh session on this thread", builtin)
	}
	r := &runner{thread: thread, env: e, rec: record.Of(e), builtin: builtin, sweep: sweep, fn: fn}
	m := e.Manager
	for i := 0; i < m.NumGPUs(); i++ {
		r.allocs = append(r.allocs, m.GPU(i))
	}
	if m.Host() != nil {
		r.allocs = append(r.allocs, m.Host())
	}
	m.Reclaim()
	r.emptyCaches()
	for _, a := range r.allocs {
		r.base = append(r.base, a.Allocated())
	}
	r.libSeq = m.Seq()
	// Whatever the runner holds while fn runs is walked from here: what
	// fn's trials drop may be freed without a collection.
	r.release = e.Session.Root(r)
	thread.DeclareTransparent()
	return r, nil
}

// emptyCaches releases the allocators' cached segments, as Lightning's
// garbage_collection_cuda does between trials. A sweep does it when it
// starts, before every point and when it ends, so the state after a sweep
// does not depend on which points ran (on this shard, or before a resume).
func (r *runner) emptyCaches() {
	for _, a := range r.allocs {
		a.EmptyCache()
	}
}

// freshStart frees what a process keeps from one trial to the next
// outside what Starlark holds — cuBLAS's and cuBLASLt's workspaces, as
// torch._C._cuda_clearCublasWorkspaces() does — and lowers the baseline
// by it, so that the trial allocates them again at its first matrix
// products, in whichever segment the allocator then picks, as a fresh
// process would: its outcome does not depend on the trials before it.
func (r *runner) freshStart() {
	// what the workspaces took is exactly what Allocated drops by: the
	// clear releases them directly, so no reclaim is needed first
	before := make([]uint64, len(r.allocs))
	for i, a := range r.allocs {
		before[i] = a.Allocated()
	}
	if stensor.Context(r.env).ClearBLASWorkspaces() > 0 {
		for i, a := range r.allocs {
			r.base[i] -= before[i] - a.Allocated()
		}
		r.libSeq = r.env.Manager.Seq()
	}
	r.freshBase = append(r.freshBase[:0], r.base...)
}

// freshIfDue starts a trial as in a fresh process when the sweep says
// so: every trial (fresh=True) or the first (fresh="search").
func (r *runner) freshIfDue() {
	if r.fresh || r.freshSearch && r.freshBase == nil {
		r.freshStart()
	}
}

// baseline is the GPUs' allocated bytes before the sweep, by device.
func (r *runner) baseline() map[string]int64 {
	m := map[string]int64{}
	for i, a := range r.allocs[:r.env.Manager.NumGPUs()] {
		m[a.Device().Name()] = int64(r.base[i])
	}
	return m
}

// currentDevice is the current GPU's name, or "".
func (r *runner) currentDevice() string {
	m := r.env.Manager
	if m.NumGPUs() == 0 {
		return ""
	}
	return m.GPU(m.Current()).Device().Name()
}

// run runs (or resumes) one point at position (unit, step): fn(*args,
// **kwargs) as a trial named after its parameters. pidx, if not nil,
// gives the params as indices of values stored with r.points.addValues.
func (r *runner) run(keys []string, params starlark.StringDict, pidx []int32, args starlark.Tuple, kwargs []starlark.Tuple, unit, step int) (*point, error) {
	return r.runPoint(keys, params, pidx, args, kwargs, unit, step, -1, nil)
}

// begin starts a point: its name, the progress bar, a fresh trial's
// start, and the record of an earlier run (a resumed point, already
// added), if any.
func (r *runner) begin(keys []string, params starlark.StringDict, pidx []int32, unit int) (*point, bool, error) {
	p := &point{keys: keys, params: params, pidx: pidx, name: pointName(keys, params)}
	j, err := record.Params(params)
	if err != nil {
		return nil, false, fmt.Errorf("%s: %v", r.builtin, err)
	}
	r.bar.describe(r.builtin + " " + r.sweep + ": " + p.name)
	// before the lookup: a record's baseline is a fresh trial's
	r.freshIfDue()
	prev, stale := r.rec.Lookup(unit, r.sweep, j, r.baseline())
	if stale {
		fmt.Fprintf(r.env.Out, "%s: the record of %s in %s was measured on another device or with other memory allocated before the sweep; running it again\n",
			r.builtin, p.name, r.rec.Out())
	}
	if prev != nil {
		p.status, p.err, p.resumed = prev.Status, prev.Error, true
		p.data = prev.Data(r.currentDevice())
		if r.replayFields {
			p.reserved = make([]uint64, r.env.Manager.NumGPUs())
		}
		r.points.add(p)
		r.bar.add()
		return p, true, nil
	}
	return p, false, nil
}

// runPoint is run; with size >= 0 it also records the trial's stream
// (point.stream) as that of a trial at size. A non-nil at replaces point
// *at with the trial instead of adding it (a replayed point confirmed).
func (r *runner) runPoint(keys []string, params starlark.StringDict, pidx []int32, args starlark.Tuple, kwargs []starlark.Tuple, unit, step, size int, at *int) (*point, error) {
	p, resumed, err := r.begin(keys, params, pidx, unit)
	if err != nil || resumed {
		return p, err
	}

	r.emptyCaches()
	// The hook captures only the name and ev (cleared below): a removed
	// hook may stay reachable for a while, and must not keep fn's value.
	var ev *env.FinishEvent
	var others int // finish events of experiments and trials inside fn
	name := p.name
	remove := r.env.Session.OnFinish(func(e env.FinishEvent) {
		if e.Kind == "trial" && e.Name == name && e.Params != nil {
			ev = &e
		} else {
			others++
		}
	})
	var peaks []*backend.Peak
	if r.replayFields || r.measurePeaks {
		m := r.env.Manager
		for i := 0; i < m.NumGPUs(); i++ {
			a := m.GPU(i)
			peaks = append(peaks, a.Peaks().New(a.Allocated(), a.Reserved()))
		}
	}
	var rec *replay.Recorder
	if size >= 0 {
		rec = replay.Record(r.env.Manager, size)
	}
	r.rec.Enter(&record.Point{Sweep: r.sweep, Name: p.name, Unit: unit, Step: step, Baseline: r.baseline()})
	v, err := r.env.Session.Trial(r.thread, p.name, r.fn, args, kwargs, params)
	r.rec.Leave()
	if rec != nil {
		p.stream = rec.Stop()
		if others > 0 && p.stream.Why == "" {
			p.stream.Why = "the trial runs experiments or trials of its own"
		}
	}
	for i, pk := range peaks {
		p.peakReserved = append(p.peakReserved, pk.MaxReserved)
		p.peakAllocated = append(p.peakAllocated, pk.MaxAllocated)
		pk.Close()
		if r.measurePeaks {
			a := r.env.Manager.GPU(i)
			free, _, err := a.Device().MemGetInfo()
			if err != nil {
				free = 0
			}
			p.budget = append(p.budget, a.Reserved()+free)
		}
	}
	if r.replayFields {
		p.reserved = p.peakReserved
	}
	remove()
	got := ev
	ev = nil
	if err != nil {
		return nil, err
	}
	if got == nil {
		return nil, fmt.Errorf("%s: internal error: trial %q sent no finish event", r.builtin, p.name)
	}
	p.status, p.err, p.data = got.Status, got.Error, got.Data
	if s, ok := v.(*starlarkstruct.Struct); ok {
		p.value, _ = s.Attr("value")
	}
	recErr := r.rec.Err()
	p.unrecorded = recErr != nil
	if at != nil {
		r.points.set(*at, p)
	} else {
		r.points.add(p)
	}
	r.bar.add()
	if err := r.checkBaseline(p, got.Leaks); err != nil {
		return nil, err
	}
	if recErr != nil {
		return nil, fmt.Errorf("%s: %v", r.builtin, recErr)
	}
	if p.status == "error" {
		return nil, fmt.Errorf("%s: trial %s failed with an error (not out of memory): %s", r.builtin, p.name, p.err)
	}
	return p, nil
}

// checkBaseline verifies that every allocator's allocated bytes are back
// at their figure from before the sweep.
func (r *runner) checkBaseline(p *point, leaks []string) error {
	// The trial's finish has just reclaimed, so the figures are exact
	// already; reclaim only to confirm a difference before reporting it.
	r.adoptLibraryMemory()
	back := true
	for i, a := range r.allocs {
		back = back && a.Allocated() == r.base[i]
	}
	if back {
		return nil
	}
	r.env.Manager.Reclaim()
	var diffs []string
	for i, a := range r.allocs {
		now, base := a.Allocated(), r.base[i]
		switch {
		case now > base:
			diffs = append(diffs, fmt.Sprintf("%s has %s more allocated than before the sweep", a.Device().Name(), backend.FormatBytes(int64(now-base))))
		case now < base:
			diffs = append(diffs, fmt.Sprintf("%s has %s less allocated than before the sweep (the trial freed memory it did not allocate)", a.Device().Name(), backend.FormatBytes(int64(base-now))))
		}
	}
	if len(diffs) == 0 {
		return nil
	}
	held := append([]string(nil), leaks...)
	refpath.Walk([]refpath.Root{{Name: "<the value fn returned>", Value: p.value}}, func(h refpath.Hit) bool {
		held = append(held, fmt.Sprintf("%s %s %s", h.Memory.Device(), backend.FormatBytes(int64(h.Memory.Size())), h.Path))
		return true
	})
	msg := fmt.Sprintf("%s: memory is not back at the baseline after trial %s: %s", r.builtin, p.name, strings.Join(diffs, "; "))
	if len(held) > 0 {
		msg += "; held by: " + strings.Join(held, ", ")
	}
	return fmt.Errorf("%s", msg)
}

// adoptLibraryMemory raises the baseline by what libraries allocated for
// the rest of the process during the trial (cuBLAS's workspaces, which
// PyTorch allocates at a process's first matrix products and keeps): the
// first trial that multiplies matrices keeps them, as in PyTorch, and
// later trials are measured from there.
func (r *runner) adoptLibraryMemory() {
	r.env.Manager.Live(func(m *backend.Memory) bool {
		if m.Library() != "" && m.Seq() > r.libSeq {
			for i, a := range r.allocs {
				if a.Device().Name() == m.Device() {
					r.base[i] += m.BlockSize()
				}
			}
		}
		return true
	})
	r.libSeq = r.env.Manager.Seq()
}

// finish prints the summary table and closes the progress bar.
func (r *runner) finish(header string, footer ...string) {
	r.bar.close()
	r.env.Manager.Reclaim()
	r.emptyCaches()
	base := r.base
	switch {
	case r.freshBase != nil && r.freshSearch:
		base = r.freshBase
		footer = append(footer, `the search started as in a fresh process (fresh="search"): the cuBLAS workspaces freed before its first trial, which allocated them again, and kept by the trials after it, as in one PyTorch process`)
	case r.freshBase != nil:
		base = r.freshBase
		footer = append(footer, "each trial started as in a fresh process (fresh=True): the cuBLAS workspaces freed first, as torch._C._cuda_clearCublasWorkspaces() does")
	}
	writeTable(r.env.Out, header, &r.points, r.gpuNames(), base, footer)
}

func (r *runner) gpuNames() []string {
	var names []string
	m := r.env.Manager
	for i := 0; i < m.NumGPUs(); i++ {
		names = append(names, m.GPU(i).Device().Name())
	}
	return names
}

func (r *runner) trialValues() *starlark.List {
	l := make([]starlark.Value, r.points.len())
	for i := range l {
		l[i] = r.points.at(i).Value()
	}
	return starlark.NewList(l)
}

// pointName is a point's trial name: "bs=64", "bs=64, seq=512".
func pointName(keys []string, params starlark.StringDict) string {
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + "=" + valueText(params[k])
	}
	return strings.Join(parts, ", ")
}

func valueText(v starlark.Value) string {
	if s, ok := starlark.AsString(v); ok {
		return s
	}
	return v.String()
}
