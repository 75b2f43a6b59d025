package fsafe

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestSniff(t *testing.T) {
	for _, tc := range []struct {
		head string
		want Kind
	}{
		{"", Empty},
		{"\x89PNG\r\n\x1a\n....", PNG},
		{"\x80\x02}q\x00", Snapshot},
		{"<?xml version=\"1.0\"?>\n<svg xmlns=...", SVG},
		{"<svg width=\"10\">", SVG},
		{"{\"traceEvents\":[\n", Trace},
		{"{\"schema\":2,\"kind\":\"trial\"}\n", Records},
		{"{\"kind\":\"experiment\",\"name\":\"x\"}\n", Records},
		{"hello world\n", Unknown},
		{"{\"other\":1}", Unknown},
		{"<?xml version=\"1.0\"?><html>", Unknown},
	} {
		if got := Sniff([]byte(tc.head)); got != tc.want {
			t.Errorf("Sniff(%q) = %q, want %q", tc.head, got, tc.want)
		}
	}
}

func chdir(t *testing.T, dir string) {
	t.Helper()
	t.Chdir(dir)
}

func writeString(s string) func(io.Writer) error {
	return func(w io.Writer) error {
		_, err := io.WriteString(w, s)
		return err
	}
}

func TestPolicyRoots(t *testing.T) {
	base := t.TempDir()
	work := filepath.Join(base, "work")
	outside := filepath.Join(base, "outside")
	outDir := filepath.Join(base, "results")
	for _, d := range []string{work, outside, outDir, filepath.Join(work, "sub")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	chdir(t, work)
	if err := os.Symlink(outside, "escape"); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("sub", "inner"); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(outside, "f.pickle"), "link.pickle"); err != nil {
		t.Fatal(err)
	}
	pol := &Policy{Roots: []string{".", outDir}}
	snap := writeString("\x80\x02snapshot")

	// Allowed: the working directory, a subdirectory through an inner
	// link, --out-dir.
	for _, p := range []string{"a.pickle", "sub/b.pickle", "inner/c.pickle", filepath.Join(outDir, "d.pickle")} {
		if err := pol.WriteFile(p, Snapshot, false, snap); err != nil {
			t.Errorf("%s: %v", p, err)
		}
	}
	if b, err := os.ReadFile("sub/c.pickle"); err != nil || string(b) != "\x80\x02snapshot" {
		t.Errorf("inner/c.pickle: got %q, %v", b, err)
	}
	// Refused: out of the roots, through a symlinked directory, a symlink
	// whose target is outside, "..".
	for _, p := range []string{filepath.Join(outside, "x.pickle"), "escape/x.pickle", "link.pickle", "../outside/y.pickle", "/etc/memsh.pickle"} {
		err := pol.WriteFile(p, Snapshot, false, snap)
		if err == nil || !strings.Contains(err.Error(), "outside the directories") {
			t.Errorf("%s: got %v, want a refusal", p, err)
		}
	}
	if ents, _ := os.ReadDir(outside); len(ents) != 0 {
		t.Errorf("files written outside: %v", ents)
	}
	// A nil policy is the working directory.
	var none *Policy
	if err := none.WriteFile("e.pickle", Snapshot, false, snap); err != nil {
		t.Error(err)
	}
	if err := none.WriteFile(filepath.Join(outDir, "e.pickle"), Snapshot, false, snap); err == nil {
		t.Error("a nil policy allowed writing out of the working directory")
	}
}

// The test's verifiers: a "snapshot" is proven by its first bytes
// "\x80\x02memsh", a "trace" by `{"traceEvents"` (the real ones, in
// packages snapshot and trace, read the whole file).
func init() {
	prefix := func(p string) Verifier {
		return func(r io.Reader) error {
			b, _ := io.ReadAll(r)
			if !strings.HasPrefix(string(b), p) {
				return errors.New("no mark")
			}
			return nil
		}
	}
	RegisterVerifier(Snapshot, prefix("\x80\x02memsh"))
	RegisterVerifier(Trace, prefix(`{"traceEvents"`))
}

func TestKindAndOverwrite(t *testing.T) {
	dir := t.TempDir()
	chdir(t, dir)
	pol := Default()
	if err := os.WriteFile("notes.txt", []byte("precious\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	err := pol.WriteFile("notes.txt", Snapshot, false, writeString("\x80\x02memsh x"))
	if err == nil || !strings.Contains(err.Error(), "refusing to replace") || strings.Contains(err.Error(), "precious") {
		t.Fatalf("got %v, want a refusal that quotes nothing of the file", err)
	}
	if b, _ := os.ReadFile("notes.txt"); string(b) != "precious\n" {
		t.Fatalf("the foreign file changed: %q", b)
	}
	// A snapshot replaces a snapshot; overwrite replaces anything.
	if err := pol.WriteFile("s.pickle", Snapshot, false, writeString("\x80\x02memsh one")); err != nil {
		t.Fatal(err)
	}
	if err := pol.WriteFile("s.pickle", Snapshot, false, writeString("\x80\x02memsh two")); err != nil {
		t.Fatal(err)
	}
	// a pickle memsh did not write (any protocol-2 pickle) is not replaced
	if err := os.WriteFile("model.pkl", []byte("\x80\x02}q\x00."), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := pol.WriteFile("model.pkl", Snapshot, false, writeString("\x80\x02memsh x")); err == nil {
		t.Error("a foreign pickle was replaced")
	}
	// a read-only file is refused, even with overwrite
	if err := os.WriteFile("ro.pickle", []byte("\x80\x02memsh ro"), 0o444); err != nil {
		t.Fatal(err)
	}
	{
		if err := pol.WriteFile("ro.pickle", Snapshot, true, writeString("\x80\x02memsh x")); err == nil || !strings.Contains(err.Error(), "read-only") {
			t.Errorf("read-only: got %v", err)
		}
	}
	// a path naming a directory that does not exist is no file name
	if err := pol.WriteFile("newdir/", Snapshot, false, writeString("\x80\x02memsh x")); err == nil {
		t.Error("newdir/ was written")
	}
	if _, err := os.Stat("newdir"); err == nil {
		t.Error("a file named newdir was created")
	}
	if err := pol.WriteFile("notes.txt", Snapshot, true, writeString("\x80\x02x")); err != nil {
		t.Fatal(err)
	}
	// Not a regular file: refused even with overwrite, without blocking.
	if err := syscall.Mkfifo("fifo", 0o644); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- pol.WriteFile("fifo", Snapshot, true, writeString("x")) }()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "not a regular file") {
			t.Errorf("fifo: got %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("writing over a FIFO blocked")
	}
}

// A failing writer leaves the old file whole and no temporary file.
func TestWriteFailureLeavesOldFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "t.json")
	if err := WriteFile(path, Trace, false, writeString(`{"traceEvents":[]}`)); err != nil {
		t.Fatal(err)
	}
	boom := errors.New("disk full")
	err := WriteFile(path, Trace, false, func(w io.Writer) error {
		io.WriteString(w, `{"traceEvents":[{"half`)
		return boom
	})
	if err == nil || !strings.Contains(err.Error(), "disk full") {
		t.Fatalf("got %v", err)
	}
	if b, _ := os.ReadFile(path); string(b) != `{"traceEvents":[]}` {
		t.Fatalf("file changed: %q", b)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Fatalf("temporary files left: %v", ents)
	}
	// The final component a symlink (unrestricted): the link's target is
	// written, the link kept.
	link := filepath.Join(dir, "l.json")
	if err := os.Symlink(path, link); err != nil {
		t.Fatal(err)
	}
	if err := WriteFile(link, Trace, false, writeString(`{"traceEvents":[1]}`)); err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Lstat(link); fi.Mode()&os.ModeSymlink == 0 {
		t.Error("the symlink was replaced")
	}
	if b, _ := os.ReadFile(path); string(b) != `{"traceEvents":[1]}` {
		t.Errorf("target: %q", b)
	}
}
