package scope

import (
	"errors"
	"fmt"
	"math"
	"reflect"
	"sort"

	"go.starlark.net/starlark"

	"github.com/memsh/memsh/backend"
	"github.com/memsh/memsh/backend/host"
	"github.com/memsh/memsh/env"
	"github.com/memsh/memsh/env/refpath"
)

// Experiment is an experiment block (docs/starlark.md), and the Starlark value
// experiment() returns. While it runs it measures host RAM and every GPU
// with its own exact peak counters; at finish it deletes the names created
// in the block, restores re-bound names to their values from before the
// block, keeps the names in keep, releases the block's memory that nothing
// surviving can reach, and reports what is still reachable as a leak with
// its reference path.
type Experiment struct {
	s       *Session
	name    string
	quiet   bool
	trial   bool // run by trial(): the trial reports its own FinishEvent
	keep    map[string]bool
	running bool
	// emptyCache: finish releases the GPU allocators' cached segments
	// (cuda.empty_cache) before reading Available, as ipyexperiments does.
	emptyCache bool
	// status and errMsg go into the FinishEvent: "ok", or "oom" / "error"
	// with the message when the block hit an out-of-memory error or the
	// script stopped on an error with the block open.
	status, errMsg string

	meter    *meter
	seqStart uint64                    // allocations with a larger Manager sequence number belong to the block
	snapshot map[string]starlark.Value // user globals at open; dropped at finish
	result   *env.Data
	outcome  *Outcome
}

// Outcome is what finish did to names and memory.
type Outcome struct {
	Deleted, Restored, Kept []string
	Released                uint64 // bytes (requested) released at finish
	Leaks                   []Leak
	// EmptiedCache reports that finish released the allocators' cached
	// segments (cuda.empty_cache()) before measuring Available.
	EmptiedCache bool
	// Status is "ok", "oom" (the block hit an out-of-memory error) or
	// "error" (the script stopped on an error with the block open); Error
	// is the message.
	Status, Error string
}

// Leak is memory allocated inside a block that is still reachable after it.
type Leak struct {
	Device string
	Bytes  uint64
	Path   string // reference path, or "held outside Starlark"
}

// pendingOp is a deletion (restore == nil) or restore of a global, applied
// by the executor after the running statement, only if the name is still
// bound to the value finish saw.
type pendingOp struct {
	name    string
	seen    starlark.Value
	restore starlark.Value
}

var (
	_ starlark.HasAttrs  = (*Experiment)(nil)
	_ refpath.Referrer   = (*Experiment)(nil)
	_ starlark.Value     = (*Experiment)(nil)
	_ starlark.Container = nil
)

// Name returns the experiment's name.
func (e *Experiment) Name() string { return e.name }

// Running reports whether the experiment is still open.
func (e *Experiment) Running() bool { return e.running }

// Result returns the final data after finish, or nil while it runs.
func (e *Experiment) Result() *env.Data { return e.result }

// Outcome returns what finish deleted, restored, kept, released and found
// leaking, or nil while it runs.
func (e *Experiment) Outcome() *Outcome { return e.outcome }

func (e *Experiment) String() string {
	state := "running"
	if !e.running {
		state = "finished"
	}
	return fmt.Sprintf("<experiment %q %s>", e.name, state)
}
func (e *Experiment) Type() string          { return "experiment" }
func (e *Experiment) Freeze()               {}
func (e *Experiment) Truth() starlark.Bool  { return true }
func (e *Experiment) Hash() (uint32, error) { return 0, errors.New("unhashable type: experiment") }

// References implements refpath.Referrer: a running experiment holds the
// pre-block values of re-bound names, to restore them.
func (e *Experiment) References(edge func(string, starlark.Value)) {
	for name, v := range e.snapshot {
		edge(".<before "+name+">", v)
	}
}

// Reach walks the globals the experiment saved at open, for the reclaim
// proof (env.Walker).
func (e *Experiment) Reach(w *env.Walker) {
	if !env.Seen(w, e) {
		w.Values(e.snapshot)
	}
}

// AttrNames implements starlark.HasAttrs.
func (e *Experiment) AttrNames() []string {
	return []string{"data", "finish", "keep", "name", "running"}
}

// Attr implements starlark.HasAttrs.
func (e *Experiment) Attr(name string) (starlark.Value, error) {
	switch name {
	case "name":
		return starlark.String(e.name), nil
	case "running":
		return starlark.Bool(e.running), nil
	case "keep":
		return starlark.NewBuiltin("experiment.keep", e.keepBuiltin).BindReceiver(e), nil
	case "data":
		return starlark.NewBuiltin("experiment.data", e.dataBuiltin).BindReceiver(e), nil
	case "finish":
		return starlark.NewBuiltin("experiment.finish", e.finishBuiltin).BindReceiver(e), nil
	}
	return nil, nil
}

// open starts an experiment on the session's stack.
func (s *Session) open(thread *starlark.Thread, name string, keep []string, quiet, emptyCache bool) *Experiment {
	e := &Experiment{s: s, name: name, quiet: quiet || s.opts.Quiet, keep: map[string]bool{}, running: true, emptyCache: emptyCache, status: "ok"}
	for _, k := range keep {
		e.keep[k] = true
	}
	// Start figures exclude garbage.
	s.mgr.Reclaim()
	e.snapshot = s.currentView()
	e.meter = s.startMeter()
	e.seqStart = s.mgr.Seq()
	s.stack = append(s.stack, e)
	s.globalsGen++
	if !e.quiet {
		fmt.Fprintf(s.out, "*** Experiment %q started\n", name)
	}
	return e
}

func (e *Experiment) keepBuiltin(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	if len(kwargs) > 0 {
		return nil, fmt.Errorf("experiment.keep: unexpected keyword argument %s", kwargs[0][0])
	}
	if !e.running {
		return nil, fmt.Errorf("experiment.keep: experiment %q already finished", e.name)
	}
	view := e.s.currentView()
	names := make([]string, len(args))
	for i, a := range args {
		n, ok := starlark.AsString(a)
		if !ok {
			return nil, fmt.Errorf("experiment.keep: for parameter names: got %s, want string", a.Type())
		}
		if _, ok := view[n]; !ok {
			return nil, fmt.Errorf("experiment.keep: for parameter names: no global named %q", n)
		}
		names[i] = n
	}
	for _, n := range names {
		e.keep[n] = true
	}
	return starlark.None, nil
}

func (e *Experiment) dataBuiltin(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	if err := starlark.UnpackArgs("experiment.data", args, kwargs); err != nil {
		return nil, err
	}
	return e.Data().Value(), nil
}

// Data returns the figures so far (after a reclaim, so garbage does not
// count), or the final figures once finished.
func (e *Experiment) Data() *env.Data {
	if !e.running {
		return e.result
	}
	e.s.mgr.Reclaim()
	return e.s.read(e.meter, e.name)
}

func (e *Experiment) finishBuiltin(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	if err := starlark.UnpackArgs("experiment.finish", args, kwargs); err != nil {
		return nil, err
	}
	d, err := e.finish(thread, nil)
	if err != nil {
		return nil, err
	}
	return d.Value(), nil
}

// Finish finishes the experiment from Go (between statements) and returns
// its data. The name deletions and restores apply at once.
func (e *Experiment) Finish() (*env.Data, error) {
	if e.s.running {
		return nil, errors.New("experiment.finish: use the Starlark method while a statement runs")
	}
	d, err := e.finish(nil, nil)
	e.s.applyPending()
	return d, err
}

// finish ends the block. extra are roots that survive besides the globals
// (a trial's returned value).
func (e *Experiment) finish(thread *starlark.Thread, extra []refpath.Root) (*env.Data, error) {
	s := e.s
	if !e.running {
		return nil, fmt.Errorf("experiment.finish: experiment %q already finished", e.name)
	}
	// Inner experiments finish first.
	for s.stack[len(s.stack)-1] != e {
		if _, err := s.stack[len(s.stack)-1].finish(thread, nil); err != nil {
			return nil, err
		}
	}

	// Classify the names bound in the block.
	view := s.currentView()
	out := &Outcome{}
	survivors := make([]refpath.Root, 0, len(view))
	kept := []refpath.Root{}
	var ops []pendingOp
	for name, v := range view {
		old, existed := e.snapshot[name]
		_, isHandle := v.(*Experiment)
		switch {
		case existed && same(old, v):
			survivors = append(survivors, refpath.Root{Name: name, Value: v})
		case e.keep[name] || s.outerKeeps(e, name):
			out.Kept = append(out.Kept, name)
			kept = append(kept, refpath.Root{Name: name, Value: v})
		case isHandle:
			// Handles are never deleted; what they refer to (an open
			// experiment's snapshot) is already among the survivors.
		case existed:
			out.Restored = append(out.Restored, name)
			ops = append(ops, pendingOp{name: name, seen: v, restore: old})
			survivors = append(survivors, refpath.Root{Name: name, Value: old})
		default:
			out.Deleted = append(out.Deleted, name)
			ops = append(ops, pendingOp{name: name, seen: v})
		}
	}
	sort.Strings(out.Deleted)
	sort.Strings(out.Restored)
	sort.Strings(out.Kept)
	for _, outer := range s.stack[:len(s.stack)-1] {
		survivors = append(survivors, refpath.Root{Name: "experiment " + outer.name, Value: outer})
	}
	// Locals of running functions outlive the block: a function that
	// finishes an experiment may go on using them (or return them).
	survivors = append(survivors, functionLocals(thread)...)
	kept = append(kept, extra...)

	// Figures at the end, garbage excluded.
	s.mgr.Reclaim()
	end := s.read(e.meter, e.name)

	// The block's live allocations.
	owned := map[*backend.Memory]bool{}
	s.mgr.Live(func(m *backend.Memory) bool {
		// What a library keeps for the process (cuBLAS's workspaces) is
		// nobody's leak: PyTorch keeps it too.
		if m.Seq() > e.seqStart && m.Library() == "" {
			owned[m] = true
		}
		return true
	})
	if len(owned) > 0 {
		keptMem := map[*backend.Memory]bool{}
		refpath.Walk(kept, func(h refpath.Hit) bool {
			keptMem[h.Memory] = true
			return true
		})
		leaked := map[*backend.Memory]bool{}
		refpath.Walk(survivors, func(h refpath.Hit) bool {
			if owned[h.Memory] && !keptMem[h.Memory] {
				leaked[h.Memory] = true
				out.Leaks = append(out.Leaks, Leak{Device: h.Memory.Device(), Bytes: h.Memory.Size(), Path: h.Path})
			}
			return true
		})
		visible := map[*backend.Memory]bool{}
		refpath.Walk(s.visibleRoots(thread, view), func(h refpath.Hit) bool {
			visible[h.Memory] = true
			return true
		})
		reason := fmt.Sprintf("released when experiment %q finished", e.name)
		for m := range owned {
			switch {
			case keptMem[m] || leaked[m]:
			case visible[m]:
				out.Released += m.Size()
				s.mgr.Release(m, reason)
			default:
				out.Leaks = append(out.Leaks, Leak{Device: m.Device(), Bytes: m.Size(), Path: "held outside Starlark"})
			}
		}
		sort.Slice(out.Leaks, func(i, j int) bool { return out.Leaks[i].Path < out.Leaks[j].Path })
	}

	// Figures after the release: what came back (glibc trimmed, so freed
	// host blocks are back with the OS; the allocators' cache released to
	// the devices unless experiment(empty_cache=False)).
	host.Trim()
	if e.emptyCache && s.mgr.NumGPUs() > 0 {
		for i := 0; i < s.mgr.NumGPUs(); i++ {
			s.mgr.GPU(i).EmptyCache()
		}
		out.EmptiedCache = true
	}
	out.Status, out.Error = e.status, e.errMsg
	post := s.read(e.meter, e.name)
	// Host RSS is noisy: a tiny growth while releasing is not a negative
	// reclaim.
	end.Host.Reclaimed = max(0, end.Host.Used-post.Host.Used)
	end.Host.Available = post.Host.Available
	for i := range end.GPUs {
		end.GPUs[i].Reclaimed = end.GPUs[i].Used - post.GPUs[i].Used
		end.GPUs[i].Available = post.GPUs[i].Available
	}
	e.meter.close()

	e.running = false
	e.snapshot = nil
	e.result = end
	e.outcome = out
	s.stack = s.stack[:len(s.stack)-1]
	s.prunePending()
	s.pending = append(s.pending, ops...)
	s.globalsGen++
	if !e.quiet {
		s.printReport(e)
	}
	if !e.trial {
		s.finishEvent(env.FinishEvent{Kind: "experiment", Name: e.name, Status: e.status, Error: e.errMsg, Data: end, Leaks: leakLines(out)})
	}
	return end, nil
}

// outerKeeps reports whether an experiment enclosing e was told to keep
// name: such a name survives e's finish, for the outer one to keep.
func (s *Session) outerKeeps(e *Experiment, name string) bool {
	for _, outer := range s.stack {
		if outer == e {
			return false
		}
		if outer.keep[name] {
			return true
		}
	}
	return false
}

// markCut records the error that stopped a top-level statement on every
// open experiment, so that each finishes (now or later, in a REPL) with
// that failure's status in its report and FinishEvent: "oom" for an
// out-of-memory error, else "error". An experiment keeps the first
// failure that cut it.
func (s *Session) markCut(err error) {
	status, msg := failure(err)
	for _, e := range s.stack {
		if e.status == "ok" {
			e.status, e.errMsg = status, msg
		}
	}
}

// failure is the status and message of a block that err cut.
func failure(err error) (status, msg string) {
	if backend.IsOOM(err) {
		return "oom", oomMessage(err)
	}
	return "error", errorMessage(err)
}

// FinishOpen finishes every open experiment, innermost first, because the
// script stopped on err: each reports as usual and its FinishEvent has
// Status "oom" if err is an out-of-memory error, else "error", and Error
// err's message. With err nil they finish with their own status. It must
// not be called while a statement runs; the name deletions and restores
// apply at once. The script runner calls it when a script fails (and a
// REPL at end of input).
func (s *Session) FinishOpen(err error) {
	if s.running {
		return
	}
	if len(s.stack) > 0 {
		s.Settle() // their reports come after what an interrupt left is freed
	}
	status, msg := "", ""
	if err != nil {
		status, msg = failure(err)
	}
	for len(s.stack) > 0 {
		e := s.stack[len(s.stack)-1]
		if status != "" {
			e.status, e.errMsg = status, msg
		}
		if _, ferr := e.finish(nil, nil); ferr != nil {
			break
		}
	}
	s.applyPending()
}

// errorMessage is err's message without a backtrace.
func errorMessage(err error) string {
	var ee *starlark.EvalError
	if errors.As(err, &ee) {
		return ee.Msg
	}
	return err.Error()
}

// currentView returns the user globals as the running statement sees them:
// the live map, with the pending deletions and restores of experiments
// finished during it applied.
func (s *Session) currentView() map[string]starlark.Value {
	view := make(map[string]starlark.Value, len(s.user)+8)
	for name := range s.user {
		view[name] = s.live[name]
	}
	for _, op := range s.pending {
		if cur, ok := view[op.name]; ok && same(cur, op.seen) {
			if op.restore == nil {
				delete(view, op.name)
			} else {
				view[op.name] = op.restore
			}
		}
	}
	return view
}

// visibleRoots is everything Starlark can still see: every name of the view
// and the locals of every frame on the thread's stack.
func (s *Session) visibleRoots(thread *starlark.Thread, view map[string]starlark.Value) []refpath.Root {
	roots := make([]refpath.Root, 0, len(view))
	for name, v := range view {
		roots = append(roots, refpath.Root{Name: name, Value: v})
	}
	return append(roots, functionLocals(thread)...)
}

// functionLocals returns the locals of every Starlark function running on
// the thread (the top-level statement has none: its bindings are globals),
// named "<fn local x>".
func functionLocals(thread *starlark.Thread) []refpath.Root {
	if thread == nil {
		return nil
	}
	var roots []refpath.Root
	for d := 0; d < thread.CallStackDepth(); d++ {
		fr := thread.DebugFrame(d)
		fn, ok := fr.Callable().(*starlark.Function)
		if !ok {
			continue
		}
		for i := 0; i < fr.NumLocals(); i++ {
			b, v := fr.Local(i)
			if v != nil {
				roots = append(roots, refpath.Root{Name: "<" + fn.Name() + " local " + b.Name + ">", Value: v})
			}
		}
	}
	return roots
}

// prunePending drops the pending deletions and restores that a re-binding
// has made moot (applyPending would skip them: the name no longer holds
// the value the experiment saw), so that experiments finished in a loop
// inside one statement do not pile them up, with the values they hold.
func (s *Session) prunePending() {
	if len(s.pending) == 0 {
		return
	}
	kept := s.pending[:0]
	for _, op := range s.pending {
		if cur, ok := s.live[op.name]; ok && same(cur, op.seen) {
			kept = append(kept, op)
		}
	}
	clear(s.pending[len(kept):])
	s.pending = kept
}

// applyPending applies the deletions and restores of experiments finished
// during the statement that just ended.
func (s *Session) applyPending() {
	for _, op := range s.pending {
		cur, ok := s.live[op.name]
		if !ok || !s.user[op.name] || !same(cur, op.seen) {
			continue // re-bound after the experiment finished: leave it
		}
		if op.restore != nil {
			s.live[op.name] = op.restore
			continue
		}
		delete(s.user, op.name)
		if b, ok := s.builtins[op.name]; ok {
			s.live[op.name] = b
		} else {
			delete(s.live, op.name)
		}
	}
	clear(s.pending)
	s.pending = s.pending[:0]
}

// same reports whether a and b are the same Starlark value (identity for
// reference values, equality for scalars).
func same(a, b starlark.Value) bool {
	if a == nil || b == nil {
		return a == b
	}
	if ta, ok := a.(starlark.Tuple); ok {
		tb, ok := b.(starlark.Tuple)
		if !ok || len(ta) != len(tb) {
			return false
		}
		for i := range ta {
			if !same(ta[i], tb[i]) {
				return false
			}
		}
		return true
	}
	if fa, ok := a.(starlark.Float); ok {
		fb, ok := b.(starlark.Float)
		return ok && math.Float64bits(float64(fa)) == math.Float64bits(float64(fb)) // NaN is itself
	}
	if reflect.TypeOf(a) != reflect.TypeOf(b) || !reflect.TypeOf(a).Comparable() {
		return false
	}
	return a == b
}
