package scope_test

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/memsh/memsh/scope"
)

// load() reads only regular files: a FIFO in the script's directory is an
// error, not a hang (it blocked forever at 42a6389), and so is a file
// larger than a script may be.
func TestLoadRegularFilesOnly(t *testing.T) {
	dir := t.TempDir()
	if err := syscall.Mkfifo(filepath.Join(dir, "fifo.star"), 0o644); err != nil {
		t.Fatal(err)
	}
	big := filepath.Join(dir, "big.star")
	f, err := os.Create(big)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(scope.MaxScript + 1); err != nil { // sparse: no disk used
		t.Fatal(err)
	}
	f.Close()
	main := filepath.Join(dir, "main.star")
	for _, tc := range []struct{ src, want string }{
		{"load('fifo.star', 'x')\n", "not a regular file"},
		{"load('big.star', 'x')\n", "larger than a script may be"},
	} {
		if err := os.WriteFile(main, []byte(tc.src), 0o644); err != nil {
			t.Fatal(err)
		}
		var out bytes.Buffer
		s, err := scope.New(scope.Options{Device: "sim:1GiB", Out: &out, Err: &out})
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- s.Exec(main, nil) }()
		select {
		case err := <-done:
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("%s: got %v, want %q", tc.src, err, tc.want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: load() blocked", tc.src)
		}
		s.Close()
	}
}
