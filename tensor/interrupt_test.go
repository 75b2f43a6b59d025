package tensor

import (
	"errors"
	"fmt"
	"math"
	"runtime"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/memsh/memsh/backend"
	"github.com/memsh/memsh/backend/host"
	"github.com/memsh/memsh/backend/sim"
)

func newHostContext(t *testing.T) *Context {
	t.Helper()
	m := backend.NewManager(backend.Config{Host: host.NewAllocator()})
	t.Cleanup(m.Close)
	return NewContext(m)
}

// interruptOp runs op in a goroutine, interrupts c after 50 ms and checks
// that op fails with ErrInterrupted promptly and that the memory op
// allocated is freed at the next reclaim. It returns the latency from the
// interrupt to op's return.
func interruptOp(t *testing.T, c *Context, op func() (*Tensor, error)) time.Duration {
	t.Helper()
	c.Manager.Reclaim()
	before := allocatedAll(c.Manager)
	type result struct {
		r   *Tensor
		err error
		at  time.Time
	}
	done := make(chan result, 1)
	go func() {
		r, err := op()
		done <- result{r, err, time.Now()}
	}()
	time.Sleep(50 * time.Millisecond)
	c.Interrupt()
	defer c.ClearInterrupt()
	at := time.Now()
	var res result
	select {
	case res = <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("op did not return 30 s after the interrupt")
	}
	lat := res.at.Sub(at)
	if lat < 0 {
		t.Fatalf("op finished before the interrupt (after < 50 ms): make it larger")
	}
	if !errors.Is(res.err, ErrInterrupted) || res.r != nil {
		t.Fatalf("op returned %v, %v; want the interrupted error", res.r, res.err)
	}
	if lat > time.Second { // the aim is 100 ms; generous for CI
		t.Errorf("interrupt latency %v, want < 1 s", lat)
	}
	c.ClearInterrupt()
	res = result{}
	runtime.GC()
	c.Manager.Reclaim()
	if after := allocatedAll(c.Manager); after != before {
		t.Errorf("allocated %d bytes after the interrupted op, %d before", after, before)
	}
	return lat
}

// allocatedAll is the bytes allocated on m's host and GPUs.
func allocatedAll(m *backend.Manager) uint64 {
	n := m.Host().Allocated()
	for i := range m.NumGPUs() {
		n += m.GPU(i).Allocated()
	}
	return n
}

func TestInterruptKernels(t *testing.T) {
	if testing.Short() {
		t.Skip("large tensors")
	}
	c := newHostContext(t)
	mk := func(shape []int) *Tensor {
		x, err := Ones(c, shape, Float32, "cpu")
		if err != nil {
			t.Fatal(err)
		}
		return x
	}
	big := mk([]int{1 << 28})
	sq := mk([]int{1 << 14, 1 << 14})
	m := mk([]int{4096, 4096})
	cases := []struct {
		name string
		op   func() (*Tensor, error)
	}{
		{"add 2^28", func() (*Tensor, error) { return Add(big, big) }},
		{"exp 2^28", func() (*Tensor, error) { return Exp(big) }},
		{"sum dim 0 2^14x2^14", func() (*Tensor, error) { return Sum(sq, []int{0}, false, Undefined) }},
		{"contiguous transpose 2^14x2^14", func() (*Tensor, error) {
			tt, err := T(sq)
			if err != nil {
				return nil, err
			}
			return Contiguous(tt)
		}},
		{"matmul 4096^2", func() (*Tensor, error) { return Matmul(m, m) }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			lat := interruptOp(t, c, tc.op)
			t.Logf("%s: interrupt latency %v", tc.name, lat.Round(100*time.Microsecond))
		})
	}
	// The Context stays usable once the flag is cleared.
	if _, err := Add(m, m); err != nil {
		t.Fatal(err)
	}
	runtime.KeepAlive(big)
}

// TestInterruptNNKernels: the random fills and the host kernels of the
// nn ops (convolution, pooling, batch and layer norm, softmax, GELU,
// dropout, attention) stop within the latency goal once interrupted,
// forward and backward, drop what they allocated and return
// ErrInterrupted. Each input is sized for an op of well over the 50 ms
// before the interrupt on a 2-core machine (the vectorised ones read and
// write a GiB). Attention
// runs on a simulated GPU with data (its CUDA kernels' host twins).
func TestInterruptNNKernels(t *testing.T) {
	if testing.Short() {
		t.Skip("large tensors")
	}
	c := newHostContext(t)
	dev := sim.New(sim.Spec{Count: 1, Total: 8 << 30})[0]
	sm := backend.NewManager(backend.Config{GPUs: []backend.Allocator{backend.NewCachingAllocator(dev, 0)}, Host: host.NewAllocator()})
	t.Cleanup(sm.Close)
	gc := NewContext(sm)
	mk := func(c *Context, shape []int, device string) *Tensor {
		x, err := Randn(c, shape, Float32, device)
		if err != nil {
			t.Fatal(err)
		}
		return x
	}
	img := mk(c, []int{16, 64, 128, 128}, "cpu")
	w := mk(c, []int{64, 64, 3, 3}, "cpu")
	conv := ConvParams{Stride: [2]int{1, 1}, Padding: [2]int{1, 1}, Dilation: [2]int{1, 1}, Groups: 1}
	y, err := Conv2d(img, w, nil, conv)
	if err != nil {
		t.Fatal(err)
	}
	rows := mk(c, []int{8192, 4096}, "cpu")
	wide := mk(c, []int{1 << 16, 1 << 12}, "cpu") // 1 GiB: the vectorised kernels' inputs
	q := mk(gc, []int{4, 8, 2048, 64}, "cuda")
	cases := []struct {
		name string
		c    *Context
		op   func() (*Tensor, error)
	}{
		{"randn 2^28", c, func() (*Tensor, error) { return Randn(c, []int{1 << 28}, Float32, "cpu") }},
		{"randint 2^28", c, func() (*Tensor, error) { return Randint(c, 0, 1000, []int{1 << 28}, Int64, "cpu") }},
		{"conv2d", c, func() (*Tensor, error) { return Conv2d(img, w, nil, conv) }},
		{"conv2d backward", c, func() (*Tensor, error) {
			gi, gw, _, err := Conv2dBackward(y, img, w, conv, [3]bool{true, true, false})
			if err == nil {
				return gi, fmt.Errorf("not interrupted (gw %v)", gw.shape)
			}
			return gi, err
		}},
		{"max_pool2d", c, func() (*Tensor, error) {
			o, _, err := MaxPool2dWithIndices(img, PoolParams{Kernel: [2]int{3, 3}, Stride: [2]int{1, 1}, Padding: [2]int{1, 1}, Dilation: [2]int{1, 1}})
			return o, err
		}},
		{"batch_norm", c, func() (*Tensor, error) {
			o, _, _, _, err := BatchNorm(img, nil, nil, nil, nil, true, 0.1, 1e-5)
			return o, err
		}},
		{"layer_norm", c, func() (*Tensor, error) {
			o, _, _, err := NativeLayerNorm(rows, []int{4096}, nil, nil, 1e-5)
			return o, err
		}},
		{"softmax (vectorised rows)", c, func() (*Tensor, error) { return Softmax(wide, -1, false) }},
		{"softmax over dim 0 (float64 kernel)", c, func() (*Tensor, error) { return Softmax(rows, 0, false) }},
		{"gelu (vectorised)", c, func() (*Tensor, error) { return Gelu(wide, "none") }},
		{"dropout", c, func() (*Tensor, error) {
			o, _, err := NativeDropout(rows, 0.1)
			return o, err
		}},
		{"flash attention", gc, func() (*Tensor, error) {
			o, _, _, _, err := FlashAttentionForward(q, q, q, 0, true, 0.125)
			return o, err
		}},
		{"efficient attention backward", gc, func() (*Tensor, error) {
			gq, _, _, err := EfficientAttentionBackward(q, q, q, q, nil, 0, false, 0.125, 0, 0)
			return gq, err
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			lat := interruptOp(t, tc.c, tc.op)
			t.Logf("%s: interrupt latency %v", tc.name, lat.Round(100*time.Microsecond))
		})
	}
	runtime.KeepAlive(y)
}

// withGemm runs f with g as the BLAS behind matrix products.
func withGemm(g *gemm, f func()) {
	saved := currentGemm()
	blasImpl = g
	defer func() { blasImpl = saved }()
	f()
}

// gemmsUnderTest are the BLAS libraries the tiling tests run with: gonum,
// and the optimised one when one is loaded (OpenBLAS).
func gemmsUnderTest() []*gemm {
	if g := currentGemm(); g != gonumGemm {
		return []*gemm{gonumGemm, g}
	}
	return []*gemm{gonumGemm}
}

// tiledClose compares a tiled product's values with one call's: equal bit
// for bit with gonum; with another BLAS within relTol of each value
// (non-negative operands: nothing cancels). It returns the largest
// relative difference and whether any value is out of tolerance.
func tiledClose(t *testing.T, g *gemm, got, want *Tensor, relTol float64) (worst float64, ok bool) {
	t.Helper()
	if g == gonumGemm {
		return 0, string(unsafeBytes(got)) == string(unsafeBytes(want))
	}
	gv, err := got.ToFloat64s()
	if err != nil {
		t.Fatal(err)
	}
	wv, err := want.ToFloat64s()
	if err != nil {
		t.Fatal(err)
	}
	ok = true
	for i := range gv {
		d := math.Abs(gv[i]-wv[i]) / max(math.Abs(wv[i]), 1e-30)
		worst = max(worst, d)
		ok = ok && d <= relTol
	}
	return worst, ok
}

// A matrix product split into tiles computes what one BLAS call computes
// (a Context without an interrupt flag makes one call): bit for bit with
// gonum, within the bound of any summation order with OpenBLAS, which
// picks its kernels by shape. Square tiles, and panels of whole rows or whole columns where
// the output is narrow; the tiles are made small (2^24 flops) so that
// every shape is split with either library.
func TestMatmulPanelsIdentical(t *testing.T) {
	c := newHostContext(t)
	plain := *c
	plain.intr = nil
	tileFlopsForTest = 1 << 24
	defer func() { tileFlopsForTest = 0 }()
	// Two summation orders of k non-negative terms differ by at most
	// 2(k−1)ε of the sum; bfloat16 results are float32 sums rounded once
	// more, so one bfloat16 ulp apart at most.
	eps := map[DType]float64{Float32: 0x1p-24, Float64: 0x1p-53}
	tol := func(dt DType, k int) float64 {
		if dt == BFloat16 {
			return 0x1p-7
		}
		return 2 * float64(k-1) * eps[dt]
	}
	for _, g := range gemmsUnderTest() {
		withGemm(g, func() {
			for _, dt := range []DType{Float32, Float64, BFloat16} {
				worst := 0.0
				for _, sh := range [][3]int{{300, 1024, 1000}, {200, 700, 1500}, {130, 2048, 300}, {60, 512, 3000}, {3000, 512, 60}} {
					var tiles [][4]int
					gemmTiles(new(atomic.Bool), sh[0], sh[1], sh[2], panelFlops(g), func(r0, r1, c0, c1 int) {
						tiles = append(tiles, [4]int{r0, r1, c0, c1})
					})
					if len(tiles) < 4 {
						t.Fatalf("%v: %d tiles, want the product split", sh, len(tiles))
					}
					a, err := Rand(c, []int{sh[0], sh[1]}, dt, "cpu")
					if err != nil {
						t.Fatal(err)
					}
					b, err := Rand(c, []int{sh[1], sh[2]}, dt, "cpu")
					if err != nil {
						t.Fatal(err)
					}
					got, err := Matmul(a, b)
					if err != nil {
						t.Fatal(err)
					}
					a.ctx, b.ctx = &plain, &plain
					want, err := Matmul(a, b)
					if err != nil {
						t.Fatal(err)
					}
					w, ok := tiledClose(t, g, got, want, tol(dt, sh[1]))
					worst = max(worst, w)
					if !ok {
						t.Errorf("%s %s %v: the tiled product differs from one call (worst relative difference %g)", g.name, dt, sh, w)
					}
				}
				if g != gonumGemm {
					t.Logf("%s %s: worst relative difference from one call %g", g.name, dt, worst)
				}
			}
		})
	}
}

// A convolution's products in tiles (gemmStop, with an interrupt flag)
// compute what one BLAS call each computes (without one), forward and
// backward: bit for bit with gonum, within rounding with OpenBLAS.
func TestConvTilesIdentical(t *testing.T) {
	if testing.Short() {
		t.Skip("large products")
	}
	c := newHostContext(t)
	plain := *c
	plain.intr = nil
	tileFlopsForTest = 1 << 26
	defer func() { tileFlopsForTest = 0 }()
	x, err := Rand(c, []int{1, 64, 128, 128}, Float32, "cpu")
	if err != nil {
		t.Fatal(err)
	}
	w, err := Rand(c, []int{128, 64, 3, 3}, Float32, "cpu")
	if err != nil {
		t.Fatal(err)
	}
	p := ConvParams{Stride: [2]int{1, 1}, Padding: [2]int{1, 1}, Dilation: [2]int{1, 1}, Groups: 1}
	if g := geomOf(x, w, p); 2*g.og*g.cg*9*g.oh*g.ow <= 4*tileFlopsForTest {
		t.Fatalf("the product is too small to be tiled: make the input larger")
	}
	run := func() [3]*Tensor {
		y, err := Conv2d(x, w, nil, p)
		if err != nil {
			t.Fatal(err)
		}
		gi, gw, _, err := Conv2dBackward(y, x, w, p, [3]bool{true, true, false})
		if err != nil {
			t.Fatal(err)
		}
		return [3]*Tensor{y, gi, gw}
	}
	for _, g := range gemmsUnderTest() {
		withGemm(g, func() {
			x.ctx, w.ctx = c, c
			tiled := run()
			x.ctx, w.ctx = &plain, &plain
			whole := run()
			for i, name := range []string{"output", "input gradient", "weight gradient"} {
				// inner dimensions: 64·9 (output), 128·9 (input gradient),
				// 128·128 (weight gradient)
				if worst, ok := tiledClose(t, g, tiled[i], whole[i], 2*128*128*0x1p-24); !ok {
					t.Errorf("%s %s: tiled products differ from one call (worst relative difference %g)", g.name, name, worst)
				} else if g != gonumGemm {
					t.Logf("%s %s: worst relative difference from one call %g", g.name, name, worst)
				}
			}
		})
	}
}

// unsafeBytes is the memory of contiguous t.
func unsafeBytes(t *Tensor) []byte {
	size := t.dtype.Size()
	return unsafe.Slice((*byte)(elemAddr(t.mem.Pointer(), t.offset, size)), t.Numel()*size)
}

// BenchmarkInterruptLatency measures Ctrl-C latency: the time from
// Context.Interrupt (50 ms into the op) to the op's return.
func BenchmarkInterruptLatency(b *testing.B) {
	for _, tc := range []struct {
		name  string
		shape []int
		op    func(x *Tensor) (*Tensor, error)
	}{
		{"matmul4096", []int{4096, 4096}, func(x *Tensor) (*Tensor, error) { return Matmul(x, x) }},
		{"add2^28", []int{1 << 28}, func(x *Tensor) (*Tensor, error) { return Add(x, x) }},
	} {
		b.Run(tc.name, func(b *testing.B) {
			m := backend.NewManager(backend.Config{Host: host.NewAllocator()})
			defer m.Close()
			c := NewContext(m)
			x, err := Ones(c, tc.shape, Float32, "cpu")
			if err != nil {
				b.Fatal(err)
			}
			var total time.Duration
			for b.Loop() {
				done := make(chan time.Time, 1)
				go func() {
					_, _ = tc.op(x)
					done <- time.Now()
				}()
				time.Sleep(50 * time.Millisecond)
				c.Interrupt()
				at := time.Now()
				total += (<-done).Sub(at)
				c.ClearInterrupt()
				m.Reclaim()
			}
			b.ReportMetric(float64(total.Microseconds())/1000/float64(b.N), "ms-latency")
		})
	}
}

// BenchmarkInterruptChunking compares ops on a Context with the interrupt
// flag (chunked kernels, tiled products) and without one (one parallelFor
// range per goroutine, one BLAS call): the cost of the checks.
func BenchmarkInterruptChunking(b *testing.B) {
	m := backend.NewManager(backend.Config{Host: host.NewAllocator()})
	defer m.Close()
	c := NewContext(m)
	plain := *c
	plain.intr = nil
	for _, mode := range []struct {
		name string
		c    *Context
	}{{"flag", c}, {"noflag", &plain}} {
		x, _ := Ones(mode.c, []int{1 << 24}, Float32, "cpu")
		a, _ := Rand(mode.c, []int{1024, 1024}, Float32, "cpu")
		s, _ := Ones(mode.c, []int{4096, 4096}, Float32, "cpu")
		b.Run("add2^24/"+mode.name, func(b *testing.B) {
			for b.Loop() {
				if _, err := Add(x, x); err != nil {
					b.Fatal(err)
				}
				m.Reclaim()
			}
		})
		b.Run("matmul1024/"+mode.name, func(b *testing.B) {
			for b.Loop() {
				if _, err := Matmul(a, a); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run("sum4096x4096dim1/"+mode.name, func(b *testing.B) {
			for b.Loop() {
				if _, err := Sum(s, []int{1}, false, Undefined); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
