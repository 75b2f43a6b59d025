package host

import "sync"

// Freed blocks kept for reuse, as glibc keeps them for PyTorch.
//
// PyTorch's CPU allocator calls posix_memalign and free; with glibc's
// defaults a large block is an mmap of its own only until the first such
// block is freed: free then raises the mmap threshold to that block's size
// (at most 32 MiB, DEFAULT_MMAP_THRESHOLD_MAX on 64-bit) and the trim
// threshold to twice it, and from then on blocks up to that size come from
// the heap, whose free top stays resident until it exceeds the trim
// threshold. A loop that makes and drops a 4 MiB result therefore reuses
// resident memory in PyTorch, where a fresh mapping would have the kernel
// zero 4 MiB of pages on every iteration (on the 2-core development VM
// about half of a float32 exp's time at 1M elements).
//
// memsh models that rule directly rather than leaving it to the C
// allocator's state: a freed block of RetainMin to RetainMax bytes is
// retained while the retained bytes stay within twice the largest such
// block freed so far (glibc's trim threshold) and within 2 × RetainMax, the
// oldest going back to the operating system first. A later Malloc of the
// same size class (the size rounded up to 4 KiB pages) takes the most
// recently retained one. Retained blocks are resident and RSS counts them,
// as it counts glibc's free heap under PyTorch; they are no allocator's
// bytes (allocated and reserved figures never include them). [Trim] — and
// so the end of every experiment — returns them all to the operating
// system, as malloc_trim does glibc's, and a Malloc that fails releases
// them and tries once more.
const (
	// RetainMin is the smallest block retained: MmapThreshold, below
	// which blocks come from glibc's arenas anyway.
	RetainMin = MmapThreshold
	// RetainMax is the largest block retained: glibc's maximum dynamic
	// mmap threshold on 64-bit systems.
	RetainMax = 32 << 20
)

// retainer is the process's set of retained blocks (host memory is one
// per process, as the C heap is). Safe for concurrent use.
type retainer struct {
	mu      sync.Mutex
	blocks  []retainedBlock // oldest first
	bytes   uint64          // sum of their classes
	largest uint64          // the largest class freed so far
}

type retainedBlock struct {
	mem   []byte // the whole block: class bytes
	class uint64
}

var retained retainer

// retainClass is size's class: size rounded up to whole pages, or 0 when
// blocks of that size are not retained.
func retainClass(size uint64) uint64 {
	if size < RetainMin || size > RetainMax {
		return 0
	}
	return (size + pageSize - 1) &^ (pageSize - 1)
}

// take returns a retained block of class, most recent first, and whether
// there was one.
func (r *retainer) take(class uint64) ([]byte, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := len(r.blocks) - 1; i >= 0; i-- {
		if r.blocks[i].class == class {
			m := r.blocks[i].mem
			r.blocks = append(r.blocks[:i], r.blocks[i+1:]...)
			r.bytes -= class
			return m, true
		}
	}
	return nil, false
}

// keep retains m (of class) and returns the blocks that no longer fit
// under the limit, oldest first, for the caller to release.
func (r *retainer) keep(m []byte, class uint64) []retainedBlock {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.largest = max(r.largest, class)
	limit := min(2*r.largest, 2*RetainMax)
	r.blocks = append(r.blocks, retainedBlock{m, class})
	r.bytes += class
	n := 0
	for r.bytes > limit {
		r.bytes -= r.blocks[n].class
		n++
	}
	out := append([]retainedBlock(nil), r.blocks[:n]...)
	r.blocks = append(r.blocks[:0], r.blocks[n:]...)
	return out
}

// drain removes and returns every retained block.
func (r *retainer) drain() []retainedBlock {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.blocks
	r.blocks, r.bytes = nil, 0
	return out
}

// Retained is the bytes of freed blocks host memory keeps for reuse (see
// RetainMin): resident, counted by RSS, and part of no allocator's figures.
func Retained() uint64 {
	retained.mu.Lock()
	defer retained.mu.Unlock()
	return retained.bytes
}

// release returns blocks to the operating system.
func release(blocks []retainedBlock) {
	for _, b := range blocks {
		if err := freeMem(b.mem); err != nil {
			panic("host: " + err.Error())
		}
	}
}
