package autograd_test

import (
	"runtime"
	"strings"
	"testing"

	"github.com/memsh/memsh/backend"
	"github.com/memsh/memsh/internal/simtest"
	"github.com/memsh/memsh/tensor"
	"github.com/memsh/memsh/tensor/autograd"
	tnn "github.com/memsh/memsh/tensor/nn"
)

type fixture struct {
	t   *testing.T
	gpu *backend.CachingAllocator
	mgr *backend.Manager
	ctx *tensor.Context
}

func newFixture(t *testing.T, meta bool) *fixture {
	f := &fixture{t: t}
	f.ctx, f.mgr, f.gpu = simtest.New(t, 1<<30, meta)
	return f
}

// allocated reclaims garbage and returns the GPU's allocated bytes.
func (f *fixture) allocated() uint64 {
	runtime.GC()
	f.mgr.Reclaim()
	return f.gpu.Allocated()
}

func round512(n int) uint64 {
	if n == 0 {
		return 0
	}
	return uint64((n + 511) / 512 * 512)
}

func mustT(t *testing.T) func(v *tensor.Tensor, err error) *tensor.Tensor {
	return func(v *tensor.Tensor, err error) *tensor.Tensor {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
}

// TestMLPClosedForms checks a Linear-ReLU-Linear step's memory against
// closed forms: parameters, saved activations after forward, gradients
// after backward (saved tensors all freed), Adam state after the first
// step, and nothing but parameters after zero_grad.
func TestMLPClosedForms(t *testing.T) {
	for _, meta := range []bool{false, true} {
		f := newFixture(t, meta)
		c := f.ctx
		must := mustT(t)
		const B, In, H, Out = 64, 512, 1024, 10
		w1, b1 := must2(t)(tnn.NewLinearParams(c, In, H, true, "cuda:0", tensor.Float32))
		w2, b2 := must2(t)(tnn.NewLinearParams(c, H, Out, true, "cuda:0", tensor.Float32))
		params := round512(H*In*4) + round512(H*4) + round512(Out*H*4) + round512(Out*4)
		if got := f.allocated(); got != params {
			t.Fatalf("params: %d, want %d", got, params)
		}
		x := must(tensor.Randn(c, []int{B, In}, tensor.Float32, "cuda:0"))
		base := params + round512(B*In*4)
		h := must(autograd.Linear(x, w1, b1))
		r := must(autograd.Relu(h))
		h = nil
		y := must(autograd.Linear(r, w2, b2))
		r = nil
		loss := must(autograd.Sum(y, nil, false, tensor.Undefined))
		y = nil
		// Saved: relu's result (mat1 of the second addmm too), the output of
		// the second linear is freed (only loss holds its graph), the loss.
		if got, want := f.allocated(), base+round512(B*H*4)+round512(4); got != want {
			t.Errorf("meta=%v after forward: %d, want %d", meta, got, want)
		}
		if name := autograd.GradFn(loss).Name(); name != "SumBackward0" {
			t.Errorf("grad_fn %q", name)
		}
		if err := autograd.Backward([]*tensor.Tensor{loss}, nil, false); err != nil {
			t.Fatal(err)
		}
		if got, want := f.allocated(), base+params+round512(4); got != want {
			t.Errorf("meta=%v after backward: %d, want %d (params %d)", meta, got, want, params)
		}
		for _, p := range []*tensor.Tensor{w1, b1, w2, b2} {
			g := autograd.Grad(p)
			if g == nil || !equalInts(g.Shape(), p.Shape()) {
				t.Fatalf("grad of %v: %v", p.Shape(), g)
			}
		}
		err := autograd.Backward([]*tensor.Tensor{loss}, nil, false)
		if err == nil || !strings.Contains(err.Error(), "Trying to backward through the graph a second time") {
			t.Errorf("second backward: %v", err)
		}
		runtime.KeepAlive(x)
	}
}

func must2(t *testing.T) func(a, b *tensor.Tensor, err error) (*tensor.Tensor, *tensor.Tensor) {
	return func(a, b *tensor.Tensor, err error) (*tensor.Tensor, *tensor.Tensor) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return a, b
	}
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// Two Sessions (two contexts) run backward at the same time: the engine
// keeps no state outside its call (go test -race checks it).
func TestConcurrentBackward(t *testing.T) {
	done := make(chan error, 2)
	for range 2 {
		f := newFixture(t, false)
		go func() {
			for range 10 {
				w, b := tensorPair(f)
				if w == nil {
					done <- nil
					return
				}
				x, err := tensor.Randn(f.ctx, []int{8, 16}, tensor.Float32, "cuda:0")
				if err != nil {
					done <- err
					return
				}
				h, err := autograd.Linear(x, w, b)
				if err != nil {
					done <- err
					return
				}
				l, err := autograd.Sum(h, nil, false, tensor.Undefined)
				if err != nil {
					done <- err
					return
				}
				if err := autograd.Backward([]*tensor.Tensor{l}, nil, false); err != nil {
					done <- err
					return
				}
				if autograd.Grad(w) == nil {
					done <- errNoGrad
					return
				}
			}
			done <- nil
		}()
	}
	for range 2 {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
}

var errNoGrad = errorString("no gradient")

type errorString string

func (e errorString) Error() string { return string(e) }

func tensorPair(f *fixture) (*tensor.Tensor, *tensor.Tensor) {
	w, b, err := tnn.NewLinearParams(f.ctx, 16, 4, true, "cuda:0", tensor.Float32)
	if err != nil {
		return nil, nil
	}
	return w, b
}
