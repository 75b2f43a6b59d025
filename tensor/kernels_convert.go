package tensor

import (
	"math"
	"unsafe"
)

// Element conversions. float16 and bfloat16 values are computed in float32
// and rounded to nearest, ties to even, when stored, as PyTorch does on the
// CPU. A float64 value stored into a half type goes through float32 first
// (as c10::Half's constructor does).

// f32ToF16 rounds f to the nearest IEEE binary16 value (ties to even).
func f32ToF16(f float32) uint16 {
	b := math.Float32bits(f)
	sign := uint16(b>>16) & 0x8000
	exp := int(b>>23) & 0xff
	mant := b & 0x7fffff
	if exp == 0xff { // Inf or NaN
		if mant != 0 {
			return sign | 0x7e00
		}
		return sign | 0x7c00
	}
	e := exp - 127 + 15
	if e >= 0x1f {
		return sign | 0x7c00 // overflow: infinity
	}
	if e <= 0 { // subnormal half (or zero)
		if e < -10 {
			return sign
		}
		mant |= 0x800000
		shift := uint(14 - e)
		h := mant >> shift
		rem := mant & (1<<shift - 1)
		halfway := uint32(1) << (shift - 1)
		if rem > halfway || (rem == halfway && h&1 == 1) {
			h++
		}
		return sign | uint16(h)
	}
	h := uint32(e)<<10 | mant>>13
	rem := mant & 0x1fff
	if rem > 0x1000 || (rem == 0x1000 && h&1 == 1) {
		h++ // a carry into the exponent is right, up to infinity
	}
	return sign | uint16(h)
}

// f16ToF32 widens an IEEE binary16 value exactly.
func f16ToF32(h uint16) float32 {
	sign := uint32(h&0x8000) << 16
	exp := uint32(h>>10) & 0x1f
	mant := uint32(h & 0x3ff)
	switch exp {
	case 0x1f:
		return math.Float32frombits(sign | 0x7f800000 | mant<<13)
	case 0:
		f := float32(mant) * (1.0 / (1 << 24))
		if sign != 0 {
			f = -f
		}
		return f
	}
	return math.Float32frombits(sign | (exp+112)<<23 | mant<<13)
}

// f32ToBF16 rounds f to the nearest bfloat16 value (ties to even).
func f32ToBF16(f float32) uint16 {
	b := math.Float32bits(f)
	if f != f {
		return uint16(b>>16) | 0x40 // quiet NaN
	}
	return uint16((b + 0x7fff + (b>>16)&1) >> 16)
}

// bf16ToF32 widens a bfloat16 value exactly.
func bf16ToF32(h uint16) float32 { return math.Float32frombits(uint32(h) << 16) }

// roundF32 rounds a float32 value to dtype d's precision (identity unless d
// is a half type).
func roundF32(d DType, v float32) float32 {
	switch d {
	case Float16:
		return f16ToF32(f32ToF16(v))
	case BFloat16:
		return bf16ToF32(f32ToBF16(v))
	}
	return v
}

// Typed element access at an address.

func ld[T any](p unsafe.Pointer) T    { return *(*T)(p) }
func st[T any](p unsafe.Pointer, v T) { *(*T)(p) = v }

// elemAddr is the address of element off (in elements) of storage base.
func elemAddr(base unsafe.Pointer, off int, size int) unsafe.Pointer {
	return unsafe.Add(base, off*size)
}

type (
	loadF64Fn  func(unsafe.Pointer) float64
	loadF32Fn  func(unsafe.Pointer) float32
	loadI64Fn  func(unsafe.Pointer) int64
	storeF64Fn func(unsafe.Pointer, float64)
	storeF32Fn func(unsafe.Pointer, float32)
	storeI64Fn func(unsafe.Pointer, int64)
)

func b2i(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

var loadF64 = [numDTypes]loadF64Fn{
	Bool:     func(p unsafe.Pointer) float64 { return float64(ld[uint8](p)) },
	Uint8:    func(p unsafe.Pointer) float64 { return float64(ld[uint8](p)) },
	Int8:     func(p unsafe.Pointer) float64 { return float64(ld[int8](p)) },
	Int16:    func(p unsafe.Pointer) float64 { return float64(ld[int16](p)) },
	Int32:    func(p unsafe.Pointer) float64 { return float64(ld[int32](p)) },
	Int64:    func(p unsafe.Pointer) float64 { return float64(ld[int64](p)) },
	Float16:  func(p unsafe.Pointer) float64 { return float64(f16ToF32(ld[uint16](p))) },
	BFloat16: func(p unsafe.Pointer) float64 { return float64(bf16ToF32(ld[uint16](p))) },
	Float32:  func(p unsafe.Pointer) float64 { return float64(ld[float32](p)) },
	Float64:  func(p unsafe.Pointer) float64 { return ld[float64](p) },
}

var loadF32 = [numDTypes]loadF32Fn{
	Bool:     func(p unsafe.Pointer) float32 { return float32(ld[uint8](p)) },
	Uint8:    func(p unsafe.Pointer) float32 { return float32(ld[uint8](p)) },
	Int8:     func(p unsafe.Pointer) float32 { return float32(ld[int8](p)) },
	Int16:    func(p unsafe.Pointer) float32 { return float32(ld[int16](p)) },
	Int32:    func(p unsafe.Pointer) float32 { return float32(ld[int32](p)) },
	Int64:    func(p unsafe.Pointer) float32 { return float32(ld[int64](p)) },
	Float16:  func(p unsafe.Pointer) float32 { return f16ToF32(ld[uint16](p)) },
	BFloat16: func(p unsafe.Pointer) float32 { return bf16ToF32(ld[uint16](p)) },
	Float32:  func(p unsafe.Pointer) float32 { return ld[float32](p) },
	Float64:  func(p unsafe.Pointer) float32 { return float32(ld[float64](p)) },
}

var loadI64 = [numDTypes]loadI64Fn{
	Bool:     func(p unsafe.Pointer) int64 { return int64(ld[uint8](p)) },
	Uint8:    func(p unsafe.Pointer) int64 { return int64(ld[uint8](p)) },
	Int8:     func(p unsafe.Pointer) int64 { return int64(ld[int8](p)) },
	Int16:    func(p unsafe.Pointer) int64 { return int64(ld[int16](p)) },
	Int32:    func(p unsafe.Pointer) int64 { return int64(ld[int32](p)) },
	Int64:    func(p unsafe.Pointer) int64 { return ld[int64](p) },
	Float16:  func(p unsafe.Pointer) int64 { return int64(f16ToF32(ld[uint16](p))) },
	BFloat16: func(p unsafe.Pointer) int64 { return int64(bf16ToF32(ld[uint16](p))) },
	Float32:  func(p unsafe.Pointer) int64 { return int64(ld[float32](p)) },
	Float64:  func(p unsafe.Pointer) int64 { return int64(ld[float64](p)) },
}

// loadBool is the truth of an element (nonzero; NaN is true).
var loadBool = [numDTypes]func(unsafe.Pointer) bool{
	Bool:     func(p unsafe.Pointer) bool { return ld[uint8](p) != 0 },
	Uint8:    func(p unsafe.Pointer) bool { return ld[uint8](p) != 0 },
	Int8:     func(p unsafe.Pointer) bool { return ld[int8](p) != 0 },
	Int16:    func(p unsafe.Pointer) bool { return ld[int16](p) != 0 },
	Int32:    func(p unsafe.Pointer) bool { return ld[int32](p) != 0 },
	Int64:    func(p unsafe.Pointer) bool { return ld[int64](p) != 0 },
	Float16:  func(p unsafe.Pointer) bool { return ld[uint16](p)&0x7fff != 0 },
	BFloat16: func(p unsafe.Pointer) bool { return ld[uint16](p)&0x7fff != 0 },
	Float32:  func(p unsafe.Pointer) bool { return ld[float32](p) != 0 },
	Float64:  func(p unsafe.Pointer) bool { return ld[float64](p) != 0 },
}

var storeF64 = [numDTypes]storeF64Fn{
	Bool:     func(p unsafe.Pointer, v float64) { st(p, uint8(b2i(v != 0))) },
	Uint8:    func(p unsafe.Pointer, v float64) { st(p, uint8(int64(v))) },
	Int8:     func(p unsafe.Pointer, v float64) { st(p, int8(int64(v))) },
	Int16:    func(p unsafe.Pointer, v float64) { st(p, int16(int64(v))) },
	Int32:    func(p unsafe.Pointer, v float64) { st(p, int32(int64(v))) },
	Int64:    func(p unsafe.Pointer, v float64) { st(p, int64(v)) },
	Float16:  func(p unsafe.Pointer, v float64) { st(p, f32ToF16(float32(v))) },
	BFloat16: func(p unsafe.Pointer, v float64) { st(p, f32ToBF16(float32(v))) },
	Float32:  func(p unsafe.Pointer, v float64) { st(p, float32(v)) },
	Float64:  func(p unsafe.Pointer, v float64) { st(p, v) },
}

var storeF32 = [numDTypes]storeF32Fn{
	Bool:     func(p unsafe.Pointer, v float32) { st(p, uint8(b2i(v != 0))) },
	Uint8:    func(p unsafe.Pointer, v float32) { st(p, uint8(int64(v))) },
	Int8:     func(p unsafe.Pointer, v float32) { st(p, int8(int64(v))) },
	Int16:    func(p unsafe.Pointer, v float32) { st(p, int16(int64(v))) },
	Int32:    func(p unsafe.Pointer, v float32) { st(p, int32(int64(v))) },
	Int64:    func(p unsafe.Pointer, v float32) { st(p, int64(v)) },
	Float16:  func(p unsafe.Pointer, v float32) { st(p, f32ToF16(v)) },
	BFloat16: func(p unsafe.Pointer, v float32) { st(p, f32ToBF16(v)) },
	Float32:  func(p unsafe.Pointer, v float32) { st(p, v) },
	Float64:  func(p unsafe.Pointer, v float32) { st(p, float64(v)) },
}

var storeI64 = [numDTypes]storeI64Fn{
	Bool:     func(p unsafe.Pointer, v int64) { st(p, uint8(b2i(v != 0))) },
	Uint8:    func(p unsafe.Pointer, v int64) { st(p, uint8(v)) },
	Int8:     func(p unsafe.Pointer, v int64) { st(p, int8(v)) },
	Int16:    func(p unsafe.Pointer, v int64) { st(p, int16(v)) },
	Int32:    func(p unsafe.Pointer, v int64) { st(p, int32(v)) },
	Int64:    func(p unsafe.Pointer, v int64) { st(p, v) },
	Float16:  func(p unsafe.Pointer, v int64) { st(p, f32ToF16(float32(v))) },
	BFloat16: func(p unsafe.Pointer, v int64) { st(p, f32ToBF16(float32(v))) },
	Float32:  func(p unsafe.Pointer, v int64) { st(p, float32(v)) },
	Float64:  func(p unsafe.Pointer, v int64) { st(p, float64(v)) },
}

// computeKind is the arithmetic a dtype's values are computed in.
type computeKind int

const (
	kindI64 computeKind = iota // bool and integer types
	kindF32                    // float32, float16, bfloat16 (PyTorch's opmath type)
	kindF64                    // float64
)

func kindOf(d DType) computeKind {
	switch d {
	case Float64:
		return kindF64
	case Float32, Float16, BFloat16:
		return kindF32
	}
	return kindI64
}

// loaderF32 returns a loader that converts an element of dtype src to the
// common dtype common (rounding to a half type's precision when common is
// one) and widens it to float32.
func loaderF32(src, common DType) loadF32Fn {
	f := loadF32[src]
	if (common == Float16 || common == BFloat16) && src != common {
		return func(p unsafe.Pointer) float32 { return roundF32(common, f(p)) }
	}
	return f
}
