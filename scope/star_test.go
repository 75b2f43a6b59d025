package scope_test

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"go.starlark.net/resolve"
	"go.starlark.net/starlark"
	"go.starlark.net/starlarktest"
	"go.starlark.net/syntax"

	"github.com/memsh/memsh/backend"
	"github.com/memsh/memsh/scope"
	"github.com/memsh/memsh/scripts"
)

// TestStarlarkFiles runs ../testdata/*.star in the style of go.starlark.net's
// own starlark/testdata: files are split into chunks at lines "---"; each
// chunk runs in a fresh Session, statement by statement; a line ending in
// `### "regexp"` expects the statement on it to fail with an error matching
// regexp (and the chunk goes on, since a Session stays usable after an
// error); any other error fails the test. A chunk may start with option
// lines `# device: sim:SPEC` and `# peak: lazy`; load("models/...") finds
// memsh's embedded model library. Starlark code sees the
// assert module and output(), which returns and clears what the Session has
// printed so far.
func TestStarlarkFiles(t *testing.T) {
	files, err := filepath.Glob("../testdata/*.star")
	if err != nil || len(files) == 0 {
		t.Fatalf("no test files: %v", err)
	}
	for _, file := range files {
		t.Run(filepath.Base(file), func(t *testing.T) {
			data, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			for _, c := range splitChunks(string(data)) {
				runChunk(t, file, c)
			}
		})
	}
}

type chunk struct {
	src       string // the chunk, padded with newlines so line numbers match the file
	firstLine int
}

func splitChunks(src string) []chunk {
	var chunks []chunk
	lines := strings.SplitAfter(src, "\n")
	start := 0
	flush := func(end int) {
		body := strings.Join(lines[start:end], "")
		chunks = append(chunks, chunk{src: strings.Repeat("\n", start) + body, firstLine: start + 1})
	}
	for i, l := range lines {
		if strings.TrimRight(l, "\r\n") == "---" {
			flush(i)
			start = i + 1
		}
	}
	flush(len(lines))
	return chunks
}

var (
	wantErrRE = regexp.MustCompile(`### "(.*)"\s*$`)
	optionRE  = regexp.MustCompile(`(?m)^# (device|peak): (\S+)\s*$`)
)

func runChunk(t *testing.T, file string, c chunk) {
	t.Helper()
	opts := scope.Options{Device: "sim:16GiB", Library: scripts.Library}
	for _, m := range optionRE.FindAllStringSubmatch(c.src, -1) {
		switch m[1] {
		case "device":
			opts.Device = m[2]
		case "peak":
			mode, err := backend.ParsePeakMode(m[2])
			if err != nil {
				t.Fatal(err)
			}
			opts.Peak = mode
		}
	}
	var out bytes.Buffer
	opts.Out, opts.Err = &out, &out
	assertMod, err := starlarktest.LoadAssertModule()
	if err != nil {
		t.Fatal(err)
	}
	opts.Builtins = starlark.StringDict{
		"assert": assertMod["assert"],
		"output": starlark.NewBuiltin("output", func(*starlark.Thread, *starlark.Builtin, starlark.Tuple, []starlark.Tuple) (starlark.Value, error) {
			s := out.String()
			out.Reset()
			return starlark.String(s), nil
		}),
	}
	s, err := scope.New(opts)
	if err != nil {
		t.Fatalf("%s:%d: %v", file, c.firstLine, err)
	}
	defer s.Close()
	starlarktest.SetReporter(s.Thread(), t)

	// Expected errors by line.
	want := map[int]*regexp.Regexp{}
	for i, l := range strings.Split(c.src, "\n") {
		if m := wantErrRE.FindStringSubmatch(l); m != nil {
			want[i+1] = regexp.MustCompile(m[1])
		}
	}
	f, err := (&syntax.FileOptions{Set: true, While: true, TopLevelControl: true, GlobalReassign: true, LoadBindsGlobally: true, Recursion: true}).Parse(file, c.src, 0)
	if err != nil {
		checkErr(t, file, err, want)
		return
	}
	srcLines := strings.SplitAfter(c.src, "\n")
	for _, stmt := range f.Stmts {
		start, end := stmt.Span()
		text := strings.Repeat("\n", int(start.Line)-1) + strings.Join(srcLines[start.Line-1:end.Line], "")
		if err := s.Exec(file, text); err != nil {
			checkErr(t, file, err, want)
		}
	}
	for line, re := range want {
		t.Errorf("%s:%d: expected error matching %q did not happen", file, line, re)
	}
}

// checkErr matches err against the expectation of a line it points at and
// removes it; an unexpected error fails the test.
func checkErr(t *testing.T, file string, err error, want map[int]*regexp.Regexp) {
	t.Helper()
	var lines []int
	var ee *starlark.EvalError
	var se syntax.Error
	var rl resolve.ErrorList
	switch {
	case errors.As(err, &ee):
		for _, fr := range ee.CallStack {
			if fr.Pos.Filename() == file {
				lines = append(lines, int(fr.Pos.Line))
			}
		}
	case errors.As(err, &se):
		lines = append(lines, int(se.Pos.Line))
	case errors.As(err, &rl):
		lines = append(lines, int(rl[0].Pos.Line))
	}
	for _, l := range lines {
		if re, ok := want[l]; ok {
			if !re.MatchString(err.Error()) {
				t.Errorf("%s:%d: error %q does not match %q", file, l, err, re)
			}
			delete(want, l)
			return
		}
	}
	msg := err.Error()
	if ee != nil {
		msg = ee.Backtrace()
	}
	t.Errorf("%s: unexpected error at lines %v: %s", file, lines, msg)
}
