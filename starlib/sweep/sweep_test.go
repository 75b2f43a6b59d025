package sweep_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"go.starlark.net/starlark"

	"github.com/memsh/memsh/record"
	"github.com/memsh/memsh/scope"
	"github.com/memsh/memsh/starlib/sweep"
)

// session returns a Session on a simulated GPU whose records go to out
// (if not "") and which runs shard (if not ""), with the extra builtins.
func session(t *testing.T, device, out, shard string, builtins starlark.StringDict) (*scope.Session, *bytes.Buffer) {
	t.Helper()
	var buf bytes.Buffer
	s, err := scope.New(scope.Options{Device: device, Out: &buf, Err: &buf, Builtins: builtins})
	if err != nil {
		t.Fatal(err)
	}
	st := record.Of(s.Env())
	if shard != "" {
		sh, err := record.ParseShard(shard)
		if err != nil {
			t.Fatal(err)
		}
		st.SetShard(sh)
	}
	if out != "" {
		if err := st.Open(out); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		st.Close()
		s.Close()
	})
	return s, &buf
}

// calls is a Starlark builtin note(n) that records its argument and, once
// it has been called interruptAt times, interrupts the Session (a kill of
// the run, in process: the point being run is lost, as with SIGKILL).
type calls struct {
	got         []int
	interruptAt int
	s           *scope.Session
}

func (c *calls) builtin() *starlark.Builtin {
	return starlark.NewBuiltin("note", func(_ *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kw []starlark.Tuple) (starlark.Value, error) {
		var n int
		if err := starlark.UnpackArgs(b.Name(), args, kw, "n", &n); err != nil {
			return nil, err
		}
		c.got = append(c.got, n)
		if c.interruptAt > 0 && len(c.got) == c.interruptAt {
			c.s.Interrupt()
		}
		return starlark.None, nil
	})
}

const resumeScript = `
def f(n):
    note(n)
    x = cuda.malloc(n * 64 * MiB)
    for i in range(100):   # a few steps, so an interrupt lands inside
        pass
    return n
r = sweep.grid(f, n=[1, 2, 3, 4, 5, 6, 20])
`

func sweepRecords(t *testing.T, path string) []*record.Record {
	t.Helper()
	recs, err := record.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []*record.Record
	for _, r := range recs {
		if r.Sweep != "" {
			out = append(out, r)
		}
	}
	return out
}

// A sweep stopped after k points and run again with the same --out
// finishes without redoing the k points.
func TestResumeSkipsRecordedPoints(t *testing.T) {
	out := filepath.Join(t.TempDir(), "out.jsonl")

	c1 := &calls{interruptAt: 4}
	s1, _ := session(t, "sim:1GiB", out, "", starlark.StringDict{"note": c1.builtin()})
	c1.s = s1
	if err := s1.Exec("job.star", resumeScript); err == nil || !strings.Contains(err.Error(), "interrupted") {
		t.Fatalf("first run: err = %v, want an interrupt", err)
	}
	first := sweepRecords(t, out)
	if len(first) != 3 {
		t.Fatalf("after the stop: %d point records, want 3", len(first))
	}

	c2 := &calls{}
	s2, buf := session(t, "sim:1GiB", out, "", starlark.StringDict{"note": c2.builtin()})
	if err := s2.Exec("job.star", resumeScript); err != nil {
		t.Fatal(err)
	}
	if want := []int{4, 5, 6, 20}; !reflect.DeepEqual(c2.got, want) {
		t.Errorf("the re-run ran fn for %v, want %v (the 3 recorded points skipped)", c2.got, want)
	}
	if n := strings.Count(buf.String(), "(resumed)"); n != 3 {
		t.Errorf("%d rows marked resumed, want 3:\n%s", n, buf)
	}
	all := sweepRecords(t, out)
	seen := map[string]int{}
	for _, r := range all {
		seen[r.Name]++
	}
	if len(all) != 7 || len(seen) != 7 {
		t.Errorf("records after resume: %d (%d distinct), want 7 distinct points: %v", len(all), len(seen), seen)
	}
	if all[6].Status != "oom" || all[5].Status != "ok" {
		t.Errorf("statuses: n=6 %s, n=20 %s", all[5].Status, all[6].Status)
	}
	// The returned trials say which points were resumed, with their figures.
	r := s2.Get("r")
	trials, _ := r.(starlark.HasAttrs).Attr("trials")
	var resumed []bool
	for i := 0; i < trials.(*starlark.List).Len(); i++ {
		v, _ := trials.(*starlark.List).Index(i).(starlark.HasAttrs).Attr("resumed")
		resumed = append(resumed, bool(v.(starlark.Bool)))
	}
	if want := []bool{true, true, true, false, false, false, false}; !reflect.DeepEqual(resumed, want) {
		t.Errorf("resumed = %v, want %v", resumed, want)
	}
}

// max_fit resumed in the middle of its search follows the same path and
// finds the same answer without redoing the recorded trials.
// resumeRuns are three runs of one script: the first, with --out, stopped
// at its interruptAt-th note; the second resuming it from that file; and
// one whole run without records.
type resumeRuns struct {
	first, resumed, whole *calls
	resumedS, wholeS      *scope.Session
	resumedOut            *bytes.Buffer
}

func interruptAndResume(t *testing.T, device, script string, interruptAt int) resumeRuns {
	t.Helper()
	out := filepath.Join(t.TempDir(), "out.jsonl")
	r := resumeRuns{first: &calls{interruptAt: interruptAt}, resumed: &calls{}, whole: &calls{}}
	s1, _ := session(t, device, out, "", starlark.StringDict{"note": r.first.builtin()})
	r.first.s = s1
	if err := s1.Exec("job.star", script); err == nil {
		t.Fatal("first run was not interrupted")
	}
	r.resumedS, r.resumedOut = session(t, device, out, "", starlark.StringDict{"note": r.resumed.builtin()})
	if err := r.resumedS.Exec("job.star", script); err != nil {
		t.Fatal(err)
	}
	r.wholeS, _ = session(t, device, "", "", starlark.StringDict{"note": r.whole.builtin()})
	if err := r.wholeS.Exec("job.star", script); err != nil {
		t.Fatal(err)
	}
	return r
}

func TestResumeMaxFit(t *testing.T) {
	script := `
def f(n):
    note(n)
    a = cuda.malloc(n * MiB)
    b = cuda.malloc(n * MiB)
    return n
r = sweep.max_fit(f, mode="binsearch")
best = r.best
`
	r := interruptAndResume(t, "sim:1GiB", script, 12)
	c1, c2, c3, s2, s3 := r.first, r.resumed, r.whole, r.resumedS, r.wholeS
	// Unresumed, the search runs 1..512 (ok), 1024 (oom), then bisects.
	if !reflect.DeepEqual(c1.got[:11], c3.got[:11]) || !reflect.DeepEqual(c2.got, c3.got[11:]) {
		t.Errorf("interrupted run %v + resumed run %v != uninterrupted run %v", c1.got, c2.got, c3.got)
	}
	if s2.Get("best").String() != "512" || s3.Get("best").String() != "512" {
		t.Errorf("best = %s (resumed), %s (uninterrupted), want 512", s2.Get("best"), s3.Get("best"))
	}
}

const shardScript = `
e = experiment("setup", quiet=True)
x = tensor.zeros([1024], device="cuda")
e.finish()
def alloc(n, copies):
    bufs = [cuda.malloc(n * MiB) for i in range(copies)]
    return len(bufs)
g = sweep.grid(alloc, n=[128, 256, 512], copies=[1, 2, 3])
def two(n):
    a = cuda.malloc(n * MiB)
    b = cuda.malloc(n * MiB)
    return n
m = sweep.max_fit(two, mode="binsearch")
r = trial(two, 4, name="after")
`

// normalize drops what differs between runs of the same points: times,
// host figures (RSS is noisy) and the shard label.
func normalize(recs []*record.Record) []string {
	var out []string
	for _, r := range recs {
		c := *r
		c.Time, c.At, c.Shard, c.Host = 0, "", "", record.Figures{}
		b, _ := json.Marshal(c)
		out = append(out, string(b))
	}
	return out
}

// The shards' records, merged, equal an unsharded run's.
func TestShardsMergeToUnshardedRun(t *testing.T) {
	dir := t.TempDir()
	whole := filepath.Join(dir, "whole.jsonl")
	s, _ := session(t, "sim:1GiB", whole, "", nil)
	if err := s.Exec("job.star", shardScript); err != nil {
		t.Fatal(err)
	}
	want, err := record.ReadFile(whole)
	if err != nil {
		t.Fatal(err)
	}

	var sets [][]*record.Record
	points := 0
	for i := 0; i < 3; i++ {
		path := filepath.Join(dir, fmt.Sprintf("shard%d.jsonl", i))
		s, buf := session(t, "sim:1GiB", path, fmt.Sprintf("%d/3", i), nil)
		if err := s.Exec("job.star", shardScript); err != nil {
			t.Fatal(err)
		}
		recs, err := record.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		n := len(sweepRecordsOf(recs))
		if n == 0 || n == len(sweepRecordsOf(want)) {
			t.Errorf("shard %d/3 ran %d of %d points", i, n, len(sweepRecordsOf(want)))
		}
		points += n
		if !strings.Contains(buf.String(), "on shard") {
			t.Errorf("shard %d/3 output does not say which points it ran:\n%s", i, buf)
		}
		sets = append(sets, recs)
	}
	if points != len(sweepRecordsOf(want)) {
		t.Errorf("the shards ran %d points in all, want %d", points, len(sweepRecordsOf(want)))
	}
	got := normalize(record.Merge(sets...))
	exp := normalize(want)
	if !reflect.DeepEqual(got, exp) {
		t.Errorf("merged shards differ from the unsharded run:\n got %d records:\n%s\nwant %d:\n%s",
			len(got), strings.Join(got, "\n"), len(exp), strings.Join(exp, "\n"))
	}
}

func sweepRecordsOf(recs []*record.Record) []*record.Record {
	var out []*record.Record
	for _, r := range recs {
		if r.Sweep != "" {
			out = append(out, r)
		}
	}
	return out
}

// The progress bar shows on stderr only when it is a terminal.
func TestProgressBarOnlyOnTerminal(t *testing.T) {
	script := `
def f(n):
    return n
sweep.grid(f, n=[1, 2, 3])
sweep.max_fit(f, high=8)
`
	var stderr bytes.Buffer
	for _, term := range []bool{false, true} {
		restore := sweep.SetTerminal(func(w io.Writer) bool { return term && w == &stderr })
		stderr.Reset()
		var stdout bytes.Buffer
		s, err := scope.New(scope.Options{Device: "sim:1GiB", Out: &stdout, Err: &stderr})
		if err != nil {
			t.Fatal(err)
		}
		err = s.Exec("job.star", script)
		s.Close()
		restore()
		if err != nil {
			t.Fatal(err)
		}
		if !term {
			if stderr.Len() != 0 {
				t.Errorf("not a terminal, yet stderr has %q", stderr.String())
			}
			continue
		}
		e := stderr.String()
		for _, want := range []string{"sweep.grid f: n=3", "(2/3)", "sweep.max_fit f: n=8 (4/-)"} {
			if !strings.Contains(e, want) {
				t.Errorf("progress output lacks %q:\n%q", want, e)
			}
		}
		if strings.Contains(stdout.String(), "\r") {
			t.Errorf("the progress bar went to stdout")
		}
	}
}

// A point that fails with an error other than out of memory is recorded as
// "error" (never "oom"), stops the sweep, and runs again on resume.
func TestErrorPointRecordedAndRetried(t *testing.T) {
	out := filepath.Join(t.TempDir(), "out.jsonl")
	script := `
def f(n):
    note(n)
    if broken() and n == 3:
        fail("bug at", n)
    x = cuda.malloc(n * 300 * MiB)
    return n
r = sweep.grid(f, n=[1, 2, 3, 4])
`
	brokenFlag := true
	broken := starlark.NewBuiltin("broken", func(*starlark.Thread, *starlark.Builtin, starlark.Tuple, []starlark.Tuple) (starlark.Value, error) {
		return starlark.Bool(brokenFlag), nil
	})
	c1 := &calls{}
	s1, _ := session(t, "sim:1GiB", out, "", starlark.StringDict{"note": c1.builtin(), "broken": broken})
	err := s1.Exec("job.star", script)
	if err == nil || !strings.Contains(err.Error(), "sweep.grid: trial n=3 failed with an error (not out of memory): fail: bug at 3") {
		t.Fatalf("err = %v", err)
	}
	recs := sweepRecords(t, out)
	if len(recs) != 3 || recs[2].Status != "error" || !strings.Contains(recs[2].Error, "bug at 3") {
		t.Fatalf("records after the error: %+v", recs)
	}

	brokenFlag = false
	c2 := &calls{}
	s2, _ := session(t, "sim:1GiB", out, "", starlark.StringDict{"note": c2.builtin(), "broken": broken})
	if err := s2.Exec("job.star", script); err != nil {
		t.Fatal(err)
	}
	if want := []int{3, 4}; !reflect.DeepEqual(c2.got, want) {
		t.Errorf("re-run ran %v, want %v (the error point again, then the rest)", c2.got, want)
	}
	statuses := map[string]string{}
	for _, r := range record.Merge(sweepRecords(t, out)) {
		statuses[r.Name] = r.Status
	}
	if want := map[string]string{"n=1": "ok", "n=2": "ok", "n=3": "ok", "n=4": "oom"}; !reflect.DeepEqual(statuses, want) {
		t.Errorf("merged statuses %v, want %v", statuses, want)
	}
}

// A recorded point is reused only if it was measured under the same
// conditions: on another device capacity, or with other memory allocated
// before the sweep, it runs again.
func TestResumeOnlySameConditions(t *testing.T) {
	out := filepath.Join(t.TempDir(), "out.jsonl")
	script := `
def fn(n):
    note(n)
    x = tensor.zeros([n], device="cuda")
r = sweep.grid(fn, n=[1024, 2048])
`
	c1 := &calls{}
	s1, _ := session(t, "sim:1GiB", out, "", starlark.StringDict{"note": c1.builtin()})
	if err := s1.Exec("job.star", script); err != nil {
		t.Fatal(err)
	}
	// Same conditions: nothing runs again.
	c2 := &calls{}
	s2, _ := session(t, "sim:1GiB", out, "", starlark.StringDict{"note": c2.builtin()})
	if err := s2.Exec("job.star", script); err != nil || len(c2.got) != 0 {
		t.Fatalf("same conditions: err %v, ran %v", err, c2.got)
	}
	// Another capacity: both run again, with a note.
	c3 := &calls{}
	s3, buf3 := session(t, "sim:2GiB", out, "", starlark.StringDict{"note": c3.builtin()})
	if err := s3.Exec("job.star", script); err != nil || len(c3.got) != 2 {
		t.Fatalf("other capacity: err %v, ran %v", err, c3.got)
	}
	if !strings.Contains(buf3.String(), "measured on another device or with other memory allocated before the sweep") {
		t.Errorf("no note about stale records:\n%s", buf3)
	}
	// Memory held before the sweep differs: both run again.
	c4 := &calls{}
	s4, _ := session(t, "sim:2GiB", out, "", starlark.StringDict{"note": c4.builtin()})
	if err := s4.Exec("job.star", "hog = cuda.malloc(64 * MiB)\n"+script); err != nil || len(c4.got) != 2 {
		t.Fatalf("other baseline: err %v, ran %v", err, c4.got)
	}
}

// Two sweeps with the same name (two closures of one def) are different
// units: a resumed run does not give one the other's records.
func TestResumeTwoSweepsOfOneName(t *testing.T) {
	out := filepath.Join(t.TempDir(), "out.jsonl")
	script := `
def make(per):
    def fit(bs):
        t = tensor.zeros([bs * per], dtype="uint8", device="cuda")
        return 0
    return fit
a = sweep.max_fit(make(MiB), high=2048, mode="binsearch")
b = sweep.max_fit(make(4 * MiB), high=2048, mode="binsearch")
best = (a.best, b.best)
`
	var bests []string
	for run := 0; run < 2; run++ {
		s, _ := session(t, "sim:1GiB", out, "", nil)
		if err := s.Exec("dup.star", script); err != nil {
			t.Fatal(err)
		}
		bests = append(bests, s.Get("best").String())
	}
	if bests[0] != bests[1] || bests[0] != "(1024, 256)" {
		t.Errorf("best (first run, resumed run) = %v, want (1024, 256) both times", bests)
	}
}

// A fresh=True search resumes like any other: its records carry the
// baseline of a trial whose cuBLAS workspaces were freed first, and the
// resumed session compares with that, whatever workspaces the trials it
// runs again have made meanwhile.
func TestResumeFreshMaxFit(t *testing.T) {
	script := `
a = tensor.empty([64, 64], device = "cuda")
def f(n):
    note(n)
    b = a.matmul(a)
    x = cuda.malloc(n * GiB)
    return n
r = sweep.max_fit(f, mode="binsearch", fresh=True)
best = r.best
`
	r := interruptAndResume(t, "sim:H100,meta", script, 6)
	c1, c2, c3, s2, s3, buf2 := r.first, r.resumed, r.whole, r.resumedS, r.wholeS, r.resumedOut
	if strings.Contains(buf2.String(), "running it again") {
		t.Errorf("the resumed search found its own records stale:\n%s", buf2)
	}
	if !reflect.DeepEqual(c1.got[:5], c3.got[:5]) || !reflect.DeepEqual(c2.got, c3.got[5:]) {
		t.Errorf("interrupted run %v + resumed run %v != uninterrupted run %v", c1.got, c2.got, c3.got)
	}
	if s2.Get("best").String() != s3.Get("best").String() {
		t.Errorf("best = %s (resumed), %s (uninterrupted)", s2.Get("best"), s3.Get("best"))
	}
}
