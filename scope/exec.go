package scope

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"go.starlark.net/starlark"
	"go.starlark.net/syntax"

	"github.com/memsh/memsh/env"
)

// prevName is the predeclared name through which a statement reads the old
// values of the globals it re-binds. It is not a valid identifier, so user
// code cannot name it.
const prevName = "·prev"

// echoName receives the value of an interactive expression statement; it is
// printed and never stored.
const echoName = "·echo"

// prevValues serves prevName: `x = ·prev.x` is prepended to a statement that
// re-binds an existing global x, so the statement's own module global starts
// at the live value. It holds values only while a statement runs.
type prevValues struct{ m map[string]starlark.Value }

var _ starlark.HasAttrs = (*prevValues)(nil)

func (p *prevValues) String() string        { return "<previous globals>" }
func (p *prevValues) Type() string          { return "previous_globals" }
func (p *prevValues) Freeze()               {}
func (p *prevValues) Truth() starlark.Bool  { return true }
func (p *prevValues) Hash() (uint32, error) { return 0, errors.New("unhashable") }
func (p *prevValues) AttrNames() []string   { return nil }

// Attr returns the old value of name and forgets it: each synthetic
// `x = ·prev.x` reads once, so the old value is not kept alive while the
// statement runs (a loop that drops it can reclaim it).
func (p *prevValues) Attr(name string) (starlark.Value, error) {
	if v, ok := p.m[name]; ok {
		delete(p.m, name)
		return v, nil
	}
	return nil, fmt.Errorf("global variable %s referenced before assignment", name)
}

// Exec parses src (a string, []byte or io.Reader, or nil to read filename)
// and runs it one top-level statement at a time against the live globals.
// It stops at the first failing statement and returns its error (an
// *starlark.EvalError with a backtrace, a syntax.Error or a resolve error,
// each with file:line). A function may call one defined later in the same
// source.
func (s *Session) Exec(filename string, src any) error {
	return s.exec(filename, src, false)
}

// ExecInteractive is Exec for a REPL input: the value of an expression
// statement other than None is printed, as Python's REPL does. The value is
// not kept anywhere (there is no `_`).
func (s *Session) ExecInteractive(filename string, src any) error {
	return s.exec(filename, src, true)
}

func (s *Session) exec(filename string, src any, echo bool) error {
	if s.running {
		return errors.New("memsh: Exec called while a statement is running")
	}
	text, err := readSource(filename, src)
	if err != nil {
		return err
	}
	if strings.HasPrefix(filename, "<") {
		if s.sources == nil {
			s.sources = map[string][]string{}
		}
		s.sources[filename] = strings.Split(strings.TrimSuffix(string(text), "\n"), "\n")
	} else if s.mainDir == "" {
		if abs, err := filepath.Abs(filepath.Dir(filename)); err == nil {
			s.mainDir = abs
		}
	}
	f, err := fileOptions.Parse(filename, text, 0)
	if err != nil {
		return withHint(err, text)
	}
	fileBound := map[string]bool{}
	bound := make([][]string, len(f.Stmts))
	for i, stmt := range f.Stmts {
		bound[i] = boundNames(stmt)
		for _, n := range bound[i] {
			fileBound[n] = true
		}
	}
	for i, stmt := range f.Stmts {
		// A REPL input is one input; each statement of a script is one.
		first, last := !echo || i == 0, !echo || i == len(f.Stmts)-1
		if err := s.execStmt(f, stmt, bound[i], fileBound, echo, first, last); err != nil {
			return err
		}
	}
	return nil
}

// execStmt runs one top-level statement: it compiles the statement as a
// file of its own whose predeclared environment is the live map itself (so
// functions see later rebindings and definitions), writes every global the
// statement bound back into the live map, then applies the name deletions
// and restores that experiments finished during the statement asked for.
func (s *Session) execStmt(f *syntax.File, stmt syntax.Stmt, names []string, fileBound map[string]bool, echo, first, last bool) error {
	s.reopen = reopenSites(stmt)
	pos, _ := stmt.Span()
	var stmts []syntax.Stmt
	s.prev.m = nil
	for _, n := range names {
		if v, ok := s.live[n]; ok {
			if s.prev.m == nil {
				s.prev.m = make(map[string]starlark.Value, len(names))
			}
			s.prev.m[n] = v
			stmts = append(stmts, &syntax.AssignStmt{
				OpPos: pos, Op: syntax.EQ,
				LHS: &syntax.Ident{NamePos: pos, Name: n},
				RHS: &syntax.DotExpr{X: &syntax.Ident{NamePos: pos, Name: prevName}, Dot: pos, NamePos: pos, Name: &syntax.Ident{NamePos: pos, Name: n}},
			})
		}
	}
	if es, ok := stmt.(*syntax.ExprStmt); ok && echo {
		stmt = &syntax.AssignStmt{OpPos: pos, Op: syntax.EQ, LHS: &syntax.Ident{NamePos: pos, Name: echoName}, RHS: es.X}
	}
	stmts = append(stmts, stmt)
	isPredeclared := func(name string) bool {
		_, ok := s.live[name]
		return ok || fileBound[name]
	}
	file := &syntax.File{Path: f.Path, Stmts: stmts, Options: f.Options}
	rewriteAugmented(file.Stmts[len(file.Stmts)-1:])
	if isCompound(stmt) && hasFunction(stmt) && len(names) > 0 {
		// See compound.go: nested functions read the statement's globals
		// dynamically, and the module lets go of them at the end.
		end := syntax.End(stmt)
		file.Stmts = append(file.Stmts, &syntax.ExprStmt{X: &syntax.CallExpr{
			Fn: &syntax.Ident{NamePos: end, Name: flushName}, Lparen: end, Rparen: end}})
		bound := make(map[string]bool, len(names))
		for _, n := range names {
			bound[n] = true
			file.Stmts = append(file.Stmts, &syntax.AssignStmt{OpPos: end, Op: syntax.EQ,
				LHS: &syntax.Ident{NamePos: end, Name: n}, RHS: &syntax.Ident{NamePos: end, Name: "None"}})
		}
		if _, err := rewriteNestedReads(file, stmt, bound, isPredeclared); err != nil {
			s.prev.m = nil
			s.markCut(err)
			return err
		}
	}
	prog, err := starlark.FileProgram(file, isPredeclared)
	if err != nil {
		s.prev.m = nil
		s.markCut(err)
		return err
	}

	end := syntax.End(stmt)
	s.statementEvent(env.StatementEvent{Start: true, Pos: pos, End: end, First: first, Last: last})
	if s.opts.MaxSteps > 0 {
		s.stepBase += s.thread.Steps + 1 // the stamp clock goes on (stamp)
		s.thread.Steps = 0
		s.thread.SetMaxExecutionSteps(s.opts.MaxSteps)
	}
	s.running = true
	globals, err := prog.Init(s.thread, s.live)
	s.running = false
	s.prev.m = nil
	s.reopen = nil
	if s.flushed != nil {
		globals, s.flushed = s.flushed, nil // the epilogue cleared the module's slots
	}

	for name, v := range globals {
		if strings.HasPrefix(name, "·") {
			continue
		}
		s.live[name] = v
		s.user[name] = true
	}
	if v, ok := globals[echoName]; ok && err == nil && v != starlark.None {
		fmt.Fprintln(s.out, v.String())
	}
	globals = nil
	s.applyPending()
	s.statementEvent(env.StatementEvent{Pos: pos, End: end, Err: err, First: first, Last: last || err != nil})
	if err != nil {
		s.markCut(err)
	}
	if err != nil {
		// A failed statement's temporaries are garbage now: reclaim them
		// so the Session stays usable with memory back where it was.
		s.thread.Uncancel()
		s.mgr.Reclaim()
		return s.explainSteps(fixError(err))
	}
	return nil
}

// readSource returns the text of src (a string, []byte or io.Reader), or
// of the file filename when src is nil.
func readSource(filename string, src any) ([]byte, error) {
	switch src := src.(type) {
	case string:
		return []byte(src), nil
	case []byte:
		return src, nil
	case io.Reader:
		return io.ReadAll(src)
	case nil:
		return os.ReadFile(filename)
	}
	return nil, fmt.Errorf("memsh: invalid source type %T", src)
}

// Source returns the lines of a pseudo-file the Session ran (a REPL input
// such as "<stdin-3>", "<cmd>" code), for tools that show source lines
// (the line profiler); ok is false for real files (read them from disk)
// and unknown names.
func (s *Session) Source(filename string) (lines []string, ok bool) {
	lines, ok = s.sources[filename]
	return lines, ok
}

var uninitialized = regexp.MustCompile(`internal error: predeclared variable (\S+) is uninitialized`)

// fixError rewords the interpreter's message for a global that a function
// uses before the statement defining it has run (a forward reference into
// a later statement of the file) as Starlark words it within one file.
func fixError(err error) error {
	var ee *starlark.EvalError
	if errors.As(err, &ee) {
		ee.Msg = uninitialized.ReplaceAllString(ee.Msg, "global variable $1 referenced before assignment")
	}
	return err
}

// explainSteps names the limit when a statement ran out of steps.
func (s *Session) explainSteps(err error) error {
	var ee *starlark.EvalError
	if s.opts.MaxSteps > 0 && errors.As(err, &ee) && strings.HasSuffix(ee.Msg, "cancelled: too many steps") {
		ee.Msg += fmt.Sprintf(" (the limit is %d steps per top-level statement: --max-steps)", s.opts.MaxSteps)
	}
	return err
}

// reopenSites finds the statement's assignments `NAME = experiment(...)`
// (at top level or in top-level control flow, not in functions) and maps the
// call's position to NAME, for ipyexperiments' re-run rule: running such an
// assignment while the experiment bound to NAME is open finishes the old
// experiment first. experimentBuiltin applies it, after validating its
// arguments.
func reopenSites(stmt syntax.Stmt) map[posKey]string {
	var sites map[posKey]string
	var walk func(stmts []syntax.Stmt)
	walk = func(stmts []syntax.Stmt) {
		for _, st := range stmts {
			switch st := st.(type) {
			case *syntax.AssignStmt:
				id, ok := st.LHS.(*syntax.Ident)
				call, ok2 := st.RHS.(*syntax.CallExpr)
				if !ok || !ok2 || st.Op != syntax.EQ {
					continue
				}
				if fn, ok := call.Fn.(*syntax.Ident); ok && fn.Name == "experiment" {
					if sites == nil {
						sites = map[posKey]string{}
					}
					sites[keyOf(call.Lparen)] = id.Name
				}
			case *syntax.ForStmt:
				walk(st.Body)
			case *syntax.WhileStmt:
				walk(st.Body)
			case *syntax.IfStmt:
				walk(st.True)
				walk(st.False)
			}
		}
	}
	walk([]syntax.Stmt{stmt})
	return sites
}

// posKey identifies a source position.
type posKey struct {
	file      string
	line, col int32
}

func keyOf(p syntax.Position) posKey { return posKey{p.Filename(), p.Line, p.Col} }

// boundNames returns the global names a top-level statement may bind, in
// order of appearance: assignment targets, def names, for-loop variables
// and load bindings, looking inside top-level if/for/while bodies but not
// inside functions or comprehensions.
func boundNames(stmt syntax.Stmt) []string {
	var names []string
	seen := map[string]bool{}
	add := func(n string) {
		if !seen[n] {
			seen[n] = true
			names = append(names, n)
		}
	}
	var target func(e syntax.Expr)
	target = func(e syntax.Expr) {
		switch e := e.(type) {
		case *syntax.Ident:
			add(e.Name)
		case *syntax.TupleExpr:
			for _, x := range e.List {
				target(x)
			}
		case *syntax.ListExpr:
			for _, x := range e.List {
				target(x)
			}
		case *syntax.ParenExpr:
			target(e.X)
		}
	}
	var walk func(stmts []syntax.Stmt)
	walk = func(stmts []syntax.Stmt) {
		for _, st := range stmts {
			switch st := st.(type) {
			case *syntax.AssignStmt:
				target(st.LHS)
			case *syntax.DefStmt:
				add(st.Name.Name)
			case *syntax.ForStmt:
				target(st.Vars)
				walk(st.Body)
			case *syntax.WhileStmt:
				walk(st.Body)
			case *syntax.IfStmt:
				walk(st.True)
				walk(st.False)
			case *syntax.LoadStmt:
				for _, id := range st.To {
					add(id.Name)
				}
			}
		}
	}
	walk([]syntax.Stmt{stmt})
	return names
}

// setGlobal writes a module-level assignment of the running statement
// through to the live globals (Thread.OnSetGlobal). Not while the
// statement's epilogue clears its module (compound.go: the values are in
// s.flushed then), and not for memsh's synthetic names.
func (s *Session) setGlobal(name string, v starlark.Value) {
	if !s.running || s.flushed != nil || strings.HasPrefix(name, "·") {
		return
	}
	s.live[name] = v
}

// Reach walks the old values not read yet (env.Reacher).
func (p *prevValues) Reach(w *env.Walker) { w.Values(p.m) }
