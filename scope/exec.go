package scope

import (
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"regexp"
	"strings"

	"go.starlark.net/starlark"
	"go.starlark.net/syntax"

	"github.com/memsh/memsh/env"
	"github.com/memsh/memsh/fsafe"
)

// echoName receives the value of an interactive expression statement; it is
// printed and never stored.
const echoName = "·echo"

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

// Every statement's module keeps its globals in the live map itself
// (starlark.Program.InitLive, patch 7 of third_party/go.starlark.net), as
// a Python module keeps them in its dict: an assignment replaces the old
// value there at once (so a loop that re-binds a global drops the old
// value at the assignment), and every function, whichever statement or
// script defined it, reads the value the live map holds when it runs.
//
// A script whose statements all resolve runs as one program (execFile),
// compiled with a STMT instruction before each top-level statement, where
// the interpreter calls back into the executor for what it does between
// statements (nextStmt); otherwise (a REPL input, or a script whose
// resolve fails at some statement, which must run the statements before
// it) each statement is compiled and run on its own (execStmt).
func (s *Session) exec(filename string, src any, echo bool) error {
	if s.running {
		return errors.New("memsh: Exec called while a statement is running")
	}
	s.Settle()
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
	if !echo {
		if prog, run := s.compileFile(f); prog != nil {
			return s.execFile(f, prog, run)
		}
		// The resolver annotated f: parse it again for the statements.
		if f, err = fileOptions.Parse(filename, text, 0); err != nil {
			return withHint(err, text)
		}
	}
	fileBound := map[string]bool{}
	for _, stmt := range f.Stmts {
		for _, n := range boundNames(stmt) {
			fileBound[n] = true
		}
	}
	for i, stmt := range f.Stmts {
		// A REPL input is one input; each statement of a script is one.
		first, last := !echo || i == 0, !echo || i == len(f.Stmts)-1
		if err := s.execStmt(f, stmt, fileBound, echo, first, last); err != nil {
			return err
		}
	}
	return nil
}

// compileFile compiles a script as one program whose module globals are
// the live map, with a STMT instruction before each statement
// (syntax.FileOptions.StatementHook); nil if it does not resolve.
func (s *Session) compileFile(f *syntax.File) (*starlark.Program, *fileRun) {
	rewriteAugmented(f.Stmts)
	run := &fileRun{stmts: make([]stmtSpan, len(f.Stmts)), cur: -1}
	for i, stmt := range f.Stmts {
		pos, end := stmt.Span()
		run.stmts[i] = stmtSpan{pos, end}
	}
	opts := *f.Options
	opts.StatementHook = true
	file := &syntax.File{Path: f.Path, Stmts: f.Stmts, Options: &opts}
	prog, err := starlark.FileProgram(file, s.live.Has)
	if err != nil {
		return nil, nil
	}
	return prog, run
}

// fileRun is the state of a script running as one program.
type fileRun struct {
	stmts []stmtSpan
	cur   int // the statement running; -1 before the first
}

// stmtSpan is where a top-level statement starts and ends.
type stmtSpan struct{ pos, end syntax.Position }

// execFile runs prog, compiled from f by compileFile.
func (s *Session) execFile(f *syntax.File, prog *starlark.Program, run *fileRun) error {
	s.reopen = reopenSites(f.Stmts)
	s.file = run
	s.running = true
	s.resetSteps() // before the first STMT, as before each statement
	err := prog.InitLive(s.thread, s.live)
	s.running = false
	s.file = nil
	s.reopen = nil
	if run.cur < 0 {
		if err == nil {
			return nil // no statements
		}
		run.cur = 0
	}
	st := run.stmts[run.cur]
	return s.endStmt(st.pos, st.end, true, true, err)
}

// nextStmt is the main thread's OnStatement: the next statement of the
// running script begins, and the one before it has ended. The calls come
// in the order of the statements, once each: nothing at top level loops
// around them.
func (s *Session) nextStmt(thread *starlark.Thread) error {
	run := s.file
	if run == nil || thread != s.thread || run.cur+1 >= len(run.stmts) {
		return errors.New("memsh: a statement hook outside a script")
	}
	if run.cur >= 0 {
		st := run.stmts[run.cur]
		_ = s.endStmt(st.pos, st.end, true, true, nil)
	}
	run.cur++
	st := run.stmts[run.cur]
	s.beginStmt(st.pos, st.end, true, true)
	return nil
}

// beginStmt is what the executor does before a top-level statement runs.
func (s *Session) beginStmt(pos, end syntax.Position, first, last bool) {
	s.globalsGen++ // the Session may have changed its globals in between
	s.statementEvent(env.StatementEvent{Start: true, Pos: pos, End: end, First: first, Last: last})
	s.resetSteps()
}

// resetSteps starts a new count of steps against --max-steps.
func (s *Session) resetSteps() {
	if s.opts.MaxSteps > 0 {
		s.stepBase += s.thread.Steps + 1 // the stamp clock goes on (stamp)
		s.thread.Steps = 0
		s.thread.SetMaxExecutionSteps(s.opts.MaxSteps)
	}
}

// endStmt is what the executor does after a top-level statement ran (err:
// how it failed): it applies the name deletions and restores that
// experiments finished during the statement asked for and sends the
// statement's end event; after a failure it marks the open experiments cut
// and reclaims the statement's temporaries. It returns err as Exec does.
func (s *Session) endStmt(pos, end syntax.Position, first, last bool, err error) error {
	interrupted := s.tctx.Interrupted() // the statement event clears the flag
	s.globalsGen++                      // pending restores, experiments' ends
	s.applyPending()
	s.statementEvent(env.StatementEvent{Pos: pos, End: end, Err: err, First: first, Last: last || err != nil})
	if err == nil {
		return nil
	}
	s.markCut(err)
	// A failed statement's temporaries are garbage now: reclaim them so
	// the Session stays usable with memory back where it was. After
	// Ctrl-C that waits for the next Exec (Settle): the reclaim of a
	// session holding a large Go heap is a collection (tens of
	// milliseconds per 100 MB of it), which would hold up the interrupt,
	// and a script that was interrupted exits without it.
	s.thread.Uncancel()
	if interrupted {
		s.reclaimDue = true
	} else {
		s.mgr.Reclaim()
	}
	return s.explainSteps(fixError(err))
}

// execStmt compiles one top-level statement as a file of its own, whose
// predeclared environment and module globals are the live map, and runs it.
func (s *Session) execStmt(f *syntax.File, stmt syntax.Stmt, fileBound map[string]bool, echo, first, last bool) error {
	s.reopen = reopenSites([]syntax.Stmt{stmt})
	pos, _ := stmt.Span()
	if es, ok := stmt.(*syntax.ExprStmt); ok && echo {
		stmt = &syntax.AssignStmt{OpPos: pos, Op: syntax.EQ, LHS: &syntax.Ident{NamePos: pos, Name: echoName}, RHS: es.X}
	}
	isPredeclared := func(name string) bool {
		_, ok := s.live[name]
		return ok || fileBound[name]
	}
	file := &syntax.File{Path: f.Path, Stmts: []syntax.Stmt{stmt}, Options: f.Options}
	rewriteAugmented(file.Stmts)
	prog, err := starlark.FileProgram(file, isPredeclared)
	if err != nil {
		s.reopen = nil
		s.markCut(err)
		return err
	}
	end := syntax.End(stmt)
	s.beginStmt(pos, end, first, last)
	s.running = true
	err = prog.InitLive(s.thread, s.live)
	s.running = false
	s.reopen = nil
	if v, ok := s.live[echoName]; ok {
		delete(s.live, echoName)
		s.globalsGen++
		if err == nil && v != starlark.None {
			// written as str() writes it: Ctrl-C stops a huge value
			var text string
			if text, err = starlark.StringOf(s.thread, v); err == nil {
				fmt.Fprintln(s.out, text)
			}
		}
	}
	return s.endStmt(pos, end, first, last, err)
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
		return ReadScript(filename)
	}
	return nil, fmt.Errorf("memsh: invalid source type %T", src)
}

// MaxScript bounds a script or module file memsh reads: a bigger file is
// refused before it is read (a 3 GB file given to load() would otherwise
// take the process's memory).
const MaxScript = 64 << 20

// ReadScript reads a script or module file: a regular file of at most
// MaxScript bytes (a FIFO, a device or a directory is an error, and never
// blocks).
func ReadScript(path string) ([]byte, error) {
	f, err := fsafe.OpenRegular(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if fi.Size() > MaxScript {
		return nil, fmt.Errorf("%s: %d bytes, larger than a script may be (%d MiB)", path, fi.Size(), MaxScript>>20)
	}
	return io.ReadAll(io.LimitReader(f, MaxScript+1))
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

// reopenSites finds the top-level statements' assignments `NAME = experiment(...)`
// (at top level or in top-level control flow, not in functions) and maps the
// call's position to NAME, for ipyexperiments' re-run rule: running such an
// assignment while the experiment bound to NAME is open finishes the old
// experiment first. experimentBuiltin applies it, after validating its
// arguments.
func reopenSites(stmts []syntax.Stmt) map[posKey]string {
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
	walk(stmts)
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

// setGlobal is called after each assignment to a global of a top-level
// statement (Thread.OnSetGlobal), which stored the value in the live map:
// the name is the user's from then on. Not for memsh's synthetic names.
func (s *Session) setGlobal(name string, _ starlark.Value) {
	s.globalsGen++
	if strings.HasPrefix(name, "·") {
		return
	}
	s.user[name] = true
}
