package repl_test

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/memsh/memsh/repl"
	"github.com/memsh/memsh/scope"
)

var update = flag.Bool("update", false, "rewrite the golden transcripts")

// Noisy parts of a transcript: elapsed times and host RSS figures.
var (
	elapsed = regexp.MustCompile(`\d\d:\d\d:\d\d\.\d\d\d|running for [0-9.]+m?s`)
	hostRow = regexp.MustCompile(`(?m)^(host ) .*$`)
	hostFig = regexp.MustCompile(`host consumed -?[0-9.]+ [KMG]?i?B`)
)

func normalize(s string) string {
	s = elapsed.ReplaceAllString(s, "<time>")
	s = hostRow.ReplaceAllString(s, "$1 <host figures>")
	s = hostFig.ReplaceAllString(s, "host consumed <rss>")
	return s
}

// TestTranscripts feeds testdata/repl/*.in to the REPL loop, line by line
// as a user would type them, and compares the transcript (prompts, echoed
// input, output, errors) with the .golden file. Run with -update to
// rewrite the golden files after an intended change.
func TestTranscripts(t *testing.T) {
	ins, _ := filepath.Glob("../testdata/repl/*.in")
	if len(ins) == 0 {
		t.Fatal("no transcripts")
	}
	for _, in := range ins {
		t.Run(filepath.Base(in), func(t *testing.T) {
			src, err := os.ReadFile(in)
			if err != nil {
				t.Fatal(err)
			}
			var out bytes.Buffer
			s, err := scope.New(scope.Options{Device: "sim:16GiB", Out: &out, Err: &out})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			if err := repl.Loop(s, repl.NewPlain(bytes.NewReader(src), &out), &out); err != nil {
				t.Fatal(err)
			}
			got := normalize(out.String())
			golden := strings.TrimSuffix(in, ".in") + ".golden"
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
				t.Errorf("transcript differs from %s:\n--- got\n%s\n--- want\n%s", golden, got, want)
			}
		})
	}
}

// :quit ends the loop before the end of input.
func TestQuit(t *testing.T) {
	var out bytes.Buffer
	s, err := scope.New(scope.Options{Device: "sim:1GiB", Out: &out, Err: &out})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	in := "x = 1\n:quit\nx = 2\n"
	if err := repl.Loop(s, repl.NewPlain(strings.NewReader(in), nil), &out); err != nil {
		t.Fatal(err)
	}
	if v := s.Get("x"); v == nil || v.String() != "1" {
		t.Errorf("x = %v, want 1 (input after :quit must not run)", v)
	}
}

// With the logger on, a REPL input of several statements gets one line, as
// ipygpulogger prints one per cell.
func TestLogOneLinePerInput(t *testing.T) {
	var out bytes.Buffer
	s, err := scope.New(scope.Options{Device: "sim:1GiB", Out: &out, Err: &out})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	in := ":log compact\nx = 1; y = 2; z = 3\nw = 4\n"
	if err := repl.Loop(s, repl.NewPlain(strings.NewReader(in), nil), &out); err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(out.String(), "(Consumed/Peaked/Used Total)"); n != 2 {
		t.Errorf("%d log lines for two inputs:\n%s", n, out.String())
	}
}
