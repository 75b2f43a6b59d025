package nn

import (
	"fmt"
	"strings"
	"weak"

	"go.starlark.net/starlark"

	"github.com/memsh/memsh/backend"
	"github.com/memsh/memsh/env"
	"github.com/memsh/memsh/record"
	staroptim "github.com/memsh/memsh/starlib/optim"
	startensor "github.com/memsh/memsh/starlib/tensor"
	"github.com/memsh/memsh/tensor/memtrack"
	"github.com/memsh/memsh/tensor/optim"
)

// nn.track(fn, *args, **kwargs) runs fn(*args, **kwargs) and reports what
// PyTorch's MemTracker (torch.distributed._tools.mem_tracker) reports for
// it, exactly (see package tensor/memtrack): the current device's bytes by
// category — Parameter, Buffer, Gradient, Activation (tensors saved for
// backward), Temp, Optstate, Comm (a DistributedDataParallel module's
// gradient buckets), Other (live before the call, none of the former)
// and Total (memory_allocated) — at the peak and at the end, and
// for every module that ran, the breakdown at the peak of its forward
// and of its backward. Modules are named as named_parameters' prefixes
// ("h.0.attn") below the root module, which is named by its class: a
// module found in fn's arguments (or their lists, tuples and dicts), or
// else the first module called that no known module contains. Optimizers
// in the arguments, or stepped during fn, count their state as Optstate.
//
// It prints the table (display_snapshot and display_modulewise_snapshots
// in one) and returns a value with .peak and .end (dicts: category →
// bytes), .modules (a list of structs: name, type, depth, forward,
// backward — dicts, backward None when the module had no backward), .device,
// .result (fn's result), .peak_phase (what ran at the peak: "forward",
// "backward", "optimizer step" or "other") and .display(units="auto",
// depth=None). Inside a sweep point the breakdown also goes into the
// point's --out record.
//
// When fn fails (out of memory, say) the error is fn's, and it carries the
// report up to the failure, whose .failed is the breakdown of what was
// allocated when it failed (None otherwise): trial(nn.track, fn, ...)
// returns it as the trial's value.
//
// nn.track_peak(fn, *args, **kwargs) is nn.track without the per-module
// figures (.modules is empty, the table has the peak and end rows only):
// each module's local peak rises with almost every allocation of its
// forward, a breakdown and (exact peak mode) a reclaim each, so
// nn.track_peak costs about what the call alone does. memsh fit measures
// its boundary with it.
func init() {
	register("track", func(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
		return nnTrack(thread, b, args, kwargs, false)
	})
	register("track_peak", func(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
		return nnTrack(thread, b, args, kwargs, true)
	})
}

const trackKey = "memsh.nn.track"

// trackState is what nn.track keeps while fn runs: the tracker, the
// modules' names and their memtrack modules.
//
// The modules are keys held weakly (names, mods), as MemTracker's
// WeakIdKeyDictionary holds them: tracking keeps no module alive, and a
// reclaim walk need not look into the model at every reclaim.
type trackState struct {
	tr    *memtrack.Tracker
	names map[weak.Pointer[Layer]]string
	mods  map[weak.Pointer[Layer]]*memtrack.Module
	depth map[*memtrack.Module]int
}

// Reach walks what nn.track holds strongly while its function runs
// (env.Reacher): what the tracker holds strongly (memtrack.Tracker.Reach).
func (ts *trackState) Reach(w *env.Walker) {
	w.Engine(ts.tr.Reach)
}

func trackOf(thread *starlark.Thread) *trackState {
	ts, _ := thread.Local(trackKey).(*trackState)
	return ts
}

// root names m's tree: m by its class, descendants by their path.
func (ts *trackState) root(m *Layer) {
	if _, ok := ts.names[weak.Make(m)]; ok {
		return
	}
	paths, mods := m.modulesPreorder("")
	for i, sub := range mods {
		ws := weak.Make(sub)
		if _, ok := ts.names[ws]; ok {
			continue
		}
		if paths[i] == "" {
			ts.names[ws] = m.typ
		} else {
			ts.names[ws] = paths[i]
		}
		_, ps := sub.namedTensors(kindParam, "", false)
		for _, p := range ps {
			ts.tr.AddParams(p.Engine())
		}
		// a 4-bit weight's quantization state is its weight's
		// (bitsandbytes keeps it on the Params4bit)
		ts.tr.AddParams(sub.quant.Tensors()...)
		_, bs := sub.namedTensors(kindBuffer, "", false)
		for _, b := range bs {
			ts.tr.AddBuffers(b.Engine())
		}
	}
}

func (ts *trackState) enter(m *Layer) {
	ts.root(m) // a module no known module contains is a root
	// Parameters and buffers may have been replaced since (MemTracker
	// tracks them again at each pre-forward hook).
	for _, p := range m.Parameters() {
		ts.tr.AddParams(p)
	}
	ts.tr.AddParams(m.quant.Tensors()...)
	if m.ddp != nil {
		ts.tr.AddComm(m.ddp.reducer)
	}
	if m.zero != nil {
		ts.tr.AddComm(m.zero)
	}
	if m.fsdp != nil && m.fsdp.comm != nil {
		ts.tr.AddComm(m.fsdp.comm)
	}
	_, bs := m.namedTensors(kindBuffer, "", false)
	for _, b := range bs {
		ts.tr.AddBuffers(b.Engine())
	}
	wm := weak.Make(m)
	mod := ts.mods[wm]
	if mod == nil {
		name := ts.names[wm]
		mod = ts.tr.NewModule(name, m.typ)
		ts.mods[wm] = mod
		if name == m.typ {
			ts.depth[mod] = 1
		} else {
			ts.depth[mod] = strings.Count(name, ".") + 2
		}
	}
	ts.tr.Enter(mod)
}

// walk registers the modules and optimizers among v (lists, tuples and
// dicts searched).
func (ts *trackState) walk(v starlark.Value, depth int) {
	if depth > 4 {
		return
	}
	switch v := v.(type) {
	case *Layer:
		ts.root(v)
	case *staroptim.Optimizer:
		ts.tr.AddOptimizer(v.Engine())
	case *starlark.List:
		for i := range v.Len() {
			ts.walk(v.Index(i), depth+1)
		}
	case starlark.Tuple:
		for _, x := range v {
			ts.walk(x, depth+1)
		}
	case *starlark.Dict:
		for _, kv := range v.Items() {
			ts.walk(kv[1], depth+1)
		}
	}
}

func nnTrack(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple, peakOnly bool) (starlark.Value, error) {
	if len(args) == 0 {
		return nil, fmt.Errorf("%s: missing argument for fn", b.Name())
	}
	fn, ok := args[0].(starlark.Callable)
	if !ok {
		return nil, fmt.Errorf("%s: for parameter fn: got %s, want callable", b.Name(), args[0].Type())
	}
	e, err := env.Of(thread, b.Name())
	if err != nil {
		return nil, err
	}
	c := startensor.Context(e)
	device := "cpu"
	if c.Manager.NumGPUs() > 0 {
		device = fmt.Sprintf("cuda:%d", c.Manager.Current())
	}
	tr, err := memtrack.New(c, device)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", b.Name(), err)
	}
	if peakOnly {
		tr.PeakOnly()
	}
	ts := &trackState{tr: tr, names: map[weak.Pointer[Layer]]string{}, mods: map[weak.Pointer[Layer]]*memtrack.Module{}, depth: map[*memtrack.Module]int{}}
	for _, a := range args[1:] {
		ts.walk(a, 0)
	}
	for _, kv := range kwargs {
		ts.walk(kv[1], 0)
	}
	prev, prevHook := thread.Local(trackKey), thread.Local(staroptim.StepHookKey)
	thread.SetLocal(trackKey, ts)
	thread.SetLocal(staroptim.StepHookKey, staroptim.StepHook(func(o optim.Optimizer) func() {
		tr.AddOptimizer(o)
		tr.StepBegin()
		return tr.StepEnd
	}))
	tr.Start()
	// what nn.track's Go code holds while fn runs is its arguments (the
	// frame's) and ts, walked as a root: the reclaim may free what fn's
	// callees drop without a Go collection
	res, callErr := func() (starlark.Value, error) {
		if e.Session != nil {
			defer e.Session.Root(ts)()
			thread.DeclareTransparent()
		}
		return starlark.Call(thread, fn, args[1:], kwargs)
	}()
	var rep *memtrack.Report
	if callErr != nil {
		rep = tr.StopFailed()
	} else {
		rep = tr.Stop()
	}
	thread.SetLocal(trackKey, prev)
	thread.SetLocal(staroptim.StepHookKey, prevHook)
	if callErr != nil {
		// the breakdown so far travels with the error: trial() puts it
		// in its .value (env.ErrorValue)
		return nil, &trackError{err: callErr, report: &TrackReport{rep: rep, result: starlark.None, depth: ts.depth, by: b.Name()}}
	}
	out := &TrackReport{rep: rep, result: res, depth: ts.depth, by: b.Name()}
	fmt.Fprint(e.Out, out.table("auto", 0))
	if rs := record.Of(e); rs != nil {
		rs.SetBreakdown(out.breakdown())
	}
	return out, nil
}

// trackError is nn.track's error when fn failed: fn's error, with the
// report up to the failure (its .failed: what was allocated when it
// failed), which trial() returns as its value.
type trackError struct {
	err    error
	report *TrackReport
}

func (e *trackError) Error() string { return e.err.Error() }
func (e *trackError) Unwrap() error { return e.err }

// ErrorValue implements env.ErrorValue.
func (e *trackError) ErrorValue() starlark.Value { return e.report }

// TrackReport is nn.track's result (type "nn.MemTrackReport").
type TrackReport struct {
	rep    *memtrack.Report
	result starlark.Value
	depth  map[*memtrack.Module]int
	by     string // the builtin that made it ("nn.track"), named in the table's title
}

var _ starlark.HasAttrs = (*TrackReport)(nil)

func (r *TrackReport) String() string        { return r.table("auto", 0) }
func (r *TrackReport) Type() string          { return "nn.MemTrackReport" }
func (r *TrackReport) Freeze()               {}
func (r *TrackReport) Truth() starlark.Bool  { return true }
func (r *TrackReport) Hash() (uint32, error) { return 0, fmt.Errorf("unhashable: %s", r.Type()) }
func (r *TrackReport) AttrNames() []string {
	return []string{"device", "display", "end", "failed", "modules", "peak", "peak_phase", "result"}
}

func snapDict(s *memtrack.Snapshot) starlark.Value {
	if s == nil {
		return starlark.None
	}
	d := starlark.NewDict(int(memtrack.NumCategories) + 1)
	for c := range memtrack.NumCategories {
		d.SetKey(starlark.String(c.String()), starlark.MakeUint64(s.Bytes[c]))
	}
	d.SetKey(starlark.String("Total"), starlark.MakeUint64(s.Total))
	if s.Library > 0 {
		// the part of Other that libraries allocated meanwhile (cuBLAS workspaces)
		d.SetKey(starlark.String("Library"), starlark.MakeUint64(s.Library))
	}
	return d
}

func (r *TrackReport) Attr(name string) (starlark.Value, error) {
	switch name {
	case "device":
		return starlark.String(r.rep.Device), nil
	case "peak":
		return snapDict(&r.rep.Peak), nil
	case "end":
		return snapDict(&r.rep.End), nil
	case "failed":
		return snapDict(r.rep.Failed), nil
	case "peak_phase":
		return starlark.String(r.rep.Peak.Phase), nil
	case "result":
		return r.result, nil
	case "modules":
		var vs []starlark.Value
		for _, m := range r.rep.Modules {
			vs = append(vs, &trackModule{m: m, depth: r.depth[m]})
		}
		return starlark.NewList(vs), nil
	case "display":
		return starlark.NewBuiltin("display", func(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
			units, depth := "auto", 0
			if err := starlark.UnpackArgs(b.Name(), args, kwargs, "units?", &units, "depth?", &depth); err != nil {
				return nil, err
			}
			if _, ok := unitDivisor[units]; !ok && units != "auto" {
				return nil, fmt.Errorf("%s: Unsupported unit: %s. Supported units are: B, KiB, MiB, GiB", b.Name(), units)
			}
			e, err := env.Of(thread, b.Name())
			if err != nil {
				return nil, err
			}
			fmt.Fprint(e.Out, r.table(units, depth))
			return starlark.None, nil
		}).BindReceiver(r), nil
	}
	return nil, nil
}

// trackModule is one entry of .modules.
type trackModule struct {
	m     *memtrack.Module
	depth int
}

func (t *trackModule) String() string {
	return fmt.Sprintf("MemTrackModule(name=%q, type=%q)", t.m.Name, t.m.Type)
}
func (t *trackModule) Type() string          { return "nn.MemTrackModule" }
func (t *trackModule) Freeze()               {}
func (t *trackModule) Truth() starlark.Bool  { return true }
func (t *trackModule) Hash() (uint32, error) { return 0, fmt.Errorf("unhashable: %s", t.Type()) }
func (t *trackModule) AttrNames() []string {
	return []string{"backward", "depth", "forward", "name", "type"}
}
func (t *trackModule) Attr(name string) (starlark.Value, error) {
	switch name {
	case "name":
		return starlark.String(t.m.Name), nil
	case "type":
		return starlark.String(t.m.Type), nil
	case "depth":
		return starlark.MakeInt(t.depth), nil
	case "forward":
		return snapDict(t.m.Forward), nil
	case "backward":
		return snapDict(t.m.Backward), nil
	}
	return nil, nil
}

var unitDivisor = map[string]uint64{"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}

func fmtUnits(n uint64, units string) string {
	if units == "auto" {
		return backend.FormatBytes(int64(n))
	}
	d := unitDivisor[units]
	if d == 1 {
		return fmt.Sprintf("%d B", n)
	}
	return fmt.Sprintf("%.2f %s", float64(n)/float64(d), units)
}

// table renders the report as MemTracker's tabulated snapshots (rst):
// the peak and end breakdowns, then each module's peaks (modules deeper
// than depth left out; 0: all).
func (r *TrackReport) table(units string, depth int) string {
	head := []string{"State"}
	for c := range memtrack.NumCategories {
		head = append(head, c.String())
	}
	head = append(head, "Total")
	row := func(first []string, s *memtrack.Snapshot) []string {
		out := append([]string(nil), first...)
		for c := range memtrack.NumCategories {
			out = append(out, fmtUnits(s.Bytes[c], units))
		}
		return append(out, fmtUnits(s.Total, units))
	}
	var b strings.Builder
	fmt.Fprintf(&b, "Memory breakdown on %s (%s)\n", r.rep.Device, r.by)
	rst(&b, head, [][]string{row([]string{"Peak"}, &r.rep.Peak), row([]string{"End"}, &r.rep.End)})
	var rows [][]string
	for _, m := range r.rep.Modules {
		if depth > 0 && r.depth[m] > depth {
			continue
		}
		name := m.Name
		if m.Forward != nil {
			rows = append(rows, row([]string{name, "Peak-Forward"}, m.Forward))
			name = ""
		}
		if m.Backward != nil {
			rows = append(rows, row([]string{name, "Peak-Backward"}, m.Backward))
		}
	}
	if len(rows) > 0 {
		b.WriteString("\n")
		rst(&b, append([]string{"Module"}, head...), rows)
	}
	return b.String()
}

// rst writes a table in tabulate's "rst" format.
func rst(b *strings.Builder, head []string, rows [][]string) {
	w := make([]int, len(head))
	for i, h := range head {
		w[i] = len(h)
	}
	for _, r := range rows {
		for i, c := range r {
			w[i] = max(w[i], len(c))
		}
	}
	rule := func() {
		for i := range w {
			if i > 0 {
				b.WriteString("  ")
			}
			b.WriteString(strings.Repeat("=", w[i]))
		}
		b.WriteString("\n")
	}
	line := func(cells []string) {
		var parts []string
		for i, c := range cells {
			if head[i] == "Module" || head[i] == "State" {
				parts = append(parts, c+strings.Repeat(" ", w[i]-len(c)))
			} else {
				parts = append(parts, strings.Repeat(" ", w[i]-len(c))+c)
			}
		}
		b.WriteString(strings.TrimRight(strings.Join(parts, "  "), " ") + "\n")
	}
	rule()
	line(head)
	rule()
	for _, r := range rows {
		line(r)
	}
	rule()
}

// breakdown is the report as its --out record field.
func (r *TrackReport) breakdown() *record.Breakdown {
	cats := func(s *memtrack.Snapshot) map[string]int64 {
		if s == nil {
			return nil
		}
		m := map[string]int64{"Total": int64(s.Total)}
		for c := range memtrack.NumCategories {
			m[c.String()] = int64(s.Bytes[c])
		}
		return m
	}
	bd := &record.Breakdown{Device: r.rep.Device, Peak: cats(&r.rep.Peak), End: cats(&r.rep.End)}
	for _, m := range r.rep.Modules {
		bd.Modules = append(bd.Modules, record.ModuleBreakdown{Name: m.Name, Type: m.Type, Forward: cats(m.Forward), Backward: cats(m.Backward)})
	}
	return bd
}

// Reach walks the tracked call's result (env.Reacher); the report itself
// keeps figures only.
func (r *TrackReport) Reach(w *env.Walker) { w.Value(r.result) }

// HoldsNoMemory implements env.Opaque: a module's figures only.
func (t *trackModule) HoldsNoMemory() {}
