// Package pages maps anonymous memory for memsh's off-heap allocations:
// large mappings are 2 MiB aligned and advised to use transparent huge
// pages, so first touches fault in 2 MiB at a time, and unmapping returns
// the memory to the operating system at once.
package pages

import (
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

// HugePage is the size (and alignment) of a transparent huge page.
const HugePage = 2 << 20

// Map maps size bytes for simulated device memory, with MAP_NORESERVE:
// untouched pages cost nothing and the simulator enforces the capacity.
func Map(size uint64) ([]byte, error) { return mapBytes(size, unix.MAP_NORESERVE) }

// MapReserved is Map without MAP_NORESERVE: the kernel's overcommit check
// applies, so a request far beyond the host's memory fails at once instead
// of being killed later (host memory).
func MapReserved(size uint64) ([]byte, error) { return mapBytes(size, 0) }

// mapBytes maps size bytes of anonymous private memory (with the extra mmap
// flags; untouched pages are not resident either way). Mappings of 2 MiB or
// more start on a 2 MiB
// boundary and are advised MADV_HUGEPAGE, so touching them faults in
// transparent huge pages rather than 4 KiB pages, as a GPU's memory would
// be used in large pages.
func mapBytes(size uint64, extra int) ([]byte, error) {
	n := size
	size = (size + pageSize - 1) &^ (pageSize - 1) // map whole pages
	b, err := mapPages(size, extra)
	if err != nil {
		return nil, err
	}
	return b[:n:n], nil
}

// mapPages maps size bytes, a multiple of the page size.
func mapPages(size uint64, extra int) ([]byte, error) {
	flags := unix.MAP_PRIVATE | unix.MAP_ANONYMOUS | extra
	prot := unix.PROT_READ | unix.PROT_WRITE
	length := size
	if size >= HugePage {
		length += HugePage
	}
	p, err := unix.MmapPtr(-1, 0, nil, uintptr(length), prot, flags)
	if err != nil {
		return nil, err
	}
	raw := unsafe.Slice((*byte)(p), length)
	if size < HugePage {
		return raw[:size:size], nil
	}
	base := uintptr(p)
	head := int((HugePage - base%HugePage) % HugePage)
	b := raw[head : head+int(size) : head+int(size)]
	if head > 0 {
		if err := Unmap(raw[:head]); err != nil {
			return nil, err
		}
	}
	if tail := raw[head+int(size):]; len(tail) > 0 {
		if err := Unmap(tail); err != nil {
			return nil, err
		}
	}
	_ = unix.Madvise(b, unix.MADV_HUGEPAGE)
	return b, nil
}

// Unmap releases a mapping made by Map (b as Map returned it, or any
// page-aligned part of one); the length is rounded up to whole pages.
func Unmap(b []byte) error {
	n := (uint64(len(b)) + pageSize - 1) &^ (pageSize - 1)
	return unix.MunmapPtr(unsafe.Pointer(&b[0]), uintptr(n))
}

var pageSize = uint64(os.Getpagesize())

// Resident counts the bytes of b resident in RAM (mincore(2)).
func Resident(b []byte) uint64 {
	pages := (uint64(len(b)) + pageSize - 1) / pageSize
	vec := make([]byte, pages)
	_, _, errno := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)), uintptr(unsafe.Pointer(&vec[0])))
	if errno != 0 {
		return 0
	}
	var n uint64
	for _, v := range vec {
		n += uint64(v & 1)
	}
	return n * pageSize
}
