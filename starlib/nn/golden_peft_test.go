package nn_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// Golden cases of frozen parameters, LoRA and QLoRA against
// bench/torchref's plain-PyTorch references (bench/torchref/peft_ref.py:
// PEFT's LoraLinear and get_peft_model's injection, bitsandbytes'
// Linear4bit and MatMul4Bit with its kernels' allocations,
// prepare_model_for_kbit_training).
//
// Corrections, each from its cause:
//   - PyTorch 1.13's foreach AdamW keeps two temporary lists of the
//     parameters that have a gradient during the step, 2.x one: the
//     step's peak is lower by the trainable parameters' bytes
//     (adamForeachCorrection's reason; frozen parameters have no
//     gradient and are in no list).
//   - The Llama cases: PyTorch 1.13's MeanBackward1 keeps each RMSNorm's
//     x.pow(2) (without2xMeanSaves, golden_hf_test.go).
//   - The QLoRA cases: the CPU's bfloat16 matrix product (1.13's aten::mm
//     for bfloat16, bitsandbytes' compute dtype) allocates a scratch
//     buffer inside aten::mm and frees it before returning; cuBLAS takes
//     none from the caching allocator per product (its workspace is the
//     handle's, which memsh models as the cuBLAS workspace, and a plain
//     sim:SIZE device has none). Those allocations are left out
//     (cpuScratch).
func init() {
	addGolden(
		opCase("op_linear_frozen_weight", randn("x", "64, 512", true)+randn("w", "1024, 512", false)+randn("b", "1024", false)+go64x1024,
			"nn.functional.linear(x, w, b)", false),
		opCase("op_linear_frozen_weight_3d", randn("x", "4, 16, 512", true)+randn("w", "1024, 512", false)+randn("b", "1024", false)+
			"go = tensor.ones(4, 16, 1024, device=\"cuda\")\n",
			"nn.functional.linear(x, w, b)", false),
		frozenMLPCase("frozen_mlp_first", 0),
		frozenMLPCase("frozen_mlp_middle", 2),
		peftCase("llama_lora_qv", `nn.lora(model, r = 8, lora_alpha = 16, target_modules = ["q_proj", "v_proj"])`, false, false),
		peftCase("llama_lora_all_inputgrad", `model.enable_input_require_grads()
nn.lora(model, r = 4, lora_alpha = 8, target_modules = "all-linear")`, false, false),
		peftCase("llama_qlora_qv", `nn.prepare_model_for_kbit_training(model, use_gradient_checkpointing = False)
nn.lora(model, r = 8, lora_alpha = 16, target_modules = ["q_proj", "v_proj"])`, true, false),
		peftCase("llama_qlora_ckpt", `nn.prepare_model_for_kbit_training(model, use_gradient_checkpointing = False)
model.enable_input_require_grads()
model.gradient_checkpointing_enable(gradient_checkpointing_kwargs = {"use_reentrant": False})
nn.lora(model, r = 8, lora_alpha = 16, target_modules = "all-linear")`, true, true),
	)
}

// frozenMLPCase is torchref's MLP with Linear number frozen
// (requires_grad_(False)) and AdamW (foreach) over all its parameters.
func frozenMLPCase(name string, frozen int) goldenCase {
	setup := fmt.Sprintf(`
model = nn.Sequential(nn.Linear(512, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10)).to("cuda")
model[%d].requires_grad_(False)
x = tensor.randn(64, 512, device="cuda")
y = tensor.randint(0, 10, [64], device="cuda")
opt = optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
`, frozen)
	// the trainable parameters' bytes: the MLP's less the frozen layer's
	layer := []int64{1024*512*4 + 1024*4, 1024*1024*4 + 1024*4, 10*1024*4 + 512}
	trainable := int64(mlpParams) - layer[frozen/2]
	c := mlpCase(name, "", nil)
	c.setup = setup
	c.correct = func(phase string, step int, f *figures) {
		if phase == "step" {
			f.Peak -= trainable
		}
	}
	return c
}

// peftCase is a Llama golden case: the tiny config of the golden file's
// description built by models/hf.star (eager attention; with quant, from
// bfloat16 weights with its linear layers but lm_head as nn.Linear4bit,
// nf4, double quantization, compute dtype bfloat16), then peft (Starlark
// run on the model), two AdamW steps of loss = model(input_ids, labels).
func peftCase(name, peft string, quant, checkpoint bool) goldenCase {
	var g hfGolden
	data, err := os.ReadFile(filepath.Join("..", "..", "testdata", "torchref", name+".json"))
	if err == nil {
		err = json.Unmarshal(data, &g)
	}
	cfg := "{}"
	if err == nil {
		cfg, _ = moeConfigOf(g.Description)
	}
	build := `model = from_config(cfg, attention = "eager", device = "cuda")`
	if quant {
		build = `model = from_config(cfg, attention = "eager", device = "cuda", dtype = "bfloat16", quantization_config = dict(
    load_in_4bit = True, bnb_4bit_quant_type = "nf4", bnb_4bit_use_double_quant = True, bnb_4bit_compute_dtype = "bfloat16"))`
	}
	_ = checkpoint
	setup := fmt.Sprintf(`
load("models/hf.star", "from_config")
cfg = json.decode(%q)
%s
%s
x = tensor.randint(0, cfg["vocab_size"], [2, 32], device = "cuda")
y = x.clone()
opt = optim.AdamW(model.parameters(), lr = 1e-3, weight_decay = 0.1)
`, cfg, build, strings.TrimSpace(peft))
	var phases []goldenPhase
	for step := 1; step <= 2; step++ {
		phases = append(phases,
			goldenPhase{"forward", step, "out = model(x, y)"},
			goldenPhase{"backward", step, "out.backward()"},
			goldenPhase{"step", step, "opt.step()"},
			goldenPhase{"zero_grad", step, "opt.zero_grad(set_to_none=True)"},
			goldenPhase{"release", step, "out = None"},
		)
	}
	grads := g.GradBytes
	fixed, ferr := withoutCPUOnly(&g, cpuScratch(&g), false)
	return goldenCase{name: name, setup: setup, phases: phases, scripts: true,
		correct: func(phase string, step int, f *figures) {
			if ferr != nil {
				panic(fmt.Sprintf("%s: %v", name, ferr))
			}
			*f = fixed[fmt.Sprintf("%s/%d", phase, step)]
			if phase == "step" {
				f.Peak -= grads
			}
		}}
}

// cpuScratch returns the allocations a golden file's aten::mm made and
// freed inside itself (the CPU bfloat16 product's scratch).
func cpuScratch(g *hfGolden) map[int]bool {
	allocOp := map[int]string{}
	drop := map[int]bool{}
	for _, p := range g.Phases {
		for _, e := range p.Events {
			if e.Ev == "alloc" {
				allocOp[e.ID] = e.Op
			} else if e.Op == "aten::mm" && allocOp[e.ID] == "aten::mm" {
				drop[e.ID] = true
			}
		}
	}
	return drop
}
