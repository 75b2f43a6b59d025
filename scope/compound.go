package scope

import (
	"errors"
	"fmt"
	"reflect"
	"strings"

	"go.starlark.net/resolve"
	"go.starlark.net/starlark"
	"go.starlark.net/syntax"
)

// A top-level compound statement (for, if, while) is compiled as a module of
// its own, and a def or lambda written inside it would read the globals the
// statement binds from that module: values frozen when the statement ended,
// kept alive as long as the function lives. Two rewrites make such functions
// behave as in Python:
//
//   - reads, inside nested functions, of globals the statement binds become
//     `·cur.NAME`: the running statement's binding if it has one, else the
//     live globals (curGlobals);
//   - after the statement, `·flush()` hands its bindings to the executor and
//     `NAME = None` clears each module slot, so nothing stays reachable
//     through the functions' module.

// curName and flushName are predeclared names user code cannot write.
const (
	curName   = "·cur"
	flushName = "·flush"
)

// curGlobals serves curName.
type curGlobals struct{ s *Session }

var _ starlark.HasAttrs = (*curGlobals)(nil)

func (c *curGlobals) String() string        { return "<current globals>" }
func (c *curGlobals) Type() string          { return "current_globals" }
func (c *curGlobals) Freeze()               {}
func (c *curGlobals) Truth() starlark.Bool  { return true }
func (c *curGlobals) Hash() (uint32, error) { return 0, errors.New("unhashable") }
func (c *curGlobals) AttrNames() []string   { return nil }

// Attr returns the current value of global name: the running top-level
// statement's binding if it has one, otherwise the live globals'.
func (c *curGlobals) Attr(name string) (starlark.Value, error) {
	s := c.s
	if v, ok := s.statementGlobals(s.thread)[name]; ok {
		return v, nil
	}
	if v, ok := s.live[name]; ok && !strings.HasPrefix(name, "·") {
		return v, nil
	}
	return nil, fmt.Errorf("global variable %s referenced before assignment", name)
}

// flusher serves flushName: called at the end of a compound statement, it
// records the statement's bindings before the epilogue clears them.
type flusher struct{ s *Session }

func (f *flusher) flush(thread *starlark.Thread, _ *starlark.Builtin, _ starlark.Tuple, _ []starlark.Tuple) (starlark.Value, error) {
	f.s.flushed = f.s.statementGlobals(thread)
	return starlark.None, nil
}

// isCompound reports whether stmt is a top-level for, if or while.
func isCompound(stmt syntax.Stmt) bool {
	switch stmt.(type) {
	case *syntax.ForStmt, *syntax.IfStmt, *syntax.WhileStmt:
		return true
	}
	return false
}

// hasFunction reports whether stmt contains a def or a lambda.
func hasFunction(stmt syntax.Stmt) bool {
	found := false
	syntax.Walk(stmt, func(n syntax.Node) bool {
		switch n.(type) {
		case *syntax.DefStmt, *syntax.LambdaExpr:
			found = true
		}
		return !found
	})
	return found
}

// rewriteNestedReads resolves file (whose last statement is stmt) and
// replaces, inside the bodies of stmt's nested functions, every read of a
// global in bound by `·cur.NAME`. It reports whether it changed anything.
func rewriteNestedReads(file *syntax.File, stmt syntax.Stmt, bound map[string]bool, isPredeclared func(string) bool) (bool, error) {
	if err := resolve.File(file, isPredeclared, starlark.Universe.Has); err != nil {
		return false, err
	}
	changed := false
	var inFunc func(n syntax.Node) bool
	inFunc = func(n syntax.Node) bool {
		switch n := n.(type) {
		case *syntax.DefStmt:
			for _, b := range n.Body {
				if replaceIdents(reflect.ValueOf(b), bound) {
					changed = true
				}
			}
			return false // parameter defaults are evaluated at def time: left as they are
		case *syntax.LambdaExpr:
			if replaceIdents(reflect.ValueOf(&n.Body).Elem(), bound) {
				changed = true
			}
			return false
		}
		return true
	}
	syntax.Walk(stmt, inFunc)
	return changed, nil
}

var (
	exprType = reflect.TypeOf((*syntax.Expr)(nil)).Elem()
	identPtr = reflect.TypeOf((*syntax.Ident)(nil))
)

// replaceIdents walks the syntax value v (a node, or a field holding one)
// and replaces each *syntax.Ident resolved as a global in bound, held in an
// Expr-typed field or slice element, by `·cur.NAME`.
func replaceIdents(v reflect.Value, bound map[string]bool) bool {
	changed := false
	var walk func(v reflect.Value)
	walk = func(v reflect.Value) {
		switch v.Kind() {
		case reflect.Interface:
			if v.IsNil() {
				return
			}
			if v.Type() == exprType && v.Elem().Type() == identPtr && v.CanSet() {
				id := v.Elem().Interface().(*syntax.Ident)
				if b, ok := id.Binding.(*resolve.Binding); ok && b.Scope == resolve.Global && bound[id.Name] {
					v.Set(reflect.ValueOf(syntax.Expr(&syntax.DotExpr{
						X:       &syntax.Ident{NamePos: id.NamePos, Name: curName},
						Dot:     id.NamePos,
						NamePos: id.NamePos,
						Name:    &syntax.Ident{NamePos: id.NamePos, Name: id.Name},
					})))
					changed = true
				}
				return
			}
			walk(v.Elem())
		case reflect.Pointer:
			if !v.IsNil() && v.Elem().Kind() == reflect.Struct {
				walk(v.Elem())
			}
		case reflect.Struct:
			for i := 0; i < v.NumField(); i++ {
				f := v.Field(i)
				if v.Type().Field(i).IsExported() {
					walk(f)
				}
			}
		case reflect.Slice:
			for i := 0; i < v.Len(); i++ {
				walk(v.Index(i))
			}
		}
	}
	walk(v)
	return changed
}

// HoldsNoMemory implements env.Opaque: what it gives access to are the
// Session's live globals, which the reach walk visits as roots.
func (g *curGlobals) HoldsNoMemory() {}
