package main

import (
	"bytes"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"

	"go.starlark.net/starlark"

	"github.com/memsh/memsh/backend"
	"github.com/memsh/memsh/repl"
	"github.com/memsh/memsh/scope"
	"github.com/memsh/memsh/starlib"
)

// maxPeakComment is a "# max-peak: 512MiB" line: the limit of the test
// defined right below it, or of every test of the file when it stands
// elsewhere.
var maxPeakComment = regexp.MustCompile(`^\s*#\s*max-peak:\s*(\S+)\s*$`)

// runTests is memsh test [--max-peak SIZE] [DIR|FILE...]: every top-level
// function named test_* of the test files, each in a fresh Session (the
// file run first, then the call as one statement), with the peak allocated
// bytes of its GPUs over the call. A test fails when it raises an error or
// when its peak exceeds its limit: the "# max-peak:" comment above its def,
// else the file's, else --max-peak. One line per test, then
// "N passed, M failed"; exit status 1 when a test failed (or none was
// found), 0 otherwise. A failed test's output and traceback follow its line.
func runTests(args []string, opts scope.Options, maxPeak uint64, stdout, stderr io.Writer) int {
	tfs := flag.NewFlagSet("memsh test", flag.ContinueOnError)
	tfs.SetOutput(stderr)
	mp := &sizeFlag{n: maxPeak}
	tfs.Var(mp, "max-peak", "the default per-test limit on peak allocated bytes (e.g. 512MiB)")
	if err := tfs.Parse(args); err != nil {
		return 2
	}
	paths := tfs.Args()
	if len(paths) == 0 {
		paths = []string{"."}
	}
	files, err := testFiles(paths)
	if err != nil {
		fmt.Fprintln(stderr, "memsh test:", err)
		return 2
	}
	passed, failed := 0, 0
	for _, file := range files {
		if len(files) > 1 {
			fmt.Fprintf(stdout, "# %s\n", file)
		}
		p, f := runTestFile(file, opts, mp.n, stdout)
		passed, failed = passed+p, failed+f
	}
	fmt.Fprintf(stdout, "%d passed, %d failed\n", passed, failed)
	if failed > 0 || passed == 0 {
		return 1
	}
	return 0
}

// testFiles expands directories to their test_*.star files (recursively),
// or to all their *.star files when they have no test_*.star file.
func testFiles(paths []string) ([]string, error) {
	var out []string
	for _, p := range paths {
		st, err := os.Stat(p)
		if err != nil {
			return nil, err
		}
		if !st.IsDir() {
			out = append(out, p)
			continue
		}
		var tests, all []string
		err = filepath.WalkDir(p, func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".star") {
				return err
			}
			all = append(all, path)
			if strings.HasPrefix(d.Name(), "test_") {
				tests = append(tests, path)
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
		if len(tests) == 0 {
			tests = all
		}
		out = append(out, tests...)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no .star files in %s", strings.Join(paths, " "))
	}
	return out, nil
}

// limits reads the file's "# max-peak:" comments: per test function, and
// for the whole file (0: none).
func limits(src []byte) (perTest map[string]uint64, file uint64, err error) {
	perTest = map[string]uint64{}
	var pending uint64
	for i, line := range strings.Split(string(src), "\n") {
		if m := maxPeakComment.FindStringSubmatch(line); m != nil {
			n, err := parseSize(m[1])
			if err != nil {
				return nil, 0, fmt.Errorf("line %d: max-peak: %v", i+1, err)
			}
			if pending != 0 {
				file = pending // two in a row: the first was the file's
			}
			pending = n
			continue
		}
		t := strings.TrimSpace(line)
		if pending != 0 {
			if name, ok := strings.CutPrefix(t, "def "); ok && strings.HasPrefix(name, "test_") {
				perTest[name[:strings.IndexAny(name+"(", "( ")]] = pending
			} else {
				file = pending
			}
			pending = 0
		}
	}
	if pending != 0 {
		file = pending
	}
	return perTest, file, nil
}

// runTestFile runs the tests of one file and prints their lines.
func runTestFile(file string, opts scope.Options, maxPeak uint64, stdout io.Writer) (passed, failed int) {
	fail := func(what, detail string) {
		fmt.Fprintf(stdout, "FAIL %s\n%s", what, indent(detail))
		failed++
	}
	src, err := scope.ReadScript(file)
	if err != nil {
		fail(file, err.Error()+"\n")
		return
	}
	perTest, fileLimit, err := limits(src)
	if err != nil {
		fail(file, err.Error()+"\n")
		return
	}
	names, out, err := collect(file, src, opts)
	if err != nil {
		fail(file, out+errorText(err))
		return
	}
	for _, name := range names {
		limit := maxPeak
		if fileLimit != 0 {
			limit = fileLimit
		}
		if n := perTest[name]; n != 0 {
			limit = n
		}
		peak, out, err := runTest(file, src, name, limit, opts)
		figures := "peak " + backend.FormatBytes(int64(peak))
		switch {
		case err != nil:
			fail(fmt.Sprintf("%s (%s)", name, figures), out+errorText(err))
		case limit != 0 && peak > limit:
			fail(fmt.Sprintf("%s (%s > max-peak %s)", name, figures, backend.FormatBytes(int64(limit))), out)
		default:
			fmt.Fprintf(stdout, "PASS %s (%s)\n", name, figures)
			passed++
		}
	}
	return
}

// collect runs the file once and returns its test_* functions in the
// order they are defined.
func collect(file string, src []byte, opts scope.Options) ([]string, string, error) {
	var buf bytes.Buffer
	opts.Out, opts.Err = &buf, &buf
	s, err := scope.New(opts)
	if err != nil {
		return nil, "", err
	}
	defer s.Close()
	if err := repl.Interruptible(s, func() error { return s.Exec(file, src) }); err != nil {
		return nil, buf.String(), err
	}
	type fn struct {
		name string
		line int32
	}
	var fns []fn
	for name, v := range s.Globals() {
		if f, ok := v.(*starlark.Function); ok && strings.HasPrefix(name, "test_") {
			fns = append(fns, fn{name, f.Position().Line})
		}
	}
	sort.Slice(fns, func(i, j int) bool { return fns[i].line < fns[j].line })
	names := make([]string, len(fns))
	for i, f := range fns {
		names[i] = f.name
	}
	return names, buf.String(), nil
}

// runTest runs one test in a fresh Session and returns its peak allocated
// bytes (the largest over its GPUs) and its output.
func runTest(file string, src []byte, name string, limit uint64, opts scope.Options) (uint64, string, error) {
	var buf bytes.Buffer
	opts.Out, opts.Err = &buf, &buf
	s, err := scope.New(opts)
	if err != nil {
		return 0, "", err
	}
	defer s.Close()
	if err := repl.Interruptible(s, func() error { return s.Exec(file, src) }); err != nil {
		return 0, buf.String(), err
	}
	if limit == 0 {
		limit = math.MaxUint64 // measure only
	}
	b, err := starlib.StartBudget(s.Env(), limit, "", &buf)
	if err != nil {
		return 0, buf.String(), err
	}
	defer b.Stop()
	err = repl.Interruptible(s, func() error { return s.Exec(file+"::"+name, name+"()") })
	return b.Max, buf.String(), err
}

// errorText is an error as memsh prints it: the traceback of a Starlark
// error.
func errorText(err error) string {
	var b bytes.Buffer
	printError(&b, err)
	return b.String()
}

func indent(s string) string {
	if s == "" {
		return ""
	}
	return "    " + strings.ReplaceAll(strings.TrimRight(s, "\n"), "\n", "\n    ") + "\n"
}
