package tensor

import (
	"math"
	"math/bits"
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
		return math.Sqrt(-2*math.Log(u1)) * math.Cos(2*math.Pi*u2)
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

// randomKernel fills n contiguous elements of dtype dt at p with the
// values of generator offsets offset, offset+1, ...
func randomKernel(p unsafe.Pointer, dt DType, n int, seed, offset uint64, normal bool) {
	store, size := storeF64[dt], dt.Size()
	parallelFor(n, parallelThreshold/8, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			store(elemAddr(p, i, size), randomValue(seed, offset+uint64(i), dt, normal))
		}
	})
}
