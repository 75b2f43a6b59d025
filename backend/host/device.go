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

// Trim asks the C allocator to return free memory it still holds to the
// operating system (glibc's malloc_trim(0)); a no-op elsewhere. Blocks of
// MmapThreshold bytes or more never need it.
func Trim() {
	C.memsh_trim()
}

// Device is host RAM as a backend.Device: the memory of "cpu" tensors,
// allocated on the C heap (outside the Go heap) and returned to the
// operating system when freed. The zero value is ready to use and Device
// holds no state, so any number of them may exist.
type Device struct{}

var _ backend.Device = (*Device)(nil)

// NewDevice returns the host device.
func NewDevice() *Device {
	setupMalloc()
	return &Device{}
}

// Name is "cpu".
func (*Device) Name() string { return "cpu" }

// Kind is "cpu".
func (*Device) Kind() string { return "cpu" }

// Description is "host RAM (<MemTotal>)", e.g. "host RAM (23.54 GiB)".
func (*Device) Description() string {
	return "host RAM (" + backend.FormatBytes(int64(Total())) + ")"
}

// MemGetInfo returns MemAvailable and MemTotal from /proc/meminfo.
func (*Device) MemGetInfo() (free, total uint64, err error) {
	return memInfo()
}

// Malloc allocates size bytes aligned to 64 bytes: blocks of 2 MiB or more
// are mappings of their own, 2 MiB aligned and advised to use transparent
// huge pages (backend/internal/pages); smaller ones come from
// posix_memalign. The bytes are not zeroed (blocks of MmapThreshold bytes or
// more are fresh pages and read as zero anyway). When the C allocator fails the error wraps
// backend.ErrDeviceFull.
func (*Device) Malloc(size uint64) (backend.DeviceMem, error) {
	if size == 0 {
		return backend.DeviceMem{}, errors.New("host: Malloc of 0 bytes")
	}
	if size > uint64(^uint(0)>>1) {
		return backend.DeviceMem{}, fmt.Errorf("host: cannot allocate %d bytes: %w", size, backend.ErrDeviceFull)
	}
	if size >= pages.HugePage {
		// Large blocks get their own huge-page mapping: a first touch
		// faults in 2 MiB, not 4 KiB, and Free unmaps at once.
		b, err := pages.MapReserved(size)
		if err != nil {
			return backend.DeviceMem{}, fmt.Errorf("host: cannot allocate %d bytes: %w: %w", size, backend.ErrDeviceFull, err)
		}
		return backend.DeviceMem{Ptr: uintptr(unsafe.Pointer(&b[0])), Host: b}, nil
	}
	setupMalloc()
	b := C.memsh_alloc(C.size_t(size))
	p := b.p
	if p == nil {
		return backend.DeviceMem{}, fmt.Errorf("host: cannot allocate %d bytes: %w: %w",
			size, backend.ErrDeviceFull, syscall.Errno(b.err))
	}
	return backend.DeviceMem{Ptr: uintptr(p), Host: unsafe.Slice((*byte)(p), int(size))}, nil
}

// Free releases memory returned by Malloc.
func (*Device) Free(m backend.DeviceMem, size uint64) error {
	if m.Ptr == 0 {
		return errors.New("host: Free of a nil pointer")
	}
	if size >= pages.HugePage {
		return pages.Unmap(m.Host[:size:size])
	}
	C.memsh_free(C.uintptr_t(m.Ptr))
	return nil
}
