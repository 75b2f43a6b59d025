package sweep_test

import (
	"fmt"
	"io"
	"sort"
	"testing"
	"time"

	"go.starlark.net/starlark"

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

// BenchmarkGridPerPointCost runs one sweep.grid of 10,000 points of a
// trivial function and reports the median wall time between consecutive
// points near the start (points 100-200) and at the end (the last 100),
// and their ratio (issue 12's goal: at most 1.2). Every point reclaims
// twice; a reclaim that collects marks the whole Go heap, so anything the
// sweep kept per point on the heap would show up as a growing per-point
// cost.
func BenchmarkGridPerPointCost(b *testing.B) {
	const n = 10000
	for i := 0; i < b.N; i++ {
		s, err := scope.New(scope.Options{Device: "sim:1GiB", Out: io.Discard, Err: io.Discard})
		if err != nil {
			b.Fatal(err)
		}
		ticks := make([]time.Time, 0, n)
		s.Set("tick", starlark.NewBuiltin("tick", func(*starlark.Thread, *starlark.Builtin, starlark.Tuple, []starlark.Tuple) (starlark.Value, error) {
			ticks = append(ticks, time.Now())
			return starlark.None, nil
		}))
		src := fmt.Sprintf("def f(n):\n    tick()\n    return n\nr = sweep.grid(f, n=list(range(%d)))\n", n)
		if err := s.Exec("bench", src); err != nil {
			b.Fatal(err)
		}
		s.Close()
		if len(ticks) != n {
			b.Fatalf("%d ticks, want %d", len(ticks), n)
		}
		median := func(from, to int) float64 {
			d := make([]float64, 0, to-from)
			for j := from; j < to; j++ {
				d = append(d, float64(ticks[j].Sub(ticks[j-1]).Microseconds()))
			}
			sort.Float64s(d)
			return d[len(d)/2]
		}
		start, end := median(100, 200), median(n-100, n)
		b.ReportMetric(start, "µs/point@100")
		b.ReportMetric(end, "µs/point@10000")
		b.ReportMetric(end/start, "ratio")
	}
}
