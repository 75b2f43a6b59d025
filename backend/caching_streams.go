package backend

import "fmt"

// Stream is a CUDA stream of one device: 0 is the default stream, the
// others are numbered as NewStream makes them.
//
// The caching allocator's stream semantics are PyTorch's
// (c10/cuda/CUDACachingAllocator.cpp): a block is allocated on the
// current stream, and once freed it is reused only by allocations on that
// stream (the free blocks are ordered by stream, then size, then address;
// a new segment belongs to the stream that asked for it). RecordStream
// (Tensor.record_stream) notes another stream that uses a block; when
// such a block is freed, allocation and allocated_bytes drop at once, but
// the block waits outside the pool, still active, for an event recorded
// on each of those streams (insert_events); the allocator checks the
// events at the start of every Malloc (process_events) and waits for all
// of them before it releases cached segments — empty_cache and the
// retry of an allocation the device refused (synchronize_and_free_events).
//
// A simulated GPU runs no kernels, so when an event completes is memsh's
// choice, stated here: an event is complete once its stream (or the whole
// device) was synchronized after it was recorded (SynchronizeStream,
// Synchronize: stream.synchronize(), torch.cuda.synchronize()). That is
// the latest the GPU can finish, so a block waits as long as PyTorch could
// make it wait; on a real GPU it is often reusable sooner.
type Stream int

// streamEvent is an event recorded on a stream when a block it used was
// freed (PyTorch's cuda_events entry).
type streamEvent struct {
	stream Stream
	at     uint64 // the clock when it was recorded
	block  *cblock
}

// mergeable reports whether a free neighbour may merge with a freed
// block: free and not waiting for events (try_merge_blocks).
func (b *cblock) mergeable() bool { return !b.allocated && b.pending == 0 }

// NewStream returns a new stream of the device (torch.cuda.Stream()).
func (a *CachingAllocator) NewStream() Stream {
	a.lastStream++
	return a.lastStream
}

// CurrentStream is the stream allocations are made on.
func (a *CachingAllocator) CurrentStream() Stream { return a.cur }

// SetCurrentStream makes s the current stream (torch.cuda.set_stream)
// and returns the previous one. It fails for a stream the device does not
// have.
func (a *CachingAllocator) SetCurrentStream(s Stream) (Stream, error) {
	if s < 0 || s > a.lastStream {
		return a.cur, fmt.Errorf("%s: no stream %d", a.dev.Name(), s)
	}
	prev := a.cur
	a.cur = s
	return prev, nil
}

// RecordStream notes that stream s uses b (Tensor.record_stream): when b
// is freed it is not reused until s's work so far is done. Recording b's
// own stream does nothing, as in PyTorch.
func (a *CachingAllocator) RecordStream(b *Block, s Stream) error {
	cb, ok := b.impl.(*cblock)
	if !ok {
		if _, zero := b.impl.(zeroBlock); zero {
			return nil // an empty tensor holds no block
		}
		return fmt.Errorf("%s: record_stream of a block this allocator does not hold", a.dev.Name())
	}
	if cb.seg == nil || cb.seg.owner != a || !cb.allocated {
		return fmt.Errorf("%s: record_stream of a block this allocator does not hold", a.dev.Name())
	}
	if s < 0 || s > a.lastStream {
		return fmt.Errorf("%s: no stream %d", a.dev.Name(), s)
	}
	if s == cb.stream {
		return nil
	}
	for _, u := range cb.uses {
		if u == s {
			return nil
		}
	}
	cb.uses = append(cb.uses, s)
	return nil
}

// SynchronizeStream waits for stream s (stream.synchronize()): the
// events recorded on it so far are complete; the blocks they free return
// to the pool at the next Malloc, as PyTorch's process_events frees them.
func (a *CachingAllocator) SynchronizeStream(s Stream) {
	if a.synced == nil {
		a.synced = map[Stream]uint64{}
	}
	a.clock++
	a.synced[s] = a.clock
}

// Synchronize waits for the whole device (torch.cuda.synchronize()).
func (a *CachingAllocator) Synchronize() {
	a.clock++
	a.syncedAll = a.clock
}

// PendingFrees is the number of freed blocks that wait for other streams'
// events, and their bytes.
func (a *CachingAllocator) PendingFrees() (n int, bytes uint64) {
	seen := map[*cblock]bool{}
	for _, e := range a.events {
		if !seen[e.block] {
			seen[e.block] = true
			n++
			bytes += e.block.size
		}
	}
	return n, bytes
}

// StreamsUsed reports whether anything but the default stream was made
// current or recorded (record and replay do not model streams).
func (a *CachingAllocator) StreamsUsed() bool { return a.lastStream > 0 }

// insertEvents records an event on each stream that used b and makes b
// wait for them outside the pool.
func (a *CachingAllocator) insertEvents(b *cblock) {
	for _, s := range b.uses {
		a.clock++
		a.events = append(a.events, streamEvent{stream: s, at: a.clock, block: b})
		b.pending++
	}
	b.uses = nil
}

// complete reports whether event e is done (see Stream).
func (a *CachingAllocator) complete(e streamEvent) bool {
	return a.syncedAll > e.at || a.synced[e.stream] > e.at
}

// processEvents frees the blocks whose events are all complete
// (process_events, at the start of every Malloc). Events of one stream
// complete in order, so a stream's first incomplete event ends its scan.
func (a *CachingAllocator) processEvents() {
	if len(a.events) == 0 {
		return
	}
	blocked := map[Stream]bool{}
	kept := a.events[:0]
	var done []*cblock
	for _, e := range a.events {
		if blocked[e.stream] || !a.complete(e) {
			blocked[e.stream] = true
			kept = append(kept, e)
			continue
		}
		if e.block.pending--; e.block.pending == 0 {
			done = append(done, e.block)
		}
	}
	clear(a.events[len(kept):])
	a.events = kept
	for _, b := range done {
		a.freeBlock(b)
	}
}

// synchronizeAndFreeEvents waits for every event and frees their blocks
// (before the cache is released: empty_cache, an allocation's retry).
func (a *CachingAllocator) synchronizeAndFreeEvents() {
	events := a.events
	a.events = nil
	for _, e := range events {
		if e.block.pending--; e.block.pending == 0 {
			a.freeBlock(e.block)
		}
	}
}

// cloneStreams copies a's streams and events into c, whose blocks waiting
// for events are clones[a's block].
func (c *CachingAllocator) cloneStreams(a *CachingAllocator, clones map[*cblock]*cblock) {
	c.cur, c.lastStream, c.clock, c.syncedAll = a.cur, a.lastStream, a.clock, a.syncedAll
	if a.synced != nil {
		c.synced = make(map[Stream]uint64, len(a.synced))
		for s, t := range a.synced {
			c.synced[s] = t
		}
	}
	for _, e := range a.events {
		c.events = append(c.events, streamEvent{stream: e.stream, at: e.at, block: clones[e.block]})
	}
}
