package gpu

import (
	"fmt"

	"go.starlark.net/starlark"

	"github.com/memsh/memsh/backend"
	"github.com/memsh/memsh/starlib/cuda"
	"github.com/memsh/memsh/starlib/numarg"
)

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
	var nbytesV, idV starlark.Value
	if err := starlark.UnpackArgs(b.Name(), args, kwargs, "nbytes", &nbytesV, "id?", &idV); err != nil {
		return nil, err
	}
	nbytes, err := numarg.Size(b.Name(), "nbytes", nbytesV, numarg.MaxInt64)
	if err != nil {
		return nil, err
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
	return cuda.NewBuffer(mem, m), nil
}
