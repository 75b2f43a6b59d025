package backend

import (
	"errors"
	"fmt"

	"github.com/google/btree"
)

// The constants of PyTorch's CUDA caching allocator
// (c10/cuda/CUDACachingAllocator.cpp), default configuration: no
// max_split_size, no roundup_power2_divisions, no expandable segments.
const (
	minBlockSize  = 512      // every request is rounded up to a multiple of this
	smallSize     = 1 << 20  // largest request served by the small pool
	smallBuffer   = 2 << 20  // segment size of the small pool
	largeBuffer   = 20 << 20 // segment size of the large pool below minLargeAlloc
	minLargeAlloc = 10 << 20 // from here on a segment is the request rounded to roundLarge
	roundLarge    = 2 << 20

	// maxRequest is the largest request the size arithmetic handles; a
	// larger one fails as a device allocation of that size would.
	maxRequest = 1 << 62
)

// CachingAllocator is PyTorch's CUDA caching allocator over a Device: sizes
// rounded up to 512 bytes; a small pool (requests of at most 1 MiB, carved
// from 2 MiB segments) and a large pool (20 MiB segments, or the request
// rounded up to 2 MiB from 10 MiB on); best fit with splitting; frees merge
// with free neighbours and stay cached; EmptyCache returns whole free
// segments to the device; a device allocation that fails releases the cache
// and is retried once before an *OOMError. Stats has the keys of
// torch.cuda.memory_stats(). Blocks belong to the stream they were
// allocated on (caching_streams.go).
//
// A CachingAllocator is not safe for concurrent use; the caller serialises.
type CachingAllocator struct {
	dev   Device
	index int

	small, large blockPool
	segs         []*segment // every segment held from the device, in no order
	spare        []*cblock  // recycled block nodes
	key          cblock     // search key for best fit (avoids an allocation per lookup)

	// streams (caching_streams.go): the current stream, the last one
	// made, the events of frees that wait for other streams' work, and
	// the clock of event records and synchronizations
	cur, lastStream Stream
	events          []streamEvent
	clock           uint64
	synced          map[Stream]uint64 // when each stream was last synchronized
	syncedAll       uint64            // when the device was

	st      stats
	peaks   PeakSet
	tryOnly bool  // a TryMalloc is running: do not count an OOM
	lastErr error // from the last EmptyCache

	// onSegment, if set, is told of every segment obtained from (alloc
	// true) or returned to the device.
	onSegment func(alloc bool, ptr uintptr, size uint64)
	// onEmpty, if set, is told of every EmptyCache call, before it
	// releases anything.
	onEmpty func()
}

// SetEmptyCacheHook installs f to be called at the start of every
// EmptyCache; nil removes it. The Manager reports the calls to its
// ObserveAll observers (a recorder of a trial's stream).
func (a *CachingAllocator) SetEmptyCacheHook(f func()) { a.onEmpty = f }

// SetSegmentHook installs f to be called after every segment allocation
// (alloc true) and release; nil removes it. The Manager uses it to report
// segment events to observers (memory_viz's segment_alloc/segment_free).
func (a *CachingAllocator) SetSegmentHook(f func(alloc bool, ptr uintptr, size uint64)) {
	a.onSegment = f
}

// blockPool is the set of free blocks of one pool, ordered by (size, address)
// for best fit.
type blockPool struct {
	stat int // statSmall or statLarge
	free *btree.BTreeG[*cblock]
}

// segment is one Device.Malloc.
type segment struct {
	owner *CachingAllocator
	mem   DeviceMem
	size  uint64
	pool  *blockPool
	head  *cblock // the block at the segment's start; blocks are linked by prev/next
}

// cblock is a block of a segment, free or allocated: PyTorch's Block.
// A freed block whose memory other streams used waits for their events
// (pending > 0: PyTorch's event_count) outside the pool.
type cblock struct {
	seg        *segment
	ptr        uintptr
	size       uint64
	requested  uint64
	prev, next *cblock // neighbours in the same segment, by address
	allocated  bool
	user       *Block   // the Block handed out for it while allocated
	stream     Stream   // the stream it was allocated on (its segment's)
	uses       []Stream // other streams that used it (record_stream)
	pending    int      // events its free waits for
}

// Markers kept in Block.impl besides *cblock. Both are pointer-shaped, so
// storing them in the interface does not allocate.
type (
	zeroBlock  struct{ a *CachingAllocator } // a live zero-size block of a
	freedBlock struct{ a *CachingAllocator } // a block already returned to a
)

func lessBlock(x, y *cblock) bool {
	if x.stream != y.stream {
		return x.stream < y.stream
	}
	if x.size != y.size {
		return x.size < y.size
	}
	return x.ptr < y.ptr
}

// NewCachingAllocator returns an empty caching allocator over dev. index is
// the GPU ordinal printed in out-of-memory messages ("GPU 0").
func NewCachingAllocator(dev Device, index int) *CachingAllocator {
	a := &CachingAllocator{dev: dev, index: index}
	fl := btree.NewFreeListG[*cblock](64)
	a.small = blockPool{stat: statSmall, free: btree.NewWithFreeListG(16, lessBlock, fl)}
	a.large = blockPool{stat: statLarge, free: btree.NewWithFreeListG(16, lessBlock, fl)}
	return a
}

// Device returns the device the allocator draws from.
func (a *CachingAllocator) Device() Device { return a.dev }

// Peaks is the set of independent peak counters over this allocator.
func (a *CachingAllocator) Peaks() *PeakSet { return &a.peaks }

// Allocated is allocated_bytes.all.current.
func (a *CachingAllocator) Allocated() uint64 {
	return uint64(a.st.allocatedBytes[statAll].current)
}

// Reserved is reserved_bytes.all.current.
func (a *CachingAllocator) Reserved() uint64 {
	return uint64(a.st.reservedBytes[statAll].current)
}

// RoundSize is the exact number of bytes Malloc(size) would add to
// allocated_bytes if called now. That is PyTorch's round_size (a multiple of
// 512 bytes, at least 512) except when the block the request would get is
// not split: a large-pool block keeps a remainder of up to 1 MiB (a 15 MiB
// request counts 16 MiB). A zero-size request counts 0. The Manager relies on
// this being exact to reclaim before any allocation that raises a peak.
func (a *CachingAllocator) RoundSize(size uint64) uint64 {
	if size == 0 || size > maxRequest {
		return size
	}
	a.processEvents() // as Malloc will first
	rounded := roundSize(size)
	p := a.poolFor(rounded)
	have := segmentSize(rounded)
	if b := a.bestFit(p, rounded); b != nil {
		have = b.size
	}
	if p.shouldSplit(have, rounded) {
		return rounded
	}
	return have
}

// NeedsSegment reports whether a request of size bytes would have to
// obtain a new segment from the device (no cached free block fits), which
// raises reserved bytes. The Manager's exact-peak mode reclaims first then.
func (a *CachingAllocator) NeedsSegment(size uint64) bool {
	if size == 0 || size > maxRequest {
		return false
	}
	a.processEvents()
	rounded := roundSize(size)
	return a.bestFit(a.poolFor(rounded), rounded) == nil
}

// roundSize is PyTorch's round_size.
func roundSize(size uint64) uint64 {
	if size < minBlockSize {
		return minBlockSize
	}
	return (size + minBlockSize - 1) / minBlockSize * minBlockSize
}

// segmentSize is PyTorch's get_allocation_size: the size of the segment
// allocated from the device for a rounded request that the cache cannot serve.
func segmentSize(rounded uint64) uint64 {
	switch {
	case rounded <= smallSize:
		return smallBuffer
	case rounded < minLargeAlloc:
		return largeBuffer
	default:
		return (rounded + roundLarge - 1) / roundLarge * roundLarge
	}
}

func (a *CachingAllocator) poolFor(rounded uint64) *blockPool {
	if rounded <= smallSize {
		return &a.small
	}
	return &a.large
}

// shouldSplit is PyTorch's should_split with an unlimited max_split_size.
func (p *blockPool) shouldSplit(blockSize, rounded uint64) bool {
	remaining := blockSize - rounded
	if p.stat == statSmall {
		return remaining >= minBlockSize
	}
	return remaining > smallSize
}

// bestFit returns the smallest free block of p of at least rounded bytes
// on the current stream (the lowest address among equals), or nil.
func (a *CachingAllocator) bestFit(p *blockPool, rounded uint64) *cblock {
	a.key.stream, a.key.size, a.key.ptr = a.cur, rounded, 0
	var found *cblock
	p.free.AscendGreaterOrEqual(&a.key, func(b *cblock) bool {
		if b.stream == a.cur {
			found = b
		}
		return false
	})
	return found
}

func (a *CachingAllocator) newNode() *cblock {
	if n := len(a.spare); n > 0 {
		b := a.spare[n-1]
		a.spare = a.spare[:n-1]
		return b
	}
	return new(cblock)
}

func (a *CachingAllocator) recycle(b *cblock) {
	*b = cblock{}
	a.spare = append(a.spare, b)
}

// Malloc returns a block of at least size bytes. A zero-size request gets a
// Block with no memory (Ptr 0, Host nil) and changes no statistic, as PyTorch
// returns a null pointer for it.
func (a *CachingAllocator) Malloc(size uint64) (*Block, error) {
	if size == 0 {
		return &Block{impl: zeroBlock{a}}, nil
	}
	if size > maxRequest {
		// No device has this much: fail as PyTorch does when cudaMalloc
		// cannot, after releasing the cache and retrying.
		if err := a.releaseCached(); err != nil {
			return nil, err
		}
		a.countRetry()
		return nil, a.outOfMemory(size)
	}
	a.processEvents()
	rounded := roundSize(size)
	p := a.poolFor(rounded)
	b := a.bestFit(p, rounded)
	if b != nil {
		p.free.Delete(b)
	} else {
		var err error
		if b, err = a.allocSegment(p, rounded, size); err != nil {
			return nil, err
		}
	}

	seg := b.seg
	si := p.stat
	alreadySplit := b.prev != nil || b.next != nil
	if p.shouldSplit(b.size, rounded) {
		// The front of b is handed out; b keeps the remainder and stays free.
		nb := a.newNode()
		nb.seg, nb.ptr, nb.size, nb.stream = seg, b.ptr, rounded, b.stream
		nb.prev, nb.next = b.prev, b
		if nb.prev != nil {
			nb.prev.next = nb
		} else {
			seg.head = nb
		}
		b.prev = nb
		b.ptr += uintptr(rounded)
		b.size -= rounded
		p.free.ReplaceOrInsert(b)
		if alreadySplit {
			// An inactive split block shrinks by rounded bytes.
			a.st.inactiveSplitBytes.dec(si, int64(rounded))
		} else {
			// A new inactive split block of b.size bytes appears.
			a.st.inactiveSplitBytes.inc(si, int64(b.size))
			a.st.inactiveSplit.inc(si, 1)
		}
		b = nb
	} else if alreadySplit {
		// An inactive split block becomes active whole.
		a.st.inactiveSplitBytes.dec(si, int64(b.size))
		a.st.inactiveSplit.dec(si, 1)
	}

	b.allocated = true
	b.requested = size
	a.st.allocation.inc(si, 1)
	a.st.allocatedBytes.inc(si, int64(b.size))
	a.st.active.inc(si, 1)
	a.st.activeBytes.inc(si, int64(b.size))
	a.st.requestedBytes.inc(si, int64(size))
	// Reserved bytes only grow in allocSegment, before this point, and
	// allocated bytes only here, so one observation sees both maxima.
	a.peaks.Observe(a.Allocated(), a.Reserved())

	blk := &Block{Ptr: b.ptr, Size: b.size, Requested: size, impl: b}
	if h := seg.mem.Host; h != nil {
		off := uint64(b.ptr - seg.mem.Ptr)
		blk.Host = h[off : off+b.size : off+b.size]
	}
	b.user = blk
	return blk, nil
}

// allocSegment allocates a new segment for a rounded request of pool p that
// the cache cannot serve and returns its single, free block, not yet in the
// pool. When the device is full it releases every cached segment and retries
// once; then it fails with an *OOMError.
func (a *CachingAllocator) allocSegment(p *blockPool, rounded, requested uint64) (*cblock, error) {
	size := segmentSize(rounded)
	mem, err := a.dev.Malloc(size)
	if err != nil {
		if !errors.Is(err, ErrDeviceFull) {
			return nil, fmt.Errorf("%s: allocating a %s segment: %w", a.dev.Name(), FormatSize(size), err)
		}
		if rerr := a.releaseCached(); rerr != nil {
			return nil, rerr
		}
		a.countRetry()
		mem, err = a.dev.Malloc(size)
		if err != nil {
			if !errors.Is(err, ErrDeviceFull) {
				return nil, fmt.Errorf("%s: allocating a %s segment: %w", a.dev.Name(), FormatSize(size), err)
			}
			return nil, a.outOfMemory(size)
		}
	}

	seg := &segment{owner: a, mem: mem, size: size, pool: p}
	a.segs = append(a.segs, seg)
	b := a.newNode()
	b.seg, b.ptr, b.size, b.stream = seg, mem.Ptr, size, a.cur
	seg.head = b
	a.st.segment.inc(p.stat, 1)
	a.st.reservedBytes.inc(p.stat, int64(size))
	a.st.numDeviceAlloc++
	if a.onSegment != nil {
		a.onSegment(true, mem.Ptr, size)
	}
	return b, nil
}

// TryMalloc implements Allocator: Malloc without counting a failure in
// num_ooms.
func (a *CachingAllocator) TryMalloc(size uint64) (*Block, error) {
	a.tryOnly = true
	defer func() { a.tryOnly = false }()
	return a.Malloc(size)
}

// countRetry counts a free-cache-and-retry, except during TryMalloc: the
// Manager's retry after a reclaim counts it once, as PyTorch counts one
// per failed allocation.
func (a *CachingAllocator) countRetry() {
	if !a.tryOnly {
		a.st.numAllocRetries++
	}
}

// outOfMemory counts an OOM and returns its error; requested is what the
// allocator tried to obtain (the segment size, PyTorch's alloc_size).
func (a *CachingAllocator) outOfMemory(requested uint64) error {
	if !a.tryOnly {
		a.st.numOOMs++
	}
	free, total, _ := a.dev.MemGetInfo() // zeros if even that fails; the OOM is what matters
	e := &OOMError{
		Device:    a.dev.Name(),
		Index:     a.index,
		Requested: requested,
		Total:     total,
		Free:      free,
		Allocated: a.Allocated(),
		Reserved:  a.Reserved(),
	}
	switch pm, ok := a.dev.(ProcessMemory); {
	case ok:
		e.ProcessUsed, e.ProcessKnown = pm.ProcessUsed()
	case a.dev.Kind() == "sim" && total >= free:
		// A simulated GPU belongs to this process: all it uses is ours
		// (segments and the ctx= preload).
		e.ProcessUsed, e.ProcessKnown = total-free, true
	}
	return e
}

// Free returns b to the cache, merging it with free neighbours. It panics if
// b was already freed or does not come from this allocator.
func (a *CachingAllocator) Free(b *Block) {
	if b == nil {
		panic("backend: CachingAllocator.Free of a nil *Block")
	}
	var cb *cblock
	switch x := b.impl.(type) {
	case *cblock:
		cb = x
	case zeroBlock:
		if x.a != a {
			panic(a.foreign(b))
		}
		b.impl = freedBlock{a}
		return
	case freedBlock:
		if x.a == a {
			panic(fmt.Sprintf("backend: %s: double free of a %s block at %#x", a.dev.Name(), FormatSize(b.Size), b.Ptr))
		}
		panic(a.foreign(b))
	default:
		panic(a.foreign(b))
	}
	if cb.seg == nil || cb.seg.owner != a || cb.user != b || !cb.allocated {
		panic(a.foreign(b))
	}

	si := cb.seg.pool.stat
	cb.allocated = false
	cb.user = nil
	b.impl = freedBlock{a}
	a.st.allocation.dec(si, 1)
	a.st.allocatedBytes.dec(si, int64(cb.size))
	if len(cb.uses) > 0 {
		// other streams used it: it waits for their work (insert_events)
		a.insertEvents(cb)
		return
	}
	a.freeBlock(cb)
}

// freeBlock returns a freed block to its pool, merging it with free
// neighbours (PyTorch's free_block): the active figures drop now.
func (a *CachingAllocator) freeBlock(cb *cblock) {
	seg := cb.seg
	p := seg.pool
	si := p.stat
	origSize, requested := cb.size, cb.requested
	cb.requested = 0

	var netSplit, netSplitBytes int64
	if prev := cb.prev; prev != nil && prev.mergeable() {
		p.free.Delete(prev)
		cb.ptr = prev.ptr
		cb.size += prev.size
		cb.prev = prev.prev
		if cb.prev != nil {
			cb.prev.next = cb
		} else {
			seg.head = cb
		}
		netSplit--
		netSplitBytes -= int64(prev.size)
		a.recycle(prev)
	}
	if next := cb.next; next != nil && next.mergeable() {
		p.free.Delete(next)
		cb.size += next.size
		cb.next = next.next
		if cb.next != nil {
			cb.next.prev = cb
		}
		netSplit--
		netSplitBytes -= int64(next.size)
		a.recycle(next)
	}
	p.free.ReplaceOrInsert(cb)
	if cb.prev != nil || cb.next != nil {
		netSplit++
		netSplitBytes += int64(cb.size)
	}

	a.st.inactiveSplit.add(si, netSplit)
	a.st.inactiveSplitBytes.add(si, netSplitBytes)
	a.st.active.dec(si, 1)
	a.st.activeBytes.dec(si, int64(origSize))
	a.st.requestedBytes.dec(si, int64(requested))
}

func (a *CachingAllocator) foreign(b *Block) string {
	return fmt.Sprintf("backend: %s: free of a %s block at %#x that this allocator did not hand out (or a copy of a *Block)",
		a.dev.Name(), FormatSize(b.Size), b.Ptr)
}

// EmptyCache releases every cached segment that holds no allocated block,
// as torch.cuda.empty_cache. A segment the device refuses to free stays
// cached (the error is kept for LastError); the session goes on.
func (a *CachingAllocator) EmptyCache() {
	if a.onEmpty != nil {
		a.onEmpty()
	}
	a.lastErr = a.releaseCached()
}

// LastError returns the error of the last EmptyCache, or nil.
func (a *CachingAllocator) LastError() error { return a.lastErr }

// releaseCached is PyTorch's release_cached_blocks: every segment that is a
// single free block goes back to the device. A segment the device fails to
// free stays cached; the first such error is returned.
func (a *CachingAllocator) releaseCached() error {
	a.synchronizeAndFreeEvents()
	var first error
	for i := len(a.segs) - 1; i >= 0; i-- {
		seg := a.segs[i]
		h := seg.head
		if h.allocated || h.pending > 0 || h.next != nil {
			continue
		}
		if err := a.dev.Free(seg.mem, seg.size); err != nil {
			if first == nil {
				first = fmt.Errorf("%s: releasing a %s segment at %#x: %w", a.dev.Name(), FormatSize(seg.size), seg.mem.Ptr, err)
			}
			continue
		}
		seg.pool.free.Delete(h)
		a.recycle(h)
		a.segs[i] = a.segs[len(a.segs)-1]
		a.segs[len(a.segs)-1] = nil
		a.segs = a.segs[:len(a.segs)-1]
		a.st.segment.dec(seg.pool.stat, 1)
		a.st.reservedBytes.dec(seg.pool.stat, int64(seg.size))
		a.st.numDeviceFree++
		if a.onSegment != nil {
			a.onSegment(false, seg.mem.Ptr, seg.size)
		}
		seg.head, seg.owner = nil, nil
	}
	return first
}

var _ Allocator = (*CachingAllocator)(nil)
