// Package host is memsh's host-RAM backend: the memory behind "cpu" tensors
// and the process-level figures that memsh reports for the host.
//
// # Memory for "cpu" tensors
//
// [Device] implements backend.Device over the C heap: Malloc is
// posix_memalign with 64-byte alignment, Free is free. The bytes are outside
// the Go heap, so Go's garbage collector neither scans nor counts them, and
// they go back to the operating system when freed: on glibc the package sets
// mallopt(M_MMAP_THRESHOLD, 64 KiB) once, so every block of 64 KiB or more
// is its own mmap and is unmapped by free (fixing the threshold also turns off
// glibc's dynamic threshold growth, which would otherwise start serving large
// blocks from the heap after the first large free). Smaller blocks come from
// glibc's arenas, which glibc trims only when their free top exceeds 128 KiB
// and no live chunk sits above it; [Trim] (malloc_trim) returns the free
// pages inside the arenas too, and the Allocator calls it every [TrimPacing]
// bytes of small blocks freed.
//
// [Allocator] implements backend.Allocator over a Device with no caching,
// like PyTorch's CPU allocator: every Malloc is a device allocation and every
// Free gives the memory back, so reserved bytes always equal allocated bytes
// and RoundSize reports the requested size unchanged.
//
// # Process figures
//
// [RSS] is the resident set size from /proc/self/statm. [PeakRSS] manages
// any number of independent, exact peak-RSS counters on top of Linux's single
// per-process high-water mark (VmHWM, reset by writing 5 to
// /proc/self/clear_refs); where that file is not writable it falls back to a
// 5 ms sampler and says so through [PeakRSS.Exact]. [Total] and [Available]
// are MemTotal and MemAvailable from /proc/meminfo. [CPUTime] is this
// process's user+system CPU time and [CPUMeter] measures the mean process CPU
// % and the busiest core's % over an interval. [HeapLive] is the Go heap's
// live bytes, reported separately from RSS.
package host
