package repl_test

import (
	"bytes"
	"os"
	"strings"
	"testing"

	"github.com/memsh/memsh/repl"
	"github.com/memsh/memsh/scope"
)

// The banner names memsh, the version, the current device and help; its
// golden transcript is testdata/repl/banner.golden.
func TestBanner(t *testing.T) {
	var out bytes.Buffer
	s, err := scope.New(scope.Options{Device: "sim:16GiB", Out: &out, Err: &out})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	got := repl.Banner(s, "v0.0.0-test")
	cpu, err := scope.New(scope.Options{Device: "cpu", Out: &out, Err: &out})
	if err != nil {
		t.Fatal(err)
	}
	defer cpu.Close()
	got += repl.Banner(cpu, "v0.0.0-test")
	const golden = "../testdata/repl/banner.golden"
	if *update {
		if err := os.WriteFile(golden, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (run go test ./repl -update)", err)
	}
	if got != string(want) {
		t.Errorf("banner:\n%s\nwant:\n%s", got, want)
	}
}

// A simulator preset is named as the real card, and the banner says it is
// simulated.
func TestBannerPreset(t *testing.T) {
	var out bytes.Buffer
	s, err := scope.New(scope.Options{Device: "sim:2xH100,meta", Out: &out, Err: &out})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	want := "device: cuda:0 = NVIDIA H100 80GB HBM3 (simulated, meta), 79.18 GiB (2 GPUs: :devices)"
	if got := repl.Banner(s, "v0.0.0-test"); !strings.Contains(got, want) {
		t.Errorf("banner:\n%s\nwant a line %q", got, want)
	}
}

// historyReader is a Plain reader that records saved history entries.
type historyReader struct {
	*repl.Plain
	saved []string
}

func (h *historyReader) SaveHistory(e string) error {
	h.saved = append(h.saved, e)
	return nil
}

// A multi-line input is one history entry.
func TestHistoryWholeInputs(t *testing.T) {
	var out bytes.Buffer
	s, err := scope.New(scope.Options{Device: "cpu", Out: &out, Err: &out})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	h := &historyReader{Plain: repl.NewPlain(strings.NewReader("x = 1\ndef f(n):\n    return n + 1\n\n:exp\nf(x)\n"), nil)}
	if err := repl.Loop(s, h, &out); err != nil {
		t.Fatal(err)
	}
	want := []string{"x = 1", "def f(n):\n    return n + 1", ":exp", "f(x)"}
	if strings.Join(h.saved, "|") != strings.Join(want, "|") {
		t.Errorf("history %q, want %q", h.saved, want)
	}
}

func TestComplete(t *testing.T) {
	var out bytes.Buffer
	s, err := scope.New(scope.Options{Device: "sim:1GiB", Out: &out, Err: &out})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Exec("<setup>", "e = experiment('c', quiet=True)\nd = e.data()"); err != nil {
		t.Fatal(err)
	}
	complete := func(before string) []string {
		got, _ := repl.Complete(s, before)
		var l []string
		for _, r := range got {
			l = append(l, string(r))
		}
		return l
	}
	for _, tc := range []struct {
		before string
		want   string // one of the completions
	}{
		{":he", "lp"},
		{"  :st", "ats"},
		{"cuda.memory_al", "located"},
		{"print(d.gpu.pe", "ak"},
		{"x = [d.host.us", "ed"},
		{"e.fin", "ish"},
		{"d.g", "pu"},
		{"expe", "riment"},
	} {
		got := complete(tc.before)
		found := false
		for _, g := range got {
			found = found || g == tc.want
		}
		if !found {
			t.Errorf("Complete(%q) = %q, want %q among them", tc.before, got, tc.want)
		}
	}
	for _, before := range []string{"nothing.at", "d.host.used.x", "1.2", "d.gpu.peak."} {
		if got := complete(before); len(got) != 0 {
			t.Errorf("Complete(%q) = %q, want none", before, got)
		}
	}
}

// The text of each REPL input is kept under its pseudo-file name, for the
// line profiler.
func TestInputSources(t *testing.T) {
	var out bytes.Buffer
	s, err := scope.New(scope.Options{Device: "cpu", Out: &out, Err: &out})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := repl.Loop(s, repl.NewPlain(strings.NewReader("x = 1\ndef f(n):\n    return n + 1\n\nf(x)\nf(None)\n"), nil), &out); err != nil {
		t.Fatal(err)
	}
	lines, ok := s.Source("<stdin-2>")
	if !ok || strings.Join(lines, "\n") != "def f(n):\n    return n + 1" {
		t.Errorf("Source(<stdin-2>) = %q, %v", lines, ok)
	}
	if !strings.Contains(out.String(), "<stdin-2>:2:14: in f") {
		t.Errorf("traceback does not name the input:\n%s", out.String())
	}
}
