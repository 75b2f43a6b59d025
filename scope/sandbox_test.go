package scope_test

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.starlark.net/starlark"
	"go.starlark.net/syntax"

	"github.com/memsh/memsh/env"
	"github.com/memsh/memsh/scope"
)

// load() resolves only inside the main script's directory and the extra
// load roots, and never quotes a file that is not Starlark.
func TestLoadSandbox(t *testing.T) {
	base := t.TempDir()
	proj := filepath.Join(base, "proj")
	extra := filepath.Join(base, "extra")
	outside := filepath.Join(base, "outside")
	for _, d := range []string{proj, filepath.Join(proj, "sub"), extra, outside} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	write := func(p, src string) string {
		if err := os.WriteFile(p, []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	write(filepath.Join(proj, "lib.star"), "load('sub/inner.star', 'inner')\nlib = inner + 1\n")
	write(filepath.Join(proj, "sub", "inner.star"), "load('sibling.star', 's')\ninner = s\n") // relative to sub/
	write(filepath.Join(proj, "sub", "sibling.star"), "s = 41\n")
	write(filepath.Join(extra, "util.star"), "util = 'extra'\n")
	secretFile := write(filepath.Join(outside, "x.star"), "x = 'outside'\n")
	const secret = "hunter2-s3cr3t"
	write(filepath.Join(proj, ".env"), "API_KEY="+secret+"\nDB_PASSWORD = \""+secret+"\" !!\n")
	write(filepath.Join(proj, "keys.txt"), "token "+secret+"\n")
	if err := os.Symlink(secretFile, filepath.Join(proj, "link.star")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(proj, "linkdir")); err != nil {
		t.Fatal(err)
	}
	main := write(filepath.Join(proj, "main.star"), "load('lib.star', 'lib')\nload('util.star', 'util')\nok = lib == 42 and util == 'extra'\n")

	var out bytes.Buffer
	s, err := scope.New(scope.Options{Device: "cpu", Out: &out, Err: &out, LoadPath: []string{extra}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Exec(main, nil); err != nil {
		t.Fatal(err)
	}
	if s.Get("ok") != starlark.True {
		t.Fatalf("ok = %v", s.Get("ok"))
	}
	for _, tc := range []struct{ load, want string }{
		{"../outside/x.star", "'..' is not allowed"},
		{"sub/../lib.star", "'..' is not allowed"},
		{secretFile, "absolute path outside the load roots"},
		{"/etc/passwd", "absolute path outside the load roots"},
		{"link.star", "symlink leads outside the load roots"},
		{"linkdir/x.star", "symlink leads outside the load roots"},
		{".env", "cannot load .env: not a valid Starlark module (syntax error at line 2)"},
		{"keys.txt", "cannot load keys.txt: not a valid Starlark module (syntax error at line 1)"},
		{"missing.star", "no such file in the load roots"},
	} {
		err := s.Exec(filepath.Join(proj, "t.star"), "load('"+tc.load+"', 'x')")
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("load(%q): %v, want %q", tc.load, err, tc.want)
			continue
		}
		if strings.Contains(err.Error(), secret) || strings.Contains(err.Error(), "outside'") {
			t.Errorf("load(%q) error quotes the file: %v", tc.load, err)
		}
	}
	// An absolute path inside a root is fine.
	if err := s.Exec(filepath.Join(proj, "t.star"), "load('"+filepath.Join(extra, "util.star")+"', u2='util')"); err != nil {
		t.Errorf("absolute path inside a root: %v", err)
	}
	if roots := s.LoadRoots(); len(roots) != 2 {
		t.Errorf("LoadRoots = %v", roots)
	}
}

// inPlace is a fake env.InPlaceOperand: += and -= update n in place.
type inPlace struct {
	n     int
	calls *int
}

func (p *inPlace) String() string        { return "inplace" }
func (p *inPlace) Type() string          { return "inplace" }
func (p *inPlace) Freeze()               {}
func (p *inPlace) Truth() starlark.Bool  { return true }
func (p *inPlace) Hash() (uint32, error) { return 0, errors.New("unhashable") }
func (p *inPlace) Attr(name string) (starlark.Value, error) {
	if name == "n" {
		return starlark.MakeInt(p.n), nil
	}
	return nil, nil
}
func (p *inPlace) AttrNames() []string { return []string{"n"} }
func (p *inPlace) Binary(op syntax.Token, y starlark.Value, side starlark.Side) (starlark.Value, error) {
	k, _ := starlark.AsInt32(y)
	switch op {
	case syntax.PLUS:
		return &inPlace{n: p.n + k, calls: p.calls}, nil
	case syntax.STAR:
		return &inPlace{n: p.n * k, calls: p.calls}, nil
	}
	return nil, nil
}
func (p *inPlace) InPlaceBinary(op syntax.Token, y starlark.Value) (starlark.Value, error) {
	k, err := starlark.AsInt32(y)
	if err != nil {
		return nil, err
	}
	switch op {
	case syntax.PLUS:
		p.n += k
	case syntax.MINUS:
		p.n -= k
	case syntax.SLASH:
		return nil, errors.New("in-place division of an integer operand")
	default:
		return nil, nil // declined: the binary operator applies
	}
	*p.calls++
	return p, nil
}

var _ env.InPlaceOperand = (*inPlace)(nil)

// holder has a settable attribute w, for `m.w += t`.
type holder struct{ w starlark.Value }

func (h *holder) String() string        { return "holder" }
func (h *holder) Type() string          { return "holder" }
func (h *holder) Freeze()               {}
func (h *holder) Truth() starlark.Bool  { return true }
func (h *holder) Hash() (uint32, error) { return 0, errors.New("unhashable") }
func (h *holder) Attr(name string) (starlark.Value, error) {
	if name == "w" {
		return h.w, nil
	}
	return nil, nil
}
func (h *holder) AttrNames() []string { return []string{"w"} }
func (h *holder) SetField(name string, v starlark.Value) error {
	h.w = v
	return nil
}

// Augmented assignment on an env.InPlaceOperand updates it in place (the
// target stays bound to the same value) for globals, locals, elements and
// attributes; other values keep Starlark's meaning.
func TestAugmentedInPlace(t *testing.T) {
	calls := 0
	mk := starlark.NewBuiltin("mk", func(_ *starlark.Thread, _ *starlark.Builtin, args starlark.Tuple, _ []starlark.Tuple) (starlark.Value, error) {
		return &inPlace{calls: &calls}, nil
	})
	hold := starlark.NewBuiltin("holder", func(_ *starlark.Thread, _ *starlark.Builtin, args starlark.Tuple, _ []starlark.Tuple) (starlark.Value, error) {
		return &holder{w: args[0]}, nil
	})
	var out bytes.Buffer
	s, err := scope.New(scope.Options{Device: "cpu", Out: &out, Err: &out, Builtins: starlark.StringDict{"mk": mk, "holder": hold}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	src := `
a = mk()
b = a
a += 5
a -= 2
same_global = a == b and b.n == 3

def f():
    x = mk()
    y = x
    for i in range(4):
        x += 1
    return x == y and y.n == 4
same_local = f()

l = [mk(), mk()]
e0 = l[0]
l[0] += 7
d = {"k": mk()}
dk = d["k"]
d["k"] += 1
m = holder(mk())
mw = m.w
m.w += 9
same_elem = l[0] == e0 and e0.n == 7 and d["k"] == dk and dk.n == 1 and m.w == mw and mw.n == 9

c = mk()
c0 = c
c *= 3              # declined: the binary operator's new value
declined = c != c0

n = 1
n += 2
xs = [1]
ys = xs
xs += [2]           # lists extend in place, as in Starlark
st = "a"
st += "b"
plain = n == 3 and ys == [1, 2] and xs == ys and st == "ab"

def g():
    z = mk()
    z /= 2
`
	if err := s.Exec("aug.star", src); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"same_global", "same_local", "same_elem", "declined", "plain"} {
		if s.Get(name) != starlark.True {
			t.Errorf("%s = %v", name, s.Get(name))
		}
	}
	if calls != 2+4+3 {
		t.Errorf("%d in-place calls, want 9", calls)
	}
	err = s.Exec("aug2.star", "g()")
	if err == nil || !strings.Contains(err.Error(), "in-place division of an integer operand") {
		t.Errorf("error from InPlaceBinary: %v", err)
	}
	err = s.Exec("aug3.star", "q = 1\nq += 'x'")
	if err == nil || !strings.Contains(err.Error(), "unknown binary op: int + string") {
		t.Errorf("int += string: %v", err)
	}
	err = s.Exec("aug4.star", "fz = tuple([1])\nfz += (2,)\n")
	if err != nil || s.Get("fz").String() != "(1, 2)" {
		t.Errorf("tuple +=: %v %v", err, s.Get("fz"))
	}
}

// Python constructs Starlark lacks fail with a hint naming the memsh way.
func TestPythonHints(t *testing.T) {
	var out bytes.Buffer
	s, err := scope.New(scope.Options{Device: "cpu", Out: &out, Err: &out})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for _, tc := range []struct{ src, want string }{
		{"x = 1\ndel x", "t.star:2:1: Starlark has no 'del' statement; rebind x = None, or create it inside an experiment() block"},
		{"with open('f') as g:\n    pass", "no 'with' statement; use e = experiment(...) ... e.finish()"},
		{"try:\n    x = 1\nexcept E:\n    pass", "no 'try'/'except'; run the code as trial(fn, ...)"},
		{"class A:\n    pass", "no classes; use a dict"},
		{"import torch", "memsh modules are predeclared, no import needed: "},
		{"from torch import nn", "memsh modules are predeclared"},
		{"def f():\n    global x\n    x = 1", "no 'global' statement"},
		{"def f():\n    nonlocal x", "no 'nonlocal' statement"},
		{"y = 3 ** 2", "no '**' power operator; use x.pow(2) for a tensor"},
		{"y = a @ b", "use tensor.matmul(a, b) or a.matmul(b)"},
		{"a @= b", "use tensor.matmul(a, b) or a.matmul(b)"},
		{"@profiled\ndef f():\n    pass", "no decorators"},
		{"y = None is None", "no 'is' operator; use =="},
		{"raise ValueError('x')", "use fail(\"message\")"},
		{"def f():\n    yield 1", "no generators"},
		{"async def f():\n    pass", "no 'async'/'await'"},
		{"f = lambda x: (y = x)", "a Starlark lambda is one expression; use def"},
	} {
		err := s.Exec("t.star", tc.src)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v\nwant %q", tc.src, err, tc.want)
		}
	}
	// The hint names the original parser message too, and leaves other
	// syntax errors alone.
	if err := s.Exec("t.star", "del x"); err == nil || !strings.Contains(err.Error(), "(got del, want primary expression)") {
		t.Errorf("del: %v", err)
	}
	if err := s.Exec("t.star", "x = (1"); err == nil || strings.Contains(err.Error(), "Starlark has no") {
		t.Errorf("plain syntax error: %v", err)
	}
	if err := s.Exec("t.star", "def g(**kw):\n    return kw\ndef f(*args, **kwargs):\n    return g(**kwargs)"); err != nil {
		t.Errorf("**kwargs: %v", err)
	}
}

// A script that stops on an error with an experiment open finishes it with
// the error's status; an experiment whose block hit an OOM finishes "oom".
func TestFinishOpenStatus(t *testing.T) {
	var out bytes.Buffer
	s, err := scope.New(scope.Options{Device: "sim:1GiB", Out: &out, Err: &out})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var events []env.FinishEvent
	s.OnFinish(func(e env.FinishEvent) { events = append(events, e) })

	err = s.Exec("oom.star", "e = experiment('big')\nk = tensor.ones([4], device='cuda')\nt = tensor.zeros([1 << 30], device='cuda')\n")
	if err == nil {
		t.Fatal("no OOM")
	}
	s.FinishOpen(err)
	err = s.Exec("err.star", "o = experiment('outer', quiet=True)\ni = experiment('inner', quiet=True)\nx = 1 // 0\n")
	if err == nil {
		t.Fatal("no error")
	}
	s.FinishOpen(err)
	// In a REPL the session goes on after an OOM; the block's finish says so.
	_ = s.Exec("<stdin-1>", "r = experiment('repl', quiet=True)\nbig = tensor.zeros([1 << 30], device='cuda')")
	if err := s.Exec("<stdin-2>", "r.finish()"); err != nil {
		t.Fatal(err)
	}
	if len(s.Experiments()) != 0 {
		t.Errorf("open: %v", s.Experiments())
	}
	want := []struct{ name, status, err string }{
		{"big", "oom", "CUDA out of memory"},
		{"inner", "error", "floored division by zero"},
		{"outer", "error", "floored division by zero"},
		{"repl", "oom", "CUDA out of memory"},
	}
	if len(events) != len(want) {
		t.Fatalf("%d events: %+v", len(events), events)
	}
	for i, w := range want {
		e := events[i]
		if e.Name != w.name || e.Status != w.status || !strings.Contains(e.Error, w.err) {
			t.Errorf("event %d: %s %s %q, want %+v", i, e.Name, e.Status, e.Error, w)
		}
	}
	if !strings.Contains(out.String(), "(status oom: CUDA out of memory") || s.Get("k") != nil {
		t.Errorf("report / deletion after FinishOpen:\n%s", out.String())
	}
}

// Any failed top-level statement marks the open experiments at the source:
// a later finish (a REPL going on, Close) sends the failure's status and
// message in its FinishEvent, never "ok"; the first failure is kept.
func TestCutExperimentStatusAtSource(t *testing.T) {
	var out bytes.Buffer
	s, err := scope.New(scope.Options{Device: "sim:1GiB", Out: &out, Err: &out})
	if err != nil {
		t.Fatal(err)
	}
	var events []env.FinishEvent
	s.OnFinish(func(e env.FinishEvent) { events = append(events, e) })
	run := func(name, src string) error { return s.Exec(name, src) }
	_ = run("<stdin-1>", "a = experiment('err', quiet=True)")
	if err := run("<stdin-2>", "x = 1 // 0"); err == nil {
		t.Fatal("no error")
	}
	if err := run("<stdin-3>", "y = tensor.zeros([1 << 30], device='cuda')"); err == nil {
		t.Fatal("no OOM")
	}
	_ = run("<stdin-4>", "a.finish()")
	_ = run("<stdin-5>", "b = experiment('undefined', quiet=True)")
	if err := run("<stdin-6>", "z = no_such_name"); err == nil {
		t.Fatal("no error for an undefined name")
	}
	_ = run("<stdin-7>", "b.finish()")
	_ = run("<stdin-8>", "c = experiment('fine', quiet=True)")
	_ = run("<stdin-9>", "c.finish()")
	_ = run("<stdin-10>", "d = experiment('closed', quiet=True)")
	_ = run("<stdin-11>", "fail(\"stop\")")
	s.Close() // finishes d while the hook still listens
	want := []struct{ name, status, err string }{
		{"err", "error", "floored division by zero"},
		{"undefined", "error", "undefined: no_such_name"},
		{"fine", "ok", ""},
		{"closed", "error", "stop"},
	}
	if len(events) != len(want) {
		t.Fatalf("%d events: %+v", len(events), events)
	}
	for i, w := range want {
		e := events[i]
		if e.Name != w.name || e.Status != w.status || !strings.Contains(e.Error, w.err) || (w.err == "") != (e.Error == "") {
			t.Errorf("event %d: %s %s %q, want %+v", i, e.Name, e.Status, e.Error, w)
		}
	}
}
