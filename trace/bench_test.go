package trace_test

import (
	"io"
	"testing"

	"github.com/memsh/memsh/backend"
	"github.com/memsh/memsh/backend/host"
	"github.com/memsh/memsh/backend/sim"
	"github.com/memsh/memsh/env"
	"github.com/memsh/memsh/trace"
)

// BenchmarkAllocFree is one 4 KiB allocation and its release through the
// Manager, untraced and with a trace recording (the observer's cost per
// memory event, counter aggregation included).
func BenchmarkAllocFree(b *testing.B) {
	for _, traced := range []bool{false, true} {
		name := "untraced"
		if traced {
			name = "traced"
		}
		b.Run(name, func(b *testing.B) {
			sp, _ := sim.ParseSpec("1GiB")
			m := backend.NewManager(backend.Config{GPUs: []backend.Allocator{backend.NewCachingAllocator(sim.New(sp)[0], 0)}, Host: host.NewAllocator()})
			defer m.Close()
			if traced {
				r := trace.Start(env.New(m, io.Discard), trace.Options{HostInterval: -1})
				defer r.Stop()
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				h, err := m.Alloc("cuda:0", 4096)
				if err != nil {
					b.Fatal(err)
				}
				m.Release(h, "done")
			}
		})
	}
}
