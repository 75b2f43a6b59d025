package tensor_test

import (
	"bytes"
	"errors"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"go.starlark.net/starlark"
	"go.starlark.net/starlarktest"
	"go.starlark.net/syntax"

	"github.com/memsh/memsh/backend"
	"github.com/memsh/memsh/backend/host"
	"github.com/memsh/memsh/backend/sim"
	"github.com/memsh/memsh/env"
	"github.com/memsh/memsh/starlib/tensor"
)

const (
	kib = 1 << 10
	mib = 1 << 20
	gib = 1 << 30
)

// fixture is one Session-like setup: a Manager over one simulated GPU
// ("cuda:0", 1 GiB, or meta) and host memory, and a thread with the tensor
// and assert modules.
type fixture struct {
	t       testing.TB
	mgr     *backend.Manager
	gpu     backend.Allocator
	host    backend.Allocator
	thread  *starlark.Thread
	out     bytes.Buffer
	globals starlark.StringDict
}

func newFixture(t testing.TB, spec sim.Spec) *fixture {
	t.Helper()
	if spec.Count == 0 {
		spec.Count = 1
	}
	if spec.Total == 0 {
		spec.Total = 1 * gib
	}
	dev := sim.New(spec)[0]
	f := &fixture{t: t, gpu: backend.NewCachingAllocator(dev, 0), host: host.NewAllocator()}
	f.mgr = backend.NewManager(backend.Config{GPUs: []backend.Allocator{f.gpu}, Host: f.host})
	t.Cleanup(f.mgr.Close)
	f.thread = &starlark.Thread{Name: t.Name()}
	env.Install(f.thread, env.New(f.mgr, &f.out))
	starlarktest.SetReporter(f.thread, t)
	f.globals = starlark.StringDict{}
	return f
}

var fileOptions = &syntax.FileOptions{TopLevelControl: true, GlobalReassign: true, While: true, Set: true, Recursion: true}

func predeclared(t testing.TB) starlark.StringDict {
	assert, err := starlarktest.LoadAssertModule()
	if err != nil {
		t.Fatal(err)
	}
	return starlark.StringDict{"tensor": tensor.Module, "assert": assert["assert"]}
}

// exec runs src with the globals of earlier exec calls visible (as a REPL
// would) and keeps the names it binds.
func (f *fixture) exec(src string) error {
	f.t.Helper()
	pre := predeclared(f.t)
	for k, v := range f.globals {
		pre[k] = v
	}
	g, err := starlark.ExecFileOptions(fileOptions, f.thread, f.t.Name()+".star", src, pre)
	for k, v := range g {
		f.globals[k] = v
	}
	return err
}

func (f *fixture) run(src string) {
	f.t.Helper()
	if err := f.exec(src); err != nil {
		f.t.Fatalf("%s\nfailed: %v", src, err)
	}
}

// eval returns the value of expression expr.
func (f *fixture) eval(expr string) starlark.Value {
	f.t.Helper()
	f.run("_v = " + expr)
	v := f.globals["_v"]
	delete(f.globals, "_v")
	return v
}

// drop forgets globals (as if deleted) so their memory becomes unreachable.
func (f *fixture) drop(names ...string) {
	for _, n := range names {
		delete(f.globals, n)
	}
}

func (f *fixture) allocated() uint64 { return f.gpu.Allocated() }

// wantErr runs src, which must fail with an error containing want, and
// checks that a reclaim afterwards brings the GPU and host figures back to
// what they were before.
func (f *fixture) wantErr(src, want string) error {
	f.t.Helper()
	f.mgr.Reclaim()
	gpu0, host0 := f.gpu.Allocated(), f.host.Allocated()
	err := f.exec(src)
	if err == nil {
		f.t.Errorf("%s: succeeded, want error %q", src, want)
		return nil
	}
	if !strings.Contains(err.Error(), want) {
		f.t.Errorf("%s: got error\n\t%v\nwant it to contain\n\t%s", src, err, want)
	}
	f.mgr.Reclaim()
	if g, h := f.gpu.Allocated(), f.host.Allocated(); g != gpu0 || h != host0 {
		f.t.Errorf("%s: after the error and a reclaim, allocated gpu %d host %d, want %d %d", src, g, h, gpu0, host0)
	}
	return err
}

// TestStarlarkFiles runs testdata/*.star in go.starlark.net's chunked
// style: chunks separated by a "---" line, each run in a fresh session; a
// chunk with a line ending in `### "regexp"` must fail with an error
// matching the regexp.
func TestStarlarkFiles(t *testing.T) {
	files, err := os.ReadDir("testdata")
	if err != nil {
		t.Fatal(err)
	}
	wantRE := regexp.MustCompile(`###\s*"(.*)"\s*$`)
	for _, fi := range files {
		if !strings.HasSuffix(fi.Name(), ".star") {
			continue
		}
		data, err := os.ReadFile("testdata/" + fi.Name())
		if err != nil {
			t.Fatal(err)
		}
		line := 1
		for _, chunk := range splitChunks(string(data)) {
			start := line
			line += strings.Count(chunk, "\n") + 2 // the chunk and its "---" line
			t.Run(fi.Name()+":"+strconv.Itoa(start), func(t *testing.T) {
				f := newFixture(t, sim.Spec{})
				var want *regexp.Regexp
				for l := range strings.SplitSeq(chunk, "\n") {
					if m := wantRE.FindStringSubmatch(l); m != nil {
						want = regexp.MustCompile(m[1])
					}
				}
				// Pad with newlines so error positions match the file's lines.
				err := f.exec(strings.Repeat("\n", start-1) + chunk)
				switch {
				case want == nil && err != nil:
					if ee, ok := err.(*starlark.EvalError); ok {
						t.Error(ee.Backtrace())
					} else {
						t.Error(err)
					}
				case want != nil && err == nil:
					t.Errorf("chunk succeeded, want error matching %q", want)
				case want != nil && !want.MatchString(err.Error()):
					t.Errorf("error %q does not match %q", err, want)
				}
			})
		}
	}
}

func splitChunks(s string) []string {
	var chunks []string
	var cur []string
	for l := range strings.SplitSeq(s, "\n") {
		if l == "---" {
			chunks = append(chunks, strings.Join(cur, "\n"))
			cur = nil
			continue
		}
		cur = append(cur, l)
	}
	return append(chunks, strings.Join(cur, "\n"))
}

func TestAllocationFigures(t *testing.T) {
	f := newFixture(t, sim.Spec{})
	f.run(`
a = tensor.zeros([256, 1024, 256], device="cuda")
b = tensor.zeros(256, 1024, 256, device="cuda")
`)
	if got := f.allocated(); got != 512*mib {
		t.Fatalf("two 256 MiB float32 zeros: allocated %d, want %d", got, 512*mib)
	}
	// Views allocate nothing.
	f.run(`
v = a[3]
w = a[1:5]
x = a.view(-1)
y = a.transpose(0, 2)
z = a.reshape(1024, -1)
p = a.permute(2, 0, 1)
q = a.t() if a.ndim == 2 else a.T
s = a[1, 2]
u = a.unsqueeze(0).squeeze(0).flatten()
assert.eq(v.is_view, True)
assert.eq(v.storage_id, a.storage_id)
assert.eq(a.is_view, False)
`)
	if got := f.allocated(); got != 512*mib {
		t.Fatalf("views: allocated %d, want %d", got, 512*mib)
	}
	// In-place ops allocate nothing.
	f.run(`
a.add_(1)
a.mul_(b)
a.add_(2.5)
a.zero_()
a.fill_(3)
a.copy_(b)
a[0] = 7
a.sub_(b[0])
a.div_(2)
`)
	if got := f.allocated(); got != 512*mib {
		t.Fatalf("in-place ops: allocated %d, want %d", got, 512*mib)
	}
	f.drop("a", "b", "v", "w", "x", "y", "z", "p", "q", "s", "u")
	f.mgr.Reclaim()
	if got := f.allocated(); got != 0 {
		t.Fatalf("after dropping everything: allocated %d, want 0", got)
	}

	// a*b+c: a temporary and a result, 1 MiB each.
	f.run(`
a = tensor.ones(512, 512, device="cuda")
b = tensor.ones(512, 512, device="cuda")
c = tensor.ones(512, 512, device="cuda")
`)
	f.mgr.Reclaim()
	base := f.allocated()
	peak := f.gpu.Peaks().New(f.gpu.Allocated(), f.gpu.Reserved())
	defer peak.Close()
	f.run(`d = a * b + c`)
	if got := peak.MaxAllocated - base; got != 2*mib {
		t.Errorf("a*b+c: peak rose by %d, want %d (temporary and result)", got, 2*mib)
	}
	f.mgr.Reclaim()
	if got := f.allocated() - base; got != 1*mib {
		t.Errorf("a*b+c after reclaim: %d more allocated, want %d (the result)", got, 1*mib)
	}
	if v := f.eval(`d[511, 511].item()`); v != starlark.Float(2) {
		t.Errorf("d = %v, want 2.0", v)
	}

	// to() to the same device and dtype returns the tensor itself.
	f.run(`
e = d.to("cuda")
assert.true(e == d)
e = d.to("cuda:0", dtype="float32")
assert.true(e == d)
h = d.to("cpu")
`)
	f.mgr.Reclaim()
	if got := f.allocated() - base; got != 1*mib {
		t.Errorf("to(same): %d more allocated, want %d", got, 1*mib)
	}
	if got := f.host.Allocated(); got != 1*mib {
		t.Errorf("to(cpu): host allocated %d, want %d", got, 1*mib)
	}
}

func TestDtypeSizes(t *testing.T) {
	f := newFixture(t, sim.Spec{})
	for _, c := range []struct {
		name string
		size uint64
	}{{"float32", 4}, {"float16", 2}, {"bfloat16", 2}, {"float64", 8}, {"int64", 8}, {"int32", 4}, {"int16", 2}, {"int8", 1}, {"uint8", 1}, {"bool", 1}} {
		f.mgr.Reclaim()
		before := f.host.Allocated()
		f.run(`x = tensor.empty(1000, dtype="` + c.name + `")
assert.eq(x.element_size(), ` + strconv.Itoa(int(c.size)) + `)
assert.eq(x.nbytes, ` + strconv.Itoa(int(1000*c.size)) + `)
assert.eq(str(x.dtype), "` + c.name + `")
assert.eq(x.dtype, tensor.` + c.name + `)
assert.eq(x.dtype.itemsize, ` + strconv.Itoa(int(c.size)) + `)`)
		if got := f.host.Allocated() - before; got != 1000*c.size {
			t.Errorf("%s: 1000 elements allocated %d bytes, want %d", c.name, got, 1000*c.size)
		}
		f.drop("x")
	}
}

func TestErrors(t *testing.T) {
	f := newFixture(t, sim.Spec{})
	f.run(`keep = tensor.ones(1024, device="cuda")`)
	for _, c := range []struct{ src, want string }{
		{`tensor.zeros("abc")`, `tensor.zeros: for parameter shape: got string, want list or tuple`},
		{`tensor.zeros(shape="abc")`, `tensor.zeros: for parameter shape: got string, want list or tuple`},
		{`tensor.zeros([2, -3])`, `tensor.zeros: for parameter shape: negative dimension -3`},
		{`tensor.zeros(2, -3)`, `tensor.zeros: for parameter shape: negative dimension -3`},
		{`tensor.zeros([2, 2.5])`, `tensor.zeros: for parameter shape: element 1: got float, want int`},
		{`tensor.zeros([1 << 40, 1 << 40])`, `tensor.zeros: shape [1099511627776, 1099511627776] needs more than 2^62 bytes`},
		{`tensor.zeros([1 << 61], dtype="float32")`, `tensor.zeros: shape [2305843009213693952] needs more than 2^62 bytes`},
		{`tensor.zeros([2], dtype="float17")`, `tensor.zeros: unknown dtype "float17"`},
		{`tensor.zeros([2], dtype=3)`, `tensor.zeros: for parameter dtype: got int, want dtype or string`},
		{`tensor.zeros([2], device="tpu")`, `tensor.zeros: invalid device "tpu"`},
		{`tensor.zeros([2], device="cuda:3")`, `tensor.zeros: invalid device "cuda:3": 1 CUDA device available`},
		{`tensor.zeros([2], device=0)`, `tensor.zeros: for parameter device: got int, want string`},
		{`tensor.zeros([2], foo=1)`, `tensor.zeros: unexpected keyword argument "foo"`},
		{`tensor.ones(2, 3) + tensor.ones(3, 2)`, `tensor.add: the size of tensor a (3) must match the size of tensor b (2) at non-singleton dimension 1`},
		{`tensor.ones(2, device="cuda") + tensor.ones(2)`, `tensor.add: expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu`},
		{`tensor.ones(2) * tensor.ones(2, device="cuda")`, `tensor.mul: expected all tensors to be on the same device, but found at least two devices, cpu and cuda:0`},
		{`tensor.ones(3)[3]`, `index 3 is out of bounds for dimension 0 with size 3`},
		{`tensor.ones(3)[-4]`, `index -4 is out of bounds for dimension 0 with size 3`},
		{`tensor.ones(2, 3)[0, 3]`, `index 3 is out of bounds for dimension 1 with size 3`},
		{`tensor.ones(2, 3)[0, 1, 2]`, `too many indices for tensor of dimension 2`},
		{`tensor.ones(2).item()`, `tensor.item: a tensor with 2 elements cannot be converted to a number`},
		{`tensor.ones(2, 3).view(4)`, `tensor.view: shape '[4]' is invalid for input of size 6`},
		{`tensor.ones(2, 3).t().view(6)`, `tensor.view: view size is not compatible with input tensor's size and stride`},
		{`tensor.ones(2, 3).reshape(-1, -1)`, `tensor.reshape: only one dimension can be inferred`},
		{`tensor.ones(2, 3).transpose(0, 2)`, `tensor.transpose: dimension out of range (expected to be in range of [-2, 1], but got 2)`},
		{`tensor.ones(2, 3, 4).t()`, `tensor.t: t() expects a tensor with <= 2 dimensions, but self is 3D`},
		{`tensor.ones(2, 3).permute(0, 0)`, `tensor.permute: repeated dim in permute`},
		{`tensor.matmul(tensor.ones(2, 3), tensor.ones(4, 5))`, `tensor.matmul: mat1 and mat2 shapes cannot be multiplied (2x3 and 4x5)`},
		{`tensor.ones(2, 3).matmul(tensor.ones(3, 2, dtype="float64"))`, `tensor.matmul: expected both tensors to have the same dtype, but got: float32 != float64`},
		{`tensor.ones(2, dtype="int32").add_(1.5)`, `tensor.add_: result type float32 can't be cast to the desired output type int32`},
		{`tensor.ones(2, 3).add_(tensor.ones(3, 3))`, `tensor.add_: the size of tensor a (2) must match the size of tensor b (3) at non-singleton dimension 0`},
		{`tensor.ones(3).add_(tensor.ones(2, 3))`, `tensor.add_: output with shape [3] doesn't match the broadcast shape [2, 3]`},
		{`tensor.ones(2, dtype="bool") - tensor.ones(2, dtype="bool")`, `tensor.sub: subtraction, the`},
		{`-tensor.ones(2, dtype="bool")`, `tensor.neg: negation, the`},
		{`tensor.ones(2, dtype="int64").mean()`, `tensor.mean: could not infer output dtype`},
		{`tensor.rand(2, dtype="int32")`, `tensor.rand: for parameter dtype: want a floating-point dtype, got int32`},
		{`tensor.arange(0, 10, 0)`, `tensor.arange: for parameter step: step must be nonzero`},
		{`tensor.arange(10, 0, 1)`, `tensor.arange: upper bound and larger bound inconsistent with step sign`},
		{`tensor.cat([tensor.ones(2, 3), tensor.ones(2, 4)])`, `tensor.cat: sizes of tensors must match except in dimension 0`},
		{`tensor.cat([])`, `tensor.cat: expected a non-empty list of tensors`},
		{`tensor.stack([tensor.ones(2), tensor.ones(3)])`, `tensor.stack: stack expects each tensor to be equal size, but got [2] at entry 0 and [3] at entry 1`},
		{`tensor.ones(2) // tensor.zeros(2, dtype="int64") if False else tensor.ones(2, dtype="int64") // 0`, `tensor.floor_divide: ZeroDivisionError`},
		{`{tensor.ones(2): 1}`, `unhashable type: tensor`},
		{`tensor.ones(2) + "a"`, `unknown binary op: tensor + string`},
		{`tensor.ones(4).max(dim=(0, 1))`, `tensor.max: for parameter dim: got tuple, want int`},
		{`tensor.zeros(0).max()`, `tensor.max: expected reduction dim to be specified for input.numel() == 0`},
		{`(lambda x: x[1:].add_(x[:3]))(tensor.ones(4))`, `tensor.add_: unsupported operation: some elements of the input tensor and the written-to tensor refer to a single memory location`},
		{`tensor.ones(1, 3).expand(2, 3).add_(1)`, `tensor.add_: unsupported operation: more than one element of the written-to tensor refers to a single memory location`},
		{`tensor.ones(1).expand(4).fill_(1)`, `tensor.fill_: unsupported operation: more than one element`},
		{`tensor.ones(2, 2)[0] = tensor.ones(3)`, `tensor.__setitem__: the size of tensor a (2) must match the size of tensor b (3) at non-singleton dimension 0`},
		{`tensor.ones(2)["a"]`, `tensor index: got string, want int, None or tensor`},
		{`tensor.ones(2) + (1 << 70)`, `tensor.add: integer 1180591620717411303424 does not fit in int64`},
		{`tensor.zeros(True)`, `tensor.zeros: for parameter shape: got bool, want list or tuple`},
		{`tensor.ones(2).to("tpu")`, `tensor.to: invalid device "tpu"`},
		{`tensor.ones(2).sum(dim=1)`, `tensor.sum: dimension out of range (expected to be in range of [-1, 0], but got 1)`},
		{`tensor.ones(2, 2).sum(dim=(0, 0))`, `tensor.sum: dim 0 appears multiple times in the list of dims`},
		{`tensor.full([2], "a")`, `tensor.full: for parameter fill_value: got string, want number`},
		{`tensor.tensor([[1, 2], [3]])`, `tensor.tensor: expected sequence of length 2 at dim 1 (got 1)`},
		{`tensor.set_default_device("gpu")`, `tensor.set_default_device: invalid device "gpu"`},
	} {
		f.wantErr(c.src, c.want)
	}
	if got := f.allocated(); got != 4*kib {
		t.Errorf("after errors: allocated %d, want %d", got, 4*kib)
	}
}

// TestErrorAfterAllocation: an op that fails after allocating its result
// (integer division by zero is only found while computing) does not keep it.
func TestErrorAfterAllocation(t *testing.T) {
	f := newFixture(t, sim.Spec{})
	f.run(`x = tensor.arange(1 << 20, device="cuda")`)
	f.wantErr(`y = x // tensor.zeros_like(x)`, "tensor.floor_divide: ZeroDivisionError")
	if _, ok := f.globals["y"]; ok {
		t.Error("y was bound")
	}
}

func TestOOM(t *testing.T) {
	f := newFixture(t, sim.Spec{})
	f.run(`a = tensor.empty(768 * 1024 * 1024, dtype="uint8", device="cuda")`)
	err := f.wantErr(`b = tensor.empty(512 * 1024 * 1024, dtype="uint8", device="cuda")`, "CUDA out of memory. Tried to allocate 512.00 MiB")
	if !backend.IsOOM(err) {
		t.Errorf("error %v: IsOOM is false", err)
	}
	var oom *backend.OOMError
	if !errors.As(err, &oom) || oom.Requested != 512*mib {
		t.Errorf("errors.As: %v", oom)
	}
	if !strings.HasPrefix(errorMessage(err), "tensor.empty: CUDA out of memory") {
		t.Errorf("message %q lacks the builtin's name", errorMessage(err))
	}
	// Elementwise OOM.
	f.wantErr(`c = a + 1`, "tensor.add: CUDA out of memory")
}

func errorMessage(err error) string {
	if ee, ok := err.(*starlark.EvalError); ok {
		return ee.Msg
	}
	return err.Error()
}

func TestReleased(t *testing.T) {
	f := newFixture(t, sim.Spec{})
	f.run(`
x = tensor.ones(4, 4, device="cuda")
v = x[1]
`)
	x := f.globals["x"].(*tensor.Tensor)
	f.mgr.Release(x.HeldMemory(), "released when experiment 'bs=16' finished")
	const why = "memory on cuda:0 was released when experiment 'bs=16' finished"
	for _, c := range []struct{ src, name string }{
		{`x.sum()`, "tensor.sum"},
		{`v.sum()`, "tensor.sum"},
		{`x.item()`, "tensor.item"},
		{`x.tolist()`, "tensor.tolist"},
		{`x + 1`, "tensor.add"},
		{`x.add_(1)`, "tensor.add_"},
		{`x.clone()`, "tensor.clone"},
		{`x.to("cpu")`, "tensor.to"},
		{`x.view(16)`, "tensor.view"},
		{`tensor.matmul(x, x)`, "tensor.matmul"},
		{`tensor.cat([x, x])`, "tensor.cat"},
		{`tensor.zeros(4).copy_(x[0])`, "tensor.copy_"},
	} {
		f.wantErr(c.src, c.name+": "+why)
	}
	// Metadata still works; printing says why.
	f.run(`
assert.eq(x.shape, (4, 4))
assert.eq(x.nbytes, 64)
assert.true("released when experiment" in str(x))
`)
}

func TestMeta(t *testing.T) {
	data := newFixture(t, sim.Spec{})
	meta := newFixture(t, sim.Spec{Meta: true, Total: 80 * gib})
	src := `
a = tensor.zeros(1024, 1024, device="cuda")
b = tensor.randn(1024, 1024, device="cuda", dtype="float16")
c = a * 2 + 1
d = tensor.matmul(a, a)
e = a.sum(dim=0)
f = a.to(dtype="bfloat16")
g = a.clone()
h = tensor.cat([a, a], dim=1)
i = tensor.stack([a, a])
j = a.t().contiguous()
k = a.max(dim=1)
l = tensor.arange(1000, device="cuda")
a.add_(1)
a.zero_()
`
	data.run(src)
	meta.run(src)
	data.mgr.Reclaim()
	meta.mgr.Reclaim()
	if d, m := data.allocated(), meta.allocated(); d != m {
		t.Errorf("allocated: data mode %d, meta mode %d", d, m)
	}
	for _, c := range []struct{ src, name string }{
		{`a[0, 0].item()`, "tensor.item"},
		{`a.tolist()`, "tensor.tolist"},
		{`a.sum().item()`, "tensor.item"},
		{`1 in a`, "tensor.__contains__"},
	} {
		meta.wantErr(c.src, c.name+": device cuda:0 is meta: values are not stored")
	}
	meta.run(`
assert.eq(str(a), "tensor(..., device='cuda:0', size=(1024, 1024), meta=True)")
assert.eq(b.shape, (1024, 1024))
`)
	// Copies to a device that stores values would have to invent them.
	meta.wantErr(`s = a.to("cpu")`, "tensor.to: device cuda:0 is meta: values are not stored")
	meta.run(`h = tensor.zeros(2)`)
	meta.wantErr(`h.copy_(a[0].narrow(0, 0, 2))`, "tensor.copy_: device cuda:0 is meta: values are not stored")
	// Huge meta tensors cost no host memory.
	meta.run(`big = tensor.empty(16 * 1024 * 1024 * 1024, dtype="float32", device="cuda")`)
	if got := meta.allocated(); got < 64*gib {
		t.Errorf("64 GiB meta tensor: allocated %d", got)
	}
}

func TestHalfRounding(t *testing.T) {
	f := newFixture(t, sim.Spec{})
	f.run(`
# 1+2^-11 is halfway between 1 and 1+2^-10: ties to even, 1. 1+3*2^-11 is
# halfway between 1+2^-10 and 1+2^-9: ties to even, 1+2^-9. 65520 overflows;
# 2^-25 ties to 0; 1.5*2^-24 ties to 2^-23.
h = tensor.tensor([1.00048828125, 1.00146484375, 65504.0, 65520.0, 2.9802322387695312e-08, 8.940696716308594e-08], dtype="float16")
assert.eq(h.tolist(), [1.0, 1.001953125, 65504.0, float("inf"), 0.0, 1.1920928955078125e-07])
# bfloat16: 1+2^-8 ties to 1; 1+3*2^-8 ties to 1+2^-6; 1+2^-7 is exact
b = tensor.tensor([1.00390625, 1.01171875, 1.0078125], dtype="bfloat16")
assert.eq(b.tolist(), [1.0, 1.015625, 1.0078125])
# half arithmetic computes in float32 and rounds on store
x = tensor.full([1], 2048.0, dtype="float16")
assert.eq((x + 1).item(), 2048.0)
assert.eq((x + 3).item(), 2052.0)
assert.eq((x * 0.5).dtype, tensor.float16)
`)
}
