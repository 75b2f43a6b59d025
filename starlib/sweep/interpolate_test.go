package sweep

import (
	"slices"
	"testing"
)

// oracle is a synthetic step: whether size n trains, and its GPU's peak
// allocated and reserved bytes when it does.
type oracle func(n int) (ok bool, allocated, reserved uint64)

// search runs max_fit's loop over o, as maxFit does: "interpolate" with
// the interpolator, "binsearch" by doubling and bisection. It returns the
// boundary and the sizes tried.
func search(o oracle, mode string, low, high int, budget uint64) (fit, oom int, tried []int) {
	fit, oom = -1, -1
	var ooms []int
	ip := &interpolator{low: low, high: high}
	try := func(n int) string {
		tried = append(tried, n)
		ok, a, r := o(n)
		p := &point{status: "oom"}
		if ok {
			p = &point{status: "ok", peakAllocated: []uint64{a}, peakReserved: []uint64{r}, budget: []uint64{budget}}
		} else {
			ooms = append(ooms, n)
		}
		narrow(&fit, &oom, n, p.status, ooms)
		ip.add(n, p)
		return p.status
	}
	if mode == "interpolate" {
		for len(tried) < 200 {
			n, more := ip.next(fit, oom)
			if !more {
				break
			}
			try(n)
		}
		return fit, oom, tried
	}
	for n := low; ; n *= 2 {
		if try(n) != "ok" || n >= high {
			break
		}
		if n > high/2 {
			n = high / 2
		}
	}
	for fit >= 0 && oom >= 0 && oom-fit > 1 {
		try(fit + (oom-fit)/2)
	}
	return fit, oom, tried
}

const MiB = 1 << 20

// linear: c + s·n allocated, rounded up to 2 MiB segments reserved with
// frag more; n trains while reserved is within budget.
func linear(c, s, frag, budget uint64) oracle {
	return func(n int) (bool, uint64, uint64) {
		a := c + s*uint64(n)
		r := (a+2*MiB-1)/(2*MiB)*(2*MiB) + frag
		return r <= budget, a, r
	}
}

// TestInterpolateFindsBinsearchBoundary: on steps whose sizes that train
// are an interval, "interpolate" ends at binsearch's boundary, in no more
// trials (a linear step: far fewer), and never tries a size twice.
func TestInterpolateFindsBinsearchBoundary(t *testing.T) {
	const U = 80 << 30
	for _, tc := range []struct {
		name string
		o    oracle
		// most: the trials interpolate may take
		most int
	}{
		{"linear", linear(30<<30, 3<<30, 0, U), 7},
		{"linear, fragmented", linear(30<<30, 3<<30, 2<<30, U), 7},
		{"small activations", linear(2<<30, 600*MiB, 512*MiB, U), 11},
		{"a floor below the line (the optimizer step's peak at small sizes)", func(n int) (bool, uint64, uint64) {
			a := max(uint64(30<<30), 20<<30+uint64(n)*(3<<30))
			return a+uint64(n)*(64*MiB) <= U, a, a + uint64(n)*(64*MiB)
		}, 9},
		{"quadratic (a sequence's attention scores)", func(n int) (bool, uint64, uint64) {
			a := uint64(4<<30) + uint64(n)*uint64(n)*(256<<10) + uint64(n)*(1<<20)
			return a <= U, a, a
		}, 30},
		{"reserved saturating at the budget (fragmentation shrinking near it)", func(n int) (bool, uint64, uint64) {
			a := uint64(1<<30) + uint64(n)*(11*MiB)
			if a > U-(1<<30) {
				return false, 0, 0
			}
			r := min(U, a+(4<<30))
			return true, a, r
		}, 30},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bf, bo, btried := search(tc.o, "binsearch", 1, maxSize, U)
			f, oom, tried := search(tc.o, "interpolate", 1, maxSize, U)
			if f != bf || oom != bo {
				t.Fatalf("interpolate: %d (%d OOM), binsearch %d (%d OOM)\n interpolate: %v\n binsearch: %v", f, oom, bf, bo, tried, btried)
			}
			if len(tried) > len(btried) || len(tried) > tc.most {
				t.Errorf("interpolate: %d trials %v; binsearch %d %v; want at most %d and at most binsearch's", len(tried), tried, len(btried), btried, tc.most)
			}
			seen := map[int]bool{}
			for _, n := range tried {
				if seen[n] {
					t.Errorf("interpolate tried %d twice: %v", n, tried)
				}
				seen[n] = true
			}
		})
	}
}

// TestInterpolateNotAnInterval: a size the line puts within the budget
// that runs out of memory (a hole where the blocks fall otherwise), once
// the search ends below it, is followed by a trial of the size above it;
// when that trains the search goes on above and ends at the upper
// boundary.
func TestInterpolateNotAnInterval(t *testing.T) {
	const U = 80 << 30
	// fragmentation that shrinks as the size grows: the bound below,
	// from the largest size that ran, is short of the boundary
	base := func(n int) (bool, uint64, uint64) {
		a := uint64(10<<30) + uint64(n)*(3<<30)
		r := a + uint64(max(0, 16<<30-n*(768*MiB)))
		return r <= U, a, r
	}
	upper, _, plain := search(base, "interpolate", 1, maxSize, U)
	i := 0
	for plain[i] <= 16 {
		i++
	}
	hole := plain[i] // the first size the bounds chose: it trains
	if ok, _, _ := base(hole); !ok || hole >= upper {
		t.Fatalf("the bound below (%d) is not short of the boundary (%d): %v", hole, upper, plain)
	}
	holed := func(n int) (bool, uint64, uint64) {
		if n == hole {
			return false, 0, 0
		}
		return base(n)
	}
	f, oom, tried := search(holed, "interpolate", 1, maxSize, U)
	if f != upper || oom != upper+1 {
		t.Errorf("with a hole at %d: %d (%d OOM), want %d (%d OOM); tried %v (without the hole %v)", hole, f, oom, upper, upper+1, tried, plain)
	}
	if !slices.Contains(tried, hole+1) {
		t.Errorf("with a hole at %d: %d not tried: %v", hole, hole+1, tried)
	}
}
