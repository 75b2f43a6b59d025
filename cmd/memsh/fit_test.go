package main

import (
	"bytes"
	"os"
	"regexp"
	"strings"
	"testing"
)

// TestFitGPT2XL runs `memsh fit gpt2-xl --gpu H100` from a directory
// without the scripts (fit.star and scripts/models are embedded) and
// checks the exact boundary: the reported batch fits, the next one is an
// OOM, both among the trials.
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
	if !strings.Contains(o, "gpt2-xl: 1557611200 parameters (published 1557611200: equal)") {
		t.Errorf("parameter count line missing:\n%s", o)
	}
	m := regexp.MustCompile(`(?m)^gpt2-xl +1557\.6 M +no +1024 +(\d+) \((\d+) OOM\)`).FindStringSubmatch(o)
	if m == nil {
		t.Fatalf("no result row:\n%s", o)
	}
	if !regexp.MustCompile(`(?m)^`+m[1]+` +ok `).MatchString(o) || !regexp.MustCompile(`(?m)^`+m[2]+` +oom `).MatchString(o) {
		t.Errorf("batch %s should be an ok trial and %s an oom trial:\n%s", m[1], m[2], o)
	}
	if rc := run([]string{"fit", "no-such-model"}, strings.NewReader(""), &out, &errb); rc == 0 {
		t.Error("an unknown model should fail")
	}
}
