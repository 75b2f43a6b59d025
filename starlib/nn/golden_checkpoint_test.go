package nn_test

// Golden case of activation checkpointing (nn.checkpoint, PyTorch's
// non-reentrant torch.utils.checkpoint): checkpoint_mlp in
// bench/torchref/README.md. It needs nn.functional.cross_entropy for its
// loss phase and fails at that phase until it exists; checkpoint_test.go
// checks the same model with a sum() loss against closed forms.
//
// No correction: the reference is PyTorch 1.13, whose non-reentrant
// checkpoint reruns the whole block in the recomputation where 2.x stops
// after the last saved tensor (early stop); here the block's last op
// (ReLU) saves its result, so both run the same ops and allocate the same
// bytes. The 5056-byte get_rng_state() tensors are host-only (left out of
// the figures).
func init() {
	setup := `
fc1 = nn.Linear(512, 1024).to("cuda")
block = nn.Sequential(nn.Linear(1024, 1024), nn.ReLU()).to("cuda")
fc3 = nn.Linear(1024, 10).to("cuda")
def forward(x):
    h = nn.functional.relu(fc1(x))
    h = nn.checkpoint(block, h, use_reentrant=False)
    return fc3(h)
params = fc1.parameters() + block.parameters() + fc3.parameters()
x = tensor.randn(64, 512, device="cuda")
y = tensor.randint(0, 10, [64], device="cuda")
opt = optim.SGD(params, lr=0.1)
`
	var phases []goldenPhase
	for step := 1; step <= 2; step++ {
		phases = append(phases,
			goldenPhase{"forward", step, "out = forward(x)"},
			goldenPhase{"loss", step, "loss = nn.functional.cross_entropy(out, y)"},
			goldenPhase{"backward", step, "loss.backward()"},
			goldenPhase{"step", step, "opt.step()"},
			goldenPhase{"zero_grad", step, "opt.zero_grad(set_to_none=True)"},
			goldenPhase{"release", step, "out = None\nloss = None"},
		)
	}
	addGolden(goldenCase{name: "checkpoint_mlp", setup: setup, phases: phases})
}
