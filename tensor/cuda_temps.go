package tensor

import "github.com/memsh/memsh/backend"

// cudaTemps allocates a CUDA kernel's own temporaries, as cudaTemporary
// does (only on simulated GPUs that model them: presets), when they are
// freed in an order other than the reverse of their allocation (CUDA's
// index_put_ frees a remainder before the product made from it). Every
// live one is held for the reach walk until freed or close.
type cudaTemps struct {
	t    *Tensor
	a    backend.Allocator
	base int // len(t.ctx.inFlightMem) when made
	live []*backend.Memory
	what []string
}

// newCUDATemps returns the temporaries of an op on t's device, or nil
// when the device does not model them (every method of a nil *cudaTemps
// does nothing).
func newCUDATemps(t *Tensor) *cudaTemps {
	a := presetAllocator(t)
	if a == nil {
		return nil
	}
	return &cudaTemps{t: t, a: a, base: len(t.ctx.inFlightMem)}
}

// take allocates n bytes and returns its handle (−1 when nothing was
// allocated).
func (c *cudaTemps) take(n uint64, what string) (int, error) {
	if c == nil || n == 0 {
		return -1, nil
	}
	m, err := c.t.ctx.Manager.AllocOn(c.a, n)
	if err != nil {
		return -1, err
	}
	c.live = append(c.live, m)
	c.what = append(c.what, what)
	c.rehold()
	return len(c.live) - 1, nil
}

// free releases the temporary of handle h.
func (c *cudaTemps) free(h int) {
	if c == nil || h < 0 || c.live[h] == nil {
		return
	}
	m := c.live[h]
	c.live[h] = nil
	c.rehold()
	c.t.ctx.Manager.Release(m, c.what[h])
}

// close releases the live temporaries, the latest first.
func (c *cudaTemps) close() {
	if c == nil {
		return
	}
	for h := len(c.live) - 1; h >= 0; h-- {
		c.free(h)
	}
}

// rehold makes the live temporaries the context's held raw allocations
// above base.
func (c *cudaTemps) rehold() {
	ctx := c.t.ctx
	clear(ctx.inFlightMem[c.base:])
	ctx.inFlightMem = ctx.inFlightMem[:c.base]
	for _, m := range c.live {
		if m != nil {
			ctx.inFlightMem = append(ctx.inFlightMem, m)
		}
	}
}
