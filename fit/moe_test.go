package fit_test

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"go.starlark.net/starlark"

	"github.com/memsh/memsh/backend"
	"github.com/memsh/memsh/fit"
	"github.com/memsh/memsh/scope"
	"github.com/memsh/memsh/scripts"
)

// The Mixture-of-Experts families' published configs (testdata/hfconfigs)
// build models/hf.star models whose parameters count what was published.
func TestMoEParameterCounts(t *testing.T) {
	for _, c := range []struct {
		config    string
		published int64
		source    string
	}{
		// mistralai/Mixtral-8x7B-v0.1: its config.json, and the count
		// issue 29 quotes from the model's safetensors metadata.
		{"mixtral-8x7b-v0.1.json", 46702792704, "mistralai/Mixtral-8x7B-v0.1 safetensors metadata (46,702,792,704)"},
		// Qwen/Qwen1.5-MoE-A2.7B: the Hugging Face Hub's total of its
		// safetensors (14,315,784,192; "14.3B" on the model card), the
		// figure KerasHub's qwen1.5_moe_2.7b_en preset publishes as params.
		{"qwen1.5-moe-a2.7b.json", 14315784192, "Qwen/Qwen1.5-MoE-A2.7B safetensors total (14,315,784,192)"},
		// Qwen/Qwen3-30B-A3B: the Hub's safetensors total and GGUF
		// general.parameter_count of its conversions (30,532,122,624;
		// "30.5B in total" on the model card).
		{"qwen3-30b-a3b.json", 30532122624, "Qwen/Qwen3-30B-A3B safetensors total (30,532,122,624)"},
	} {
		cfg, err := os.ReadFile(filepath.Join("..", "testdata", "hfconfigs", c.config))
		if err != nil {
			t.Fatal(err)
		}
		if n := buildCountBF16(t, string(cfg)); n != c.published {
			t.Errorf("%s: %d parameters, published %d (%s)", c.config, n, c.published, c.source)
		}
	}
}

// buildCountBF16 is buildCount for models too large for an H100 in
// float32: built in bfloat16 on a 2 TiB meta simulator, in lazy peak mode
// (only the count matters: exact mode's reclaim before each new peak, at
// every parameter, took 14 s for the three models).
func buildCountBF16(t *testing.T, config string) int64 {
	t.Helper()
	var out bytes.Buffer
	s, err := scope.New(scope.Options{Device: "sim:2TiB,meta", Out: &out, Err: &out, Library: scripts.Library, Peak: backend.PeakLazy})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	s.Set("CONFIG", starlark.String(config))
	err = s.Exec("count.star", `load("models/hf.star", "from_config")
m = from_config(json.decode(CONFIG), device = "cuda", dtype = "bfloat16")
N = 0
for p in m.parameters():
    N += p.numel()
`)
	if err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	n, _ := s.Get("N").(starlark.Int).Int64()
	return n
}

// tinyMixtral is a small Mixtral config (4 experts, 2 per token).
const tinyMixtral = `{"model_type": "mixtral", "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
"num_attention_heads": 4, "num_key_value_heads": 2, "num_local_experts": 4, "num_experts_per_tok": 2,
"vocab_size": 1024, "max_position_embeddings": 512, "tie_word_embeddings": false, "torch_dtype": "bfloat16"}`

// memsh fit of an MoE config runs with either routing plan and says which
// it used; the plans give the model different memory (with "worst" two
// of the four experts get every token and the other two none, so their
// parameters get no gradients and no optimizer state).
func TestFitMoERouting(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "config.json"), []byte(tinyMixtral), 0o644); err != nil {
		t.Fatal(err)
	}
	peaks := map[string]int64{}
	for _, routing := range []string{"balanced", "worst"} {
		set := map[string]any{"gpu": "1GiB", "seq": 256, "json": true}
		if routing == "worst" {
			set["routing"] = routing
		}
		rc, out, errs := runMain(t, options(dir, set))
		if rc != 0 {
			t.Fatalf("%s: exit %d: %s", routing, rc, errs)
		}
		var r fit.Report
		if err := json.Unmarshal([]byte(out), &r); err != nil {
			t.Fatal(err)
		}
		if r.Routing != routing {
			t.Errorf("routing %q in the report, want %q", r.Routing, routing)
		}
		if r.LargestBatch == nil || r.Peak == nil {
			t.Fatalf("%s: no batch fits: %s", routing, out)
		}
		peaks[routing] = r.Peak.Allocated
		t.Logf("%s: largest batch %d, peak allocated %d", routing, *r.LargestBatch, r.Peak.Allocated)
	}
	if peaks["worst"] == peaks["balanced"] {
		t.Errorf("both plans peak at %d: the routing did not reach the model", peaks["worst"])
	}
}
