package backend

// Block is one allocation handed out by an Allocator.
type Block struct {
	Ptr       uintptr // device address
	Host      []byte  // CPU view of the Size bytes, nil if not host-accessible
	Size      uint64  // bytes the block occupies (after rounding); what allocated_bytes counts
	Requested uint64  // bytes the caller asked for; what requested_bytes counts

	// fields private to the allocator that produced the block
	impl any
}

// Allocator hands out Blocks on one Device and keeps PyTorch's statistics.
// Implementations: CachingAllocator (GPUs, PyTorch's CUDA caching
// allocator) and backend/host's allocator (host RAM, no caching, as
// PyTorch's CPU allocator).
type Allocator interface {
	Device() Device
	// Malloc returns a block of at least size bytes (size may be 0: a
	// zero-size block with no memory). On failure it returns an *OOMError.
	Malloc(size uint64) (*Block, error)
	// TryMalloc is Malloc except that a failure is not counted in num_ooms:
	// the Manager's first attempt, after which it reclaims and calls Malloc.
	TryMalloc(size uint64) (*Block, error)
	// Free returns a block to the allocator. Freeing twice panics.
	Free(b *Block)
	// RoundSize is the number of bytes a request of size bytes will count in
	// allocated_bytes (PyTorch: rounded up to a multiple of 512).
	RoundSize(size uint64) uint64
	// Allocated is allocated_bytes.all.current: bytes in blocks handed out.
	Allocated() uint64
	// Reserved is reserved_bytes.all.current: bytes held from the device.
	Reserved() uint64
	// EmptyCache releases every cached segment that holds no allocated block.
	EmptyCache()
	// Stats returns torch.cuda.memory_stats()'s keys and values.
	Stats() map[string]int64
	// ResetPeakStats resets the ".peak" entries of Stats to their current
	// values, as torch.cuda.reset_peak_memory_stats.
	ResetPeakStats()
	// Peaks is the set of independent peak counters over this allocator.
	Peaks() *PeakSet
}
