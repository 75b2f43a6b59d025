package tensor

import "github.com/memsh/memsh/backend"

// A Storage is the memory of a tensor and of all its views: one
// *backend.Memory owned by the Context's Manager, and a version counter.
//
// The Storage does not own the memory: the Manager frees it at its next
// reclaim once no handle to the Memory is reachable (a Storage reachable
// from a live tensor is such a handle).
//
// The version counter counts in-place writes, as PyTorch's: every op that
// writes into an existing tensor (the methods ending in "_", the Out
// variants) bumps the counter of the tensor's Storage, which all views
// share. Autograd compares it with the version saved at record time.
type Storage struct {
	mem     *backend.Memory
	version uint64
}

func newStorage(m *backend.Memory) *Storage { return &Storage{mem: m} }

// Memory returns the allocation.
func (s *Storage) Memory() *backend.Memory { return s.mem }

// Version returns the number of in-place writes so far.
func (s *Storage) Version() uint64 { return s.version }

// BumpVersion records an in-place write.
func (s *Storage) BumpVersion() { s.version++ }

// Device returns the canonical device string of the memory.
func (s *Storage) Device() string { return s.mem.Device() }

// NBytes is the allocation's size in bytes.
func (s *Storage) NBytes() uint64 { return s.mem.Size() }
