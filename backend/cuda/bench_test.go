package cuda_test

import (
	"testing"
	"unsafe"

	"github.com/memsh/memsh/backend"
	"github.com/memsh/memsh/backend/cuda"
	"github.com/memsh/memsh/backend/cuda/cudatest"
)

// The benchmarks run through the stub driver here (its cuMemAlloc is
// malloc plus bookkeeping); on a GPU machine point MEMSH_LIBCUDA at the
// real driver with -gpu to measure cuMemAlloc/cuMemFree themselves:
//
//	go test ./backend/cuda -run XXX -bench . -gpu
var sizes = []uint64{64 << 10, 1 << 20, 64 << 20}

// benchDevice returns device 0 of the stub, or of the real driver with
// -gpu.
func benchDevice(b *testing.B) *cuda.Device {
	if *realGPU {
		drv, err := cuda.Open("")
		if err != nil {
			b.Skip(err)
		}
		return drv.Devices()[0]
	}
	s := cudatest.New(b, cudatest.Config{Mem: 4 << 30, NoCtx: true, NoPoison: true})
	drv, err := cuda.Open(s.LibCUDA)
	if err != nil {
		b.Fatal(err)
	}
	return drv.Devices()[0]
}

// BenchmarkCachingAllocatorHit: Malloc+Free served from the caching
// allocator's cache (no driver call).
func BenchmarkCachingAllocatorHit(b *testing.B) {
	d := benchDevice(b)
	for _, size := range sizes {
		b.Run(backend.FormatSize(size), func(b *testing.B) {
			a := backend.NewCachingAllocator(d, 0)
			blk, err := a.Malloc(size)
			if err != nil {
				b.Fatal(err)
			}
			a.Free(blk)
			b.ResetTimer()
			for range b.N {
				blk, err := a.Malloc(size)
				if err != nil {
					b.Fatal(err)
				}
				a.Free(blk)
			}
			b.StopTimer()
			a.EmptyCache()
		})
	}
}

// BenchmarkCachingAllocatorMiss: Malloc+Free+EmptyCache, so every Malloc
// allocates a segment from the device (cuMemAlloc) and every EmptyCache
// returns it (cuMemFree).
func BenchmarkCachingAllocatorMiss(b *testing.B) {
	d := benchDevice(b)
	for _, size := range sizes {
		b.Run(backend.FormatSize(size), func(b *testing.B) {
			a := backend.NewCachingAllocator(d, 0)
			for range b.N {
				blk, err := a.Malloc(size)
				if err != nil {
					b.Fatal(err)
				}
				a.Free(blk)
				a.EmptyCache()
			}
		})
	}
}

// BenchmarkDeviceMallocFree: cuMemAlloc + cuMemFree through the binding
// (context made current on each call).
func BenchmarkDeviceMallocFree(b *testing.B) {
	d := benchDevice(b)
	for _, size := range sizes {
		b.Run(backend.FormatSize(size), func(b *testing.B) {
			for range b.N {
				m, err := d.Malloc(size)
				if err != nil {
					b.Fatal(err)
				}
				if err := d.Free(m, size); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkLaunch: one small kernel launch and its wait.
func BenchmarkLaunch(b *testing.B) {
	d := benchDevice(b)
	m, err := d.Malloc(4096)
	if err != nil {
		b.Fatal(err)
	}
	defer d.Free(m, 4096)
	for range b.N {
		if err := d.Fill(m.Ptr, 8, 0x0102030405060708, 256); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCopyHtoD: a 1 MiB host-to-device copy.
func BenchmarkCopyHtoD(b *testing.B) {
	d := benchDevice(b)
	m, err := d.Malloc(1 << 20)
	if err != nil {
		b.Fatal(err)
	}
	defer d.Free(m, 1<<20)
	src := make([]byte, 1<<20)
	b.SetBytes(1 << 20)
	for range b.N {
		if err := d.CopyHtoD(m.Ptr, unsafe.Pointer(&src[0]), 1<<20); err != nil {
			b.Fatal(err)
		}
	}
}
