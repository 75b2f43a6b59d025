package tensor

/*
#cgo CFLAGS: -O3 -fopenmp-simd
#include <stdint.h>
void memsh_binary_f32(int op, int mode, float *o, const float *a, const float *b, int64_t n, int stream);
void memsh_binary_f64(int op, int mode, double *o, const double *a, const double *b, int64_t n, int stream);
double memsh_sum_f32(const float *a, int64_t n);
double memsh_sum_f64(const double *a, int64_t n);
void memsh_fill_32(uint32_t *o, uint32_t v, int64_t n);
*/
import "C"

import (
	"os"
	"strconv"
	"strings"
	"sync"
	"unsafe"
)

// Vectorised loops (kernels_simd.c) for the hot contiguous cases of the
// elementwise kernels: float32/float64 + - * / with both operands
// contiguous or one a broadcast scalar, float sums and 32-bit fills. Go
// does not vectorise loops; these run the CPU's widest vectors (AVX-512,
// AVX2 or SSE2, chosen at load time). A call costs tens of nanoseconds, so
// the Go loops serve runs shorter than simdMin elements.

// simdMin is the shortest run handed to the C loops.
const simdMin = 64

// Operand modes of memsh_binary_*: both vectors, a vector and a scalar
// (b), a scalar (a) and a vector.
const (
	modeVV = iota
	modeVS
	modeSV
)

// simdMode returns the operand mode for byte strides sa and sb of element
// size sz, or -1 if the run is not contiguous/scalar.
func simdMode(sz, sa, sb int) int {
	switch {
	case sa == sz && sb == sz:
		return modeVV
	case sa == sz && sb == 0:
		return modeVS
	case sa == 0 && sb == sz:
		return modeSV
	}
	return -1
}

// binarySIMD computes n elements of o = a op b (op one of OpAdd, OpSub,
// OpMul, OpDiv) for float32 (size 4) or float64 (size 8); with stream the
// results are written with non-temporal stores (see streamBytes).
func binarySIMD(size int, op BinaryOp, mode int, o, a, b unsafe.Pointer, n int, stream bool) {
	s := cBool(stream)
	if size == 4 {
		C.memsh_binary_f32(C.int(op), C.int(mode), (*C.float)(o), (*C.float)(a), (*C.float)(b), C.int64_t(n), s)
		return
	}
	C.memsh_binary_f64(C.int(op), C.int(mode), (*C.double)(o), (*C.double)(a), (*C.double)(b), C.int64_t(n), s)
}

// streamBytes is the size from which an elementwise op (all its operands
// together, in bytes) writes its result with non-temporal stores: the
// last-level cache's size. Below it the result is better left in the cache
// for the next op; above it the cache cannot hold the operands anyway, and
// skipping the read of the destination's lines saves memory traffic.
var streamBytes = sync.OnceValue(func() int { return lastLevelCache(32 << 20) })

// lastLevelCache returns the size of CPU 0's largest cache (Linux sysfs),
// or def when it cannot be read.
func lastLevelCache(def int) int {
	best := 0
	for i := range 8 {
		data, err := os.ReadFile("/sys/devices/system/cpu/cpu0/cache/index" + strconv.Itoa(i) + "/size")
		if err != nil {
			break
		}
		s := strings.TrimSpace(string(data))
		mult := 1
		switch {
		case strings.HasSuffix(s, "K"):
			mult, s = 1<<10, s[:len(s)-1]
		case strings.HasSuffix(s, "M"):
			mult, s = 1<<20, s[:len(s)-1]
		}
		if n, err := strconv.Atoi(s); err == nil {
			best = max(best, n*mult)
		}
	}
	if best == 0 {
		return def
	}
	return best
}

// sumSIMD returns the sum, in float64, of n contiguous float32 (size 4) or
// float64 (size 8) elements.
func sumSIMD(size int, p unsafe.Pointer, n int) float64 {
	if size == 4 {
		return float64(C.memsh_sum_f32((*C.float)(p), C.int64_t(n)))
	}
	return float64(C.memsh_sum_f64((*C.double)(p), C.int64_t(n)))
}

// fill32SIMD stores v into n contiguous 32-bit elements.
func fill32SIMD(p unsafe.Pointer, v uint32, n int) {
	C.memsh_fill_32((*C.uint32_t)(p), C.uint32_t(v), C.int64_t(n))
}
