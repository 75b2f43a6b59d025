package record

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// faultyFile is a Sink over a byte slice that fails once limit bytes have
// been written in all: a write that would cross the limit writes what
// fits and fails with ENOSPC, as a full disk does.
type faultyFile struct {
	data      []byte
	limit     int
	failSync  bool
	writes    int
	truncated int
}

func (f *faultyFile) Write(p []byte) (int, error) {
	f.writes++
	room := f.limit - len(f.data)
	if room >= len(p) {
		f.data = append(f.data, p...)
		return len(p), nil
	}
	room = max(room, 0)
	f.data = append(f.data, p[:room]...)
	return room, syscall.ENOSPC
}

func (f *faultyFile) Sync() error {
	if f.failSync {
		return syscall.EIO
	}
	return nil
}

func (f *faultyFile) Truncate(n int64) error {
	f.truncated++
	f.data = f.data[:n]
	return nil
}

func (f *faultyFile) Close() error { return nil }

func sample(i int) *Record {
	return &Record{Schema: SchemaVersion, Kind: "trial", Name: fmt.Sprintf("bs=%d", i), Sweep: "s",
		Params: json.RawMessage(fmt.Sprintf(`{"bs":%d}`, i)), Status: "ok", Pos: Pos{i, 0, 0}, GPUs: []Figures{{Device: "cuda:0", Peak: int64(i) << 20}}}
}

// A write that fails after N bytes, for every N up to a few records:
// the error is returned, the file ends with the last complete record,
// nothing written before the fault is lost, and the file reads back.
func TestWriterFaultAfterNBytes(t *testing.T) {
	var line0 []byte
	b, _ := json.Marshal(sample(0))
	line0 = append(b, '\n')
	for limit := 0; limit < 4*len(line0); limit += 7 {
		f := &faultyFile{limit: limit}
		w := NewWriter(f, 0, "mem.jsonl")
		var ok int
		var werr error
		for i := 0; i < 6; i++ {
			if werr = w.Write(sample(i)); werr != nil {
				break
			}
			ok++
		}
		if werr == nil || !errors.Is(werr, syscall.ENOSPC) {
			t.Fatalf("limit %d: got %v, want ENOSPC", limit, werr)
		}
		recs, err := Read(bytes.NewReader(f.data), "mem.jsonl")
		if err != nil {
			t.Fatalf("limit %d: the file does not read back: %v\n%q", limit, err, f.data)
		}
		if len(recs) != ok {
			t.Fatalf("limit %d: %d records read, %d written", limit, len(recs), ok)
		}
		if len(f.data) > 0 && f.data[len(f.data)-1] != '\n' {
			t.Fatalf("limit %d: the file ends in a partial record: %q", limit, f.data)
		}
		for i, r := range recs {
			if r.Name != fmt.Sprintf("bs=%d", i) {
				t.Fatalf("limit %d: record %d is %s", limit, i, r.Name)
			}
		}
		// Space freed: the next record goes on after the good ones.
		f.limit = 1 << 20
		if err := w.Write(sample(99)); err != nil {
			t.Fatal(err)
		}
		if recs, err := Read(bytes.NewReader(f.data), "x"); err != nil || len(recs) != ok+1 {
			t.Fatalf("limit %d: after freeing space: %d records, %v", limit, len(recs), err)
		}
		if f.writes != ok+2 {
			t.Fatalf("limit %d: %d write calls for %d records: each record must be one write", limit, f.writes, ok+2)
		}
	}
	// fsync failing: the record is cut off too.
	f := &faultyFile{limit: 1 << 20}
	w := NewWriter(f, 0, "x")
	if err := w.Write(sample(1)); err != nil {
		t.Fatal(err)
	}
	f.failSync = true
	if err := w.Write(sample(2)); !errors.Is(err, syscall.EIO) {
		t.Fatalf("got %v, want EIO", err)
	}
	if recs, _ := Read(bytes.NewReader(f.data), "x"); len(recs) != 1 {
		t.Fatalf("%d records after a failed fsync, want 1", len(recs))
	}
}

func TestOpenWriterRefuses(t *testing.T) {
	dir := t.TempDir()
	foreign := filepath.Join(dir, "notes.txt")
	for _, content := range []string{"precious notes\n", "no newline at all", `{"kind":"other","status":"x"}` + "\n", "\x00\x01\x02", sampleLine(1) + "garbage\n"} {
		if err := os.WriteFile(foreign, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		_, _, err := OpenWriter(foreign)
		if err == nil || !strings.Contains(err.Error(), "not a memsh records file") {
			t.Errorf("%q: got %v, want a refusal", content, err)
		}
		if b, _ := os.ReadFile(foreign); string(b) != content {
			t.Errorf("%q: the file changed to %q", content, b)
		}
	}
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{fifo, "/dev/zero", dir} {
		done := make(chan error, 1)
		go func() { _, _, err := OpenWriter(p); done <- err }()
		select {
		case err := <-done:
			if err == nil || err.Error() != p+": not a regular file" {
				t.Errorf("%s: got %v", p, err)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: OpenWriter hangs", p)
		}
	}
	// /dev/null: accepted, nothing resumes, writes vanish.
	w, recs, err := OpenWriter(os.DevNull)
	if err != nil || len(recs) != 0 {
		t.Fatalf("/dev/null: %v, %d records", err, len(recs))
	}
	if err := w.Write(sample(1)); err != nil {
		t.Fatal(err)
	}
	w.Close()
}

func sampleLine(i int) string {
	b, _ := json.Marshal(sample(i))
	return string(b) + "\n"
}

// A partial last line that a kill left is cut; records without "schema"
// (version 1) are read.
func TestOpenWriterResumes(t *testing.T) {
	path := filepath.Join(t.TempDir(), "r.jsonl")
	v1 := `{"kind":"trial","name":"bs=7","sweep":"s","params":{"bs":7},"status":"oom","time":1,"pos":[7,0,0],"host":{"device":"host"},"gpus":[]}` + "\n"
	content := v1 + sampleLine(1) + sampleLine(2)[:40]
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	w, recs, err := OpenWriter(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 2 || recs[0].Schema != 1 || recs[1].Schema != SchemaVersion || recs[0].Status != "oom" {
		t.Fatalf("records %+v", recs)
	}
	if err := w.Write(sample(3)); err != nil {
		t.Fatal(err)
	}
	w.Close()
	b, _ := os.ReadFile(path)
	if want := v1 + sampleLine(1) + sampleLine(3); string(b) != want {
		t.Fatalf("file:\n%s\nwant:\n%s", b, want)
	}
	if _, err := ReadFile(path); err != nil {
		t.Fatal(err)
	}
	// Newer schema: refused.
	if err := os.WriteFile(path, []byte(`{"schema":9,"kind":"trial","status":"ok"}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadFile(path); err == nil || !strings.Contains(err.Error(), "newer memsh") {
		t.Fatalf("got %v", err)
	}
}

// ReadFile of a device is bounded: /dev/zero is one endless line.
func TestReadFileBounded(t *testing.T) {
	done := make(chan error, 1)
	go func() { _, err := ReadFile("/dev/zero"); done <- err }()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("/dev/zero read as records")
		}
	case <-time.After(20 * time.Second):
		t.Fatal("ReadFile(/dev/zero) does not return")
	}
}

// A file that is not memsh's is never cut or appended to, whatever its
// last line looks like, and the error quotes none of its values: a
// foreign JSON object without a final newline, one that starts as
// records do, or a lone "{" (cut to 0 bytes at 42a6389).
func TestOpenWriterRefusesForeign(t *testing.T) {
	dir := t.TempDir()
	for i, content := range []string{
		`{"kind":"config","db_password":"hunter2"}`,
		`{"schema":"v1","token":"sk-live-123"}`,
		`{`,
		`{"schema":3,"kind":"trial","name":"x","secret":"sk-live-123"`,
		sampleLine(1) + `{"schema":3,"kind":"trial","password":"sk-live-123"`,
		sampleLine(1) + `{"kind":"config","db_password":"hunter2"}` + "\n",
	} {
		path := filepath.Join(dir, fmt.Sprintf("f%d.jsonl", i))
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		_, _, err := OpenWriter(path)
		if err == nil {
			t.Errorf("case %d: accepted %q", i, content)
		} else if strings.Contains(err.Error(), "hunter2") || strings.Contains(err.Error(), "sk-live") {
			t.Errorf("case %d: the error quotes the file: %v", i, err)
		}
		if b, _ := os.ReadFile(path); string(b) != content {
			t.Errorf("case %d: the file changed to %q", i, b)
		}
	}
	// a torn record after whole ones is cut; the whole ones stay
	path := filepath.Join(dir, "torn.jsonl")
	whole := sampleLine(1) + sampleLine(2)
	if err := os.WriteFile(path, []byte(whole+sampleLine(3)[:57]), 0o644); err != nil {
		t.Fatal(err)
	}
	w, recs, err := OpenWriter(path)
	if err != nil || len(recs) != 2 {
		t.Fatalf("torn tail: %v, %d records", err, len(recs))
	}
	w.Close()
	if b, _ := os.ReadFile(path); string(b) != whole {
		t.Errorf("after the cut: %q", b)
	}
	// read-only: refused
	ro := filepath.Join(dir, "ro.jsonl")
	if err := os.WriteFile(ro, []byte(whole), 0o444); err != nil {
		t.Fatal(err)
	}
	if _, _, err := OpenWriter(ro); err == nil || !strings.Contains(err.Error(), "read-only") {
		t.Errorf("read-only --out: %v", err)
	}
}
