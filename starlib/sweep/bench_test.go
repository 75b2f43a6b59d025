package sweep_test

import (
	"fmt"
	"io"
	"testing"

	"github.com/memsh/memsh/scope"
)

// BenchmarkPoint is the cost of one point of a trivial function: as a
// sweep.grid point (trial, cache emptied, baseline verified after a
// reclaim) and, for comparison, as a plain trial() in a loop.
func BenchmarkPoint(b *testing.B) {
	for _, tc := range []struct{ name, src string }{
		{"grid", "def f(n):\n    return n\nsweep.grid(f, n=list(range(%d)))\n"},
		{"trial", "def f(n):\n    return n\nfor i in range(%d):\n    trial(f, i)\n"},
	} {
		b.Run(tc.name, func(b *testing.B) {
			s, err := scope.New(scope.Options{Device: "sim:1GiB", Out: io.Discard, Err: io.Discard})
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			b.ResetTimer()
			if err := s.Exec("bench", fmt.Sprintf(tc.src, b.N)); err != nil {
				b.Fatal(err)
			}
		})
	}
}
