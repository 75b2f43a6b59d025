package scope_test

import (
	"fmt"
	"io"
	"math"
	"runtime"
	"strings"
	"testing"
	"time"

	"go.starlark.net/starlark"
	"go.starlark.net/syntax"

	"github.com/memsh/memsh/backend"
	"github.com/memsh/memsh/scope"
)

// statements returns n simple top-level statements that re-bind globals.
func statements(n int) string {
	var b strings.Builder
	b.WriteString("x = 0\n")
	for i := 0; i < n; i++ {
		fmt.Fprintf(&b, "x = x + %d\n", i%7)
	}
	return b.String()
}

// BenchmarkExecStatement measures memsh's statement-by-statement executor:
// ns/op is per top-level statement (compile and run). Compare with
// BenchmarkExecPlainStarlark: the difference is the executor's overhead.
func BenchmarkExecStatement(b *testing.B) {
	const n = 1000
	src := statements(n)
	s, err := scope.New(scope.Options{Device: "sim:1GiB", Out: io.Discard, Err: io.Discard})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := s.Exec("bench.star", src); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*(n+1)), "ns/stmt")
}

// BenchmarkExecPlainStarlark runs the same source with go.starlark.net's
// ExecFileOptions as one file: the baseline for BenchmarkExecStatement.
func BenchmarkExecPlainStarlark(b *testing.B) {
	const n = 1000
	src := statements(n)
	opts := &syntax.FileOptions{Set: true, While: true, TopLevelControl: true, GlobalReassign: true, Recursion: true}
	for i := 0; i < b.N; i++ {
		thread := &starlark.Thread{}
		if _, err := starlark.ExecFileOptions(opts, thread, "bench.star", src, nil); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*(n+1)), "ns/stmt")
}

// BenchmarkReclaim10kObjects is one reclaim pass (runtime.GC plus the
// registry scan) with 10,000 live Starlark objects and 1,000 live tensors.
func BenchmarkReclaim10kObjects(b *testing.B) {
	s, err := scope.New(scope.Options{Device: "sim:1GiB", Out: io.Discard, Err: io.Discard})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	err = s.Exec("setup.star", `
objs = [{"i": i, "s": str(i)} for i in range(10000)]
ts = [tensor.zeros([16], device="cuda") for i in range(1000)]
`)
	if err != nil {
		b.Fatal(err)
	}
	m := s.Manager()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		m.Reclaim()
	}
}

// BenchmarkPeakMode runs an allocation-heavy loop (1,000 iterations each
// allocating a fresh 4 KiB tensor while the previous one is still bound)
// inside an experiment, in exact and lazy peak modes. ns/op is per loop.
func BenchmarkPeakMode(b *testing.B) {
	benchPeakModes(b, `
e = experiment(quiet=True)
for i in range(1000):
    t = tensor.zeros([1024], device="cuda")
e.finish()
`)
}

// BenchmarkGrowth builds a list and a dict of 20,000 tensors of 64 bytes
// each (pure growth: every allocation raises the peak, no reclaim finds
// garbage), in exact and lazy peak modes. ns/op is per build of both.
// Exact mode reclaims before every allocation; the walks look only at
// what was appended since the last (pinned containers, reach_pins.go).
func BenchmarkGrowth(b *testing.B) {
	benchPeakModes(b, `
cuda.reset_peak_memory_stats()
big = [tensor.ones([16], device="cuda") for i in range(20000)]
d = {}
for i in range(20000):
    d[i] = tensor.ones([16], device="cuda")
big, d = None, None
`)
}

// benchPeakModes runs src once per op on a sim:1GiB Session in exact and
// in lazy peak mode, and reports the reclaims, those proven, and the
// values the walks looked into, per op.
func benchPeakModes(b *testing.B, src string) {
	for _, mode := range []backend.PeakMode{backend.PeakExact, backend.PeakLazy} {
		b.Run(mode.String(), func(b *testing.B) {
			s, err := scope.New(scope.Options{Device: "sim:1GiB", Peak: mode, Out: io.Discard, Err: io.Discard})
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			before := s.Manager().Stats()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if err := s.Exec("bench.star", src); err != nil {
					b.Fatal(err)
				}
			}
			st := s.Manager().Stats().Since(before)
			b.ReportMetric(float64(st.Reclaims)/float64(b.N), "reclaims/op")
			b.ReportMetric(float64(st.ProvenReclaims)/float64(b.N), "proven/op")
			b.ReportMetric(float64(st.ValuesWalked)/float64(b.N), "values-walked/op")
		})
	}
}

// BenchmarkExperimentLoop runs 10,000 experiments inside one top-level
// for statement (each allocating and dropping a tensor) and reports the
// time per experiment and the Go heap the loop keeps per experiment,
// measured inside the statement between iteration 1,000 and the last
// (issue 12's goal: 0 bytes).
func BenchmarkExperimentLoop(b *testing.B) {
	const n = 10000
	for i := 0; i < b.N; i++ {
		s, err := scope.New(scope.Options{Device: "sim:1GiB", Out: io.Discard, Err: io.Discard})
		if err != nil {
			b.Fatal(err)
		}
		heap := map[int]uint64{}
		s.Set("heap", starlark.NewBuiltin("heap", func(_ *starlark.Thread, _ *starlark.Builtin, args starlark.Tuple, _ []starlark.Tuple) (starlark.Value, error) {
			var at int
			if err := starlark.AsInt(args[0], &at); err != nil {
				return nil, err
			}
			var ms runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&ms)
			heap[at] = ms.HeapAlloc
			return starlark.None, nil
		}))
		start := time.Now()
		src := fmt.Sprintf(`
for i in range(%d):
    e = experiment("x", quiet=True)
    t = tensor.zeros([256], device="cuda")
    e.finish()
    if i == 1000 or i == %d:
        heap(i)
`, n, n-1)
		if err := s.Exec("loop.star", src); err != nil {
			b.Fatal(err)
		}
		el := time.Since(start)
		s.Close()
		b.ReportMetric(float64(el.Microseconds())/n, "µs/experiment")
		b.ReportMetric((float64(heap[n-1])-float64(heap[1000]))/float64(n-1001), "heap-B/experiment")
	}
}

// deepRecursion defines f(n), which recurses n levels deep, each keeping a
// 256-byte tensor in a local until the recursion unwinds.
const deepRecursion = `
def f(n):
    t = tensor.zeros([64], device="cuda")
    if n == 0:
        return 0
    return f(n - 1)
`

// BenchmarkDeepRecursion calls a recursive function that allocates a
// 256-byte tensor at each level and keeps it in a local until the
// recursion unwinds (exact peak mode, inside an experiment), at depth
// 1,000 and 8,000. Linear cost in depth (issue 13) shows as a ratio of 8,
// and as frames walked per level (over all the reclaims of the deeper
// run) staying near 1.
func BenchmarkDeepRecursion(b *testing.B) {
	src := deepRecursion + `
e = experiment(quiet=True)
f(%d)
e.finish()
`
	times := map[int]time.Duration{}
	frames := 0.0
	for i := 0; i < b.N; i++ {
		for _, depth := range []int{1000, 8000} {
			s, err := scope.New(scope.Options{Device: "sim:1GiB", Out: io.Discard, Err: io.Discard})
			if err != nil {
				b.Fatal(err)
			}
			start := time.Now()
			if err := s.Exec("deep.star", fmt.Sprintf(src, depth)); err != nil {
				b.Fatal(err)
			}
			times[depth] += time.Since(start)
			if depth == 8000 {
				frames += float64(s.Manager().Stats().FramesWalked) / float64(depth)
			}
			s.Close()
		}
	}
	b.ReportMetric(float64(times[1000].Milliseconds())/float64(b.N), "ms@1000")
	b.ReportMetric(float64(times[8000].Milliseconds())/float64(b.N), "ms@8000")
	b.ReportMetric(float64(times[8000])/float64(times[1000]), "ratio")
	b.ReportMetric(frames/float64(b.N), "frames-walked/level")
}

// BenchmarkDeepRecursionPerLevel is BenchmarkDeepRecursion's recursion
// (without the experiment) at depths 1,000 to 16,000, in exact and lazy
// peak mode: the time per level of each (best of b.N runs) is flat when
// the cost is linear in depth. Run it with GOGC=off too: the Go
// collector's scans of the goroutine's stack (about 2 KiB per level) add
// to both modes alike, and to go.starlark.net's own recursion, which is
// measured too.
func BenchmarkDeepRecursionPerLevel(b *testing.B) {
	src := deepRecursion + "f(%d)\n"
	for _, mode := range []backend.PeakMode{backend.PeakExact, backend.PeakLazy} {
		for _, depth := range []int{1000, 4000, 16000} {
			best := time.Duration(math.MaxInt64)
			for i := 0; i < b.N; i++ {
				s, err := scope.New(scope.Options{Device: "sim:1GiB", Peak: mode, Out: io.Discard, Err: io.Discard})
				if err != nil {
					b.Fatal(err)
				}
				start := time.Now()
				if err := s.Exec("deep.star", fmt.Sprintf(src, depth)); err != nil {
					b.Fatal(err)
				}
				best = min(best, time.Since(start))
				s.Close()
			}
			b.ReportMetric(float64(best.Nanoseconds())/1e3/float64(depth), fmt.Sprintf("µs/level@%d-%s", depth, mode))
		}
	}
	// go.starlark.net alone, a 64-element list per level instead of the
	// tensor: how the interpreter's own recursion grows with depth
	opts := &syntax.FileOptions{Recursion: true}
	for _, depth := range []int{1000, 4000, 16000} {
		src := fmt.Sprintf("def f(n):\n    t = [n] * 64\n    if n == 0:\n        return 0\n    return f(n - 1)\nf(%d)\n", depth)
		best := time.Duration(math.MaxInt64)
		for i := 0; i < b.N; i++ {
			start := time.Now()
			if _, err := starlark.ExecFileOptions(opts, &starlark.Thread{}, "deep.star", src, nil); err != nil {
				b.Fatal(err)
			}
			best = min(best, time.Since(start))
		}
		b.ReportMetric(float64(best.Nanoseconds())/1e3/float64(depth), fmt.Sprintf("µs/level@%d-go.starlark.net", depth))
	}
}

// BenchmarkLayoutTrainingStep runs training steps of GPT-2 small
// (scripts/models, bf16 autocast, AdamW) on a simulated H100 without
// data in exact peak mode, as memsh fit's trials do: ns/op is one step,
// and it reports the reclaims per step, the Go collections among them
// and the mean time of a reclaim (almost all of it the reach walk, whose
// cost follows what the session holds: parameters, optimizer state, the
// autograd graph).
func BenchmarkLayoutTrainingStep(b *testing.B) {
	s, err := scope.New(scope.Options{Device: "sim:H100,meta", Peak: backend.PeakExact, Out: io.Discard, Err: io.Discard, LoadPath: []string{"../scripts"}})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	err = s.Exec("setup.star", `
load("models/gpt2.star", "gpt2", "GPT2_SMALL")
model = gpt2(device="cuda", **GPT2_SMALL)
opt = optim.AdamW(model.parameters(), lr=1e-4)
x = tensor.randint(0, 50257, [4, 1024], device="cuda")
def loss_of(model, x):
    out = model(x)
    return nn.functional.cross_entropy(out.view(-1, out.shape[-1]), x.view(-1))
def step():
    nn.autocast(loss_of, model, x, dtype="bfloat16").backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
step()
`)
	if err != nil {
		b.Fatal(err)
	}
	before := s.Manager().Stats()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := s.Exec("step.star", "step()"); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	st := s.Manager().Stats().Since(before)
	b.ReportMetric(float64(st.Reclaims)/float64(b.N), "reclaims/step")
	b.ReportMetric(float64(st.Collections())/float64(b.N), "collections/step")
	if st.Reclaims > 0 {
		b.ReportMetric(float64(st.ReclaimTime.Microseconds())/float64(st.Reclaims), "µs/reclaim")
	}
}
