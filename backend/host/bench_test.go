package host

import "testing"

// BenchmarkRSS is one RSS reading (one pread of /proc/self/statm).
func BenchmarkRSS(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		if _, err := RSS(); err != nil {
			b.Fatal(err)
		}
	}
}

func benchmarkAllocFree(b *testing.B, size uint64) {
	a := NewAllocator()
	b.ReportAllocs()
	for b.Loop() {
		blk, err := a.Malloc(size)
		if err != nil {
			b.Fatal(err)
		}
		a.Free(blk)
	}
}

// BenchmarkAllocFree64KiB is one Malloc and Free of 64 KiB: at
// MmapThreshold, so an mmap and a munmap each time.
func BenchmarkAllocFree64KiB(b *testing.B) { benchmarkAllocFree(b, 64<<10) }

// BenchmarkAllocFree1KiB is one Malloc and Free of 1 KiB, from glibc's
// arena.
func BenchmarkAllocFree1KiB(b *testing.B) { benchmarkAllocFree(b, 1<<10) }

// BenchmarkPeak is one reading of an exact (or sampled) peak counter.
func BenchmarkPeak(b *testing.B) {
	p := NewPeakRSS()
	c, err := p.New()
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	for b.Loop() {
		if _, err := c.Peak(); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkPeakReset is one Reset of a counter while 3 others are open
// (read VmHWM, fold it into 3 counters, reset the kernel mark, read RSS).
func BenchmarkPeakReset(b *testing.B) {
	p := NewPeakRSS()
	for range 3 {
		c, err := p.New()
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
	}
	c, err := p.New()
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	for b.Loop() {
		if err := c.Reset(); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkCPUTime(b *testing.B) {
	for b.Loop() {
		if _, err := CPUTime(); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkAvailable(b *testing.B) {
	for b.Loop() {
		if Available() == 0 {
			b.Fatal("no MemAvailable")
		}
	}
}
