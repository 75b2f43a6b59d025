package log

import (
	"bufio"
	"errors"
	"io"
	"os"
	"sync"

	"github.com/memsh/memsh/fsafe"
)

// FileHeader is the first line of every --log-file memsh writes: the
// mark by which memsh proves, before appending to a file, that it is a
// log of its own.
const FileHeader = "# memsh log 1\n"

func init() {
	fsafe.RegisterVerifier(fsafe.Log, func(r io.Reader) error {
		line, err := bufio.NewReader(r).ReadString('\n')
		if err != nil && !errors.Is(err, io.EOF) {
			return err
		}
		if line != FileHeader {
			return errors.New("its first line is not memsh's log header")
		}
		return nil
	})
}

// File is a --log-file: appended to, its first write error kept (Err) so
// that memsh exits non-zero naming it rather than losing lines silently.
type File struct {
	f    *os.File
	mu   sync.Mutex
	err  error
	path string
}

// OpenFile opens path for the log's lines: a new file (given the header)
// or a memsh log; anything else (another file, a FIFO, a directory, a
// read-only file) is refused untouched (fsafe.OpenAppend).
func OpenFile(path string) (*File, error) {
	f, err := fsafe.OpenAppend(path, fsafe.Log, []byte(FileHeader))
	if err != nil {
		return nil, err
	}
	return &File{f: f, path: path}, nil
}

// Write appends p; after a failure every later write fails too.
func (l *File) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err != nil {
		return 0, l.err
	}
	n, err := l.f.Write(p)
	if err == nil && n < len(p) {
		err = io.ErrShortWrite
	}
	if err != nil {
		var pe *os.PathError
		if errors.As(err, &pe) {
			err = pe.Err
		}
		l.err = err
	}
	return n, err
}

// Close closes the file and returns the first error of its writes or of
// the close.
func (l *File) Close() error {
	cerr := l.f.Close()
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err != nil {
		return l.err
	}
	return cerr
}
