package backend

import (
	"fmt"
	"unsafe"
)

// Memory is the handle to one allocation owned by a Manager: what a tensor's
// storage or a cuda.malloc buffer holds. The reach walk finds the handles
// the Session's values still reach (reach.go); before a reclaim asks the
// Go collector instead, the Manager keeps only a weak pointer to each
// handle (entry, settle), so when the last Starlark value referring to it
// becomes unreachable the reclaim frees the allocation.
//
// Code holding a *Memory must not let the record escape to anything the
// Manager keeps strongly.
type Memory struct {
	rec *record
	// A weak pointer to a handle (made before a collection that judges
	// it) is recorded by the Go runtime in a list per span of memory,
	// kept in address order; an 8-byte handle shares its span with 1,023
	// others, and each new weak pointer walks that list. 64 bytes (128
	// per span) made an op on a meta device 15 % faster when every
	// allocation made one (bench/README.md).
	_ [7]uintptr
}

// record is the Manager's strong side of an allocation. It must never point
// back to its Memory handle.
type record struct {
	owner *Manager
	mark  uint64 // the Manager's reach epoch in which a reach walk last found the record
	gen   uint64 // the generation of the frame credited with reaching it (Frames), 0 if none
	frame int32  // that frame's number
	// freed and dropped sit in the first cache line with what a reach
	// walk's visit reads (owner, mark, gen, frame): one line per record
	freed    bool
	dropped  bool // the Go code that made it let go of it (Manager.Dropped)
	deferred bool // made on the meta device: no block until Regrow (AllocDeferred)
	alloc    Allocator
	block    *Block
	device   string
	nbytes   uint64    // requested bytes
	seq      uint64    // allocation sequence number within the Manager (1, 2, ...)
	stamp    uint64    // the stamp clock when it was made (reach.go)
	pcs      []uintptr // where it was allocated, with MEMSH_DEBUG_REACH=1 (reach.go)
	released string    // non-empty once freed explicitly: why
	library  string    // non-empty for memory a library keeps for the process: what (SetLibrary)
}

// Bytes returns the CPU view of the allocation's nbytes bytes, or nil when the
// memory is not host-accessible (a real GPU, meta mode) or the size is 0.
// It returns nil after the memory was released; callers check Err first.
func (m *Memory) Bytes() []byte {
	r := m.rec
	if r.freed || r.block == nil || r.block.Host == nil {
		return nil
	}
	return r.block.Host[:r.nbytes:r.nbytes]
}

// Pointer returns the address of the first byte of a host-accessible
// allocation (nil otherwise). It is a convenience for typed views such as
// unsafe.Slice((*float32)(m.Pointer()), n).
func (m *Memory) Pointer() unsafe.Pointer {
	b := m.Bytes()
	if len(b) == 0 {
		return nil
	}
	return unsafe.Pointer(&b[0])
}

// HostAccessible reports whether Bytes gives the data (false on real GPUs and
// meta devices).
func (m *Memory) HostAccessible() bool {
	return m.rec.nbytes == 0 || (m.rec.block != nil && m.rec.block.Host != nil)
}

// Ptr returns the device address (0 for a zero-size allocation).
func (m *Memory) Ptr() uintptr {
	if m.rec.block == nil {
		return 0
	}
	return m.rec.block.Ptr
}

// Size returns the requested size in bytes.
func (m *Memory) Size() uint64 { return m.rec.nbytes }

// BlockSize returns the bytes the allocation counts in allocated_bytes (the
// allocator's rounded block size).
func (m *Memory) BlockSize() uint64 {
	if m.rec.block == nil {
		return 0
	}
	return m.rec.block.Size
}

// Device returns the PyTorch device string of the allocation ("cpu", "cuda:0").
func (m *Memory) Device() string { return m.rec.device }

// Seq returns the allocation's sequence number in its Manager: allocations
// made later have larger numbers. Experiments use it to tell which live
// allocations they own.
func (m *Memory) Seq() uint64 { return m.rec.seq }

// Err returns nil while the memory is usable, otherwise an error saying why
// it was released.
func (m *Memory) Err() error {
	if m.rec.released != "" {
		return fmt.Errorf("memory on %s was %s", m.rec.device, m.rec.released)
	}
	return nil
}

// Deferred reports whether the memory was made on the meta device and
// has no block yet (Manager.AllocDeferred).
func (m *Memory) Deferred() bool { return m.rec.deferred }

// Released reports whether the memory was freed explicitly.
func (m *Memory) Released() bool { return m.rec.freed }

// SetLibrary marks the allocation as memory a library keeps for the rest
// of the process, as PyTorch's cuBLAS workspaces: what says which
// ("cuBLAS workspace"). Experiments and sweeps do not count it as their
// own: no experiment leaked it and no trial failed to give it back.
func (m *Memory) SetLibrary(what string) { m.rec.library = what }

// Library returns what SetLibrary said, or "".
func (m *Memory) Library() string { return m.rec.library }
