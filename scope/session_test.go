package scope_test

import (
	"bytes"
	"errors"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"go.starlark.net/starlark"

	"github.com/memsh/memsh/backend"
	"github.com/memsh/memsh/backend/host"
	"github.com/memsh/memsh/scope"
)

func newSession(t *testing.T, device string) (*scope.Session, *bytes.Buffer) {
	t.Helper()
	var out bytes.Buffer
	s, err := scope.New(scope.Options{Device: device, Out: &out, Err: &out})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s, &out
}

// A script may call a function defined later in the file.
func TestForwardReference(t *testing.T) {
	s, out := newSession(t, "sim:1GiB")
	err := s.Exec("fwd.star", `
def main():
    return helper() + 1
def helper():
    return 41
print(main())
`)
	if err != nil {
		t.Fatal(err)
	}
	if got := out.String(); got != "42\n" {
		t.Errorf("output %q, want 42", got)
	}
}

// Calling a function that uses a global defined by a later statement,
// before that statement runs, is Starlark's usual error.
func TestForwardReferenceBeforeDefinition(t *testing.T) {
	s, _ := newSession(t, "sim:1GiB")
	err := s.Exec("early.star", `
def main():
    return later
main()
later = 1
`)
	if err == nil || !strings.Contains(err.Error(), "global variable later referenced before assignment") {
		t.Fatalf("err = %v", err)
	}
}

// Errors carry file:line and a Starlark backtrace.
func TestErrorBacktrace(t *testing.T) {
	s, _ := newSession(t, "sim:1GiB")
	err := s.Exec("bt.star", "def f():\n    return 1 // 0\n\nf()\n")
	var ee *starlark.EvalError
	if !errors.As(err, &ee) {
		t.Fatalf("err = %v (%T), want *starlark.EvalError", err, err)
	}
	bt := ee.Backtrace()
	for _, want := range []string{"bt.star:4:2: in <toplevel>", "bt.star:2:14: in f", "division by zero"} {
		if !strings.Contains(bt, want) {
			t.Errorf("backtrace lacks %q:\n%s", want, bt)
		}
	}
	// The session stays usable.
	if err := s.Exec("after.star", "x = 1"); err != nil {
		t.Fatal(err)
	}
}

// Syntax errors have positions.
func TestSyntaxError(t *testing.T) {
	s, _ := newSession(t, "sim:1GiB")
	err := s.Exec("syn.star", "x = (1,\n")
	if err == nil || !strings.Contains(err.Error(), "syn.star:") {
		t.Fatalf("err = %v", err)
	}
}

// ExecInteractive prints expression values and keeps no `_`.
func TestInteractiveEcho(t *testing.T) {
	s, out := newSession(t, "sim:1GiB")
	if err := s.ExecInteractive("<stdin>", "1 + 2"); err != nil {
		t.Fatal(err)
	}
	if err := s.ExecInteractive("<stdin>", "None"); err != nil {
		t.Fatal(err)
	}
	if got := out.String(); got != "3\n" {
		t.Errorf("output %q, want \"3\\n\"", got)
	}
	if len(s.Globals()) != 0 {
		t.Errorf("globals after echo: %v", s.Globals())
	}
}

// Interrupt stops a running statement; the session reclaims and stays usable.
func TestInterrupt(t *testing.T) {
	s, _ := newSession(t, "sim:1GiB")
	execInterrupted(t, s, 100*time.Millisecond, "x = tensor.zeros([1024], device=\"cuda\")\nwhile True:\n    y = x + 1\n")
	if err := s.Exec("after.star", "y = None\nassert_ok = cuda.memory_allocated() == 4096"); err != nil {
		t.Fatal(err)
	}
	if v := s.Get("assert_ok"); v != starlark.True {
		t.Errorf("memory after interrupt: assert_ok = %v", v)
	}
}

// execInterrupted runs src, which must run until Interrupt, which it
// calls after d, and checks that it failed as interrupted.
func execInterrupted(t *testing.T, s *scope.Session, d time.Duration, src string) {
	t.Helper()
	go func() {
		time.Sleep(d)
		s.Interrupt()
	}()
	if err := s.Exec("loop.star", src); err == nil || !strings.Contains(err.Error(), "interrupted") {
		t.Fatalf("err = %v", err)
	}
}

// After Ctrl-C the statement's temporaries are reclaimed by the next Exec
// (or Settle), not before the interrupted Exec returns: a session holding
// a large Go heap would otherwise hold up the interrupt with a collection.
// A statement that fails otherwise is reclaimed before Exec returns.
func TestInterruptDefersReclaim(t *testing.T) {
	s, err := scope.New(scope.Options{Device: "sim:1GiB", Peak: backend.PeakLazy, Out: io.Discard, Err: io.Discard})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	gpu := s.Manager().GPU(0)
	if err := s.Exec("fail.star", "def g():\n    t = tensor.zeros([1024], device=\"cuda\")\n    fail(\"no\")\ng()\n"); err == nil {
		t.Fatal("fail.star did not fail")
	}
	if got := gpu.Allocated(); got != 0 {
		t.Errorf("after a failed statement: %d bytes allocated, want 0", got)
	}
	interrupted := func() {
		t.Helper()
		execInterrupted(t, s, 50*time.Millisecond, "def f():\n    t = tensor.zeros([1024], device=\"cuda\")\n    while True:\n        pass\nf()\n")
		if got := gpu.Allocated(); got != 4096 {
			t.Errorf("just after the interrupt: %d bytes allocated, want f's 4096 (its reclaim is due)", got)
		}
	}
	interrupted()
	s.Settle()
	if got := gpu.Allocated(); got != 0 {
		t.Errorf("after Settle: %d bytes allocated, want 0", got)
	}
	interrupted()
	if err := s.Exec("next.star", "n = cuda.memory_stats()[\"allocated_bytes.all.current\"]"); err != nil {
		t.Fatal(err)
	}
	if v := s.Get("n"); v == nil || v.String() != "0" {
		t.Errorf("the next statement sees %v bytes allocated, want 0", v)
	}
}

// Two Sessions in one process do not see each other.
func TestSessionsIsolated(t *testing.T) {
	a, _ := newSession(t, "sim:1GiB")
	b, _ := newSession(t, "sim:1GiB")
	if err := a.Exec("a.star", "x = tensor.zeros([1024], device=\"cuda\")"); err != nil {
		t.Fatal(err)
	}
	if err := b.Exec("b.star", "ok = cuda.memory_allocated() == 0"); err != nil {
		t.Fatal(err)
	}
	if b.Get("x") != nil || b.Get("ok") != starlark.True {
		t.Errorf("session b sees a's state: x=%v ok=%v", b.Get("x"), b.Get("ok"))
	}
	if _, ok := starlark.Universe["experiment"]; ok {
		t.Errorf("starlark.Universe was mutated")
	}
}

// Go code can finish an experiment between statements; names go at once.
func TestFinishFromGo(t *testing.T) {
	s, _ := newSession(t, "sim:1GiB")
	if err := s.Exec("go.star", "e = experiment(quiet=True)\nx = tensor.zeros([1024], device=\"cuda\")"); err != nil {
		t.Fatal(err)
	}
	e := s.Experiments()[0]
	d, err := e.Finish()
	if err != nil {
		t.Fatal(err)
	}
	if d.GPU.Consumed != 4096 || d.GPU.Reclaimed != 4096 {
		t.Errorf("consumed %d reclaimed %d, want 4096 4096", d.GPU.Consumed, d.GPU.Reclaimed)
	}
	if s.Get("x") != nil {
		t.Errorf("x survived the experiment")
	}
	if len(s.Experiments()) != 0 {
		t.Errorf("experiment still open")
	}
}

func TestMaxSteps(t *testing.T) {
	var out bytes.Buffer
	s, err := scope.New(scope.Options{Device: "sim:1GiB", Out: &out, Err: &out, MaxSteps: 1000})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	err = s.Exec("steps.star", "n = 0\nwhile True:\n    n += 1\n")
	if err == nil || !strings.Contains(err.Error(), "too many steps") {
		t.Fatalf("err = %v", err)
	}
	if err := s.Exec("after.star", "m = 1"); err != nil {
		t.Fatalf("after a step limit: %v", err)
	}
}

func TestOpenDevices(t *testing.T) {
	// auto: real GPUs when the driver is usable, otherwise one simulated
	// GPU and a notice saying so.
	for _, spec := range []string{"auto", ""} {
		gpus, notice, err := scope.OpenDevices(spec)
		if err != nil {
			t.Fatalf("%q: %v", spec, err)
		}
		simulated := len(gpus) > 0 && gpus[0].Kind() == "sim"
		if simulated != (notice != "") || (simulated && len(gpus) != 1) {
			t.Errorf("%q: %d gpus (first kind %v), notice %q", spec, len(gpus), simulated, notice)
		}
	}
	for _, tc := range []struct {
		spec    string
		n       int
		notice  bool
		wantErr string
	}{
		{"cpu", 0, false, ""},
		{"sim", 1, false, ""},
		{"sim:2x80GiB,meta", 2, false, ""},
		{"sim:16GiB,ctx=300MiB", 1, false, ""},
		{"sim:80GiB,meta", 1, false, ""},
		{"sim:lots", 0, false, "unknown GPU preset \"lots\" (known: A100-40GB"},
		{"sim:1GiB,ctx=2GiB", 0, false, "does not fit"},
		{"sim:1GiB,fast", 0, false, "unknown option"},
		{"tpu", 0, false, "unknown device"},
	} {
		gpus, notice, err := scope.OpenDevices(tc.spec)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("%q: err = %v, want %q", tc.spec, err, tc.wantErr)
			}
			continue
		}
		if err != nil || len(gpus) != tc.n || (notice != "") != tc.notice {
			t.Errorf("%q: %d gpus, notice %q, err %v", tc.spec, len(gpus), notice, err)
		}
	}
}

func TestLoad(t *testing.T) {
	dir := t.TempDir()
	write := func(name, src string) string {
		p := dir + "/" + name
		if err := os.WriteFile(p, []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	lib := write("lib.star", "print('loading lib')\ndef two():\n    return 2\nbuf = cuda.malloc(KiB)\n")
	self := write("self.star", "load('self.star', 'x')\nx = 1\n")
	loop := write("loop.star", "n = 0\nwhile True:\n    n += 1\n")

	var out bytes.Buffer
	s, err := scope.New(scope.Options{Device: "sim:1GiB", Out: &out, Err: &out, MaxSteps: 10000, LoadPath: []string{dir}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Exec("a.star", "load('"+lib+"', 'two', 'buf')\nload('"+lib+"', t2='two')\nok = two() + t2() == 4 and buf.nbytes == 1024"); err != nil {
		t.Fatal(err)
	}
	if s.Get("ok") != starlark.True || strings.Count(out.String(), "loading lib") != 1 {
		t.Errorf("ok = %v, output %q (want the module loaded once)", s.Get("ok"), out.String())
	}
	if err := s.Exec("b.star", "load('"+self+"', 'x')"); err == nil || !strings.Contains(err.Error(), "cycle in load graph") {
		t.Errorf("self-load: %v", err)
	}
	if err := s.Exec("c.star", "load('"+loop+"', 'n')"); err == nil || !strings.Contains(err.Error(), "too many steps") {
		t.Errorf("looping load with --max-steps: %v", err)
	}
	if err := s.Exec("d.star", "after = 1"); err != nil {
		t.Errorf("session unusable after failed loads: %v", err)
	}
}

// The logger's seed (log.start(seed=N)) reseeds the tensor generator
// before every input, as tensor.manual_seed(N) would.
func TestLogSeedReseedsTensors(t *testing.T) {
	var out bytes.Buffer
	s, err := scope.New(scope.Options{Device: "sim:1GiB", Out: &out, Err: &out})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for _, src := range []string{
		"log.start(compact=True, seed=3)",
		"a = tensor.rand([4]).tolist()",
		"b = tensor.rand([4]).tolist()",
		"log.stop()",
		"tensor.manual_seed(3)\nc = tensor.rand([4]).tolist()",
		"print(a == b, a == c)",
	} {
		if err := s.Exec("<stdin>", src); err != nil {
			t.Fatalf("%s: %v", src, err)
		}
	}
	if !strings.HasSuffix(out.String(), "True True\n") {
		t.Errorf("output:\n%s", out.String())
	}
}

// Set with nil deletes a user global; a later statement may bind it again
// (it used to leave a nil entry that broke the next re-binding).
func TestSetNilDeletes(t *testing.T) {
	s, _ := newSession(t, "sim:1GiB")
	if err := s.Exec("a.star", "def f(x):\n    return x\ny = f(1)\n"); err != nil {
		t.Fatal(err)
	}
	s.Set("f", nil)
	s.Set("y", nil)
	if s.Get("f") != nil || s.Get("y") != nil {
		t.Fatal("Set(name, nil) did not delete")
	}
	if _, ok := s.Globals()["f"]; ok {
		t.Fatal("f still in Globals()")
	}
	if err := s.Exec("b.star", "def f(x):\n    return 2 * x\ny = f(2)\n"); err != nil {
		t.Fatal(err)
	}
	if got := s.Get("y"); got == nil || got.(starlark.Int).String() != "4" {
		t.Fatalf("y = %v", got)
	}
}

// TestCloseReturnsRetainedHostMemory: a cpu tensor of 4 MiB dropped in a
// session is retained for reuse once reclaimed (backend/host, as glibc
// retains it under PyTorch), the next one of its size takes it, and Close
// returns what is retained to the operating system.
func TestCloseReturnsRetainedHostMemory(t *testing.T) {
	host.Trim()
	s, err := scope.New(scope.Options{Device: "cpu", Out: io.Discard, Err: io.Discard})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	exec := func(src string) {
		t.Helper()
		if err := s.Exec("retain.star", src); err != nil {
			t.Fatal(err)
		}
	}
	exec("x = tensor.zeros([1 << 20])\nx = None\n")
	s.Manager().Reclaim()
	if got := host.Retained(); got != 4<<20 {
		t.Fatalf("after dropping a 4 MiB tensor host.Retained() = %d, want %d", got, 4<<20)
	}
	exec("y = tensor.ones([1 << 20])\n")
	if got := host.Retained(); got != 0 {
		t.Fatalf("after a tensor of the same size host.Retained() = %d, want 0", got)
	}
	exec("y = None\n")
	s.Manager().Reclaim()
	if got := host.Retained(); got != 4<<20 {
		t.Fatalf("after dropping it host.Retained() = %d, want %d", got, 4<<20)
	}
	s.Close()
	if got := host.Retained(); got != 0 {
		t.Errorf("after Close host.Retained() = %d, want 0", got)
	}
}
