// What the vectorised C kernels of package tensor (kernels_math.c,
// kernels_normal.c) share: the inlining their per-value functions need to
// vectorise, and the choice among the variants each kernel is compiled
// in — AVX-512, AVX2 with FMA, and the baseline (SSE2 on x86-64, or any
// other architecture) — made at run time from memsh_math_isa's answer.

#ifndef MEMSH_KERNELS_ISA_H
#define MEMSH_KERNELS_ISA_H

#define MINLINE static inline __attribute__((always_inline))

// MEMSH_MATH_X86 is defined where the AVX2 and AVX-512 variants are
// compiled (GCC on x86-64; function-level target attributes).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define MEMSH_MATH_X86 1
#endif

// ISA_DISPATCH calls FN_avx512, FN_avx2 or FN_default with the arguments,
// as isa (memsh_math_isa: 2, 1, 0) says, and returns: the body of every
// exported kernel.
#ifdef MEMSH_MATH_X86
#define ISA_DISPATCH(FN, ...)                               \
	if (isa == 2) { FN##_avx512(__VA_ARGS__); return; } \
	if (isa == 1) { FN##_avx2(__VA_ARGS__); return; }   \
	FN##_default(__VA_ARGS__);
#else
#define ISA_DISPATCH(FN, ...) FN##_default(__VA_ARGS__);
#endif

// ISA_VARIANTS defines the variants ISA_DISPATCH calls: static void
// NAME_default, and where MEMSH_MATH_X86 NAME_avx2 and NAME_avx512, each
// taking PARAMS (in parentheses) with the body BODY compiled for its
// instruction set. Inside BODY the constant ISA_FMA is 1 where that
// instruction set has fused multiply-add (AVX2 and AVX-512) and 0 in the
// baseline, so that code exact only with an FMA (__builtin_fmaf, which is
// a libm call without one) can be chosen at compile time.
#ifdef MEMSH_MATH_X86
#define ISA_VARIANTS(NAME, PARAMS, BODY)                                                           \
	static void NAME##_default PARAMS { enum { ISA_FMA = 0 }; BODY }                               \
	__attribute__((target("avx2,fma"))) static void NAME##_avx2 PARAMS { enum { ISA_FMA = 1 }; BODY } \
	__attribute__((target("avx512f,avx2,fma"))) static void NAME##_avx512 PARAMS { enum { ISA_FMA = 1 }; BODY }
#else
#define ISA_VARIANTS(NAME, PARAMS, BODY) static void NAME##_default PARAMS { enum { ISA_FMA = 0 }; BODY }
#endif

#endif
