// Vectorised inner loops of the CPU kernels (see kernels_simd.go).
//
// GCC compiles each exported function three times (target_clones: AVX-512,
// AVX2 and baseline x86-64) and picks one when the program loads, so the
// binary runs on any x86-64 CPU and uses the widest vectors it has. The
// loops are plain C that GCC vectorises; "GCC ivdep" tells it that the
// output never overlaps an input except element for element (in-place
// ops, where the output is the first input: reading a[i] before writing
// o[i] is then still right), which the Go side guarantees.
//
// With stream set, results are computed into a small buffer and written
// with non-temporal stores, which skip reading the destination's cache
// lines first: the Go side asks for it when the operands are larger than
// the last-level cache, where that saves a third of the memory traffic.

#include <stdint.h>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define MEMSH_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define MEMSH_CLONES
#endif

#if defined(__SSE2__)
#include <emmintrin.h>
#define MEMSH_STREAM 1
#endif

#define INLINE static inline __attribute__((always_inline))

// Operation and operand-mode codes, as in kernels_simd.go.
enum { OP_ADD, OP_SUB, OP_MUL, OP_DIV };
enum { MODE_VV, MODE_VS, MODE_SV };

#define LOOP(EXPR)                      \
	_Pragma("GCC ivdep")                \
	for (int64_t i = 0; i < n; i++) {   \
		o[i] = EXPR;                    \
	}

#define BINARY(T)                                                    \
	switch (mode * 4 + op) {                                         \
	case MODE_VV * 4 + OP_ADD: LOOP(a[i] + b[i]) break;              \
	case MODE_VV * 4 + OP_SUB: LOOP(a[i] - b[i]) break;              \
	case MODE_VV * 4 + OP_MUL: LOOP(a[i] * b[i]) break;              \
	case MODE_VV * 4 + OP_DIV: LOOP(a[i] / b[i]) break;              \
	case MODE_VS * 4 + OP_ADD: { T s = b[0]; LOOP(a[i] + s) } break; \
	case MODE_VS * 4 + OP_SUB: { T s = b[0]; LOOP(a[i] - s) } break; \
	case MODE_VS * 4 + OP_MUL: { T s = b[0]; LOOP(a[i] * s) } break; \
	case MODE_VS * 4 + OP_DIV: { T s = b[0]; LOOP(a[i] / s) } break; \
	case MODE_SV * 4 + OP_ADD: { T s = a[0]; LOOP(s + b[i]) } break; \
	case MODE_SV * 4 + OP_SUB: { T s = a[0]; LOOP(s - b[i]) } break; \
	case MODE_SV * 4 + OP_MUL: { T s = a[0]; LOOP(s * b[i]) } break; \
	case MODE_SV * 4 + OP_DIV: { T s = a[0]; LOOP(s / b[i]) } break; \
	}

INLINE void binary_f32(int op, int mode, float *o, const float *a, const float *b, int64_t n) { BINARY(float) }
INLINE void binary_f64(int op, int mode, double *o, const double *a, const double *b, int64_t n) { BINARY(double) }

// STREAM_BLOCK is the buffer size, in bytes, of the streaming loops.
#define STREAM_BLOCK 4096

#ifdef MEMSH_STREAM
// stream_block copies nbytes (a multiple of 16) from buf to a 16-byte
// aligned o with non-temporal stores.
INLINE void stream_block(void *o, const void *buf, int64_t nbytes) {
	__m128i *d = (__m128i *)o;
	const __m128i *s = (const __m128i *)buf;
	for (int64_t i = 0; i < nbytes / 16; i++) {
		_mm_stream_si128(d + i, _mm_load_si128(s + i));
	}
}
#endif

// STREAMED(T, FN) runs FN (binary_f32/f64) over n elements, streaming the
// results; a and b advance unless they are the scalar operand.
#ifdef MEMSH_STREAM
#define STREAMED(T, FN)                                                           \
	int64_t head = 0;                                                             \
	while (head < n && ((uintptr_t)(o + head) & 15)) head++;                      \
	FN(op, mode, o, a, b, head);                                                  \
	int64_t da = mode == MODE_SV ? 0 : 1, db = mode == MODE_VS ? 0 : 1;           \
	T buf[STREAM_BLOCK / sizeof(T)] __attribute__((aligned(64)));                 \
	const int64_t per = STREAM_BLOCK / sizeof(T);                                 \
	int64_t i = head;                                                             \
	for (; i + per <= n; i += per) {                                              \
		FN(op, mode, buf, a + i * da, b + i * db, per);                           \
		stream_block(o + i, buf, STREAM_BLOCK);                                   \
	}                                                                             \
	FN(op, mode, o + i, a + i * da, b + i * db, n - i);                           \
	_mm_sfence();
#else
#define STREAMED(T, FN) FN(op, mode, o, a, b, n);
#endif

// memsh_binary_f32 computes o[i] = a[i] op b[i] for n contiguous float32
// elements; in MODE_VS b is one value, in MODE_SV a is. stream: see above.
MEMSH_CLONES void memsh_binary_f32(int op, int mode, float *o, const float *a, const float *b, int64_t n, int stream) {
	if (!stream) {
		binary_f32(op, mode, o, a, b, n);
		return;
	}
	STREAMED(float, binary_f32)
}

// memsh_binary_f64 is memsh_binary_f32 for float64.
MEMSH_CLONES void memsh_binary_f64(int op, int mode, double *o, const double *a, const double *b, int64_t n, int stream) {
	if (!stream) {
		binary_f64(op, mode, o, a, b, n);
		return;
	}
	STREAMED(double, binary_f64)
}

// memsh_sum_f32 returns the sum of n contiguous float32 values, accumulated
// in double precision.
MEMSH_CLONES double memsh_sum_f32(const float *a, int64_t n) {
	double s = 0;
#pragma omp simd reduction(+ : s)
	for (int64_t i = 0; i < n; i++) {
		s += (double)a[i];
	}
	return s;
}

// memsh_sum_f64 returns the sum of n contiguous float64 values.
MEMSH_CLONES double memsh_sum_f64(const double *a, int64_t n) {
	double s = 0;
#pragma omp simd reduction(+ : s)
	for (int64_t i = 0; i < n; i++) {
		s += a[i];
	}
	return s;
}

// memsh_fill_32 stores v into n contiguous 32-bit elements.
MEMSH_CLONES void memsh_fill_32(uint32_t *o, uint32_t v, int64_t n) {
	for (int64_t i = 0; i < n; i++) {
		o[i] = v;
	}
}
