package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/memsh/memsh/record"
)

// The memsh binary, built once for every test that runs it as a child.
var memshBin, memshBuildErr string

// fsizeEnv, set in a child's environment, makes the test binary a
// wrapper: it sets its own RLIMIT_FSIZE to the value and execs the rest of
// its arguments (memshFsize), so that the test process itself never runs
// under the limit (its test log, written meanwhile, would fail with EFBIG).
const fsizeEnv = "MEMSH_TEST_FSIZE_EXEC"

func TestMain(m *testing.M) {
	if v := os.Getenv(fsizeEnv); v != "" {
		var limit uint64
		fmt.Sscan(v, &limit)
		var old syscall.Rlimit
		syscall.Getrlimit(syscall.RLIMIT_FSIZE, &old)
		if err := syscall.Setrlimit(syscall.RLIMIT_FSIZE, &syscall.Rlimit{Cur: limit, Max: old.Max}); err != nil {
			fmt.Fprintln(os.Stderr, "setrlimit:", err)
			os.Exit(125)
		}
		env := slices.DeleteFunc(os.Environ(), func(e string) bool { return strings.HasPrefix(e, fsizeEnv+"=") })
		err := syscall.Exec(os.Args[1], os.Args[1:], env)
		fmt.Fprintln(os.Stderr, "exec:", err)
		os.Exit(126)
	}
	dir, err := os.MkdirTemp("", "memsh-test-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	bin := filepath.Join(dir, "memsh")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		memshBuildErr = fmt.Sprintf("%v\n%s", err, out)
	} else {
		memshBin = bin
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

type result struct {
	rc             int
	stdout, stderr string
}

// memsh runs the binary in dir with a timeout; stdout is the child's
// standard output when not nil.
func memsh(t *testing.T, dir string, stdout *os.File, args ...string) result {
	t.Helper()
	bin := buildMemsh(t, dir)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Dir = dir
	var out, errb bytes.Buffer
	cmd.Stderr = &errb
	if stdout != nil {
		cmd.Stdout = stdout
	} else {
		cmd.Stdout = &out
	}
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("memsh %v: timed out (a hang)", args)
	}
	rc := 0
	if ee, ok := err.(*exec.ExitError); ok {
		rc = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return result{rc, out.String(), errb.String()}
}

func (r result) want(t *testing.T, rc int, stderr string) {
	t.Helper()
	if r.rc != rc || !strings.Contains(r.stderr, stderr) {
		t.Errorf("rc %d, stderr %q; want rc %d and %q", r.rc, r.stderr, rc, stderr)
	}
}

// Targets of --out that are not records files are refused at once, the
// file untouched; /dev/null is accepted.
func TestOutRefusesWhatIsNotARecordsFile(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"/dev/zero", "/dev/full", fifo, dir} {
		r := memsh(t, dir, nil, "--device", "sim:1GiB", "--out", p, "-c", "1")
		r.want(t, 2, "memsh: --out "+p+": not a regular file\n")
	}
	notes := "my notes\nnot records\n"
	foreign := write(t, filepath.Join(dir, "notes.jsonl"), notes)
	r := memsh(t, dir, nil, "--device", "sim:1GiB", "--out", foreign, "-c", "e = experiment('x', quiet=True)\ne.finish()")
	r.want(t, 2, "notes.jsonl:1: not a memsh record")
	r.want(t, 2, "refusing to append to it")
	if b, _ := os.ReadFile(foreign); string(b) != notes {
		t.Errorf("the foreign file changed: %q", b)
	}
	r = memsh(t, dir, nil, "--device", "sim:1GiB", "--out", os.DevNull, "-c", "e = experiment('x', quiet=True)\ne.finish()\nprint('ran')")
	if r.rc != 0 || r.stdout != "ran\n" {
		t.Errorf("--out /dev/null: rc %d, stdout %q, stderr %q", r.rc, r.stdout, r.stderr)
	}
}

// Standard output that fails (a full device, a closed pipe) is an error.
func TestStdoutFailures(t *testing.T) {
	dir := t.TempDir()
	full, err := os.OpenFile("/dev/full", os.O_WRONLY, 0)
	if err != nil {
		t.Skip("no /dev/full")
	}
	defer full.Close()
	r := memsh(t, dir, full, "--device", "sim:1GiB", "-c", "print('hello')")
	r.want(t, 1, "memsh: writing standard output: no space left on device")
	recs := write(t, filepath.Join(dir, "a.jsonl"), sampleRecords(2))
	r = memsh(t, dir, full, "merge", recs)
	r.want(t, 1, "memsh merge: ")
	r.want(t, 1, "no space left on device")

	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	pr.Close()
	defer pw.Close()
	r = memsh(t, dir, pw, "--device", "sim:1GiB", "-c", "print('hello')")
	r.want(t, 1, "memsh: writing standard output: broken pipe")
}

func sampleRecords(n int) string {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, `{"schema":2,"kind":"experiment","name":"e%d","status":"ok","time":0,"pos":[0,-1,%d],"host":{"device":"host"},"gpus":[]}`+"\n", i, i)
	}
	return b.String()
}

// memshFsize runs memsh with RLIMIT_FSIZE at limit bytes: a write past it
// fails with EFBIG (Go ignores SIGXFSZ), as on a full disk.
func memshFsize(t *testing.T, dir string, limit uint64, args ...string) result {
	t.Helper()
	bin := buildMemsh(t, dir)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, self, append([]string{bin}, args...)...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%d", fsizeEnv, limit))
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	err = cmd.Wait()
	if ctx.Err() != nil {
		t.Fatal("timed out")
	}
	rc := 0
	if ee, ok := err.(*exec.ExitError); ok {
		rc = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return result{rc, out.String(), errb.String()}
}

// A sweep whose records stop fitting on disk: memsh exits non-zero, the
// file ends with the last complete record, every record written before
// the fault is intact, and once there is room again the run resumes from
// the file and memsh merge reads it.
func TestOutWriteFailure(t *testing.T) {
	dir := t.TempDir()
	script := write(t, filepath.Join(dir, "grid.star"), `
def f(n):
    x = cuda.malloc(n * MiB)
    return n
r = sweep.grid(f, n=list(range(1, 9)))
print("done", len(r.trials))
`)
	// A reference run, for the lengths of the records.
	ref := filepath.Join(dir, "ref.jsonl")
	if r := memsh(t, dir, nil, "--device", "sim:1GiB", "--out", ref, script); r.rc != 0 {
		t.Fatalf("reference run: %+v", r)
	}
	b, _ := os.ReadFile(ref)
	lines := strings.SplitAfter(string(b), "\n")
	limit := uint64(len(lines[0]) + len(lines[1]) + len(lines[2])/2) // room for 2.5 records

	out := filepath.Join(dir, "out.jsonl")
	r := memshFsize(t, dir, limit, "--device", "sim:1GiB", "--out", out, script)
	r.want(t, 1, "memsh: --out "+out+": record \"n=3\" not written: file too large")
	if strings.Contains(r.stdout, "done") {
		t.Errorf("the sweep went on after its records failed: %q", r.stdout)
	}
	// the table marks the point whose record failed, and only it
	if n := strings.Count(r.stdout, "(record not written to --out)"); n != 1 || !regexp.MustCompile(`(?m)^3 .*ok .*\(record not written to --out\)$`).MatchString(r.stdout) {
		t.Errorf("the sweep table does not mark point 3 (and only it) as unrecorded:\n%s", r.stdout)
	}
	got, _ := os.ReadFile(out)
	if len(got) == 0 || got[len(got)-1] != '\n' {
		t.Fatalf("the file does not end with a complete record: %q", got)
	}
	recs, err := record.ReadFile(out)
	if err != nil || len(recs) != 2 {
		t.Fatalf("%d records after the fault (%v), want 2", len(recs), err)
	}
	for i, rec := range recs {
		var want, have record.Record
		_ = json.Unmarshal([]byte(lines[i]), &want)
		have = *rec
		if have.Name != want.Name || have.Status != "ok" || have.Schema != record.SchemaVersion {
			t.Errorf("record %d: %+v", i, have)
		}
	}
	// Room again: resume skips the two recorded points.
	r = memsh(t, dir, nil, "--device", "sim:1GiB", "--out", out, script)
	if r.rc != 0 || !strings.Contains(r.stderr, "2 sweep points recorded already will be skipped") || !strings.Contains(r.stdout, "done 8") {
		t.Fatalf("resume: %+v", r)
	}
	if recs, err := record.ReadFile(out); err != nil || len(recs) != 8 {
		t.Fatalf("after resume: %d records, %v", len(recs), err)
	}
	r = memsh(t, dir, nil, "merge", out, "-o", filepath.Join(dir, "all.jsonl"))
	r.want(t, 0, "8 records from 1 files")

	// Plain experiments (no sweep to stop): still a non-zero exit.
	out2 := filepath.Join(dir, "exp.jsonl")
	r = memshFsize(t, dir, 100, "--device", "sim:1GiB", "--out", out2, "-c", "e = experiment('x', quiet=True)\ne.finish()\nprint('after')")
	r.want(t, 1, "not written: file too large")
	if st, err := os.Stat(out2); err != nil || st.Size() != 0 {
		t.Errorf("a partial record was left: %v %v", st, err)
	}
}

// dump_snapshot writes only under the working directory or --out-dir,
// never through a symlink out of it, never over a foreign file unless
// overwrite=True.
func TestSnapshotSandbox(t *testing.T) {
	base := t.TempDir()
	work := filepath.Join(base, "work")
	outside := filepath.Join(base, "outside")
	for _, d := range []string{work, outside} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(outside, filepath.Join(work, "escape")); err != nil {
		t.Fatal(err)
	}
	notes := write(t, filepath.Join(work, "notes.pickle"), "not a pickle\n")
	dump := func(args ...string) result {
		return memsh(t, work, nil, append([]string{"--device", "sim:1GiB"}, args...)...)
	}
	r := dump("-c", `cuda.dump_snapshot("escape/s.pickle")`)
	r.want(t, 1, "escape/s.pickle: outside the directories a script may write to")
	r = dump("-c", `cuda.dump_snapshot("`+filepath.Join(outside, "s.pickle")+`")`)
	r.want(t, 1, "outside the directories a script may write to")
	r = dump("-c", `cuda.dump_snapshot("../outside/s.pickle")`)
	r.want(t, 1, "outside the directories a script may write to")
	if ents, _ := os.ReadDir(outside); len(ents) != 0 {
		t.Fatalf("written outside: %v", ents)
	}
	r = dump("-c", `cuda.dump_snapshot("notes.pickle")`)
	r.want(t, 1, "refusing to replace an existing file that is not a memory snapshot")
	if b, _ := os.ReadFile(notes); string(b) != "not a pickle\n" {
		t.Fatalf("foreign file changed: %q", b)
	}
	r = dump("-c", `cuda.dump_snapshot("notes.pickle", overwrite=True)`)
	r.want(t, 0, "")
	r = dump("-c", `cuda.dump_snapshot("s.pickle")`+"\n"+`cuda.dump_snapshot("s.pickle")`)
	r.want(t, 0, "")
	// --out-dir opens a directory, a symlink into it included.
	r = dump("--out-dir", outside, "-c", `cuda.dump_snapshot("escape/s.pickle")`)
	r.want(t, 0, "")
	if b, err := os.ReadFile(filepath.Join(outside, "s.pickle")); err != nil || len(b) < 2 || b[0] != 0x80 {
		t.Fatalf("snapshot under --out-dir: %v", err)
	}
	if ents, _ := os.ReadDir(work); len(ents) != 3 { // escape, notes.pickle, s.pickle: no temporary files
		t.Errorf("work dir: %v", ents)
	}
}

// An experiment cut by an out-of-memory error is recorded "oom"; one open
// when the script stops on another error is finished and recorded with
// that error; one never finished is recorded "ok" at exit.
func TestCutExperimentsRecorded(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		code, status, errText string
		rc                    int
	}{
		{"e = experiment('big', quiet=True)\nx = cuda.malloc(2 * GiB)", "oom", "out of memory", 1},
		{"e = experiment('outer', quiet=True)\nf = experiment('inner', quiet=True)\n1 // 0", "error", "division by zero", 1},
		{"e = experiment('open', quiet=True)\nx = 1", "ok", "", 0},
	} {
		out := filepath.Join(dir, tc.status+".jsonl")
		tr := filepath.Join(dir, tc.status+".json")
		var stdout, stderr bytes.Buffer
		rc := run([]string{"--device", "sim:1GiB", "--out", out, "--trace", tr, "-c", tc.code}, strings.NewReader(""), &stdout, &stderr)
		if rc != tc.rc {
			t.Errorf("%q: rc %d, want %d (%s)", tc.code, rc, tc.rc, stderr.String())
		}
		recs, err := record.ReadFile(out)
		if err != nil || len(recs) == 0 {
			t.Fatalf("%q: %d records, %v", tc.code, len(recs), err)
		}
		for _, r := range recs {
			if r.Kind != "experiment" || r.Status != tc.status || !strings.Contains(r.Error, tc.errText) {
				t.Errorf("%q: record %+v, want status %q and error %q", tc.code, r, tc.status, tc.errText)
			}
		}
		if strings.Contains(tc.code, "inner") && (len(recs) != 2 || recs[0].Name != "inner" || recs[1].Name != "outer") {
			t.Errorf("nested: %d records", len(recs))
		}
		if strings.Contains(stdout.String(), "finished") {
			t.Errorf("%q: reports printed for experiments finished at exit:\n%s", tc.code, stdout.String())
		}
		// The trace shows each experiment with the same status: the
		// Session's FinishEvent carries it.
		b, err := os.ReadFile(tr)
		if err != nil {
			t.Fatal(err)
		}
		var doc struct {
			TraceEvents []struct {
				Name, Cat string
				Args      map[string]any
			} `json:"traceEvents"`
		}
		if err := json.Unmarshal(b, &doc); err != nil {
			t.Fatalf("%q: trace: %v", tc.code, err)
		}
		n := 0
		for _, ev := range doc.TraceEvents {
			if ev.Cat != "experiment" {
				continue
			}
			n++
			msg, _ := ev.Args["error"].(string)
			if ev.Args["status"] != tc.status || !strings.Contains(msg, tc.errText) {
				t.Errorf("%q: trace event %s %v, want status %q", tc.code, ev.Name, ev.Args, tc.status)
			}
		}
		if n != len(recs) {
			t.Errorf("%q: %d experiments in the trace, %d records", tc.code, n, len(recs))
		}
	}
	// A failed script (not -c) finishes its open experiments with their
	// reports, which name the failure.
	var so, se bytes.Buffer
	script := filepath.Join(dir, "cut.star")
	if err := os.WriteFile(script, []byte("e = experiment('loud')\nx = cuda.malloc(2 * GiB)\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if rc := run([]string{"--device", "sim:1GiB", script}, strings.NewReader(""), &so, &se); rc != 1 {
		t.Errorf("script: rc %d", rc)
	}
	if !strings.Contains(so.String(), "(status oom: CUDA out of memory") || !strings.Contains(se.String(), "cut.star:2") {
		t.Errorf("script cut by an OOM:\n--- stdout\n%s--- stderr\n%s", so.String(), se.String())
	}
	// In the REPL (-i: piped stdin is otherwise a script) the session goes
	// on: the experiment a failed input cut is recorded "oom" when it is
	// finished later.
	out := filepath.Join(dir, "repl.jsonl")
	var stdout, stderr bytes.Buffer
	in := "e = experiment('r', quiet=True)\nx = cuda.malloc(2 * GiB)\ne.finish()\nf = experiment('fine', quiet=True)\nf.finish()\n"
	if rc := run([]string{"--device", "sim:1GiB", "--out", out, "-i"}, strings.NewReader(in), &stdout, &stderr); rc != 0 {
		t.Fatalf("repl: rc %d: %s", rc, stderr.String())
	}
	recs, _ := record.ReadFile(out)
	if len(recs) != 2 || recs[0].Status != "oom" || recs[1].Status != "ok" {
		t.Fatalf("repl records: %+v", recs)
	}
}

// memsh plot: one panel per sweep, --sweep picks one; outputs replace
// only files of their kind; merge -o likewise.
func TestPlotSweepsAndOutputKinds(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "two.jsonl")
	code := `
def a(n):
    x = cuda.malloc(n * 64 * MiB)
def b(k):
    x = cuda.malloc(k * 100 * MiB)
sweep.grid(a, n=[1, 2, 4, 32])
sweep.max_fit(b, name="kfit")
`
	var stdout, stderr bytes.Buffer
	if rc := run([]string{"--device", "sim:1GiB", "--out", out, "-c", code}, strings.NewReader(""), &stdout, &stderr); rc != 0 {
		t.Fatalf("rc %d: %s", rc, stderr.String())
	}
	svg := filepath.Join(dir, "two.svg")
	if rc := run([]string{"plot", out, "-o", svg}, nil, &stdout, &stderr); rc != 0 {
		t.Fatalf("plot: %s", stderr.String())
	}
	b, _ := os.ReadFile(svg)
	if !bytes.Contains(b, []byte(`kfit`)) || !bytes.Contains(b, []byte(`"a"`)) && !bytes.Contains(b, []byte(`&#34;a&#34;`)) {
		t.Errorf("the chart lacks a panel per sweep")
	}
	one := filepath.Join(dir, "one.png")
	if rc := run([]string{"plot", out, "--sweep", "kfit", "-o", one}, nil, &stdout, &stderr); rc != 0 {
		t.Fatalf("plot --sweep: %s", stderr.String())
	}
	stderr.Reset()
	if rc := run([]string{"plot", out, "--sweep", "nope", "-o", one}, nil, &stdout, &stderr); rc != 1 || !strings.Contains(stderr.String(), `no sweep "nope" in the records (they hold "a", "kfit")`) {
		t.Errorf("plot --sweep nope: rc %d, %s", rc, stderr.String())
	}
	// Plot over the records file itself (a typo): refused, records intact.
	before, _ := os.ReadFile(out)
	stderr.Reset()
	notes := write(t, filepath.Join(dir, "notes.svg"), "my notes")
	for _, target := range []string{notes, out + ".png"} {
		if target != notes {
			write(t, target, string(before))
		}
		if rc := run([]string{"plot", out, "-o", target}, nil, &stdout, &stderr); rc != 1 || !strings.Contains(stderr.String(), "refusing to replace") {
			t.Errorf("plot -o %s: rc %d, %s", target, rc, stderr.String())
		}
	}
	if after, _ := os.ReadFile(out); !bytes.Equal(before, after) {
		t.Error("the records changed")
	}
	// merge -o: over a records file (an input) fine, over notes refused.
	stderr.Reset()
	if rc := run([]string{"merge", out, "-o", out}, nil, &stdout, &stderr); rc != 0 {
		t.Errorf("merge -o onto its input: %s", stderr.String())
	}
	if rc := run([]string{"merge", out, "-o", notes}, nil, &stdout, &stderr); rc != 1 || !strings.Contains(stderr.String(), "not a memsh records (JSONL)") {
		t.Errorf("merge -o notes: rc %d, %s", rc, stderr.String())
	}
	if b, _ := os.ReadFile(notes); string(b) != "my notes" {
		t.Errorf("notes changed: %q", b)
	}
	if ents, _ := filepath.Glob(filepath.Join(dir, ".*memsh-*")); len(ents) != 0 {
		t.Errorf("temporary files left: %v", ents)
	}
}
