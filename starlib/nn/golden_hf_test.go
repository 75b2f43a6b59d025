package nn_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// Hugging Face transformers' causal LMs as scripts/models/hf.star builds
// them from a config.json, against the plain-PyTorch references of
// bench/torchref/hf_families.py (written from transformers 4.5x's
// modeling code): eager attention, fp32, labels a copy of the inputs,
// loss = model(input_ids, labels) (ForCausalLMLoss) as the forward phase,
// two AdamW steps.
//
// hf_<family>_tiny and hf_<family>_long, the dense families: the config
// the JSON records (2 layers, hidden 64, 4 heads, 2 KV heads; GPT-2:
// n_embd 64, 4 heads), AdamW(lr=1e-3, foreach=True). _tiny: vocab 512,
// batch 2 × 32 tokens; _long: vocab 32, 2 × 256 tokens.
//
// mixtral_tiny, qwen2_moe_tiny, qwen3_moe_tiny, the Mixture-of-Experts
// families (hf_families.py's HFCausalLM, SparseMoe): the configs read from
// the golden files' descriptions, so the two sides build the same model;
// qwen3_moe_tiny with the "worst" routing plan, the others "balanced",
// forced on topk's indices in the reference; AdamW(lr=1e-3,
// weight_decay=0.1); batch 2 × 32 tokens.
//
// Corrections from PyTorch 1.13 (the recording) to 2.x (what memsh
// models), each computed from its cause:
//   - mean over a dim (RMSNorm's variance): 1.13's MeanBackward1 saves its
//     input (derivatives.yaml's mean.dim formula reads self.numel(), which
//     1.13's codegen saves as the whole tensor); 2.x saves
//     self.sym_numel() only. So each RMSNorm's x.pow(2) (LlamaRMSNorm:
//     pow(2).mean(-1, keepdim=True)) is kept from the forward until its
//     MeanBackward1 runs, where 2.x frees it once the mean is computed
//     (README item 14). The figures are recomputed from the golden file's
//     event list with those tensors freed right after the mean's result is
//     allocated and their later free left out (without2xMeanSaves).
//   - foreach AdamW: 1.13 keeps two parameter-sized temporary lists during
//     the step, 2.x one (README item 7, adamForeachCorrection); the step's
//     peak is lower by the bytes of the parameters that have a gradient
//     (all of a dense model's; an unused expert's have none, and AdamW
//     skips them).
var hfGoldenFamilies = []string{"llama", "qwen2", "qwen3", "gemma2", "phi3", "gpt2", "mistral", "gemma3_text"}

// hfGoldenVariants: _tiny (vocab 512, 32 tokens: the peaks at the loss) and
// _long (vocab 32, 256 tokens: the peaks inside the layers, in the
// attention scores).
var hfGoldenVariants = []string{"tiny", "long"}

func init() {
	for _, v := range hfGoldenVariants {
		for _, fam := range hfGoldenFamilies {
			addGolden(hfGoldenCase("hf_" + fam + "_" + v))
		}
	}
	for _, name := range []string{"mixtral_tiny", "qwen2_moe_tiny", "qwen3_moe_tiny"} {
		addGolden(moeModelCase(name))
	}
}

// hfGolden is what the cases read from a golden file beyond the figures.
type hfGolden struct {
	Description string          `json:"description"`
	Config      json.RawMessage `json:"config"`
	GradBytes   int64           `json:"grad_bytes"`
	Inputs      []struct {
		Shape []int `json:"shape"`
	} `json:"inputs"`
	Phases []struct {
		Phase  string        `json:"phase"`
		Step   int           `json:"step"`
		Start  int64         `json:"start"`
		End    int64         `json:"end"`
		Peak   int64         `json:"peak"`
		Events []goldenEvent `json:"events"`
	} `json:"phases"`
}

// goldenEvent is one allocation or free of a golden file's event list.
type goldenEvent struct {
	Ev    string `json:"ev"`
	ID    int    `json:"id"`
	Bytes int64  `json:"bytes"`
	Op    string `json:"op"`
	Top   string `json:"top"`
	Host  string `json:"host"`
}

const meanBackward1 = "autograd::engine::evaluate_function: MeanBackward1"

// readHFGolden reads a case's golden file.
func readHFGolden(name string) (*hfGolden, error) {
	var g hfGolden
	data, err := os.ReadFile(filepath.Join("..", "..", "testdata", "torchref", name+".json"))
	if err == nil {
		err = json.Unmarshal(data, &g)
	}
	return &g, err
}

// without2xMeanSaves recomputes every phase's start, end and peak (the
// device figures: host-only events left out) with the forward
// allocations (and a checkpoint's recomputed x.pow(2)) that 1.13's
// MeanBackward1 frees (its saved input) freed
// instead right after the next aten::mean allocation that follows them,
// as PyTorch 2.x frees them. It fails when the events do not reproduce the
// file's own figures, or, with wantMean (a model with an RMSNorm), when
// no MeanBackward1 frees a forward's tensor.
func without2xMeanSaves(g *hfGolden, wantMean bool) (map[string]figures, error) {
	return withoutCPUOnly(g, nil, wantMean)
}

// withoutCPUOnly is without2xMeanSaves that also leaves out the
// allocations drop names (both their allocation and their free): CPU-only
// temporaries (cpuScratch).
func withoutCPUOnly(g *hfGolden, drop map[int]bool, wantMean bool) (map[string]figures, error) {
	moved := map[int]bool{} // allocation ids 1.13's MeanBackward1 frees
	allocPhase, allocOp := map[int]string{}, map[int]string{}
	for _, p := range g.Phases {
		for _, e := range p.Events {
			if e.Host != "" {
				continue
			}
			if e.Ev == "alloc" {
				allocPhase[e.ID], allocOp[e.ID] = p.Phase, e.Op
			} else if e.Top == meanBackward1 && (allocPhase[e.ID] == "forward" || allocOp[e.ID] == "aten::pow") {
				// the forward's, and a checkpointed region's recomputed
				// x.pow(2) (made in the backward, kept for MeanBackward1)
				moved[e.ID] = true
			}
		}
	}
	out := map[string]figures{}
	var total, real int64
	for _, p := range g.Phases {
		var pending []int64 // moved tensors waiting for their mean
		f := figures{Start: total, Peak: total}
		realStart, realPeak := real, real
		for _, e := range p.Events {
			if e.Host != "" {
				continue
			}
			real += e.Bytes
			realPeak = max(realPeak, real)
			if drop[e.ID] {
				continue
			}
			if e.Ev == "free" && moved[e.ID] {
				continue // freed earlier, below
			}
			total += e.Bytes
			f.Peak = max(f.Peak, total)
			if e.Ev == "alloc" && moved[e.ID] {
				pending = append(pending, e.Bytes)
			} else if e.Ev == "alloc" && e.Op == "aten::mean" && len(pending) > 0 {
				total -= pending[0]
				pending = pending[1:]
			}
		}
		if len(pending) > 0 {
			return nil, fmt.Errorf("%s/%d: %d saved inputs of MeanBackward1 without a mean after them", p.Phase, p.Step, len(pending))
		}
		f.End = total
		if realStart != p.Start || real != p.End || realPeak != p.Peak {
			return nil, fmt.Errorf("%s/%d: the events give start %d end %d peak %d, the file %d %d %d", p.Phase, p.Step, realStart, real, realPeak, p.Start, p.End, p.Peak)
		}
		out[fmt.Sprintf("%s/%d", p.Phase, p.Step)] = f
	}
	if wantMean && len(moved) == 0 {
		return nil, fmt.Errorf("no input saved by MeanBackward1 found")
	}
	return out, nil
}

// hfPhases: two steps of loss = model(x, y), its backward, AdamW's step,
// zero_grad and the loss's release.
func hfPhases(out string) []goldenPhase {
	var phases []goldenPhase
	for step := 1; step <= 2; step++ {
		phases = append(phases,
			goldenPhase{"forward", step, out + " = model(x, y)"},
			goldenPhase{"backward", step, out + ".backward()"},
			goldenPhase{"step", step, "opt.step()"},
			goldenPhase{"zero_grad", step, "opt.zero_grad(set_to_none=True)"},
			goldenPhase{"release", step, out + " = None"},
		)
	}
	return phases
}

// hfCorrection replaces a phase's figures with the 2.x ones of fixed and
// takes the second foreach list (grads bytes) off the step's peak.
func hfCorrection(name string, fixed map[string]figures, ferr error, grads int64) func(string, int, *figures) {
	return func(phase string, step int, f *figures) {
		if ferr != nil {
			panic(fmt.Sprintf("%s: %v", name, ferr))
		}
		*f = fixed[fmt.Sprintf("%s/%d", phase, step)]
		if phase == "step" {
			f.Peak -= grads
		}
	}
}

// hfGoldenCase reads the case's config, input shape, gradient bytes and
// events from its golden file; a file that cannot be read, or whose events
// do not add up to its figures, makes a setup that fails, naming it.
func hfGoldenCase(name string) goldenCase {
	g, err := readHFGolden(name)
	if err == nil && (len(g.Config) == 0 || len(g.Inputs) == 0 || len(g.Inputs[0].Shape) != 2) {
		err = fmt.Errorf("no config or input shape")
	}
	var fixed map[string]figures
	if err == nil {
		// GPT-2's LayerNorms take no mean: nothing to move
		fixed, err = without2xMeanSaves(g, !strings.HasPrefix(name, "hf_gpt2_"))
	}
	setup := ""
	if err != nil {
		setup = fmt.Sprintf("fail(%s)", strconv.Quote(name+": "+err.Error()))
	} else {
		setup = fmt.Sprintf(`
load("models/hf.star", "from_config", "inputs")
cfg = json.decode(%s)
model = from_config(cfg, attention = "eager", device = "cuda")
x, y = inputs(cfg, %d, %d, "cuda")
opt = optim.AdamW(model.parameters(), lr = 1e-3, foreach = True)
`, strconv.Quote(string(g.Config)), g.Inputs[0].Shape[0], g.Inputs[0].Shape[1])
	}
	return goldenCase{name: name, setup: setup, phases: hfPhases("loss"), scripts: true,
		correct: hfCorrection(name, fixed, err, g.GradBytes)}
}

func moeModelCase(name string) goldenCase {
	g, err := readHFGolden(name)
	// a missing or bad file fails the case when it runs (runGolden reads it)
	cfg, routing := "{}", "balanced"
	if err == nil {
		cfg, routing = moeConfigOf(g.Description)
	}
	setup := fmt.Sprintf(`
load("models/hf.star", "from_config", "inputs")
cfg = json.decode(%q)
model = from_config(cfg, attention = "eager", device = "cuda", routing = %q)
x = tensor.randint(0, cfg["vocab_size"], [2, 32], device = "cuda")
y = x.clone()
opt = optim.AdamW(model.parameters(), lr = 1e-3, weight_decay = 0.1)
`, cfg, routing)
	fixed, ferr := without2xMeanSaves(g, true)
	return goldenCase{name: name, setup: setup, phases: hfPhases("out"), scripts: true,
		correct: hfCorrection(name, fixed, ferr, g.GradBytes)}
}

// moeConfigOf reads the config JSON and the routing plan out of a golden
// file's description ("..., config {...}; routing plan NAME forced ...").
func moeConfigOf(desc string) (cfg, routing string) {
	var i, depth int
	start := -1
	for i = 0; i < len(desc); i++ {
		switch desc[i] {
		case '{':
			if depth == 0 {
				start = i
			}
			depth++
		case '}':
			depth--
			if depth == 0 && start >= 0 {
				cfg = desc[start : i+1]
				i = len(desc)
			}
		}
	}
	routing = "balanced"
	const key = "routing plan "
	for j := 0; j+len(key) < len(desc); j++ {
		if desc[j:j+len(key)] == key {
			rest := desc[j+len(key):]
			if len(rest) >= 5 && rest[:5] == "worst" {
				routing = "worst"
			}
			break
		}
	}
	return cfg, routing
}

func TestMoEConfigOf(t *testing.T) {
	cfg, routing := moeConfigOf(`family in plain PyTorch, config {"a": {"b": 1}, "c": [1]}; routing plan worst forced on`)
	if cfg != `{"a": {"b": 1}, "c": [1]}` || routing != "worst" {
		t.Errorf("got %q %q", cfg, routing)
	}
}
