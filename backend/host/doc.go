// Package host is memsh's host-RAM backend: the memory behind "cpu" tensors
// and the process-level figures that memsh reports for the host.
//
// # Memory for "cpu" tensors
//
// [Device] implements backend.Device over host memory outside the Go heap,
// so Go's garbage collector neither scans nor counts it: blocks of 2 MiB or
// more are huge-page mappings of their own, smaller ones posix_memalign's
// (64-byte aligned). On glibc the package sets mallopt(M_MMAP_THRESHOLD,
// 64 KiB) once, so every block of 64 KiB or more is its own mapping and
// fixing the threshold turns off glibc's dynamic threshold growth; in its
// place memsh applies that rule itself and on purpose: freed blocks of
// [RetainMin] (64 KiB) to [RetainMax] (32 MiB) are retained for reuse
// while they total at most twice the largest one freed, as glibc keeps
// them for PyTorch, so a loop that makes and drops a result reuses
// resident memory instead of having the kernel zero fresh pages. RSS counts
// retained blocks ([Retained] says how many bytes); no allocator figure
// does. Every other block goes back to the operating system at free.
// Blocks under 64 KiB come from glibc's arenas, which glibc trims only when
// their free top exceeds 128 KiB and no live chunk sits above it; [Trim]
// (malloc_trim) returns the free pages inside the arenas, and the retained
// blocks, too; the Allocator calls it every [TrimPacing] bytes of small
// blocks freed, and every experiment at its end.
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
