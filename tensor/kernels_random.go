package tensor

/*
#cgo LDFLAGS: -lm
#include <stdint.h>
void memsh_uniform_f32(float *o, uint64_t seed, uint64_t offset, int64_t n, int bits, int isa);
void memsh_uniform_f64(double *o, uint64_t seed, uint64_t offset, int64_t n, int isa);
void memsh_normal_u(double *u1, double *u2, uint64_t seed, uint64_t offset, int64_t n, int isa);
void memsh_box_muller_f64(double *o, const double *u1, const double *u2, int64_t n, int isa);
void memsh_box_muller_f32(float *o, const double *u1, const double *u2, int64_t n, int isa);
*/
import "C"

import (
	"math"
	"math/bits"
	"sync/atomic"
	"unsafe"
)

// The random generator: Philox-4x32-10 (Salmon et al., "Parallel random
// numbers: as easy as 1, 2, 3", SC 2011), keyed by the 64-bit seed
// (key = [low 32 bits, high 32 bits]). The value with generator offset k
// (k counts values drawn since manual_seed, across calls) uses the block
// philox(counter = [low32(k), high32(k), 0, 0], key) = [x0, x1, x2, x3]:
//
//	uniform:  u = x0 >> (32-b) × 2^-b with b = 24 (float32), 11 (float16),
//	          8 (bfloat16); float64 uses 53 bits: (x0<<32 | x1) >> 11 × 2^-53
//	normal:   u1 = 1 - ((x0<<32 | x1) >> 11) × 2^-53, u2 = ((x2<<32 | x3) >> 11) × 2^-53,
//	          z = sqrt(-2 ln u1) × cos(2π u2) in float64, rounded to the dtype
//
// so a device kernel reproduces the same values from (seed, offset).

const (
	philoxM0 = 0xD2511F53
	philoxM1 = 0xCD9E8D57
	philoxW0 = 0x9E3779B9
	philoxW1 = 0xBB67AE85
)

// philox4x32 is Philox-4x32 with 10 rounds.
func philox4x32(ctr [4]uint32, key [2]uint32) [4]uint32 {
	for range 10 {
		hi0, lo0 := bits.Mul32(philoxM0, ctr[0])
		hi1, lo1 := bits.Mul32(philoxM1, ctr[2])
		ctr = [4]uint32{hi1 ^ ctr[1] ^ key[0], lo1, hi0 ^ ctr[3] ^ key[1], lo0}
		key[0] += philoxW0
		key[1] += philoxW1
	}
	return ctr
}

// randomValue is the value of generator offset k as float64 (already
// rounded to dt's precision for uniform draws so that [0, 1) holds).
func randomValue(seed, k uint64, dt DType, normal bool) float64 {
	x := philox4x32([4]uint32{uint32(k), uint32(k >> 32), 0, 0}, [2]uint32{uint32(seed), uint32(seed >> 32)})
	hi := (uint64(x[0])<<32 | uint64(x[1])) >> 11
	if normal {
		u1 := 1 - float64(hi)*(1.0/(1<<53))
		u2 := float64((uint64(x[2])<<32|uint64(x[3]))>>11) * (1.0 / (1 << 53))
		return boxMuller(u1, u2)
	}
	switch dt {
	case Float64:
		return float64(hi) * (1.0 / (1 << 53))
	case Float16:
		return float64(x[0]>>21) * (1.0 / (1 << 11))
	case BFloat16:
		return float64(x[0]>>24) * (1.0 / (1 << 8))
	}
	return float64(x[0]>>8) * (1.0 / (1 << 24))
}

// randomBlock is the buffer length, in elements, of the random kernels'
// paths that finish values in Go.
const randomBlock = 256

// The bulk generators: Philox runs in C (kernels_math.c), vectorised
// across counters (AVX-512, AVX2 or baseline, as the math kernels), with
// exactly randomValue's mapping; normal values finish with Box-Muller in
// C too (kernels_normal.c: Go's amd64 math.Log and math.Cos transcribed
// operation for operation, without fused multiply-adds), so that they stay
// bit-identical to randomValue's. Large requests are split over
// goroutines by counter ranges.

// randomKernel fills n contiguous elements of dtype dt at p with the
// values of generator offsets offset, offset+1, ...
func randomKernel(p unsafe.Pointer, dt DType, n int, seed, offset uint64, normal bool) {
	randomKernelISA(nil, p, dt, n, seed, offset, normal, mathISA())
}

// randomKernelStop is randomKernel stopping between chunks of
// interruptGrain elements once stop (when not nil) is set (see
// Context.Interrupt), leaving p partly written.
func randomKernelStop(stop *atomic.Bool, p unsafe.Pointer, dt DType, n int, seed, offset uint64, normal bool) {
	randomKernelISA(stop, p, dt, n, seed, offset, normal, mathISA())
}

// randomKernelISA is randomKernelStop with the C loops for instruction set
// isa (see mathISA).
func randomKernelISA(stop *atomic.Bool, p unsafe.Pointer, dt DType, n int, seed, offset uint64, normal bool, isa0 int) {
	isa := C.int(isa0)
	cs := C.uint64_t(seed)
	size := dt.Size()
	parallelForStop(stop, n, parallelThreshold/8, interruptGrain, func(lo, hi int) {
		at := func(i int) unsafe.Pointer { return elemAddr(p, i, size) }
		switch {
		case normal:
			var u1, u2, z [randomBlock]float64
			for i := lo; i < hi; i += randomBlock {
				m := min(randomBlock, hi-i)
				C.memsh_normal_u((*C.double)(&u1[0]), (*C.double)(&u2[0]), cs, C.uint64_t(offset+uint64(i)), C.int64_t(m), isa)
				switch dt {
				case Float32:
					boxMullerF32s(unsafe.Slice((*float32)(at(i)), m), u1[:m], u2[:m], isa0)
				case Float64:
					boxMullerF64s(unsafe.Slice((*float64)(at(i)), m), u1[:m], u2[:m], isa0)
				default:
					boxMullerF64s(z[:m], u1[:m], u2[:m], isa0)
					store := storeF64[dt]
					for j := range m {
						store(at(i+j), z[j])
					}
				}
			}
		case dt == Float32:
			C.memsh_uniform_f32((*C.float)(at(lo)), cs, C.uint64_t(offset+uint64(lo)), C.int64_t(hi-lo), 24, isa)
		case dt == Float64:
			C.memsh_uniform_f64((*C.double)(at(lo)), cs, C.uint64_t(offset+uint64(lo)), C.int64_t(hi-lo), isa)
		default:
			// float16 and bfloat16: 11 or 8 bits, exact in float32 and in dt.
			b := C.int(11)
			if dt == BFloat16 {
				b = 8
			}
			store := storeF32[dt]
			var buf [randomBlock]float32
			for i := lo; i < hi; i += randomBlock {
				m := min(randomBlock, hi-i)
				C.memsh_uniform_f32((*C.float)(&buf[0]), cs, C.uint64_t(offset+uint64(i)), C.int64_t(m), b, isa)
				for j := range m {
					store(at(i+j), buf[j])
				}
			}
		}
	})
}

// boxMullerF64s sets o[i] = boxMuller(u1[i], u2[i]), bit for bit, with
// kernels_normal.c's loops for instruction set isa (see mathISA); u1 must
// lie in (0, 1] and u2 in [0, 1), as Philox's do. The slices have one
// length.
func boxMullerF64s(o, u1, u2 []float64, isa int) {
	if len(o) > 0 {
		C.memsh_box_muller_f64((*C.double)(&o[0]), (*C.double)(&u1[0]), (*C.double)(&u2[0]), C.int64_t(len(o)), C.int(isa))
	}
}

// boxMullerF32s is boxMullerF64s rounded to float32.
func boxMullerF32s(o []float32, u1, u2 []float64, isa int) {
	if len(o) > 0 {
		C.memsh_box_muller_f32((*C.float)(&o[0]), (*C.double)(&u1[0]), (*C.double)(&u2[0]), C.int64_t(len(o)), C.int(isa))
	}
}

// boxMuller is randomValue's normal value from u1 and u2.
func boxMuller(u1, u2 float64) float64 {
	return math.Sqrt(-2*math.Log(u1)) * math.Cos(2*math.Pi*u2)
}

// randomF64s sets vals[k] to randomValue(seed, offset+k, Float64, normal)
// for every k, in bulk (see randomKernel).
func randomF64s(vals []float64, seed, offset uint64, normal bool) {
	if len(vals) > 0 {
		randomKernel(unsafe.Pointer(&vals[0]), Float64, len(vals), seed, offset, normal)
	}
}

// randintBlock is how many uniform values randintInt64s draws at a time
// into a buffer of its own (per goroutine).
const randintBlock = 4096

// randintInt64s sets o[i] = int64(float64(low) + floor(u × span)), u the
// float64 uniform value of generator offset offset+i (randomValue):
// Randint's values, computed in bulk without a per-element store
// function. It stops between chunks of interruptGrain values once stop
// (when not nil) is set, leaving o partly written.
func randintInt64s(stop *atomic.Bool, o []int64, seed, offset uint64, low int64, span float64) {
	lowf := float64(low)
	parallelForStop(stop, len(o), parallelThreshold, interruptGrain, func(lo, hi int) {
		buf := make([]float64, min(hi-lo, randintBlock))
		for i := lo; i < hi; i += randintBlock {
			u := buf[:min(randintBlock, hi-i)]
			randomF64s(u, seed, offset+uint64(i), false)
			dst := o[i : i+len(u)]
			for j, x := range u {
				dst[j] = int64(lowf + math.Floor(x*span))
			}
		}
	})
}
