package main

import (
	"bytes"
	"os"
	"regexp"
	"strings"
	"testing"
)

// TestFitGPT2XL runs `memsh fit gpt2-xl --gpu H100` from a directory
// without the scripts (the model library is embedded) and checks the
// exact boundary: the reported batch fits, the next one is an OOM, both
// among the trials; and that the report names the attention it ran.
func TestFitGPT2XL(t *testing.T) {
	wd, _ := os.Getwd()
	if err := os.Chdir(t.TempDir()); err != nil {
		t.Fatal(err)
	}
	defer os.Chdir(wd)
	var out, errb bytes.Buffer
	if rc := run([]string{"fit", "gpt2-xl", "--gpu", "H100"}, strings.NewReader(""), &out, &errb); rc != 0 {
		t.Fatalf("memsh fit: exit %d\n%s\n%s", rc, out.String(), errb.String())
	}
	o := out.String()
	if !strings.Contains(o, "1,557,611,200 parameters (published 1,557,611,200: equal)") {
		t.Errorf("parameter count line missing:\n%s", o)
	}
	if !strings.Contains(o, "attention sdpa → cudnn") {
		t.Errorf("the attention is not named:\n%s", o)
	}
	m := regexp.MustCompile(`(?m)^  sequence 1024, largest batch: (\d+) \((\d+) runs out of memory\)$`).FindStringSubmatch(o)
	if m == nil {
		t.Fatalf("no result line:\n%s", o)
	}
	if !regexp.MustCompile(`(?m)^`+m[1]+` +ok `).MatchString(o) || !regexp.MustCompile(`(?m)^`+m[2]+` +oom `).MatchString(o) {
		t.Errorf("batch %s should be an ok trial and %s an oom trial:\n%s", m[1], m[2], o)
	}
	errb.Reset()
	if rc := run([]string{"fit", "no-such-model"}, strings.NewReader(""), &out, &errb); rc != 2 || !strings.Contains(errb.String(), `memsh fit: unknown model "no-such-model"`) {
		t.Errorf("an unknown model: exit %d, %s", rc, errb.String())
	}
}

// A mistyped subcommand is a usage error naming the command it was
// probably meant to be, and memsh --help lists fit first.
func TestUnknownCommand(t *testing.T) {
	wd, _ := os.Getwd()
	if err := os.Chdir(t.TempDir()); err != nil {
		t.Fatal(err)
	}
	defer os.Chdir(wd)
	var out, errb bytes.Buffer
	if rc := run([]string{"fitt", "gpt2-small"}, strings.NewReader(""), &out, &errb); rc != 2 || !strings.Contains(errb.String(), `memsh: unknown command "fitt" (did you mean "fit"?)`) {
		t.Errorf("memsh fitt: exit %d, %q", rc, errb.String())
	}
	out.Reset()
	if rc := run([]string{"--help"}, strings.NewReader(""), &out, &errb); rc != 0 || !strings.HasPrefix(out.String(), "usage: memsh fit SOURCE") {
		t.Errorf("memsh --help: exit %d:\n%s", rc, out.String())
	}
}
