package record

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
)

// Writer appends records to a JSONL file, one JSON object per line. Each
// Write is one write(2) of the whole line followed by fsync, so a record
// is complete on disk when Write returns and a killed process leaves at
// most a partial line being written, which OpenWriter removes.
type Writer struct {
	f    *os.File
	path string
}

// OpenWriter opens path for appending, creating it if needed, and returns
// the records already in it (for resume). A partial last line (a run
// killed in the middle of a write) is cut off; any other malformed line is
// an error naming the file and line.
func OpenWriter(path string) (*Writer, []*Record, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, nil, err
	}
	data, err := io.ReadAll(f)
	if err != nil {
		f.Close()
		return nil, nil, err
	}
	if n := len(data); n > 0 && data[n-1] != '\n' {
		keep := bytes.LastIndexByte(data, '\n') + 1
		if err := f.Truncate(int64(keep)); err != nil {
			f.Close()
			return nil, nil, fmt.Errorf("%s: cutting off a partial last line: %v", path, err)
		}
		data = data[:keep]
	}
	recs, err := Read(bytes.NewReader(data), path)
	if err != nil {
		f.Close()
		return nil, nil, err
	}
	if _, err := f.Seek(0, io.SeekEnd); err != nil {
		f.Close()
		return nil, nil, err
	}
	return &Writer{f: f, path: path}, recs, nil
}

// Path returns the file's name.
func (w *Writer) Path() string { return w.path }

// Write appends r as one line and flushes it to disk.
func (w *Writer) Write(r *Record) error {
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	b = append(b, '\n')
	if _, err := w.f.Write(b); err != nil {
		return err
	}
	return w.f.Sync()
}

// Close closes the file.
func (w *Writer) Close() error { return w.f.Close() }

// ReadFile reads the records of a JSONL file (see Read). A partial last
// line, as a killed run may leave, is ignored.
func ReadFile(path string) ([]*Record, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	if n := len(data); n > 0 && data[n-1] != '\n' {
		data = data[:bytes.LastIndexByte(data, '\n')+1]
	}
	return Read(bytes.NewReader(data), path)
}

// Read parses JSONL records; name is used in errors ("out.jsonl:3: ...").
// Blank lines are skipped. Records are returned in file order, duplicates
// included (see Merge).
func Read(r io.Reader, name string) ([]*Record, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 64<<20)
	var recs []*Record
	for line := 1; sc.Scan(); line++ {
		b := bytes.TrimSpace(sc.Bytes())
		if len(b) == 0 {
			continue
		}
		rec := new(Record)
		if err := json.Unmarshal(b, rec); err != nil {
			return nil, fmt.Errorf("%s:%d: not a memsh record: %v", name, line, err)
		}
		if rec.Kind == "" {
			return nil, fmt.Errorf("%s:%d: not a memsh record: no \"kind\"", name, line)
		}
		recs = append(recs, rec)
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return nil, fmt.Errorf("%s: a line is longer than 64 MiB", name)
		}
		return nil, fmt.Errorf("%s: %v", name, err)
	}
	return recs, nil
}

// WriteAll writes records as JSONL to w.
func WriteAll(w io.Writer, recs []*Record) error {
	bw := bufio.NewWriter(w)
	enc := json.NewEncoder(bw)
	enc.SetEscapeHTML(false)
	for _, r := range recs {
		if err := enc.Encode(r); err != nil {
			return err
		}
	}
	return bw.Flush()
}
