package scope_test

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"

	"go.starlark.net/starlark"

	"github.com/memsh/memsh/env"
	"github.com/memsh/memsh/scope"
)

// A script runs as one program, yet the executor's work between
// statements still happens at each one: every top-level statement gets its
// start and end event, in order, with its own span, and the failing one
// ends with its error.
func TestScriptStatementEvents(t *testing.T) {
	s, _ := newSession(t, "sim:1GiB")
	var got []string
	remove := s.OnStatement(func(e env.StatementEvent) {
		kind := "end"
		if e.Start {
			kind = "start"
		}
		ev := fmt.Sprintf("%s %d-%d", kind, e.Pos.Line, e.End.Line)
		if e.Err != nil {
			ev += " error"
		}
		got = append(got, ev)
	})
	defer remove()
	err := s.Exec("events.star", `x = 1
for i in range(3):
    x = x + i
y = [1][x]
z = 2
`)
	if err == nil || !strings.Contains(err.Error(), "index 4 out of range") {
		t.Fatalf("err = %v", err)
	}
	want := []string{"start 1-1", "end 1-1", "start 2-3", "end 2-3", "start 4-4", "end 4-4 error"}
	if strings.Join(got, ", ") != strings.Join(want, ", ") {
		t.Errorf("events\n got %v\nwant %v", got, want)
	}
	if s.Get("z") != nil {
		t.Errorf("z = %v after the failing statement", s.Get("z"))
	}
	if v, _ := starlark.AsInt32(s.Get("x")); v != 4 {
		t.Errorf("x = %v, want 4", s.Get("x"))
	}
}

// A script with a statement that does not resolve runs the statements
// before it, as Python would run up to a NameError, then fails there.
func TestScriptResolveErrorRunsEarlierStatements(t *testing.T) {
	s, out := newSession(t, "sim:1GiB")
	err := s.Exec("undef.star", "x = 1\nprint(x)\ny = undefined_name + 1\nprint(2)\n")
	if err == nil || !strings.Contains(err.Error(), "undef.star:3:5: undefined: undefined_name") {
		t.Fatalf("err = %v", err)
	}
	if out.String() != "1\n" {
		t.Errorf("output %q, want the first print only", out.String())
	}
	if s.Get("x") == nil || s.Get("y") != nil {
		t.Errorf("x = %v, y = %v", s.Get("x"), s.Get("y"))
	}
}

// A function reads its globals from the Session's live globals when it
// runs, as a Python function reads its module's dict: a name a later
// script or REPL input re-binds (the function itself included, for a
// recursion) is seen at once, and the old value is not kept.
func TestFunctionsReadLiveGlobals(t *testing.T) {
	s, _ := newSession(t, "sim:1GiB")
	if err := s.Exec("a.star", `x = 1
def f():
    return x
def g(n):
    return 0 if n == 0 else g(n - 1)
for k in range(2):
    def h():
        return k
`); err != nil {
		t.Fatal(err)
	}
	for _, step := range []struct{ src, name, want string }{
		{"x = 2\nr = f()", "r", "2"},
		{"r = g(3)", "r", "0"},
		{"def g(n):\n    return 'new'\nr = f and g(3)", "r", `"new"`},
		{"k = 'later'\nr = h()", "r", `"later"`},
	} {
		if err := s.ExecInteractive("<stdin>", step.src); err != nil {
			t.Fatalf("%q: %v", step.src, err)
		}
		if got := s.Get(step.name).String(); got != step.want {
			t.Errorf("%q: %s = %s, want %s", step.src, step.name, got, step.want)
		}
	}
	// The old value of a re-bound global is garbage at the assignment,
	// though a function of the statement that bound it lives on.
	if err := s.Exec("b.star", `x, fx = tensor.ones([256], device="cuda"), lambda: x
x = None
ok = cuda.memory_allocated() == 0
`); err != nil {
		t.Fatal(err)
	}
	if s.Get("ok") != starlark.True {
		t.Errorf("a function's module kept the old value of x")
	}
}

// A comprehension's variable does not outlive its top-level statement,
// though the script's statements run as one program (its toplevel's
// locals): the value it last held is garbage once nothing else holds it.
func TestComprehensionVariableReleased(t *testing.T) {
	s, _ := newSession(t, "sim:1GiB")
	if err := s.Exec("comp.star", `xs = [tensor.ones([256], device="cuda") for i in range(2)]
ys = [x for x in xs]
fs = [lambda: k for k in range(3)]
xs = None
ys = None
ok = cuda.memory_allocated() == 0
last = fs[0]()
`); err != nil {
		t.Fatal(err)
	}
	if s.Get("ok") != starlark.True {
		t.Errorf("the comprehension's variable kept a tensor alive")
	}
	if v, _ := starlark.AsInt32(s.Get("last")); v != 2 {
		t.Errorf("a closure over a comprehension variable read %v, want 2", s.Get("last"))
	}
}

// --max-steps counts per top-level statement though a script runs as one
// program: two loops of 50 iterations each run under a limit of 1,000
// steps (75 iterations do not, so the two together are over it), and a
// third statement that loops forever stops at its own limit.
func TestMaxStepsPerStatementOfAScript(t *testing.T) {
	s, err := scope.New(scope.Options{Device: "sim:1GiB", Out: io.Discard, Err: io.Discard, MaxSteps: 1000})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	err = s.Exec("steps.star", `a = 0
for i in range(50):
    a += i
b = 0
for i in range(50):
    b += i
c = 0
while True:
    c += 1
`)
	var ee *starlark.EvalError
	if !errors.As(err, &ee) || !strings.Contains(err.Error(), "too many steps") || !strings.Contains(ee.Backtrace(), "steps.star:9:") {
		t.Fatalf("err = %v, want the step limit in the while loop (line 9)", err)
	}
	if v, _ := starlark.AsInt32(s.Get("b")); v != 1225 {
		t.Errorf("b = %v, want 1225: the second loop ran in full", s.Get("b"))
	}
}
