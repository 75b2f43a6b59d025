package dist

import (
	"math"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/memsh/memsh/backend"
	"github.com/memsh/memsh/internal/simtest"
	"github.com/memsh/memsh/tensor"
	"github.com/memsh/memsh/tensor/autograd"
	tnn "github.com/memsh/memsh/tensor/nn"
)

type fixture struct {
	gpu *backend.CachingAllocator
	mgr *backend.Manager
	ctx *tensor.Context
}

func newFixture(t *testing.T, meta bool) *fixture {
	f := &fixture{}
	f.ctx, f.mgr, f.gpu = simtest.New(t, 4<<30, meta)
	return f
}

// allocated collects garbage and returns the GPU's allocated bytes.
func (f *fixture) allocated() uint64 {
	runtime.GC()
	f.mgr.Reclaim()
	return f.gpu.Allocated()
}

func must[T any](t *testing.T) func(T, error) T {
	return func(v T, err error) T {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
}

// mlp is the 4-layer MLP of the DDP probes: Linear(256, 1024),
// Linear(1024, 512), Linear(512, 8192), Linear(8192, 1024), float32;
// params in registration order (weight, bias per layer).
func mlp(t *testing.T, f *fixture, dt tensor.DType) []*tensor.Tensor {
	dims := []int{256, 1024, 512, 8192, 1024}
	var ps []*tensor.Tensor
	for i := range 4 {
		w, b, err := tnn.NewLinearParams(f.ctx, dims[i], dims[i+1], true, "cuda:0", dt)
		if err != nil {
			t.Fatal(err)
		}
		ps = append(ps, w, b)
	}
	return ps
}

func forward(t *testing.T, f *fixture, ps []*tensor.Tensor, x *tensor.Tensor) *tensor.Tensor {
	h := x
	for i := 0; i < len(ps); i += 2 {
		h = must[*tensor.Tensor](t)(autograd.Linear(h, ps[i], ps[i+1]))
		if i+2 < len(ps) {
			h = must[*tensor.Tensor](t)(autograd.Unary(tensor.OpRelu, h))
		}
	}
	return must[*tensor.Tensor](t)(autograd.Sum(h, nil, false, tensor.Undefined))
}

func sizes(ts []*tensor.Tensor, idx [][]int) [][]int {
	out := make([][]int, len(idx))
	for i, b := range idx {
		for _, j := range b {
			out[i] = append(out[i], ts[j].NBytes())
		}
	}
	return out
}

// assignBuckets closes a bucket once it reaches its limit (so a bucket
// may pass it by its last tensor), keeps dtypes apart, sorts by smallest
// index without an order and keeps the closing order with one.
func TestAssignBuckets(t *testing.T) {
	f := newFixture(t, true)
	ps := mlp(t, f, tensor.Float32)
	// the gradient-ready order of the MLP's backward: last layer first,
	// bias before weight
	ready := []int{7, 6, 5, 4, 3, 2, 1, 0}
	got := assignBuckets(ps, ready, []int64{DefaultFirstBucketBytes, DefaultBucketCapBytes})
	want := [][]int{{7, 6}, {5, 4, 3, 2, 1, 0}}
	if !slices.EqualFunc(got, want, slices.Equal) {
		t.Fatalf("rebuilt buckets %v, want %v", got, want)
	}
	var total [2]int
	for i, b := range got {
		for _, j := range b {
			total[i] += ps[j].NBytes()
		}
	}
	// the probe's figures (PyTorch 1.13, gloo): 33,558,528 and 19,961,856
	if total != [2]int{33558528, 19961856} {
		t.Errorf("rebuilt bucket bytes %v, want [33558528 19961856]", total)
	}
	if got := assignBuckets(ps, nil, []int64{noLimit}); len(got) != 1 || len(got[0]) != 8 {
		t.Errorf("first-iteration buckets %v, want one of all 8", got)
	}
	// 250 MiB broadcast buckets: 200 MiB + 100 MiB reach the limit
	// together, 10 MiB is left over
	big := []*tensor.Tensor{
		must[*tensor.Tensor](t)(tensor.Empty(f.ctx, []int{50 << 20}, tensor.Float32, "cuda:0")),
		must[*tensor.Tensor](t)(tensor.Empty(f.ctx, []int{25 << 20}, tensor.Float32, "cuda:0")),
		must[*tensor.Tensor](t)(tensor.Empty(f.ctx, []int{5 << 20}, tensor.BFloat16, "cuda:0")),
		must[*tensor.Tensor](t)(tensor.Empty(f.ctx, []int{10 << 20}, tensor.Float32, "cuda:0")),
	}
	got = assignBuckets(big, nil, []int64{DefaultBroadcastBucketBytes})
	if want := [][]int{{0, 1}, {2}, {3}}; !slices.EqualFunc(got, want, slices.Equal) {
		t.Errorf("broadcast buckets %v (bytes %v), want %v", got, sizes(big, got), want)
	}
}

// One rank of a 4-rank DDP step on a simulated GPU with data: the
// constructor's tensors, the bucket of all parameters, gradients equal to
// a plain backward's (divided by 4 into the bucket, summed back by the
// all-reduce), the rebuild in gradient-ready order, gradient_as_bucket_view
// and the unused-parameter error.
func TestReducer(t *testing.T) {
	for _, view := range []bool{false, true} {
		f := newFixture(t, false)
		ps := mlp(t, f, tensor.Float32)
		x := must[*tensor.Tensor](t)(tensor.Randn(f.ctx, []int{4, 256}, tensor.Float32, "cuda:0"))
		params := f.allocated()
		const P = 53520384 // the parameters' bytes, each a multiple of 512
		// The bucket's block: P rounded up to 2 MiB for its own segment,
		// whose remainder (under 1 MiB) is not split off; after the
		// rebuild the two buckets split the freed block the same way (a
		// 33,558,528-byte block and the rest), so the figure stands.
		const bucketBlock = 26 << 21
		if params != P+4*256*4 {
			t.Fatalf("parameters and input: %d", params)
		}
		// the reference gradients, from a backward without DDP
		if err := autograd.Backward([]*tensor.Tensor{forward(t, f, ps, x)}, nil, false); err != nil {
			t.Fatal(err)
		}
		var want []*tensor.Tensor
		for _, p := range ps {
			want = append(want, autograd.Grad(p))
			if err := autograd.SetGrad(p, nil); err != nil {
				t.Fatal(err)
			}
		}
		g := must[*Group](t)(New(4, 1, "nccl"))
		base := f.allocated()
		f.mgr.ResetPeakStats(f.gpu)
		if err := g.VerifyParamShapes(ps); err != nil {
			t.Fatal(err)
		}
		// param_size_tensor, 4 gathered counts, 16 × 16 dims of metadata
		if peak, end := f.gpu.Stats()["allocated_bytes.all.peak"], f.allocated(); uint64(peak) != base+6*512 || end != base {
			t.Errorf("verify: peak %d end %d, want %d and %d", peak, end, base+6*512, base)
		}
		r := must[*Reducer](t)(g.NewReducer(ps, ReducerOptions{GradientAsBucketView: view}))
		if got := f.allocated(); got != base+bucketBlock {
			t.Errorf("after the constructor: %d, want %d", got-base, bucketBlock)
		}
		if b := r.Buckets(); !slices.Equal(b, []int64{P}) {
			t.Errorf("buckets %v, want one of %d", b, P)
		}
		for step := 1; step <= 2; step++ {
			if err := r.Prepare(true, true); err != nil {
				t.Fatal(err)
			}
			if err := autograd.Backward([]*tensor.Tensor{forward(t, f, ps, x)}, nil, false); err != nil {
				t.Fatal(err)
			}
			grads := uint64(P)
			if view {
				grads = 0 // the gradients are the bucket's views
			}
			if got := f.allocated(); got != base+bucketBlock+grads {
				t.Errorf("view=%v step %d after backward: %d, want parameters + bucket + %d", view, step, got-base, grads)
			}
			for i, p := range ps {
				gr := autograd.Grad(p)
				if view && gr.Storage() == want[i].Storage() {
					t.Fatal("not a view")
				}
				if view != (gr.Storage() == r.buckets[r.where[i].bucket].flat.Storage()) {
					t.Errorf("view=%v: gradient %d in a bucket: %v", view, i, !view)
				}
				if d := maxDiff(t, gr, want[i]); d > 1e-5 {
					t.Errorf("step %d gradient %d differs from the plain backward's by %g", step, i, d)
				}
				if err := autograd.SetGrad(p, nil); err != nil {
					t.Fatal(err)
				}
			}
			if step == 1 && r.Rebuilt() {
				t.Error("rebuilt before the second forward")
			}
		}
		if !r.Rebuilt() || !slices.Equal(r.Buckets(), []int64{33558528, 19961856}) {
			t.Errorf("after the rebuild: %v", r)
		}
		// a backward that leaves a parameter without a gradient: the next
		// forward fails as PyTorch's does
		if err := r.Prepare(true, true); err != nil {
			t.Fatal(err)
		}
		y := must[*tensor.Tensor](t)(autograd.Linear(x, ps[0], nil))
		if err := autograd.Backward([]*tensor.Tensor{must[*tensor.Tensor](t)(autograd.Sum(y, nil, false, tensor.Undefined))}, nil, false); err != nil {
			t.Fatal(err)
		}
		if err := r.Prepare(true, true); err == nil || !strings.Contains(err.Error(), "Expected to have finished reduction in the prior iteration") {
			t.Errorf("unused parameters: %v", err)
		}
		r.Remove()
	}
}

func maxDiff(t *testing.T, a, b *tensor.Tensor) float64 {
	t.Helper()
	av := must[[]float64](t)(a.ToFloat64s())
	bv := must[[]float64](t)(b.ToFloat64s())
	m := 0.0
	for i := range av {
		m = math.Max(m, math.Abs(av[i]-bv[i])/(1+math.Abs(bv[i])))
	}
	return m
}
