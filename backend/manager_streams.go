package backend

import "fmt"

// StreamAllocator is an Allocator with CUDA streams: the caching
// allocator (caching_streams.go has the semantics).
type StreamAllocator interface {
	Allocator
	NewStream() Stream
	CurrentStream() Stream
	SetCurrentStream(s Stream) (prev Stream, err error)
	RecordStream(b *Block, s Stream) error
	SynchronizeStream(s Stream)
	Synchronize()
}

var _ StreamAllocator = (*CachingAllocator)(nil)

// Streams runs f with device's allocator, under the Manager's lock; it
// fails for a device without streams (the host, a GPU without a caching
// allocator).
func (m *Manager) Streams(device string, f func(StreamAllocator) error) error {
	a, err := m.Allocator(device)
	if err != nil {
		return err
	}
	sa, ok := a.(StreamAllocator)
	if !ok {
		return fmt.Errorf("%s has no CUDA streams", a.Device().Name())
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return f(sa)
}

// RecordStream notes that stream s of h's device uses h
// (Tensor.record_stream): freed, its block is not reused before s's work
// so far is done.
func (m *Manager) RecordStream(h *Memory, s Stream) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	r := h.rec
	if r.freed {
		return fmt.Errorf("record_stream of memory already freed")
	}
	sa, ok := r.alloc.(StreamAllocator)
	if !ok {
		return fmt.Errorf("record_stream: %s has no CUDA streams", r.device)
	}
	return sa.RecordStream(r.block, s)
}
