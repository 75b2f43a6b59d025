package tensor

import (
	"runtime"
	"sync"
	"sync/atomic"
	"unsafe"
)

// The CPU kernels. They serve "cpu" tensors and the simulated GPU alike
// (its memory is host-accessible); they read and write device memory through
// raw addresses and never allocate tensor data themselves.
//
// An elementwise kernel describes each operand by a strided layout over a
// common iteration shape (broadcast operands have stride 0), coalesces
// dimensions that are contiguous for every operand, and calls a body for
// each run along the innermost dimension. Work above parallelThreshold
// elements is split over runtime.GOMAXPROCS goroutines by linear element
// ranges, so results do not depend on the number of goroutines.

// parallelThreshold is the element count above which kernels split work
// across goroutines.
const parallelThreshold = 1 << 16

// parallelFor calls body over [0, n) split into ranges, in parallel when n
// is at least threshold and more than one CPU is available.
func parallelFor(n, threshold int, body func(lo, hi int)) {
	p := runtime.GOMAXPROCS(0)
	if n < threshold || p == 1 || n < 2 {
		body(0, n)
		return
	}
	chunks := min(p, n)
	size := (n + chunks - 1) / chunks
	var wg sync.WaitGroup
	for lo := 0; lo < n; lo += size {
		hi := min(lo+size, n)
		wg.Go(func() { body(lo, hi) })
	}
	wg.Wait()
}

// interruptGrain is the number of elements an interruptible kernel
// processes between two checks of its Context's interrupt flag (see
// Context.Interrupt): about a millisecond of work, so Ctrl-C stops a
// kernel within milliseconds at no measurable cost.
const interruptGrain = 1 << 20

// stopGrain is parallelForStop's grain for items of work elements each
// (rows, planes, heads): about interruptGrain elements between checks.
func stopGrain(work int) int { return max(1, interruptGrain/max(work, 1)) }

// parallelForStop is parallelFor for a body that may be called on any
// split of [0, n) with the same results (elementwise work): each
// goroutine's range runs in chunks of grain, and no chunk starts once stop
// (when not nil) is set. The ranges given to the goroutines are
// parallelFor's, so results do not change.
func parallelForStop(stop *atomic.Bool, n, threshold, grain int, body func(lo, hi int)) {
	if stop == nil || n <= grain {
		if stop == nil || !stop.Load() {
			parallelFor(n, threshold, body)
		}
		return
	}
	parallelFor(n, threshold, func(lo, hi int) {
		for c := lo; c < hi; c += grain {
			if stop.Load() {
				return
			}
			body(c, min(c+grain, hi))
		}
	})
}

// strided is one operand of an elementwise iteration.
type strided struct {
	base unsafe.Pointer // storage address of element 0
	size int            // bytes per element
	off  int            // offset of the first element, in elements
	st   []int          // strides over the iteration shape, in elements
	stop *atomic.Bool   // the interrupt flag of the tensor's Context, or nil
}

// layoutOf returns t's layout broadcast to shape (which must be a broadcast
// of t.shape), with base the address of t's storage.
func layoutOf(t *Tensor, shape []int) strided {
	return strided{base: t.mem.Pointer(), size: t.dtype.Size(), off: t.offset, st: broadcastStrides(t, shape), stop: t.ctx.stopFlag()}
}

// broadcastStrides returns t's strides aligned to shape, with stride 0 for
// broadcast dimensions.
func broadcastStrides(t *Tensor, shape []int) []int {
	st := make([]int, len(shape))
	k := len(shape) - len(t.shape)
	for d := range t.shape {
		if t.shape[d] != 1 || shape[k+d] == 1 {
			st[k+d] = t.strides[d]
		}
	}
	return st
}

// elemIter iterates several operands over one shape.
type elemIter struct {
	shape []int
	ops   []strided
	inner []int        // innermost stride of each operand, in bytes
	n     int          // number of elements
	stop  *atomic.Bool // an operand's interrupt flag: run stops between chunks when it is set
}

// newElemIter builds an iteration over shape, coalescing dimensions.
func newElemIter(shape []int, ops ...strided) *elemIter {
	n := 1
	for _, s := range shape {
		n *= s
	}
	it := &elemIter{n: n, ops: make([]strided, len(ops))}
	for _, o := range ops {
		if o.stop != nil {
			it.stop = o.stop
			break
		}
	}
	// Coalesce: drop size-1 dims, merge dims contiguous for every operand.
	var sh []int
	sts := make([][]int, len(ops))
	for d, s := range shape {
		if s == 1 {
			continue
		}
		if len(sh) > 0 {
			last := len(sh) - 1
			ok := true
			for k := range ops {
				if sts[k][last] != ops[k].st[d]*s {
					ok = false
					break
				}
			}
			if ok {
				sh[last] *= s
				for k := range ops {
					sts[k][last] = ops[k].st[d]
				}
				continue
			}
		}
		sh = append(sh, s)
		for k := range ops {
			sts[k] = append(sts[k], ops[k].st[d])
		}
	}
	if len(sh) == 0 {
		sh = []int{1}
		for k := range ops {
			sts[k] = []int{0}
		}
	}
	it.shape = sh
	it.inner = make([]int, len(ops))
	for k, o := range ops {
		o.st = sts[k]
		it.ops[k] = o
		it.inner[k] = o.st[len(sh)-1] * o.size
	}
	return it
}

// iterScratch is reusable per-goroutine state for runRangeWith.
type iterScratch struct {
	idx, offs []int
	p         []unsafe.Pointer
	// stop, when not nil, ends runRangeWith early once set (checked every
	// interruptGrain elements, between runs: the runs visited and their
	// order are unchanged, so an uninterrupted result is too)
	stop *atomic.Bool
}

func (it *elemIter) scratch() *iterScratch {
	return &iterScratch{idx: make([]int, len(it.shape)), offs: make([]int, len(it.ops)), p: make([]unsafe.Pointer, len(it.ops))}
}

// runRange calls body for each run of the innermost dimension within the
// linear element range [lo, hi); p[k] is operand k's address at the run's
// start and n the run's length.
func (it *elemIter) runRange(lo, hi int, body func(p []unsafe.Pointer, n int)) {
	it.runRangeWith(it.scratch(), nil, lo, hi, body)
}

// runRangeWith is runRange with scratch state and, if base is not nil, an
// extra element offset for each operand.
func (it *elemIter) runRangeWith(sc *iterScratch, base []int, lo, hi int, body func(p []unsafe.Pointer, n int)) {
	if lo >= hi {
		return
	}
	nd := len(it.shape)
	idx, offs, p := sc.idx, sc.offs, sc.p
	rem := lo
	for d := nd - 1; d >= 0; d-- {
		idx[d] = rem % it.shape[d]
		rem /= it.shape[d]
	}
	for k, o := range it.ops {
		offs[k] = o.off
		if base != nil {
			offs[k] += base[k]
		}
		for d := range nd {
			offs[k] += idx[d] * o.st[d]
		}
	}
	inner := it.shape[nd-1]
	check := lo + interruptGrain
	for pos := lo; pos < hi; {
		n := min(inner-idx[nd-1], hi-pos)
		for k, o := range it.ops {
			p[k] = unsafe.Add(o.base, offs[k]*o.size)
		}
		body(p, n)
		pos += n
		if pos >= hi {
			break
		}
		if sc.stop != nil && pos >= check {
			if sc.stop.Load() {
				return
			}
			check = pos + interruptGrain
		}
		for k, o := range it.ops {
			offs[k] += n * o.st[nd-1]
		}
		idx[nd-1] += n
		for d := nd - 1; d > 0 && idx[d] == it.shape[d]; d-- {
			for k, o := range it.ops {
				offs[k] += o.st[d-1] - it.shape[d]*o.st[d]
			}
			idx[d] = 0
			idx[d-1]++
		}
	}
}

// run calls body over all elements, in parallel for large iterations. It
// stops early, leaving elements unvisited, when the operands' Context is
// interrupted (the op then returns the interrupted error).
func (it *elemIter) run(body func(p []unsafe.Pointer, n int)) {
	if it.n == 0 {
		return
	}
	parallelForStop(it.stop, it.n, parallelThreshold, interruptGrain, func(lo, hi int) { it.runRange(lo, hi, body) })
}

// elemPtr is the address of one element.
type elemPtr = unsafe.Pointer

// forEachElem calls f with the address of each element of t in row-major
// order until f returns false.
func forEachElem(t *Tensor, f func(p elemPtr) bool) {
	it := newElemIter(t.shape, layoutOf(t, t.shape))
	if it.n == 0 {
		return
	}
	stop := false
	it.runRange(0, it.n, func(p []unsafe.Pointer, n int) {
		q := p[0]
		for range n {
			if stop {
				return
			}
			if !f(q) {
				stop = true
				return
			}
			q = unsafe.Add(q, it.inner[0])
		}
	})
}
