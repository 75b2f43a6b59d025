package backend

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// BenchmarkCacheHitAllocFree measures one Malloc+Free pair served from a
// warm cache: no device call. "fragmented" first leaves over 10,000 free blocks
// of assorted sizes in the pools, so best fit searches a large tree.
func BenchmarkCacheHitAllocFree(b *testing.B) {
	for _, frag := range []bool{false, true} {
		for _, size := range []uint64{64 * caKiB, caMiB} {
			name := FormatSize(size)
			if frag {
				name = "fragmented/" + name
			}
			b.Run(name, func(b *testing.B) {
				a := NewCachingAllocator(newCAFakeDevice(1<<40, false), 0)
				if frag {
					caFragment(b, a)
				}
				a.Free(caMalloc(b, a, size)) // warm
				b.ReportAllocs()
				b.ResetTimer()
				for range b.N {
					blk, err := a.Malloc(size)
					if err != nil {
						b.Fatal(err)
					}
					a.Free(blk)
				}
				b.StopTimer()
				if n := a.Stats()["num_device_alloc"]; !frag && n != 1 {
					b.Fatalf("%d device allocations", n)
				}
			})
		}
	}
}

// fragment leaves at least 10,000 free blocks in the pools, every other block
// of each segment allocated so that none merge.
func caFragment(b *testing.B, a *CachingAllocator) {
	r := rand.New(rand.NewPCG(7, 7))
	var blocks []*Block
	for range 30000 {
		var size uint64
		if r.IntN(2) == 0 {
			size = uint64(r.IntN(int(caMiB))) + 1
		} else {
			size = uint64(r.IntN(int(8*caMiB))) + caMiB + 1
		}
		blocks = append(blocks, caMalloc(b, a, size))
	}
	for i := 0; i < len(blocks); i += 2 {
		a.Free(blocks[i])
	}
	if n := a.small.free.Len() + a.large.free.Len(); n < 10000 {
		panic(fmt.Sprintf("only %d free blocks", n))
	}
}

// BenchmarkDeviceAlloc measures the miss path: a Malloc that allocates a
// segment from the (fake) device, its Free, and the EmptyCache that returns
// the segment.
func BenchmarkDeviceAlloc(b *testing.B) {
	for _, size := range []uint64{64 * caKiB, caMiB, 64 * caMiB} {
		b.Run(FormatSize(size), func(b *testing.B) {
			d := newCAFakeDevice(1<<40, false)
			a := NewCachingAllocator(d, 0)
			b.ReportAllocs()
			for range b.N {
				blk, err := a.Malloc(size)
				if err != nil {
					b.Fatal(err)
				}
				a.Free(blk)
				a.EmptyCache()
			}
			b.StopTimer()
			if d.mallocs != b.N || d.frees != b.N {
				b.Fatalf("device mallocs %d frees %d, want %d", d.mallocs, d.frees, b.N)
			}
		})
	}
}
