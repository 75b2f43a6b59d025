package gpu

import (
	"errors"
	"fmt"

	"go.starlark.net/starlark"

	"github.com/memsh/memsh/backend"
	"github.com/memsh/memsh/starlib/env"
)

// Buffer is the raw device allocation leave_free returns: .nbytes,
// .device, .free(). Its memory is freed by .free() or when no value refers
// to it (like cuda.malloc's buffers).
type Buffer struct {
	mem *backend.Memory
	mgr *backend.Manager
}

var _ env.Holder = (*Buffer)(nil)

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

const (
	segmentGrain = 2 << 20  // large segments are requests rounded up to this
	minExact     = 10 << 20 // from here on a request gets a segment of its own size
)

// leave_free(nbytes, id=None) empties the device's cache, then allocates
// one buffer through the caching allocator so that the device's free
// memory (as mem().free reports it) ends between nbytes and nbytes + 2 MiB:
// the buffer is free - nbytes rounded down to 2 MiB, the allocator's
// segment granularity. When that is less than 10 MiB (a request the
// allocator would serve from a 20 MiB segment), or when free is already
// at most nbytes, the buffer is empty (0 bytes). Free the buffer, or drop
// it, to give the memory back.
func leaveFree(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	var nbytesV starlark.Int
	var idV starlark.Value
	if err := starlark.UnpackArgs(b.Name(), args, kwargs, "nbytes", &nbytesV, "id?", &idV); err != nil {
		return nil, err
	}
	nbytes, ok := nbytesV.Uint64()
	if !ok || nbytes > 1<<62 {
		return nil, fmt.Errorf("%s: for parameter nbytes: %s is not a size in bytes (want 0 <= nbytes <= 2^62)", b.Name(), nbytesV)
	}
	m, a, _, err := device(thread, b, idV)
	if err != nil {
		return nil, err
	}
	a.EmptyCache()
	mm, err := memoryOf(a.Device())
	if err != nil {
		return nil, memoryErr(b, err)
	}
	var req uint64
	if mm.free > nbytes {
		req = (mm.free - nbytes) &^ (segmentGrain - 1)
	}
	if req < minExact {
		req = 0
	}
	mem, err := m.AllocOn(a, req)
	if err != nil && backend.IsOOM(err) && req >= minExact+64<<20 {
		// The driver's free figure was not all allocatable in one piece.
		mem, err = m.AllocOn(a, req-64<<20)
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", b.Name(), err)
	}
	return &Buffer{mem: mem, mgr: m}, nil
}
