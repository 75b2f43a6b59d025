package tensor

import (
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"testing"
	"unsafe"
)

// mathRef is each math kernel's float64 reference, rounded to float32 by
// the caller: the correctly rounded result but for double rounding.
var mathRef = []struct {
	name   string
	code   int
	f      func(float64) float64
	maxULP int // asserted bound, in float32 ulps from the rounded reference
	// maxSubULP, when not 0, bounds instead the error of results below
	// the normal range (in subnormal ulps, 2^-149).
	maxSubULP int
}{
	{"exp", mathExp, math.Exp, 1, 0},
	{"log", mathLog, math.Log, 1, 0},
	{"tanh", mathTanh, math.Tanh, 1, 0},
	{"sigmoid", mathSigmoid, func(x float64) float64 { return 1 / (1 + math.Exp(-x)) }, 2, 0},
	// silu: x·σ(x) in float32; its tiny results (x < -87, where σ(x) is
	// subnormal) lose sigmoid's relative accuracy
	{"silu", mathSilu, func(x float64) float64 { return x / (1 + math.Exp(-x)) }, 3, 2},
	// GELU's tanh form, in float64 as x·σ(2u): 1 + tanh(u) = 2σ(2u)
	{"gelu_tanh", mathGeluTanh, func(x float64) float64 {
		u := geluSqrt2OverPi * (x + geluCoeff*x*x*x)
		return x / (1 + math.Exp(-2*u))
	}, 1, 0},
	// GELU: ½x·erfc(-x/√2), which does not cancel for x ≪ 0
	{"gelu", mathGelu, func(x float64) float64 { return 0.5 * x * math.Erfc(-x/math.Sqrt2) }, 6, 2},
}

// ulpOrd maps a float32 to an integer that orders floats by value, with
// neighbouring floats one apart (+0 and -0 both 0).
func ulpOrd(f float32) int64 {
	b := int64(math.Float32bits(f))
	if b&0x80000000 != 0 {
		return -(b & 0x7fffffff)
	}
	return b
}

// ulpDiff is the distance in float32 ulps between got and want; NaNs
// match only NaNs.
func ulpDiff(got, want float32) int64 {
	if got != got || want != want {
		if got != got && want != want {
			return 0
		}
		return math.MaxInt32
	}
	if math.IsInf(float64(want), 0) || math.IsInf(float64(got), 0) {
		if got == want {
			return 0
		}
		return math.MaxInt32
	}
	d := ulpOrd(got) - ulpOrd(want)
	if d < 0 {
		d = -d
	}
	return d
}

// mathISAs lists the kernel variants this CPU can run.
func mathISAs() []int {
	var isas []int
	for isa := 0; isa <= mathISA(); isa++ {
		isas = append(isas, isa)
	}
	return isas
}

// mathInputs returns the float32 inputs of the accuracy test: every
// step-th bit pattern (all signs, exponents, NaNs and infinities), and
// dense sweeps of the ranges where the kernels switch method or where
// results are large, tiny or near 1.
func mathInputs(step uint32) []float32 {
	var xs []float32
	for b := uint64(0); b < 1<<32; b += uint64(step) {
		xs = append(xs, math.Float32frombits(uint32(b)))
	}
	dense := func(lo, hi float32, n int) {
		for i := range n {
			xs = append(xs, lo+(hi-lo)*float32(i)/float32(n))
		}
	}
	dense(-1, 1, 1<<18)              // tanh/sigmoid near 0, exp near 1
	dense(0.5, 0.6, 1<<16)           // tanh's switch at 0.55
	dense(0.5, 2, 1<<18)             // log near 1
	dense(80, 89, 1<<16)             // exp overflow
	dense(-105, -85, 1<<16)          // exp subnormal results, sigmoid's tail
	dense(-12, 12, 1<<16)            // tanh/sigmoid saturation
	dense(0x1p-149, 0x1p-120, 1<<14) // log of subnormals
	return xs
}

// TestMathKernelsULP checks every variant of every math kernel against
// the float64 math package over several million inputs, and reports the
// largest error found.
func TestMathKernelsULP(t *testing.T) {
	step := uint32(509)
	if testing.Short() {
		step = 8191
	}
	xs := mathInputs(step)
	got := make([]float32, len(xs))
	for _, isa := range mathISAs() {
		for _, m := range mathRef {
			mathF32(m.code, unsafe.Pointer(&got[0]), unsafe.Pointer(&xs[0]), len(xs), isa)
			var worst, worstSub int64
			var worstX float32
			for i, x := range xs {
				want := float32(m.f(float64(x)))
				d := ulpDiff(got[i], want)
				if m.maxSubULP > 0 && math.Abs(float64(want)) < 0x1p-126 {
					if worstSub = max(worstSub, d); d > int64(m.maxSubULP) {
						t.Errorf("isa %d %s(%g) = %g, want %g: %d subnormal ulp > %d", isa, m.name, x, got[i], want, d, m.maxSubULP)
					}
					continue
				}
				if d > worst {
					worst, worstX = d, x
				}
			}
			if m.maxSubULP > 0 {
				t.Logf("isa %d %s: max error %d subnormal ulp below the normal range", isa, m.name, worstSub)
			}
			t.Logf("isa %d %s: max error %d ulp (at %g) over %d inputs", isa, m.name, worst, worstX, len(xs))
			if worst > int64(m.maxULP) {
				x := worstX
				t.Errorf("isa %d %s(%g) = %g, want %g: %d ulp > %d", isa, m.name, x, mathOne(m.code, x, isa), float32(m.f(float64(x))), worst, m.maxULP)
			}
		}
	}
}

func mathOne(code int, x float32, isa int) float32 {
	var y float32
	mathF32(code, unsafe.Pointer(&y), unsafe.Pointer(&x), 1, isa)
	return y
}

// TestMathKernelsSpecial checks special values exactly.
func TestMathKernelsSpecial(t *testing.T) {
	inf, nan := float32(math.Inf(1)), float32(math.NaN())
	negZero := float32(math.Copysign(0, -1))
	maxF, minSub := float32(math.MaxFloat32), float32(math.SmallestNonzeroFloat32)
	cases := []struct {
		code int
		x    float32
		want float32
	}{
		{mathExp, nan, nan}, {mathExp, inf, inf}, {mathExp, -inf, 0}, {mathExp, 0, 1}, {mathExp, negZero, 1},
		{mathExp, 88.72283, float32(math.Exp(float64(float32(88.72283))))}, {mathExp, 88.72284, inf}, {mathExp, 100, inf}, {mathExp, maxF, inf},
		{mathExp, -87.33654, float32(math.Exp(float64(float32(-87.33654))))}, {mathExp, -100, 3.7835e-44}, {mathExp, -103.2789, minSub},
		{mathExp, -104, 0}, {mathExp, -maxF, 0},
		{mathLog, nan, nan}, {mathLog, inf, inf}, {mathLog, -inf, nan}, {mathLog, 0, -inf}, {mathLog, negZero, -inf},
		{mathLog, -1, nan}, {mathLog, -minSub, nan}, {mathLog, 1, 0}, {mathLog, minSub, -103.27893}, {mathLog, maxF, 88.72284},
		{mathLog, float32(math.E), 1},
		{mathTanh, nan, nan}, {mathTanh, inf, 1}, {mathTanh, -inf, -1}, {mathTanh, 0, 0}, {mathTanh, negZero, negZero},
		{mathTanh, 20, 1}, {mathTanh, -20, -1}, {mathTanh, maxF, 1}, {mathTanh, minSub, minSub}, {mathTanh, 1e-20, 1e-20},
		{mathSigmoid, nan, nan}, {mathSigmoid, inf, 1}, {mathSigmoid, -inf, 0}, {mathSigmoid, 0, 0.5},
		{mathSigmoid, 20, 1}, {mathSigmoid, -100, 3.7835e-44}, {mathSigmoid, -maxF, 0}, {mathSigmoid, maxF, 1},
		{mathSilu, nan, nan}, {mathSilu, inf, inf}, {mathSilu, -inf, nan}, {mathSilu, 0, 0}, {mathSilu, negZero, negZero},
		{mathSilu, maxF, maxF}, {mathSilu, -maxF, negZero},
		{mathGeluTanh, nan, nan}, {mathGeluTanh, inf, inf}, {mathGeluTanh, -inf, nan}, {mathGeluTanh, 0, 0}, {mathGeluTanh, negZero, negZero},
		{mathGeluTanh, maxF, maxF}, {mathGeluTanh, -maxF, negZero}, {mathGeluTanh, -30, negZero},
		{mathGelu, nan, nan}, {mathGelu, inf, inf}, {mathGelu, -inf, nan}, {mathGelu, 0, 0}, {mathGelu, negZero, negZero},
		{mathGelu, maxF, maxF}, {mathGelu, -maxF, negZero}, {mathGelu, -30, negZero}, {mathGelu, 30, 30},
	}
	for _, isa := range mathISAs() {
		for _, c := range cases {
			got := mathOne(c.code, c.x, isa)
			same := got == c.want && math.Signbit(float64(got)) == math.Signbit(float64(c.want)) || got != got && c.want != c.want
			if !same {
				t.Errorf("isa %d %s(%g) = %g, want %g", isa, mathRef[c.code].name, c.x, got, c.want)
			}
		}
	}
}

// TestMathKernelsLayouts checks that a value's result does not depend on
// the run it is in: contiguous, strided, and through float16 (computed in
// float32, then rounded).
func TestMathKernelsLayouts(t *testing.T) {
	xs := mathInputs(1 << 20)
	want := make([]float32, len(xs))
	for _, m := range mathRef {
		mathF32(m.code, unsafe.Pointer(&want[0]), unsafe.Pointer(&xs[0]), len(xs), mathISA())
		// Strided: every other element of a doubled buffer.
		n := 3001
		src, dst := make([]float32, 2*n), make([]float32, 2*n)
		for i := range n {
			src[2*i] = xs[i*7]
		}
		it := newElemIter([]int{n}, strided{base: unsafe.Pointer(&dst[0]), size: 4, st: []int{2}}, strided{base: unsafe.Pointer(&src[0]), size: 4, st: []int{2}})
		unaryMathKernel(m.code, it, Float32, Float32)
		for i := range n {
			if g, w := dst[2*i], want[i*7]; math.Float32bits(g) != math.Float32bits(w) && !(g != g && w != w) {
				t.Fatalf("%s strided: %g -> %g, contiguous %g", m.name, xs[i*7], g, w)
			}
		}
	}
}

// TestMathHalfExhaustive checks the half-type loops (mathHalf: widened,
// computed in float32 and rounded back in C) against the float32 kernel
// and Go's rounding (f32ToBF16, f32ToF16), bit for bit, on all 65,536
// values of bfloat16 and of float16, for every op and instruction set.
func TestMathHalfExhaustive(t *testing.T) {
	in, got := make([]uint16, 1<<16), make([]uint16, 1<<16)
	for i := range in {
		in[i] = uint16(i)
	}
	for _, dt := range []DType{BFloat16, Float16} {
		widen, round := bf16ToF32, f32ToBF16
		if dt == Float16 {
			widen, round = f16ToF32, f32ToF16
		}
		for _, isa := range mathISAs() {
			for _, m := range mathRef {
				mathHalf(dt, m.code, unsafe.Pointer(&got[0]), unsafe.Pointer(&in[0]), len(in), isa)
				bad := 0
				for i, h := range in {
					want := round(mathOne(m.code, widen(h), isa))
					if got[i] != want {
						if bad < 3 {
							t.Errorf("isa %d %s %s(%#04x = %g) = %#04x, want %#04x", isa, dt, m.name, h, widen(h), got[i], want)
						}
						bad++
					}
				}
				if bad > 0 {
					t.Errorf("isa %d %s %s: %d of 65536 values differ", isa, dt, m.name, bad)
				}
			}
		}
	}
}

// TestHalfConversionsC checks the C conversions (halfToF32s, f32ToHalfs,
// on every instruction set) against Go's (f16ToF32, f32ToF16, bf16ToF32,
// f32ToBF16), bit for bit:
// every half value widened, and every 97th float32 bit pattern (all
// signs, exponents, NaNs and infinities) plus every float32 around the
// float16 rounding and subnormal boundaries rounded.
func TestHalfConversionsC(t *testing.T) {
	halves := make([]uint16, 1<<16)
	for i := range halves {
		halves[i] = uint16(i)
	}
	var fs []float32
	for b := uint64(0); b < 1<<32; b += 97 {
		fs = append(fs, math.Float32frombits(uint32(b)))
	}
	for e := uint32(100); e < 145; e++ { // float32 exponents around float16's range
		for m := uint32(0); m < 1<<23; m += 4093 {
			for _, d := range []uint32{0, 1, 0xfff, 0x1000, 0x1001, 0x1fff} {
				fs = append(fs, math.Float32frombits(e<<23|(m&^0x1fff)|d), -math.Float32frombits(e<<23|(m&^0x1fff)|d))
			}
		}
	}
	wide := make([]float32, len(halves))
	narrow := make([]uint16, len(fs))
	for _, dt := range []DType{BFloat16, Float16} {
		widen, round := bf16ToF32, f32ToBF16
		if dt == Float16 {
			widen, round = f16ToF32, f32ToF16
		}
		for _, isa := range mathISAs() {
			halfToF32sISA(dt, unsafe.Pointer(&wide[0]), unsafe.Pointer(&halves[0]), len(halves), isa)
			for i, h := range halves {
				if w := widen(h); math.Float32bits(wide[i]) != math.Float32bits(w) {
					t.Fatalf("isa %d %s: %#04x widened to %#08x, want %#08x", isa, dt, h, math.Float32bits(wide[i]), math.Float32bits(w))
				}
			}
			f32ToHalfsISA(dt, unsafe.Pointer(&narrow[0]), unsafe.Pointer(&fs[0]), len(fs), isa)
			for i, f := range fs {
				if w := round(f); narrow[i] != w {
					t.Fatalf("isa %d %s: %g (%#08x) rounded to %#04x, want %#04x", isa, dt, f, math.Float32bits(f), narrow[i], w)
				}
			}
		}
	}
}

// softmaxRef is softmax (or log_softmax) of one row in float64, as the
// float64 host kernel computes it.
func softmaxRef(row []float32, log bool) []float64 {
	m := math.Inf(-1)
	for _, v := range row {
		m = math.Max(m, float64(v))
	}
	s := 0.0
	for _, v := range row {
		s += math.Exp(float64(v) - m)
	}
	out := make([]float64, len(row))
	for i, v := range row {
		if log {
			out[i] = float64(v) - m - math.Log(s)
		} else {
			out[i] = math.Exp(float64(v)-m) / s
		}
	}
	return out
}

// TestSoftmaxRowsF32 checks the vectorised softmax and log_softmax rows
// (every instruction set) against float64: softmax within 3 + |x − m|
// ulp (exp's argument x − m is rounded to float32, as in ATen's kernel),
// log_softmax within 2^-21·(1 + |y|) absolute; and rows with NaN and
// infinities as the float64 formula gives them.
func TestSoftmaxRowsF32(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	inf, nan := float32(math.Inf(1)), float32(math.NaN())
	var rows [][]float32
	for _, n := range []int{1, 2, 7, 16, 63, 64, 65, 1000, 5003, 1 << 17} {
		for _, scale := range []float32{0.01, 1, 10, 100} {
			row := make([]float32, n)
			for i := range row {
				row[i] = float32(rng.NormFloat64()) * scale
			}
			rows = append(rows, row)
		}
	}
	rows = append(rows, []float32{1, nan, 2}, []float32{-inf, 0, 1}, []float32{-inf, -inf}, []float32{inf, 1}, []float32{inf, inf, 0},
		[]float32{-inf}, []float32{3.4e38, -3.4e38, 0}, []float32{1e-45, 0, -1e-45})
	for _, isa := range mathISAs() {
		for _, log := range []bool{false, true} {
			for _, row := range rows {
				got := make([]float32, len(row))
				softmaxRowsF32(unsafe.Pointer(&got[0]), unsafe.Pointer(&row[0]), 1, len(row), log, isa)
				want := softmaxRef(row, log)
				m := math.Inf(-1)
				for _, v := range row {
					m = math.Max(m, float64(v))
				}
				for i := range row {
					w := float32(want[i])
					if w != w || got[i] != got[i] || math.IsInf(float64(w), 0) {
						if !(w != w && got[i] != got[i]) && got[i] != w {
							t.Errorf("isa %d log=%v row %v: element %d is %g, want %g", isa, log, row[:min(len(row), 4)], i, got[i], w)
						}
						continue
					}
					if log {
						if d := math.Abs(float64(got[i]) - want[i]); d > 0x1p-21*(1+math.Abs(want[i])) {
							t.Errorf("isa %d log_softmax n=%d element %d: %g, want %g (error %g)", isa, len(row), i, got[i], want[i], d)
						}
					} else if d, lim := ulpDiff(got[i], w), 3+int64(math.Ceil(min(math.Abs(float64(row[i])-m), 1<<20))); d > lim {
						t.Errorf("isa %d softmax n=%d element %d (x − m = %g): %g, want %g: %d ulp > %d", isa, len(row), i, float64(row[i])-m, got[i], w, d, lim)
					}
				}
			}
		}
	}
}

func BenchmarkMathF32(b *testing.B) {
	for _, m := range mathRef {
		for _, n := range []int{1 << 20, 4 << 20} {
			b.Run(fmt.Sprintf("%s/%d", m.name, n), func(b *testing.B) {
				src, dst := make([]float32, n), make([]float32, n)
				for i := range src {
					src[i] = float32(i%20001)/1000 - 10
					if m.code == mathLog {
						src[i] = float32(i%20001)/100 + 1e-3
					}
				}
				it := newElemIter([]int{n}, strided{base: unsafe.Pointer(&dst[0]), size: 4, st: []int{1}}, strided{base: unsafe.Pointer(&src[0]), size: 4, st: []int{1}})
				b.SetBytes(int64(8 * n))
				for b.Loop() {
					unaryMathKernel(m.code, it, Float32, Float32)
				}
			})
		}
	}
}

// TestExportedMathHelpers: ExpF32, LogF32, TanhF32 and SigmoidF32 round
// exactly as the tensor ops' kernels do, and refuse slices of different
// lengths.
func TestExportedMathHelpers(t *testing.T) {
	xs := mathInputs(1 << 22)
	for _, h := range []struct {
		f    func(dst, src []float32)
		code int
	}{{ExpF32, mathExp}, {LogF32, mathLog}, {TanhF32, mathTanh}, {SigmoidF32, mathSigmoid}} {
		got := make([]float32, len(xs))
		h.f(got, xs)
		for i, x := range xs {
			if w := mathOne(h.code, x, mathISA()); math.Float32bits(got[i]) != math.Float32bits(w) && !(w != w && got[i] != got[i]) {
				t.Fatalf("%s(%g) = %g, want %g", mathRef[h.code].name, x, got[i], w)
			}
		}
	}
	defer func() {
		if recover() == nil {
			t.Error("ExpF32 with slices of different lengths did not panic")
		}
	}()
	ExpF32(make([]float32, 2), make([]float32, 3))
}

// BenchmarkGeluErfF32 times the GELU (erf form) forward kernel alone, on
// one thread, for each instruction set this CPU runs, over inputs spread
// evenly across [-10, 10] (as bench/kernels' x = rand·20 − 10).
func BenchmarkGeluErfF32(b *testing.B) {
	for _, isa := range mathISAs() {
		for _, n := range []int{1 << 20, 1 << 22} {
			b.Run(fmt.Sprintf("isa%d/%d", isa, n), func(b *testing.B) {
				src, dst := make([]float32, n), make([]float32, n)
				for i := range src {
					src[i] = float32(i%20001)/1000 - 10
				}
				b.SetBytes(int64(8 * n))
				for b.Loop() {
					mathF32(mathGelu, unsafe.Pointer(&dst[0]), unsafe.Pointer(&src[0]), n, isa)
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(n), "ns/value")
			})
		}
	}
}

// TestGeluErfExhaustive checks the GELU (erf) forward of every kernel
// variant on every float32 of |x| < 17 (both signs; beyond, the result is
// exact or ±0) against float64, as the accuracy kernels_math.go states
// for it (4 ulp with an FMA, 5 without, 2 subnormal ulp). It takes a few
// minutes, so it runs only with MEMSH_EXHAUSTIVE=1.
func TestGeluErfExhaustive(t *testing.T) {
	if os.Getenv("MEMSH_EXHAUSTIVE") == "" {
		t.Skip("set MEMSH_EXHAUSTIVE=1 to check every float32")
	}
	ref := func(x float64) float64 { return 0.5 * x * math.Erfc(-x/math.Sqrt2) }
	limit := math.Float32bits(17)
	const chunk = 1 << 22
	xs, got := make([]float32, chunk), make([]float32, chunk)
	for _, isa := range mathISAs() {
		var worst, worstSub int64
		for _, sign := range []uint32{0, 1 << 31} {
			for lo := uint32(0); lo < limit; lo += chunk {
				n := int(min(chunk, limit-lo))
				for i := range n {
					xs[i] = math.Float32frombits(sign | (lo + uint32(i)))
				}
				mathF32(mathGelu, unsafe.Pointer(&got[0]), unsafe.Pointer(&xs[0]), n, isa)
				for i := range n {
					want := float32(ref(float64(xs[i])))
					d := ulpDiff(got[i], want)
					if math.Abs(float64(want)) < 0x1p-126 {
						worstSub = max(worstSub, d)
					} else {
						worst = max(worst, d)
					}
				}
			}
		}
		t.Logf("isa %d: max error %d ulp, %d subnormal ulp", isa, worst, worstSub)
		wantMax := int64(4)
		if isa == 0 {
			wantMax = 5 // no FMA: −x²/2 from the split, one rounding more
		}
		if worst > wantMax || worstSub > 2 {
			t.Errorf("isa %d: %d ulp, %d subnormal ulp; kernels_math.go states %d and 2", isa, worst, worstSub, wantMax)
		}
	}
}

// BenchmarkSoftmaxRowsF32 times the softmax and log_softmax kernel alone,
// on one thread, for each instruction set this CPU runs: rows of 1024
// float32 values spread over [-10, 10] (bench/kernels' x = rand·20 − 10
// viewed as [n/1024, 1024]).
func BenchmarkSoftmaxRowsF32(b *testing.B) {
	const n = 1024
	for _, log := range []bool{false, true} {
		for _, isa := range mathISAs() {
			for _, total := range []int{1 << 20, 1 << 22} {
				name := fmt.Sprintf("softmax/isa%d/%d", isa, total)
				if log {
					name = "log_" + name
				}
				b.Run(name, func(b *testing.B) {
					src, dst := make([]float32, total), make([]float32, total)
					for i := range src {
						src[i] = float32(i%20001)/1000 - 10
					}
					b.SetBytes(int64(8 * total))
					for b.Loop() {
						softmaxRowsF32(unsafe.Pointer(&dst[0]), unsafe.Pointer(&src[0]), total/n, n, log, isa)
					}
					b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(total), "ns/value")
				})
			}
		}
	}
}
