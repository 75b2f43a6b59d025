// Vectorised float32 transcendental functions: exp, log, tanh, sigmoid,
// and built on them silu, GELU's tanh form and softmax rows; bfloat16
// through float32 (see kernels_math.go).
//
// Each function is a branch-free polynomial evaluation on one float that
// GCC inlines into a loop and vectorises ("omp simd"). The loops are
// compiled three times: for AVX-512 (16 lanes, FMA), AVX2 with FMA
// (8 lanes) and baseline x86-64 / any other architecture (SSE2, 4 lanes,
// or scalar): the portable fallback. memsh_unary_math_f32 picks the
// widest the CPU supports at run time; memsh_math_isa tells which.
//
// Accuracy (float32 ulps, measured by kernels_math_test.go against the
// float64 math functions over all float32 inputs of several ranges):
// exp ≤ 1, log ≤ 1, tanh ≤ 1, sigmoid ≤ 2. Special values: NaN in, NaN
// out; exp(+Inf) = +Inf, exp(-Inf) = 0, exp overflows to +Inf above
// 88.72 and underflows through the subnormals to 0 below -103.97;
// log(0) = -Inf, log(x < 0) = NaN, log(+Inf) = +Inf, subnormal inputs
// are exact; tanh(±Inf) = ±1, tanh(-0) = -0; sigmoid(-Inf) = 0,
// sigmoid(+Inf) = 1, and sigmoid's small results are exp(x)-accurate
// down to the subnormals (never 1/(1+Inf) = 0 early).
//
// The reductions and coefficients: exp(x) = 2^n · e^r with
// n = round(x / ln 2), r = x - n·ln 2 (ln 2 in two parts, the first with
// few enough bits that n·C1 is exact), e^r by its degree-7 Taylor
// polynomial (|r| ≤ 0.347: truncation below 2^-27), 2^n applied in two
// halves so subnormal results come out right. log(x) = e·ln 2 +
// log1p(f) with x = 2^e·(1+f), 1+f in [√½, √2), and log1p(f) = f -
// (f²/2 - s·(f²/2 + R(s²))) with s = f/(2+f) and R the Taylor series of
// 2·atanh(s)/s - 2 up to s^8. tanh(x) = x + x³·P(x²) for |x| < 0.55, with
// P of degree 4 fitted (weighted least squares, relative error below
// 2e-9 on [0, 0.5625]); above, 1 - 2/(e^2|x| + 1). sigmoid(x) =
// 1/(1 + e^-|x|) for x ≥ 0 and e^x/(1 + e^x) below.

#include <stdint.h>
#include <string.h>

#include "kernels_isa.h"

// Float comparisons feed selects, never branches: without this GCC keeps
// them as branches (a comparison might trap) and vectorises nothing.
#pragma GCC optimize("no-trapping-math")

// Operation codes, as in kernels_math.go.
enum { M_EXP, M_LOG, M_TANH, M_SIGMOID, M_SILU, M_GELU_TANH, M_GELU };

MINLINE uint32_t f2u(float x) {
	uint32_t u;
	memcpy(&u, &x, 4);
	return u;
}

MINLINE float u2f(uint32_t u) {
	float x;
	memcpy(&x, &u, 4);
	return x;
}

// exp_scaled_f32 is e^c·2^k for c already clamped to the range its caller
// allows: n = round(c / ln 2) (adding 1.5·2^23 rounds to an integer), r =
// c − n·ln 2, e^r by its Taylor polynomial, then 2^(n+k) applied in two
// halves so that subnormal results come out right.
MINLINE float exp_scaled_f32(float c, int32_t k) {
	const float shift = 12582912.0f;
	float n = (c * 1.44269504088896341f + shift) - shift;
	float r = c - n * 0.693359375f;
	r = r - n * -2.12194440e-4f;
	float p = 1.0f / 5040.0f;
	p = p * r + 1.0f / 720.0f;
	p = p * r + 1.0f / 120.0f;
	p = p * r + 1.0f / 24.0f;
	p = p * r + 1.0f / 6.0f;
	p = p * r + 0.5f;
	p = p * (r * r) + r;
	p = p + 1.0f;
	int32_t ni = (int32_t)n + k;
	int32_t n1 = ni >> 1, n2 = ni - n1; // each in [-76, 64]
	float s1 = u2f((uint32_t)(n1 + 127) << 23), s2 = u2f((uint32_t)(n2 + 127) << 23);
	return (p * s1) * s2;
}

// exp_f32 is e^x (see above).
MINLINE float exp_f32(float x) {
	float c = x > 89.0f ? 89.0f : x;
	c = c < -104.0f ? -104.0f : c;
	float y = exp_scaled_f32(c, 0);
	return x != x ? x : y;
}

// exp_f32_scaled64 is e^x·2^64 for x ≤ 0 (so results down to x ≈ -131
// stay normal floats; 0 below -150).
MINLINE float exp_f32_scaled64(float x) {
	float c = x < -150.0f ? -150.0f : x;
	float y = exp_scaled_f32(c, 64);
	y = x < -150.0f ? 0.0f : y;
	return x != x ? x : y;
}

// log_f32 is the natural logarithm (see above).
MINLINE float log_f32(float x) {
	int sub = x < 0x1p-126f;
	float xs = sub ? x * 0x1p23f : x;
	uint32_t ix = f2u(xs);
	int32_t e = (int32_t)(ix >> 23) - 127 - (sub ? 23 : 0);
	float m = u2f((ix & 0x007fffffu) | 0x3f800000u);
	int big = m > 1.41421356f;
	m = big ? m * 0.5f : m;
	e += big;
	float f = m - 1.0f;
	float s = f / (2.0f + f);
	float z = s * s;
	float R = z * (2.0f / 3.0f + z * (2.0f / 5.0f + z * (2.0f / 7.0f + z * (2.0f / 9.0f))));
	float hfsq = 0.5f * f * f;
	float fe = (float)e;
	float y = fe * 0.693359375f - ((hfsq - (s * (hfsq + R) + fe * -2.12194440e-4f)) - f);
	y = x == __builtin_inff() ? x : y;
	y = x == 0.0f ? -__builtin_inff() : y;
	y = x < 0.0f ? __builtin_nanf("") : y;
	return x != x ? x : y;
}

// tanh_f32 is the hyperbolic tangent (see above).
MINLINE float tanh_f32(float x) {
	uint32_t sign = f2u(x) & 0x80000000u;
	float a = u2f(f2u(x) & 0x7fffffffu);
	float z = a * a;
	float p = -6.180468946695328e-03f;
	p = p * z + 2.1007928997278214e-02f;
	p = p * z + -5.383754521608353e-02f;
	p = p * z + 1.33324533700943e-01f;
	p = p * z + -3.333331346511841e-01f;
	float small = a + (a * z) * p;
	float e = exp_f32(2.0f * a);
	float large = 1.0f - 2.0f / (e + 1.0f);
	float y = a < 0.55f ? small : large;
	return u2f(f2u(y) | sign);
}

// sigmoid_f32 is 1 / (1 + e^-x) (see above).
MINLINE float sigmoid_f32(float x) {
	float a = u2f(f2u(x) & 0x7fffffffu);
	float e = exp_f32(-a);
	float num = x >= 0.0f ? 1.0f : e;
	return num / (1.0f + e);
}

// exp_f64 is e^x in float64 for a float32 result rounded once (x within
// [-745, 709]; beyond, 0 or +Inf; NaN stays NaN): e^x = 2^n · e^r, n =
// round(x / ln 2), r = x − n·ln 2 (ln 2 in two parts), e^r by its degree-10
// Taylor polynomial, whose truncation error on |r| ≤ 0.347 is below
// 0.347^11/11! ≈ 2.2e-13 relative. GELU's tanh form, built on it, is
// within 1 ulp of float64 over 9.2M inputs (TestMathKernelsULP).
MINLINE double exp_f64(double x) {
	double c = x > 709.0 ? 709.0 : x;
	c = c < -745.0 ? -745.0 : c;
	const double shift = 6755399441055744.0; // 1.5·2^52: adding it rounds to an integer
	double n = (c * 1.4426950408889634 + shift) - shift;
	double r = (c - n * 0x1.62e42fee00000p-1) - n * 0x1.a39ef35793c76p-33;
	double p = 1.0 / 3628800.0;
	p = p * r + 1.0 / 362880.0;
	p = p * r + 1.0 / 40320.0;
	p = p * r + 1.0 / 5040.0;
	p = p * r + 1.0 / 720.0;
	p = p * r + 1.0 / 120.0;
	p = p * r + 1.0 / 24.0;
	p = p * r + 1.0 / 6.0;
	p = p * r + 0.5;
	p = p * r + 1.0;
	p = p * r + 1.0;
	int32_t ni = (int32_t)n;
	int32_t n1 = ni >> 1, n2 = ni - n1; // each in [-538, 512]
	uint64_t b1 = (uint64_t)(int64_t)(n1 + 1023) << 52, b2 = (uint64_t)(int64_t)(n2 + 1023) << 52;
	double s1, s2;
	memcpy(&s1, &b1, 8);
	memcpy(&s2, &b2, 8);
	double y = (p * s1) * s2;
	y = x > 709.78 ? __builtin_inf() : y;
	y = x < -746.0 ? 0.0 : y;
	return x != x ? x : y;
}

// sigmoid_mul_f32 is x·σ(t) computed in float64 and rounded once: σ(t) =
// 1/(1 + e^-t) for t ≥ 0, e^t/(1 + e^t) below, so it keeps its relative
// accuracy down to the smallest results.
MINLINE float sigmoid_mul_f32(double x, double t) {
	double e = exp_f64(-__builtin_fabs(t));
	double s = (t >= 0.0 ? 1.0 : e) / (1.0 + e);
	return (float)(x * s);
}

// silu_f32 is x·σ(x) (torch.nn.functional.silu) in float32: x/(1 + e^-x)
// for x ≥ 0, and x·e^x/(1 + e^x) below with e^x taken as e^x·2^64 (scaled
// inside exp_f32's own 2^n step, so it stays a normal float down to
// x ≈ -131) and the product scaled back at the end: within 3 ulp of the
// correctly rounded result wherever that is a normal float.
// silu(-inf) is NaN, as x / (1 + e^-x) gives.
MINLINE float silu_f32(float x) {
	float es = exp_f32_scaled64(x < 0.0f ? x : -x); // e^-|x|·2^64
	float e = es * 0x1p-64f;
	// x·e^x·2^64/(1 + e^x) below 0, x/(1 + e^-x) above: one division
	// (the factor chosen with integer masks: as a float select, GCC
	// divides twice and selects the quotient)
	uint32_t neg = (uint32_t)-(int32_t)(x < 0.0f);
	float f = u2f(0x3f800000u ^ ((f2u(es) ^ 0x3f800000u) & neg)); // es or 1
	float q = (x * f) / (1.0f + e);
	float y = x < 0.0f ? q * 0x1p-64f : q;
	return x != x ? x : y;
}

// gelu_tanh_f32 is GELU's tanh approximation ½x(1 + tanh(u)), u =
// √(2/π)(x + 0.044715x³), computed in float64 as x·σ(2u) (1 + tanh(u) =
// 2σ(2u)), which keeps its relative accuracy where 1 + tanh(u) cancels
// (x ≪ 0), and rounded once.
MINLINE float gelu_tanh_f32(float x) {
	double xd = (double)x;
	float y = sigmoid_mul_f32(xd, 2.0 * 0.7978845608028654 * (xd + 0.044715 * (xd * xd * xd)));
	return x != x ? x : y;
}

// ERFC_P is P, the polynomial of gelu_backward_f32's erfc fit, highest
// degree first (float32 coefficients), as bench/kernels/fit_erfc.py
// computes and prints them: erfc(z) = t·e^(P(s) − z²), t = 1/(1 + z/2),
// s = (t − 0.58)/0.42, z = |x|/√2.
static const float ERFC_P[12] = {
	-0x1.81dd4cp-18f, -0x1.93fc5cp-16f, 0x1.4020b8p-14f, 0x1.163838p-13f,
	-0x1.34a182p-11f, -0x1.0d3546p-12f, 0x1.fc3f6ep-9f, -0x1.4340d6p-10f,
	-0x1.edf0b2p-6f, 0x1.11e114p-6f, 0x1.263348p-1f, -0x1.205616p-1f,
};

// gelu_terms gives, for x, the erfc fit's t and P(s), and −x²/2 as
// ha + hb + hc, each term exact: with |x| (capped at 20) split as xh + xl,
// xh its 12 leading bits, −xh²/2, −xh·xl and −xl²/2.
MINLINE void gelu_terms(float x, float *t, float *p, float *ha, float *hb, float *hc) {
	float ax = u2f(f2u(x) & 0x7fffffffu);
	float z = ax * 0.70710678118654752f;
	*t = 1.0f / (1.0f + 0.5f * z);
	float s = (*t - 0.58f) * (1.0f / 0.42f);
	float q = ERFC_P[0];
	for (int i = 1; i < 12; i++) q = q * s + ERFC_P[i];
	*p = q;
	float xc = ax < 20.0f ? ax : 20.0f;
	float xh = u2f(f2u(xc) & 0xfffff000u);
	float xl = xc - xh;
	*ha = -0.5f * (xh * xh);
	*hb = -(xh * xl);
	*hc = -0.5f * (xl * xl);
}

// gelu_erf_f32 is GELU x·Φ(x) (torch.nn.functional.gelu's default), in
// float32 and without a cancelling 1 + erf: with a = |x| (capped at
// GELU_CLAMP), Φ(−a) = K·e^(−a²/2)·D(a)/(a·D(a) + N(a)), K = 1/√(2π), and
// x·Φ(x) is x − x·Φ(−a) for x > 0 and x·Φ(−a) below. N/D (degrees 4 and
// 4) approximates h(a) = K/(Φ(−a)·e^(a²/2)) − a, which is √(π/2) at 0
// and falls like 1/a (Laplace's continued fraction for Mills' ratio): an
// error in h costs only its share h/(a + h) of Φ, and D's rounding errors
// cancel between numerator and denominator. Both are Horner sums of
// positive terms, so their float32 evaluation stays within a few
// roundings. e^(−a²/2) needs −a²/2 = hi + lo exactly (its rounding would
// cost up to 132·2^-24, dozens of ulps): with an FMA, hi = fl(−a²/2) and
// lo = fma(−a/2, a, −hi); without, hi = −ah²/2 and lo = −ah·al − al²/2
// from a = ah + al, ah its 12 leading bits, every product exact. Then
// e^(hi+lo) = 2^n·e^r, n = round((hi+lo)/ln 2) and r = (hi − n·C1) +
// (lo − n·C2) (the first exact), K·e^r by GELU_E, and 2^(n+64) built from
// n's bits: scaled by 2^64 so that the small results keep their precision
// down to the subnormals (it is +0 at the cap, n = −191, so that
// x·Φ(−a) is ±0 below −GELU_CLAMP, NaN at −Inf, and x − x·Φ(−a) = x
// above). bench/kernels/fit_gelu.py fits the three tables (K's float32
// rounding included, so that Φ(0) is exactly ½). Against float64 over
// every float32 of |x| < 17 (TestGeluErfExhaustive): within 4 ulp with an
// FMA, 5 without, and 2 subnormal ulp where the result is subnormal. A NaN in is that NaN (quieted) out: only xc
// carries it.
#define GELU_CLAMP 16.265625f
#define GELU_ND 5
#define GELU_DD 5

// The tables of gelu_erf_f32, highest degree first: K·e^r, N and D.
static const float GELU_E[7] = {0x1.2188cep-11f, 0x1.b5edb2p-9f, 0x1.105a8cp-6f, 0x1.105732p-4f, 0x1.98845p-3f, 0x1.988454p-2f, 0x1.988454p-2f};
static const float GELU_N[GELU_ND] = {0x1.340b02p-20f, 0x1.33b46cp-7f, 0x1.71c256p-4f, 0x1.72496ap-2f, 0x1.988454p-1f};
static const float GELU_D[GELU_DD] = {0x1.355436p-7f, 0x1.6dfaf6p-4f, 0x1.8fb7aep-2f, 0x1.d138fp-1f, 0x1p+0f};

MINLINE float gelu_erf_f32(float x, int fma) {
	int32_t ab = (int32_t)(f2u(x) & 0x7fffffffu), cb = (int32_t)f2u(GELU_CLAMP);
	float ax = u2f((uint32_t)ab);
	// a = min(|x|, GELU_CLAMP), a NaN becoming GELU_CLAMP: as integers with
	// an FMA (a float select there makes GCC blend constants through the
	// whole computation), as floats in the baseline (SSE2 has no pminsd)
	float ac = fma ? u2f((uint32_t)(ab < cb ? ab : cb)) : (ax < GELU_CLAMP ? ax : GELU_CLAMP);
	float xc = x > GELU_CLAMP ? GELU_CLAMP : x; // a NaN stays
	float hi, lo, hs;
	if (fma) {
		float m = -0.5f * ac;
		hi = m * ac;
		lo = __builtin_fmaf(m, ac, -hi);
		hs = hi;
	} else {
		float xh = u2f(f2u(ac) & 0xfffff000u);
		float xl = ac - xh;
		hi = (-0.5f * xh) * xh;             // exact
		lo = -(xh * xl) - (0.5f * xl) * xl; // products exact
		hs = hi + lo;
	}
	const float shift = 12582912.0f;
	float nn = hs * 1.44269504088896341f + shift;
	float n = nn - shift;
	float r = (hi - n * 0.693359375f) + (lo - n * -2.12194440e-4f);
	float p = GELU_E[0];
	for (int i = 1; i < 7; i++) p = p * r + GELU_E[i];
	float sc = u2f((f2u(nn) + 191u) << 23); // 2^(n+64) (nn's low bits are n); +0 at n = −191
	float e = p * sc;                       // K·e^(−a²/2)·2^64
	float d = GELU_D[0], q = GELU_N[0];
	for (int i = 1; i < GELU_DD; i++) d = d * ac + GELU_D[i];
	for (int i = 1; i < GELU_ND; i++) q = q * ac + GELU_N[i];
	float g = ac * d + q;
	float c = e * (d / g); // Φ(−a)·2^64
	float u = xc * c;
	float neg = u * 0x1p-64f;
	float pos = x - u * 0x1p-64f;
	return x > 0.0f ? pos : neg;
}

// gelu_erf_isa is gelu_erf_f32 as the variant being compiled allows (see
// ISA_FMA).
#define gelu_erf_isa(x) gelu_erf_f32(x, ISA_FMA)

#define MATH_LOOP(FN)                       \
	_Pragma("omp simd")                     \
	for (int64_t i = 0; i < n; i++) {       \
		o[i] = FN(a[i]);                    \
	}

#define MATH_BODY                                    \
	switch (op) {                                    \
	case M_EXP: MATH_LOOP(exp_f32) break;            \
	case M_LOG: MATH_LOOP(log_f32) break;            \
	case M_TANH: MATH_LOOP(tanh_f32) break;          \
	case M_SIGMOID: MATH_LOOP(sigmoid_f32) break;    \
	case M_SILU: MATH_LOOP(silu_f32) break;          \
	case M_GELU_TANH: MATH_LOOP(gelu_tanh_f32) break; \
	case M_GELU: MATH_LOOP(gelu_erf_isa) break;      \
	}

ISA_VARIANTS(math, (int op, float *o, const float *a, int64_t n), MATH_BODY)

// memsh_math_isa returns the widest instruction set the CPU supports of
// those compiled: 2 AVX-512, 1 AVX2 with FMA, 0 the baseline.
int memsh_math_isa(void) {
#ifdef MEMSH_MATH_X86
	__builtin_cpu_init();
	if (__builtin_cpu_supports("avx512f")) return 2;
	if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return 1;
#endif
	return 0;
}

// memsh_unary_math_f32 computes o[i] = op(a[i]) for n contiguous float32
// elements (o may be a) with the loops for isa (see memsh_math_isa; the
// caller never passes more than the CPU supports).
void memsh_unary_math_f32(int op, float *o, const float *a, int64_t n, int isa) {
	ISA_DISPATCH(math, op, o, a, n)
}

// Philox-4x32-10 (see kernels_random.go): block i of a call uses the
// counter [low32(offset+i), high32(offset+i), 0, 0] and the key [low32(seed),
// high32(seed)]. The loops are written for one block at a time and
// vectorised across blocks.

#define PHILOX_ROUNDS(SEED, K)                                                  \
	uint32_t c0 = (uint32_t)(K), c1 = (uint32_t)((K) >> 32), c2 = 0, c3 = 0;   \
	uint32_t k0 = (uint32_t)(SEED), k1 = (uint32_t)((SEED) >> 32);             \
	for (int r = 0; r < 10; r++) {                                              \
		uint64_t p0 = (uint64_t)0xD2511F53u * c0, p1 = (uint64_t)0xCD9E8D57u * c2; \
		uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0, n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1; \
		c1 = (uint32_t)p1;                                                      \
		c3 = (uint32_t)p0;                                                      \
		c0 = n0;                                                                \
		c2 = n2;                                                                \
		k0 += 0x9E3779B9u;                                                      \
		k1 += 0xBB67AE85u;                                                      \
	}

// RANDOM_BODY defines the loop of one generator kernel; EMIT stores block
// i's outputs from c0..c3.
#define RANDOM_BODY(EMIT)                         \
	_Pragma("omp simd")                           \
	for (int64_t i = 0; i < n; i++) {             \
		uint64_t k = offset + (uint64_t)i;        \
		PHILOX_ROUNDS(seed, k)                    \
		EMIT                                      \
	}

// u53 returns (x >> 11) × 2^-53 exactly, without a 64-bit integer to
// double conversion (AVX2 has none): the top 52 bits as the mantissa of a
// double in [1, 2), minus 1, plus the 53rd bit.
MINLINE double u53(uint64_t x) {
	uint64_t b = 0x3FF0000000000000ull | (x >> 12);
	double d;
	memcpy(&d, &b, 8);
	return (d - 1.0) + ((x >> 11) & 1 ? 0x1p-53 : 0.0);
}

// UNIFORM_F32: (x0 >> (32-bits)) × 2^-bits as float32 (exact).
#define UNIFORM_F32 o[i] = (float)(int32_t)(c0 >> (32 - bits)) * scale;
// UNIFORM_F64: the top 53 bits of x0:x1 × 2^-53.
#define UNIFORM_F64 o[i] = u53(((uint64_t)c0 << 32) | c1);
// NORMAL_U: Box-Muller's u1 = 1 - (x0:x1 >> 11)·2^-53 and u2 = (x2:x3 >> 11)·2^-53.
#define NORMAL_U                                                                \
	u1[i] = 1.0 - u53(((uint64_t)c0 << 32) | c1); \
	u2[i] = u53(((uint64_t)c2 << 32) | c3);

#define RANDOM_FNS(SUFFIX, ATTR, BODY)                                                                     \
	ATTR static void uniform_f32_##SUFFIX(float *o, uint64_t seed, uint64_t offset, int64_t n, int bits) { \
		float scale = 1.0f / (float)(1u << bits);                                                          \
		BODY(UNIFORM_F32)                                                                                  \
	}                                                                                                      \
	ATTR static void uniform_f64_##SUFFIX(double *o, uint64_t seed, uint64_t offset, int64_t n) {          \
		BODY(UNIFORM_F64)                                                                                  \
	}                                                                                                      \
	ATTR static void normal_u_##SUFFIX(double *u1, double *u2, uint64_t seed, uint64_t offset, int64_t n) { \
		BODY(NORMAL_U)                                                                                     \
	}

RANDOM_FNS(default, , RANDOM_BODY)
#ifdef MEMSH_MATH_X86
#include <immintrin.h>

// Philox with AVX2 intrinsics. GCC vectorises RANDOM_BODY's 32 × 32 → 64-bit
// products through 64-bit lanes, shuffling the 32-bit counter words in and
// out every round (about 75 instructions per value); here each round works
// on 8 blocks' words in place: vpmuludq on the even words and on the odd
// words shifted down, the products' high and low halves blended back into
// 8 lanes (about 20 instructions per round for 8 blocks). The outputs of
// PHILOX_GROUP blocks are stored in C0..C3, and EMIT's loop, vectorised by
// GCC as in RANDOM_BODY, turns them into values: the same values, bit for
// bit (TestRandomKernelISAs).
#define PHILOX_GROUP 64

// philox8_avx2 runs the rounds on PHILOX_LANES groups of 8 blocks at once
// (w: each group's 4 words), interleaved: one group's round is a chain of
// dependent instructions, and a second group fills its latency.
#define PHILOX_LANES 2

__attribute__((target("avx2,fma"))) static inline void philox8_avx2(__m256i w[][4], const __m256i *K0, const __m256i *K1) {
	const __m256i M0 = _mm256_set1_epi32((int)0xD2511F53u), M1 = _mm256_set1_epi32((int)0xCD9E8D57u);
	__m256i c0[PHILOX_LANES], c1[PHILOX_LANES], c2[PHILOX_LANES], c3[PHILOX_LANES];
	for (int g = 0; g < PHILOX_LANES; g++) {
		c0[g] = w[g][0], c1[g] = w[g][1], c2[g] = _mm256_setzero_si256(), c3[g] = _mm256_setzero_si256();
	}
	for (int r = 0; r < 10; r++) {
		for (int g = 0; g < PHILOX_LANES; g++) {
			__m256i p0e = _mm256_mul_epu32(c0[g], M0), p0o = _mm256_mul_epu32(_mm256_srli_epi64(c0[g], 32), M0);
			__m256i p1e = _mm256_mul_epu32(c2[g], M1), p1o = _mm256_mul_epu32(_mm256_srli_epi64(c2[g], 32), M1);
			__m256i hi0 = _mm256_blend_epi32(_mm256_srli_epi64(p0e, 32), p0o, 0xAA);
			__m256i lo0 = _mm256_blend_epi32(p0e, _mm256_slli_epi64(p0o, 32), 0xAA);
			__m256i hi1 = _mm256_blend_epi32(_mm256_srli_epi64(p1e, 32), p1o, 0xAA);
			__m256i lo1 = _mm256_blend_epi32(p1e, _mm256_slli_epi64(p1o, 32), 0xAA);
			c0[g] = _mm256_xor_si256(_mm256_xor_si256(hi1, c1[g]), K0[r]);
			c2[g] = _mm256_xor_si256(_mm256_xor_si256(hi0, c3[g]), K1[r]);
			c1[g] = lo1;
			c3[g] = lo0;
		}
	}
	for (int g = 0; g < PHILOX_LANES; g++) {
		w[g][0] = c0[g], w[g][1] = c1[g], w[g][2] = c2[g], w[g][3] = c3[g];
	}
}

// RANDOM_BODY_AVX2 is RANDOM_BODY through philox8_avx2: block i's counter
// words are low32(offset+i) and high32(offset+i), the carry into the high
// word taken where the low word wrapped (an unsigned compare, as signed
// after flipping the sign bits).
#define RANDOM_BODY_AVX2(EMIT)                                                         \
	__m256i K0[10], K1[10];                                                            \
	{                                                                                  \
		uint32_t a = (uint32_t)seed, b = (uint32_t)(seed >> 32);                       \
		for (int r = 0; r < 10; r++, a += 0x9E3779B9u, b += 0xBB67AE85u) {             \
			K0[r] = _mm256_set1_epi32((int)a);                                         \
			K1[r] = _mm256_set1_epi32((int)b);                                         \
		}                                                                              \
	}                                                                                  \
	const __m256i iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);                   \
	const __m256i flip = _mm256_set1_epi32((int)0x80000000u);                          \
	uint32_t C0[PHILOX_GROUP] __attribute__((aligned(32))), C1[PHILOX_GROUP] __attribute__((aligned(32))); \
	uint32_t C2[PHILOX_GROUP] __attribute__((aligned(32))), C3[PHILOX_GROUP] __attribute__((aligned(32))); \
	for (int64_t i0 = 0; i0 < n; i0 += PHILOX_GROUP) {                                 \
		int64_t m = n - i0 < PHILOX_GROUP ? n - i0 : PHILOX_GROUP;                     \
		for (int64_t j = 0; j < m; j += 8 * PHILOX_LANES) {                            \
			__m256i w[PHILOX_LANES][4];                                                \
			for (int g = 0; g < PHILOX_LANES; g++) {                                   \
				uint64_t kb = offset + (uint64_t)(i0 + j + 8 * g);                     \
				__m256i base = _mm256_set1_epi32((int)(uint32_t)kb);                   \
				__m256i lo = _mm256_add_epi32(base, iota);                             \
				__m256i wrapped = _mm256_cmpgt_epi32(_mm256_xor_si256(base, flip), _mm256_xor_si256(lo, flip)); \
				w[g][0] = lo;                                                          \
				w[g][1] = _mm256_sub_epi32(_mm256_set1_epi32((int)(uint32_t)(kb >> 32)), wrapped); \
			}                                                                          \
			philox8_avx2(w, K0, K1);                                                   \
			for (int g = 0; g < PHILOX_LANES; g++) {                                   \
				_mm256_store_si256((__m256i *)(C0 + j + 8 * g), w[g][0]);              \
				_mm256_store_si256((__m256i *)(C1 + j + 8 * g), w[g][1]);              \
				_mm256_store_si256((__m256i *)(C2 + j + 8 * g), w[g][2]);              \
				_mm256_store_si256((__m256i *)(C3 + j + 8 * g), w[g][3]);              \
			}                                                                          \
		}                                                                              \
		_Pragma("omp simd")                                                            \
		for (int64_t j = 0; j < m; j++) {                                              \
			int64_t i = i0 + j;                                                        \
			uint32_t c0 = C0[j], c1 = C1[j], c2 = C2[j], c3 = C3[j];                   \
			(void)c2, (void)c3;                                                        \
			EMIT                                                                       \
		}                                                                              \
	}

RANDOM_FNS(avx2, __attribute__((target("avx2,fma"))), RANDOM_BODY_AVX2)
RANDOM_FNS(avx512, __attribute__((target("avx512f,avx512dq,avx2,fma"))), RANDOM_BODY)
#endif

// memsh_uniform_f32 stores the uniform values of generator offsets
// offset .. offset+n-1 with bits of precision (24, 11 or 8) as float32.
void memsh_uniform_f32(float *o, uint64_t seed, uint64_t offset, int64_t n, int bits, int isa) {
	ISA_DISPATCH(uniform_f32, o, seed, offset, n, bits)
}

// memsh_uniform_f64 is memsh_uniform_f32 for float64 (53 bits).
void memsh_uniform_f64(double *o, uint64_t seed, uint64_t offset, int64_t n, int isa) {
	ISA_DISPATCH(uniform_f64, o, seed, offset, n)
}

// memsh_normal_u stores Box-Muller's u1 and u2 of generator offsets
// offset .. offset+n-1.
void memsh_normal_u(double *u1, double *u2, uint64_t seed, uint64_t offset, int64_t n, int isa) {
	ISA_DISPATCH(normal_u, u1, u2, seed, offset, n)
}

// bfloat16 <-> float32, as kernels_convert.go's bf16ToF32 and f32ToBF16
// (round to nearest, ties to even; a NaN stays a quiet NaN of its sign
// and top payload bits).
MINLINE float bf16_to_f32(uint16_t h) { return u2f((uint32_t)h << 16); }

MINLINE uint16_t f32_to_bf16(float f) {
	uint32_t b = f2u(f);
	uint16_t nan = (uint16_t)(b >> 16) | 0x40;
	uint16_t r = (uint16_t)((b + 0x7fffu + ((b >> 16) & 1u)) >> 16);
	return f != f ? nan : r;
}

// float16 <-> float32, as kernels_convert.go's f16ToF32 and f32ToF16
// (round to nearest, ties to even, through the subnormals; overflow to
// infinity; a NaN becomes the quiet NaN of its sign), every case computed
// and one chosen, so that the loops vectorise.
MINLINE float f16_to_f32(uint16_t h) {
	uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
	uint32_t exp = ((uint32_t)h >> 10) & 0x1fu, mant = (uint32_t)h & 0x3ffu;
	float sub = (float)(int32_t)mant * 0x1p-24f;
	sub = sign ? -sub : sub;
	float infnan = u2f(sign | 0x7f800000u | (mant << 13));
	float norm = u2f(sign | ((exp + 112u) << 23) | (mant << 13));
	return exp == 0x1fu ? infnan : (exp == 0 ? sub : norm);
}

MINLINE uint16_t f32_to_f16(float f) {
	uint32_t b = f2u(f);
	uint32_t sign = (b >> 16) & 0x8000u;
	int32_t exp = (int32_t)((b >> 23) & 0xffu);
	uint32_t mant = b & 0x7fffffu;
	uint32_t naninf = sign | (mant ? 0x7e00u : 0x7c00u);
	int32_t e = exp - 127 + 15;
	// a normal half: e in [1, 30]; a carry out of the mantissa is right
	uint32_t h = ((uint32_t)(e & 0x1f) << 10) | (mant >> 13);
	uint32_t rem = mant & 0x1fffu;
	h += (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ? 1u : 0u;
	// a subnormal half: e in [-10, 0], the shift in [14, 24]
	int32_t sh = e <= 0 && e >= -10 ? 14 - e : 14;
	uint32_t m2 = mant | 0x800000u;
	uint32_t hs = m2 >> sh;
	uint32_t rs = m2 & ((1u << sh) - 1u);
	uint32_t half = 1u << (sh - 1);
	hs += (rs > half || (rs == half && (hs & 1u))) ? 1u : 0u;
	uint32_t r = e <= 0 ? (e < -10 ? sign : sign | hs) : sign | h;
	r = e >= 0x1f ? sign | 0x7c00u : r;
	r = exp == 0xff ? naninf : r;
	return (uint16_t)r;
}

// BF16_BLOCK is the float32 buffer of the bfloat16 loops, in elements.
#define BF16_BLOCK 256

#define MATH_HALF_LOOP(FN, TO_F32, FROM_F32)                        \
	for (int64_t b = 0; b < n; b += BF16_BLOCK) {                  \
		int64_t m = n - b < BF16_BLOCK ? n - b : BF16_BLOCK;       \
		float buf[BF16_BLOCK];                                     \
		_Pragma("omp simd")                                        \
		for (int64_t i = 0; i < m; i++) buf[i] = FN(TO_F32(a[b + i])); \
		_Pragma("omp simd")                                        \
		for (int64_t i = 0; i < m; i++) o[b + i] = FROM_F32(buf[i]); \
	}

#define MATH_HALF_BODY(TO_F32, FROM_F32)                                     \
	switch (op) {                                                            \
	case M_EXP: MATH_HALF_LOOP(exp_f32, TO_F32, FROM_F32) break;             \
	case M_LOG: MATH_HALF_LOOP(log_f32, TO_F32, FROM_F32) break;             \
	case M_TANH: MATH_HALF_LOOP(tanh_f32, TO_F32, FROM_F32) break;           \
	case M_SIGMOID: MATH_HALF_LOOP(sigmoid_f32, TO_F32, FROM_F32) break;     \
	case M_SILU: MATH_HALF_LOOP(silu_f32, TO_F32, FROM_F32) break;           \
	case M_GELU_TANH: MATH_HALF_LOOP(gelu_tanh_f32, TO_F32, FROM_F32) break; \
	case M_GELU: MATH_HALF_LOOP(gelu_erf_isa, TO_F32, FROM_F32) break;       \
	}

#define MATH_BF16_BODY MATH_HALF_BODY(bf16_to_f32, f32_to_bf16)
#define MATH_F16_BODY MATH_HALF_BODY(f16_to_f32, f32_to_f16)

ISA_VARIANTS(math_bf16, (int op, uint16_t *o, const uint16_t *a, int64_t n), MATH_BF16_BODY)

ISA_VARIANTS(math_f16, (int op, uint16_t *o, const uint16_t *a, int64_t n), MATH_F16_BODY)

// memsh_unary_math_f16 is memsh_unary_math_bf16 for float16.
void memsh_unary_math_f16(int op, uint16_t *o, const uint16_t *a, int64_t n, int isa) {
	ISA_DISPATCH(math_f16, op, o, a, n)
}

// memsh_unary_math_bf16 is memsh_unary_math_f32 for n contiguous bfloat16
// elements: each widened to float32, computed, and rounded back (o may be
// a).
void memsh_unary_math_bf16(int op, uint16_t *o, const uint16_t *a, int64_t n, int isa) {
	ISA_DISPATCH(math_bf16, op, o, a, n)
}

// The half-type conversions of n contiguous elements, per instruction set
// (half: 0 bfloat16, 1 float16), for the kernels that widen whole rows.
#define CONV_LOOP(FN)                 \
	_Pragma("omp simd")               \
	for (int64_t i = 0; i < n; i++) o[i] = FN(a[i]);

#define CONV_FNS(SUFFIX, ATTR)                                                               \
	ATTR static void to_f32_##SUFFIX(int half, float *o, const uint16_t *a, int64_t n) {    \
		if (half) { CONV_LOOP(f16_to_f32) } else { CONV_LOOP(bf16_to_f32) }                  \
	}                                                                                        \
	ATTR static void from_f32_##SUFFIX(int half, uint16_t *o, const float *a, int64_t n) {  \
		if (half) { CONV_LOOP(f32_to_f16) } else { CONV_LOOP(f32_to_bf16) }                  \
	}

CONV_FNS(default, )
#ifdef MEMSH_MATH_X86
CONV_FNS(avx2, __attribute__((target("avx2,fma"))))
CONV_FNS(avx512, __attribute__((target("avx512f,avx2,fma"))))
#endif

// memsh_half_to_f32 widens n contiguous half-type values (half: 0
// bfloat16, 1 float16) with the loops for isa.
void memsh_half_to_f32(int half, float *o, const uint16_t *a, int64_t n, int isa) {
	ISA_DISPATCH(to_f32, half, o, a, n)
}

// memsh_f32_to_half rounds n contiguous float32 values to a half type.
void memsh_f32_to_half(int half, uint16_t *o, const float *a, int64_t n, int isa) {
	ISA_DISPATCH(from_f32, half, o, a, n)
}

// Softmax along rows: the forward of softmax and log_softmax over the
// last dimension of rows × n contiguous float32 values, as ATen's CPU
// kernel computes it: m = max(x), e = exp(x − m) in float32, the sum of
// e, then softmax = e · (1/sum) and log_softmax = (x − m) − log(sum).
//
// A row whose values and maximum are finite takes the fast path, all in
// float32 but for the sum: e = exp(x − m) with x − m ≤ 0 known (one clamp,
// no NaN select), summed in float32 over blocks of 64 values (one vector
// accumulator, at most 8 roundings per lane) and the block sums in
// float64; softmax multiplies by 1/sum rounded to float32 (one rounding
// more than a float64 product: within 1 ulp of it); log_softmax
// subtracts log(sum) rounded to float32 from x − m, two terms of one sign
// (x − m ≤ 0, log(sum) ≥ 0, since the maximum's e is 1), so nothing
// cancels and the result is within about 1.5 ulp of y.
//
// Any other row takes the general path: the sum in float64, softmax =
// e · (1/sum) and log_softmax = x − (m + log(sum)) in float64, each
// rounded once. A row holding a NaN is all NaN; a row whose maximum is
// ±infinity gives what x − m gives (NaN where both are infinite), as the
// formula does.

// exp_le0_f32 is exp_f32 for x ≤ 0 and not NaN (a softmax exponent
// x − m of a finite row): the lower clamp only.
MINLINE float exp_le0_f32(float x) {
	float c = x > -104.0f ? x : -104.0f;
	return exp_scaled_f32(c, 0);
}

#define SOFTMAX_BLOCK 64

// SOFTMAX_FAST is the fast path for one finite row x → y with maximum m.
#define SOFTMAX_FAST                                                          	double s = 0;                                                             	int64_t i0 = 0;                                                           	for (; i0 + SOFTMAX_BLOCK <= n; i0 += SOFTMAX_BLOCK) {                    		float bs = 0;                                                         		if (log) {                                                            			_Pragma("omp simd reduction(+:bs)")                               			for (int64_t i = i0; i < i0 + SOFTMAX_BLOCK; i++)                 				bs += exp_le0_f32(x[i] - m);                                  		} else {                                                              			_Pragma("omp simd reduction(+:bs)")                               			for (int64_t i = i0; i < i0 + SOFTMAX_BLOCK; i++) {               				float e = exp_le0_f32(x[i] - m);                              				y[i] = e;                                                     				bs += e;                                                      			}                                                                 		}                                                                     		s += (double)bs;                                                      	}                                                                         	for (; i0 < n; i0++) {                                                    		float e = exp_le0_f32(x[i0] - m);                                     		if (!log) y[i0] = e;                                                  		s += (double)e;                                                       	}                                                                         	if (log) {                                                                		float ls = (float)__builtin_log(s);                                   		_Pragma("omp simd")                                                   		for (int64_t i = 0; i < n; i++) y[i] = (x[i] - m) - ls;               	} else {                                                                  		float inv = (float)(1.0 / s);                                         		_Pragma("omp simd")                                                   		for (int64_t i = 0; i < n; i++) y[i] = y[i] * inv;                    	}

// SOFTMAX_GENERAL is the general path for one row x → y with maximum m
// (NaN when the row holds one).
#define SOFTMAX_GENERAL                                                       	double s = 0;                                                             	if (log) {                                                                		_Pragma("omp simd reduction(+:s)")                                    		for (int64_t i = 0; i < n; i++) s += (double)exp_f32(x[i] - m);       		double c = (double)m + __builtin_log(s);                              		_Pragma("omp simd")                                                   		for (int64_t i = 0; i < n; i++) y[i] = (float)((double)x[i] - c);     	} else {                                                                  		_Pragma("omp simd reduction(+:s)")                                    		for (int64_t i = 0; i < n; i++) {                                     			float e = exp_f32(x[i] - m);                                      			y[i] = e;                                                         			s += (double)e;                                                   		}                                                                     		double inv = 1.0 / s;                                                 		_Pragma("omp simd")                                                   		for (int64_t i = 0; i < n; i++) y[i] = (float)((double)y[i] * inv);   	}

#define SOFTMAX_BODY                                                          	for (int64_t r = 0; r < rows; r++) {                                      		const float *x = a + r * n;                                           		float *y = o + r * n;                                                 		float m = -__builtin_inff();                                          		int nan = 0;                                                          		_Pragma("omp simd reduction(max:m) reduction(|:nan)")                 		for (int64_t i = 0; i < n; i++) {                                     			m = x[i] > m ? x[i] : m;                                          			nan |= x[i] != x[i];                                              		}                                                                     		if (nan) m = __builtin_nanf("");                                      		if (!nan && m > -__builtin_inff() && m < __builtin_inff()) {          			SOFTMAX_FAST                                                      		} else {                                                              			SOFTMAX_GENERAL                                                   		}                                                                     	}

ISA_VARIANTS(softmax, (float *o, const float *a, int64_t rows, int64_t n, int log), SOFTMAX_BODY)

// memsh_softmax_rows_f32 is SOFTMAX_BODY with the loops for isa (o may
// not be a: softmax keeps e in o before it divides).
void memsh_softmax_rows_f32(float *o, const float *a, int64_t rows, int64_t n, int log, int isa) {
	ISA_DISPATCH(softmax, o, a, rows, n, log)
}

// The activations' backward: o = g · f'(x), elementwise over n contiguous
// values. Each keeps the relative accuracy of gradients of deep negative
// inputs, as the forwards do: silu and GELU (erf) in float32 with their
// tails scaled by 2^64 (the exponentials' arguments are exact there),
// GELU's tanh form in float64 inside and rounded once (its argument
// √(2/π)(x + 0.044715x³) would lose that accuracy in float32).
enum { B_SILU, B_GELU_TANH, B_GELU };

// silu_backward: σ(x)(1 + x(1 − σ(x))), with 1 − σ(x) = σ(−x); below
// x = −40 from e^x·2^64 (exp_f32_scaled64), scaled back after the product
// with g (where it cannot overflow: the derivative is below 2^-50 there).
MINLINE float silu_backward_f32(float g, float x) {
	float es = exp_f32_scaled64(x < 0.0f ? x : -x); // e^-|x|·2^64
	float e = es * 0x1p-64f;
	float inv = 1.0f / (1.0f + e);
	float sp = (x >= 0.0f ? 1.0f : e) * inv; // σ(x)
	float sn = (x >= 0.0f ? e : 1.0f) * inv; // σ(−x)
	float d = sp * (1.0f + x * sn);
	float tail = ((es * inv) * (1.0f + x * sn)) * g; // d·g·2^64 for x < 0
	float y = x < -40.0f ? tail * 0x1p-64f : g * d;
	return x != x ? x : y;
}

// gelu_backward, tanh form: with u = √(2/π)(x + 0.044715x³), 1 + tanh(u) =
// 2σ(2u) and 1 − tanh²(u) = 4σ(2u)σ(−2u): σ(2u) + ½x·4σ(2u)σ(−2u)·
// √(2/π)(1 + 3·0.044715x²).
MINLINE float gelu_tanh_backward_f32(float g, float x) {
	double xd = (double)x;
	double t = 2.0 * 0.7978845608028654 * (xd + 0.044715 * (xd * xd * xd));
	double e = exp_f64(-__builtin_fabs(t));
	double sp = (t >= 0.0 ? 1.0 : e) / (1.0 + e);
	double sn = (t >= 0.0 ? e : 1.0) / (1.0 + e);
	double d = sp + 2.0 * xd * sp * sn * 0.7978845608028654 * (1.0 + 3.0 * 0.044715 * (xd * xd));
	float y = (float)((double)g * d);
	return x != x ? x : y;
}

// gelu_backward, erf form: Φ(x) + x·φ(x), φ(x) = e^(−x²/2)/√(2π), in
// float32: e^(−x²/2)·2^64 from the exact split of −x²/2 that gelu_terms
// gives (so the tail keeps its relative accuracy), erfc(z) = t·e^P·e^(−z²)
// from the same fit. Near x = −0.75, where Φ(x) and x·φ(x) cancel, the
// error stays within a few float32 ulps of the terms (at most about 1e-7,
// TestActBackwardULP). Below x = −8 the sum is scaled back after the
// product with g.
MINLINE float gelu_backward_f32(float g, float x) {
	float t, p, ha, hb, hc;
	gelu_terms(x, &t, &p, &ha, &hb, &hc);
	float a = ha + hb; // two-sum: a + e1 = ha + hb
	float b = a - ha;
	float lo = ((ha - (a - b)) + (hb - b)) + hc;
	float es = exp_f32_scaled64(a);
	es = es + es * lo;                     // e^(−x²/2)·2^64
	float erfc = t * exp_f32(p) * es;      // erfc(z)·2^64
	float pdf = 0.39894228040143268f * es; // φ(x)·2^64
	float dpos = (1.0f - (0.5f * 0x1p-64f) * erfc) + x * (pdf * 0x1p-64f);
	float dneg = 0.5f * erfc + x * pdf; // (Φ(x) + x·φ(x))·2^64 for x < 0
	float y = x >= 0.0f ? g * dpos : (x < -8.0f ? (g * dneg) * 0x1p-64f : g * (dneg * 0x1p-64f));
	return x != x ? x : y;
}

#define BWD_LOOP(FN)                               \
	_Pragma("omp simd")                            \
	for (int64_t i = 0; i < n; i++) o[i] = FN(g[i], x[i]);

#define BWD_BODY                                             \
	switch (op) {                                            \
	case B_SILU: BWD_LOOP(silu_backward_f32) break;          \
	case B_GELU_TANH: BWD_LOOP(gelu_tanh_backward_f32) break; \
	case B_GELU: BWD_LOOP(gelu_backward_f32) break;          \
	}

ISA_VARIANTS(bwd, (int op, float *o, const float *g, const float *x, int64_t n), BWD_BODY)

// memsh_act_backward_f32 computes o[i] = g[i]·f'(x[i]) for op (B_*) over n
// contiguous float32 values.
void memsh_act_backward_f32(int op, float *o, const float *g, const float *x, int64_t n, int isa) {
	ISA_DISPATCH(bwd, op, o, g, x, n)
}

// Softmax backward along rows of n contiguous float32 values, given the
// forward's output y and the incoming gradient g (_softmax_backward_data:
// y·(g − Σg·y); _log_softmax_backward_data: g − e^y·Σg), the sum in
// float64 and carried into the float32 pass as two floats s_hi + s_lo:
// y·((g − s_hi) − s_lo), where g − s_hi is exact when g is close to the
// sum (they cancel), and g − e^y·s_hi − e^y·s_lo.
#define SOFTMAX_BWD_BODY                                                            \
	for (int64_t r = 0; r < rows; r++) {                                            \
		const float *gr = g + r * n, *yr = y + r * n;                               \
		float *orow = o + r * n;                                                    \
		double s = 0;                                                               \
		if (log) {                                                                  \
			_Pragma("omp simd reduction(+:s)")                                      \
			for (int64_t i = 0; i < n; i++) s += (double)gr[i];                     \
		} else {                                                                    \
			_Pragma("omp simd reduction(+:s)")                                      \
			for (int64_t i = 0; i < n; i++) s += (double)gr[i] * (double)yr[i];     \
		}                                                                           \
		float sh = (float)s, sl = (float)(s - (double)sh);                          \
		sl = sl == sl ? sl : 0.0f; /* s infinite: as the float64 formula gives */   \
		if (log) {                                                                  \
			_Pragma("omp simd")                                                     \
			for (int64_t i = 0; i < n; i++) {                                       \
				float e = exp_f32(yr[i]);                                           \
				orow[i] = (gr[i] - e * sh) - e * sl;                                \
			}                                                                       \
		} else {                                                                    \
			_Pragma("omp simd")                                                     \
			for (int64_t i = 0; i < n; i++) orow[i] = yr[i] * ((gr[i] - sh) - sl);  \
		}                                                                           \
	}

ISA_VARIANTS(softmax_bwd, (float *o, const float *g, const float *y, int64_t rows, int64_t n, int log), SOFTMAX_BWD_BODY)

// memsh_softmax_backward_rows_f32 is SOFTMAX_BWD_BODY with the loops for isa.
void memsh_softmax_backward_rows_f32(float *o, const float *g, const float *y, int64_t rows, int64_t n, int log, int isa) {
	ISA_DISPATCH(softmax_bwd, o, g, y, rows, n, log)
}
