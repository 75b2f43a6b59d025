package host

/*
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#if defined(__GLIBC__)
#include <malloc.h>
#endif

// memsh_set_mmap_threshold makes glibc serve every request of at least
// threshold bytes with its own mmap, unmapped again by free. Setting the
// threshold also disables glibc's dynamic threshold adjustment.
static int memsh_set_mmap_threshold(int threshold) {
#if defined(__GLIBC__) && defined(M_MMAP_THRESHOLD)
	return mallopt(M_MMAP_THRESHOLD, threshold);
#else
	return 0;
#endif
}

static int memsh_trim(void) {
#if defined(__GLIBC__)
	return malloc_trim(0);
#else
	return 0;
#endif
}

typedef struct {
	void *p;
	int err;
} memsh_block;

// memsh_alloc returns size bytes aligned to 64, or NULL and the error.
static memsh_block memsh_alloc(size_t size) {
	memsh_block b = {NULL, 0};
	b.err = posix_memalign(&b.p, 64, size);
	if (b.err != 0) {
		b.p = NULL;
	}
	return b;
}

static void memsh_free(uintptr_t p) {
	free((void *)p);
}
*/
import "C"

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"

	"github.com/memsh/memsh/backend"
	"github.com/memsh/memsh/backend/internal/pages"
)

// MmapThreshold is the size from which glibc serves a block with its own
// mmap (and unmaps it at free). The package sets it once, before its first
// allocation.
const MmapThreshold = 64 << 10

// Alignment is the alignment of every block returned by Device.Malloc (a
// cache line, enough for any dtype and for SIMD loads).
const Alignment = 64

var mallocSetup sync.Once

func setupMalloc() {
	mallocSetup.Do(func() { C.memsh_set_mmap_threshold(C.int(MmapThreshold)) })
}

// Trim returns the retained blocks (see RetainMin) to the operating system
// and asks the C allocator to return the free memory it still holds
// (glibc's malloc_trim(0); that part is a no-op elsewhere).
func Trim() {
	release(retained.drain())
	C.memsh_trim()
}

// Device is host RAM as a backend.Device: the memory of "cpu" tensors,
// allocated outside the Go heap and returned to the operating system when
// freed, but for the freed blocks retained for reuse as glibc would retain
// them under PyTorch (see RetainMin). The zero value is ready to use; the
// retained blocks are the process's, shared by every Device.
//
// A meta Device (NewMetaDevice) is the host of a session whose GPUs are
// simulated in meta mode: its blocks have sizes and addresses but no
// memory, so a "cpu" tensor there has a shape, a dtype and a size but no
// values, as the meta GPU's tensors (a CPU-offloaded 8B model's states
// cost the process nothing).
type Device struct {
	meta bool
	next atomic.Uintptr // a meta device's next address
}

var _ backend.Device = (*Device)(nil)

// NewDevice returns the host device.
func NewDevice() *Device {
	setupMalloc()
	return &Device{}
}

// NewMetaDevice returns a host device that keeps no data (see Device).
func NewMetaDevice() *Device {
	d := &Device{meta: true}
	d.next.Store(metaBase)
	return d
}

// metaBase is a meta device's first address (any nonzero, 64-byte aligned
// value: the addresses are only distinct).
const metaBase = 1 << 40

// Meta reports whether the device keeps no data (NewMetaDevice).
func (d *Device) Meta() bool { return d.meta }

// Name is "cpu".
func (*Device) Name() string { return "cpu" }

// Kind is "cpu".
func (*Device) Kind() string { return "cpu" }

// Description is "host RAM (<MemTotal>)", e.g. "host RAM (23.54 GiB)";
// a meta device's ends "meta: no values".
func (d *Device) Description() string {
	if d.meta {
		return "host RAM (" + backend.FormatBytes(int64(Total())) + "; meta: no values)"
	}
	return "host RAM (" + backend.FormatBytes(int64(Total())) + ")"
}

// MemGetInfo returns MemAvailable and MemTotal from /proc/meminfo.
func (*Device) MemGetInfo() (free, total uint64, err error) {
	return memInfo()
}

// Malloc allocates size bytes aligned to 64 bytes: blocks of 2 MiB or more
// are mappings of their own, 2 MiB aligned and advised to use transparent
// huge pages (backend/internal/pages); smaller ones come from
// posix_memalign. A block of RetainMin to RetainMax bytes is a retained
// block of its size class when there is one (see RetainMin), and is
// allocated with its whole class otherwise. The bytes are not zeroed. When
// the memory cannot be had even after the retained blocks are released, the
// error wraps backend.ErrDeviceFull. A meta device returns an address and
// no memory.
func (d *Device) Malloc(size uint64) (backend.DeviceMem, error) {
	if size == 0 {
		return backend.DeviceMem{}, errors.New("host: Malloc of 0 bytes")
	}
	if size > uint64(^uint(0)>>1) {
		return backend.DeviceMem{}, fmt.Errorf("host: cannot allocate %d bytes: %w", size, backend.ErrDeviceFull)
	}
	if d.meta {
		n := uintptr((size + Alignment - 1) &^ (Alignment - 1))
		return backend.DeviceMem{Ptr: d.next.Add(n) - n}, nil
	}
	n := size
	if class := retainClass(size); class != 0 {
		if b, ok := retained.take(class); ok {
			return deviceMem(b, size), nil
		}
		n = class
	}
	b, err := allocMem(n)
	if err != nil && Retained() > 0 {
		release(retained.drain())
		b, err = allocMem(n)
	}
	if err != nil {
		return backend.DeviceMem{}, fmt.Errorf("host: cannot allocate %d bytes: %w: %w", size, backend.ErrDeviceFull, err)
	}
	return deviceMem(b, size), nil
}

// deviceMem is the DeviceMem of size bytes at the start of block b.
func deviceMem(b []byte, size uint64) backend.DeviceMem {
	return backend.DeviceMem{Ptr: uintptr(unsafe.Pointer(&b[0])), Host: b[:size:size]}
}

// allocMem allocates n bytes: a huge-page mapping of its own from 2 MiB, or
// posix_memalign's.
func allocMem(n uint64) ([]byte, error) {
	if n >= pages.HugePage {
		// Large blocks get their own huge-page mapping: a first touch
		// faults in 2 MiB, not 4 KiB, and releasing unmaps at once.
		return pages.MapReserved(n)
	}
	setupMalloc()
	b := C.memsh_alloc(C.size_t(n))
	if b.p == nil {
		return nil, syscall.Errno(b.err)
	}
	return unsafe.Slice((*byte)(b.p), int(n)), nil
}

// freeMem releases a block that allocMem returned (all of it).
func freeMem(b []byte) error {
	if len(b) >= pages.HugePage {
		return pages.Unmap(b)
	}
	C.memsh_free(C.uintptr_t(uintptr(unsafe.Pointer(&b[0]))))
	return nil
}

// Free releases memory returned by Malloc(size): a block of RetainMin to
// RetainMax bytes is retained for reuse (see RetainMin), any other goes
// back to the C allocator and, from MmapThreshold bytes, to the operating
// system.
func (d *Device) Free(m backend.DeviceMem, size uint64) error {
	if d.meta && m.Ptr != 0 {
		return nil
	}
	if m.Ptr == 0 || len(m.Host) == 0 {
		return errors.New("host: Free of a nil pointer")
	}
	if class := retainClass(size); class != 0 {
		release(retained.keep(unsafe.Slice(&m.Host[0], class), class))
		return nil
	}
	return freeMem(m.Host[:size:size])
}
