package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestLogFlag(t *testing.T) {
	code := "x = tensor.zeros([1024, 1024], device='cuda')\ny = 1"
	for _, tc := range []struct {
		args  []string
		rc    int
		want  string // in stderr
		lines int    // log lines expected
	}{
		{[]string{"--log"}, 0, "･ cuda:0:     4.00 MiB         0 B    4.00 MiB |\n", 6},
		{[]string{"--log=compact"}, 0, "cuda:0: 4.00 MiB/0 B/4.00 MiB | Time ", 2},
		{[]string{"--log=on"}, 0, "･ RAM:", 6},
		{[]string{"--log=false"}, 0, "", 0},
		{nil, 0, "", 0},
	} {
		var out, errb bytes.Buffer
		args := append(append([]string{"--device", "sim:1GiB"}, tc.args...), "-c", code)
		if rc := run(args, strings.NewReader(""), &out, &errb); rc != tc.rc {
			t.Errorf("%v: rc %d, stderr %s", tc.args, rc, errb.String())
		}
		if out.Len() != 0 {
			t.Errorf("%v: stdout is not the script's: %q", tc.args, out.String())
		}
		if !strings.Contains(errb.String(), tc.want) {
			t.Errorf("%v: stderr lacks %q:\n%s", tc.args, tc.want, errb.String())
		}
		if n := strings.Count(errb.String(), "\n"); n != tc.lines {
			t.Errorf("%v: %d lines, want %d:\n%s", tc.args, n, tc.lines, errb.String())
		}
	}
	var out, errb bytes.Buffer
	if rc := run([]string{"--log=loud", "-c", "1"}, strings.NewReader(""), &out, &errb); rc != 2 || !strings.Contains(errb.String(), "want --log or --log=compact") {
		t.Errorf("--log=loud: rc %d, stderr %s", rc, errb.String())
	}
}

// --log-file sends the lines to a file; stdout and stderr stay clean.
func TestLogFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "mem.log")
	var out, errb bytes.Buffer
	rc := run([]string{"--device", "sim:1GiB", "--log=compact", "--log-file", path, "-c", "print(1)\ny = 2"}, strings.NewReader(""), &out, &errb)
	b, _ := os.ReadFile(path)
	if rc != 0 || out.String() != "1\n" || errb.Len() != 0 || strings.Count(string(b), "\n") != 3 || !strings.HasPrefix(string(b), "# memsh log 1\n") || !strings.Contains(string(b), "<cmd>:2") {
		t.Errorf("rc %d stdout %q stderr %q file %q", rc, out.String(), errb.String(), b)
	}
	if rc := run([]string{"--log-file", path, "-c", "1"}, strings.NewReader(""), &out, &errb); rc != 2 {
		t.Errorf("--log-file without --log: rc %d", rc)
	}
}
