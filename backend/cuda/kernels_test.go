package cuda_test

import (
	"errors"
	"math"
	"math/bits"
	"math/rand/v2"
	"os"
	"os/exec"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"testing"
	"unsafe"

	"github.com/memsh/memsh/backend/cuda"
	"github.com/memsh/memsh/backend/cuda/cudatest"
)

// devBuf is a device buffer with host helpers for tests.
type devBuf struct {
	t *testing.T
	d *cuda.Device
	p uintptr
	n uint64
}

func alloc(t *testing.T, d *cuda.Device, n uint64) *devBuf {
	t.Helper()
	m, err := d.Malloc(n)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Free(m, n) })
	return &devBuf{t, d, m.Ptr, n}
}

func put[T any](b *devBuf, vals []T) {
	b.t.Helper()
	if err := b.d.CopyHtoD(b.p, unsafe.Pointer(&vals[0]), uint64(len(vals))*uint64(unsafe.Sizeof(vals[0]))); err != nil {
		b.t.Fatal(err)
	}
}

func get[T any](b *devBuf, n int) []T {
	b.t.Helper()
	out := make([]T, n)
	if err := b.d.CopyDtoH(unsafe.Pointer(&out[0]), b.p, uint64(n)*uint64(unsafe.Sizeof(out[0]))); err != nil {
		b.t.Fatal(err)
	}
	return out
}

// TestContextPerThread: the CUDA context is current per OS thread. Calls
// from goroutines locked to fresh threads (where no context was ever made
// current) and calls alternating between two devices on one thread all
// work, because each call makes its device's context current first; the
// stub enforces this (a call on a thread without a context fails, as the
// negative control shows).
func TestContextPerThread(t *testing.T) {
	s, drv := open(t, cudatest.Config{GPUs: 2, NoCtx: true})
	d0, d1 := drv.Devices()[0], drv.Devices()[1]
	if _, err := d0.Context(); err != nil {
		t.Fatal(err)
	}

	// Negative control: a fresh thread has no current context.
	if code := s.RawAllocNewThread(4096); code != 201 {
		t.Fatalf("raw cuMemAlloc on a fresh thread returned %d, want 201 (CUDA_ERROR_INVALID_CONTEXT)", code)
	}

	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for g := range 16 {
		wg.Go(func() {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			d := []*cuda.Device{d0, d1}[g%2]
			other := []*cuda.Device{d1, d0}[g%2]
			for i := range 20 {
				m, err := d.Malloc(uint64(1024 * (i + 1)))
				if err != nil {
					errs <- err
					return
				}
				m2, err := other.Malloc(512)
				if err != nil {
					errs <- err
					return
				}
				v := []uint32{uint32(g), uint32(i)}
				if err := d.CopyHtoD(m.Ptr, unsafe.Pointer(&v[0]), 8); err != nil {
					errs <- err
					return
				}
				if ours, err := d.CurrentContextIsOurs(); err != nil || !ours {
					errs <- errors.New("the device's context is not current after its call")
					return
				}
				if err := other.Free(m2, 512); err != nil { // needs the other device's context
					errs <- err
					return
				}
				if err := d.Free(m, uint64(1024*(i+1))); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if s.LiveAllocs() != 2 { // the two workspaces
		t.Errorf("%d live allocations", s.LiveAllocs())
	}
}

// TestLaunchArguments: the parameter words reach the kernel as passed, on
// a grid of 256-thread blocks capped at 8192 blocks.
func TestLaunchArguments(t *testing.T) {
	s, drv := open(t, cudatest.Config{NoCtx: true})
	d := drv.Devices()[0]
	n := uint64(1000)
	out, a, b := alloc(t, d, 4*n), alloc(t, d, 4*n), alloc(t, d, 4*n)
	before := s.LaunchCount()
	if err := d.Binary(cuda.Mul, cuda.F32, out.p, cuda.Operand{Ptr: a.p}, cuda.Operand{Ptr: b.p, Div: 10, Mod: 7}, n); err != nil {
		t.Fatal(err)
	}
	if err := d.Binary(cuda.Sub, cuda.BF16, out.p, cuda.Operand{Number: true, Value: 2.5}, cuda.Operand{Ptr: b.p, Mod: 3}, 600); err != nil {
		t.Fatal(err)
	}
	ls := s.Launches()[before:]
	if len(ls) < 2 {
		t.Fatalf("launches %+v", ls)
	}
	want := []cudatest.Launch{
		{Name: "memsh_binary", Grid: 4, Block: 256, Params: []uint64{2, 0, n, uint64(out.p), uint64(a.p), 1, 0, uint64(b.p), 10, 7, 0, 0, 0}},
		{Name: "memsh_binary", Grid: 3, Block: 256, Params: []uint64{1, 2, 600, uint64(out.p), 0, 1, 0, uint64(b.p), 1, 3, math.Float64bits(2.5), 0, 1}},
	}
	for i, w := range want {
		g := ls[i]
		if g.Name != w.Name || g.Grid != w.Grid || g.Block != w.Block || !equalWords(g.Params, w.Params) {
			t.Errorf("launch %d = %+v\nwant       %+v", i, g, w)
		}
	}
}

func equalWords(a, b []uint64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestLaunchGridCap(t *testing.T) {
	s, drv := open(t, cudatest.Config{NoCtx: true, NoPoison: true})
	d := drv.Devices()[0]
	n := uint64(3 << 20) // 3M elements: 12288 blocks uncapped
	buf := alloc(t, d, 4*n)
	if err := d.Fill(buf.p, 8, 0x0123456789abcdef, n/2); err != nil {
		t.Fatal(err)
	}
	ls := s.Launches()
	if l := ls[len(ls)-1]; l.Name != "memsh_fill64" || l.Grid != 6144 || l.Params[0] != n/2 {
		t.Errorf("fill launch %+v", l)
	}
	if err := d.Binary(cuda.Add, cuda.F32, buf.p, cuda.Operand{Ptr: buf.p}, cuda.Operand{Number: true, Value: 1}, n); err != nil {
		t.Fatal(err)
	}
	ls = s.Launches()
	if l := ls[len(ls)-1]; l.Grid != 8192 {
		t.Errorf("grid %d, want the 8192 cap", l.Grid)
	}
}

func TestBinaryUnaryCast(t *testing.T) {
	_, drv := open(t, cudatest.Config{NoCtx: true})
	d := drv.Devices()[0]
	const rows, cols = 3, 4
	n := uint64(rows * cols)
	a, b, out := alloc(t, d, 8*n), alloc(t, d, 8*n), alloc(t, d, 8*n)
	av := make([]float32, n)
	for i := range av {
		av[i] = float32(i) - 5.5
	}
	put(a, av)
	put(b, []float32{1, 2, 4, 8}) // a row of cols elements
	check := func(name string, want func(i int) float32) {
		t.Helper()
		got := get[float32](out, int(n))
		for i := range got {
			if w := want(i); got[i] != w && !(w != w && got[i] != got[i]) {
				t.Errorf("%s: element %d = %v, want %v", name, i, got[i], w)
			}
		}
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(d.Binary(cuda.Div, cuda.F32, out.p, cuda.Operand{Ptr: a.p}, cuda.Operand{Ptr: b.p, Mod: cols}, n))
	check("a / row", func(i int) float32 { return av[i] / []float32{1, 2, 4, 8}[i%cols] })
	put(b, []float32{10, 20, 30})
	must(d.Binary(cuda.Add, cuda.F32, out.p, cuda.Operand{Ptr: b.p, Div: cols}, cuda.Operand{Ptr: a.p}, n))
	check("column + a", func(i int) float32 { return []float32{10, 20, 30}[i/cols] + av[i] })
	must(d.Binary(cuda.Sub, cuda.F32, out.p, cuda.Operand{Number: true, Value: 0.1}, cuda.Operand{Ptr: a.p}, n))
	check("0.1 - a", func(i int) float32 { return float32(0.1) - av[i] })
	must(d.Unary(cuda.Relu, cuda.F32, out.p, a.p, n))
	check("relu", func(i int) float32 { return max(av[i], 0) })
	must(d.Unary(cuda.Sqrt, cuda.F32, out.p, a.p, n))
	check("sqrt", func(i int) float32 { return float32(math.Sqrt(float64(av[i]))) })
	must(d.Unary(cuda.Abs, cuda.F32, out.p, a.p, n))
	check("abs", func(i int) float32 { return float32(math.Abs(float64(av[i]))) })
	must(d.Unary(cuda.Neg, cuda.F32, out.p, a.p, n))
	check("neg", func(i int) float32 { return -av[i] })

	// float64 in float64 arithmetic.
	dv := []float64{1.0 / 3, 2, math.Pi}
	put(a, dv)
	must(d.Binary(cuda.Mul, cuda.F64, out.p, cuda.Operand{Ptr: a.p}, cuda.Operand{Number: true, Value: 0.1}, 3))
	if got := get[float64](out, 3); got[0] != dv[0]*0.1 || got[2] != math.Pi*0.1 {
		t.Errorf("f64 mul %v", got)
	}
	// Casts through the half types: 1/3 to float16 is 0x3555, to bfloat16
	// 0x3eab; back to float32 exactly.
	put(a, []float32{1.0 / 3, -65504, 1e-8, float32(math.Inf(1))})
	must(d.Cast(cuda.F16, out.p, cuda.F32, a.p, 4))
	if got := get[uint16](out, 4); got[0] != 0x3555 || got[1] != 0xfbff || got[2] != 0 || got[3] != 0x7c00 {
		t.Errorf("f32 -> f16 %#x", got)
	}
	must(d.Cast(cuda.BF16, b.p, cuda.F32, a.p, 4))
	if got := get[uint16](b, 4); got[0] != 0x3eab || got[3] != 0x7f80 {
		t.Errorf("f32 -> bf16 %#x", got)
	}
	must(d.Cast(cuda.F64, a.p, cuda.BF16, b.p, 1))
	if got := get[float64](a, 1); got[0] != float64(math.Float32frombits(0x3eab<<16)) {
		t.Errorf("bf16 -> f64 %v", got)
	}
	// float16 arithmetic in float32, rounded on store: 1/3 + 1/3.
	put(b, []uint16{0x3555, 0x3555})
	must(d.Binary(cuda.Add, cuda.F16, out.p, cuda.Operand{Ptr: b.p}, cuda.Operand{Ptr: b.p}, 2))
	if got := get[uint16](out, 2); got[0] != 0x3955 {
		t.Errorf("f16 add %#x, want 0x3955", got)
	}
}

// philox and uniform32 are an independent transcription of the generator
// in starlib/tensor/kernels_random.go.
func philox(c [4]uint32, k0, k1 uint32) [4]uint32 {
	for range 10 {
		h0, l0 := bits.Mul32(0xD2511F53, c[0])
		h1, l1 := bits.Mul32(0xCD9E8D57, c[2])
		c = [4]uint32{h1 ^ c[1] ^ k0, l1, h0 ^ c[3] ^ k1, l0}
		k0 += 0x9E3779B9
		k1 += 0xBB67AE85
	}
	return c
}

func TestRandomAndSum(t *testing.T) {
	_, drv := open(t, cudatest.Config{NoCtx: true})
	d := drv.Devices()[0]
	const n = 5000
	buf := alloc(t, d, 8*n)
	seed, offset := uint64(0xdeadbeef12345678), uint64(1<<32-7) // the counter crosses 2^32
	if err := d.Random(cuda.F32, buf.p, n, seed, offset, false); err != nil {
		t.Fatal(err)
	}
	got := get[float32](buf, n)
	var want float64
	for i := range n {
		k := offset + uint64(i)
		x := philox([4]uint32{uint32(k), uint32(k >> 32), 0, 0}, uint32(seed), uint32(seed>>32))
		w := float32(x[0]>>8) / (1 << 24)
		if got[i] != w {
			t.Fatalf("uniform %d = %v, want %v", i, got[i], w)
		}
		want += float64(w)
	}
	sum, err := d.Sum(cuda.F32, buf.p, n)
	if err != nil {
		t.Fatal(err)
	}
	if math.Abs(sum-want) > 1e-9 {
		t.Errorf("sum %v, want %v", sum, want)
	}
	// Integers sum exactly, whatever the order.
	ints := make([]float32, n)
	for i := range ints {
		ints[i] = float32(i%17) - 8
	}
	put(buf, ints)
	var exact float64
	for _, v := range ints {
		exact += float64(v)
	}
	if s, err := d.Sum(cuda.F32, buf.p, n); err != nil || s != exact {
		t.Errorf("sum of ints %v (%v), want %v", s, err, exact)
	}
	if s, err := d.Sum(cuda.F32, buf.p, 0); err != nil || s != 0 {
		t.Errorf("empty sum %v %v", s, err)
	}
}

// TestMathPorts: the kernels' ports of Go's math.Log (amd64) and math.Cos
// give Go's bits, for the inputs the normal draw produces and for edge
// cases. The PTX is compiled from the same source.
func TestMathPorts(t *testing.T) {
	if runtime.GOARCH != "amd64" {
		t.Skip("the log port follows math/log_amd64.s; on " + runtime.GOARCH + " Go's math.Log is another algorithm")
	}
	_, drv := open(t, cudatest.Config{NoCtx: true, NoPoison: true})
	d := drv.Devices()[0]
	r := rand.New(rand.NewPCG(1, 2))
	xs := []float64{1, 0.5, math.Sqrt2 / 2, math.Nextafter(math.Sqrt2/2, 1), math.Nextafter(math.Sqrt2/2, 0),
		0x1p-53, 1 - 0x1p-53, math.Pi / 4, math.Pi / 2, math.Pi, 3 * math.Pi / 2, 2 * math.Pi, 0, 1e-300}
	for len(xs) < 200000 {
		h := r.Uint64() >> 11
		xs = append(xs, 1-float64(h)*0x1p-53, float64(h)*0x1p-53*(2*math.Pi))
	}
	n := uint64(len(xs))
	in, logs, coss := alloc(t, d, 8*n), alloc(t, d, 8*n), alloc(t, d, 8*n)
	put(in, xs)
	if err := d.Launch("memsh_math_check", n, n, uint64(in.p), uint64(logs.p), uint64(coss.p)); err != nil {
		t.Fatal(err)
	}
	gl, gc := get[float64](logs, len(xs)), get[float64](coss, len(xs))
	bad := 0
	for i, x := range xs {
		if x > 0 && math.Float64bits(gl[i]) != math.Float64bits(math.Log(x)) {
			if bad++; bad < 5 {
				t.Errorf("log(%v): port %v, Go %v", x, gl[i], math.Log(x))
			}
		}
		if math.Float64bits(gc[i]) != math.Float64bits(math.Cos(x)) {
			if bad++; bad < 5 {
				t.Errorf("cos(%v): port %v, Go %v", x, gc[i], math.Cos(x))
			}
		}
	}
	if bad > 0 {
		t.Errorf("%d mismatches", bad)
	}
}

func TestModuleLoadFailure(t *testing.T) {
	s := cudatest.New(t, cudatest.Config{NoCtx: true})
	s.Fail("cuModuleLoadDataEx", 218, 0, 1)
	drv, err := cuda.Open(s.LibCUDA)
	if err != nil {
		t.Fatal(err)
	}
	d := drv.Devices()[0]
	info, err := d.Context()
	if err != nil || info.ModuleErr == nil || !strings.Contains(info.ModuleErr.Error(), "loading memsh's kernels: cuModuleLoadDataEx: a PTX JIT compilation failed (CUDA_ERROR_INVALID_PTX)") {
		t.Fatalf("context %+v, %v", info, err)
	}
	buf := alloc(t, d, 64) // memory still works
	err = d.Unary(cuda.Neg, cuda.F32, buf.p, buf.p, 16)
	if err == nil || !strings.Contains(err.Error(), "cuda:0: loading memsh's kernels") {
		t.Errorf("kernel after a failed load: %v", err)
	}
}

func TestSgemm(t *testing.T) {
	s, drv := open(t, cudatest.Config{NoCtx: true})
	d := drv.Devices()[0]
	path, version, err := d.BLAS()
	if err != nil || path != s.LibCUBLAS || version != 120402 {
		t.Fatalf("BLAS %q %d %v", path, version, err)
	}
	// Column-major A (2x3), B (3x2): C = A·B (2x2).
	A, B, C := alloc(t, d, 24), alloc(t, d, 24), alloc(t, d, 16)
	put(A, []float32{1, 4, 2, 5, 3, 6}) // [[1 2 3] [4 5 6]]
	put(B, []float32{7, 9, 11, 8, 10, 12})
	if err := d.Sgemm(false, false, 2, 2, 3, A.p, 2, B.p, 3, C.p, 2); err != nil {
		t.Fatal(err)
	}
	if got := get[float32](C, 4); got[0] != 58 || got[1] != 139 || got[2] != 64 || got[3] != 154 {
		t.Errorf("C = %v", got)
	}
	if s.BLASCalls() != 1 || s.BLASLast() != [8]int{0, 0, 2, 2, 3, 2, 3, 2} {
		t.Errorf("calls %d last %v", s.BLASCalls(), s.BLASLast())
	}
	s.BLASFail(13)
	if err := d.Sgemm(false, false, 2, 2, 3, A.p, 2, B.p, 3, C.p, 2); err == nil || !strings.Contains(err.Error(), "cublasSgemm: CUBLAS_STATUS_EXECUTION_FAILED") {
		t.Errorf("failed sgemm: %v", err)
	}
	// A matrix outside device memory is refused by the stub (as a fault
	// would be on a GPU).
	if err := d.Sgemm(false, false, 2, 2, 3, A.p+16, 2, B.p, 3, C.p, 2); err == nil {
		t.Error("out-of-range sgemm succeeded")
	}
}

func TestNoBLAS(t *testing.T) {
	s := cudatest.New(t, cudatest.Config{NoBLAS: true, NoCtx: true})
	drv, err := cuda.Open(s.LibCUDA)
	if err != nil {
		t.Fatal(err)
	}
	d := drv.Devices()[0]
	_, _, err = d.BLAS()
	if !errors.Is(err, cuda.ErrNoBLAS) || !strings.Contains(err.Error(), "MEMSH_LIBCUBLAS") {
		t.Fatalf("err = %v", err)
	}
	if err := d.Sgemm(false, false, 1, 1, 1, 0, 1, 0, 1, 0, 1); !errors.Is(err, cuda.ErrNoBLAS) {
		t.Errorf("Sgemm without cuBLAS: %v", err)
	}
}

var entryRE = regexp.MustCompile(`\.visible \.entry (\w+)\(`)

// TestPTX checks the embedded module: every kernel the Go code launches is
// an entry; no instruction fuses, flushes subnormals or approximates (each
// would break bit-equality with the CPU kernels).
func TestPTX(t *testing.T) {
	ptx := cuda.PTX()
	if !strings.Contains(ptx, ".version 4.1") || !strings.Contains(ptx, ".target sm_52") || !strings.Contains(ptx, ".address_size 64") {
		t.Error("unexpected PTX header")
	}
	var entries []string
	for _, m := range entryRE.FindAllStringSubmatch(ptx, -1) {
		entries = append(entries, m[1])
	}
	want := "memsh_fill64 memsh_binary memsh_unary memsh_cast memsh_sum_partial memsh_random memsh_math_check"
	if strings.Join(entries, " ") != want {
		t.Errorf("entries %v, want %s", entries, want)
	}
	for _, bad := range []string{"fma.", ".ftz", ".approx", "call.uni", "call "} {
		if strings.Contains(ptx, bad) {
			t.Errorf("the PTX contains %q", bad)
		}
	}
}

// TestPTXUpToDate regenerates kernels.ptx from kernels.cu with clang (the
// go:generate command) and compares.
func TestPTXUpToDate(t *testing.T) {
	clang, err := exec.LookPath("clang-14")
	if err != nil {
		t.Skip("clang-14 not found: cannot check that kernels.ptx is generated from kernels.cu (go generate ./backend/cuda)")
	}
	out := t.TempDir() + "/kernels.ptx"
	cmd := exec.Command(clang, "-x", "cuda", "--cuda-device-only", "-nocudainc", "-nocudalib", "--cuda-gpu-arch=sm_52", "-O2", "-ffp-contract=off", "-S", "-o", out, "kernels.cu")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("clang: %v\n%s", err, b)
	}
	got, _ := os.ReadFile(out)
	if string(got) != cuda.PTX() {
		t.Error("kernels.ptx is stale: run go generate ./backend/cuda")
	}
}
