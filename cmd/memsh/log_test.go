package main

import (
	"bytes"
	"strings"
	"testing"
)

func TestLogFlag(t *testing.T) {
	code := "x = tensor.zeros([1024, 1024], device='cuda')\ny = 1"
	for _, tc := range []struct {
		args  []string
		rc    int
		want  string // in stdout
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
		if !strings.Contains(out.String(), tc.want) {
			t.Errorf("%v: stdout lacks %q:\n%s", tc.args, tc.want, out.String())
		}
		if n := strings.Count(out.String(), "\n"); n != tc.lines {
			t.Errorf("%v: %d lines, want %d:\n%s", tc.args, n, tc.lines, out.String())
		}
	}
	var out, errb bytes.Buffer
	if rc := run([]string{"--log=loud", "-c", "1"}, strings.NewReader(""), &out, &errb); rc != 2 || !strings.Contains(errb.String(), "want --log or --log=compact") {
		t.Errorf("--log=loud: rc %d, stderr %s", rc, errb.String())
	}
}
