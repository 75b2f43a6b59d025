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

// FreeStorage resizes t's storage to 0 bytes (untyped_storage().resize_(0)):
// its memory is freed now and every tensor viewing it shares the empty
// storage until AllocStorage; using one meanwhile is an error naming
// reason. FSDP2 does it to an unsharded parameter when it reshards.
func FreeStorage(t *Tensor, reason string) {
	if t.ctx != nil && t.ctx.Manager != nil {
		t.ctx.Manager.Release(t.mem, reason)
	}
}

// AllocStorage resizes t's storage, freed by FreeStorage, back to its
// size (untyped_storage().resize_(n)): a new allocation every view of it
// sees; its values are undefined until written.
func AllocStorage(t *Tensor) error {
	if t.ctx == nil || t.ctx.Manager == nil {
		return nil
	}
	return t.ctx.Manager.Regrow(t.mem)
}

// StorageFreed reports whether t's storage is resized to 0 bytes.
func StorageFreed(t *Tensor) bool { return t.mem != nil && t.mem.Released() }

// PreserveVersion runs f and puts t's version counter back as it was
// (torch.autograd._unsafe_preserve_version_counter): for writes autograd
// must not see, as FSDP2's copy of the all-gathered values into an
// unsharded parameter that saved tensors view.
func PreserveVersion(t *Tensor, f func() error) error {
	v := t.st.version
	err := f()
	t.st.version = v
	return err
}

// MetaDevice runs f with the tensors it makes on the meta device (as
// PyTorch's `with torch.device("meta"):` block, which torchtitan builds
// a model in before sharding it): each keeps its device, shape and dtype
// but has no memory and no values until Materialize — ops on it compute
// shapes only, as on a meta simulator.
func MetaDevice(c *Context, f func() error) error {
	c.MetaInit++
	defer func() { c.MetaInit-- }()
	return f()
}

// Deferred reports whether t was made on the meta device and has no
// memory yet.
func Deferred(t *Tensor) bool { return t.mem != nil && t.mem.Deferred() }

// Materialize gives a tensor made on the meta device its memory
// (Module.to_empty: uninitialized values); nothing for any other.
func Materialize(t *Tensor) error { return MaterializeOn(t, "") }

// MaterializeOn is Materialize on device ("": the one it was made for),
// as Module.to_empty(device=...) makes a meta tensor's storage there;
// the tensor and its views are then on that device.
func MaterializeOn(t *Tensor, device string) error {
	if !Deferred(t) || t.ctx == nil || t.ctx.Manager == nil {
		return nil
	}
	var a backend.Allocator
	if device != "" {
		d, err := t.ctx.device("to_empty", device)
		if err != nil {
			return err
		}
		if a, err = t.ctx.Manager.Allocator(d); err != nil {
			return err
		}
	}
	return t.ctx.Manager.RegrowOn(t.mem, a)
}
