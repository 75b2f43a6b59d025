package main

import (
	"bytes"
	"regexp"
	"strings"
	"testing"
)

// scripts/fit.star's rows are `memsh fit`'s answers: for Qwen2.5 0.5B on
// the H100 preset, each row's largest batch (and its first OOM) equals
// what `memsh fit` finds for the same options — full training with and
// without checkpointing, LoRA, QLoRA (checkpointed, as
// prepare_model_for_kbit_training sets it) and generation.
func TestFitScriptAgreesWithFit(t *testing.T) {
	if testing.Short() {
		t.Skip("runs eleven searches")
	}
	var stdout, stderr bytes.Buffer
	args := []string{"--quiet", "--device", "sim:H100,meta", "../../scripts/fit.star", "qwen2.5-0.5b",
		"--what", "batch", "--prompt", "256", "--max-new-tokens", "8"}
	if rc := run(args, nil, &stdout, &stderr); rc != 0 {
		t.Fatalf("fit.star: rc %d\n%s\n%s", rc, stdout.String(), stderr.String())
	}
	rowRE := regexp.MustCompile(`(?m)^qwen2\.5-0\.5b +[0-9.]+ M +(\w+) +(yes|no) +\d+ +(\d+ \(\d+ OOM\))`)
	rows := map[string]string{}
	for _, m := range rowRE.FindAllStringSubmatch(stdout.String(), -1) {
		rows[m[1]+" "+m[2]] = m[3]
	}
	fitRE := regexp.MustCompile(`largest batch: (\d+) \((\d+) runs out of memory\)`)
	for _, c := range []struct {
		row  string
		args []string
	}{
		{"inference no", []string{"--inference", "--seq", "256", "--max-new-tokens", "8"}},
		{"full no", nil},
		{"full yes", []string{"--checkpoint"}},
		{"lora no", []string{"--finetune", "lora"}},
		{"qlora yes", []string{"--finetune", "qlora"}},
	} {
		got, ok := rows[c.row]
		if !ok {
			t.Errorf("fit.star has no %q row:\n%s", c.row, stdout.String())
			continue
		}
		var out, errb bytes.Buffer
		// fit.star searches by interpolation by default: so does fit here
		if rc := run(append([]string{"fit", "qwen2.5-0.5b", "--search-mode", "interpolate"}, c.args...), nil, &out, &errb); rc != 0 {
			t.Fatalf("fit %s: rc %d\n%s", strings.Join(c.args, " "), rc, errb.String())
		}
		m := fitRE.FindStringSubmatch(out.String())
		if m == nil {
			t.Fatalf("fit %s: no largest batch in\n%s", strings.Join(c.args, " "), out.String())
		}
		if want := m[1] + " (" + m[2] + " OOM)"; got != want {
			t.Errorf("%s: fit.star %s, memsh fit %s", c.row, got, want)
		}
	}
}
