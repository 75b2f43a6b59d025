package nn_test

import "fmt"

// Golden cases of the optimizers people pick to save memory, gradient
// accumulation and clipping (bench/torchref/optim_refs.py): the MLP of the
// mlp_* cases trained for two optimizer steps.

const mlpSetup = `
model = nn.Sequential(nn.Linear(512, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10)).to("cuda")
`

func init() {
	// Gradient accumulation: accum micro-batches, each forward, loss / accum
	// and backward (AccumulateGrad steals the first micro-batch's gradients
	// and adds the later ones in place, freeing each incoming gradient),
	// then one SGD step without momentum (no state, no temporaries: the
	// step allocates nothing). No correction: nothing host-only is counted
	// (the wrapped divisor and its float copy are host tensors).
	const accum = 3
	setup := mlpSetup
	for k := 1; k <= accum; k++ {
		setup += fmt.Sprintf("x%d = tensor.randn(64, 512, device=\"cuda\")\ny%d = tensor.randint(0, 10, [64], device=\"cuda\")\n", k, k)
	}
	setup += "opt = optim.SGD(model.parameters(), lr=0.1, momentum=0.0)\n"
	var phases []goldenPhase
	for step := 1; step <= 2; step++ {
		for k := 1; k <= accum; k++ {
			phases = append(phases,
				goldenPhase{fmt.Sprintf("forward.%d", k), step, fmt.Sprintf("out = model(x%d)", k)},
				goldenPhase{fmt.Sprintf("loss.%d", k), step, fmt.Sprintf("loss = nn.functional.cross_entropy(out, y%d) / %d", k, accum)},
				goldenPhase{fmt.Sprintf("backward.%d", k), step, "loss.backward()"},
				goldenPhase{fmt.Sprintf("release.%d", k), step, "out = None\nloss = None"},
			)
		}
		phases = append(phases,
			goldenPhase{"step", step, "opt.step()"},
			goldenPhase{"zero_grad", step, "opt.zero_grad(set_to_none=True)"},
		)
	}
	addGolden(goldenCase{name: "optim_grad_accum", setup: setup, phases: phases})
}

func init() {
	// Gradient clipping after backward, as PyTorch 2.x's clip_grad_norm_
	// with foreach=True: the six 0-dim norms, their stack and its norm
	// (peak 8 × 512 above the start), then clip_coef's sum, reciprocal and
	// product, the clamp, the in-place multiply; the total norm stays
	// (norm, until release). CUDA's fast _foreach_norm also makes its
	// output_per_tensor scratch (6 tensors × 16 chunks of 65536 = 96
	// floats, one 512-byte block) before the norms and frees it after:
	// 7 blocks then, below the 8 of the stack, so the CPU reference's peak
	// stands. No correction.
	setup := mlpSetup + `x = tensor.randn(64, 512, device="cuda")
y = tensor.randint(0, 10, [64], device="cuda")
opt = optim.SGD(model.parameters(), lr=0.1, momentum=0.0)
`
	var phases []goldenPhase
	for step := 1; step <= 2; step++ {
		phases = append(phases,
			goldenPhase{"forward", step, "out = model(x)"},
			goldenPhase{"loss", step, "loss = nn.functional.cross_entropy(out, y)"},
			goldenPhase{"backward", step, "loss.backward()"},
			goldenPhase{"clip", step, "norm = nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0, foreach=True)"},
			goldenPhase{"step", step, "opt.step()"},
			goldenPhase{"zero_grad", step, "opt.zero_grad(set_to_none=True)"},
			goldenPhase{"release", step, "out = None\nloss = None\nnorm = None"},
		)
	}
	addGolden(goldenCase{name: "optim_clip_grad", setup: setup, phases: phases})
}

func init() {
	// Adafactor: transformers' (optim.transformers.Adafactor) with
	// Trainer's options and with its defaults plus beta1 and weight decay
	// (the learning rate then a 0-dim tensor: RMS × step size), and
	// torch.optim.Adafactor's loop and foreach paths. The references are
	// the sources' code in plain PyTorch 1.13 (optim_refs.py); their 0-dim
	// results (norms, RMS, the bool comparison, the learning rate, a row
	// mean) are device tensors, counted. No correction: the host step
	// counters and wrapped scalars are left out of the figures.
	addGolden(
		mlpCase("optim_adafactor_hf", "optim.transformers.Adafactor(model.parameters(), lr=1e-3, scale_parameter=False, relative_step=False, warmup_init=False)", nil),
		mlpCase("optim_adafactor_hf_beta1", "optim.transformers.Adafactor(model.parameters(), beta1=0.9, weight_decay=0.01)", nil),
		mlpCase("optim_adafactor_torch", "optim.Adafactor(model.parameters(), lr=1e-2)", nil),
		mlpCase("optim_adafactor_torch_foreach", "optim.Adafactor(model.parameters(), lr=1e-2, foreach=True)", nil),
	)
}
