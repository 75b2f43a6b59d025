package tensor

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/memsh/memsh/backend"
)

// cuBLAS workspaces, as PyTorch 2.x keeps them.
//
// PyTorch gives each cuBLAS handle a workspace allocated through the CUDA
// caching allocator (at::cuda::getCurrentCUDABlasHandle, CublasHandlePool.cpp),
// so it shows in memory_allocated(): getChosenWorkspaceSize() bytes, 32 MiB
// on sm90 (":4096:8") and 8 MiB + 128 KiB elsewhere (":4096:2:16:8"), unless
// CUBLAS_WORKSPACE_CONFIG says otherwise. A handle belongs to a thread: the
// Python thread's is made at its first matrix product, and the autograd
// engine's device thread has its own, made at the first matrix product of
// a backward. A cuBLASLt call (addmm with a bias vector: nn.Linear) also
// takes a cuBLASLt workspace, 1 MiB by default (CUBLASLT_WORKSPACE_SIZE),
// per thread, after the cuBLAS one. Neither is freed: empty_cache() keeps
// them (they are allocated, not cached).
//
// Creating the handle also takes device memory outside the allocator: on an
// H100, total - free - memory_reserved() grew by 71,303,168 bytes during the
// first forward and by exactly 67,108,864 during the first backward, whose
// only new thing is the autograd thread's handle (BLASHandleDevice).
//
// torch 2.11's allocator trace on an H100 shows each: the first forward
// nn.Linear allocates its output, then 33,554,432 bytes, then 1,048,576;
// the first backward matrix product allocates its output, then
// 33,554,432; a checkpointed block's recomputation (in the backward)
// allocates 1,048,576 at its first nn.Linear (bench/gpu/torch_fit.py
// trace).
//
// A simulated GPU models them when its spec gives the sizes (the presets
// do: backend/sim); other devices (plain sim:SIZE, real GPUs, whose
// workspaces memsh's own cuBLAS keeps outside the allocator) have none.

// BLASWorkspaceDevice is implemented by a device whose PyTorch cuBLAS and
// cuBLASLt workspace sizes are known (backend/sim.Device); 0 means none.
type BLASWorkspaceDevice interface {
	BLASWorkspaces() (cublas, cublasLt uint64)
}

// BLASHandleDevice is implemented by a device that knows what creating a
// cuBLAS handle takes from it outside the allocator (backend/sim presets):
// memsh takes it when a thread's first matrix product creates the handle,
// before the workspace.
type BLASHandleDevice interface {
	BLASHandleBytes() uint64
	TakeDriverMemory(n uint64) error
}

// blasKey names one workspace: a device, the thread (the autograd
// engine's or the caller's) and the library.
type blasKey struct {
	device   string
	backward bool
	lt       bool
}

// blasWorkspace allocates, the first time on this device and thread, the
// cuBLAS workspace (and with lt, then the cuBLASLt one) that PyTorch would
// allocate for a matrix product on device: call it after the op allocated
// its output. It does nothing where the device has no workspace sizes.
func (c *Context) blasWorkspace(device string, lt bool) error {
	if c == nil || c.Manager == nil || c.blas == nil {
		return nil
	}
	if err := c.blasWorkspaceOf(device, false); err != nil || !lt {
		return err
	}
	return c.blasWorkspaceOf(device, true)
}

func (c *Context) blasWorkspaceOf(device string, lt bool) error {
	key := blasKey{device, c.blas.backward > 0, lt}
	if _, ok := c.blas.ws[key]; ok {
		return nil
	}
	a, d := c.deviceOf(device)
	wd, ok := d.(BLASWorkspaceDevice)
	if !ok {
		return nil
	}
	cublas, cublasLt := wd.BLASWorkspaces()
	size := cublas
	if lt {
		size = cublasLt
	}
	if size == 0 {
		return nil
	}
	if hd, ok := d.(BLASHandleDevice); ok && !lt && hd.BLASHandleBytes() > 0 && !c.blas.handles[key] {
		// The thread's cuBLAS handle first: memory the driver takes
		// outside the allocator (64 MiB on an H100 with torch 2.11). When
		// the device has too little left, cublasCreate fails
		// (CUBLAS_STATUS_ALLOC_FAILED), which sweeps and trials count as
		// running out of memory, as Lightning's batch-size finder does.
		if err := hd.TakeDriverMemory(hd.BLASHandleBytes()); err != nil {
			free, total, _ := d.MemGetInfo()
			idx, _ := strconv.Atoi(strings.TrimPrefix(d.Name(), "cuda:"))
			return fmt.Errorf("creating a cuBLAS handle (CUBLAS_STATUS_ALLOC_FAILED): %w", &backend.OOMError{
				Device: d.Name(), Index: idx, Requested: hd.BLASHandleBytes(), Total: total, Free: free,
				Allocated: a.Allocated(), Reserved: a.Reserved()})
		}
		if c.blas.handles == nil {
			c.blas.handles = map[blasKey]bool{}
		}
		c.blas.handles[key] = true
	}
	m, err := c.Manager.AllocOn(a, size)
	if err != nil {
		return err
	}
	if lt {
		m.SetLibrary("cuBLASLt workspace")
	} else {
		m.SetLibrary("cuBLAS workspace")
	}
	if c.blas.ws == nil {
		c.blas.ws = map[blasKey]*backend.Memory{}
	}
	c.blas.ws[key] = m
	return nil
}

// LibraryMemory returns the allocations the Context made for libraries
// rather than tensors: the cuBLAS and cuBLASLt workspaces.
func (c *Context) LibraryMemory() []*backend.Memory {
	if c == nil || c.blas == nil {
		return nil
	}
	out := make([]*backend.Memory, 0, len(c.blas.ws))
	for _, m := range c.blas.ws {
		out = append(out, m)
	}
	return out
}

// EnterBackward marks the start of a backward pass (the autograd engine's
// thread, for the cuBLAS workspaces); the returned function marks its end.
// Backward passes nest (a checkpoint's recomputation runs inside one).
func (c *Context) EnterBackward() (leave func()) {
	if c == nil || c.blas == nil {
		return func() {}
	}
	c.blas.backward++
	return func() { c.blas.backward-- }
}

// blasState is the Context's part in the workspaces: shared with staging
// contexts (a pointer), as PyTorch's handle pool is per process.
type blasState struct {
	ws       map[blasKey]*backend.Memory
	handles  map[blasKey]bool // cuBLAS handles created (their device memory taken)
	backward int
}

// ClearBLASWorkspaces frees every cuBLAS and cuBLASLt workspace now, as
// PyTorch's torch._C._cuda_clearCublasWorkspaces() (at::cuda::
// clearCublasWorkspaces) does; the next matrix product of each thread
// allocates its workspace again, as in a fresh process. The handles stay:
// what creating them took outside the allocator is not given back. It
// returns the bytes freed.
func (c *Context) ClearBLASWorkspaces() uint64 {
	if c == nil || c.Manager == nil || c.blas == nil {
		return 0
	}
	var n uint64
	for k, m := range c.blas.ws {
		n += m.Size()
		c.Manager.Release(m, "freed by clear_cublas_workspaces()")
		delete(c.blas.ws, k)
	}
	return n
}
