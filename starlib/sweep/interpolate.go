package sweep

import (
	"cmp"
	"math"
	"slices"
)

// interpolator chooses max_fit(mode="interpolate")'s trials: a bisection
// on an interval that the trials' peaks narrow. A training step's peak
// grows about linearly in the batch (the activations) above a part that
// does not grow (the weights, gradients and optimizer state), so two
// sizes that ran bound the boundary by the line through their peaks:
//
//   - above: the size whose allocated bytes the line puts past what the
//     allocator can hold (its reserved bytes and the device's free bytes
//     after a trial) cannot train, whatever the blocks;
//   - below: the size whose peak reserved bytes, growing as allocated
//     bytes do from the largest size that ran, stay within it likely
//     trains (fragmentation tends to shrink near the limit).
//
// Before the first out-of-memory trial it doubles as "power" does while
// the bound above is past the next doubling. Then it bisects between the
// largest size that ran and the smallest that did not or the bound above,
// whichever is lower, trying no size below the bound below; the bound
// above, when that is all that is left, is tried to confirm it. A bound
// below at or past a size that ran out of memory is not used; bounds
// that were wrong twice (a size the line put out of reach trained, or
// one it put within reach ran out of memory) are not used again: the
// search is then "binsearch".
//
// Where the caching allocator's blocks make the sizes that train not an
// interval (a size runs out of memory, a larger one trains), a search
// finds one of the boundaries, which one depending on the sizes it
// tried. A size at or below the bound below that runs out of memory is
// such a size, or a peak growing faster than the line: after one, the
// size above the first out-of-memory size the search ends at is tried
// once, and if that trains the search goes on above it (and the footer
// says the sizes are not an interval).
type interpolator struct {
	low, high int
	ok        []ipoint // the ok trials with their peaks, in increasing size
	budget    []uint64 // the last budget a full trial measured, per GPU
	// chose: the bounds chose the last size next returned, below then;
	// guessed: that size was the bound above, tried as an out-of-memory
	// size; wrong counts the sizes where the bounds were wrong (a guessed
	// one trained, one at or below the bound below did not)
	chose   bool
	below   int
	guessed bool
	wrong   int
	// surprised: a size at or below the bound below ran out of memory;
	// checked: the size above the boundary was tried after it; tried:
	// the sizes tried
	surprised, checked bool
	tried              map[int]bool
}

// ipoint is an ok trial's size and its GPUs' peak reserved and
// allocated bytes.
type ipoint struct {
	n                   int
	reserved, allocated []uint64
}

// add takes the trial at n's outcome.
func (ip *interpolator) add(n int, p *point) {
	if ip.tried == nil {
		ip.tried = map[int]bool{}
	}
	ip.tried[n] = true
	if len(p.budget) > 0 {
		ip.budget = p.budget
	}
	switch {
	case p.status == "oom" && ip.chose && n <= ip.below:
		ip.surprised = true
		ip.wrong++
	case p.status == "ok" && ip.guessed:
		ip.wrong++
	}
	pt := ipoint{n: n, reserved: p.peakReserved, allocated: p.peakAllocated}
	if p.status != "ok" || len(pt.reserved) == 0 || len(pt.allocated) != len(pt.reserved) {
		return
	}
	i, found := slices.BinarySearchFunc(ip.ok, n, func(q ipoint, n int) int { return cmp.Compare(q.n, n) })
	if found {
		ip.ok[i] = pt
	} else {
		ip.ok = slices.Insert(ip.ok, i, pt)
	}
}

// bounds returns the bounds below and above (see interpolator) from two
// ok trials — the largest at or below fit, b, and the largest at or below
// b/2 (else the next below b): sizes close together give a slope of the
// allocator's rounding more than of the step's growth — on the GPU that
// bounds it most, and false when the peaks do not grow with the size.
func (ip *interpolator) bounds(fit int) (below, above int, ok bool) {
	var a, b *ipoint
	for i := len(ip.ok) - 1; i >= 0; i-- {
		switch {
		case ip.ok[i].n > fit:
		case b == nil:
			b = &ip.ok[i]
		case a == nil || 2*a.n > b.n:
			a = &ip.ok[i]
		}
	}
	if a == nil || len(a.allocated) != len(b.allocated) || len(ip.budget) != len(b.allocated) {
		return 0, 0, false
	}
	lo, hi := math.MaxFloat64, math.MaxFloat64
	for g := range b.allocated {
		slope := (float64(b.allocated[g]) - float64(a.allocated[g])) / float64(b.n-a.n)
		if slope <= 0 {
			continue
		}
		u := float64(ip.budget[g])
		lo = min(lo, float64(b.n)+(u-float64(b.reserved[g]))/slope)
		hi = min(hi, float64(b.n)+(u-float64(b.allocated[g]))/slope)
	}
	if hi == math.MaxFloat64 {
		return 0, 0, false
	}
	clamp := func(x float64) int { return int(min(math.Floor(x), float64(maxSize))) }
	return clamp(lo), clamp(hi), true
}

// estimated reports whether the bounds chose the last size next returned:
// a size near the boundary, which full trials confirm anyway.
func (ip *interpolator) estimated() bool { return ip.chose }

// next returns the size to try after the trials so far (fit the largest
// that ran, oom the smallest above it that ran out of memory, -1 for
// none), or false when the boundary is found.
func (ip *interpolator) next(fit, oom int) (int, bool) {
	ip.chose, ip.guessed = false, false
	switch {
	case fit < 0 && oom < 0:
		return ip.low, true
	case fit < 0, fit >= ip.high:
		return 0, false
	case oom >= 0 && oom-fit <= 1:
		if ip.surprised && !ip.checked && oom < ip.high && !ip.tried[oom+1] {
			ip.checked = true
			return oom + 1, true
		}
		return 0, false
	}
	below, above, ok := ip.bounds(fit)
	if ok && (ip.wrong >= 2 || above < fit) {
		ok = false
	}
	upper := oom // exclusive: a size known, or bounded, to run out of memory
	if oom < 0 {
		double := ip.high
		if fit <= ip.high/2 {
			double = 2 * fit
		}
		if !ok || above >= double {
			return double, true
		}
		upper = min(above+1, ip.high+1)
	} else if ok && above+1 < oom {
		upper = above + 1
	}
	if !ok {
		return fit + (oom-fit)/2, true
	}
	if oom >= 0 && below >= oom {
		below = fit // contradicted by a size that ran out of memory
	}
	ip.chose, ip.below = true, below
	if upper-fit <= 1 {
		// only the bound above is left: confirm it
		ip.guessed = upper != oom
		return min(upper, ip.high), true
	}
	n := fit + (upper-fit)/2
	n = max(n, min(below, upper-1))
	return max(n, fit+1), true
}
