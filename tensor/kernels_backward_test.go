package tensor

import (
	"math"
	"math/rand/v2"
	"testing"
	"unsafe"
)

// TestActBackwardULP: the activations' backward kernels (silu, GELU in
// both forms) on every instruction set, over a dense sweep of float32
// inputs from -120 to 20 with g = 1 and g = -3.5 (exact in float32),
// against the derivative in float64 (math.Exp, math.Erfc): within 6 ulp
// (silu), 4 (GELU) and 1 (GELU's tanh form, computed in float64)
// wherever the result is a normal float32 (deep negative inputs
// included: their tails keep relative accuracy), except where the
// derivative's terms cancel (cancel, below), where the error is within
// 2^-22·|g|.
func TestActBackwardULP(t *testing.T) {
	var xs []float32
	for x := float32(-120); x < 20; x += 1.0 / 512 {
		xs = append(xs, x)
	}
	xs = append(xs, 0, float32(math.Copysign(0, -1)), -0.7517915, 1e-30, -1e-30)
	silu := func(x float64) float64 {
		s := 1 / (1 + math.Exp(-x))
		return s * (1 + x*(1-s))
	}
	gelu := func(x float64) float64 {
		return 0.5*math.Erfc(-x/math.Sqrt2) + x*math.Exp(-x*x/2)/math.Sqrt(2*math.Pi)
	}
	sigmoid := func(t float64) float64 {
		if t >= 0 {
			return 1 / (1 + math.Exp(-t))
		}
		e := math.Exp(t)
		return e / (1 + e)
	}
	geluTanh := func(x float64) float64 { // 1 + tanh(u) = 2σ(2u), 1 − tanh²(u) = 4σ(2u)σ(−2u)
		t := 2 * geluSqrt2OverPi * (x + geluCoeff*x*x*x)
		sp, sn := sigmoid(t), sigmoid(-t)
		return sp + 2*x*sp*sn*geluSqrt2OverPi*(1+3*geluCoeff*x*x)
	}
	ops := []struct {
		name   string
		code   int
		f      func(float64) float64
		maxULP int64
	}{{"silu", bwdSilu, silu, 6}, {"gelu", bwdGelu, gelu, 4}, {"gelu tanh", bwdGeluTanh, geluTanh, 1}}
	// Where the derivative's two terms cancel, around its zero (silu:
	// 1 + x·σ(−x) at x ≈ −1.28; GELU: Φ(x) + x·φ(x) at x ≈ −0.75, and
	// its tanh form likewise), a float32 evaluation is accurate to its
	// terms' size, not the result's; the float64 tanh form needs no
	// such range.
	cancel := func(code int) (float32, float32) {
		switch code {
		case bwdSilu:
			return -2, -0.75
		case bwdGelu:
			return -1.5, -0.25
		}
		return 0, 0
	}
	gs := make([]float32, len(xs))
	got := make([]float32, len(xs))
	for _, isa := range mathISAs() {
		for _, op := range ops {
			for _, g := range []float32{1, -3.5} {
				for i := range gs {
					gs[i] = g
				}
				actBackwardF32(op.code, unsafe.Pointer(&got[0]), unsafe.Pointer(&gs[0]), unsafe.Pointer(&xs[0]), len(xs), isa)
				var worst int64
				var worstX float32
				for i, x := range xs {
					w := float64(g) * op.f(float64(x))
					want := float32(w)
					if math.Abs(w) < 0x1p-126 {
						if d := math.Abs(float64(got[i]) - w); d > 0x1p-126 {
							t.Errorf("isa %d %s backward(x=%g, g=%g) = %g, want %g (subnormal range)", isa, op.name, x, g, got[i], w)
						}
						continue
					}
					if lo, hi := cancel(op.code); x > lo && x < hi {
						// the derivative's terms cancel: an absolute bound
						if d := math.Abs(float64(got[i]) - w); d > 0x1p-22*math.Abs(float64(g)) {
							t.Errorf("isa %d %s backward(x=%g, g=%g) = %g, want %g: error %g", isa, op.name, x, g, got[i], w, d)
						}
						continue
					}
					if d := ulpDiff(got[i], want); d > worst {
						worst, worstX = d, x
					}
				}
				t.Logf("isa %d %s backward, g=%g: max error %d ulp (at x=%g)", isa, op.name, g, worst, worstX)
				if worst > op.maxULP {
					t.Errorf("isa %d %s backward, g=%g: %d ulp at x=%g, want at most %d", isa, op.name, g, worst, worstX, op.maxULP)
				}
			}
		}
	}
}

// TestSoftmaxBackwardRowsF32: softmax's and log_softmax's backward rows
// on every instruction set against float64 (y·(g − Σg·y) and
// g − e^y·Σg), within 2^-21 of the size of the terms the result is the
// difference of (they cancel where g is close to the sum), for rows of
// several lengths; a row whose sum is infinite gives what the float64
// formula gives.
func TestSoftmaxBackwardRowsF32(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	for _, n := range []int{1, 3, 17, 1024, 1037} {
		const rows = 5
		y, g, got := make([]float32, rows*n), make([]float32, rows*n), make([]float32, rows*n)
		for r := 0; r < rows; r++ { // y: a softmax row (log: its log)
			row := y[r*n : (r+1)*n]
			var sum float64
			for i := range row {
				row[i] = float32(math.Exp(rng.NormFloat64() * 3))
				sum += float64(row[i])
			}
			for i := range row {
				row[i] = float32(float64(row[i]) / sum)
			}
		}
		for i := range g {
			g[i] = float32(rng.NormFloat64())
		}
		for _, log := range []bool{false, true} {
			ys := y
			if log {
				ys = make([]float32, len(y))
				for i, v := range y {
					ys[i] = float32(math.Log(float64(v)))
				}
			}
			for _, isa := range mathISAs() {
				softmaxBackwardRowsF32(unsafe.Pointer(&got[0]), unsafe.Pointer(&g[0]), unsafe.Pointer(&ys[0]), rows, n, log, isa)
				for r := 0; r < rows; r++ {
					var s float64
					for i := r * n; i < (r+1)*n; i++ {
						if log {
							s += float64(g[i])
						} else {
							s += float64(g[i]) * float64(ys[i])
						}
					}
					for i := r * n; i < (r+1)*n; i++ {
						yi, gi := float64(ys[i]), float64(g[i])
						want, size := yi*(gi-s), math.Abs(yi)*(math.Abs(gi)+math.Abs(s))
						if log {
							want, size = gi-math.Exp(yi)*s, math.Abs(gi)+math.Exp(yi)*math.Abs(s)
						}
						if d := math.Abs(float64(got[i]) - want); d > 0x1p-21*size {
							t.Fatalf("isa %d log=%v n=%d element %d: %g, want %g (error %g, terms %g)", isa, log, n, i, got[i], want, d, size)
						}
					}
				}
			}
		}
	}
	// An infinite gradient makes the sum infinite: NaN where the float64
	// formula has inf − inf, ±inf elsewhere.
	y := []float32{0.25, 0.75}
	g := []float32{float32(math.Inf(1)), 1}
	for _, isa := range mathISAs() {
		got := make([]float32, 2)
		softmaxBackwardRowsF32(unsafe.Pointer(&got[0]), unsafe.Pointer(&g[0]), unsafe.Pointer(&y[0]), 1, 2, false, isa)
		if !math.IsNaN(float64(got[0])) || !math.IsInf(float64(got[1]), -1) {
			t.Errorf("isa %d softmax backward of an infinite gradient: %v, want [NaN -Inf]", isa, got)
		}
	}
}

// BenchmarkActBackward times the activations' backward kernels over 1M
// float32 values (one goroutine, the CPU's widest instruction set), and
// softmax's and log_softmax's backward over 1024 rows of 1024.
func BenchmarkActBackward(b *testing.B) {
	const n = 1 << 20
	x, g, o := make([]float32, n), make([]float32, n), make([]float32, n)
	for i := range x {
		x[i] = float32(i%20001)/1000 - 10
		g[i] = float32(i%7) - 3
	}
	isa := mathISA()
	for _, op := range []struct {
		name string
		code int
	}{{"silu", bwdSilu}, {"gelu", bwdGelu}, {"gelu_tanh", bwdGeluTanh}} {
		b.Run(op.name, func(b *testing.B) {
			b.SetBytes(12 * n)
			for b.Loop() {
				actBackwardF32(op.code, unsafe.Pointer(&o[0]), unsafe.Pointer(&g[0]), unsafe.Pointer(&x[0]), n, isa)
			}
		})
	}
	for i := range x {
		x[i] = -float32(i%1024) / 100 // a log_softmax-like output: ≤ 0
	}
	for _, log := range []bool{false, true} {
		name := "softmax"
		if log {
			name = "log_softmax"
		}
		b.Run(name, func(b *testing.B) {
			b.SetBytes(12 * n)
			for b.Loop() {
				softmaxBackwardRowsF32(unsafe.Pointer(&o[0]), unsafe.Pointer(&g[0]), unsafe.Pointer(&x[0]), 1024, 1024, log, isa)
			}
		})
	}
}
