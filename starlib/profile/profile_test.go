package profile_test

import (
	"bytes"
	"strings"
	"testing"

	"github.com/memsh/memsh/scope"
)

// A function defined in a REPL input (or -c code) is profiled with its
// source lines, which the Session kept for the pseudo-file <stdin-N>.
func TestSourceLinesOfPseudoFiles(t *testing.T) {
	var out bytes.Buffer
	s, err := scope.New(scope.Options{Device: "sim:1GiB", Out: &out, Err: &out})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.ExecInteractive("<stdin-1>", "def f(n):\n    x = tensor.zeros([n], device='cuda')\n\n    y = x + 1\n    return y.nbytes\n"); err != nil {
		t.Fatal(err)
	}
	if err := s.ExecInteractive("<stdin-2>", "n = profile(f, 1024)"); err != nil {
		t.Fatal(err)
	}
	got := out.String()
	for _, want := range []string{
		"## f  <stdin-1>:1  cuda:0",
		"def f(n):\n",
		"x = tensor.zeros([n], device='cuda')\n",
		"y = x + 1\n",
		"return y.nbytes\n",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("report lacks %q:\n%s", want, got)
		}
	}
	// -c code (<cmd>) likewise; a lambda is its own line.
	if err := s.Exec("<cmd>", "g = lambda n: tensor.ones([n], device='cuda').nbytes\nm = profile(g, 256)"); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "g = lambda n: tensor.ones([n], device='cuda').nbytes") {
		t.Errorf("lambda in <cmd>:\n%s", out.String())
	}
}
