package nn_test

// gpt2_tiny: scripts/models/gpt2.star at n_layer=2, n_head=4, n_embd=128,
// vocab 512, context 64, math attention with the registered causal mask,
// batch 4 × 64 tokens, cross-entropy, AdamW(lr=1e-3, weight_decay=0.1,
// foreach) — the model bench/torchref/torchref.py runs in PyTorch.
func init() {
	setup := `
load("gpt2.star", "gpt2")
model = gpt2(n_layer = 2, n_head = 4, n_embd = 128, vocab_size = 512, block_size = 64, device = "cuda")
x = tensor.randint(0, 512, [4, 64], device = "cuda")
y = tensor.randint(0, 512, [4, 64], device = "cuda")
opt = optim.AdamW(model.parameters(), lr = 1e-3, weight_decay = 0.1)
`
	var phases []goldenPhase
	for step := 1; step <= 2; step++ {
		phases = append(phases,
			goldenPhase{"forward", step, "out = model(x)"},
			goldenPhase{"loss", step, "loss = nn.functional.cross_entropy(out.view(-1, 512), y.view(-1))"},
			goldenPhase{"backward", step, "loss.backward()"},
			goldenPhase{"step", step, "opt.step()"},
			goldenPhase{"zero_grad", step, "opt.zero_grad(set_to_none=True)"},
			goldenPhase{"release", step, "out = None\nloss = None"},
		)
	}
	// gpt2Params is the model's parameter bytes (28 tensors, the tied
	// embedding once, each rounded to 512): the golden param_bytes.
	const gpt2Params = 1882112
	addGolden(goldenCase{name: "gpt2_tiny", setup: setup, phases: phases, scripts: true,
		// PyTorch 1.13's foreach AdamW keeps two parameter-sized temporary
		// lists during the step; 2.x keeps one (see adamForeachCorrection).
		correct: func(phase string, step int, f *figures) {
			if phase == "step" {
				f.Peak -= gpt2Params
			}
		}})
}
