package snapshot_test

import (
	"fmt"
	"io"
	"testing"

	"github.com/memsh/memsh/scope"
)

// BenchmarkMalloc is one cuda.malloc(4096) from Starlark (its buffer
// freed by the next reclaim), without and with cuda.record_memory_history:
// the cost of recording each alloc and free with its Starlark frames.
func BenchmarkMalloc(b *testing.B) {
	for _, rec := range []bool{false, true} {
		name := "plain"
		if rec {
			name = "recording"
		}
		b.Run(name, func(b *testing.B) {
			s, err := scope.New(scope.Options{Device: "sim:1GiB", Out: io.Discard, Err: io.Discard})
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			if rec {
				if err := s.Exec("setup", "cuda.record_memory_history()"); err != nil {
					b.Fatal(err)
				}
			}
			src := fmt.Sprintf("def f():\n    for i in range(%d):\n        b = cuda.malloc(4096)\n        b.free()\nf()\n", b.N)
			b.ResetTimer()
			if err := s.Exec("bench", src); err != nil {
				b.Fatal(err)
			}
		})
	}
}
