package tensor

import (
	"errors"
	"fmt"
	"runtime"
	"slices"
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

// A matrix product split into panels of rows is bit-identical to one BLAS
// call (a Context without an interrupt flag makes one call).
func TestMatmulPanelsIdentical(t *testing.T) {
	c := newHostContext(t)
	plain := *c
	plain.intr = nil
	for _, dt := range []DType{Float32, Float64, BFloat16} {
		for _, sh := range [][3]int{{300, 1024, 1000}, {200, 700, 1500}, {130, 2048, 300}} {
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
			g := unsafeBytes(got)
			w := unsafeBytes(want)
			if string(g) != string(w) {
				t.Errorf("%s %v: panelled product differs from one call", dt, sh)
			}
		}
	}
}

// A convolution's products in tiles (gemmStop, with an interrupt flag) are
// bit-identical to one BLAS call each (without one), forward and backward.
func TestConvTilesIdentical(t *testing.T) {
	if testing.Short() {
		t.Skip("large products")
	}
	c := newHostContext(t)
	plain := *c
	plain.intr = nil
	x, err := Randn(c, []int{1, 64, 128, 128}, Float32, "cpu")
	if err != nil {
		t.Fatal(err)
	}
	w, err := Randn(c, []int{128, 64, 3, 3}, Float32, "cpu")
	if err != nil {
		t.Fatal(err)
	}
	p := ConvParams{Stride: [2]int{1, 1}, Padding: [2]int{1, 1}, Dilation: [2]int{1, 1}, Groups: 1}
	if g := geomOf(x, w, p); 2*g.og*g.cg*9*g.oh*g.ow <= panelFlops(currentGemm()) {
		t.Fatalf("the product is too small to be tiled: make the input larger")
	}
	run := func() [3][]byte {
		y, err := Conv2d(x, w, nil, p)
		if err != nil {
			t.Fatal(err)
		}
		gi, gw, _, err := Conv2dBackward(y, x, w, p, [3]bool{true, true, false})
		if err != nil {
			t.Fatal(err)
		}
		return [3][]byte{slices.Clone(unsafeBytes(y)), slices.Clone(unsafeBytes(gi)), slices.Clone(unsafeBytes(gw))}
	}
	tiled := run()
	x.ctx, w.ctx = &plain, &plain
	whole := run()
	for i, name := range []string{"output", "input gradient", "weight gradient"} {
		if string(tiled[i]) != string(whole[i]) {
			t.Errorf("%s: tiled products differ from one call", name)
		}
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
