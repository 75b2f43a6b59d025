package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestCLI(t *testing.T) {
	dir := t.TempDir()
	script := filepath.Join(dir, "s.star")
	if err := os.WriteFile(script, []byte("print('args', argv)\nx = tensor.zeros([4], device='cuda')\nprint(x.device)\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	bad := filepath.Join(dir, "bad.star")
	if err := os.WriteFile(bad, []byte("def f():\n    return 1 // 0\nf()\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		args    []string
		stdin   string
		rc      int
		out     string // substring of stdout
		errText string // substring of stderr
	}{
		{"version", []string{"version"}, "", 0, "memsh ", ""},
		{"devices", []string{"--device", "sim:2x8GiB", "devices"}, "", 0, "cuda:1", ""},
		{"devices preset", []string{"--device", "sim:2xH100", "devices"}, "", 0, "NVIDIA H100 80GB HBM3", ""},
		{"devices bad arg", []string{"devices", "--nope"}, "", 2, "", "usage: memsh devices [--presets]"},
		{"unknown preset", []string{"--device", "sim:B200", "-c", "1"}, "", 1, "", "unknown GPU preset \"B200\" (known: A100-40GB"},
		{"devices auto notice", []string{"devices"}, "", 0, "simulated GPU", "using the simulator"},
		{"code", []string{"--device", "sim:1GiB", "-c", "print(cuda.device_count(), argv)", "a"}, "", 0, `1 ["a"]`, ""},
		{"script with args", []string{"--device", "sim:1GiB", script, "x", "y"}, "", 0, "args [\"x\", \"y\"]\ncuda:0", ""},
		{"script error", []string{"--device", "sim:1GiB", bad}, "", 1, "", "bad.star:2:14: in f"},
		{"missing script", []string{"--device", "sim:1GiB", filepath.Join(dir, "nope.star")}, "", 1, "", "no such file"},
		{"bad device", []string{"--device", "tpu", "-c", "1"}, "", 1, "", "unknown device \"tpu\""},
		{"bad peak", []string{"--peak", "eager", "-c", "1"}, "", 2, "", "unknown peak mode"},
		{"bad flag", []string{"--nope"}, "", 2, "", "flag provided but not defined"},
		{"piped script", []string{"--device", "sim:1GiB"}, "def f():\n    x = 6\n\n    return x * 7\n\nprint(f())\n", 0, "42", ""},
		{"piped script error", []string{"--device", "sim:1GiB"}, "x = 1\n1 // 0\n", 1, "", "<stdin>:2:3"},
		{"dash script args", []string{"--device", "sim:1GiB", "-", "a"}, "print(argv)\n", 0, `["a"]`, ""},
		{"help flag", []string{"--help"}, "", 0, "usage: memsh", ""},
		{"h flag", []string{"-h"}, "", 0, "-max-steps", ""},
		{"help command", []string{"help"}, "", 0, "usage: memsh", ""},
		{"version flag", []string{"--version"}, "", 0, "commit ", ""},
		{"interactive after script", []string{"--device", "sim:1GiB", "-i", script}, "x.shape\n", 0, "(4,)", ""},
		{"quiet", []string{"--device", "sim:1GiB", "--quiet", "-c", "e = experiment()\ne.finish()"}, "", 0, "", ""},
		{"cpu only", []string{"--device", "cpu", "-c", "print(cuda.is_available())"}, "", 0, "False", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out, errb bytes.Buffer
			rc := run(tc.args, strings.NewReader(tc.stdin), &out, &errb)
			if rc != tc.rc {
				t.Errorf("rc = %d, want %d\nstdout: %s\nstderr: %s", rc, tc.rc, out.String(), errb.String())
			}
			if !strings.Contains(out.String(), tc.out) {
				t.Errorf("stdout lacks %q:\n%s", tc.out, out.String())
			}
			if !strings.Contains(errb.String(), tc.errText) {
				t.Errorf("stderr lacks %q:\n%s", tc.errText, errb.String())
			}
			if tc.name == "quiet" && out.Len() != 0 {
				t.Errorf("--quiet printed %q", out.String())
			}
		})
	}
}

// Ctrl-C (SIGINT) during a script interrupts the running statement: memsh
// prints the traceback and exits 130 after its cleanups, instead of dying.
func TestScriptInterrupt(t *testing.T) {
	script := filepath.Join(t.TempDir(), "loop.star")
	if err := os.WriteFile(script, []byte("n = 0\nwhile True:\n    n += 1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	go func() {
		time.Sleep(500 * time.Millisecond) // the loop is running by then
		_ = syscall.Kill(os.Getpid(), syscall.SIGINT)
	}()
	var out, errb bytes.Buffer
	rc := run([]string{"--device", "sim:1GiB", script}, strings.NewReader(""), &out, &errb)
	if rc != 130 || !strings.Contains(errb.String(), "interrupted") || !strings.Contains(errb.String(), "loop.star:") {
		t.Errorf("rc = %d, stderr:\n%s", rc, errb.String())
	}
}

// --load-path adds load roots: repeated, or as a path list; a module
// outside every root is refused; a bad directory is a usage error.
func TestLoadPathFlag(t *testing.T) {
	dir := t.TempDir()
	libA, libB, main := filepath.Join(dir, "a"), filepath.Join(dir, "b"), filepath.Join(dir, "main")
	for _, d := range []string{libA, libB, main} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	write := func(p, src string) {
		if err := os.WriteFile(p, []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(filepath.Join(libA, "a.star"), "A = 'from a'\n")
	write(filepath.Join(libB, "b.star"), "B = 'from b'\n")
	script := filepath.Join(main, "s.star")
	write(script, "load('a.star', 'A')\nload('b.star', 'B')\nprint(A, B)\n")
	list := libA + string(filepath.ListSeparator) + libB
	for _, tc := range []struct {
		name    string
		args    []string
		rc      int
		out     string
		errText string
	}{
		{"repeated", []string{"--load-path", libA, "--load-path=" + libB, script}, 0, "from a from b", ""},
		{"list", []string{"--load-path", list, script}, 0, "from a from b", ""},
		{"-c", []string{"--load-path", list, "-c", "load('b.star', 'B'); print(B)"}, 0, "from b", ""},
		{"missing root", []string{"--load-path", libA, script}, 1, "", "cannot load b.star"},
		{"not a directory", []string{"--load-path", script, script}, 2, "", "--load-path " + script + ": not a directory"},
		{"no such directory", []string{"--load-path", filepath.Join(dir, "nope"), script}, 2, "", "no such file or directory"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out, errb bytes.Buffer
			rc := run(append([]string{"--device", "sim:1GiB"}, tc.args...), strings.NewReader(""), &out, &errb)
			if rc != tc.rc || !strings.Contains(out.String(), tc.out) || !strings.Contains(errb.String(), tc.errText) {
				t.Errorf("rc %d (want %d)\nstdout: %s\nstderr: %s", rc, tc.rc, out.String(), errb.String())
			}
		})
	}
	var p pathList
	for _, v := range []string{libA, list, ""} {
		_ = p.Set(v)
	}
	if want := []string{libA, libA, libB}; strings.Join(p, "|") != strings.Join(want, "|") {
		t.Errorf("pathList %q, want %q", p, want)
	}
}

// The REPL banner's version is the one --version prints first.
func TestVersionNumber(t *testing.T) {
	if v := versionNumber(); !strings.HasPrefix(versionString(), v+" commit ") {
		t.Errorf("versionNumber %q, versionString %q", v, versionString())
	}
}
