package tensor

import (
	"math"
	"sync/atomic"
	"unsafe"
)

// BinaryOp is an elementwise binary operation.
type BinaryOp uint8

const (
	OpAdd BinaryOp = iota
	OpSub
	OpMul
	OpDiv
	OpFloorDivide
	OpRemainder
)

type floatT interface{ float32 | float64 }

// opFloat applies op in T's arithmetic, with PyTorch's (and Python's)
// floor division and remainder.
func opFloat[T floatT](op BinaryOp, x, y T) T {
	switch op {
	case OpAdd:
		return x + y
	case OpSub:
		return x - y
	case OpMul:
		return x * y
	case OpDiv:
		return x / y
	case OpFloorDivide:
		if y == 0 {
			return x / y
		}
		mod := T(math.Mod(float64(x), float64(y)))
		div := (x - mod) / y
		if mod != 0 && (y < 0) != (mod < 0) {
			div--
		}
		if div == 0 {
			return T(math.Copysign(0, float64(x/y)))
		}
		fl := T(math.Floor(float64(div)))
		if div-fl > 0.5 {
			fl++
		}
		return fl
	case OpRemainder:
		mod := T(math.Mod(float64(x), float64(y)))
		if mod != 0 && (y < 0) != (mod < 0) {
			mod += y
		}
		return mod
	}
	panic("bad op")
}

// opInt applies op in int64 arithmetic; division by zero in // and % sets
// *divZero. OpDiv never reaches here (true division is floating point).
func opInt(op BinaryOp, x, y int64, divZero *atomic.Bool) int64 {
	switch op {
	case OpAdd:
		return x + y
	case OpSub:
		return x - y
	case OpMul:
		return x * y
	case OpFloorDivide, OpRemainder:
		if y == 0 {
			divZero.Store(true)
			return 0
		}
		q, r := x/y, x%y
		if r != 0 && (r < 0) != (y < 0) {
			q--
			r += y
		}
		if op == OpRemainder {
			return r
		}
		return q
	}
	panic("bad op")
}

// binFloat is the same-dtype float32/float64 loop over one run, with tight
// loops for contiguous and broadcast-scalar operands. Strides are in bytes.
func binFloat[T floatT](op BinaryOp, n int, o unsafe.Pointer, so int, a unsafe.Pointer, sa int, b unsafe.Pointer, sb int, stream bool) {
	sz := int(unsafe.Sizeof(T(0)))
	if so == sz && op <= OpDiv && n >= simdMin {
		if m := simdMode(sz, sa, sb); m >= 0 {
			binarySIMD(sz, op, m, o, a, b, n, stream)
			return
		}
	}
	if so == sz && op <= OpDiv {
		os := unsafe.Slice((*T)(o), n)
		switch {
		case sa == sz && sb == sz:
			as, bs := unsafe.Slice((*T)(a), n), unsafe.Slice((*T)(b), n)
			switch op {
			case OpAdd:
				for i := range os {
					os[i] = as[i] + bs[i]
				}
			case OpSub:
				for i := range os {
					os[i] = as[i] - bs[i]
				}
			case OpMul:
				for i := range os {
					os[i] = as[i] * bs[i]
				}
			case OpDiv:
				for i := range os {
					os[i] = as[i] / bs[i]
				}
			}
			return
		case sa == sz && sb == 0:
			as, bv := unsafe.Slice((*T)(a), n), *(*T)(b)
			switch op {
			case OpAdd:
				for i := range os {
					os[i] = as[i] + bv
				}
			case OpSub:
				for i := range os {
					os[i] = as[i] - bv
				}
			case OpMul:
				for i := range os {
					os[i] = as[i] * bv
				}
			case OpDiv:
				for i := range os {
					os[i] = as[i] / bv
				}
			}
			return
		case sa == 0 && sb == sz:
			av, bs := *(*T)(a), unsafe.Slice((*T)(b), n)
			switch op {
			case OpAdd:
				for i := range os {
					os[i] = av + bs[i]
				}
			case OpSub:
				for i := range os {
					os[i] = av - bs[i]
				}
			case OpMul:
				for i := range os {
					os[i] = av * bs[i]
				}
			case OpDiv:
				for i := range os {
					os[i] = av / bs[i]
				}
			}
			return
		}
	}
	for range n {
		*(*T)(o) = opFloat(op, *(*T)(a), *(*T)(b))
		o, a, b = unsafe.Add(o, so), unsafe.Add(a, sa), unsafe.Add(b, sb)
	}
}

// binArg is one input of binaryKernel: a strided operand (a tensor, or a
// number stored in compute precision with all strides 0) and its dtype.
type binArg struct {
	s      strided
	dt     DType
	number bool // a Starlark number: converted to the compute type only, never rounded to a half common dtype
}

// numberArg stores a number in the compute type of common as a stride-0
// operand over ndim dimensions.
func numberArg(o operand, common DType, ndim int) binArg {
	var p unsafe.Pointer
	var dt DType
	switch kindOf(common) {
	case kindF32:
		v := float32(o.f)
		p, dt = unsafe.Pointer(&v), Float32
	case kindF64:
		v := o.f
		p, dt = unsafe.Pointer(&v), Float64
	default:
		v := o.i
		p, dt = unsafe.Pointer(&v), Int64
	}
	return binArg{s: strided{base: p, size: dt.Size(), st: make([]int, ndim)}, dt: dt, number: true}
}

// binaryKernel computes out = a op b over shape, in the arithmetic of the
// common dtype, storing into out's dtype. It reports an integer division
// by zero.
func binaryKernel(op BinaryOp, out strided, outDT DType, a, b binArg, common DType, shape []int) (divZero bool) {
	it := newElemIter(shape, out, a.s, b.s)
	so, sa, sb := it.inner[0], it.inner[1], it.inner[2]
	var dz atomic.Bool
	traffic := it.n * outDT.Size()
	for _, x := range []binArg{a, b} {
		if !x.number {
			traffic += it.n * x.dt.Size()
		}
	}
	stream := traffic > streamBytes()
	switch kindOf(common) {
	case kindF32:
		if outDT == Float32 && a.dt == Float32 && b.dt == Float32 {
			it.run(func(p []unsafe.Pointer, n int) { binFloat[float32](op, n, p[0], so, p[1], sa, p[2], sb, stream) })
			break
		}
		la, lb := loadF32[a.dt], loadF32[b.dt]
		if !a.number {
			la = loaderF32(a.dt, common)
		}
		if !b.number {
			lb = loaderF32(b.dt, common)
		}
		store := storeF32[outDT]
		it.run(func(p []unsafe.Pointer, n int) {
			o, x, y := p[0], p[1], p[2]
			for range n {
				store(o, opFloat(op, la(x), lb(y)))
				o, x, y = unsafe.Add(o, so), unsafe.Add(x, sa), unsafe.Add(y, sb)
			}
		})
	case kindF64:
		if outDT == Float64 && a.dt == Float64 && b.dt == Float64 {
			it.run(func(p []unsafe.Pointer, n int) { binFloat[float64](op, n, p[0], so, p[1], sa, p[2], sb, stream) })
			break
		}
		la, lb, store := loadF64[a.dt], loadF64[b.dt], storeF64[outDT]
		it.run(func(p []unsafe.Pointer, n int) {
			o, x, y := p[0], p[1], p[2]
			for range n {
				store(o, opFloat(op, la(x), lb(y)))
				o, x, y = unsafe.Add(o, so), unsafe.Add(x, sa), unsafe.Add(y, sb)
			}
		})
	default:
		la, lb, store := loadI64[a.dt], loadI64[b.dt], storeI64[outDT]
		it.run(func(p []unsafe.Pointer, n int) {
			o, x, y := p[0], p[1], p[2]
			for range n {
				store(o, opInt(op, la(x), lb(y), &dz))
				o, x, y = unsafe.Add(o, so), unsafe.Add(x, sa), unsafe.Add(y, sb)
			}
		})
	}
	return dz.Load()
}

// UnaryOp is an elementwise unary operation.
type UnaryOp uint8

const (
	OpNeg UnaryOp = iota
	OpAbs
	OpRelu
	OpExp
	OpLog
	OpSqrt
	OpTanh
	OpSigmoid
)

// floatOnly reports whether op needs floating point (integer inputs give
// a float32 result, as in PyTorch).
func (op UnaryOp) floatOnly() bool { return op >= OpExp }

func unaryFloat[T floatT](op UnaryOp, x T) T {
	switch op {
	case OpNeg:
		return -x
	case OpAbs:
		if x < 0 {
			return -x
		}
		return x + 0 // -0 becomes +0
	case OpRelu:
		if x > 0 || x != x {
			return x
		}
		return 0
	case OpExp:
		return T(math.Exp(float64(x)))
	case OpLog:
		return T(math.Log(float64(x)))
	case OpSqrt:
		return T(math.Sqrt(float64(x)))
	case OpTanh:
		return T(math.Tanh(float64(x)))
	case OpSigmoid:
		return T(1 / (1 + math.Exp(-float64(x))))
	}
	panic("bad op")
}

func unaryInt(op UnaryOp, x int64) int64 {
	switch op {
	case OpNeg:
		return -x
	case OpAbs:
		if x < 0 {
			return -x
		}
		return x
	case OpRelu:
		return max(x, 0)
	}
	panic("bad op")
}

// unaryKernel computes out = op(in) over shape in the arithmetic of outDT.
func unaryKernel(op UnaryOp, out strided, outDT DType, in strided, inDT DType, shape []int) {
	it := newElemIter(shape, out, in)
	so, si := it.inner[0], it.inner[1]
	switch kindOf(outDT) {
	case kindF32:
		if code := mathOp(op); code >= 0 {
			unaryMathKernel(code, it, outDT, inDT)
			return
		}
		if outDT == Float32 && inDT == Float32 && so == 4 && si == 4 {
			it.run(func(p []unsafe.Pointer, n int) {
				os, is := unsafe.Slice((*float32)(p[0]), n), unsafe.Slice((*float32)(p[1]), n)
				switch op {
				case OpNeg:
					for i := range os {
						os[i] = -is[i]
					}
				case OpRelu:
					for i, v := range is {
						if !(v > 0 || v != v) {
							v = 0
						}
						os[i] = v
					}
				default:
					for i, v := range is {
						os[i] = unaryFloat(op, v)
					}
				}
			})
			return
		}
		load, store := loaderF32(inDT, outDT), storeF32[outDT]
		it.run(func(p []unsafe.Pointer, n int) {
			o, x := p[0], p[1]
			for range n {
				store(o, unaryFloat(op, load(x)))
				o, x = unsafe.Add(o, so), unsafe.Add(x, si)
			}
		})
	case kindF64:
		load, store := loadF64[inDT], storeF64[outDT]
		it.run(func(p []unsafe.Pointer, n int) {
			o, x := p[0], p[1]
			for range n {
				store(o, unaryFloat(op, load(x)))
				o, x = unsafe.Add(o, so), unsafe.Add(x, si)
			}
		})
	default:
		load, store := loadI64[inDT], storeI64[outDT]
		it.run(func(p []unsafe.Pointer, n int) {
			o, x := p[0], p[1]
			for range n {
				store(o, unaryInt(op, load(x)))
				o, x = unsafe.Add(o, so), unsafe.Add(x, si)
			}
		})
	}
}

// copyKernel copies src into dst over shape, converting dtypes as
// PyTorch's static casts do (float to integer truncates; to bool is != 0).
func copyKernel(dst strided, dstDT DType, src strided, srcDT DType, shape []int) {
	it := newElemIter(shape, dst, src)
	sd, ss := it.inner[0], it.inner[1]
	if dstDT == srcDT {
		size := dstDT.Size()
		if copyTiled(it, size) {
			return
		}
		it.run(func(p []unsafe.Pointer, n int) {
			if sd == size && ss == size {
				copy(unsafe.Slice((*byte)(p[0]), n*size), unsafe.Slice((*byte)(p[1]), n*size))
				return
			}
			o, x := p[0], p[1]
			switch size {
			case 1:
				for range n {
					st(o, ld[uint8](x))
					o, x = unsafe.Add(o, sd), unsafe.Add(x, ss)
				}
			case 2:
				for range n {
					st(o, ld[uint16](x))
					o, x = unsafe.Add(o, sd), unsafe.Add(x, ss)
				}
			case 4:
				for range n {
					st(o, ld[uint32](x))
					o, x = unsafe.Add(o, sd), unsafe.Add(x, ss)
				}
			default:
				for range n {
					st(o, ld[uint64](x))
					o, x = unsafe.Add(o, sd), unsafe.Add(x, ss)
				}
			}
		})
		return
	}
	switch {
	case dstDT == Bool:
		load := loadBool[srcDT]
		it.run(func(p []unsafe.Pointer, n int) {
			o, x := p[0], p[1]
			for range n {
				st(o, uint8(b2i(load(x))))
				o, x = unsafe.Add(o, sd), unsafe.Add(x, ss)
			}
		})
	case dstDT.IsFloat():
		load, store := loadF64[srcDT], storeF64[dstDT]
		if srcDT == Float32 || srcDT == Float16 || srcDT == BFloat16 {
			l32 := loadF32[srcDT]
			s32 := storeF32[dstDT]
			it.run(func(p []unsafe.Pointer, n int) {
				o, x := p[0], p[1]
				for range n {
					s32(o, l32(x))
					o, x = unsafe.Add(o, sd), unsafe.Add(x, ss)
				}
			})
			return
		}
		it.run(func(p []unsafe.Pointer, n int) {
			o, x := p[0], p[1]
			for range n {
				store(o, load(x))
				o, x = unsafe.Add(o, sd), unsafe.Add(x, ss)
			}
		})
	default:
		load, store := loadI64[srcDT], storeI64[dstDT]
		it.run(func(p []unsafe.Pointer, n int) {
			o, x := p[0], p[1]
			for range n {
				store(o, load(x))
				o, x = unsafe.Add(o, sd), unsafe.Add(x, ss)
			}
		})
	}
}

// fillKernel stores one value (already encoded in dt's bytes in pattern)
// into every element of dst over shape.
func fillKernel(dst strided, dt DType, pattern uint64, shape []int) {
	it := newElemIter(shape, dst)
	sd := it.inner[0]
	size := dt.Size()
	it.run(func(p []unsafe.Pointer, n int) {
		o := p[0]
		if sd == size && pattern == 0 {
			clear(unsafe.Slice((*byte)(o), n*size))
			return
		}
		switch size {
		case 1:
			if sd == 1 {
				s := unsafe.Slice((*byte)(o), n)
				for i := range s {
					s[i] = byte(pattern)
				}
				return
			}
			for range n {
				st(o, uint8(pattern))
				o = unsafe.Add(o, sd)
			}
		case 2:
			for range n {
				st(o, uint16(pattern))
				o = unsafe.Add(o, sd)
			}
		case 4:
			if sd == 4 && n >= simdMin {
				fill32SIMD(o, uint32(pattern), n)
				return
			}
			if sd == 4 {
				s := unsafe.Slice((*uint32)(o), n)
				for i := range s {
					s[i] = uint32(pattern)
				}
				return
			}
			for range n {
				st(o, uint32(pattern))
				o = unsafe.Add(o, sd)
			}
		default:
			for range n {
				st(o, pattern)
				o = unsafe.Add(o, sd)
			}
		}
	})
}

// encodeValue returns the bytes (little-endian in a uint64) of the number v
// stored as dtype dt: a float is stored with storeF64, an int with
// storeI64, so conversions match the kernels'.
func encodeValue(dt DType, o operand) uint64 {
	var buf uint64
	p := unsafe.Pointer(&buf)
	if o.dt.IsFloat() {
		storeF64[dt](p, o.f)
	} else {
		storeI64[dt](p, o.i)
	}
	return buf
}
