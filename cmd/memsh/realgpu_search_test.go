package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"
)

// cardTrial is one trial of a search PyTorch ran on a card.
type cardTrial struct {
	n  int
	ok bool
}

// cardSearch reads the trials of model's search (checkpoint ckpt) from a
// golden search file, in the order the card ran them, up to the line
// that gives its boundary (later lines of the same model are another
// search).
func cardSearch(t *testing.T, file, model string, ckpt bool) []cardTrial {
	t.Helper()
	data, err := os.ReadFile(realGPUDir + file)
	if err != nil {
		t.Fatal(err)
	}
	var out []cardTrial
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		var r struct {
			Model        string `json:"model"`
			Checkpoint   bool   `json:"checkpoint"`
			Batch        *int   `json:"batch"`
			Seq          int    `json:"seq"`
			Fits         *bool  `json:"fits"`
			LargestBatch *int   `json:"largest_batch"`
			FirstOOM     *int   `json:"first_oom"`
		}
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatal(err)
		}
		if r.Model != model || r.Checkpoint != ckpt {
			continue
		}
		if r.Fits == nil {
			if r.FirstOOM != nil {
				return out
			}
			continue
		}
		n := r.Seq
		if strings.Contains(file, "_search") && !strings.Contains(file, "seq_search") {
			n = *r.Batch
		}
		out = append(out, cardTrial{n, *r.Fits})
	}
	if len(out) == 0 {
		t.Fatalf("%s: no search of %s (checkpoint %v)", file, model, ckpt)
	}
	return out
}

var trialRow = regexp.MustCompile(`(?m)^(\d+) +(ok|oom) `)

// fitTrials runs memsh with args and returns the trials of the search
// whose table's header contains search (the first search when "").
func fitTrials(t *testing.T, search string, args ...string) []cardTrial {
	t.Helper()
	var out, errb bytes.Buffer
	if rc := run(args, strings.NewReader(""), &out, &errb); rc != 0 {
		t.Fatalf("memsh %v: exit %d\n%s\n%s", args, rc, out.String(), errb.String())
	}
	o := out.String()
	if i := strings.Index(o, "sweep.max_fit"+search); i >= 0 {
		o = o[i:]
	}
	if i := strings.Index(o[1:], "sweep.max_fit"); i >= 0 {
		o = o[:i+1]
	}
	var got []cardTrial
	for _, m := range trialRow.FindAllStringSubmatch(o, -1) {
		var n int
		fmt.Sscan(m[1], &n)
		got = append(got, cardTrial{n, m[2] == "ok"})
	}
	return got
}

func trialsText(ts []cardTrial) string {
	var b strings.Builder
	for _, x := range ts {
		fmt.Fprintf(&b, " %d:%s", x.n, map[bool]string{true: "ok", false: "oom"}[x.ok])
	}
	return b.String()
}

// TestRealGPUSearches: memsh on a card's preset makes the search PyTorch
// 2.11 made on the card, trial for trial — every size it tried, in the
// order it tried them, fits or runs out of memory as it did on the card.
// memsh fit (its searches replay what they can): GPT-2 small on the H100
// and the H200, with and without activation checkpointing, the card's
// math attention (--attention eager; h100_search.jsonl,
// h200_search.jsonl), the ResNets (h100_models_search.jsonl); the
// card's own Llama 3.2 1B (models/llama.star, which scripts/fit.star
// searched until it took the Hugging Face configs: llamaSearchScript,
// its trial and its searches as fit.star made them): its batch at
// sequence 2048 and its longest sequence at batch 1. Where memsh's search differs
// from the card's, the trials that differ are the ones README and
// bench/README.md name, with why: this test fails when they change.
func TestRealGPUSearches(t *testing.T) {
	for _, tc := range []struct {
		file, model, gpu string
		ckpt             bool
		// star: the card's own Llama (models/llama.star, not Hugging
		// Face's), by llamaSearchScript; seq: its sequence search at
		// batch 1
		star, seq bool
		// differ lists the sizes whose status memsh does not share with
		// the card (then memsh's own search is not compared further)
		differ []int
	}{
		{"h100_search.jsonl", "gpt2-small", "H100", false, false, false, nil},
		{"h100_search.jsonl", "gpt2-small", "H100", true, false, false, nil},
		{"h200_search.jsonl", "gpt2-small", "H200", false, false, false, nil},
		{"h200_search.jsonl", "gpt2-small", "H200", true, false, false, nil},
		{"h100_models_search.jsonl", "llama-3.2-1b", "H100", false, true, false, nil},
		{"h100_models_search.jsonl", "llama-3.2-1b", "H100", true, true, false, nil},
		{"h100_models_search.jsonl", "resnet18", "H100", false, false, false, nil},
		// cuDNN's convolution workspaces, which memsh does not model
		{"h100_models_search.jsonl", "resnet18", "H100", true, false, false, []int{8704}},
		{"h100_models_search.jsonl", "resnet50", "H100", false, false, false, []int{1864}},
		{"h100_models_search.jsonl", "resnet50", "H100", true, false, false, []int{4096}},
		// the longest sequence at batch 1: not established (README)
		{"h100_models_seq_search.jsonl", "llama-3.2-1b", "H100", false, true, true, []int{18096}},
		{"h100_models_seq_search.jsonl", "llama-3.2-1b", "H100", true, true, true, []int{30472}},
	} {
		want := cardSearch(t, tc.file, tc.model, tc.ckpt)
		model := strings.TrimPrefix(tc.model, "hf-")
		args := []string{"fit", model, "--gpu", tc.gpu}
		if !strings.HasPrefix(model, "resnet") {
			args = append(args, "--attention", "eager") // the card's math attention
		}
		if tc.ckpt {
			args = append(args, "--checkpoint")
		}
		search := ""
		if tc.star {
			what := "batch"
			search = ` "` + tc.model + map[bool]string{true: " ckpt", false: ""}[tc.ckpt] + ` batch`
			if tc.seq {
				// as the card's: from the sequence the batch search
				// trained batch 1 at (2048)
				what = "both"
				search = ` "` + tc.model + map[bool]string{true: " ckpt", false: ""}[tc.ckpt] + ` seq (batch 1)"`
			}
			args = []string{"--device", "sim:" + tc.gpu + ",meta", "--load-path", "../../scripts", "-c", llamaSearchScript(tc.ckpt, what == "both")}
		}
		got := fitTrials(t, search, args...)
		var differ []int
		for i, w := range want {
			if i >= len(got) {
				t.Errorf("memsh fit %v: %d trials, the card's search %d:%s", args, len(got), len(want), trialsText(want))
				break
			}
			if got[i].n != w.n {
				t.Errorf("memsh fit %v: trial %d is %d, the card's %d\n memsh:%s\n card: %s", args, i, got[i].n, w.n, trialsText(got), trialsText(want))
				break
			}
			if got[i].ok != w.ok {
				differ = append(differ, w.n)
				break
			}
		}
		if fmt.Sprint(differ) != fmt.Sprint(tc.differ) {
			t.Errorf("memsh fit %v: trials whose status differs from the card's: %v, want %v\n memsh:%s\n card: %s", args, differ, tc.differ, trialsText(got), trialsText(want))
		} else if len(differ) == 0 && len(got) != len(want) {
			t.Errorf("memsh fit %v: %d trials, the card's search %d\n memsh:%s\n card: %s", args, len(got), len(want), trialsText(got), trialsText(want))
		}
	}
}

// llamaSearchScript is the card's own Llama 3.2 1B (models/llama.star)
// trained and searched as scripts/fit.star did before it took the
// Hugging Face configs: two steps of bf16 autocast forward and cross
// entropy (the logits upcast to float32), backward, AdamW(lr=1e-4) and
// zero_grad(set_to_none=True) per trial; its batch at sequence 2048 and,
// with seq, its longest sequence at batch 1 from 2048, each search as
// fit.star's (binsearch, search="layout", fresh="search", replay=True,
// named as fit.star named them).
func llamaSearchScript(ckpt, seq bool) string {
	py := map[bool]string{true: "True", false: "False"}
	tag := "llama-3.2-1b" + map[bool]string{true: " ckpt", false: ""}[ckpt]
	return trainDefs(`load("models/llama.star", "llama", "LLAMA_3_2_1B")`, `llama(device = "cuda", checkpoint = CKPT, **LLAMA_3_2_1B)`, ".float()", 128256) + fmt.Sprintf(`CKPT = %s
r = sweep.max_fit(lambda b: train(b, 2048), mode = "binsearch", max_trials = 40, search = "layout", fresh = "search", replay = True, name = "%s batch (seq 2048)")
if %s and r.fit != None and r.fit >= 1:
    sweep.max_fit(lambda s: train(1, s), low = 2048, high = 131072, mode = "binsearch", max_trials = 48, search = "layout", fresh = "search", replay = True, name = "%s seq (batch 1)")
`, py[ckpt], tag, py[seq], tag)
}
