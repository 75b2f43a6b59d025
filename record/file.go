package record

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"syscall"

	"github.com/memsh/memsh/fsafe"
)

// MaxLine bounds the length of one record line a reader accepts, so a
// file that is not a records file (a device, a huge binary) is refused
// after reading at most this much of one line.
const MaxLine = 64 << 20

// Sink is what a Writer writes to: an *os.File opened for appending, or a
// test's fault-injecting file.
type Sink interface {
	io.Writer
	Sync() error
	Truncate(size int64) error
	Close() error
}

// Writer appends records to a JSONL file, one JSON object per line. Each
// Write is one write(2) of the whole line followed by fsync; when either
// fails the file is cut back to the end of the last complete record, so
// the file always ends with a whole record (resume and memsh merge keep
// working once the fault is gone) and the error is returned.
type Writer struct {
	f    Sink
	path string
	size int64 // bytes of complete records in the file
}

// NewWriter returns a Writer appending to f, which holds size bytes of
// complete records; path names it in messages.
func NewWriter(f Sink, size int64, path string) *Writer {
	return &Writer{f: f, path: path, size: size}
}

// discard is the Sink of --out /dev/null.
type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }
func (discard) Sync() error                 { return nil }
func (discard) Truncate(int64) error        { return nil }
func (discard) Close() error                { return nil }

// OpenWriter opens path for appending, creating it if needed, and returns
// the records already in it (for resume). It refuses, without writing, a
// path that is not a regular file (a FIFO, a device: it never blocks on
// one nor reads it without bound) and a file that is not a memsh records
// file (every line must be a record). A partial last line that begins as
// a record memsh writes and follows whole records (a run killed in the
// middle of a write) is cut off; a read-only file is refused.
// /dev/null is accepted: records are discarded and nothing resumes.
func OpenWriter(path string) (*Writer, []*Record, error) {
	fi, err := os.Stat(path)
	switch {
	case err == nil && isDevNull(fi):
		return &Writer{f: discard{}, path: path}, nil, nil
	case err == nil && !fi.Mode().IsRegular():
		return nil, nil, fmt.Errorf("%s: not a regular file", path)
	case err != nil && !errors.Is(err, os.ErrNotExist):
		return nil, nil, pathErr(path, err)
	case err == nil && fi.Mode().Perm()&0o222 == 0:
		return nil, nil, fmt.Errorf("%s: read-only (mode %v): memsh does not append to it", path, fi.Mode().Perm())
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_APPEND|os.O_CREATE|syscall.O_NONBLOCK|syscall.O_NOCTTY, 0o644)
	if err != nil {
		return nil, nil, pathErr(path, err)
	}
	// The path may have changed between Stat and OpenFile.
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		f.Close()
		if err != nil {
			return nil, nil, pathErr(path, err)
		}
		return nil, nil, fmt.Errorf("%s: not a regular file", path)
	}
	recs, good, partial, _, err := read(f, path)
	if err != nil {
		f.Close()
		return nil, nil, fmt.Errorf("%v: not a memsh records file; refusing to append to it", err)
	}
	if partial {
		if err := f.Truncate(good); err != nil {
			f.Close()
			return nil, nil, fmt.Errorf("%s: cutting off a partial last line: %v", path, err)
		}
	}
	return &Writer{f: f, path: path, size: good}, recs, nil
}

func isDevNull(fi os.FileInfo) bool {
	null, err := os.Stat(os.DevNull)
	return err == nil && os.SameFile(fi, null)
}

func pathErr(path string, err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return fmt.Errorf("%s: %v", path, pe.Err)
	}
	return fmt.Errorf("%s: %v", path, err)
}

// Path returns the file's name.
func (w *Writer) Path() string { return w.path }

// Write appends r as one line and flushes it to disk. On failure the file
// is cut back to its previous length.
func (w *Writer) Write(r *Record) error {
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	b = append(b, '\n')
	n, err := w.f.Write(b)
	if err == nil && n < len(b) {
		err = io.ErrShortWrite
	}
	if err == nil {
		err = w.f.Sync()
	}
	if err != nil {
		// Cut back whatever part of the line reached the file.
		if terr := w.f.Truncate(w.size); terr != nil {
			return fmt.Errorf("%v (and cutting the partial record off failed: %v)", unwrap(err), unwrap(terr))
		}
		return unwrap(err)
	}
	w.size += int64(len(b))
	return nil
}

func unwrap(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// Close closes the file.
func (w *Writer) Close() error { return w.f.Close() }

// ReadFile reads the records of a JSONL file (see Read), boundedly: a
// FIFO, a device or a file with a line over MaxLine is an error, not a
// hang or an exhausted memory. A partial last line, as a killed run may leave, is
// ignored.
func ReadFile(path string) ([]*Record, error) {
	f, err := fsafe.OpenRegular(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	recs, _, _, _, err := read(f, path)
	return recs, err
}

// Read parses JSONL records; name is used in errors ("out.jsonl:3: ...").
// Blank lines are skipped. Records are returned in file order, duplicates
// included (see Merge). A last line without a newline must be a whole
// record too (ReadFile ignores a partial one, as a killed run leaves).
func Read(r io.Reader, name string) ([]*Record, error) {
	recs, _, partial, last, err := read(r, name)
	if err == nil && partial {
		if last == nil {
			return nil, fmt.Errorf("%s: the last line is not a complete record", name)
		}
		recs = append(recs, last)
	}
	return recs, err
}

// read parses records line by line. good is the length of the complete
// lines; partial reports a last line without its newline that begins as
// memsh records do (it is not in recs; last is its record when it is a
// whole one). Any other malformed line, or a line over MaxLine, is an
// error.
func read(r io.Reader, name string) (recs []*Record, good int64, partial bool, last *Record, err error) {
	br := bufio.NewReaderSize(r, 64<<10)
	var line []byte
	for n := 1; ; n++ {
		line = line[:0]
		var rerr error
		for {
			var chunk []byte
			chunk, rerr = br.ReadSlice('\n')
			line = append(line, chunk...)
			if len(line) > MaxLine {
				return nil, 0, false, nil, fmt.Errorf("%s:%d: a line longer than %d MiB", name, n, MaxLine>>20)
			}
			if rerr != bufio.ErrBufferFull {
				break
			}
		}
		if rerr != nil && rerr != io.EOF {
			return nil, 0, false, nil, pathErr(name, rerr)
		}
		if rerr == io.EOF && len(line) > 0 {
			// No newline: a record cut by a kill, or not a records file.
			b := bytes.TrimSpace(line)
			if len(b) == 0 {
				return recs, good + int64(len(line)), false, nil, nil
			}
			last, _ = parseLine(b, name, n)
			if last == nil && (len(recs) == 0 || !isRecordPrefix(b)) {
				// a torn record follows whole ones and is a prefix of one
				return nil, 0, false, nil, fmt.Errorf("%s:%d: not a memsh record", name, n)
			}
			return recs, good, true, last, nil
		}
		if b := bytes.TrimSpace(line); len(b) > 0 {
			rec, err := parseLine(b, name, n)
			if err != nil {
				return nil, 0, false, nil, err
			}
			recs = append(recs, rec)
		}
		good += int64(len(line))
		if rerr == io.EOF {
			return recs, good, false, nil, nil
		}
	}
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
