// Box-Muller's last step for the normal generator (see kernels_random.go):
// z = sqrt(-2 ln u1) × cos(2π u2) in float64, bit for bit as Go computes
// it on amd64 with math.Log (archLog, math/log_amd64.s: FreeBSD's
// e_log.c in SSE2 instructions) and math.Cos (math/sin.go: Cephes), so
// that a vectorised loop gives the values randomValue gives.
//
// Bit-exactness needs the same operations in the same order, each rounded
// to float64: no contraction of a*b+c into a fused multiply-add (the
// AVX2 and AVX-512 variants could otherwise use one), and no reassociation
// (the file is compiled without -ffast-math). sqrt is IEEE's correctly
// rounded square root in both; GCC keeps C's sqrt a library call (errno)
// that stops vectorisation, and cgo does not allow -fno-math-errno, so the
// x86 variants take it from SSE2/AVX instructions (a second loop), the
// others from the C library. The constants are Go's,
// written as hexadecimal floats. The domain is Box-Muller's: u1 in
// (0, 1], a normal float64, and 2π·u2 in [0, 2π), far below Go's
// reduceThreshold, so neither function's special cases arise (both are
// documented where they are skipped). kernels_random_test.go checks every
// variant against Go's functions over millions of (u1, u2) pairs and the
// edges of both domains.

#pragma GCC optimize("fp-contract=off", "no-trapping-math")

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernels_isa.h"

// go_log_unit is Go's math.Log on amd64 for x a positive normal float64
// (archLog without its zero, negative, infinity and NaN branches).
MINLINE double go_log_unit(double x) {
	uint64_t b;
	memcpy(&b, &x, 8);
	// f1, k := frexp(x): f1 in [0.5, 1)
	uint64_t fb = (b & 0x000FFFFFFFFFFFFFull) | 0x3FE0000000000000ull;
	double f1;
	memcpy(&f1, &fb, 8);
	double k = (double)((int32_t)((b >> 52) & 0x7FF) - 0x3FE);
	// archLog compares with cmpnlt: f1 <= √2/2 takes k-1 and 2·f1
	int lo = f1 <= 0x1.6a09e667f3bcdp-01;
	double one = lo ? 1.0 : 0.0;
	k = k - one;
	f1 = f1 * (one + 1.0);
	double f = f1 - 1.0;
	double s = f / (2.0 + f);
	double s2 = s * s;
	double s4 = s2 * s2;
	double t1 = s2 * ((((0x1.2f112df3e5244p-03 * s4 + 0x1.7466496cb03dep-03) * s4 + 0x1.2492494229359p-02) * s4) + 0x1.5555555555593p-01);
	double t2 = s4 * (((0x1.39a09d078c69fp-03 * s4 + 0x1.c71c51d8e78afp-03) * s4) + 0x1.999999997fa04p-02);
	double R = t1 + t2;
	double hfsq = (0.5 * f) * f;
	double a = s * (R + hfsq) + k * 0x1.a39ef35793c76p-33;
	return k * 0x1.62e42feep-01 - ((hfsq - a) - f);
}

// go_cos_small is Go's math.Cos (the portable cos of math/sin.go, which
// amd64 uses) for x in [0, reduceThreshold): no NaN, infinity or Payne-
// Hanek reduction; x >= 0, so its Abs is the identity.
MINLINE double go_cos_small(double x) {
	int32_t j = (int32_t)(x * 0x1.45f306dc9c883p+00); // x / (π/4), truncated
	j += j & 1;                                          // map zeros to origin
	double y = (double)j;
	j &= 7;
	int sign = j > 3;
	j -= sign ? 4 : 0;
	sign ^= j > 1;
	double z = ((x - y * 0x1.921fb4p-01) - y * 0x1.4442dp-25) - y * 0x1.8469898cc517p-49;
	double zz = z * z;
	double ps = z + z * zz * ((((((0x1.5d8fd1fd19ccdp-33 * zz) + -0x1.ae5e5a9291f5dp-26) * zz + 0x1.71de3567d48a1p-19) * zz + -0x1.a01a019bfdf03p-13) * zz + 0x1.111111110f7dp-07) * zz + -0x1.5555555555548p-03);
	double pc = 1.0 - 0.5 * zz + zz * zz * ((((((-0x1.8fa49a0861a9bp-37 * zz) + 0x1.1ee9d7b4e3f05p-29) * zz + -0x1.27e4f7eac4bc6p-22) * zz + 0x1.a01a019c844f5p-16) * zz + -0x1.6c16c16c14f91p-10) * zz + 0x1.555555555554bp-05);
	double r = (j == 1 || j == 2) ? ps : pc;
	return sign ? -r : r;
}

// BLOCK is the number of values the two loops of a kernel share through
// the stack: the vectorised logarithms and cosines, then the square roots.
#define BLOCK 256

// BM_FIRST computes a[i] = -2 ln u1[i] and c[i] = cos(2π u2[i]) for block
// [b, b+m); the constant is Go's 2*math.Pi.
#define BM_FIRST                                                         \
	_Pragma("omp simd")                                                  \
	for (int64_t i = 0; i < m; i++) {                                    \
		a[i] = -2.0 * go_log_unit(u1[b + i]);                            \
		c[i] = go_cos_small(0x1.921fb54442d18p+02 * u2[b + i]);          \
	}

#ifdef MEMSH_MATH_X86
#include <immintrin.h>

// The square roots and products: o = sqrt(a) * c, per ISA; SSE2 is the
// x86-64 baseline.
#define BM_SECOND(T, SQRTMUL)                       \
	int64_t i = 0;                                  \
	SQRTMUL                                         \
	for (; i < m; i++) {                            \
		__m128d v = _mm_sqrt_sd(_mm_setzero_pd(), _mm_set_sd(a[i])); \
		o[b + i] = (T)(_mm_cvtsd_f64(v) * c[i]);    \
	}

#define SQRTMUL_F64_SSE2 for (; i + 2 <= m; i += 2) _mm_storeu_pd(o + b + i, _mm_mul_pd(_mm_sqrt_pd(_mm_loadu_pd(a + i)), _mm_loadu_pd(c + i)));
#define SQRTMUL_F32_SSE2 for (; i + 2 <= m; i += 2) { double t[2]; _mm_storeu_pd(t, _mm_mul_pd(_mm_sqrt_pd(_mm_loadu_pd(a + i)), _mm_loadu_pd(c + i))); o[b + i] = (float)t[0]; o[b + i + 1] = (float)t[1]; }
#define SQRTMUL_F64_AVX2 for (; i + 4 <= m; i += 4) _mm256_storeu_pd(o + b + i, _mm256_mul_pd(_mm256_sqrt_pd(_mm256_loadu_pd(a + i)), _mm256_loadu_pd(c + i)));
#define SQRTMUL_F32_AVX2 for (; i + 4 <= m; i += 4) _mm_storeu_ps(o + b + i, _mm256_cvtpd_ps(_mm256_mul_pd(_mm256_sqrt_pd(_mm256_loadu_pd(a + i)), _mm256_loadu_pd(c + i))));
#define SQRTMUL_F64_AVX512 for (; i + 8 <= m; i += 8) _mm512_storeu_pd(o + b + i, _mm512_mul_pd(_mm512_sqrt_pd(_mm512_loadu_pd(a + i)), _mm512_loadu_pd(c + i)));
#define SQRTMUL_F32_AVX512 for (; i + 8 <= m; i += 8) _mm256_storeu_ps(o + b + i, _mm512_cvtpd_ps(_mm512_mul_pd(_mm512_sqrt_pd(_mm512_loadu_pd(a + i)), _mm512_loadu_pd(c + i))));
#else
#define BM_SECOND(T, SQRTMUL)             \
	for (int64_t i = 0; i < m; i++) {     \
		o[b + i] = (T)(sqrt(a[i]) * c[i]); \
	}
#endif

#define BM_FN(NAME, T, ATTR, SQRTMUL)                                                  \
	ATTR static void NAME(T *o, const double *u1, const double *u2, int64_t n) {      \
		double a[BLOCK], c[BLOCK];                                                    \
		for (int64_t b = 0; b < n; b += BLOCK) {                                      \
			int64_t m = n - b < BLOCK ? n - b : BLOCK;                                \
			BM_FIRST                                                                  \
			BM_SECOND(T, SQRTMUL)                                                     \
		}                                                                             \
	}

#ifdef MEMSH_MATH_X86
BM_FN(bm_f64_default, double, , SQRTMUL_F64_SSE2)
BM_FN(bm_f32_default, float, , SQRTMUL_F32_SSE2)
BM_FN(bm_f64_avx2, double, __attribute__((target("avx2,fma"))), SQRTMUL_F64_AVX2)
BM_FN(bm_f32_avx2, float, __attribute__((target("avx2,fma"))), SQRTMUL_F32_AVX2)
BM_FN(bm_f64_avx512, double, __attribute__((target("avx512f,avx512dq,avx2,fma"))), SQRTMUL_F64_AVX512)
BM_FN(bm_f32_avx512, float, __attribute__((target("avx512f,avx512dq,avx2,fma"))), SQRTMUL_F32_AVX512)
#else
BM_FN(bm_f64_default, double, , )
BM_FN(bm_f32_default, float, , )
#endif

// memsh_box_muller_f64 stores sqrt(-2 ln u1[i]) × cos(2π u2[i]) (Go's
// boxMuller) for n elements, with the loops for isa (memsh_math_isa).
void memsh_box_muller_f64(double *o, const double *u1, const double *u2, int64_t n, int isa) {
	ISA_DISPATCH(bm_f64, o, u1, u2, n)
}

// memsh_box_muller_f32 is memsh_box_muller_f64 rounded to float32.
void memsh_box_muller_f32(float *o, const double *u1, const double *u2, int64_t n, int isa) {
	ISA_DISPATCH(bm_f32, o, u1, u2, n)
}
