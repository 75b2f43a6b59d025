package tensor_test

import (
	"math"
	"slices"
	"testing"

	"github.com/memsh/memsh/tensor"
)

// TestOptimOps checks vector_norm over every dimension set and order,
// clamp, clamp_, rsqrt_, square_ and reciprocal against values worked out
// by hand, on a non-contiguous (transposed) input as well.
func TestOptimOps(t *testing.T) {
	c := newContext(t)
	a, err := tensor.FromFloat64s(c, []float64{3, -4, 0, 1, 2, -2}, []int{2, 3}, tensor.Undefined, "cuda")
	if err != nil {
		t.Fatal(err)
	}
	at, _ := tensor.T(a) // [[3, 1], [-4, 2], [0, -2]]
	near := func(got, want []float64) bool {
		if len(got) != len(want) {
			return false
		}
		for i := range got {
			if math.Abs(got[i]-want[i]) > 1e-5*math.Max(1, math.Abs(want[i])) {
				return false
			}
		}
		return true
	}
	inf := math.Inf(1)
	for _, tc := range []struct {
		name    string
		in      *tensor.Tensor
		ord     float64
		dims    []int
		keepdim bool
		shape   []int
		vals    []float64
	}{
		{"l2 all", a, 2, nil, false, []int{}, []float64{math.Sqrt(34)}},
		{"l1 all", a, 1, nil, false, []int{}, []float64{12}},
		{"inf all", a, inf, nil, false, []int{}, []float64{4}},
		{"-inf all", a, math.Inf(-1), nil, false, []int{}, []float64{0}},
		{"l0 all", a, 0, nil, false, []int{}, []float64{5}},
		{"l3 all", a, 3, nil, false, []int{}, []float64{math.Cbrt(27 + 64 + 1 + 8 + 8)}},
		{"rows keepdim", a, 2, []int{-1}, true, []int{2, 1}, []float64{5, 3}},
		{"cols keepdim", a, 2, []int{-2}, true, []int{1, 3}, []float64{math.Sqrt(10), math.Sqrt(20), 2}},
		{"transposed rows", at, 2, []int{1}, false, []int{3}, []float64{math.Sqrt(10), math.Sqrt(20), 2}},
	} {
		r, err := tensor.VectorNorm(tc.in, tc.ord, tc.dims, tc.keepdim)
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		got, _ := r.ToFloat64s()
		if !slices.Equal(r.Shape(), tc.shape) || r.DType() != tensor.Float32 || !near(got, tc.vals) {
			t.Errorf("%s: got %v %s %v, want %v %v", tc.name, r.Shape(), r.DType(), got, tc.shape, tc.vals)
		}
		if v, err := tensor.NormOf(tc.in, tc.ord); tc.dims == nil && (err != nil || !near([]float64{v}, tc.vals)) {
			t.Errorf("%s: NormOf got %v %v, want %v", tc.name, v, err, tc.vals)
		}
	}
	lo, hi := -1.0, 2.0
	r, err := tensor.Clamp(a, &lo, &hi)
	if got, _ := r.ToFloat64s(); err != nil || !slices.Equal(got, []float64{2, -1, 0, 1, 2, -1}) {
		t.Errorf("clamp: %v %v", got, err)
	}
	if _, err := tensor.Clamp(a, nil, nil); err == nil {
		t.Error("clamp with no bound: no error")
	}
	b, _ := tensor.Clone(a)
	if err := tensor.Clamp_(b, nil, &hi); err != nil {
		t.Fatal(err)
	}
	if got, _ := b.ToFloat64s(); !slices.Equal(got, []float64{2, -4, 0, 1, 2, -2}) {
		t.Errorf("clamp_ max: %v", got)
	}
	if err := tensor.Square_(b); err != nil {
		t.Fatal(err)
	}
	if err := tensor.Rsqrt_(b); err != nil {
		t.Fatal(err)
	}
	if got, _ := b.ToFloat64s(); !near(got, []float64{0.5, 0.25, inf, 1, 0.5, 0.5}) {
		t.Errorf("square_ then rsqrt_: %v", got)
	}
	rec, _ := tensor.Reciprocal(a)
	if got, _ := rec.ToFloat64s(); !near(got, []float64{1.0 / 3, -0.25, inf, 1, 0.5, -0.5}) {
		t.Errorf("reciprocal: %v", got)
	}
	ints, _ := tensor.FromFloat64s(c, []float64{1, 2}, []int{2}, tensor.Int64, "cuda")
	if _, err := tensor.VectorNorm(ints, 2, nil, false); err == nil {
		t.Error("vector_norm of int64: no error")
	}
}

// TestInPlaceFastLoops: the optimizers' in-place ops on contiguous
// float32 tensors (their direct loops, f32Loop) give the same bits as on
// a transposed view of the same values (the generic elementwise path),
// which computes each element through the op's float64 function.
func TestInPlaceFastLoops(t *testing.T) {
	c := newContext(t)
	const r, k = 67, 129 // odd sizes: partial chunks
	rnd := func() *tensor.Tensor {
		x, err := tensor.Randn(c, []int{r, k}, tensor.Float32, "cuda")
		if err != nil {
			t.Fatal(err)
		}
		return x
	}
	// pair returns a contiguous copy of x and a transposed view of a
	// transposed copy: equal values, one contiguous and one not
	pair := func(x *tensor.Tensor) (*tensor.Tensor, *tensor.Tensor) {
		a, _ := tensor.Clone(x)
		tt, _ := tensor.T(x)
		tc, _ := tensor.Contiguous(tt)
		b, _ := tensor.T(tc)
		if b.IsContiguous() {
			t.Fatal("the transposed view is contiguous")
		}
		return a, b
	}
	b0, c0 := rnd(), rnd()
	pos, _ := tensor.Abs(c0)
	_ = tensor.AddScalar_(pos, 0.5) // a divisor away from 0
	for _, tc := range []struct {
		name string
		op   func(dst, b, c *tensor.Tensor) error
	}{
		{"lerp_", func(d, b, _ *tensor.Tensor) error { return tensor.Lerp_(d, b, 0.1) }},
		{"addcmul_", func(d, b, c *tensor.Tensor) error { return tensor.Addcmul_(d, b, c, 0.001) }},
		{"addcdiv_", func(d, b, c *tensor.Tensor) error { return tensor.Addcdiv_(d, b, c, -0.3) }},
		{"add_", func(d, b, _ *tensor.Tensor) error { return tensor.Add_(d, b, 0.7) }},
		{"mul_", func(d, _, _ *tensor.Tensor) error { return tensor.MulScalar_(d, 0.999) }},
		{"add_ scalar", func(d, _, _ *tensor.Tensor) error { return tensor.AddScalar_(d, 1e-8) }},
		{"div_", func(d, _, _ *tensor.Tensor) error { return tensor.DivScalar_(d, 0.3) }},
	} {
		fast, slow := pair(rnd())
		bf, bs := pair(b0)
		cf, cs := pair(pos)
		if err := tc.op(fast, bf, cf); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if err := tc.op(slow, bs, cs); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		got, _ := fast.ToFloat64s()
		want, _ := slow.ToFloat64s()
		if !slices.Equal(got, want) {
			t.Errorf("%s: the direct loop differs from the elementwise path", tc.name)
		}
	}
}
