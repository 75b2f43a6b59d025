// Package backend holds what memsh's memory model is made of: the Device
// interface (raw device memory, as cuMemAlloc/cuMemFree are to CUDA), the
// Allocator interface with a PyTorch-style caching allocator over a Device,
// exact and concurrent peak counters, and the Manager: the reclaim registry
// that owns every tensor allocation of a Session through weak pointers and
// frees what Starlark can no longer reach, synchronously.
//
// All sizes are in bytes. Backends live in sub-packages: backend/sim (the
// simulated GPU), backend/host (host RAM: process RSS, peak RSS and the
// allocator for "cpu" tensors).
package backend

import (
	"errors"
	"fmt"
)

// DeviceMem is one raw device allocation.
type DeviceMem struct {
	Ptr  uintptr // device address
	Host []byte  // the same bytes as seen by the CPU, or nil if the device memory is not host-accessible
}

// Device is raw memory on one device. Implementations: backend/sim (simulated
// GPU), backend/host (host RAM for "cpu" tensors) and, later, backend/cuda.
// A Device is used from one goroutine at a time (the Manager serialises).
type Device interface {
	// Name is the PyTorch device string: "cpu", "cuda:0", "cuda:1", ...
	Name() string
	// Description is a human name: "simulated GPU (16.00 GiB)", "NVIDIA H200".
	Description() string
	// Kind is the backend serving it: "sim", "cuda" or "cpu".
	Kind() string
	// MemGetInfo returns the device-wide free and total bytes, as cuMemGetInfo.
	MemGetInfo() (free, total uint64, err error)
	// Malloc allocates size bytes (size > 0). When the device has no room it
	// returns an error wrapping ErrDeviceFull.
	Malloc(size uint64) (DeviceMem, error)
	// Free releases memory returned by Malloc; size is the size passed to Malloc.
	Free(m DeviceMem, size uint64) error
}

// ErrDeviceFull is wrapped by Device.Malloc errors that mean "no room".
var ErrDeviceFull = errors.New("device memory exhausted")

// OOMError is the out-of-memory error of an Allocator, worded like PyTorch's
// torch.cuda.OutOfMemoryError (PyTorch 2.x's message, every sentence, with
// memsh named where PyTorch names itself), so that people and log parsers
// find the same fields.
type OOMError struct {
	Device    string // "cuda:0", "cpu"
	Index     int    // the GPU's ordinal, as in "GPU 0"; -1 for host memory
	Requested uint64 // bytes the allocator tried to obtain: the segment size for a GPU, as PyTorch reports it (its alloc_size); the request for host memory
	Total     uint64 // device capacity
	Free      uint64 // device-wide free bytes at the time of the failure
	Allocated uint64 // bytes allocated by memsh's allocator on the device
	Reserved  uint64 // bytes reserved (held in segments) by memsh's allocator
	// ProcessUsed is the device memory this process uses, memsh's and
	// anything else's (the CUDA context, a simulator's ctx=), when known
	// (ProcessKnown): PyTorch's "Including non-PyTorch memory, this
	// process has ... memory in use", a sentence it too leaves out when it
	// cannot tell.
	ProcessUsed  uint64
	ProcessKnown bool
}

// ProcessMemory is implemented by devices that know how much of their
// memory this process uses (see OOMError.ProcessUsed).
type ProcessMemory interface {
	ProcessUsed() (used uint64, ok bool)
}

// OOMAdvice is the OOM message's advice sentence. PyTorch's suggests
// PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True; memsh's allocator has
// no expandable segments (nor max_split_size), so it says what memsh
// offers instead.
const OOMAdvice = "If reserved but unallocated memory is large, memsh's allocator has no expandable_segments setting: " +
	"free or reorder long-lived tensors (cuda.memory_summary() and cuda.dump_snapshot() show the segments) to avoid fragmentation."

// OOMDocs is the closing sentence of PyTorch's message, kept as it is.
const OOMDocs = "See documentation for Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"

func (e *OOMError) Error() string {
	if e.Index < 0 {
		return fmt.Sprintf("CPU out of memory. Tried to allocate %s. Of the allocated memory %s is allocated by memsh.",
			FormatSize(e.Requested), FormatSize(e.Allocated))
	}
	unalloc := uint64(0)
	if e.Reserved > e.Allocated {
		unalloc = e.Reserved - e.Allocated
	}
	proc := ""
	if e.ProcessKnown {
		proc = fmt.Sprintf("Including non-memsh memory, this process has %s memory in use. ", FormatSize(e.ProcessUsed))
	}
	return fmt.Sprintf("CUDA out of memory. Tried to allocate %s. GPU %d has a total capacity of %s of which %s is free. %s"+
		"Of the allocated memory %s is allocated by memsh, and %s is reserved by memsh but unallocated. %s  %s",
		FormatSize(e.Requested), e.Index, FormatSize(e.Total), FormatSize(e.Free), proc,
		FormatSize(e.Allocated), FormatSize(unalloc), OOMAdvice, OOMDocs)
}

// IsOOM reports whether err is (or wraps) an *OOMError.
func IsOOM(err error) bool {
	var o *OOMError
	return errors.As(err, &o)
}

// FormatSize prints a byte count exactly as PyTorch's allocator messages
// do (c10's format_size): "N bytes" up to 1 KiB, then "%.2f KiB" up to
// 1 MiB, "%.2f MiB" up to 1 GiB, and "%.2f GiB" above (so 1 GiB prints as
// "1024.00 MiB", as in PyTorch).
func FormatSize(n uint64) string {
	const (
		kib = 1 << 10
		mib = 1 << 20
		gib = 1 << 30
	)
	switch {
	case n <= kib:
		return fmt.Sprintf("%d bytes", n)
	case n <= mib:
		return fmt.Sprintf("%.2f KiB", float64(n)/kib)
	case n <= gib:
		return fmt.Sprintf("%.2f MiB", float64(n)/mib)
	default:
		return fmt.Sprintf("%.2f GiB", float64(n)/gib)
	}
}

// FormatBytes prints a byte count with IEC units and two decimals
// ("512.00 MiB", "1.50 GiB"); counts below 1 KiB print as "N B". Negative
// counts keep their sign. It is the unit style of every memsh report and of
// the fmt_bytes builtin.
func FormatBytes(n int64) string {
	sign := ""
	u := uint64(n)
	if n < 0 {
		sign, u = "-", uint64(-n)
	}
	if u < 1024 {
		return fmt.Sprintf("%s%d B", sign, u)
	}
	units := []string{"KiB", "MiB", "GiB", "TiB", "PiB"}
	v := float64(u) / 1024
	i := 0
	for v >= 1024 && i < len(units)-1 {
		v /= 1024
		i++
	}
	return fmt.Sprintf("%s%.2f %s", sign, v, units[i])
}
