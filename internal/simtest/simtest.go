// Package simtest gives the engine packages' tests a tensor Context on one
// simulated GPU behind a caching allocator, without a Session.
package simtest

import (
	"testing"

	"github.com/memsh/memsh/backend"
	"github.com/memsh/memsh/backend/host"
	"github.com/memsh/memsh/backend/sim"
	"github.com/memsh/memsh/tensor"
)

// New returns a Context on a simulated GPU of total bytes (meta: no
// values), its Manager (closed when the test ends) and the GPU's caching
// allocator.
func New(t testing.TB, total uint64, meta bool) (*tensor.Context, *backend.Manager, *backend.CachingAllocator) {
	dev := sim.New(sim.Spec{Count: 1, Total: total, Meta: meta})[0]
	gpu := backend.NewCachingAllocator(dev, 0)
	mgr := backend.NewManager(backend.Config{GPUs: []backend.Allocator{gpu}, Host: host.NewAllocator()})
	t.Cleanup(mgr.Close)
	return tensor.NewContext(mgr), mgr, gpu
}
