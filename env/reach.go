package env

import (
	"reflect"
	"time"
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
// sound whatever it skips; a value it does not know is skipped.
//
// A walk has a deadline, which the Manager sets to about what its last
// collection took: past it the walk gives up (Exhausted) and the reclaim
// runs the collector, so a session holding a million-element list pays at
// most twice a collection, never a longer walk.
type Walker struct {
	r        tensor.Reacher
	seen     map[unsafe.Pointer]struct{}
	deadline time.Time
	count    int  // values visited since the last look at the clock
	late     bool // past the deadline
}

// Reacher is implemented by memsh's Starlark values that hold tensors,
// device memory or other Starlark values: Reach passes each to w.
type Reacher interface {
	Reach(w *Walker)
}

// NewWalker returns a walker for the walk numbered epoch that reports
// every allocation it reaches to visit and gives up at deadline.
func NewWalker(epoch uint64, deadline time.Time, visit func(*backend.Memory)) *Walker {
	w := &Walker{seen: map[unsafe.Pointer]struct{}{}, deadline: deadline}
	w.r = tensor.Reacher{Epoch: epoch, Memory: visit, Other: w.other}
	return w
}

// Exhausted reports that the walk is past its deadline.
func (w *Walker) Exhausted() bool { return w.late }

// tick counts one value and looks at the clock every 256.
func (w *Walker) tick() {
	w.count++
	if w.count >= 256 {
		w.count = 0
		w.late = time.Now().After(w.deadline)
	}
}

// Finish walks what the walk queued (autograd graphs) and reports whether
// it completed before its deadline.
func (w *Walker) Finish() bool {
	if !w.late {
		w.r.Drain()
	}
	return !w.late && !time.Now().After(w.deadline)
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
	}
}

// isCell reports whether t is go.starlark.net's cell type (a local
// variable captured by a closure, as frames and free variables hold it):
// a struct of one Value, read through unsafe.
func isCell(t reflect.Type) bool {
	return t.Kind() == reflect.Pointer && t.Elem().Name() == "cell" && t.Elem().PkgPath() == "go.starlark.net/starlark" &&
		t.Elem().Kind() == reflect.Struct && t.Elem().NumField() == 1 && t.Elem().Field(0).Type == reflect.TypeFor[starlark.Value]()
}

// referrer is env/refpath's Referrer: memsh's container values that list
// what they refer to (experiments, trial results).
type referrer interface {
	References(edge func(suffix string, v starlark.Value))
}

// Value walks a Starlark value.
func (w *Walker) Value(v starlark.Value) {
	if v == nil || w.late {
		return
	}
	w.tick()
	switch v := v.(type) {
	case starlark.NoneType, starlark.Bool, starlark.Int, starlark.Float, starlark.String, starlark.Bytes:
	case Reacher:
		v.Reach(w)
	case referrer:
		if rv := reflect.ValueOf(v); rv.Kind() == reflect.Pointer && Seen(w, (*byte)(rv.UnsafePointer())) {
			return // walked already (or holds itself)
		}
		v.References(func(_ string, x starlark.Value) { w.Value(x) })
	case *starlark.List:
		if Seen(w, v) {
			return
		}
		for i := 0; i < v.Len(); i++ {
			w.Value(v.Index(i))
		}
	case starlark.Tuple:
		for _, x := range v {
			w.Value(x)
		}
	case *starlark.Dict:
		if Seen(w, v) {
			return
		}
		for k, x := range v.Entries() {
			w.Value(k)
			w.Value(x)
		}
	case *starlark.Set:
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
		for _, name := range v.AttrNames() {
			x, _ := v.Attr(name)
			w.Value(x)
		}
	case *starlark.Function:
		if Seen(w, v) {
			return
		}
		for i := 0; i < v.NumParams()+v.NumKwonlyParams(); i++ {
			w.Value(v.ParamDefault(i))
		}
		for i := 0; i < v.NumFreeVars(); i++ {
			_, x := v.FreeVar(i)
			w.Value(x)
		}
	case *starlark.Builtin:
		w.Value(v.Receiver())
	default:
		if isCell(reflect.TypeOf(v)) {
			w.Value(*(*starlark.Value)(unsafe.Pointer(reflect.ValueOf(v).Pointer())))
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
