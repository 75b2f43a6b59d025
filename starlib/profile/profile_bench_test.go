package profile_test

import (
	"io"
	"testing"

	"github.com/memsh/memsh/backend"
	"github.com/memsh/memsh/scope"
)

// heavy allocates 1,000 tensors of 4 KiB on the simulated GPU and 1,000 on
// the host, each bound to a local that the next one replaces.
const heavy = `
def heavy():
    for i in range(1000):
        t = tensor.zeros([1024], device="cuda")
        h = tensor.zeros([1024])
    return 0
`

// BenchmarkProfile measures the profiler on an allocation-heavy function:
// ns/op is one call of heavy (2,000 allocations). Compare plain calls with
// profiled ones, in exact peak mode (a reclaim before each allocation) and
// lazy mode (attribution only).
func BenchmarkProfile(b *testing.B) {
	for _, bc := range []struct {
		name string
		mode backend.PeakMode
		call string
	}{
		{"plain/exact", backend.PeakExact, "heavy()"},
		{"profiled/exact", backend.PeakExact, "p()"},
		{"plain/lazy", backend.PeakLazy, "heavy()"},
		{"profiled/lazy", backend.PeakLazy, "p()"},
	} {
		b.Run(bc.name, func(b *testing.B) {
			s, err := scope.New(scope.Options{Device: "sim:1GiB", Peak: bc.mode, Out: io.Discard, Err: io.Discard})
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			if err := s.Exec("bench.star", heavy+"p = profiled(heavy)\n"); err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			for range b.N {
				if err := s.Exec("bench.star", bc.call); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*2000), "ns/alloc")
		})
	}
}
