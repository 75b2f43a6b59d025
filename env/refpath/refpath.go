// Package refpath finds which memory allocations Starlark values keep alive,
// and by what reference path: `cache["k"][3]`, `f.<free t>`, `s.weights`.
// Experiments use it to report leaks at finish and reports use it to name
// tensors.
//
// The walk is breadth-first from named roots, so each allocation is reported
// with a shortest path. It follows lists, tuples, dicts, sets, structs,
// modules, functions (free variables, defaults and module globals), bound
// builtins (their receiver), env.Holder values (tensors, buffers) and any
// value implementing Referrer. Other values are opaque.
package refpath

import (
	"fmt"
	"reflect"
	"strconv"
	"strings"

	"go.starlark.net/starlark"
	"go.starlark.net/starlarkstruct"

	"github.com/memsh/memsh/backend"
	"github.com/memsh/memsh/env"
)

// Referrer is implemented by memsh's own container values (experiment
// handles, trial results, ...) so the walk can see inside them. Each call of
// edge gives a path suffix (".field", "[0]", ".<state>") and the value it
// leads to.
type Referrer interface {
	starlark.Value
	References(edge func(suffix string, v starlark.Value))
}

// Root is a named starting point of the walk.
type Root struct {
	Name  string
	Value starlark.Value
}

// Hit is one allocation reached by the walk.
type Hit struct {
	Memory *backend.Memory
	Path   string         // shortest reference path, e.g. `lst[0]`
	Holder starlark.Value // the value that owns the memory (a tensor, a buffer)
}

// Walk visits every value reachable from roots, breadth-first, and calls
// visit once for each distinct allocation the first time a holder of it is
// reached. If visit returns false the walk stops.
func Walk(roots []Root, visit func(Hit) bool) {
	mems := map[*backend.Memory]bool{}
	Holders(roots, func(h env.Holder, path string) bool {
		m := h.HeldMemory()
		if mems[m] {
			return true
		}
		mems[m] = true
		return visit(Hit{Memory: m, Path: path, Holder: h})
	})
}

// Holders visits every value reachable from roots, breadth-first, and calls
// visit once for each distinct holder value (a tensor, a buffer) with the
// shortest path that reaches it — views sharing one allocation are each
// visited. If visit returns false the walk stops.
func Holders(roots []Root, visit func(h env.Holder, path string) bool) {
	holders(roots, visit, false)
}

// HoldersAll is Holders that also visits a holder each further time the
// walk reaches it by another path (a tied parameter reached as
// "b.weight" after "a.weight"), without walking into it again; reports
// show such paths as sharing the first one.
func HoldersAll(roots []Root, visit func(h env.Holder, path string) bool) {
	holders(roots, visit, true)
}

// step is one value of the walk's queue: how it was reached (its parent
// step and the edge's suffix) rather than its whole path, so that the
// walk is linear in the values it visits however deep they nest; a path
// is built only for a holder visit reports.
type step struct {
	v      starlark.Value
	parent int32  // index of the step it was reached from; -1 for a root
	suffix string // the edge's suffix, or its format with key
	key    starlark.Value
}

// path builds the path of steps[i] from its root.
func path(steps []step, i int32) string {
	var parts []string
	for ; i >= 0; i = steps[i].parent {
		st := &steps[i]
		if st.key != nil {
			parts = append(parts, fmt.Sprintf(st.suffix, st.key.String()))
		} else {
			parts = append(parts, st.suffix)
		}
	}
	var b strings.Builder
	for k := len(parts) - 1; k >= 0; k-- {
		b.WriteString(parts[k])
	}
	return b.String()
}

func holders(roots []Root, visit func(h env.Holder, path string) bool, aliases bool) {
	seen := map[uintptr]bool{}
	steps := make([]step, 0, len(roots))
	for _, r := range roots {
		if r.Value != nil {
			steps = append(steps, step{v: r.Value, parent: -1, suffix: r.Name})
		}
	}
	for head := 0; head < len(steps); head++ {
		cur := int32(head)
		v, _ := env.UnwrapCell(steps[head].v)
		steps[head].v = nil // the queue does not keep what it walked
		id, ok := identity(v)
		if ok && seen[id] && aliases {
			if h, isH := v.(env.Holder); isH && h.HeldMemory() != nil && !visit(h, path(steps, cur)) {
				return
			}
		}
		if !ok || seen[id] {
			continue // a scalar holds nothing; a seen value was walked
		}
		seen[id] = true
		if h, ok := v.(env.Holder); ok && h.HeldMemory() != nil {
			if !visit(h, path(steps, cur)) {
				return
			}
		}
		push := func(suffix string, x starlark.Value) {
			if x != nil {
				steps = append(steps, step{v: x, parent: cur, suffix: suffix})
			}
		}
		pushKey := func(format string, key, x starlark.Value) {
			if x != nil {
				steps = append(steps, step{v: x, parent: cur, suffix: format, key: key})
			}
		}
		switch v := v.(type) {
		case *starlark.List:
			for i := 0; i < v.Len(); i++ {
				push("["+strconv.Itoa(i)+"]", v.Index(i))
			}
		case starlark.Tuple:
			for i, x := range v {
				push("["+strconv.Itoa(i)+"]", x)
			}
		case *starlark.Dict:
			for _, kv := range v.Items() {
				pushKey("[%s]", kv[0], kv[1])
				pushKey(".<key %s>", kv[0], kv[0])
			}
		case *starlark.Set:
			iter := v.Iterate()
			var x starlark.Value
			for i := 0; iter.Next(&x); i++ {
				push(".<element "+strconv.Itoa(i)+">", x)
			}
			iter.Done()
		case *starlarkstruct.Struct:
			for _, name := range v.AttrNames() {
				x, _ := v.Attr(name)
				push("."+name, x)
			}
		case *starlarkstruct.Module:
			for name, x := range v.Members {
				push("."+name, x)
			}
		case *starlark.Function:
			for i := 0; i < v.NumFreeVars(); i++ {
				b, x := v.FreeVar(i)
				push(".<free "+b.Name+">", x)
			}
			for i := 0; i < v.NumParams()+v.NumKwonlyParams(); i++ {
				if d := v.ParamDefault(i); d != nil {
					name, _ := v.Param(i)
					push(".<default "+name+">", d)
				}
			}
			for name, x := range v.Globals() {
				push(".<global "+name+">", x)
			}
		case *starlark.Builtin:
			push(".<receiver>", v.Receiver())
		case Referrer:
			v.References(push)
		}
	}
}

// identity returns a key that identifies a reference value, and false for
// values that cannot hold references (numbers, strings, None, bools).
func identity(v starlark.Value) (uintptr, bool) {
	switch v := v.(type) {
	case starlark.NoneType, starlark.Bool, starlark.Int, starlark.Float, starlark.String, starlark.Bytes:
		return 0, false
	case starlark.Tuple:
		if len(v) == 0 {
			return 0, false
		}
		return reflect.ValueOf(&v[0]).Pointer(), true
	}
	rv := reflect.ValueOf(v)
	switch rv.Kind() {
	case reflect.Pointer, reflect.Map, reflect.Slice, reflect.Func, reflect.Chan, reflect.UnsafePointer:
		if rv.Pointer() == 0 {
			return 0, false
		}
		return rv.Pointer(), true
	}
	// A value type we do not know: walk it once per distinct type+value is
	// not possible to key; treat it as a leaf that is still visited.
	return reflect.ValueOf(&v).Pointer(), true
}
