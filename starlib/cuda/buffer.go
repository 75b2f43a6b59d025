package cuda

import (
	"errors"
	"fmt"

	"go.starlark.net/starlark"

	"github.com/memsh/memsh/backend"
	"github.com/memsh/memsh/env"
)

// Buffer is a raw device allocation from cuda.malloc or gpu.leave_free:
// .nbytes, .device,
// .free(). Its memory is freed by .free() or when no value refers to it.
type Buffer struct {
	mem *backend.Memory
	mgr *backend.Manager
}

var _ env.Holder = (*Buffer)(nil)

// NewBuffer returns the buffer value for memory obtained from m (used by
// cuda.malloc and gpu.leave_free).
func NewBuffer(mem *backend.Memory, m *backend.Manager) *Buffer { return &Buffer{mem: mem, mgr: m} }

// HeldMemory implements env.Holder.
func (b *Buffer) HeldMemory() *backend.Memory { return b.mem }

func (b *Buffer) String() string {
	state := ""
	if b.mem.Released() {
		state = ", freed"
	}
	return fmt.Sprintf("<buffer %s on %s%s>", backend.FormatBytes(int64(b.mem.Size())), b.mem.Device(), state)
}
func (b *Buffer) Type() string          { return "buffer" }
func (b *Buffer) Freeze()               {}
func (b *Buffer) Truth() starlark.Bool  { return true }
func (b *Buffer) Hash() (uint32, error) { return 0, errors.New("unhashable type: buffer") }

// AttrNames implements starlark.HasAttrs.
func (b *Buffer) AttrNames() []string { return []string{"device", "free", "nbytes"} }

// Attr implements starlark.HasAttrs.
func (b *Buffer) Attr(name string) (starlark.Value, error) {
	switch name {
	case "nbytes":
		return starlark.MakeUint64(b.mem.Size()), nil
	case "device":
		return starlark.String(b.mem.Device()), nil
	case "free":
		return starlark.NewBuiltin("buffer.free", b.free).BindReceiver(b), nil
	}
	return nil, nil
}

func (b *Buffer) free(thread *starlark.Thread, fn *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	if err := starlark.UnpackArgs(fn.Name(), args, kwargs); err != nil {
		return nil, err
	}
	if err := b.mem.Err(); err != nil {
		return nil, fmt.Errorf("%s: %v", fn.Name(), err)
	}
	b.mgr.Release(b.mem, "freed by buffer.free()")
	return starlark.None, nil
}

// malloc(nbytes, device=None) allocates nbytes (an int >= 0) on a GPU
// through the caching allocator and returns a buffer.
func mallocBuiltin(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	var nbytes starlark.Int
	var dev starlark.Value
	if err := starlark.UnpackArgs(b.Name(), args, kwargs, "nbytes", &nbytes, "device?", &dev); err != nil {
		return nil, err
	}
	n, ok := nbytes.Uint64()
	if !ok || n > 1<<62 {
		return nil, fmt.Errorf("%s: for parameter nbytes: %s is not a size in bytes (want 0 <= nbytes <= 2^62)", b.Name(), nbytes)
	}
	m, err := manager(thread, b)
	if err != nil {
		return nil, err
	}
	a, err := Resolve(m, b.Name(), "device", dev)
	if err != nil {
		return nil, err
	}
	mem, err := m.AllocOn(a, n)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", b.Name(), err)
	}
	return &Buffer{mem: mem, mgr: m}, nil
}
