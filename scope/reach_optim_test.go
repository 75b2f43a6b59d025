package scope_test

import (
	"fmt"
	"io"
	"testing"

	"github.com/memsh/memsh/backend"
	"github.com/memsh/memsh/scope"
)

// TestOptimReclaimsNeedNoCollection: the steps of the memory-saving
// optimizers, of the loops (foreach=False), GradScaler's step (its
// unscale_'s inv_scale and found_inf), clipping and accumulation free
// their temporaries
// by the reach walk (tensor/optim's frame drops
// what it made; the loops hold what they compute with and tell what they
// drop), never by a Go collection, in exact peak mode.
func TestOptimReclaimsNeedNoCollection(t *testing.T) {
	t.Setenv("MEMSH_VERIFY_RECLAIM", "1")
	const model = `
m = nn.Sequential(nn.Linear(512, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10)).to("cuda")
x = tensor.randn([16, 512], device="cuda")
y = tensor.randint(0, 10, [16], device="cuda")
nn.functional.cross_entropy(m(x), y).backward()
`
	cases := []struct{ name, setup, measured string }{
		{"transformers Adafactor", model + "opt = optim.transformers.Adafactor(m.parameters(), beta1=0.9, weight_decay=0.01)\n", "opt.step()\nopt.step()"},
		{"torch Adafactor", model + "opt = optim.Adafactor(m.parameters())\n", "opt.step()\nopt.step()"},
		{"torch Adafactor foreach", model + "opt = optim.Adafactor(m.parameters(), foreach=True)\n", "opt.step()\nopt.step()"},
		{"AdamW8bit", model + "opt = optim.bnb.AdamW8bit(m.parameters())\n", "opt.step()\nopt.step()"},
		{"fused AdamW", model + "opt = optim.AdamW(m.parameters(), fused=True)\n", "opt.step()\nopt.step()"},
		{"Adam loop with weight decay", model + "opt = optim.Adam(m.parameters(), weight_decay=0.1, foreach=False)\n", "opt.step()\nopt.step()"},
		{"SGD loop, Nesterov", model + "opt = optim.SGD(m.parameters(), lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.1, foreach=False)\n", "opt.step()\nopt.step()"},
		{"GradScaler step", model + "opt = optim.AdamW(m.parameters())\nscaler = optim.GradScaler()\nscaler.scale(nn.functional.cross_entropy(m(x), y)).backward()\n",
			"scaler.step(opt)\nscaler.update()"},
		{"clip_grad_norm_", model, "n = nn.utils.clip_grad_norm_(m.parameters(), 1.0)\nn = None"},
		{"accumulation", model, "nn.functional.cross_entropy(m(x), y).backward()"},
	}
	for _, mode := range []backend.PeakMode{backend.PeakExact} {
		for _, c := range cases {
			t.Run(c.name, func(t *testing.T) {
				s, err := scope.New(scope.Options{Device: "sim:4GiB", Peak: mode, Out: io.Discard, Err: io.Discard})
				if err != nil {
					t.Fatal(err)
				}
				defer s.Close()
				if err := s.Exec("setup.star", c.setup); err != nil {
					t.Fatal(err)
				}
				before := s.Manager().Stats()
				if err := s.Exec("measured.star", c.measured); err != nil {
					t.Fatal(err)
				}
				st := s.Manager().Stats().Since(before)
				if st.Reclaims == 0 || st.Collections() != 0 {
					t.Fatalf("%d reclaims, %d of them collections; want some, none", st.Reclaims, st.Collections())
				}
			})
		}
	}
}

// TestOptimizerStepKeepsFrames: an optimizer's step() is a pure built-in
// (it changes no reference of the values that hold the optimizer but its
// state, which the engine optimizer notes itself: made, the frame that
// met the optimizer grows by it; replaced, that frame is walked again),
// so a reclaim during the step keeps the frames below and the globals
// instead of walking the model and every parameter's state again at
// each of the step's allocations: four times the parameters walk at most
// five times the values over a first and a second step (each walk of the
// step walked them all before: about 15 times), with the same reclaims
// and figures as walks that keep nothing (every proof checked by a
// collection under MEMSH_VERIFY_RECLAIM). The loops (foreach=False) also hold what their Go code
// computes with and tell what it drops (tensor.Context.Hold,
// tensor.Dropped): no collection. The optimizer is a global (the
// globals' frame) or a local of a function below the step.
func TestOptimizerStepKeepsFrames(t *testing.T) {
	const model = `
C = 64
blocks = [nn.Sequential(nn.Linear(C, C), nn.GELU(), nn.Linear(C, C)).to("cuda") for _ in range(N)]
params = [p for b in blocks for p in b.parameters()]
for p in params:
    p.grad = tensor.ones(p.shape, device = "cuda")
`
	for _, c := range []struct {
		name, optimizer string
		local           bool
	}{
		{"Adam loop with weight decay", "optim.Adam(params, weight_decay = 0.1, foreach = False)", true},
		{"SGD loop, Nesterov", "optim.SGD(params, lr = 0.1, momentum = 0.9, nesterov = True, weight_decay = 0.1, foreach = False)", false},
		{"torch Adafactor", "optim.Adafactor(params)", false},
	} {
		t.Run(c.name+", global", func(t *testing.T) {
			walksLinearly(t, model+"opt = "+c.optimizer+"\n", "opt.step()\nopt.step()")
		})
		if c.local {
			t.Run(c.name+", local", func(t *testing.T) {
				walksLinearly(t, model, fmt.Sprintf("def train():\n    opt = %s\n    opt.step()\n    opt.step()\ntrain()", c.optimizer))
			})
		}
	}
}
