package tensor

/*
#include <stdint.h>
int memsh_math_isa(void);
void memsh_unary_math_f32(int op, float *o, const float *a, int64_t n, int isa);
void memsh_unary_math_bf16(int op, uint16_t *o, const uint16_t *a, int64_t n, int isa);
void memsh_unary_math_f16(int op, uint16_t *o, const uint16_t *a, int64_t n, int isa);
void memsh_half_to_f32(int half, float *o, const uint16_t *a, int64_t n, int isa);
void memsh_f32_to_half(int half, uint16_t *o, const float *a, int64_t n, int isa);
void memsh_softmax_rows_f32(float *o, const float *a, int64_t rows, int64_t n, int log, int isa);
void memsh_act_backward_f32(int op, float *o, const float *g, const float *x, int64_t n, int isa);
void memsh_softmax_backward_rows_f32(float *o, const float *g, const float *y, int64_t rows, int64_t n, int log, int isa);
*/
import "C"

import (
	"sync"
	"unsafe"
)

// Vectorised float32 exp, log, tanh and sigmoid, the activations silu and
// GELU (both forms, forward and backward), and softmax / log_softmax along
// rows (forward and backward)
// (kernels_math.c: AVX-512, AVX2+FMA or baseline loops, chosen at run
// time). They serve the float32 unary ops (and float16/bfloat16, computed
// in float32; contiguous half types convert in C) for every run length, so
// a value's result never depends on the tensor's layout, and silu, GELU
// and softmax over the last dimension of contiguous float32 and
// half-type tensors (nn_activation.go; other layouts and dtypes use the
// float64 host kernels). Accuracy: exp, log, tanh and GELU (tanh) within 1
// ulp of the correctly rounded result, sigmoid within 2, silu within 3,
// GELU (erf) within 6 (kernels_math_test.go's bound; 4 with an FMA and 5
// without over every float32 of |x| < 17, 2 subnormal ulp:
// MEMSH_EXHAUSTIVE=1 TestGeluErfExhaustive); the backward of silu within
// 6, of GELU within 4 and its tanh form 1, absolute (2^-22·|g|) where the
// derivative's terms cancel (kernels_backward_test.go); float64 tensors
// keep Go's math package.

// Operation codes of memsh_unary_math_f32, _bf16 and _f16: the
// unary ops, and the activations built on them (silu, GELU's tanh form;
// see kernels_math.c).
const (
	mathExp = iota
	mathLog
	mathTanh
	mathSigmoid
	mathSilu
	mathGeluTanh
	mathGelu
)

// mathISA is the instruction set memsh_unary_math_f32 uses: 2 AVX-512,
// 1 AVX2+FMA, 0 baseline. Tests lower it to check each variant.
var mathISA = sync.OnceValue(func() int { return int(C.memsh_math_isa()) })

// mathOp returns the memsh_unary_math_f32 code of op, or -1.
func mathOp(op UnaryOp) int {
	switch op {
	case OpExp:
		return mathExp
	case OpLog:
		return mathLog
	case OpTanh:
		return mathTanh
	case OpSigmoid:
		return mathSigmoid
	}
	return -1
}

// mathF32 runs the math kernel code over n contiguous float32 values (o
// may equal a) with instruction set isa.
func mathF32(code int, o, a unsafe.Pointer, n, isa int) {
	if n > 0 {
		C.memsh_unary_math_f32(C.int(code), (*C.float)(o), (*C.float)(a), C.int64_t(n), C.int(isa))
	}
}

// mathHalf is mathF32 for n contiguous values of dt, float32 or a half
// type (float16, bfloat16: each computed in float32 and rounded back as
// storeF32 rounds).
func mathHalf(dt DType, code int, o, a unsafe.Pointer, n, isa int) {
	switch {
	case n <= 0:
	case dt == Float32:
		mathF32(code, o, a, n, isa)
	case dt == BFloat16:
		C.memsh_unary_math_bf16(C.int(code), (*C.uint16_t)(o), (*C.uint16_t)(a), C.int64_t(n), C.int(isa))
	default:
		C.memsh_unary_math_f16(C.int(code), (*C.uint16_t)(o), (*C.uint16_t)(a), C.int64_t(n), C.int(isa))
	}
}

// vectorisedDT reports whether the math kernels serve dtype dt directly:
// float32, and the half types through their C conversions.
func vectorisedDT(dt DType) bool { return dt == Float32 || dt == BFloat16 || dt == Float16 }

// softmaxRowsF32 computes softmax (log_softmax when log) along each of
// rows rows of n contiguous float32 values from a into o (o != a), with
// kernels_math.c's loops for isa.
func softmaxRowsF32(o, a unsafe.Pointer, rows, n int, log bool, isa int) {
	if rows > 0 && n > 0 {
		C.memsh_softmax_rows_f32((*C.float)(o), (*C.float)(a), C.int64_t(rows), C.int64_t(n), cBool(log), C.int(isa))
	}
}

// Operation codes of memsh_act_backward_f32: the activations' backward
// (kernels_math.c).
const (
	bwdSilu = iota
	bwdGeluTanh
	bwdGelu
)

// actBackwardF32 computes o[i] = g[i]·f'(x[i]) for the backward op code
// over n contiguous float32 values, with instruction set isa.
func actBackwardF32(code int, o, g, x unsafe.Pointer, n, isa int) {
	if n > 0 {
		C.memsh_act_backward_f32(C.int(code), (*C.float)(o), (*C.float)(g), (*C.float)(x), C.int64_t(n), C.int(isa))
	}
}

// softmaxBackwardRowsF32 is _softmax_backward_data (log:
// _log_softmax_backward_data) along rows of n contiguous float32 values:
// g the incoming gradient, y the forward's output.
func softmaxBackwardRowsF32(o, g, y unsafe.Pointer, rows, n int, log bool, isa int) {
	if rows > 0 && n > 0 {
		C.memsh_softmax_backward_rows_f32((*C.float)(o), (*C.float)(g), (*C.float)(y), C.int64_t(rows), C.int64_t(n), cBool(log), C.int(isa))
	}
}

// cBool is b as a C int flag (1 or 0).
func cBool(b bool) C.int {
	if b {
		return 1
	}
	return 0
}

// halfToF32s and f32ToHalfs convert n contiguous elements of half type dt
// (float16 or bfloat16) to and from float32, as f16ToF32/bf16ToF32 and
// f32ToF16/f32ToBF16 do.
func halfToF32s(dt DType, o, a unsafe.Pointer, n int) { halfToF32sISA(dt, o, a, n, mathISA()) }

func f32ToHalfs(dt DType, o, a unsafe.Pointer, n int) { f32ToHalfsISA(dt, o, a, n, mathISA()) }

// halfToF32sISA and f32ToHalfsISA are halfToF32s and f32ToHalfs with the
// loops for instruction set isa.
func halfToF32sISA(dt DType, o, a unsafe.Pointer, n, isa int) {
	if n > 0 {
		C.memsh_half_to_f32(halfCode(dt), (*C.float)(o), (*C.uint16_t)(a), C.int64_t(n), C.int(isa))
	}
}

func f32ToHalfsISA(dt DType, o, a unsafe.Pointer, n, isa int) {
	if n > 0 {
		C.memsh_f32_to_half(halfCode(dt), (*C.uint16_t)(o), (*C.float)(a), C.int64_t(n), C.int(isa))
	}
}

// halfCode is the C conversions' code of half type dt: 0 bfloat16, 1
// float16.
func halfCode(dt DType) C.int {
	if dt == Float16 {
		return 1
	}
	return 0
}

// ExpF32, LogF32, TanhF32 and SigmoidF32 compute dst[i] = f(src[i]) for
// float32 slices of equal length (dst may be src) with the vectorised
// kernels: the helpers for ops built on these functions (softmax, GELU,
// SiLU, ...), so that they round exactly as tensor.Exp, Log, Tanh and
// Sigmoid do. They run on the calling goroutine; split large inputs with
// parallelFor.
func ExpF32(dst, src []float32) { mathSlice(mathExp, dst, src) }

// LogF32 is the natural logarithm (see ExpF32).
func LogF32(dst, src []float32) { mathSlice(mathLog, dst, src) }

// TanhF32 is the hyperbolic tangent (see ExpF32).
func TanhF32(dst, src []float32) { mathSlice(mathTanh, dst, src) }

// SigmoidF32 is 1/(1+e^-x) (see ExpF32).
func SigmoidF32(dst, src []float32) { mathSlice(mathSigmoid, dst, src) }

func mathSlice(code int, dst, src []float32) {
	if len(dst) != len(src) {
		panic("tensor: math kernel: dst and src lengths differ")
	}
	if len(src) == 0 {
		return
	}
	mathF32(code, unsafe.Pointer(&dst[0]), unsafe.Pointer(&src[0]), len(src), mathISA())
}

// mathBlock is the buffer length, in elements, of the strided and
// float16/bfloat16 paths of unaryMathKernel.
const mathBlock = 512

// unaryMathKernel computes out = op(in) for op with a math kernel (code)
// and outDT of float32 kind: contiguous float32 runs go straight to the C
// loops, others are loaded into a float32 buffer, computed and stored.
func unaryMathKernel(code int, it *elemIter, outDT, inDT DType) {
	so, si := it.inner[0], it.inner[1]
	isa := mathISA()
	if outDT == Float32 && inDT == Float32 && so == 4 && si == 4 {
		it.run(func(p []unsafe.Pointer, n int) { mathF32(code, p[0], p[1], n, isa) })
		return
	}
	if outDT == inDT && (inDT == BFloat16 || inDT == Float16) && so == 2 && si == 2 {
		it.run(func(p []unsafe.Pointer, n int) { mathHalf(inDT, code, p[0], p[1], n, isa) })
		return
	}
	load, store := loaderF32(inDT, outDT), storeF32[outDT]
	it.run(func(p []unsafe.Pointer, n int) {
		var buf [mathBlock]float32
		o, x := p[0], p[1]
		for n > 0 {
			m := min(n, mathBlock)
			for i := range m {
				buf[i] = load(x)
				x = unsafe.Add(x, si)
			}
			mathF32(code, unsafe.Pointer(&buf[0]), unsafe.Pointer(&buf[0]), m, isa)
			for i := range m {
				store(o, buf[i])
				o = unsafe.Add(o, so)
			}
			n -= m
		}
	})
}
