package nn_test

import (
	"bytes"
	"strconv"
	"testing"

	"github.com/memsh/memsh/scope"
)

// TestCheckpointMLPSum runs golden_checkpoint_test.go's checkpoint_mlp
// model with a sum() loss (no cross_entropy needed) on a simulated GPU and
// checks its figures against closed forms (float32; A = 64×1024×4 =
// 262144 bytes, one activation):
//
//   - forward: fc1's addmm (A), relu (A), addmm freed; in the checkpoint the
//     block's addmm (A) and relu (A), addmm freed; fc3's output 2560. Only the
//     block's input (relu(fc1(x)), which fc1's relu also saves) and its output
//     stay: end 2A+2560, peak 3A. No saved tensor of the block is kept.
//   - backward, at the block's ReluBackward0: the recomputation allocates
//     the block's addmm and relu (2A, the addmm freed at once), then
//     threshold_backward (A); live then are the outputs out (2560), loss and
//     the implicit gradient (512 each), fc3's grads (40960+512), the block
//     input (A), the incoming gradient (A), the recomputed relu (A) and the
//     new gradient (A): 4A+45056. The whole backward's peak is later, at
//     fc1's AddmmBackward0: grads of fc3 and the block (45056−2560−1024+
//     4194304+4096), the incoming gradient (A), fc1's weight grad 2097152 and
//     bias grad 4096 = 6606848; the end is the parameters' grads
//     (6341120) plus out and loss (3072).
func TestCheckpointMLPSum(t *testing.T) {
	var out bytes.Buffer
	s, err := scope.New(scope.Options{Device: "sim:8GiB", Out: &out, Err: &out, Quiet: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	setup := `
fc1 = nn.Linear(512, 1024).to("cuda")
block = nn.Sequential(nn.Linear(1024, 1024), nn.ReLU()).to("cuda")
fc3 = nn.Linear(1024, 10).to("cuda")
seen = []
def run(h):
    # the block, noting the allocated bytes each time it starts (forward, recomputation)
    seen.append(cuda.memory_allocated())
    return block(h)
def forward(x):
    h = nn.functional.relu(fc1(x))
    h = nn.checkpoint(run, h, use_reentrant=False)
    return fc3(h)
x = tensor.randn(64, 512, device="cuda")
`
	if err := s.Exec("setup.star", setup); err != nil {
		t.Fatalf("setup: %v\n%s", err, out.String())
	}
	mgr := s.Manager()
	gpu := mgr.GPU(0)
	measure := func() int64 { mgr.Reclaim(); return int64(gpu.Allocated()) }
	const A = 64 * 1024 * 4
	base := measure()
	for _, p := range []struct {
		code      string
		end, peak int64
	}{
		{code: "out = forward(x)", end: 2*A + 2560, peak: 3 * A},
		{code: "loss = out.sum()", end: 2*A + 2560 + 512, peak: 2*A + 2560 + 512},
		{code: "loss.backward()", end: 6341120 + 3072, peak: 6606848},
	} {
		mgr.ResetPeakStats(gpu)
		if err := s.Exec("phase.star", p.code); err != nil {
			t.Fatalf("%s: %v\n%s", p.code, err, out.String())
		}
		peak := int64(peakOf(gpu)) - base
		end := measure() - base
		if end != p.end || peak != p.peak {
			t.Errorf("%s: got end %d peak %d, want end %d peak %d", p.code, end, peak, p.end, p.peak)
		}
	}
	// The block ran twice: in the forward with the block input alive (A),
	// and in the backward's recomputation, when ReluBackward0 of the block
	// first unpacked a saved tensor: out, loss, the implicit gradient and
	// fc3's grads (45056), the block input (A) and the gradient of the
	// block's output (A); none of the block's activations was kept.
	if err := s.Exec("seen.star", "seen = [n - "+itoa(base)+" for n in seen]"); err != nil {
		t.Fatal(err)
	}
	if got, want := s.Globals()["seen"].String(), "["+itoa(A)+", "+itoa(2*A+45056)+"]"; got != want {
		t.Errorf("allocated at the block's starts: got %s, want %s", got, want)
	}
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }
