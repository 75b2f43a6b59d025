package backend

import "slices"

// The caching allocator's state as others read it: copies for replay
// (Clone) and the segments for snapshots (Segments).

// Clone returns a copy of the allocator as it stands — its segments and
// their blocks, free and allocated, and its statistics — drawing from dev,
// which must hold the same device memory at the same addresses (a copy of
// the device: backend/sim's Device.Clone). The copy has no hooks and no
// peak counters open; the blocks allocated in a, which the copy's caller
// never frees, stay allocated in it. backend/replay replays a trial's
// allocations through such a copy.
func (a *CachingAllocator) Clone(dev Device) *CachingAllocator {
	c := NewCachingAllocator(dev, a.index)
	c.st = a.st
	clones := map[*cblock]*cblock{} // the blocks whose frees wait for events
	for _, seg := range a.segs {
		ns := &segment{owner: c, mem: DeviceMem{Ptr: seg.mem.Ptr}, size: seg.size, pool: &c.large}
		if seg.pool == &a.small {
			ns.pool = &c.small
		}
		var prev *cblock
		for b := seg.head; b != nil; b = b.next {
			nb := &cblock{seg: ns, ptr: b.ptr, size: b.size, requested: b.requested, allocated: b.allocated, prev: prev,
				stream: b.stream, uses: append([]Stream(nil), b.uses...), pending: b.pending}
			if prev == nil {
				ns.head = nb
			} else {
				prev.next = nb
			}
			if !nb.allocated && nb.pending == 0 {
				ns.pool.free.ReplaceOrInsert(nb)
			}
			if b.pending > 0 {
				clones[b] = nb
			}
			prev = nb
		}
		c.segs = append(c.segs, ns)
	}
	c.cloneStreams(a, clones)
	return c
}

// SegmentInfo describes one segment held from the device, for snapshots.
type SegmentInfo struct {
	Ptr    uintptr
	Size   uint64
	Pool   string      // "small" or "large"
	Stream Stream      // the stream it was allocated on
	Blocks []BlockInfo // by address; their sizes add up to Size
}

// BlockInfo is one block of a segment.
type BlockInfo struct {
	Ptr       uintptr
	Size      uint64
	Requested uint64 // bytes the caller asked for; 0 for a free block
	Allocated bool
	// Pending: freed, waiting for other streams' work (PyTorch's
	// snapshot state "active_pending_free")
	Pending bool
}

// Segments lists the segments held from the device, by address.
func (a *CachingAllocator) Segments() []SegmentInfo {
	out := make([]SegmentInfo, 0, len(a.segs))
	for _, seg := range a.segs {
		si := SegmentInfo{Ptr: seg.mem.Ptr, Size: seg.size, Pool: "large", Stream: seg.head.stream}
		if seg.pool.stat == statSmall {
			si.Pool = "small"
		}
		for b := seg.head; b != nil; b = b.next {
			si.Blocks = append(si.Blocks, BlockInfo{Ptr: b.ptr, Size: b.size, Requested: b.requested, Allocated: b.allocated, Pending: b.pending > 0})
		}
		out = append(out, si)
	}
	slices.SortFunc(out, func(x, y SegmentInfo) int {
		switch {
		case x.Ptr < y.Ptr:
			return -1
		case x.Ptr > y.Ptr:
			return 1
		}
		return 0
	})
	return out
}
