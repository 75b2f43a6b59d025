package autograd_test

import (
	"runtime"
	"strings"
	"testing"

	"github.com/memsh/memsh/tensor"
	"github.com/memsh/memsh/tensor/autograd"
	tnn "github.com/memsh/memsh/tensor/nn"
)

// TestAutocastLinear: a Linear under bf16 autocast saves bf16 copies of
// its input and weight (AddmmBackward0's mat1 and mat2, through
// ToCopyBackward0), caches the casts of the leaves that require grad
// while the region lasts and empties the cache when it ends; once the
// graph is freed no bf16 copy remains.
func TestAutocastLinear(t *testing.T) {
	for _, meta := range []bool{false, true} {
		f := newFixture(t, meta)
		c := f.ctx
		must := mustT(t)
		const N, I, O = 48, 200, 120
		w, b := must2(t)(tnn.NewLinearParams(c, I, O, true, "cuda:0", tensor.Float32))
		x := must(tensor.Randn(c, []int{N, I}, tensor.Float32, "cuda:0"))
		must(x, autograd.SetRequiresGrad(x, true))
		base := f.allocated()
		var y *tensor.Tensor
		err := autograd.Autocast(c, true, tensor.BFloat16, func() error {
			var err error
			y, err = autograd.Linear(x, w, b)
			if n := autograd.AutocastCacheLen(c); n != 3 {
				t.Errorf("cache inside the region: %d casts, want 3 (x, weight, bias)", n)
			}
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		if n := autograd.AutocastCacheLen(c); n != 0 {
			t.Errorf("cache after the region: %d casts", n)
		}
		if y.DType() != tensor.BFloat16 {
			t.Fatalf("dtype %s", y.DType())
		}
		fn := autograd.GradFn(y)
		if fn.Name() != "AddmmBackward0" {
			t.Fatalf("grad_fn %s", fn.Name())
		}
		saved := fn.SavedTensors()
		if len(saved) != 2 {
			t.Fatalf("saved %d tensors", len(saved))
		}
		for _, s := range saved {
			if s.DType() != tensor.BFloat16 {
				t.Errorf("saved %v in %s", s.Shape(), s.DType())
			}
		}
		// bias and input casts, then the transposed cast of the weight
		for i, e := range fn.NextFunctions() {
			want := []string{"ToCopyBackward0", "ToCopyBackward0", "TBackward0"}[i]
			if e.Node == nil || e.Node.Name() != want {
				t.Errorf("next %d: %v, want %s", i, e.Node, want)
			}
		}
		want := round512(N*I*2) + round512(O*I*2) + round512(N*O*2)
		if got := f.allocated() - base; got != want {
			t.Errorf("meta=%v after forward: %d, want %d (bf16 input + bf16 weight + bf16 output)", meta, got, want)
		}
		runtime.KeepAlive(y) // y holds the graph
		y, fn, saved = nil, nil, nil
		if got := f.allocated() - base; got != 0 {
			t.Errorf("meta=%v after the graph is freed: %d bytes remain", meta, got)
		}
		runtime.KeepAlive(x)
		runtime.KeepAlive(w)
		runtime.KeepAlive(b)
	}
}

// TestAutocastNesting: leaving an inner region keeps the cache; leaving
// the outermost clears it; enabled=false inside turns casting off.
func TestAutocastNesting(t *testing.T) {
	f := newFixture(t, true)
	c := f.ctx
	w, _ := must2(t)(tnn.NewLinearParams(c, 8, 4, false, "cuda:0", tensor.Float32))
	x := mustT(t)(tensor.Randn(c, []int{2, 8}, tensor.Float32, "cuda:0"))
	err := autograd.Autocast(c, true, tensor.Float16, func() error {
		if err := autograd.Autocast(c, true, tensor.Float16, func() error {
			_, err := autograd.Linear(x, w, nil)
			return err
		}); err != nil {
			return err
		}
		if n := autograd.AutocastCacheLen(c); n != 1 {
			t.Errorf("after the inner region: %d casts, want 1", n)
		}
		return autograd.Autocast(c, false, tensor.Float16, func() error {
			y, err := autograd.Linear(x, w, nil)
			if err == nil && y.DType() != tensor.Float32 {
				t.Errorf("autocast(enabled=False): %s", y.DType())
			}
			return err
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	if n := autograd.AutocastCacheLen(c); n != 0 {
		t.Errorf("after the outer region: %d casts", n)
	}
	if err := autograd.Autocast(c, true, tensor.Float64, func() error { return nil }); err == nil || !strings.Contains(err.Error(), "target dtype is not supported") {
		t.Errorf("float64: %v", err)
	}
}

// TestAutocastAttentionExcluded: scaled_dot_product_attention is cast to
// the lower precision as a whole; the softmax inside runs in bf16 (the
// wrapper excludes autocast), not in float32.
func TestAutocastAttentionExcluded(t *testing.T) {
	f := newFixture(t, false)
	c := f.ctx
	must := mustT(t)
	q := must(tensor.Randn(c, []int{2, 5, 4}, tensor.Float32, "cuda:0"))
	must(q, autograd.SetRequiresGrad(q, true))
	var out *tensor.Tensor
	if err := autograd.Autocast(c, true, tensor.BFloat16, func() error {
		var err error
		out, err = autograd.ScaledDotProductAttention(q, q, q, nil, 0, false, 0, false)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if out.DType() != tensor.BFloat16 {
		t.Fatalf("dtype %s", out.DType())
	}
	found := false
	seen := map[*autograd.Node]bool{}
	var walk func(n *autograd.Node)
	walk = func(n *autograd.Node) {
		if n == nil || seen[n] {
			return
		}
		seen[n] = true
		if n.Name() == "SoftmaxBackward0" {
			found = true
			for _, s := range n.SavedTensors() {
				if s.DType() != tensor.BFloat16 {
					t.Errorf("softmax saved a %s result", s.DType())
				}
			}
		}
		for _, e := range n.NextFunctions() {
			walk(e.Node)
		}
	}
	walk(autograd.GradFn(out))
	if !found {
		t.Error("no SoftmaxBackward0 in the graph")
	}
}

// TestAutocastCrossEntropy: cross_entropy is off the lists; its
// log_softmax gets an explicit dtype (the input's), so it runs in bf16,
// and nll_loss (fp32) casts the log-probabilities: NllLossBackward0 →
// ToCopyBackward0 → LogSoftmaxBackward0 (saving a bf16 result).
func TestAutocastCrossEntropy(t *testing.T) {
	f := newFixture(t, false)
	c := f.ctx
	must := mustT(t)
	x := must(tensor.Randn(c, []int{4, 10}, tensor.BFloat16, "cuda:0"))
	must(x, autograd.SetRequiresGrad(x, true))
	target := must(tensor.Zeros(c, []int{4}, tensor.Int64, "cuda:0"))
	var loss *tensor.Tensor
	if err := autograd.Autocast(c, true, tensor.BFloat16, func() error {
		var err error
		loss, err = autograd.CrossEntropy(x, target, tensor.ReductionMean, -100)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if loss.DType() != tensor.Float32 {
		t.Fatalf("loss dtype %s", loss.DType())
	}
	var names []string
	for n := autograd.GradFn(loss); n != nil; {
		names = append(names, n.Name())
		if n.Name() == "LogSoftmaxBackward0" {
			if s := n.SavedTensors(); len(s) != 1 || s[0].DType() != tensor.BFloat16 {
				t.Errorf("log_softmax saved %v", s)
			}
		}
		next := n.NextFunctions()
		n = nil
		if len(next) > 0 {
			n = next[0].Node
		}
	}
	if got := strings.Join(names, " "); got != "NllLossBackward0 ToCopyBackward0 LogSoftmaxBackward0 AccumulateGrad" {
		t.Errorf("graph: %s", got)
	}
}
