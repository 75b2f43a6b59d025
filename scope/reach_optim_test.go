package scope_test

import (
	"io"
	"testing"

	"github.com/memsh/memsh/backend"
	"github.com/memsh/memsh/scope"
)

// TestOptimReclaimsNeedNoCollection: the steps of the memory-saving
// optimizers, clipping and accumulation free their temporaries by the
// reach walk (tensor/optim's frame drops what it made), never by a Go
// collection, in exact peak mode.
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
