package scope_test

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/fstest"

	"go.starlark.net/starlark"

	"github.com/memsh/memsh/scope"
)

// backtraceHas reports whether one of err's chain of Starlark errors has
// a backtrace containing s.
func backtraceHas(err error, s string) bool {
	for ; err != nil; err = errors.Unwrap(err) {
		if ee, ok := err.(*starlark.EvalError); ok && strings.Contains(ee.Backtrace(), s) {
			return true
		}
	}
	return false
}

// load() falls back to the library (Options.Library: memsh's embedded
// model library) for a relative module the load roots do not have; the
// library's modules load from the library only; a file on disk of the
// same name wins for the user's own loads.
func TestLoadLibrary(t *testing.T) {
	lib := fstest.MapFS{
		"models/a.star":    {Data: []byte("load('models/b.star', 'b')\na = b + 1\n")},
		"models/b.star":    {Data: []byte("b = 41\n")},
		"models/bad.star":  {Data: []byte("load('local.star', 'x')\n")},
		"models/fail.star": {Data: []byte("def f():\n    fail('boom')\nf()\n")},
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "local.star"), []byte("x = 1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	run := libRunner(t, dir, lib)
	if out, err := run("load('models/a.star', 'a')\nprint(a)\n"); err != nil || out != "42\n" {
		t.Fatalf("library load: %q, %v", out, err)
	}
	// a library module cannot reach the user's files
	if _, err := run("load('models/bad.star', 'x')\n"); err == nil || !strings.Contains(err.Error(), "no such module in memsh's library") {
		t.Errorf("library module loading a disk file: %v", err)
	}
	// tracebacks name library files memsh:PATH
	if _, err := run("load('models/fail.star', 'f')\n"); !backtraceHas(err, "memsh:models/fail.star:2:9: in f") {
		t.Errorf("traceback through a library module: %v", err)
	}
	// a file on disk shadows the library's for the user's own loads
	if err := os.MkdirAll(filepath.Join(dir, "models"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "models", "b.star"), []byte("b = 7\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := run("load('models/b.star', 'b')\nload('models/a.star', 'a')\nprint(b, a)\n"); err != nil || out != "7 42\n" {
		t.Errorf("disk before library, library modules from the library: %q, %v", out, err)
	}
	if _, err := run("load('models/none.star', 'x')\n"); err == nil || !strings.Contains(err.Error(), "nor in memsh's library") {
		t.Errorf("missing module: %v", err)
	}
}

// A .json module (the library's published configs, a user's config.json)
// loads as one member, data: its value as json.decode gives it, frozen;
// a file that is not JSON is an error that does not quote it.
func TestLoadJSON(t *testing.T) {
	lib := fstest.MapFS{
		"models/configs/tiny.json": {Data: []byte(`{"model_type": "llama", "hidden_size": 64, "layer_types": ["full_attention"]}`)},
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "secret.json"), []byte("{\"token\": \"hunter2\",\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	run := libRunner(t, dir, lib)
	out, err := run(`load("models/configs/tiny.json", cfg = "data")
print(cfg["model_type"], cfg["hidden_size"], cfg["layer_types"])
`)
	if err != nil || out != "llama 64 [\"full_attention\"]\n" {
		t.Fatalf("library JSON: %q, %v", out, err)
	}
	if _, err := run(`load("models/configs/tiny.json", cfg = "data")
cfg["hidden_size"] = 1
`); err == nil || !strings.Contains(err.Error(), "frozen") {
		t.Errorf("a loaded JSON value is frozen: %v", err)
	}
	_, err = run(`load("secret.json", "data")` + "\n")
	if err == nil || !strings.Contains(err.Error(), "cannot load secret.json: not a valid JSON file") || strings.Contains(err.Error(), "hunter2") {
		t.Errorf("a bad JSON file: %v", err)
	}
}

// libRunner returns a function that writes src to dir/main.star and runs
// it in a new Session with the library lib: its output and error.
func libRunner(t *testing.T, dir string, lib fstest.MapFS) func(src string) (string, error) {
	main := filepath.Join(dir, "main.star")
	return func(src string) (string, error) {
		if err := os.WriteFile(main, []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
		var out bytes.Buffer
		s, err := scope.New(scope.Options{Device: "sim:1GiB", Out: &out, Err: &out, Library: lib})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		err = s.Exec(main, nil)
		return out.String(), err
	}
}
