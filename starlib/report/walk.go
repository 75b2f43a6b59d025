package report

import (
	"fmt"
	"reflect"

	"go.starlark.net/starlark"
	"go.starlark.net/starlarkstruct"

	"github.com/memsh/memsh/scope/refpath"
	"github.com/memsh/memsh/starlib/env"
)

// holder is one value that owns memory (a tensor, a buffer), with the
// shortest reference path that reaches it.
type holder struct {
	value env.Holder
	path  string
}

// holders walks from roots breadth-first, along the edges scope/refpath
// follows, and returns every distinct holder value in the order reached.
// refpath.Walk reports each allocation once; a report needs every tensor,
// including views sharing an allocation.
func holders(roots []refpath.Root) []holder {
	type item struct {
		v    starlark.Value
		path string
	}
	var out []holder
	seen := map[uintptr]bool{}
	queue := make([]item, 0, len(roots))
	for _, r := range roots {
		if r.Value != nil {
			queue = append(queue, item{r.Value, r.Name})
		}
	}
	for len(queue) > 0 {
		it := queue[0]
		queue = queue[1:]
		id, ok := identity(it.v)
		if !ok || seen[id] {
			continue
		}
		seen[id] = true
		if h, ok := it.v.(env.Holder); ok && h.HeldMemory() != nil {
			out = append(out, holder{value: h, path: it.path})
		}
		push := func(suffix string, v starlark.Value) {
			if v != nil {
				queue = append(queue, item{v, it.path + suffix})
			}
		}
		switch v := it.v.(type) {
		case *starlark.List:
			for i := 0; i < v.Len(); i++ {
				push(fmt.Sprintf("[%d]", i), v.Index(i))
			}
		case starlark.Tuple:
			for i, x := range v {
				push(fmt.Sprintf("[%d]", i), x)
			}
		case *starlark.Dict:
			for _, kv := range v.Items() {
				push(fmt.Sprintf("[%s]", kv[0].String()), kv[1])
				push(fmt.Sprintf(".<key %s>", kv[0].String()), kv[0])
			}
		case *starlark.Set:
			iter := v.Iterate()
			var x starlark.Value
			for i := 0; iter.Next(&x); i++ {
				push(fmt.Sprintf(".<element %d>", i), x)
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
		case refpath.Referrer:
			v.References(push)
		}
	}
	return out
}

// identity returns a key for a reference value, false for values that hold
// nothing (numbers, strings, None, bools, the empty tuple).
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
	// A value of a type we do not know: visit it (it may be a Referrer),
	// keyed by a fresh address, as refpath does.
	return reflect.ValueOf(&v).Pointer(), true
}
