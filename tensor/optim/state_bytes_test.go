package optim_test

import (
	"testing"

	"github.com/memsh/memsh/backend"
	"github.com/memsh/memsh/backend/host"
	"github.com/memsh/memsh/backend/sim"
	"github.com/memsh/memsh/tensor"
	"github.com/memsh/memsh/tensor/autograd"
	"github.com/memsh/memsh/tensor/optim"
)

func round512(n uint64) uint64 {
	if n == 0 {
		return 0
	}
	return (n + 511) / 512 * 512
}

// setup makes parameters of the given shapes with gradients on a meta
// simulated GPU and returns them and the GPU's allocator.
func setup(t *testing.T, shapes [][]int) ([]*tensor.Tensor, *gpuFigures) {
	t.Helper()
	gpu := backend.NewCachingAllocator(sim.New(sim.Spec{Count: 1, Total: 16 << 30, Meta: true})[0], 0)
	m := backend.NewManager(backend.Config{GPUs: []backend.Allocator{gpu}, Host: host.NewAllocator(), Peak: backend.PeakExact})
	t.Cleanup(m.Close)
	c := tensor.NewContext(m)
	var ps []*tensor.Tensor
	for _, s := range shapes {
		p, err := tensor.Zeros(c, s, tensor.Float32, "cuda")
		if err != nil {
			t.Fatal(err)
		}
		if err := autograd.SetRequiresGrad(p, true); err != nil {
			t.Fatal(err)
		}
		g, err := tensor.Zeros(c, s, tensor.Float32, "cuda")
		if err != nil {
			t.Fatal(err)
		}
		if err := autograd.SetGrad(p, g); err != nil {
			t.Fatal(err)
		}
		ps = append(ps, p)
	}
	t.Cleanup(c.Hold(ps...)) // the parameters (and their gradients) are live
	return ps, &gpuFigures{m, gpu}
}

// gpuFigures reads the GPU's allocated bytes after a reclaim (the
// temporaries a step let go of are freed at the Manager's next reclaim).
type gpuFigures struct {
	m   *backend.Manager
	gpu backend.Allocator
}

func (g *gpuFigures) Allocated() uint64 {
	g.m.Reclaim()
	return g.gpu.Allocated()
}

// stepState runs one step and returns the device bytes it left (the state).
func stepState(t *testing.T, o optim.Optimizer, gpu *gpuFigures) uint64 {
	t.Helper()
	// the optimizer is live, as its Starlark value keeps it
	defer o.Params()[0].Context().Root(o.(tensor.ReachRoot))()
	before := gpu.Allocated()
	if err := o.Step(); err != nil {
		t.Fatal(err)
	}
	return gpu.Allocated() - before
}

var shapes = [][]int{{1000, 300}, {300}, {64, 100}, {100}, {4096}, {3, 5, 7}, {10, 4000}}

// TestStateBytesClosedForms checks the exported closed forms of the
// optimizers' state against what a first step leaves on the device.
func TestStateBytesClosedForms(t *testing.T) {
	t.Run("AdamW8bit", func(t *testing.T) {
		for _, paged := range []bool{false, true} {
			for _, minSize := range []int{4096, 100} {
				ps, gpu := setup(t, shapes)
				o, err := optim.NewAdam8bit(ps, 1e-3, 0.9, 0.999, 1e-8, 0.01, false, 32, minSize, paged, true)
				if err != nil {
					t.Fatal(err)
				}
				want, wantPaged := uint64(2*1024), uint64(0) // the maps
				for _, p := range ps {
					d, pg := optim.Adam8bitStateBytes(uint64(p.Numel()), minSize, paged, round512)
					want += d
					wantPaged += pg
				}
				if got := stepState(t, o, gpu); got != want || o.PagedBytes() != wantPaged {
					t.Errorf("paged %v min %d: state %d paged %d, want %d and %d", paged, minSize, got, o.PagedBytes(), want, wantPaged)
				}
			}
		}
	})
	t.Run("transformers.Adafactor", func(t *testing.T) {
		for _, beta1 := range []float64{nanF(), 0.9} {
			ps, gpu := setup(t, shapes)
			o, err := optim.NewHFAdafactor(ps, 1e-3, 1e-30, 1e-3, 1, -0.8, beta1, 0, false, false, false)
			if err != nil {
				t.Fatal(err)
			}
			var want uint64
			for _, p := range ps {
				want += optim.HFAdafactorStateBytes(p.Shape(), beta1 == beta1, round512) + 512 // + the RMS tensor
			}
			if got := stepState(t, o, gpu); got != want {
				t.Errorf("beta1 %v: state %d, want %d", beta1, got, want)
			}
		}
	})
	t.Run("Adafactor", func(t *testing.T) {
		for _, foreach := range []bool{false, true} {
			ps, gpu := setup(t, shapes)
			o, err := optim.NewAdafactor(ps, 1e-2, -0.8, nanF(), 1e-3, 1, 0, foreach, false)
			if err != nil {
				t.Fatal(err)
			}
			var want uint64
			for _, p := range ps {
				want += optim.AdafactorStateBytes(p.Shape(), 4, round512)
			}
			if got := stepState(t, o, gpu); got != want {
				t.Errorf("foreach %v: state %d, want %d", foreach, got, want)
			}
		}
	})
}

func nanF() float64 {
	z := 0.0
	return z / z
}
