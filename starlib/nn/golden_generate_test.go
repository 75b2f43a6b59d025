package nn_test

import (
	"fmt"
	"strconv"
)

// Greedy generation with a KV cache (scripts/models/generate.star's
// start_generation and generation_step, one phase per new token) against
// bench/torchref/generate_ref.py: the tiny config of the golden file (llama;
// qwen3 for its q/k norms),
// eager attention, fp32, a prompt of the file's input shape, under no_grad.
// hf_llama_generate_dynamic grows a DynamicCache by torch.cat at every
// token; hf_llama_generate_static writes a StaticCache in place;
// hf_qwen3_generate_dynamic adds Qwen3's q_norm and k_norm. No
// correction: nothing is saved for a backward, and the host-only events
// (the eager mask's wrapped finfo.min) are already out of the figures.
func init() {
	addGolden(generateCase("hf_llama_generate_dynamic", "dynamic"),
		generateCase("hf_llama_generate_static", "static"),
		generateCase("hf_qwen3_generate_dynamic", "dynamic"))
}

// generateCase builds the model and the generation state in setup and runs
// one generation_step per phase: "prefill" (step 1), then "decode".
func generateCase(name, kind string) goldenCase {
	g, err := readHFGolden(name)
	if err == nil && (len(g.Config) == 0 || len(g.Inputs) != 1 || len(g.Inputs[0].Shape) != 2 || len(g.Phases) < 2) {
		err = fmt.Errorf("no config, input shape or phases")
	}
	c := goldenCase{name: name, scripts: true}
	if err != nil {
		c.setup = fmt.Sprintf("fail(%s)", strconv.Quote(name+": "+err.Error()))
		return c
	}
	c.setup = fmt.Sprintf(`
load("models/hf.star", "from_config")
load("models/generate.star", "start_generation", "generation_step")
cfg = json.decode(%s)
model = from_config(cfg, attention = "eager", device = "cuda")
model.eval()
x = tensor.randint(0, cfg["vocab_size"], [%d, %d], device = "cuda")
st = start_generation(model, x, %d, cache = %q)
mask0 = st["attention_mask"]  # bound in the reference too (its profiler cannot see a free of a block made before it started)
`, strconv.Quote(string(g.Config)), g.Inputs[0].Shape[0], g.Inputs[0].Shape[1], len(g.Phases), kind)
	for i, p := range g.Phases {
		c.phases = append(c.phases, goldenPhase{p.Phase, i + 1, "tensor.no_grad(generation_step, st)"})
	}
	return c
}
