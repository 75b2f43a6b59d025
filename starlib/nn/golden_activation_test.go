package nn_test

// Golden cases of the activations, softmax, layer norm and dropout
// (bench/torchref/README.md: op micro-cases and mlp_dropout).

func init() {
	x := randn("x", "64, 1024", true) + go64x1024
	addGolden(
		opCase("op_gelu", x, "nn.functional.gelu(x)", false),
		opCase("op_gelu_tanh", x, "nn.functional.gelu(x, approximate=\"tanh\")", false),
		opCase("op_silu", x, "nn.functional.silu(x)", false),
		opCase("op_softmax", x, "nn.functional.softmax(x, dim=-1)", false),
		opCase("op_log_softmax", x, "nn.functional.log_softmax(x, dim=-1)", false),
	)
	ln := opCase("op_layer_norm", x+
		"w = tensor.ones(1024, device=\"cuda\", requires_grad=True)\n"+
		"b = tensor.zeros(1024, device=\"cuda\", requires_grad=True)\n",
		"nn.functional.layer_norm(x, [1024], w, b)", false)
	ln.correct = layerNormCorrection
	addGolden(ln, mlpDropoutCase())
}

// layerNormCorrection (README item 6): the CPU native_layer_norm_backward
// allocates a per-thread dgamma/dbeta buffer of 2·N·4 bytes (one thread:
// 2·1024·4 = 8,192 bytes, transient, aten::resize_ under
// NativeLayerNormBackward0) that CUDA's kernel does not; CUDA's backward
// peak is that much lower.
func layerNormCorrection(phase string, step int, f *figures) {
	if phase == "backward" {
		f.Peak -= round512(2 * 1024 * 4)
	}
}

func round512(n int64) int64 {
	if n == 0 {
		return 0
	}
	return max(512, (n+511)/512*512)
}

// mlpDropoutCase is mlp_dropout: Linear(512,1024) ReLU Dropout(0.1)
// Linear(1024,10), SGD(lr=0.1), two steps. Its loss phase needs
// nn.functional.cross_entropy.
func mlpDropoutCase() goldenCase {
	c := mlpCase("mlp_dropout", "optim.SGD(model.parameters(), lr=0.1)", mlpDropoutCorrection)
	c.setup = `
model = nn.Sequential(nn.Linear(512, 1024), nn.ReLU(), nn.Dropout(0.1), nn.Linear(1024, 10)).to("cuda")
x = tensor.randn(64, 512, device="cuda")
y = tensor.randint(0, 10, [64], device="cuda")
opt = optim.SGD(model.parameters(), lr=0.1)
`
	return c
}

// mlpDropoutCorrection (README item 3): 1.13's CPU dropout is the
// composite path, keeping a float32 noise tensor of the input's size
// (round512(4n) = 262,144 bytes for n = 64·1024) where CUDA's
// native_dropout keeps a 1-byte bool mask (round512(n) = 65,536). The
// difference, 196,608 bytes, is subtracted while the mask lives: from the
// dropout in forward to its backward node (forward end and peak, the loss
// phase, backward start). The backward peak comes after the mask is freed
// and the backward itself allocates one input-sized gradient on both.
func mlpDropoutCorrection(phase string, step int, f *figures) {
	const n = 64 * 1024
	d := round512(4*n) - round512(n)
	switch phase {
	case "forward":
		f.End -= d
		f.Peak -= d
	case "loss":
		f.Start -= d
		f.End -= d
		f.Peak -= d
	case "backward":
		f.Start -= d
	}
}
