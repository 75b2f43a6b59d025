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

// TestFitStarSequenceSearch runs scripts/fit.star for GPT-2 small and
// Llama 3.2 1B, batch and sequence: GPT-2's batch search trains batch 1
// at its longest sequence (1024), so the sequence search is not run and
// the row says so; Llama's sequence search starts at the batch search's
// 2048 (its first trial) and ends on an exact boundary.
func TestFitStarSequenceSearch(t *testing.T) {
	// What is tested is the search, not the reclaims (scope's tests check
	// those): under MEMSH_VERIFY_RECLAIM=1 a collection per reclaim would
	// make these 39 trials take minutes.
	t.Setenv("MEMSH_VERIFY_RECLAIM", "")
	var out, errb bytes.Buffer
	args := []string{"--device", "sim:H100,meta", "../../scripts/fit.star", "gpt2-small", "llama-3.2-1b", "--checkpoint", "off"}
	if rc := run(args, strings.NewReader(""), &out, &errb); rc != 0 {
		t.Fatalf("fit.star: exit %d\n%s\n%s", rc, out.String(), errb.String())
	}
	o := out.String()
	if strings.Contains(o, `"gpt2-small seq (batch 1)"`) || !strings.Contains(o, "gpt2-small seq (batch 1): 1024, the model's longest sequence, trains") {
		t.Errorf("GPT-2 small's sequence search should be answered by its batch search:\n%s", o)
	}
	// 41 (42 OOM): the largest batch PyTorch 2.11 trained on the H100
	// (testdata/torchref/cuda/h100_search.jsonl; TestRealGPUBoundary)
	if !regexp.MustCompile(`(?m)^gpt2-small +124\.4 M +no +1024 +41 \(42 OOM\) +1 +1024 \(no OOM up to the limit\)$`).MatchString(o) {
		t.Errorf("GPT-2 small's row:\n%s", o)
	}
	m := regexp.MustCompile(`(?s)sweep.max_fit "llama-3.2-1b seq \(batch 1\)" \(binsearch, low=2048, high=131072\)\n(?:[^\n]*\n)?s +status[^\n]*\n(\d+) +ok`).FindStringSubmatch(o)
	if m == nil || m[1] != "2048" {
		t.Errorf("Llama's sequence search should start at 2048:\n%s", o)
	}
	r := regexp.MustCompile(`(?m)^llama-3.2-1b +1235\.8 M +no +2048 +\d+ \(\d+ OOM\) +1 +(\d+) \((\d+) OOM\)$`).FindStringSubmatch(o)
	if r == nil {
		t.Fatalf("no Llama row:\n%s", o)
	}
	if !regexp.MustCompile(`(?m)^`+r[1]+` +ok `).MatchString(o) || !regexp.MustCompile(`(?m)^`+r[2]+` +oom `).MatchString(o) {
		t.Errorf("sequence %s should be an ok trial and %s an oom trial:\n%s", r[1], r[2], o)
	}
}

// TestFitStarTable runs the main job, the whole scripts/fit.star table on
// the simulated H100, and compares its output — every trial's status and
// peak, each search's boundary, the table — with testdata/fit_star.txt,
// less the trials' times (go test ./cmd/memsh -run FitStarTable -update
// rewrites it). The table runs in seconds (bench/README.md); its figures
// change only with a reviewed golden file.
func TestFitStarTable(t *testing.T) {
	t.Setenv("MEMSH_VERIFY_RECLAIM", "") // as TestFitStarSequenceSearch
	var out, errb bytes.Buffer
	if rc := run([]string{"--device", "sim:H100,meta", "../../scripts/fit.star"}, strings.NewReader(""), &out, &errb); rc != 0 {
		t.Fatalf("fit.star: exit %d\n%s\n%s", rc, out.String(), errb.String())
	}
	got := regexp.MustCompile(`(?m) +[0-9.]+ s$`).ReplaceAllString(out.String(), "")
	checkGolden(t, "testdata/fit_star.txt", got)
}
