package nn_test

import "fmt"

// Golden cases of the ops and models built on the core ops (linear, relu,
// tanh, sigmoid, pow, rsqrt, matmul) and the MLP training steps.

// opCase is a single-op case: setup makes the inputs and grad_output
// (go), forward runs expr into out, backward is out.backward(go) — or
// out.backward() for a scalar output (noGo).
func opCase(name, setup, expr string, noGo bool) goldenCase {
	bwd := "out.backward(go)"
	if noGo {
		bwd = "out.backward()"
	}
	return goldenCase{name: name, setup: setup, phases: []goldenPhase{
		{"forward", 1, "out = " + expr},
		{"backward", 1, bwd},
	}}
}

func randn(name string, shape string, grad bool) string {
	rg := ""
	if grad {
		rg = ", requires_grad=True"
	}
	return fmt.Sprintf("%s = tensor.randn(%s, device=\"cuda\"%s)\n", name, shape, rg)
}

const go64x1024 = "go = tensor.ones(64, 1024, device=\"cuda\")\n"

func init() {
	addGolden(
		opCase("op_relu", randn("x", "64, 1024", true)+go64x1024, "nn.functional.relu(x)", false),
		opCase("op_tanh", randn("x", "64, 1024", true)+go64x1024, "x.tanh()", false),
		opCase("op_sigmoid", randn("x", "64, 1024", true)+go64x1024, "x.sigmoid()", false),
		opCase("op_pow", randn("x", "64, 1024", true)+go64x1024, "tensor.pow(x, 2)", false),
		opCase("op_rsqrt", "x = (tensor.randn(64, 1024, device=\"cuda\").abs() + 1).requires_grad_()\n"+go64x1024, "tensor.rsqrt(x)", false),
		opCase("op_linear", randn("x", "64, 512", true)+randn("w", "1024, 512", true)+randn("b", "1024", true)+go64x1024,
			"nn.functional.linear(x, w, b)", false),
		opCase("op_linear_nograd_input", randn("x", "64, 512", false)+randn("w", "1024, 512", true)+randn("b", "1024", true)+go64x1024,
			"nn.functional.linear(x, w, b)", false),
		opCase("op_matmul_batched", randn("a", "4, 8, 64, 32", true)+randn("b", "4, 8, 32, 64", true)+"go = tensor.ones(4, 8, 64, 64, device=\"cuda\")\n",
			"tensor.matmul(a, b)", false),
		opCase("op_matmul_batched_transposed", randn("a", "4, 8, 64, 32", true)+randn("b", "4, 8, 64, 32", true)+"go = tensor.ones(4, 8, 64, 64, device=\"cuda\")\n",
			"tensor.matmul(a, b.transpose(-2, -1))", false),
	)
	addGolden(mlpCase("mlp_adam_foreach", "optim.Adam(model.parameters(), lr=1e-3, foreach=True)", adamForeachCorrection),
		mlpCase("mlp_adam_forloop", "optim.Adam(model.parameters(), lr=1e-3, foreach=False)", nil),
		mlpCase("mlp_sgd_momentum", "optim.SGD(model.parameters(), lr=0.1, momentum=0.9)", nil),
	)
}

// mlpParams is the MLP's parameter bytes (each tensor rounded to 512).
const mlpParams = 1024*512*4 + 1024*4 + 1024*1024*4 + 1024*4 + 10*1024*4 + 512

// adamForeachCorrection: PyTorch 1.13's _multi_tensor_adam keeps two
// parameter-sized temporary lists during the step (exp_avg_sq_sqrt and
// denom); 2.x adds eps in place and keeps one, so the step's peak is one
// parameter set (P bytes) lower on CUDA with PyTorch 2.x.
func adamForeachCorrection(phase string, step int, f *figures) {
	if phase == "step" {
		f.Peak -= mlpParams
	}
}

func mlpCase(name, opt string, correct func(string, int, *figures)) goldenCase {
	setup := `
model = nn.Sequential(nn.Linear(512, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10)).to("cuda")
x = tensor.randn(64, 512, device="cuda")
y = tensor.randint(0, 10, [64], device="cuda")
opt = ` + opt + "\n"
	var phases []goldenPhase
	for step := 1; step <= 2; step++ {
		phases = append(phases,
			goldenPhase{"forward", step, "out = model(x)"},
			goldenPhase{"loss", step, "loss = nn.functional.cross_entropy(out, y)"},
			goldenPhase{"backward", step, "loss.backward()"},
			goldenPhase{"step", step, "opt.step()"},
			goldenPhase{"zero_grad", step, "opt.zero_grad(set_to_none=True)"},
			goldenPhase{"release", step, "out = None\nloss = None"},
		)
	}
	return goldenCase{name: name, setup: setup, phases: phases, correct: correct}
}
