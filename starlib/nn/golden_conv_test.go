package nn_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
)

// Golden cases of convolution, max pooling and batch norm, and the small
// CNN training step built on them.
//
// The CPU reference (PyTorch 1.13, mkldnn) differs from CUDA inside two
// kinds of op, and every difference is an allocation the profiler tagged
// "transient" (allocated and freed inside the same top-level op or
// backward node):
//
//   - convolution (bench/torchref/README.md item 4): mkldnn makes a weight
//     reorder, an input reorder (16-channel conv), a blocked output copied
//     into the dense one, and blocked grad buffers in
//     convolution_backward. cuDNN makes none of them (it takes an
//     algorithm-dependent workspace instead, which memsh does not model).
//   - batch norm (item 5): CPU native_batch_norm makes four [C]-float
//     temporaries in the forward (two around the statistics, two after the
//     output; only two are alive at the peak, so the forward peak drops by
//     2×512 bytes for C ≤ 128, not 4×512) and native_batch_norm_backward
//     one input-sized temporary before grad_input (op_batch_norm: 2,097,152
//     bytes). cudnn_batch_norm / cudnn_batch_norm_backward make none.
//
// The correction recomputes each phase's peak from the event list without
// those transient events (their allocations and frees), so the figure
// subtracted is exactly what was alive of them at the CPU peak; start and
// end are unaffected (transients are freed inside their op).

// transientTops are the top-level ops and backward nodes whose transient
// events are CPU-only.
var transientTops = []string{"aten::conv2d", "ConvolutionBackward0", "aten::batch_norm", "NativeBatchNormBackward0"}

type eventFile struct {
	Phases []struct {
		Phase  string `json:"phase"`
		Step   int    `json:"step"`
		Start  int64  `json:"start"`
		Peak   int64  `json:"peak"`
		Events []struct {
			Ev        string  `json:"ev"`
			ID        int     `json:"id"`
			Bytes     int64   `json:"bytes"`
			Top       *string `json:"top"`
			Host      *string `json:"host"`
			Transient bool    `json:"transient"`
		} `json:"events"`
	} `json:"phases"`
}

var (
	cudaPeaksMu sync.Mutex
	cudaPeaks   = map[string]map[string]int64{}
)

// peakWithoutCPUTransients is the phase's peak with the CPU-only
// transients of convolution and batch norm left out (see above).
func peakWithoutCPUTransients(name, phase string, step int) int64 {
	cudaPeaksMu.Lock()
	defer cudaPeaksMu.Unlock()
	if m, ok := cudaPeaks[name]; ok {
		return m[fmt.Sprintf("%s/%d", phase, step)]
	}
	data, err := os.ReadFile(filepath.Join("..", "..", "testdata", "torchref", name+".json"))
	if err != nil {
		panic(err)
	}
	var f eventFile
	if err := json.Unmarshal(data, &f); err != nil {
		panic(err)
	}
	m := map[string]int64{}
	for _, p := range f.Phases {
		skip := map[int]bool{}
		total, peak := p.Start, p.Start
		for _, e := range p.Events {
			if e.Host != nil {
				continue
			}
			if e.Ev == "alloc" && e.Transient && e.Top != nil && cpuOnlyTop(*e.Top) {
				skip[e.ID] = true
			}
			if skip[e.ID] {
				continue
			}
			total += e.Bytes
			peak = max(peak, total)
		}
		m[fmt.Sprintf("%s/%d", p.Phase, p.Step)] = peak
	}
	cudaPeaks[name] = m
	return m[fmt.Sprintf("%s/%d", phase, step)]
}

func cpuOnlyTop(top string) bool {
	for _, t := range transientTops {
		if top == t || strings.HasSuffix(top, ": "+t) {
			return true
		}
	}
	return false
}

// dropCPUTransients is the correct function of a case with convolutions
// or batch norms.
func dropCPUTransients(name string) func(string, int, *figures) {
	return func(phase string, step int, f *figures) {
		f.Peak = peakWithoutCPUTransients(name, phase, step)
	}
}

func init() {
	conv := opCase("op_conv2d", randn("x", "32, 3, 32, 32", true)+randn("w", "16, 3, 3, 3", true)+randn("b", "16", true)+
		"go = tensor.ones(32, 16, 32, 32, device=\"cuda\")\n",
		"nn.functional.conv2d(x, w, b, padding=1)", false)
	conv.correct = dropCPUTransients("op_conv2d")
	pool := opCase("op_max_pool2d", randn("x", "32, 16, 32, 32", true)+"go = tensor.ones(32, 16, 16, 16, device=\"cuda\")\n",
		"nn.functional.max_pool2d(x, 2)", false)
	bn := opCase("op_batch_norm", randn("x", "32, 16, 32, 32", true)+
		"rm = tensor.zeros(16, device=\"cuda\")\nrv = tensor.ones(16, device=\"cuda\")\n"+
		randn("w", "16", true)+randn("b", "16", true)+"go = tensor.ones(32, 16, 32, 32, device=\"cuda\")\n",
		"nn.functional.batch_norm(x, rm, rv, w, b, training=True)", false)
	bn.correct = dropCPUTransients("op_batch_norm")
	addGolden(conv, pool, bn, cnnCase())
}

// cnnCase is cnn_bn: two conv/BN/ReLU/max-pool blocks and a linear head,
// SGD with momentum. Its loss is nn.functional.cross_entropy, which
// another change adds; until then the case fails at its loss phase.
func cnnCase() goldenCase {
	setup := `
model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
    nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
    nn.Flatten(), nn.Linear(32 * 8 * 8, 10)).to("cuda")
x = tensor.randn(32, 3, 32, 32, device="cuda")
y = tensor.randint(0, 10, [32], device="cuda")
opt = optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
`
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
	return goldenCase{name: "cnn_bn", setup: setup, phases: phases, correct: dropCPUTransients("cnn_bn")}
}
