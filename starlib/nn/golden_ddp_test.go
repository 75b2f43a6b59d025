package nn_test

// DistributedDataParallel (bench/torchref/ddp_ref.py): a model wrapped on
// a one-rank process group, trained two steps with SGD(lr=0.1): the
// constructor's flattened broadcast and bucket, the step-2 forward's
// rebuilt buckets, the backward's copies into the buckets (with
// gradient_as_bucket_view the gradients become the views). No correction:
// the host tensors (shape metadata, the host halves of the bucket
// indices, the profiler's handles) are tagged in the reference.
func init() {
	ddpPhases := func(view bool) []goldenPhase {
		init := "ddp = nn.parallel.DistributedDataParallel(model)\n"
		if view {
			init = "ddp = nn.parallel.DistributedDataParallel(model, gradient_as_bucket_view=True)\n"
		}
		phases := []goldenPhase{{"ddp_init", 1, init + "opt = optim.SGD(ddp.parameters(), lr=0.1, momentum=0.0)"}}
		for step := 1; step <= 2; step++ {
			phases = append(phases,
				goldenPhase{"forward", step, "out = ddp(x)"},
				goldenPhase{"loss", step, "loss = lossf(out, y)"},
				goldenPhase{"backward", step, "loss.backward()"},
				goldenPhase{"step", step, "opt.step()"},
				goldenPhase{"zero_grad", step, "opt.zero_grad(set_to_none=True)"},
				goldenPhase{"release", step, "out = None\nloss = None"},
			)
		}
		return phases
	}
	mlp := `dist.init_process_group(world_size=1)
model = nn.Sequential(nn.Linear(512, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10)).to("cuda")
x = tensor.randn(64, 512, device="cuda")
y = tensor.randint(0, 10, [64], device="cuda")
lossf = nn.functional.cross_entropy
`
	gpt := `dist.init_process_group(world_size=1)
load("gpt2.star", "gpt2")
model = gpt2(n_layer = 2, n_head = 4, n_embd = 128, vocab_size = 512, block_size = 64, device = "cuda")
x = tensor.randint(0, 512, [4, 64], device = "cuda")
y = tensor.randint(0, 512, [4, 64], device = "cuda")
def lossf(out, y):
    return nn.functional.cross_entropy(out.view(-1, 512), y.view(-1))
`
	addGolden(
		goldenCase{name: "ddp_mlp", setup: mlp, phases: ddpPhases(false)},
		goldenCase{name: "ddp_mlp_view", setup: mlp, phases: ddpPhases(true)},
		goldenCase{name: "ddp_gpt2_tiny", setup: gpt, phases: ddpPhases(false), scripts: true},
	)
}
