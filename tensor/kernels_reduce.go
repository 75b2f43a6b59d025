package tensor

import (
	"runtime"
	"unsafe"
)

// Reductions: sum, mean, max, min over any set of dimensions. Floating
// inputs accumulate in float64, integer and bool inputs in int64; max and
// min propagate NaN (and report its index) as PyTorch does.

type reduceKind uint8

const (
	redSum reduceKind = iota
	redMean
	redMax
	redMin
)

// accum is a partial reduction.
type accum struct {
	f   float64
	i   int64
	idx int  // index of the max/min in the reduced range
	set bool // a max/min has been seen
	nan bool // a NaN has been seen (max/min of floats)
}

// sumRunF adds n elements of dtype dt at p (stride in bytes) in float64.
func sumRunF(p unsafe.Pointer, n, stride int, dt DType) float64 {
	return sumRunFFrom(0, p, n, stride, dt)
}

// sumRunFFrom is sumRunF continuing a strided (or short) run's sequential
// sum s, so that a run summed in pieces (to check for an interrupt
// between them) gives the same result as whole; a contiguous piece's sum
// is added to s.
func sumRunFFrom(s float64, p unsafe.Pointer, n, stride int, dt DType) float64 {
	switch {
	case (dt == Float32 || dt == Float64) && stride == dt.Size() && n >= simdMin:
		return s + sumSIMD(stride, p, n)
	case dt == Float32 && stride == 4:
		xs := unsafe.Slice((*float32)(p), n)
		var a0, a1, a2, a3 float64
		i := 0
		for ; i+4 <= n; i += 4 {
			a0 += float64(xs[i])
			a1 += float64(xs[i+1])
			a2 += float64(xs[i+2])
			a3 += float64(xs[i+3])
		}
		for ; i < n; i++ {
			a0 += float64(xs[i])
		}
		return s + ((a0 + a1) + (a2 + a3))
	case dt == Float64 && stride == 8:
		xs := unsafe.Slice((*float64)(p), n)
		var a0, a1 float64
		i := 0
		for ; i+2 <= n; i += 2 {
			a0 += xs[i]
			a1 += xs[i+1]
		}
		if i < n {
			a0 += xs[i]
		}
		return s + (a0 + a1)
	}
	load := loadF64[dt]
	for range n {
		s += load(p)
		p = unsafe.Add(p, stride)
	}
	return s
}

// reducePiece bounds the elements of one run a reduction handles between
// two checks of the interrupt flag. A contiguous float run longer than it
// is summed piece by piece (the pieces' sums added in order); strided runs
// continue one sequential sum, so their results do not change.
const reducePiece = 1 << 24

func sumRunI(p unsafe.Pointer, n, stride int, dt DType) int64 {
	load := loadI64[dt]
	var s int64
	for range n {
		s += load(p)
		p = unsafe.Add(p, stride)
	}
	return s
}

// extremeRun folds n elements into a (max if isMax, else min); pos is the
// reduced index of the first element.
func extremeRun(a *accum, p unsafe.Pointer, n, stride int, dt DType, isMax bool, pos int) {
	if dt.IsFloat() {
		load := loadF64[dt]
		for j := range n {
			if a.nan {
				return
			}
			v := load(p)
			switch {
			case v != v:
				a.f, a.idx, a.nan, a.set = v, pos+j, true, true
			case !a.set || (isMax && v > a.f) || (!isMax && v < a.f):
				a.f, a.idx, a.set = v, pos+j, true
			}
			p = unsafe.Add(p, stride)
		}
		return
	}
	load := loadI64[dt]
	for j := range n {
		v := load(p)
		if !a.set || (isMax && v > a.i) || (!isMax && v < a.i) {
			a.i, a.idx, a.set = v, pos+j, true
		}
		p = unsafe.Add(p, stride)
	}
}

// combine merges partial b (from a later range) into a.
func (a *accum) combine(b accum, kind reduceKind, float bool) {
	switch kind {
	case redSum, redMean:
		a.f += b.f
		a.i += b.i
		return
	}
	if a.nan || !b.set {
		return
	}
	isMax := kind == redMax
	switch {
	case b.nan, !a.set:
		*a = b
	case float && ((isMax && b.f > a.f) || (!isMax && b.f < a.f)):
		*a = b
	case !float && ((isMax && b.i > a.i) || (!isMax && b.i < a.i)):
		*a = b
	}
}

// reduceKernel reduces in over the dimensions marked in red, writing one
// value per kept position (row-major over the kept dimensions) at outP as
// outDT and, for max/min when idxP is not nil, the int64 index there.
func reduceKernel(kind reduceKind, in *Tensor, red []bool, outP unsafe.Pointer, outDT DType, idxP unsafe.Pointer) {
	var oShape, oSt, iShape, iSt []int
	for d, s := range in.shape {
		if red[d] {
			iShape, iSt = append(iShape, s), append(iSt, in.strides[d])
		} else {
			oShape, oSt = append(oShape, s), append(oSt, in.strides[d])
		}
	}
	nOut, nIn := numel(oShape), numel(iShape)
	isFloat := in.dtype.IsFloat()
	size := in.dtype.Size()
	inner := newElemIter(iShape, strided{base: in.mem.Pointer(), size: size, st: iSt})
	// The flag is checked between outputs (each output's sum keeps its
	// order of summation, so results do not depend on the chunking).
	stop := in.ctx.stopFlag()
	stride := inner.inner[0]

	reduceRange := func(sc *iterScratch, base []int, lo, hi int) accum {
		var a accum
		pos := lo
		inner.runRangeWith(sc, base, lo, hi, func(p []unsafe.Pointer, n int) {
			q := p[0]
			var runF float64
			for n > 0 {
				m := min(n, reducePiece)
				switch kind {
				case redSum, redMean:
					if isFloat {
						runF = sumRunFFrom(runF, q, m, stride, in.dtype)
					} else {
						a.i += sumRunI(q, m, stride, in.dtype)
					}
				default:
					extremeRun(&a, q, m, stride, in.dtype, kind == redMax, pos)
				}
				pos += m
				n -= m
				q = unsafe.Add(q, m*stride)
				if n > 0 && stop != nil && stop.Load() {
					break
				}
			}
			a.f += runF
		})
		return a
	}
	offsetOf := func(o int) int {
		off := in.offset
		for d := len(oShape) - 1; d >= 0; d-- {
			off += (o % oShape[d]) * oSt[d]
			o /= oShape[d]
		}
		return off
	}
	outSize := outDT.Size()
	store := func(o int, a accum) {
		q := elemAddr(outP, o, outSize)
		switch {
		case kind == redMean && isFloat:
			storeF64[outDT](q, a.f/float64(nIn))
		case kind == redMean:
			storeF64[outDT](q, float64(a.i)/float64(nIn))
		case isFloat:
			storeF64[outDT](q, a.f)
		default:
			storeI64[outDT](q, a.i)
		}
		if idxP != nil {
			st(elemAddr(idxP, o, 8), int64(a.idx))
		}
	}
	total := nOut * nIn
	p := runtime.GOMAXPROCS(0)
	if nOut >= p || total < parallelThreshold {
		thr := nOut + 1
		if total >= parallelThreshold {
			thr = 1
		}
		parallelFor(nOut, thr, func(lo, hi int) {
			sc := inner.scratch()
			sc.stop = stop
			base := []int{0}
			for o := lo; o < hi; o++ {
				if stop != nil && stop.Load() {
					return
				}
				base[0] = offsetOf(o)
				store(o, reduceRange(sc, base, 0, nIn))
			}
		})
		return
	}
	// Few outputs, many inputs each: split each reduction.
	for o := range nOut {
		if stop != nil && stop.Load() {
			return
		}
		base := []int{offsetOf(o)}
		chunks := make([]accum, p)
		size := (nIn + p - 1) / p
		parallelFor(p, 1, func(lo, hi int) {
			for c := lo; c < hi; c++ {
				clo, chi := c*size, min((c+1)*size, nIn)
				sc := inner.scratch()
				sc.stop = stop
				chunks[c] = reduceRange(sc, base, clo, chi)
			}
		})
		a := chunks[0]
		for _, b := range chunks[1:] {
			a.combine(b, kind, in.dtype.IsFloat())
		}
		store(o, a)
	}
}
