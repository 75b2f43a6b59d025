package env

import (
	"reflect"
	"unsafe"

	"go.starlark.net/starlark"
	"go.starlark.net/starlarkstruct"

	"github.com/memsh/memsh/backend"
	"github.com/memsh/memsh/tensor"
)

// Walker walks Starlark values for the Manager's proof that a reclaim
// would find no garbage (backend.ReachFunc, backend/reach.go): the Session
// calls Value for each of its roots, and the walk goes through lists,
// tuples, dicts, sets, structs, functions' defaults and free variables,
// bound methods' receivers, memsh's values (each a Reacher), tensors and
// their autograd graphs, reporting every allocation it reaches. It never
// reports what it did not reach through a real reference, so the proof is
// sound whatever it skips; a value it does not know (one of memsh's that
// does not implement Reacher) is skipped.
//
// A walk has no deadline (backend.ReachFunc says why): it ends early
// only when Stop says so.
type Walker struct {
	r       tensor.Reacher
	seen    map[unsafe.Pointer]struct{}
	count   int // values visited since the last look at Stop
	visited int // values visited in this walk, by 256
	// Stop, if set, is asked every 256 values once the walk has visited
	// minWalkValues: true ends the walk (the Session's Ctrl-C, so that a
	// reclaim in a session holding millions of values does not hold up
	// an interrupt).
	Stop    func() bool
	stopped bool // Stop said so
	// unknown names a value the walk met and could not look into (a type
	// it does not know), if any: then it is not Complete.
	unknown string
	// Outermost names the built-in the horizon comes from (MEMSH_DEBUG_REACH).
	Outermost string
	lastFunc  *starlark.Function // the function walked last (Value)
	// Containers, if set, is asked about each list and dict the walk
	// meets before it looks into it; true: the walk does not, since a
	// frame of its own stands for what it reaches (scope's pinned lists
	// and dicts).
	Containers func(v starlark.Value) (skip bool)
}

// Incomplete records that the walk met something it could not look into
// (what, for MEMSH_VERIFY_RECLAIM's messages): what it did not reach may
// then be held by it, so the reclaim leaves the decision to the collector.
func (w *Walker) Incomplete(what string) {
	if w.unknown == "" {
		w.unknown = what
	}
}

// Why names what made the walk incomplete ("" when it is complete).
func (w *Walker) Why() string { return w.unknown }

// Bound returns the lowest horizon the engine's roots gave
// (tensor.Reacher.Bound), if any.
func (w *Walker) Bound() (uint64, string, bool) { return w.r.Horizon, w.r.BoundBy, w.r.Bounded() }

// Spans returns the closed stretches of stamps the engine's roots protect
// (tensor.Reacher.Protect).
func (w *Walker) Spans() []backend.Span { return w.r.Spans }

// Complete reports whether the walk looked into every value it met.
func (w *Walker) Complete() bool {
	if w.unknown == "" && !w.r.Complete() {
		w.unknown = "a value the engine keeps"
	}
	return w.unknown == ""
}

// Opaque is implemented by memsh's Starlark values that hold no memory
// and no other Starlark value (a dtype, a device): the walk has nothing
// to look into.
type Opaque interface {
	HoldsNoMemory()
}

// Reacher is implemented by memsh's Starlark values that hold tensors,
// device memory or other Starlark values: Reach passes each to w.
type Reacher interface {
	Reach(w *Walker)
}

// NewWalker returns a walker for the walk numbered epoch that reports
// every allocation it reaches to visit.
func NewWalker(epoch uint64, visit func(*backend.Memory)) *Walker {
	w := &Walker{seen: map[unsafe.Pointer]struct{}{}}
	w.r = tensor.Reacher{Epoch: epoch, Memory: visit, Other: w.other}
	return w
}

// Restart makes w, after Done, a walker for another walk, as NewWalker
// would, keeping the memory of its seen-set and its Stop.
func (w *Walker) Restart(epoch uint64, visit func(*backend.Memory)) {
	seen, stop := w.seen, w.Stop
	*w = Walker{seen: seen, Stop: stop}
	w.r = tensor.Reacher{Epoch: epoch, Memory: visit, Other: w.other}
}

// Done forgets what the walk saw (it would keep those values alive for
// the collector); Restart reuses w.
func (w *Walker) Done() {
	clear(w.seen)
	w.lastFunc = nil
	w.r = tensor.Reacher{}
}

// SetFrontier turns the engine walk's frontier mode on or off
// (tensor.Reacher.Frontier): tensors with autograd state and autograd
// nodes are set aside instead of walked, for Frontier.
func (w *Walker) SetFrontier(on bool) { w.r.SetFrontier(on) }

// Frontier returns what frontier mode set aside, and forgets it.
func (w *Walker) Frontier() ([]*tensor.Tensor, []tensor.GradNode) {
	ts, ns := w.r.FrontierTensors, w.r.FrontierNodes
	w.r.FrontierTensors, w.r.FrontierNodes = nil, nil
	return ts, ns
}

// Autograd walks what the autograd state of t, a tensor frontier mode set
// aside, holds (tensor.Reacher.Autograd).
func (w *Walker) Autograd(t *tensor.Tensor) {
	w.tick()
	w.r.Autograd(t)
}

// Node walks an autograd node (tensor.Reacher.Node).
func (w *Walker) Node(n tensor.GradNode) { w.r.Node(n) }

// SetMemory replaces the function the walk reports allocations to.
func (w *Walker) SetMemory(visit func(*backend.Memory)) { w.r.Memory = visit }

// Epoch returns the walk's number (never 0), for values that mark
// themselves visited instead of using Seen.
func (w *Walker) Epoch() uint64 { return w.r.Epoch }

// Apart runs f as a walk of its own inside this one: numbered epoch,
// crediting no frame (Visit leaves the marks' frames as they are) and
// with a seen-set of its own, so that it finds nothing met that the rest
// of the walk met (a memo's frontier walk, which must meet everything its
// roots hold). What it reports goes where the walk's reports go.
func (w *Walker) Apart(epoch uint64, f func()) {
	oldEpoch, oldFrames, oldSeen, oldLast := w.r.Epoch, w.r.Frames, w.seen, w.lastFunc
	w.r.Epoch, w.r.Frames, w.seen, w.lastFunc = epoch, nil, map[unsafe.Pointer]struct{}{}, nil
	defer func() { w.r.Epoch, w.r.Frames, w.seen, w.lastFunc = oldEpoch, oldFrames, oldSeen, oldLast }()
	f()
}

// SetFrames gives the walk the credits of the frames it keeps
// (tensor.Reacher.Frames).
func (w *Walker) SetFrames(f *backend.Frames) { w.r.Frames = f }

// Visit reports whether the walk must look into the value m marks (a
// module), and marks it met (backend.Frames.Visit): for values that many
// paths lead to, instead of Seen.
func (w *Walker) Visit(m *backend.Mark) bool { return w.r.Visit(m) }

// minWalkValues: a walk that has visited fewer values than this does not
// ask Stop: its own work is a fraction of a millisecond.
const minWalkValues = 4096

// tick counts one value and asks Stop every 256.
func (w *Walker) tick() {
	w.count++
	if w.count >= 256 {
		w.count = 0
		w.visited += 256
		if w.visited >= minWalkValues && w.Stop != nil && w.Stop() {
			w.stopped = true
		}
	}
}

// Visited returns the values the walk looked into: Starlark values and
// the engine's (Value, Tensor, Autograd and Engine calls), and the
// tensors, autograd nodes and modules below them (Visit).
func (w *Walker) Visited() int { return w.visited + w.count + w.r.Looked }

// Stopped reports that Stop ended the walk.
func (w *Walker) Stopped() bool { return w.stopped }

// Settle walks the autograd graphs the walk queued so far, so that what
// they reach is reported now (before the walk of the next frame begins:
// backend.Frames credits it to the frame that reached it).
func (w *Walker) Settle() {
	if !w.stopped {
		w.r.Drain()
	}
}

// Finish walks what the walk queued (autograd graphs) and reports whether
// it completed (was not stopped).
func (w *Walker) Finish() bool {
	if !w.stopped {
		w.r.Drain()
	}
	return !w.stopped
}

// Memory reports an allocation.
func (w *Walker) Memory(m *backend.Memory) {
	if m != nil {
		w.r.Memory(m)
	}
}

// Tensor walks an engine tensor (its memory, gradient and graph).
func (w *Walker) Tensor(t *tensor.Tensor) {
	if t != nil {
		w.tick()
		w.r.Tensor(t)
	}
}

// Seen reports whether the value at p was visited in this walk already,
// and marks it (for values that can be reached twice or hold themselves).
func Seen[T any](w *Walker, p *T) bool {
	k := unsafe.Pointer(p)
	if _, ok := w.seen[k]; ok {
		return true
	}
	w.seen[k] = struct{}{}
	return false
}

func (w *Walker) other(v any) {
	switch v := v.(type) {
	case starlark.Value:
		w.Value(v)
	case *tensor.Tensor:
		w.Tensor(v)
	case tensor.ReachRoot: // an engine object (a DDP reducer a hook keeps)
		w.Engine(v.Reach)
	}
}

// UnwrapCell returns the value inside a Starlark cell — a local variable
// captured by a closure, as frames hold it and starlark.DebugFrame.Local
// returns it — and true, or v and false for any other value. The cell
// type is unexported: it is recognised by reflection (a struct of one
// Value named go.starlark.net/starlark.cell) and read through unsafe.
func UnwrapCell(v starlark.Value) (starlark.Value, bool) {
	t := reflect.TypeOf(v)
	if t == nil || t.Kind() != reflect.Pointer {
		return v, false
	}
	e := t.Elem()
	if e.Name() != "cell" || e.PkgPath() != "go.starlark.net/starlark" || e.Kind() != reflect.Struct ||
		e.NumField() != 1 || e.Field(0).Type != reflect.TypeFor[starlark.Value]() {
		return v, false
	}
	p := reflect.ValueOf(v).UnsafePointer()
	if p == nil {
		return v, false
	}
	return *(*starlark.Value)(p), true
}

// Value walks a Starlark value.
func (w *Walker) Value(v starlark.Value) {
	if v == nil || w.stopped {
		return
	}
	w.tick()
	switch v := v.(type) {
	case starlark.NoneType, starlark.Bool, starlark.Int, starlark.Float, starlark.String, starlark.Bytes:
	case Reacher: // before Opaque: most values a walk meets are tensors and modules
		v.Reach(w)
	case Opaque:
	case *starlark.List:
		v.Watch() // a mutation now moves starlark.Mutations (scope/reach.go)
		if (w.Containers != nil && w.Containers(v)) || Seen(w, v) {
			return
		}
		w.Tail(v, 0)
	case starlark.Tuple:
		for _, x := range v {
			w.Value(x)
		}
	case *starlark.Dict:
		v.Watch()
		if (w.Containers != nil && w.Containers(v)) || Seen(w, v) {
			return
		}
		w.Tail(v, 0)
	case *starlark.Set:
		v.Watch()
		if Seen(w, v) {
			return
		}
		for x := range v.Elements() {
			w.Value(x)
		}
	case *starlarkstruct.Struct:
		if Seen(w, v) {
			return
		}
		for x := range v.Values {
			w.Value(x)
		}
	case *starlark.Function:
		// modules made by one constructor share their forward function:
		// the last one walked is checked before the seen-set
		if v == w.lastFunc || Seen(w, v) {
			return
		}
		w.lastFunc = v
		for i := 0; i < v.NumParams()+v.NumKwonlyParams(); i++ {
			w.Value(v.ParamDefault(i))
		}
		for i := 0; i < v.NumFreeVars(); i++ {
			_, x := v.FreeVar(i)
			w.Value(x)
		}
		// its module's globals: another top-level statement's (a
		// lambda's module keeps what that statement bound) or a loaded
		// module's; once per module
		if gs := v.GlobalValues(); len(gs) > 0 && !Seen(w, &gs[0]) {
			for _, x := range gs {
				w.Value(x)
			}
		}
	case *starlark.Builtin:
		w.Value(v.Receiver())
	case *starlarkstruct.Module:
		if Seen(w, v) {
			return
		}
		w.Values(v.Members)
	default:
		if x, ok := UnwrapCell(v); ok {
			w.Value(x)
		} else if v.Type() != "range" { // a range holds integers only
			w.Incomplete(v.Type())
		}
	}
}

// Tail walks the elements of a list from index i on, or the entries
// of a dict (keys and values, in insertion order) from the i-th on.
func (w *Walker) Tail(v starlark.Value, i int) {
	switch v := v.(type) {
	case *starlark.List:
		for ; i < v.Len(); i++ {
			w.Value(v.Index(i))
		}
	case *starlark.Dict:
		for k, x := range v.EntriesFrom(i) {
			w.Value(k)
			w.Value(x)
		}
	}
}

// Values walks each value of a StringDict.
func (w *Walker) Values(d starlark.StringDict) {
	for _, v := range d {
		w.Value(v)
	}
}

// Engine lets an engine object (an optimizer, a scaler) report its tensors
// through the walk's tensor.Reacher.
func (w *Walker) Engine(reach func(*tensor.Reacher)) {
	w.tick()
	reach(&w.r)
}
