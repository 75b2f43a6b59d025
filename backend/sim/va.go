package sim

import "slices"

// vaSpace places a simulated GPU's allocations in its address space as the
// CUDA driver places cudaMalloc's, to the extent that PyTorch's caching
// allocator can tell: it picks the free block of the best size, and among
// blocks of equal size the one at the lowest address, so the order of the
// segments' addresses decides which cached block a request reuses.
//
// Observed on an H100 with PyTorch 2.11 (testdata/torchref/cuda/
// h100_trace_b122_ckpt_cpp.jsonl.gz, every segment's address): segments
// are reserved top-down, each below the last, in 2 MiB units, and a freed
// range is reused from its top by the next one that fits — except the
// segments of more than 2 MiB and up to 20 MiB after the first (the
// medium ones PyTorch makes for requests of 1 to 10 MiB), which follow
// one another upwards in a region of their own. The simulator does the
// same, so a newer large segment has the lower address and a newer
// 20 MiB one the higher, as on the GPU.
type vaSpace struct {
	medium  uintptr            // the next address of a medium segment (upwards)
	mediums int                // medium segments placed so far
	low     uintptr            // the lowest address reserved top-down
	gaps    []vaRange          // freed ranges above low, by address
	live    map[uintptr]uint64 // the reserved length of each top-down allocation
}

type vaRange struct{ lo, hi uintptr }

const (
	vaUnit       = 2 << 20  // the driver's placement unit
	vaMediumMax  = 20 << 20 // the largest segment placed upwards
	vaMediumBase = 1 << 40
	vaTop        = 0x7f0000000000
)

func newVASpace() *vaSpace {
	return &vaSpace{medium: vaMediumBase, low: vaTop, live: map[uintptr]uint64{}}
}

// alloc returns the address of a new allocation of size bytes.
func (v *vaSpace) alloc(size uint64) uintptr {
	n := uintptr((size + vaUnit - 1) &^ (vaUnit - 1))
	if size > vaUnit && size <= vaMediumMax {
		v.mediums++
		if v.mediums > 1 {
			p := v.medium
			v.medium += n
			return p
		}
	}
	for i := len(v.gaps) - 1; i >= 0; i-- {
		g := &v.gaps[i]
		if g.hi-g.lo >= n {
			p := g.hi - n
			g.hi = p
			if g.hi == g.lo {
				v.gaps = slices.Delete(v.gaps, i, i+1)
			}
			v.live[p] = uint64(n)
			return p
		}
	}
	v.low -= n
	v.live[v.low] = uint64(n)
	return v.low
}

// free returns the range of the allocation at p to the space (a medium
// segment's is not reused: the address only orders blocks, and there is
// room enough).
func (v *vaSpace) free(p uintptr) {
	n, ok := v.live[p]
	if !ok {
		return
	}
	delete(v.live, p)
	r := vaRange{p, p + uintptr(n)}
	i, _ := slices.BinarySearchFunc(v.gaps, r.lo, func(g vaRange, lo uintptr) int {
		switch {
		case g.lo < lo:
			return -1
		case g.lo > lo:
			return 1
		}
		return 0
	})
	v.gaps = slices.Insert(v.gaps, i, r)
	// coalesce with the neighbours
	if i+1 < len(v.gaps) && v.gaps[i].hi == v.gaps[i+1].lo {
		v.gaps[i].hi = v.gaps[i+1].hi
		v.gaps = slices.Delete(v.gaps, i+1, i+2)
	}
	if i > 0 && v.gaps[i-1].hi == v.gaps[i].lo {
		v.gaps[i-1].hi = v.gaps[i].hi
		v.gaps = slices.Delete(v.gaps, i, i+1)
		i--
	}
	// a gap at the bottom goes back to the unreserved space
	if i == 0 && v.gaps[0].lo == v.low {
		v.low = v.gaps[0].hi
		v.gaps = v.gaps[1:]
	}
}
