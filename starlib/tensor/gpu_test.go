package tensor_test

import (
	"bytes"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	"go.starlark.net/starlark"
	"go.starlark.net/starlarktest"
	"go.starlark.net/syntax"

	"github.com/memsh/memsh/backend"
	"github.com/memsh/memsh/backend/cuda"
	"github.com/memsh/memsh/backend/cuda/cudatest"
	"github.com/memsh/memsh/backend/host"
	"github.com/memsh/memsh/backend/sim"
	"github.com/memsh/memsh/env"
	"github.com/memsh/memsh/internal/textdiff"
	"github.com/memsh/memsh/starlib/tensor"
)

// The GPU path is tested differentially: the same Starlark runs on the
// simulated GPU (whose values the CPU kernels compute) and on the stub CUDA
// driver (cudatest: the binding, the PTX kernels' source run on the CPU,
// staging through host copies), and must print the same values and leave
// the allocators with the same statistics — the same allocations, in the
// same order, with the same peaks.

type gpuFixture struct {
	t       testing.TB
	mgr     *backend.Manager
	gpu     backend.Allocator
	host    backend.Allocator
	thread  *starlark.Thread
	out     bytes.Buffer
	globals starlark.StringDict
	stub    *cudatest.Stub
}

func newGPUFixture(t testing.TB, dev backend.Device) *gpuFixture {
	f := &gpuFixture{t: t, gpu: backend.NewCachingAllocator(dev, 0), host: host.NewAllocator()}
	f.mgr = backend.NewManager(backend.Config{GPUs: []backend.Allocator{f.gpu}, Host: f.host})
	t.Cleanup(f.mgr.Close)
	f.thread = &starlark.Thread{Name: t.Name(), Print: func(_ *starlark.Thread, msg string) { f.out.WriteString(msg + "\n") }}
	env.Install(f.thread, env.New(f.mgr, &f.out))
	starlarktest.SetReporter(f.thread, t)
	f.globals = starlark.StringDict{}
	return f
}

// stubFixture is a fixture over device 0 of a fresh stub driver.
func stubFixture(t testing.TB, cfg cudatest.Config) *gpuFixture {
	s := cudatest.New(t, cfg)
	drv, err := cuda.Open(s.LibCUDA)
	if err != nil {
		t.Fatal(err)
	}
	f := newGPUFixture(t, drv.Devices()[0])
	f.stub = s
	return f
}

func simFixture(t testing.TB) *gpuFixture {
	return newGPUFixture(t, sim.New(sim.Spec{Count: 1, Total: 1 << 30})[0])
}

var gpuFileOptions = &syntax.FileOptions{TopLevelControl: true, GlobalReassign: true, While: true, Set: true, Recursion: true}

// exec runs src and returns what it printed and its error.
func (f *gpuFixture) exec(src string) (string, error) {
	assert, err := starlarktest.LoadAssertModule()
	if err != nil {
		f.t.Fatal(err)
	}
	pre := starlark.StringDict{"tensor": tensor.Module, "assert": assert["assert"]}
	for k, v := range f.globals {
		pre[k] = v
	}
	f.out.Reset()
	g, err := starlark.ExecFileOptions(gpuFileOptions, f.thread, "gpu.star", src, pre)
	for k, v := range g {
		f.globals[k] = v
	}
	return f.out.String(), err
}

// stats returns the GPU and host allocators' statistics after a reclaim.
func (f *gpuFixture) stats() (map[string]int64, map[string]int64) {
	f.mgr.Reclaim()
	return f.gpu.Stats(), f.host.Stats()
}

// gpuPrograms run on both devices. Values print exactly; sums use
// integer-valued data (the GPU adds in another order); matmul is compared
// apart (cuBLAS rounds differently).
var gpuPrograms = []string{
	// creation and fills of every dtype
	`for dt in ["float32", "float16", "bfloat16", "float64", "int64", "int32", "int16", "int8", "uint8", "bool"]:
    print(dt, tensor.zeros([2, 3], dtype=dt, device="cuda").tolist(), tensor.ones([3], dtype=dt, device="cuda").tolist())
    print(tensor.full([2, 2], 7, dtype=dt, device="cuda").tolist(), tensor.full([3], -1.5 if dt != "bool" else True, dtype=dt, device="cuda").tolist())
print(tensor.full([2], 1e300, dtype="float64", device="cuda").tolist(), tensor.full([2], -3, dtype="int64", device="cuda").tolist())
print(tensor.zeros([0], device="cuda").tolist(), tensor.zeros([2, 0, 3], device="cuda").shape)
print(tensor.arange(10, device="cuda").tolist(), tensor.arange(0.5, 3, 0.25, device="cuda").tolist())
print(tensor.tensor([[1, 2], [3, 4.5]], device="cuda").tolist(), tensor.tensor(3, device="cuda").item())
x = tensor.ones([3, 4], dtype="float16", device="cuda")
print(tensor.zeros_like(x).tolist(), tensor.full_like(x, 2.5).tolist(), tensor.ones_like(x, dtype="int8").tolist())`,

	// the random generator: same values on every device
	`tensor.manual_seed(1234)
for dt in ["float32", "float16", "bfloat16", "float64"]:
    print(dt, tensor.rand([5], dtype=dt, device="cuda").tolist())
    print(dt, tensor.randn([7], dtype=dt, device="cuda").tolist())
a = tensor.randn([3000], device="cuda")
b = tensor.rand([2, 1500], device="cuda")
print(a[2999].item(), b[1, 1499].item(), tensor.randn_like(b).tolist()[0][:3], tensor.rand_like(a)[:2].tolist())
print(str(a))`,

	// elementwise arithmetic with kernels (contiguous, same float dtype,
	// numbers, row / column / single-element broadcasting)
	`a = tensor.arange(12, dtype="float32", device="cuda").reshape(3, 4) / 7 - 0.75
b = tensor.tensor([1.0, -2.0, 0.5, 3.0], device="cuda")
c = tensor.tensor([[2.0], [-1.0], [0.25]], device="cuda")
s = tensor.tensor([3.0], device="cuda")
for r in [a + a, a - b, b * a, a / c, c - a, a * s, 2 * a, a / 3, 1 - a, a / 0, -a, a.add(b), a.div(c)]:
    print(r.tolist())
for dt in ["float16", "bfloat16", "float64"]:
    h = a.to(dt)
    print(dt, (h + h).tolist(), (h * 1.1).tolist(), (h / b.to(dt)).tolist(), (1 / h).tolist())
print(a.relu().tolist(), a.abs().tolist(), a.neg().tolist(), a.sqrt().tolist())
big = tensor.arange(3000, dtype="float32", device="cuda") / 7
print((big * big - big / 3).tolist()[2990:], (big.half() + 1).tolist()[-3:], big.sqrt().sum().item() > 0)`,

	// elementwise without kernels: integers, mixed dtypes, views, //, %,
	// transcendental functions, comparisons
	`i = tensor.arange(-6, 6, device="cuda").reshape(3, 4)
f = tensor.arange(12, dtype="float32", device="cuda").reshape(3, 4) / 5
h = f.half()
print((i + 1).tolist(), (i * i).tolist(), (i // 4).tolist(), (i % 5).tolist(), (i / 4).tolist())
print((f + h).tolist(), (h + i).tolist(), (f.t() + f.t()).tolist(), (f.narrow(1, 1, 2) * 2).tolist(), (f // 0.7).tolist(), (f % 0.3).tolist())
print(f.exp().tolist(), (f + 1).log().tolist(), f.tanh().tolist(), f.sigmoid().tolist(), i.abs().tolist(), (-i).tolist())
print(f.gt(1).tolist(), i.eq(0).tolist(), f.le(h).tolist(), f.equal(f.clone()), f.allclose(h, atol=0.01))
z = tensor.tensor(2.0)   # a 0-dim cpu tensor combines with GPU tensors
print((f * z).tolist())
print(1.5 in f, 1.6 in f, 4 in i)`,

	// in-place operations, fills, item assignment, copies
	`a = tensor.zeros([3, 4], device="cuda")
a.add_(1.5)
a.mul_(tensor.tensor([1.0, 2.0, 3.0, 4.0], device="cuda"))
a.sub_(a)
a.add_(tensor.arange(12, dtype="float32", device="cuda").reshape(3, 4))
a.div_(2)
print(a.tolist())
v = a[1]
v.fill_(9)
a[0] = 5
a[2, 3] = -1
a.narrow(1, 0, 2)[0] = tensor.tensor([7.0, 8.0], device="cuda")
print(a.tolist())
a.t().mul_(2)
print(a.tolist())
i = tensor.ones([4], dtype="int64", device="cuda")
i.add_(3)
i.mul_(i)
print(i.tolist())
h = tensor.ones([2, 2], dtype="float16", device="cuda")
h.add_(tensor.ones([2, 2], device="cuda"))   # float32 other: staged
print(h.tolist())
a.zero_()
print(a.sum().item())
c = tensor.arange(6, dtype="float32").reshape(2, 3)    # on the CPU
g = tensor.empty([2, 3], device="cuda")
g.copy_(c)
g2 = tensor.empty([2, 3], dtype="float16", device="cuda")
g2.copy_(g)
back = tensor.zeros([2, 3])
back.copy_(g2)
row = tensor.empty([2, 3], device="cuda")
row.copy_(tensor.tensor([1.0, 2.0, 3.0]))   # broadcast from the CPU: staged
print(g.tolist(), g2.tolist(), back.tolist(), row.tolist())
a.add_(a.t().t())`,

	// reductions and values
	`x = tensor.arange(24, dtype="float32", device="cuda").reshape(2, 3, 4) - 10
print(x.sum().item(), x.sum(dim=1).tolist(), x.sum(dim=[0, 2], keepdim=True).tolist(), x.mean().item(), x.mean(dim=-1).tolist())
m = x.max(dim=2)
print(x.max().item(), x.min().item(), m.values.tolist(), m.indices.tolist(), x.min(dim=0)[1].tolist())
print(x.to("float16").sum().item(), x.to("float64").sum().tolist(), x.to("bfloat16").sum().item())
print(tensor.arange(10, device="cuda").sum().item(), tensor.zeros([0], device="cuda").sum().item())
print(x[1, 2, 3].item(), x[0].tolist(), x.tolist()[1][0])
print(x.half(), x[0].t(), x[0, 0])`,

	// conversions and copies
	`x = tensor.arange(6, dtype="float32", device="cuda").reshape(2, 3) / 3
c = x.cpu()
print(c.device, c.tolist(), x.to("cpu", "float16").tolist(), x.double().tolist(), x.long().tolist(), x.bool().tolist())
y = c.cuda()
print(y.device, y.tolist(), c.to("cuda", dtype="bfloat16").tolist(), x.t().contiguous().tolist(), x.t().reshape(6).tolist())
print(x.clone().tolist(), x.half().float().tolist(), x.to(dtype="float64").half().tolist(), tensor.tensor(x, dtype="int32").tolist())
print(tensor.cat([x, x * 2], dim=1).tolist(), tensor.stack([x[0], x[1]]).tolist(), tensor.cat([x, c.cuda()]).shape)
big = tensor.arange(2 * 30 * 40, dtype="float32", device="cuda").reshape(2, 30, 40) / 9
print(big.transpose(1, 2))
print(big[1][3:29:2].half())
print(big[0, 0][0:1])`,
}

func TestGPUMatchesCPU(t *testing.T) {
	compareWithSim(t, stubFixture(t, cudatest.Config{GPUs: 1, NoCtx: true}), gpuPrograms)
}

// TestGPUWithoutKernels: when memsh's kernels cannot be loaded (a driver
// whose JIT refuses the PTX) and cuBLAS is missing, every operation takes
// the staged path and the results are still the CPU's.
func TestGPUWithoutKernels(t *testing.T) {
	g := stubFixture(t, cudatest.Config{GPUs: 1, NoCtx: true, NoBLAS: true})
	g.stub.Fail("cuModuleLoadDataEx", 218, 0, 1)
	compareWithSim(t, g, append(gpuPrograms, matmulProgram))
	if n := g.stub.LaunchCount(); n != 0 {
		t.Errorf("%d kernel launches without a module", n)
	}
}

// compareWithSim runs programs on g and on a simulator and compares.
func compareWithSim(t *testing.T, g *gpuFixture, programs []string) {
	s := simFixture(t)
	for i, src := range programs {
		name := fmt.Sprintf("program %d", i)
		wantOut, wantErr := s.exec(src)
		gotOut, gotErr := g.exec(src)
		if wantErr != nil {
			t.Errorf("%s fails on the simulator: %v", name, wantErr)
		}
		if fmt.Sprint(wantErr) != fmt.Sprint(gotErr) {
			t.Errorf("%s: error on the stub %v, on the simulator %v", name, gotErr, wantErr)
		}
		if gotOut != wantOut {
			t.Errorf("%s: output differs\nstub:\n%s\nsimulator:\n%s", name, gotOut, diffHint(gotOut, wantOut))
		}
		gg, gh := g.stats()
		sg, sh := s.stats()
		if !maps.Equal(gg, sg) {
			t.Errorf("%s: GPU allocator statistics differ:%s", name, statsDiff(gg, sg))
		}
		if !maps.Equal(gh, sh) {
			t.Errorf("%s: host allocator statistics differ:%s", name, statsDiff(gh, sh))
		}
		clear(g.globals)
		clear(s.globals)
	}
	// Nothing is left on the device but memsh's workspace and the cache.
	g.mgr.Reclaim()
	g.gpu.EmptyCache()
	if n := g.stub.LiveAllocs(); n != 1 || g.gpu.Allocated() != 0 {
		t.Errorf("%d live device allocations, %d bytes allocated", n, g.gpu.Allocated())
	}
}

// diffHint shows the first differing line.
func diffHint(got, want string) string {
	if n, a, b, ok := textdiff.FirstLine(got, want); ok {
		return fmt.Sprintf("line %d:\n  stub: %s\n  sim:  %s", n, a, b)
	}
	return want
}

func statsDiff(a, b map[string]int64) string {
	var out []string
	for _, k := range slices.Sorted(maps.Keys(b)) {
		if a[k] != b[k] {
			out = append(out, fmt.Sprintf("\n  %s: stub %d, simulator %d", k, a[k], b[k]))
		}
	}
	return strings.Join(out, "")
}
