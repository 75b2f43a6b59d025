// Package memtrace is the global builtin memtrace: fastai's GPUMemTrace
// (fastai v1 utils/mem.py) over memsh's allocator, with an exact peak.
//
//	t = memtrace(ctx="", silent=False, device=None)
//	t.data()                  (delta_used, delta_peaked) in bytes
//	t.report(subctx="")       print △Used Peaked MiB: <used> <peaked> (ctx: subctx)
//	t.report_n_reset(subctx="")  report, then reset
//	t.reset()                 restart both figures at the current usage
//	t.start()                 reset and run (a new trace is already running)
//	t.stop()                  freeze the figures
//	t.silent(on=True)         turn report output off (or back on)
//	t.ctx, t.device, t.running, t.is_silent
//
// used is the GPU allocator's allocated bytes after a reclaim (garbage never
// counts); delta_used = used − used at start; delta_peaked is the fastai /
// ipyexperiments definition max(0, peak − start) − max(0, delta_used), the
// blip above what was kept. The peak is the trace's own exact counter on the
// allocator (backend.PeakSet), independent of every other counter
// (cuda.reset_peak_memory_stats, experiments, other traces): no sampling
// thread, so a transient allocation of any duration counts.
package memtrace

import (
	"errors"
	"fmt"

	"go.starlark.net/starlark"

	"github.com/memsh/memsh/backend"
	"github.com/memsh/memsh/env"
	"github.com/memsh/memsh/starlib/cuda"
)

// Builtin is the global memtrace(ctx="", silent=False, device=None): a new
// trace of the GPU device (None: the current one), started now. ctx is
// printed in every report; silent=True suppresses reports.
var Builtin = starlark.NewBuiltin("memtrace", newTrace)

// MemTrace is the Starlark value of type "memtrace".
type MemTrace struct {
	env    *env.Env
	alloc  backend.Allocator
	ctx    string
	silent bool

	running bool
	start   uint64 // allocated bytes at start or reset
	cell    *cell  // the open peak counter, shared with the session registry

	// the figures frozen by stop
	used, peaked int64
}

var (
	_ starlark.HasAttrs = (*MemTrace)(nil)
	_ starlark.Value    = (*MemTrace)(nil)
)

func newTrace(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	var ctx string
	var silent bool
	var dev starlark.Value
	if err := starlark.UnpackArgs(b.Name(), args, kwargs, "ctx?", &ctx, "silent?", &silent, "device?", &dev); err != nil {
		return nil, err
	}
	e, err := env.Of(thread, b.Name())
	if err != nil {
		return nil, err
	}
	a, err := cuda.Resolve(e.Manager, b.Name(), "device", dev)
	if err != nil {
		return nil, err
	}
	t := &MemTrace{env: e, alloc: a, ctx: ctx, silent: silent, cell: &cell{}}
	register(e, t)
	t.startTrace()
	return t, nil
}

// startTrace reclaims, then opens (or resets) the peak counter at the
// current figures.
func (t *MemTrace) startTrace() {
	t.env.Manager.Reclaim()
	a := t.alloc
	t.start = a.Allocated()
	if t.cell.peak == nil {
		t.cell.peak = a.Peaks().New(a.Allocated(), a.Reserved())
	} else {
		t.cell.peak.Reset(a.Allocated(), a.Reserved())
	}
	t.running = true
}

// figures returns (delta_used, delta_peaked): measured now (after a
// reclaim) while running, the frozen figures after stop.
func (t *MemTrace) figures() (used, peaked int64) {
	if !t.running {
		return t.used, t.peaked
	}
	t.env.Manager.Reclaim()
	now := int64(t.alloc.Allocated())
	start := int64(t.start)
	peak := int64(t.cell.peak.MaxAllocated)
	used = now - start
	peaked = max(0, peak-start) - max(0, used)
	return used, max(0, peaked)
}

func (t *MemTrace) stopTrace() {
	if !t.running {
		return
	}
	t.used, t.peaked = t.figures()
	t.running = false
	t.cell.close()
}

// line is fastai's __repr__: △Used Peaked MiB: <used> <peaked>.
func (t *MemTrace) line() string {
	used, peaked := t.figures()
	return fmt.Sprintf("△Used Peaked MiB: %9.2f %9.2f", mibs(used), mibs(peaked))
}

func mibs(n int64) float64 { return float64(n) / (1 << 20) }

// ctxSuffix is fastai's _get_ctx: " (ctx: subctx)", " (ctx)", " (subctx)"
// or "".
func (t *MemTrace) ctxSuffix(subctx string) string {
	switch {
	case t.ctx != "" && subctx != "":
		return " (" + t.ctx + ": " + subctx + ")"
	case t.ctx != "":
		return " (" + t.ctx + ")"
	case subctx != "":
		return " (" + subctx + ")"
	}
	return ""
}

func (t *MemTrace) report(subctx string) {
	if t.silent {
		return
	}
	fmt.Fprintln(t.env.Out, t.line()+t.ctxSuffix(subctx))
}

// String returns the report line (after a reclaim while running), as
// fastai's repr.
func (t *MemTrace) String() string { return t.line() + t.ctxSuffix("") }

// Type returns "memtrace".
func (t *MemTrace) Type() string { return "memtrace" }

// Freeze does nothing: a trace is a measuring instrument, not data.
func (t *MemTrace) Freeze() {}

// Truth is True.
func (t *MemTrace) Truth() starlark.Bool { return true }

// Hash fails: traces are unhashable.
func (t *MemTrace) Hash() (uint32, error) { return 0, errors.New("unhashable type: memtrace") }

// AttrNames implements starlark.HasAttrs.
func (t *MemTrace) AttrNames() []string {
	return []string{"ctx", "data", "device", "is_silent", "report", "report_n_reset", "reset", "running", "silent", "start", "stop"}
}

// Attr implements starlark.HasAttrs.
func (t *MemTrace) Attr(name string) (starlark.Value, error) {
	switch name {
	case "ctx":
		return starlark.String(t.ctx), nil
	case "device":
		return starlark.String(t.alloc.Device().Name()), nil
	case "running":
		return starlark.Bool(t.running), nil
	case "is_silent":
		return starlark.Bool(t.silent), nil
	}
	if fn, ok := methods[name]; ok {
		return starlark.NewBuiltin("memtrace."+name, fn).BindReceiver(t), nil
	}
	return nil, nil
}

type method = func(*starlark.Thread, *starlark.Builtin, starlark.Tuple, []starlark.Tuple) (starlark.Value, error)

var methods = map[string]method{
	"data":           data,
	"report":         report,
	"report_n_reset": reportNReset,
	"reset":          reset,
	"start":          start,
	"stop":           stop,
	"silent":         silent,
}

func recv(b *starlark.Builtin) *MemTrace { return b.Receiver().(*MemTrace) }

// data() returns (delta_used, delta_peaked) in bytes.
func data(_ *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	if err := starlark.UnpackArgs(b.Name(), args, kwargs); err != nil {
		return nil, err
	}
	used, peaked := recv(b).figures()
	return starlark.Tuple{starlark.MakeInt64(used), starlark.MakeInt64(peaked)}, nil
}

// report(subctx="") prints the figures unless the trace is silent.
func report(_ *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	var subctx string
	if err := starlark.UnpackArgs(b.Name(), args, kwargs, "subctx?", &subctx); err != nil {
		return nil, err
	}
	recv(b).report(subctx)
	return starlark.None, nil
}

// report_n_reset(subctx="") reports, then resets.
func reportNReset(_ *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	var subctx string
	if err := starlark.UnpackArgs(b.Name(), args, kwargs, "subctx?", &subctx); err != nil {
		return nil, err
	}
	t := recv(b)
	t.report(subctx)
	t.startTrace()
	return starlark.None, nil
}

// reset() restarts the figures at the current usage (and runs the trace if
// it was stopped, as fastai's reset re-reads the start figures).
func reset(_ *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	if err := starlark.UnpackArgs(b.Name(), args, kwargs); err != nil {
		return nil, err
	}
	recv(b).startTrace()
	return starlark.None, nil
}

// start() resets and runs the trace.
func start(_ *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	if err := starlark.UnpackArgs(b.Name(), args, kwargs); err != nil {
		return nil, err
	}
	recv(b).startTrace()
	return starlark.None, nil
}

// stop() freezes the figures and closes the peak counter.
func stop(_ *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	if err := starlark.UnpackArgs(b.Name(), args, kwargs); err != nil {
		return nil, err
	}
	recv(b).stopTrace()
	return starlark.None, nil
}

// silent(on=True) turns report output off (on=False: back on).
func silent(_ *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	on := true
	if err := starlark.UnpackArgs(b.Name(), args, kwargs, "on?", &on); err != nil {
		return nil, err
	}
	recv(b).silent = on
	return starlark.None, nil
}

// HoldsNoMemory implements env.Opaque: a tracer keeps figures, not values.
func (t *MemTrace) HoldsNoMemory() {}
