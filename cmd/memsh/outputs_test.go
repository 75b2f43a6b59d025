package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/memsh/memsh/record"
)

func write(t *testing.T, path, text string) string {
	t.Helper()
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestOutputFlagErrors(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--shard", "2/2"}, "--shard: bad shard \"2/2\": want 0 <= i < n"},
		{[]string{"--shard", "x"}, "--shard: bad shard \"x\""},
		{[]string{"--out", filepath.Join(dir, "no", "such", "dir.jsonl")}, "--out " + filepath.Join(dir, "no", "such", "dir.jsonl") + ": no such file or directory"},
		{[]string{"--trace", filepath.Join(dir, "no", "t.json")}, "--trace " + filepath.Join(dir, "no", "t.json") + ": no such file or directory"},
		{[]string{"--trace", write(t, filepath.Join(dir, "notes.txt"), "notes\n")}, "refusing to replace an existing file that is not a Chrome trace"},
		{[]string{"--out-dir", filepath.Join(dir, "nodir")}, "--out-dir " + filepath.Join(dir, "nodir") + ": no such file or directory"},
		{[]string{"--trace", filepath.Join(dir, "t.json"), "--trace-max-events", "0"}, "--trace-max-events: got 0"},
	} {
		var out, errb bytes.Buffer
		args := append(append([]string{"--device", "sim:1GiB"}, tc.args...), "-c", "1")
		if rc := run(args, strings.NewReader(""), &out, &errb); rc != 2 || !strings.Contains(errb.String(), tc.want) {
			t.Errorf("%v: rc %d, stderr %q; want rc 2 and %q", tc.args, rc, errb.String(), tc.want)
		}
	}
}

const gridScript = `
e = experiment("setup", quiet=True)
x = tensor.zeros([256], device="cuda")
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
print("best", m.best)
`

// normalized drops what differs between runs of the same points: times,
// host figures (RSS is noisy) and the shard label.
func normalized(t *testing.T, path string) []string {
	t.Helper()
	recs, err := record.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, r := range recs {
		c := *r
		c.Time, c.At, c.Shard, c.Host = 0, "", "", record.Figures{}
		b, _ := json.Marshal(c)
		out = append(out, string(b))
	}
	return out
}

// Shards run with --shard and merged with memsh merge equal an unsharded
// run; memsh plot charts the records and the trace.
func TestShardMergePlot(t *testing.T) {
	dir := t.TempDir()
	script := write(t, filepath.Join(dir, "job.star"), gridScript)
	whole := filepath.Join(dir, "whole.jsonl")
	tr := filepath.Join(dir, "whole.json")
	var out, errb bytes.Buffer
	if rc := run([]string{"--device", "sim:1GiB", "--out", whole, "--trace", tr, script}, strings.NewReader(""), &out, &errb); rc != 0 {
		t.Fatalf("unsharded run: rc %d: %s", rc, errb.String())
	}
	var parts []string
	for i := 0; i < 4; i++ {
		p := filepath.Join(dir, fmt.Sprintf("part%d.jsonl", i))
		out.Reset()
		if rc := run([]string{"--device", "sim:1GiB", "--shard", fmt.Sprintf("%d/4", i), "--out", p, script}, strings.NewReader(""), &out, &errb); rc != 0 {
			t.Fatalf("shard %d: rc %d: %s", i, rc, errb.String())
		}
		parts = append(parts, p)
	}
	all := filepath.Join(dir, "all.jsonl")
	errb.Reset()
	if rc := run(append(append([]string{"merge"}, parts...), "-o", all), nil, &out, &errb); rc != 0 {
		t.Fatalf("merge: rc %d: %s", rc, errb.String())
	}
	if got, want := normalized(t, all), normalized(t, whole); !reflect.DeepEqual(got, want) {
		t.Errorf("merged shards (%d records) differ from the unsharded run (%d records):\n%s\n---\n%s",
			len(got), len(want), strings.Join(got, "\n"), strings.Join(want, "\n"))
	}

	for _, tc := range []struct {
		args []string
		file string
	}{
		{[]string{"plot", all, "-o", filepath.Join(dir, "sweep.svg")}, "sweep.svg"},
		{[]string{"plot", "-o", filepath.Join(dir, "sweep.png"), whole}, "sweep.png"},
		{[]string{"plot", tr, "-o", filepath.Join(dir, "trace.png")}, "trace.png"},
		{[]string{"plot", tr}, "whole.svg"},
	} {
		out.Reset()
		errb.Reset()
		if rc := run(tc.args, nil, &out, &errb); rc != 0 {
			t.Errorf("%v: rc %d: %s", tc.args, rc, errb.String())
			continue
		}
		if st, err := os.Stat(filepath.Join(dir, tc.file)); err != nil || st.Size() < 1000 {
			t.Errorf("%v: no chart %s: %v", tc.args, tc.file, err)
		}
	}
	for _, tc := range []struct {
		args []string
		rc   int
		want string
	}{
		{[]string{"merge"}, 2, "usage: memsh merge"},
		{[]string{"merge", filepath.Join(dir, "nope.jsonl")}, 1, "no such file"},
		{[]string{"merge", script}, 1, "job.star:2: not a memsh record"},
		{[]string{"plot"}, 2, "usage: memsh plot"},
		{[]string{"plot", all, "-o", filepath.Join(dir, "x.gif")}, 1, "want .svg or .png"},
		{[]string{"plot", all, "-x", "batch"}, 1, `no numeric parameter "batch"`},
	} {
		errb.Reset()
		if rc := run(tc.args, nil, &out, &errb); rc != tc.rc || !strings.Contains(errb.String(), tc.want) {
			t.Errorf("%v: rc %d, stderr %q; want rc %d and %q", tc.args, rc, errb.String(), tc.rc, tc.want)
		}
	}
}

// A sweep killed (SIGKILL) after k points and re-run with the same --out
// finishes without redoing the k points.
func TestKillAndResume(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	dir := t.TempDir()
	bin := buildMemsh(t, dir)
	const points = 12
	script := write(t, filepath.Join(dir, "slow.star"), fmt.Sprintf(`
def step(n):
    x = cuda.malloc(n * MiB)
    s = 0
    for i in range(200000):   # some work, so the kill lands mid-sweep
        s += i
    return s
r = sweep.grid(step, n=list(range(1, %d)))
print("done", len(r.trials))
`, points+1))
	out := filepath.Join(dir, "out.jsonl")
	cmd := exec.Command(bin, "--device", "sim:1GiB", "--out", out, script)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := func() int {
		data, _ := os.ReadFile(out)
		return bytes.Count(data, []byte("\n"))
	}
	deadline := time.Now().Add(60 * time.Second)
	for lines() < 4 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	cmd.Process.Signal(syscall.SIGKILL)
	cmd.Wait()
	k := lines()
	if k < 4 || k >= points {
		t.Fatalf("killed after %d of %d points; want a kill mid-sweep", k, points)
	}

	var stdout, stderr bytes.Buffer
	again := exec.Command(bin, "--device", "sim:1GiB", "--out", out, script)
	again.Stdout, again.Stderr = &stdout, &stderr
	if err := again.Run(); err != nil {
		t.Fatalf("re-run: %v\n%s", err, stderr.String())
	}
	if !strings.Contains(stdout.String(), fmt.Sprintf("done %d", points)) {
		t.Errorf("re-run output:\n%s", stdout.String())
	}
	if n := strings.Count(stdout.String(), "(resumed)"); n != k {
		t.Errorf("%d points resumed, want the %d recorded before the kill:\n%s", n, k, stdout.String())
	}
	if !strings.Contains(stderr.String(), fmt.Sprintf("%d sweep points recorded already", k)) {
		t.Errorf("stderr: %s", stderr.String())
	}
	recs, err := record.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]int{}
	for _, r := range recs {
		seen[r.Name]++
	}
	if len(recs) != points || len(seen) != points {
		t.Errorf("%d records, %d distinct points; want each of the %d points once: %v", len(recs), len(seen), points, seen)
	}
}

// The example scripts run (with small budgets, so the CPU compute is
// quick), and their records chart.
func TestExampleScripts(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the example sweeps")
	}
	dir := t.TempDir()
	for _, tc := range []struct {
		script, budget, want string
	}{
		{"../../scripts/mlp_max_batch.star", "64", "largest batch that fits: "},
		{"../../scripts/transformer_max_batch.star", "24", "sequence length -> largest batch that fits"},
	} {
		out := filepath.Join(dir, filepath.Base(tc.script)+".jsonl")
		var stdout, stderr bytes.Buffer
		if rc := run([]string{"--device", "sim:1GiB", "--out", out, tc.script, tc.budget}, nil, &stdout, &stderr); rc != 0 {
			t.Fatalf("%s: rc %d\n%s\n%s", tc.script, rc, stdout.String(), stderr.String())
		}
		if !strings.Contains(stdout.String(), tc.want) {
			t.Errorf("%s output lacks %q:\n%s", tc.script, tc.want, stdout.String())
		}
		if rc := run([]string{"plot", out, "-o", out + ".svg"}, nil, &stdout, &stderr); rc != 0 {
			t.Errorf("plot %s: %s", out, stderr.String())
		}
	}
}

// buildMemsh returns the memsh binary TestMain built.
func buildMemsh(t *testing.T, _ string) string {
	t.Helper()
	if memshBin == "" {
		t.Fatalf("go build: %s", memshBuildErr)
	}
	return memshBin
}

// SIGTERM (a batch system's time limit) still writes the trace.
func TestTraceWrittenOnSIGTERM(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	dir := t.TempDir()
	bin := buildMemsh(t, dir)
	script := write(t, filepath.Join(dir, "long.star"), `
def step(n):
    x = cuda.malloc(n * MiB)
    for i in range(200000):
        pass
    return n
sweep.grid(step, n=list(range(1, 1000)))
`)
	out, tr := filepath.Join(dir, "out.jsonl"), filepath.Join(dir, "trace.json")
	var stderr bytes.Buffer
	cmd := exec.Command(bin, "--device", "sim:1GiB", "--out", out, "--trace", tr, script)
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		if data, _ := os.ReadFile(out); bytes.Count(data, []byte("\n")) >= 3 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	cmd.Process.Signal(syscall.SIGTERM)
	err := cmd.Wait()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 143 {
		t.Errorf("exit: %v, want status 143\n%s", err, stderr.String())
	}
	data, err := os.ReadFile(tr)
	if err != nil {
		t.Fatal(err)
	}
	var tf struct {
		TraceEvents []struct {
			Name string `json:"name"`
			Ph   string `json:"ph"`
		} `json:"traceEvents"`
	}
	if err := json.Unmarshal(data, &tf); err != nil {
		t.Fatalf("the trace written on SIGTERM is not valid JSON: %v", err)
	}
	trials := 0
	for _, e := range tf.TraceEvents {
		if e.Ph == "X" && strings.HasPrefix(e.Name, "n=") {
			trials++
		}
	}
	if trials < 2 || !strings.Contains(stderr.String(), "terminated by SIGTERM") { // the third may be signalled between its record and its slice
		t.Errorf("%d trial slices in the trace; stderr %q", trials, stderr.String())
	}
}
