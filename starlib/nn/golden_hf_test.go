package nn_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
)

// hf_<family>_tiny and hf_<family>_long: Hugging Face transformers'
// causal LMs as scripts/models/hf.star builds them from a config.json,
// against the plain-PyTorch references of bench/torchref/hf_families.py
// (written from transformers' modeling code): the config the JSON records
// (2 layers, hidden 64, 4 heads, 2 KV heads; GPT-2: n_embd 64, 4 heads),
// eager attention, fp32, labels a copy of the inputs, loss =
// model(input_ids, labels) (ForCausalLMLoss) as the forward phase,
// AdamW(lr=1e-3, foreach=True). _tiny: vocab 512, batch 2 × 32 tokens;
// _long: vocab 32, 2 × 256 tokens.
//
// Corrections from PyTorch 1.13 (the recording) to 2.x (what memsh
// models), each computed from its cause:
//   - foreach AdamW: 1.13 keeps two parameter-sized temporary lists in the
//     step, 2.x one (README item 7): step peak − param_bytes, as gpt2_tiny.
//   - mean over a dim (RMSNorm's variance): 1.13's MeanBackward1 saves its
//     input (the x.pow(2) temporary) until the backward node runs; 2.x's
//     saves only its sizes and numel, so the temporary dies when mean
//     returns (README item 13). The golden figures are recomputed from the
//     event list with each such tensor freed right after its mean instead
//     of in MeanBackward1.
var hfGoldenFamilies = []string{"llama", "qwen2", "qwen3", "gemma2", "phi3", "gpt2", "mistral", "gemma3_text"}

// hfGoldenVariants: _tiny (vocab 512, 32 tokens: the peaks at the loss) and
// _long (vocab 32, 128 tokens: the peaks inside the layers, in the
// attention scores).
var hfGoldenVariants = []string{"tiny", "long"}

func init() {
	for _, v := range hfGoldenVariants {
		for _, fam := range hfGoldenFamilies {
			addGolden(hfGoldenCase("hf_" + fam + "_" + v))
		}
	}
}

// hfGolden is what the cases read from a golden file beyond the figures.
type hfGolden struct {
	Config     json.RawMessage `json:"config"`
	ParamBytes int64           `json:"param_bytes"`
	Inputs     []struct {
		Shape []int `json:"shape"`
	} `json:"inputs"`
	Phases []hfPhase `json:"phases"`
}

type hfPhase struct {
	Phase  string    `json:"phase"`
	Step   int       `json:"step"`
	Start  int64     `json:"start"`
	End    int64     `json:"end"`
	Peak   int64     `json:"peak"`
	Events []hfEvent `json:"events"`
}

type hfEvent struct {
	Ev    string `json:"ev"`
	ID    int64  `json:"id"`
	Bytes int64  `json:"bytes"`
	Top   string `json:"top"`
	Host  string `json:"host"`
}

const meanBackward = "autograd::engine::evaluate_function: MeanBackward1"

// replay recomputes every phase's start, end and peak (host-only events
// left out) from the events; with mean2x, a forward's tensor that 1.13's
// MeanBackward1 frees is freed instead right after the top-level
// aten::mean that follows its allocation (2.x's MeanBackward1 saves no
// tensor, so the temporary dies when mean returns).
func replay(phases []hfPhase, mean2x bool) map[string]figures {
	moved := map[int64]bool{}
	if mean2x {
		// the saved input: allocated in a forward, freed by MeanBackward1
		// (the node frees its incoming grad too, made in the backward)
		inForward := map[int64]bool{}
		for _, p := range phases {
			for _, e := range p.Events {
				if e.Ev == "alloc" && p.Phase == "forward" {
					inForward[e.ID] = true
				}
				if e.Ev == "free" && e.Top == meanBackward && inForward[e.ID] {
					moved[e.ID] = true
				}
			}
		}
	}
	size := map[int64]int64{}
	out := map[string]figures{}
	var total int64
	for _, p := range phases {
		f := figures{Start: total, Peak: total}
		var pending []int64 // moved tensors waiting for their mean to return
		inMean := false
		release := func() {
			for _, id := range pending {
				total -= size[id]
			}
			pending = pending[:0]
		}
		for _, e := range p.Events {
			if inMean && e.Top != "aten::mean" {
				inMean = false
				release()
			}
			if e.Top == "aten::mean" && len(pending) > 0 {
				inMean = true
			}
			if e.Host != "" {
				continue
			}
			switch {
			case e.Ev == "alloc" && moved[e.ID]:
				size[e.ID] = e.Bytes
				pending = append(pending, e.ID)
			case e.Ev == "free" && moved[e.ID]:
				continue // freed already, after its mean
			}
			total += e.Bytes
			f.Peak = max(f.Peak, total)
		}
		if inMean {
			release()
		}
		f.End = total
		out[fmt.Sprintf("%s/%d", p.Phase, p.Step)] = f
	}
	return out
}

// hfGoldenCase reads the case's config, input shape, parameter bytes and
// events from its golden file; a file that cannot be read, or whose events
// do not add up to its figures, makes a setup that fails, naming it.
func hfGoldenCase(name string) goldenCase {
	var g hfGolden
	data, err := os.ReadFile(filepath.Join("..", "..", "testdata", "torchref", name+".json"))
	if err == nil {
		err = json.Unmarshal(data, &g)
	}
	if err == nil && (len(g.Config) == 0 || len(g.Inputs) == 0 || len(g.Inputs[0].Shape) != 2) {
		err = fmt.Errorf("no config or input shape")
	}
	var plain, fixed map[string]figures
	if err == nil {
		plain, fixed = replay(g.Phases, false), replay(g.Phases, true)
		for _, p := range g.Phases {
			key := fmt.Sprintf("%s/%d", p.Phase, p.Step)
			if got := plain[key]; got != (figures{p.Start, p.End, p.Peak}) {
				err = fmt.Errorf("%s: events replay to %+v, the file says %d/%d/%d", key, got, p.Start, p.End, p.Peak)
				break
			}
		}
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
	var phases []goldenPhase
	for step := 1; step <= 2; step++ {
		phases = append(phases,
			goldenPhase{"forward", step, "loss = model(x, y)"},
			goldenPhase{"backward", step, "loss.backward()"},
			goldenPhase{"step", step, "opt.step()"},
			goldenPhase{"zero_grad", step, "opt.zero_grad(set_to_none=True)"},
			goldenPhase{"release", step, "loss = None"},
		)
	}
	params := g.ParamBytes
	return goldenCase{name: name, setup: setup, phases: phases, scripts: true,
		correct: func(phase string, step int, f *figures) {
			key := fmt.Sprintf("%s/%d", phase, step)
			p, x := plain[key], fixed[key]
			f.Start += x.Start - p.Start
			f.End += x.End - p.End
			f.Peak += x.Peak - p.Peak
			if phase == "step" {
				f.Peak -= params
			}
		}}
}
