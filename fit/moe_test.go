package fit_test

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"go.starlark.net/starlark"

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
// float32: built in bfloat16 on a 2 TiB meta simulator.
func buildCountBF16(t *testing.T, config string) int64 {
	t.Helper()
	var out bytes.Buffer
	s, err := scope.New(scope.Options{Device: "sim:2TiB,meta", Out: &out, Err: &out, Library: scripts.Library})
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
