package tensor_test

import (
	"strconv"
	"testing"

	"go.starlark.net/starlark"

	"github.com/memsh/memsh/backend/sim"
)

// benchFunc defines def f(): <body> over setup's globals and returns f.
func benchFunc(b *testing.B, setup, body string) (*fixture, starlark.Value) {
	f := newFixture(b, sim.Spec{Total: 4 * gib})
	f.run(setup + "\ndef f():\n    return " + body + "\n")
	return f, f.globals["f"]
}

func benchCall(b *testing.B, f *fixture, fn starlark.Value, bytes int64) {
	b.SetBytes(bytes)
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if _, err := starlark.Call(f.thread, fn, nil, nil); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	f.mgr.Reclaim()
}

func benchAdd(b *testing.B, n int, device string) {
	setup := "a = tensor.rand(" + strconv.Itoa(n) + ", " + strconv.Itoa(n) + ", device='" + device + "')\nb = tensor.rand(" + strconv.Itoa(n) + ", " + strconv.Itoa(n) + ", device='" + device + "')\nc = tensor.empty(" + strconv.Itoa(n) + ", " + strconv.Itoa(n) + ", device='" + device + "')"
	b.Run("out-of-place", func(b *testing.B) {
		f, fn := benchFunc(b, setup, "a + b")
		benchCall(b, f, fn, int64(3*n*n*4))
	})
	b.Run("in-place", func(b *testing.B) {
		f, fn := benchFunc(b, setup, "c.copy_(a).add_(b)")
		benchCall(b, f, fn, int64(4*n*n*4))
	})
}

// BenchmarkAddFloat32 measures a + b (allocation, kernel and the Manager's
// paced reclaims) and c.copy_(a).add_(b) (kernels only) for float32
// matrices on the host and on the simulated GPU. SetBytes counts the bytes
// read and written.
func BenchmarkAddFloat32(b *testing.B) {
	for _, n := range []int{1024, 4096} {
		for _, dev := range []string{"cpu", "cuda"} {
			b.Run(strconv.Itoa(n)+"x"+strconv.Itoa(n)+"/"+dev, func(b *testing.B) { benchAdd(b, n, dev) })
		}
	}
}

// BenchmarkAddOutFloat32 measures tensor.add(a, b, out=c): the kernel
// alone, no allocation (NumPy's np.add(a, b, out=c)).
func BenchmarkAddOutFloat32(b *testing.B) {
	for _, n := range []int{1024, 2048, 4096} {
		b.Run(strconv.Itoa(n)+"x"+strconv.Itoa(n), func(b *testing.B) {
			s := strconv.Itoa(n)
			f, fn := benchFunc(b, "a = tensor.rand("+s+", "+s+", device='cuda')\nb = tensor.rand("+s+", "+s+", device='cuda')\nc = tensor.empty("+s+", "+s+", device='cuda')", "tensor.add(a, b, out=c)")
			benchCall(b, f, fn, int64(3*n*n*4))
		})
	}
}

// BenchmarkMatmulFloat32 measures a 1024×1024 by 1024×1024 float32 matmul
// through the BLAS in use (OpenBLAS when installed, else gonum: see
// blas.go); GFLOP/s is 2·n³ / (ns/op).
func BenchmarkMatmulFloat32(b *testing.B) {
	for _, dev := range []string{"cpu", "cuda"} {
		b.Run("1024/"+dev, func(b *testing.B) {
			f, fn := benchFunc(b, "a = tensor.rand(1024, 1024, device='"+dev+"')\nb = tensor.rand(1024, 1024, device='"+dev+"')", "tensor.matmul(a, b)")
			benchCall(b, f, fn, 3*1024*1024*4)
			b.ReportMetric(2*1024*1024*1024/(float64(b.Elapsed().Nanoseconds())/float64(b.N)), "GFLOP/s")
		})
	}
}

// BenchmarkSumFloat32 measures a full reduction of 4096×4096 float32.
func BenchmarkSumFloat32(b *testing.B) {
	f, fn := benchFunc(b, "a = tensor.rand(4096, 4096)", "a.sum()")
	benchCall(b, f, fn, 4096*4096*4)
}
