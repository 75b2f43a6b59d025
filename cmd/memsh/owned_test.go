package main

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// The cases of "nothing lost, nothing stuck, II" (files memsh does not own
// are never cut, replaced or appended to; inputs are regular files; no
// error quotes a foreign file). Each failed at 42a6389.

// One path named for two outputs is a usage error, before anything runs.
func TestOneFileForTwoOutputs(t *testing.T) {
	dir := t.TempDir()
	recs := write(t, filepath.Join(dir, "x.jsonl"), sampleRecords(2))
	before, _ := os.ReadFile(recs)
	for _, args := range [][]string{
		{"--out", recs, "--trace", recs},
		{"--out", recs, "--trace", "./x.jsonl"},
		{"--trace", "t.json", "--log", "--log-file", "t.json"},
		{"--out", recs, "--log", "--log-file", filepath.Join(dir, ".", "x.jsonl")},
	} {
		r := memsh(t, dir, nil, append(append([]string{"--device", "sim:1GiB"}, args...), "-c", "print('ran')")...)
		r.want(t, 2, "name the same file")
		if r.stdout != "" {
			t.Errorf("%v: the script ran: %q", args, r.stdout)
		}
	}
	if b, _ := os.ReadFile(recs); string(b) != string(before) {
		t.Error("the records file changed")
	}
}

// --log-file writes a new file (memsh's header first) or appends to a
// memsh log; anything else is refused untouched, a FIFO without hanging.
func TestLogFileOwnership(t *testing.T) {
	dir := t.TempDir()
	secret := "root:x:0:0:root:/root:/bin/bash\n"
	passwd := write(t, filepath.Join(dir, "passwd"), secret)
	r := memsh(t, dir, nil, "--device", "sim:1GiB", "--log", "--log-file", passwd, "-c", "x = 1")
	r.want(t, 2, "refusing to append to an existing file that is not a memsh log")
	if strings.Contains(r.stderr, "root:x") {
		t.Errorf("the error quotes the file: %q", r.stderr)
	}
	if b, _ := os.ReadFile(passwd); string(b) != secret {
		t.Errorf("the foreign file changed: %q", b)
	}
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	memsh(t, dir, nil, "--device", "sim:1GiB", "--log", "--log-file", fifo, "-c", "x = 1").want(t, 2, "not a regular file")
	memsh(t, dir, nil, "--device", "sim:1GiB", "--log", "--log-file", dir, "-c", "x = 1").want(t, 2, "a directory, not a file")
	ro := write(t, filepath.Join(dir, "ro.log"), "# memsh log 1\n")
	os.Chmod(ro, 0o444)
	memsh(t, dir, nil, "--device", "sim:1GiB", "--log", "--log-file", ro, "-c", "x = 1").want(t, 2, "read-only")

	log := filepath.Join(dir, "mem.log")
	for i := 1; i <= 2; i++ {
		if r := memsh(t, dir, nil, "--device", "sim:1GiB", "--log=compact", "--log-file", log, "-c", "x = 1"); r.rc != 0 {
			t.Fatalf("run %d: %+v", i, r)
		}
		b, _ := os.ReadFile(log)
		if !strings.HasPrefix(string(b), "# memsh log 1\n") || strings.Count(string(b), "# memsh log 1") != 1 || strings.Count(string(b), "<cmd>:1") != i {
			t.Errorf("after run %d the log is %q", i, b)
		}
	}
}

// memsh runs FILE.star, - and -c only: another file is a usage error
// that shows none of its content.
func TestRunsOnlyStarFiles(t *testing.T) {
	dir := t.TempDir()
	write(t, filepath.Join(dir, ".env"), "API_KEY = hunter2\n")
	write(t, filepath.Join(dir, "notes.txt"), "print('ran')\n")
	for _, name := range []string{".env", "notes.txt", "./.env"} {
		r := memsh(t, dir, nil, "--device", "sim:1GiB", name)
		r.want(t, 2, name+": not a script")
		if strings.Contains(r.stderr, "hunter2") || strings.Contains(r.stderr, "API_KEY") || r.stdout != "" {
			t.Errorf("%s: rc %d stdout %q stderr %q", name, r.rc, r.stdout, r.stderr)
		}
	}
}

// load(), merge, plot and memsh test refuse a FIFO, a directory or a
// device with an error instead of hanging on it.
func TestInputsAreRegularFiles(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "lib.star")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	main := write(t, filepath.Join(dir, "main.star"), "load('lib.star', 'x')\n")
	memsh(t, dir, nil, "--device", "sim:1GiB", main).want(t, 1, "not a regular file")
	memsh(t, dir, nil, "--device", "sim:1GiB", fifo).want(t, 1, "not a regular file")
	os.Mkdir(filepath.Join(dir, "d.star"), 0o755)
	memsh(t, dir, nil, "--device", "sim:1GiB", "d.star").want(t, 1, "a directory, not a file")
	recFifo := filepath.Join(dir, "r.jsonl")
	if err := syscall.Mkfifo(recFifo, 0o644); err != nil {
		t.Fatal(err)
	}
	memsh(t, dir, nil, "merge", recFifo).want(t, 1, "not a regular file")
	memsh(t, dir, nil, "plot", recFifo, "-o", filepath.Join(dir, "p.svg")).want(t, 1, "not a regular file")
	memsh(t, dir, nil, "merge", "/dev/zero").want(t, 1, "not a regular file")
	r := memsh(t, dir, nil, "test", fifo)
	if r.rc == 0 || !strings.Contains(r.stdout+r.stderr, "not a regular file") {
		t.Errorf("memsh test FIFO: %+v", r)
	}
}

// Files memsh would replace must be proven its own: a user's pickle, a
// JSON file that starts like a records file, a read-only trace or
// snapshot; "newdir/" names a directory, not a file.
func TestReplaceOnlyProvenFiles(t *testing.T) {
	dir := t.TempDir()
	// a protocol-4 pickle of {"a": 1}: the user's, not a snapshot
	userPickle := "\x80\x04\x95\x0a\x00\x00\x00\x00\x00\x00\x00}\x94\x8c\x01a\x94K\x01s."
	model := write(t, filepath.Join(dir, "model.pkl"), userPickle)
	memsh(t, dir, nil, "--device", "sim:1GiB", "-c", "cuda.dump_snapshot('model.pkl')").want(t, 1, "refusing to replace an existing file that is not a memory snapshot")
	if b, _ := os.ReadFile(model); string(b) != userPickle {
		t.Error("the user's pickle changed")
	}
	// memsh's own snapshot is replaced; a read-only one is not
	if r := memsh(t, dir, nil, "--device", "sim:1GiB", "-c", "cuda.dump_snapshot('s.pickle')\ncuda.dump_snapshot('s.pickle')"); r.rc != 0 {
		t.Fatalf("replacing memsh's own snapshot: %+v", r)
	}
	os.Chmod(filepath.Join(dir, "s.pickle"), 0o444)
	memsh(t, dir, nil, "--device", "sim:1GiB", "-c", "cuda.dump_snapshot('s.pickle', overwrite=True)").want(t, 1, "read-only")
	memsh(t, dir, nil, "--device", "sim:1GiB", "-c", "cuda.dump_snapshot('newdir/')").want(t, 1, "names a directory")
	if _, err := os.Lstat(filepath.Join(dir, "newdir")); err == nil {
		t.Error("dump_snapshot('newdir/') created newdir")
	}

	cfg := `{"schema": 1, "db_password": "sk-live-123"}`
	cfgPath := write(t, filepath.Join(dir, "cfg.json"), cfg)
	recs := write(t, filepath.Join(dir, "a.jsonl"), sampleRecords(2))
	r := memsh(t, dir, nil, "merge", "-o", cfgPath, recs)
	if r.rc == 0 || strings.Contains(r.stderr, "sk-live") {
		t.Errorf("merge -o cfg.json: %+v", r)
	}
	if b, _ := os.ReadFile(cfgPath); string(b) != cfg {
		t.Error("merge replaced the JSON file")
	}
	// --force says otherwise: merge, --trace and plot replace a foreign file
	if r := memsh(t, dir, nil, "merge", "--force", "-o", cfgPath, recs); r.rc != 0 {
		t.Fatalf("merge --force: %+v", r)
	}
	if b, _ := os.ReadFile(cfgPath); string(b) == cfg {
		t.Error("merge --force left the JSON file")
	}
	notes := write(t, filepath.Join(dir, "notes.json"), `{"mine": true}`)
	memsh(t, dir, nil, "--device", "sim:1GiB", "--trace", notes, "-c", "x = 1").want(t, 2, "--force")
	if r := memsh(t, dir, nil, "--device", "sim:1GiB", "--force", "--trace", notes, "-c", "x = 1"); r.rc != 0 {
		t.Fatalf("--force --trace: %+v", r)
	}
	if b, _ := os.ReadFile(notes); !strings.Contains(string(b), "traceEvents") {
		t.Error("--force --trace did not write the trace")
	}
	img := write(t, filepath.Join(dir, "photo.svg"), `<svg xmlns="http://www.w3.org/2000/svg"/>`)
	memsh(t, dir, nil, "plot", notes, "-o", img).want(t, 1, "refusing to replace")
	if r := memsh(t, dir, nil, "plot", "--force", notes, "-o", img); r.rc != 0 {
		t.Fatalf("plot --force: %+v", r)
	}

	tr := filepath.Join(dir, "t.json")
	if r := memsh(t, dir, nil, "--device", "sim:1GiB", "--trace", tr, "-c", "x = 1"); r.rc != 0 {
		t.Fatalf("--trace: %+v", r)
	}
	os.Chmod(tr, 0o444)
	memsh(t, dir, nil, "--device", "sim:1GiB", "--trace", tr, "-c", "x = 1").want(t, 2, "read-only")

	// --out: a foreign file whose last line looks like a torn record
	for _, foreign := range []string{`{"kind":"config","db_password":"sk-live-1"}`, `{"schema":"v1","a":2}`, `{`} {
		p := write(t, filepath.Join(dir, "o.jsonl"), foreign)
		r := memsh(t, dir, nil, "--device", "sim:1GiB", "--out", p, "-c", "e = experiment('x', quiet=True)\ne.finish()")
		r.want(t, 2, "refusing to append")
		if strings.Contains(r.stderr, "sk-live") || strings.Contains(r.stderr, "config") {
			t.Errorf("the error quotes the foreign file: %q", r.stderr)
		}
		if b, _ := os.ReadFile(p); string(b) != foreign {
			t.Errorf("%q was changed to %q", foreign, b)
		}
	}
}

// A trace that cannot be written at exit (the disk fills while the
// script runs) is a failure: exit 1 naming --trace and the OS error.
func TestTraceFailureAtExit(t *testing.T) {
	dir := t.TempDir()
	tr := filepath.Join(dir, "t.json")
	if r := memsh(t, dir, nil, "--device", "sim:1GiB", "--trace", tr, "-c", "x = 1"); r.rc != 0 {
		t.Fatalf("a plain --trace run: %+v", r)
	}
	small, _ := os.Stat(tr)
	os.Remove(tr)
	script := write(t, filepath.Join(dir, "s.star"), "for i in range(200):\n    x = cuda.malloc(MiB)\n")
	// room for the (empty) trace written at the start, not for the full one
	r := memshFsize(t, dir, uint64(small.Size())+64, "--device", "sim:1GiB", "--trace", tr, script)
	if r.rc != 1 || !strings.Contains(r.stderr, "--trace "+tr) || !strings.Contains(r.stderr, "file too large") {
		t.Errorf("--trace on a full disk at exit: %+v", r)
	}
	if b, err := os.ReadFile(tr); err != nil || int64(len(b)) > small.Size()+64 {
		t.Errorf("the trace left behind: %d bytes, %v", len(b), err)
	}
}
