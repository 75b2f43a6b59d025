// Package fsafe writes memsh's output files safely: every file is written
// to a temporary file in its directory, synced and renamed into place, so
// a failure (disk full, an I/O error, a kill) never leaves a torn file; an
// existing file is only replaced by a file of its own kind (a trace by a
// trace, a snapshot by a snapshot) unless the caller says overwrite; and,
// under a Policy with Roots, files are written only below those
// directories, never through a symlink that leads out of them.
//
// The confinement uses os.Root, so it holds against symlinks swapped in
// while the file is written, not only against those present when the path
// is checked.
package fsafe

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// Kind is the kind of file a writer produces, as Sniff recognizes it.
type Kind string

// The kinds memsh writes.
const (
	Records  Kind = "memsh records (JSONL)"
	Trace    Kind = "Chrome trace (JSON)"
	Snapshot Kind = "memory snapshot (pickle)"
	SVG      Kind = "SVG image"
	PNG      Kind = "PNG image"
	Log      Kind = "memsh log"
	Empty    Kind = "empty file"
	Unknown  Kind = "unrecognized content"
)

// sniffLen bounds how much of an existing file Sniff reads.
const sniffLen = 4096

// A Verifier proves that a file's whole content is one memsh wrote, of
// its kind (every record line a memsh record, a trace carrying memsh's
// mark, ...), reading it from r; its error says why not without quoting
// the content. The package that writes a kind registers its verifier.
type Verifier func(r io.Reader) error

var verifiers = map[Kind]Verifier{}

// RegisterVerifier sets the verifier of kind (packages record, trace,
// snapshot and plot register theirs in init).
func RegisterVerifier(kind Kind, v Verifier) { verifiers[kind] = v }

// maxVerify bounds the bytes a verifier is given: a bigger file is not
// proven memsh's and is refused.
const maxVerify = 1 << 30

// Verify proves that the regular file f is a file of kind memsh wrote:
// empty, or accepted by kind's verifier (a kind without one is never
// proven). The error names neither the file nor its content.
func Verify(f *os.File, kind Kind) error {
	if err := verify(f, kind); err != nil {
		return fmt.Errorf("not a %s memsh wrote: %v", kind, err)
	}
	return nil
}

// verify is Verify with the reason alone.
func verify(f *os.File, kind Kind) error {
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if !fi.Mode().IsRegular() {
		return errors.New("not a regular file")
	}
	if fi.Size() == 0 {
		return nil
	}
	v := verifiers[kind]
	if v == nil {
		return errors.New("memsh cannot prove it wrote it")
	}
	if fi.Size() > maxVerify {
		return fmt.Errorf("over %d MiB, too big to prove", maxVerify>>20)
	}
	return v(io.LimitReader(f, maxVerify))
}

// writable reports whether the existing file fi may be replaced or
// appended to by this process: not read-only.
func writable(path string, fi os.FileInfo) error {
	if fi.Mode().Perm()&0o222 == 0 {
		return fmt.Errorf("read-only (mode %v): memsh does not replace it", fi.Mode().Perm())
	}
	if err := syscall.Access(path, 2 /* W_OK */); err != nil {
		return fmt.Errorf("not writable (%v): memsh does not replace it", err)
	}
	return nil
}

// Sniff recognizes the kind of a file's content from its first bytes.
func Sniff(head []byte) Kind {
	if len(head) == 0 {
		return Empty
	}
	if bytes.HasPrefix(head, []byte("\x89PNG\r\n\x1a\n")) {
		return PNG
	}
	if len(head) >= 2 && head[0] == 0x80 && head[1] >= 2 && head[1] <= 5 {
		return Snapshot // a pickle of protocol 2 or later
	}
	t := bytes.TrimLeft(head, " \t\r\n")
	switch {
	case bytes.HasPrefix(t, []byte("<?xml")) || bytes.HasPrefix(t, []byte("<svg")):
		if bytes.Contains(t, []byte("<svg")) {
			return SVG
		}
	case bytes.HasPrefix(t, []byte(`{"traceEvents"`)):
		return Trace
	case bytes.HasPrefix(t, []byte(`{"schema":`)) || bytes.HasPrefix(t, []byte(`{"kind":"`)):
		return Records
	}
	return Unknown
}

// SniffFile reads at most the first 4 KiB of path, without blocking on a
// FIFO or a device, and returns its kind. A path that does not exist is
// an error satisfying errors.Is(err, fs.ErrNotExist); one that is not a
// regular file is an error saying so.
func SniffFile(path string) (Kind, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK|syscall.O_NOCTTY, 0)
	if err != nil {
		return "", err
	}
	defer f.Close()
	return sniffOpen(f, path)
}

func sniffOpen(f *os.File, name string) (Kind, error) {
	fi, err := f.Stat()
	if err != nil {
		return "", err
	}
	if !fi.Mode().IsRegular() {
		return "", fmt.Errorf("%s: not a regular file", name)
	}
	head := make([]byte, sniffLen)
	n, err := io.ReadFull(f, head)
	if err != nil && err != io.EOF && err != io.ErrUnexpectedEOF {
		return "", err
	}
	return Sniff(head[:n]), nil
}

// Policy says where builtins may write files. The zero Policy (no Roots)
// allows any directory: it is what memsh uses for the paths given on its
// command line. A nil *Policy is the working directory only (Default).
type Policy struct {
	// Roots are the directories files may be written under (the working
	// directory and --out-dir). Relative roots are taken from the working
	// directory when the Policy is used.
	Roots []string
}

// Default is the policy of a session without --out-dir: the working
// directory.
func Default() *Policy { return &Policy{Roots: []string{"."}} }

// target is where a path resolves: a directory opened as an os.Root and
// the file's name relative to it.
type target struct {
	root *os.Root
	rel  string
	name string // the path as the user gave it, for messages
}

// resolve finds the root a path belongs to. Symlinks in the path are
// resolved first, so a path through a link that stays inside a root is
// allowed and one that leads out is refused.
func (p *Policy) resolve(path string) (*target, error) {
	if p == nil {
		p = Default()
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, err
	}
	if len(p.Roots) == 0 {
		// Unrestricted: the file's own directory, a final symlink followed.
		if real, err := filepath.EvalSymlinks(abs); err == nil {
			abs = real
		}
		root, err := os.OpenRoot(filepath.Dir(abs))
		if err != nil {
			return nil, fmt.Errorf("%s: %v", path, unwrapPath(err))
		}
		return &target{root: root, rel: filepath.Base(abs), name: path}, nil
	}
	real, err := evalParent(abs)
	if err != nil {
		if !p.lexicallyInside(abs) {
			return nil, p.outside(path)
		}
		return nil, fmt.Errorf("%s: %v", path, unwrapPath(err))
	}
	for _, r := range p.Roots {
		ra, err := filepath.Abs(r)
		if err != nil {
			continue
		}
		if rr, err := filepath.EvalSymlinks(ra); err == nil {
			ra = rr
		}
		rel, err := filepath.Rel(ra, real)
		if err != nil || rel == "." || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
			continue
		}
		root, err := os.OpenRoot(ra)
		if err != nil {
			return nil, err
		}
		return &target{root: root, rel: rel, name: path}, nil
	}
	return nil, p.outside(path)
}

func (p *Policy) outside(path string) error {
	return fmt.Errorf("%s: outside the directories a script may write to (%s)", path, p.describe())
}

// lexicallyInside reports whether abs is under a root, symlinks aside.
func (p *Policy) lexicallyInside(abs string) bool {
	for _, r := range p.Roots {
		ra, err := filepath.Abs(r)
		if err != nil {
			continue
		}
		if rel, err := filepath.Rel(ra, abs); err == nil && rel != ".." && !strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
			return true
		}
	}
	return false
}

func (p *Policy) describe() string {
	var ds []string
	for _, r := range p.Roots {
		if a, err := filepath.Abs(r); err == nil {
			r = a
		}
		ds = append(ds, r)
	}
	return strings.Join(ds, ", ")
}

// evalParent resolves the symlinks of abs's directory, and of abs itself
// when it is a symlink (one to nothing yet too: where the file would be
// created).
func evalParent(abs string) (string, error) {
	for range 40 {
		fi, err := os.Lstat(abs)
		if err != nil || fi.Mode()&os.ModeSymlink == 0 {
			break
		}
		to, err := os.Readlink(abs)
		if err != nil {
			return "", err
		}
		if !filepath.IsAbs(to) {
			to = filepath.Join(filepath.Dir(abs), to)
		}
		abs = filepath.Clean(to)
	}
	dir, err := filepath.EvalSymlinks(filepath.Dir(abs))
	if err != nil {
		return "", err
	}
	return filepath.Join(dir, filepath.Base(abs)), nil
}

// Check reports whether path may be written with a file of kind: it is
// inside the policy's roots and, if it exists, is a regular file holding
// kind (or empty), or overwrite is set.
func (p *Policy) Check(path string, kind Kind, overwrite bool) error {
	t, err := p.resolve(path)
	if err != nil {
		return err
	}
	defer t.root.Close()
	return t.check(kind, overwrite)
}

func (t *target) check(kind Kind, overwrite bool) error {
	fi, err := t.root.Lstat(t.rel)
	if errors.Is(err, os.ErrNotExist) {
		if strings.HasSuffix(t.name, string(filepath.Separator)) {
			return fmt.Errorf("%s: names a directory that does not exist, not a file", t.name)
		}
		return nil
	}
	if err != nil {
		return fmt.Errorf("%s: %v", t.name, unwrapPath(err))
	}
	if fi.IsDir() {
		return fmt.Errorf("%s: a directory, not a file", t.name)
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("%s: not a regular file", t.name)
	}
	if err := writable(filepath.Join(t.root.Name(), t.rel), fi); err != nil {
		return fmt.Errorf("%s: %v", t.name, err)
	}
	if overwrite {
		return nil
	}
	f, err := t.root.OpenFile(t.rel, os.O_RDONLY|syscall.O_NONBLOCK|syscall.O_NOCTTY, 0)
	if err != nil {
		return fmt.Errorf("%s: %v", t.name, unwrapPath(err))
	}
	defer f.Close()
	if err := verify(f, kind); err != nil {
		return fmt.Errorf("%s: refusing to replace an existing file that is not a %s memsh wrote (%v); overwrite=True (a builtin's) or --force (memsh's command line) replaces it", t.name, kind, err)
	}
	return nil
}

// File is an output file being written: a temporary file next to its
// final name. Commit syncs it and renames it into place; Abort removes it.
// Exactly one of them must be called.
type File struct {
	*os.File
	t   *target
	tmp string
}

// Create checks path (see Check) and starts writing it.
func (p *Policy) Create(path string, kind Kind, overwrite bool) (*File, error) {
	t, err := p.resolve(path)
	if err != nil {
		return nil, err
	}
	if err := t.check(kind, overwrite); err != nil {
		t.root.Close()
		return nil, err
	}
	var rnd [6]byte
	_, _ = rand.Read(rnd[:])
	tmp := filepath.Join(filepath.Dir(t.rel), "."+filepath.Base(t.rel)+".memsh-"+hex.EncodeToString(rnd[:]))
	f, err := t.root.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		t.root.Close()
		return nil, fmt.Errorf("%s: %v", path, err)
	}
	return &File{File: f, t: t, tmp: tmp}, nil
}

// Commit flushes the file to disk and renames it over the final name.
func (f *File) Commit() error {
	defer f.t.root.Close()
	err := f.File.Sync()
	if cerr := f.File.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = f.t.root.Rename(f.tmp, f.t.rel)
	}
	if err != nil {
		_ = f.t.root.Remove(f.tmp)
		return fmt.Errorf("%s: %v", f.t.name, unwrapPath(err))
	}
	if d, err := f.t.root.Open(filepath.Dir(f.t.rel)); err == nil {
		_ = d.Sync() // make the rename durable; not all file systems can
		d.Close()
	}
	return nil
}

// Abort removes the temporary file, leaving the final name as it was.
func (f *File) Abort() {
	f.File.Close()
	_ = f.t.root.Remove(f.tmp)
	f.t.root.Close()
}

// WriteFile writes path with write (see Create): the file appears whole
// or not at all.
func (p *Policy) WriteFile(path string, kind Kind, overwrite bool, write func(io.Writer) error) error {
	f, err := p.Create(path, kind, overwrite)
	if err != nil {
		return err
	}
	if err := write(f); err != nil {
		f.Abort()
		return fmt.Errorf("%s: %v", path, unwrapPath(err))
	}
	return f.Commit()
}

// WriteFile writes path, anywhere, with write: the file appears whole or
// not at all, and an existing file is replaced only if memsh wrote it as
// kind (proven by its verifier) or overwrite is true (--force).
func WriteFile(path string, kind Kind, overwrite bool, write func(io.Writer) error) error {
	return (&Policy{}).WriteFile(path, kind, overwrite, write)
}

// unwrapPath drops an *os.PathError's operation and temporary name, so
// messages name the user's path once.
func unwrapPath(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	var le *os.LinkError
	if errors.As(err, &le) {
		return le.Err
	}
	return err
}

// OpenRegular opens path for reading only if it is a regular file: a
// FIFO, a device or a directory is an error saying so, and opening one
// never blocks (O_NONBLOCK, checked with fstat on the file opened).
func OpenRegular(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK|syscall.O_NOCTTY, 0)
	if err != nil {
		return nil, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	if fi.IsDir() {
		f.Close()
		return nil, fmt.Errorf("%s: a directory, not a file", path)
	}
	if !fi.Mode().IsRegular() {
		f.Close()
		return nil, fmt.Errorf("%s: not a regular file", path)
	}
	return f, nil
}

// OpenAppend opens path for appending lines of kind: a new file is
// created holding header; an existing one must be a regular, writable file
// that Verify proves of kind (a FIFO, a device, a directory, a read-only
// file or any other content is refused, untouched, with the reason). The
// open never blocks.
func OpenAppend(path string, kind Kind, header []byte) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_APPEND|os.O_CREATE|syscall.O_NONBLOCK|syscall.O_NOCTTY, 0o644)
	if err != nil {
		var pe *os.PathError
		if errors.As(err, &pe) && errors.Is(pe.Err, syscall.EISDIR) {
			return nil, fmt.Errorf("%s: a directory, not a file", path)
		}
		return nil, fmt.Errorf("%s: %v", path, unwrapPath(err))
	}
	fi, err := f.Stat()
	switch {
	case err != nil:
		f.Close()
		return nil, fmt.Errorf("%s: %v", path, err)
	case !fi.Mode().IsRegular():
		f.Close()
		return nil, fmt.Errorf("%s: not a regular file", path)
	}
	if err := writable(path, fi); err != nil {
		f.Close()
		return nil, fmt.Errorf("%s: %v", path, err)
	}
	if fi.Size() == 0 {
		if _, err := f.Write(header); err != nil {
			f.Close()
			return nil, fmt.Errorf("%s: %v", path, unwrapPath(err))
		}
		return f, nil
	}
	if err := verify(f, kind); err != nil {
		f.Close()
		return nil, fmt.Errorf("%s: refusing to append to an existing file that is not a %s (%v)", path, kind, err)
	}
	return f, nil
}
