package tensor

import (
	"math"
	"math/rand/v2"
	"testing"
)

// TestActivationsVectorised: silu, GELU's tanh form, softmax and
// log_softmax of contiguous float32 and bfloat16 tensors (the vectorised
// kernels) agree with the same ops on float64 tensors (the float64 host
// kernels) rounded to the dtype — within the kernels' bounds
// (kernels_math_test.go) for float32, within one bfloat16 ulp for
// bfloat16 — and a softmax over another dimension (the float64 path)
// still does.
func TestActivationsVectorised(t *testing.T) {
	c := newHostContext(t)
	rng := rand.New(rand.NewPCG(5, 6))
	shape := []int{37, 301}
	vals := make([]float64, shape[0]*shape[1])
	for i := range vals {
		vals[i] = float64(float32(rng.NormFloat64() * 6))
	}
	gvals := make([]float64, len(vals))
	for i := range gvals {
		gvals[i] = float64(float32(rng.NormFloat64()))
	}
	g64, err := FromFloat64s(c, gvals, shape, Float64, "cpu")
	if err != nil {
		t.Fatal(err)
	}
	var gr *Tensor // the incoming gradient, in the dtype under test
	ops := []struct {
		name string
		f    func(*Tensor) (*Tensor, error)
		// float32 bound, in ulps; 0: within 2^-21·(1 + |want|), and, for a
		// backward (bwd), within 2^-21·|g|·(1 + |x|) (its terms cancel)
		ulps32 int64
		bwd    bool
	}{
		{"silu_backward", func(x *Tensor) (*Tensor, error) { return SiluBackward(sameDT(gr, x), x) }, 0, true},
		{"gelu_backward tanh", func(x *Tensor) (*Tensor, error) { return GeluBackward(sameDT(gr, x), x, "tanh") }, 0, true},
		{"gelu_backward", func(x *Tensor) (*Tensor, error) { return GeluBackward(sameDT(gr, x), x, "none") }, 0, true},
		{"softmax_backward", func(x *Tensor) (*Tensor, error) { return SoftmaxBackward(sameDT(gr, x), x, -1, false) }, 0, true},
		{"log_softmax_backward", func(x *Tensor) (*Tensor, error) { return SoftmaxBackward(sameDT(gr, x), x, -1, true) }, 0, true},
		{"silu", func(x *Tensor) (*Tensor, error) { return Silu(x) }, 3, false},
		{"gelu_tanh", func(x *Tensor) (*Tensor, error) { return Gelu(x, "tanh") }, 1, false},
		{"gelu", func(x *Tensor) (*Tensor, error) { return Gelu(x, "none") }, 6, false},
		{"softmax", func(x *Tensor) (*Tensor, error) { return Softmax(x, -1, false) }, 40, false},
		{"log_softmax", func(x *Tensor) (*Tensor, error) { return Softmax(x, 1, true) }, 0, false},
		{"softmax dim 0", func(x *Tensor) (*Tensor, error) { return Softmax(x, 0, false) }, 1, false},
	}
	x64, err := FromFloat64s(c, vals, shape, Float64, "cpu")
	if err != nil {
		t.Fatal(err)
	}
	for _, dt := range []DType{Float32, BFloat16, Float16} {
		x, err := To(x64, "cpu", dt, false)
		if err != nil {
			t.Fatal(err)
		}
		xv, _ := x.ToFloat64s()
		xr, err := FromFloat64s(c, xv, shape, Float64, "cpu") // x's values, in float64
		if err != nil {
			t.Fatal(err)
		}
		if gr, err = To(g64, "cpu", dt, false); err != nil {
			t.Fatal(err)
		}
		for _, op := range ops {
			got, err := op.f(x)
			if err != nil {
				t.Fatal(err)
			}
			if got.dtype != dt {
				t.Fatalf("%s %s: result dtype %s", op.name, dt, got.dtype)
			}
			ref, err := op.f(xr)
			if err != nil {
				t.Fatal(err)
			}
			g, _ := got.ToFloat64s()
			w, _ := ref.ToFloat64s()
			for i := range g {
				if r := float64(roundF32(dt, float32(w[i]))); math.IsInf(r, 0) && g[i] == r {
					continue // beyond the dtype's range in both
				}
				var bad bool
				switch {
				case dt != Float32 && op.bwd:
					// a half type's rounding of the result and of the gradient
					bad = math.Abs(g[i]-w[i]) > ulpHalf(dt)*(math.Abs(gvals[i])*(1+math.Abs(xv[i]))+math.Abs(w[i]))
				case dt != Float32:
					// one ulp of the half type, of the float64 result's rounding
					bad = math.Abs(g[i]-float64(roundF32(dt, float32(w[i])))) > math.Abs(w[i])*ulpHalf(dt)+0x1p-24
				case op.bwd:
					bad = math.Abs(g[i]-w[i]) > 0x1p-21*math.Abs(gvals[i])*(1+math.Abs(xv[i]))+0x1p-21*math.Abs(w[i])
				case op.ulps32 == 0:
					bad = math.Abs(g[i]-w[i]) > 0x1p-21*(1+math.Abs(w[i]))
				default:
					bad = ulpDiff(float32(g[i]), float32(w[i])) > op.ulps32
				}
				if bad {
					t.Fatalf("%s %s element %d (x = %g): %g, want %g", op.name, dt, i, xv[i], g[i], w[i])
				}
			}
		}
	}
}

// ulpHalf is the relative size of one ulp of half type dt.
func ulpHalf(dt DType) float64 {
	if dt == BFloat16 {
		return 0x1p-7
	}
	return 0x1p-10
}

// sameDT returns g in x's dtype (float64 for the reference runs): the
// values are the same, since g's are exact in every dtype under test's
// rounding once converted.
func sameDT(g, x *Tensor) *Tensor {
	if g.dtype == x.dtype {
		return g
	}
	r, err := To(g, "cpu", x.dtype, false)
	if err != nil {
		panic(err)
	}
	return r
}
