package tensor_test

import (
	"fmt"
	"math"
	"strings"
	"testing"

	"go.starlark.net/starlark"

	"github.com/memsh/memsh/backend"
	"github.com/memsh/memsh/backend/cuda/cudatest"
	"github.com/memsh/memsh/starlib/tensor"
)

// matmulProgram prints matrix products of every kind; with cuBLAS the 2-D
// float32 ones differ from the CPU's in the last bits, so it is compared
// exactly only when cuBLAS is missing (TestGPUWithoutKernels).
const matmulProgram = `tensor.manual_seed(7)
a = tensor.randn([5, 7], device="cuda")
b = tensor.randn([7, 3], device="cuda")
print(a.matmul(b).tolist(), a.t().t().matmul(b).tolist(), b.t().matmul(a.t()).tolist())
print(tensor.matmul(a[0], b).tolist(), a.matmul(b.select(1, 1)).tolist(), a[0].matmul(a[1]).item())
c = tensor.randn([2, 5, 7], device="cuda")
print(c.matmul(b).tolist(), a.half().matmul(b.half()).tolist())`

// TestGPUMatmul: float32 2-D products go to cuBLAS with the layout of each
// operand (row-major, or a transposed view) and agree with the CPU within
// float32 rounding; others are computed on the CPU through host copies and
// agree exactly.
func TestGPUMatmul(t *testing.T) {
	g := stubFixture(t, cudatest.Config{GPUs: 1, NoCtx: true})
	s := simFixture(t)
	for _, src := range []string{
		"tensor.manual_seed(7)\na = tensor.randn([5, 7], device='cuda')\nb = tensor.randn([7, 3], device='cuda')",
	} {
		if _, err := g.exec(src); err != nil {
			t.Fatal(err)
		}
		s.exec(src)
	}
	for _, tc := range []struct {
		expr string
		blas [8]int // transa, transb, m, n, k, lda, ldb, ldc of the cuBLAS call; zero: not cuBLAS
	}{
		{"a.matmul(b)", [8]int{0, 0, 3, 5, 7, 3, 7, 3}},
		{"b.t().matmul(a.t())", [8]int{1, 1, 5, 3, 7, 7, 3, 5}},
		{"a.t().contiguous().t().matmul(b)", [8]int{0, 1, 3, 5, 7, 3, 5, 3}},
		{"tensor.matmul(a[1:4], b.t().contiguous().t())", [8]int{1, 0, 3, 3, 7, 7, 7, 3}},
		{"a[0].matmul(b)", [8]int{}},                                   // 1-D: the CPU's
		{"tensor.randn([2, 5, 7], device='cuda').matmul(b)", [8]int{}}, // batched
		{"a.half().matmul(b.half())", [8]int{}},                        // float16
	} {
		before := g.stub.BLASCalls()
		got, err := g.exec("r = (" + tc.expr + ").tolist()")
		if err != nil {
			t.Fatalf("%s: %v", tc.expr, err)
		}
		_ = got
		s.exec("r = (" + tc.expr + ").tolist()")
		calls := g.stub.BLASCalls() - before
		if (calls == 1) != (tc.blas != [8]int{}) || (calls == 1 && g.stub.BLASLast() != tc.blas) {
			t.Errorf("%s: %d cuBLAS calls, last %v, want %v", tc.expr, calls, g.stub.BLASLast(), tc.blas)
		}
		exact := tc.blas == [8]int{}
		compareNested(t, tc.expr, g.globals["r"], s.globals["r"], exact)
	}
	if _, err := g.exec("tensor.ones([2, 3], device='cuda').matmul(tensor.ones([2, 3], device='cuda'))"); err == nil ||
		!strings.Contains(err.Error(), "tensor.matmul: mat1 and mat2 shapes cannot be multiplied (2x3 and 2x3)") {
		t.Errorf("shape error: %v", err)
	}
}

// compareNested compares nested lists of floats, exactly or within
// float32 rounding of the products.
func compareNested(t *testing.T, what string, got, want starlark.Value, exact bool) {
	t.Helper()
	gl, ok1 := got.(*starlark.List)
	wl, ok2 := want.(*starlark.List)
	if ok1 != ok2 {
		t.Fatalf("%s: %v vs %v", what, got, want)
	}
	if ok1 {
		if gl.Len() != wl.Len() {
			t.Fatalf("%s: lengths %d, %d", what, gl.Len(), wl.Len())
		}
		for i := range gl.Len() {
			compareNested(t, what, gl.Index(i), wl.Index(i), exact)
		}
		return
	}
	g, _ := starlark.AsFloat(got)
	w, _ := starlark.AsFloat(want)
	if exact && g != w || !exact && math.Abs(g-w) > 1e-5*(1+math.Abs(w)) {
		t.Errorf("%s: %v, CPU %v", what, g, w)
	}
}

// TestGPUErrors: bad operations on GPU tensors fail with the CPU's errors
// and leave nothing allocated.
func TestGPUErrors(t *testing.T) {
	g := stubFixture(t, cudatest.Config{GPUs: 1, NoCtx: true})
	s := simFixture(t)
	setup := `x = tensor.ones([2, 3], device="cuda")
y = tensor.ones([4], device="cuda")
b = tensor.ones([3], dtype="bool", device="cuda")
v = tensor.arange(6, dtype="float32", device="cuda")`
	for _, f := range []*gpuFixture{g, s} {
		if _, err := f.exec(setup); err != nil {
			t.Fatal(err)
		}
	}
	for _, src := range []string{
		"x + y", "x.add(y)", "x.mul_(y)", "y.add_(x)", "x.item()", "v[0:4].add_(v[2:6])", "v[0:4].copy_(v[2:6])",
		"b - b", "-b", "x.matmul(y)", "x.sum(dim=5)", "x.max(dim=2)", "x.view(5)", "x[2] = 1", "x[0] = y",
		"tensor.cat([x, y])", "tensor.stack([x, x.t()])", "x.fill_(y)", "x.to('cuda:1')", "tensor.zeros_like(x, device='cuda:3')",
		"x.div(x, out=y)", "tensor.ones([2], dtype='int64', device='cuda') // tensor.zeros([2], dtype='int64', device='cuda')",
	} {
		g.mgr.Reclaim()
		before := g.gpu.Allocated()
		_, gotErr := g.exec(src)
		_, wantErr := s.exec(src)
		if gotErr == nil || fmt.Sprint(gotErr) != fmt.Sprint(wantErr) {
			t.Errorf("%s: error on the stub %v, on the simulator %v", src, gotErr, wantErr)
		}
		g.mgr.Reclaim()
		if a := g.gpu.Allocated(); a != before {
			t.Errorf("%s: %d bytes allocated after the error, %d before", src, a, before)
		}
	}
}

// TestGPUOutOfMemory: kernels and staged operations fail with PyTorch's
// message before computing, and leave the device as it was.
func TestGPUOutOfMemory(t *testing.T) {
	g := stubFixture(t, cudatest.Config{GPUs: 1, Mem: 64 << 20, NoCtx: true})
	if _, err := g.exec(`a = tensor.ones([6, 1024, 1024], device="cuda")   # 24 MiB
b = tensor.ones([6, 1024, 1024], device="cuda")`); err != nil {
		t.Fatal(err)
	}
	for _, src := range []string{
		"c = a + b",      // a kernel
		"c = a.exp()",    // staged
		"c = a.double()", // a cast
		"c = tensor.cat([a, b])",
		"c = tensor.arange(8 << 20, dtype='float32', device='cuda')",
		"c = tensor.randn([6, 1024, 1024], device='cuda')",
	} {
		g.mgr.Reclaim()
		before, live := g.gpu.Allocated(), g.stub.LiveAllocs()
		_, err := g.exec(src)
		if err == nil || !backend.IsOOM(err) || !strings.Contains(err.Error(), "CUDA out of memory. Tried to allocate") {
			t.Errorf("%s: %v, want an OOM error", src, err)
		}
		g.mgr.Reclaim()
		if g.gpu.Allocated() != before || g.stub.LiveAllocs() != live {
			t.Errorf("%s: allocated %d (was %d), %d device allocations (were %d)", src, g.gpu.Allocated(), before, g.stub.LiveAllocs(), live)
		}
	}
	// Freeing b makes room: the same operations now work.
	delete(g.globals, "b")
	if out, err := g.exec("c = a.exp()\nprint(c[5, 1023, 1023].item())"); err != nil || out != "2.7182817459106445\n" {
		t.Errorf("after freeing: %q, %v", out, err)
	}
}

// TestGPUReleased: a GPU tensor whose memory was released (an experiment
// finished) reports it, and still prints.
func TestGPUReleased(t *testing.T) {
	g := stubFixture(t, cudatest.Config{GPUs: 1, NoCtx: true})
	if _, err := g.exec("x = tensor.ones([4], device='cuda')\nv = x[1:3]"); err != nil {
		t.Fatal(err)
	}
	x := g.globals["x"].(*tensor.Tensor)
	g.mgr.Release(x.HeldMemory(), "released when experiment 'e' finished")
	for _, src := range []string{"v + 1", "v.sum()", "v.item()", "v.tolist()", "v.add_(1)", "v.cpu()", "v[0] = 2", "print(1 in v)"} {
		_, err := g.exec(src)
		if err == nil || !strings.Contains(err.Error(), "memory on cuda:0 was released when experiment 'e' finished") {
			t.Errorf("%s: %v", src, err)
		}
	}
	if s := x.String(); !strings.Contains(s, "device='cuda:0'") {
		t.Errorf("str of released memory: %q", s)
	}
}

// TestGPUStagingCopiesSpan: staging copies only the part of a storage the
// operation's arguments touch.
func TestGPUStagingCopiesSpan(t *testing.T) {
	g := stubFixture(t, cudatest.Config{GPUs: 1, NoCtx: true})
	if _, err := g.exec("x = tensor.arange(1 << 20, dtype='float32', device='cuda')"); err != nil {
		t.Fatal(err)
	}
	before := g.stub.Calls("cuMemcpyDtoH_v2")
	out, err := g.exec("print(x[1000].item(), x[5:8].exp().tolist()[0] > 148)")
	if err != nil || out != "1000.0 True\n" {
		t.Fatalf("%q %v", out, err)
	}
	// item: one 4-byte copy; exp: the 3-element span, then the result.
	if n := g.stub.Calls("cuMemcpyDtoH_v2") - before; n != 3 {
		t.Errorf("%d device-to-host copies", n)
	}
}

// TestGPUPrintCopiesShownElements: printing a large GPU tensor copies only
// the elements the summary shows.
func TestGPUPrintCopiesShownElements(t *testing.T) {
	g := stubFixture(t, cudatest.Config{GPUs: 1, NoCtx: true})
	if _, err := g.exec("x = tensor.arange(1 << 20, dtype='float32', device='cuda').reshape(64, 128, 128)"); err != nil {
		t.Fatal(err)
	}
	before := g.stub.Calls("cuMemcpyDtoH_v2")
	out, err := g.exec("print(x)")
	if err != nil || !strings.Contains(out, "1.0486e+06]]], device='cuda:0')") {
		t.Fatalf("%q %v", out, err)
	}
	if n := g.stub.Calls("cuMemcpyDtoH_v2") - before; n != 6*6*6 {
		t.Errorf("%d device-to-host copies, want 216", n)
	}
}
