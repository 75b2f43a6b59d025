package scope_test

import (
	"fmt"
	"io"
	"reflect"
	"testing"

	"go.starlark.net/starlark"

	"github.com/memsh/memsh/backend"
	"github.com/memsh/memsh/scope"
)

// probe(*args, **kwargs) reclaims and returns what the reclaim was:
// "proven" (the reach walk found every live allocation, no Go
// collection), "walked N" (the walk freed N allocations it proved
// unreachable, no Go collection), "collected" (the collector ran and
// freed nothing) or "freed N" (the collector freed N allocations).
func probe(s *scope.Session) *starlark.Builtin {
	return starlark.NewBuiltin("probe", func(*starlark.Thread, *starlark.Builtin, starlark.Tuple, []starlark.Tuple) (starlark.Value, error) {
		before := s.Manager().Stats().WalkReclaims
		r := s.Manager().Reclaim()
		switch {
		case r.Proven:
			return starlark.String("proven"), nil
		case s.Manager().Stats().WalkReclaims > before:
			return starlark.String(fmt.Sprintf("walked %d", r.Count)), nil
		case r.Count == 0:
			return starlark.String("collected"), nil
		}
		return starlark.String(fmt.Sprintf("freed %d", r.Count)), nil
	})
}

// TestReachProof: a reclaim is answered without a Go collection exactly
// when the reach walk reaches every live allocation — wherever a Starlark
// value holds it: globals, locals and captured variables of running
// functions, arguments on the operand stack, containers, memsh values,
// autograd graphs, optimizer state — and goes to the collector, which
// frees the garbage, when something is unreachable.
func TestReachProof(t *testing.T) {
	cases := []struct{ name, src, want string }{
		{"nothing allocated", `r = probe()`, "proven"},
		{"global", `x = tensor.zeros([256], device="cuda")
r = probe()`, "proven"},
		{"garbage", `x = tensor.zeros([256], device="cuda")
x = tensor.zeros([256], device="cuda")
r = probe()`, "walked 1"},
		{"local of a running function", `def f():
    t = tensor.ones([64], device="cuda")
    return probe()
r = f()`, "proven"},
		{"captured variable", `def f():
    t = tensor.ones([64], device="cuda")
    def g():
        return (t, probe())
    return g()[1]
r = f()`, "proven"},
		{"argument on the operand stack", `def f(a, b):
    return b
r = f(tensor.ones([64], device="cuda"), probe())`, "proven"},
		{"list being built", `r = [tensor.ones([8], device="cuda") for i in range(3)] + [probe()]
r = r[-1]`, "proven"},
		{"containers", `d = {"a": [tensor.ones([8], device="cuda")], "b": (tensor.ones([8], device="cuda"),)}
s = [{1: tensor.ones([8], device="cuda")}]
r = probe()`, "proven"},
		{"default value", `def f(t = tensor.ones([8], device="cuda")):
    return t
r = probe()`, "proven"},
		{"module and optimizer", `m = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).to("cuda")
opt = optim.AdamW(m.parameters(), lr=0.01)
loss = m(tensor.randn([4, 8], device="cuda")).sum()
loss.backward()
opt.step()
r = probe()
r = probe()`, "proven"},
		{"autograd graph", `w = tensor.randn([8, 8], device="cuda", requires_grad=True)
h = tensor.randn([4, 8], device="cuda").matmul(w).relu()
loss = (h * h).sum()
r = probe()
r = probe()`, "proven"},
		// h * h (sum saves nothing) is garbage; the matmul's result (relu
		// saves its output) was, and the peak reclaim before h * h freed it
		{"graph temporaries", `w = tensor.randn([8, 8], device="cuda", requires_grad=True)
h = tensor.randn([4, 8], device="cuda").matmul(w).relu()
loss = (h * h).sum()
r = probe()`, "walked 1"},
		{"dropped graph", `w = tensor.randn([8, 8], device="cuda", requires_grad=True)
loss = tensor.randn([4, 8], device="cuda").matmul(w).relu().sum()
loss = None
r = probe()`, "walked 3"},
		{"top-level loop binding", `for i in range(2):
    t = tensor.ones([8], device="cuda")
    r = probe()`, "walked 1"},
		// what running Go code holds, found through the frames
		{"a call's keyword argument", `r = probe(t=tensor.ones([64], device="cuda"))`, "proven"},
		{"a call's unpacked arguments", `r = probe(*[tensor.ones([64], device="cuda")])`, "proven"},
		{"the list a for loop iterates", `def f():
    for t in [tensor.ones([8], device="cuda"), 1]:
        t = None
        return probe()
r = f()`, "proven"},
		// the Linear's weights on the host are garbage after .to; the
		// module, held only as the running call's callable, keeps the rest
		// a function reads its globals from the live map when it runs,
		// as Python's from its module's dict: it keeps no old value
		{"a function's module globals", `a, f = tensor.ones([64], device="cuda"), lambda: a
r = probe()`, "proven"},
		{"a function's re-bound global", `a, f = tensor.ones([64], device="cuda"), lambda: a
a = None
r = probe()`, "walked 1"},
		// (the host weight went at the peak reclaim before the bias's copy)
		{"a called module", `r = nn.Module(lambda self: probe(), w=nn.Linear(4, 4).to("cuda"))()`, "walked 1"},
		// garbage made inside a built-in that calls back: a transparent
		// one (autocast) lets the walk free it; another (sorted) may hold
		// what it made, so the collector decides
		{"inside a transparent built-in", `def k(i):
    x = tensor.ones([8], device="cuda")
    x = None
    return probe()
r = nn.autocast(k, 1)`, "walked 1"},
		{"inside another built-in", `out = []
def k(i):
    x = tensor.ones([8], device="cuda")
    x = None
    out.append(probe())
    return i
sorted([1], key=k)
r = out[0]`, "freed 1"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s, _ := newSession(t, "sim:1GiB")
			s.Set("probe", probe(s))
			if err := s.Exec("reach.star", tc.src); err != nil {
				t.Fatal(err)
			}
			got, _ := starlark.AsString(s.Get("r"))
			if got != tc.want {
				t.Errorf("reclaim: %s, want %s", got, tc.want)
			}
		})
	}
}

// trainingSetup defines a model m, its optimizer opt and a training step
// step(x, y) on the simulated GPU.
const trainingSetup = `
m = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Dropout(0.1), nn.Linear(256, 10)).to("cuda")
opt = optim.AdamW(m.parameters(), lr=0.001)
def step(x, y):
    loss = nn.functional.cross_entropy(m(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss
`

// TestReachProofAgreesWithCollector runs training steps in exact mode with
// every proof and every walk-freed allocation checked by a collection
// (MEMSH_VERIFY_RECLAIM's check, which panics when the collector finds
// garbage the walk said was reachable, or reachable what the walk freed),
// through autocast, checkpointing, dropout and AdamW; most reclaims are
// settled by the walk.
func TestReachProofAgreesWithCollector(t *testing.T) {
	t.Setenv("MEMSH_VERIFY_RECLAIM", "1")
	s, _ := newSession(t, "sim:4GiB")
	err := s.Exec("train.star", trainingSetup+`
for i in range(3):
    e = experiment("step %d" % i)
    nn.autocast(step, tensor.randn([32, 64], device="cuda"), tensor.zeros([32], dtype="int64", device="cuda"))
    nn.checkpoint(m, tensor.randn([32, 64], device="cuda", requires_grad=True)).sum().backward()
    e.finish()
`)
	if err != nil {
		t.Fatal(err)
	}
	st := s.Manager().Stats()
	if st.ProvenReclaims == 0 || st.WalkReclaims == 0 {
		t.Errorf("of %d reclaims, %d proven and %d freed by the walk: want some of each", st.Reclaims, st.ProvenReclaims, st.WalkReclaims)
	}
	if collected := st.Collections(); 2*collected > st.Reclaims {
		t.Errorf("%d of %d reclaims ran a collection", collected, st.Reclaims)
	}
	t.Logf("%d of %d reclaims proven, %d freed by the walk (%d peak-triggered)", st.ProvenReclaims, st.Reclaims, st.WalkReclaims, st.PeakReclaims)
}

// TestReachNoLiveAllocation: a Manager with nothing allocated needs no
// collection to know it.
func TestReachNoLiveAllocation(t *testing.T) {
	s, _ := newSession(t, "sim:1GiB")
	s.Manager().SetReach(nil)
	if r := s.Manager().Reclaim(); !r.Proven {
		t.Errorf("reclaim with nothing allocated: %+v, want proven", r)
	}
	if err := s.Exec("x.star", `x = tensor.zeros([4], device="cuda")`); err != nil {
		t.Fatal(err)
	}
	if r := s.Manager().Reclaim(); r.Proven {
		t.Errorf("reclaim without a reach walk proved %+v", r)
	}
}

// TestWalkFreesAsTheCollector: the collector is the oracle. The same
// scripts run twice, once with every reclaim left to the collector
// (MEMSH_RECLAIM=gc) and once as usual, in exact peak mode;
// every memory event — each allocation and free and each segment, in
// order, with its size and the allocator's figures after it — must be the
// same (addresses aside: they are the process's mappings).
func TestWalkFreesAsTheCollector(t *testing.T) {
	scripts := map[string]string{
		"training": trainingSetup + `
for i in range(2):
    nn.autocast(step, tensor.randn([32, 64], device="cuda"), tensor.zeros([32], dtype="int64", device="cuda"))
    nn.checkpoint(m, tensor.randn([32, 64], device="cuda", requires_grad=True)).sum().backward()
`,
		"rms_norm and flash attention, checkpointed": `
blk = nn.Sequential(nn.RMSNorm(256), nn.Linear(256, 256)).to("cuda")
def attn(q):
    return nn.sdpa_kernel("flash", nn.functional.scaled_dot_product_attention, q, q, q)
for i in range(2):
    x = tensor.randn([64, 256], device="cuda", requires_grad=True)
    nn.checkpoint(blk, x).sum().backward()
    nn.autocast(lambda: nn.checkpoint(blk, x).sum(), dtype="bfloat16").backward()
    q = tensor.randn([2, 4, 128, 64], device="cuda", dtype="bfloat16", requires_grad=True)
    nn.checkpoint(attn, q).sum().backward()
`,
		"loops and containers": `
keep = []
for i in range(20):
    t = tensor.ones([256 * (i + 1)], device="cuda")
    if i % 3 == 0:
        keep.append(t * 2)
    if i % 5 == 0:
        keep.pop(0)
d = {str(i): tensor.zeros([64], device="cuda") for i in range(10)}
d = {k: v + 1 for k, v in d.items() if int(k) % 2}
r = sorted([tensor.ones([8 * i + 8], device="cuda") for i in range(4)], key=lambda t: -t.numel())
`,
	}
	for name, src := range scripts {
		for _, mode := range []backend.PeakMode{backend.PeakExact} {
			t.Run(name+"/"+mode.String(), func(t *testing.T) {
				run := func(reclaim string) ([]backend.Event, backend.ManagerStats) {
					t.Setenv("MEMSH_RECLAIM", reclaim)
					s, err := scope.New(scope.Options{Device: "sim:4GiB", Peak: mode, Out: io.Discard, Err: io.Discard})
					if err != nil {
						t.Fatal(err)
					}
					defer s.Close()
					var evs []backend.Event
					defer s.Manager().Observe(func(e backend.Event) {
						e.Addr = 0 // the host's and the simulator's mappings are the process's
						evs = append(evs, e)
					})()
					if err := s.Exec("script.star", src); err != nil {
						t.Fatal(err)
					}
					return evs, s.Manager().Stats()
				}
				want, gcStats := run("gc")
				got, st := run("")
				if st.WalkReclaims == 0 {
					t.Errorf("no reclaim freed by the walk: %+v", st)
				}
				t.Logf("collections: %d of %d reclaims with MEMSH_RECLAIM=gc, %d of %d without", gcStats.Collections(), gcStats.Reclaims, st.Collections(), st.Reclaims)
				for i := range min(len(got), len(want)) {
					if !reflect.DeepEqual(got[i], want[i]) { // Event.Args is a slice
						t.Fatalf("event %d: %+v, with the collector %+v", i, got[i], want[i])
					}
				}
				if len(got) != len(want) {
					t.Fatalf("%d events, with the collector %d", len(got), len(want))
				}
			})
		}
	}
}

// TestReclaimsNeedNoCollection: reclaims that used to fall back to a Go
// collection although a reference-counted runtime would know at once
// what is garbage are settled by the walk — each case's measured
// statement runs no collection — with every proof and every walk-freed
// allocation checked by a collection (MEMSH_VERIFY_RECLAIM):
//
//   - a recursion's innermost level dropping tensors while the frames
//     below it are kept from an earlier walk (whose horizon is not that
//     walk's now);
//
//   - AdamW's first step, whose moments are made one after another
//     (those already made are in the optimizer's state, where the walk
//     sees them);
//
//   - rms_norm's forward inside a checkpointed region (its intermediates
//     held while the next is made, and dropped after: autograd keeps none
//     of them when the region's saved tensors are packed away), and flash
//     attention's forward (its output and logsumexp held while the rest
//     is allocated).
//
//   - a tensor-parallel block's forward and backward (RowwiseParallel's
//     Partial output held while it is reduced, all-reduced to Replicate
//     or reduce-scattered to Shard(1));
//
//   - batch norm, convolution, max pooling, layer norm and cross entropy,
//     forward and backward, and an embedding's backward over more than
//     3,072 indices (their results, contiguous copies and sort buffers
//     held from when each is made; the arange the sort drops noted as
//     dropped), and an empty allocation a running op holds (0 bytes count
//     in no statistic, so the walk leaves it for later).
//
// Backward nodes that hold intermediates of their own still leave some
// reclaims to the collector (bench/README.md counts them).
func TestReclaimsNeedNoCollection(t *testing.T) {
	t.Setenv("MEMSH_VERIFY_RECLAIM", "1")
	cases := []struct {
		name, setup, measured string
		mode                  backend.PeakMode
	}{
		{"recursion with kept frames", `
def f(n):
    if n == 0:
        for i in range(40):
            t = tensor.zeros([1024 * (i % 4 + 1)], device="cuda")
        return
    f(n - 1)
`, "f(30)", backend.PeakExact},
		{"AdamW's first step", `
m = nn.Sequential(nn.Linear(1024, 1024), nn.Linear(1024, 1024), nn.Linear(1024, 16)).to("cuda")
opt = optim.AdamW(m.parameters(), lr=0.001)
m(tensor.randn([8, 1024], device="cuda")).sum().backward()
`, "opt.step()", backend.PeakExact},
		{"rms_norm in a checkpointed region", `
blk = nn.Sequential(nn.RMSNorm(1024), nn.Linear(1024, 1024)).to("cuda")
x = tensor.randn([256, 1024], device="cuda", requires_grad=True)
`, `y = nn.autocast(lambda: nn.checkpoint(blk, x).sum(), dtype="bfloat16")`, backend.PeakExact},
		{"a convolutional block", `
blk = nn.Sequential(nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2)).to("cuda")
x = tensor.randn([64, 16, 32, 32], device="cuda")
`, "blk(x).sum().backward()", backend.PeakExact},
		{"layer norm, embedding and cross entropy", `
emb = nn.Embedding(1000, 256).to("cuda")
ln = nn.LayerNorm(256).to("cuda")
head = nn.Linear(256, 1000).to("cuda")
idx = tensor.randint(0, 1000, [8, 512], device="cuda")
`, "nn.functional.cross_entropy(head(ln(emb(idx))).view(-1, 1000), idx.view(-1)).backward()", backend.PeakExact},
		// each constructor holds the tensors it made while it makes the
		// next (every one raises the peak)
		{"constructors on the GPU", `
def build():
    return nn.Sequential(nn.Conv2d(3, 16, 3, device="cuda"), nn.BatchNorm2d(16, device="cuda"),
                         nn.LayerNorm(16, device="cuda"), nn.RMSNorm(16, device="cuda"), nn.Linear(16, 16, device="cuda"))
`, "blk = build()", backend.PeakExact},
		{"flash attention", `
q = tensor.randn([4, 8, 512, 64], device="cuda", dtype="bfloat16", requires_grad=True)
`, `o = nn.sdpa_kernel("flash", nn.functional.scaled_dot_product_attention, q, q, q)`, backend.PeakExact},
		// a tensor-parallel block: RowwiseParallel's Partial output is
		// held while it is reduced (all-reduce, reduce-scatter)
		{"tensor parallel", `
mesh = dist.init_device_mesh("cuda", (4,), mesh_dim_names = ("tp",))
P = dist.tensor.parallel
def mlpf(self, x):
    return self.down(self.up(x))
m = nn.Module(mlpf, up = nn.Linear(256, 1024, bias = False), down = nn.Linear(1024, 256, bias = False)).to("cuda")
m2 = nn.Module(mlpf, up = nn.Linear(256, 1024, bias = False), down = nn.Linear(1024, 256, bias = False)).to("cuda")
P.parallelize_module(m, mesh["tp"], {"up": P.ColwiseParallel(), "down": P.RowwiseParallel()})
P.parallelize_module(m2, mesh["tp"], {"up": P.ColwiseParallel(), "down": P.RowwiseParallel(output_layouts = dist.tensor.Shard(1))})
x = tensor.randn([8, 64, 256], device="cuda", requires_grad=True)
`, "y = m2(x)\ny.sum().backward()\ny = m(x)", backend.PeakExact},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s, err := scope.New(scope.Options{Device: "sim:4GiB", Peak: c.mode, Out: io.Discard, Err: io.Discard})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			if err := s.Exec("setup.star", c.setup); err != nil {
				t.Fatal(err)
			}
			before := s.Manager().Stats()
			if err := s.Exec("measured.star", c.measured); err != nil {
				t.Fatal(err)
			}
			st := s.Manager().Stats().Since(before)
			if st.Reclaims == 0 || st.Collections() != 0 {
				t.Fatalf("%d reclaims, %d of them collections; want some, none", st.Reclaims, st.Collections())
			}
			t.Logf("%d reclaims (%d walks freed garbage), no collection", st.Reclaims, st.WalkReclaims)
		})
	}
}

// A reclaim while an interrupt is pending, in a session holding many
// values, stops: the walk stops (env's TestWalkerStop) and no collection
// follows (backend's TestStoppedWalkCollectsNothing), which could hold up
// the interrupt; the garbage goes at the next statement's reclaim, and
// later walks are not held back (backend's TestStoppedWalkKeepsWalking).
func TestInterruptStopsWalk(t *testing.T) {
	s, _ := newSession(t, "sim:1GiB")
	if err := s.Exec("many.star", `objs = [{"i": i} for i in range(50000)]
x = tensor.zeros([256], device="cuda")
x = None
`); err != nil {
		t.Fatal(err)
	}
	m := s.Manager()
	before := m.Stats()
	s.Interrupt()
	r := m.Reclaim()
	st := m.Stats().Since(before)
	if st.Collections() != 0 || st.StoppedReclaims != 1 || r.Count != 0 {
		t.Errorf("interrupted reclaim: %d collections, %d stopped, %d freed; want 0, 1, 0", st.Collections(), st.StoppedReclaims, r.Count)
	}
	// the interrupt stops the statement that runs next (it fails at
	// once), as in the REPL
	if err := s.Exec("stopped.star", "y = 1"); err == nil {
		t.Fatal("the statement after Interrupt ran")
	}
	if err := s.Exec("next.star", "n = cuda.memory_allocated()"); err != nil {
		t.Fatal(err)
	}
	if n := s.Get("n"); n == nil || n.String() != "0" {
		t.Errorf("the next statement sees %v bytes allocated, want 0", n)
	}
}

// A reclaim during backward() reuses what the walk before it found in the
// frames and globals while no Starlark code ran since (reach_memo.go):
// with every proof and every walk-freed allocation checked by a
// collection (MEMSH_VERIFY_RECLAIM), the training steps reclaim exactly
// what they reclaim with the memo off (MEMSH_REACH_MEMO=0), to the byte,
// with the same peaks, and most of backward's walks are reused — also
// through a checkpointed region's recomputation, which runs Starlark code
// above backward (the memo holds through it unless that code changes an
// existing value, as the region below that empties a global's list
// does).
func TestBackwardReusesWalks(t *testing.T) {
	t.Setenv("MEMSH_VERIFY_RECLAIM", "1")
	const src = `
blocks = [nn.Sequential(nn.LayerNorm(256), nn.Linear(256, 1024), nn.GELU(), nn.Linear(1024, 256)).to("cuda") for i in range(4)]
head = nn.Linear(256, 512).to("cuda")
params = []
for b in blocks:
    params += b.parameters()
opt = optim.AdamW(params + head.parameters(), lr=0.001)
x = tensor.randn([64, 256], device="cuda")
y = tensor.randint(0, 512, [64], device="cuda")
def step(ckpt):
    h = x
    for b in blocks:
        h = h + (nn.checkpoint(b, h) if ckpt else b(h))
    loss = nn.functional.cross_entropy(head(h), y)
    loss.backward()
    opt.step()
    opt.zero_grad()
for i in range(2):
    step(False)
    step(True)
`
	// A checkpointed region whose recomputation (its second call, inside
	// backward, after a walk that made a memo, and allocating too little
	// to reclaim itself) lets go of a global's 4 MiB tensor: the memo must
	// not be reused after it (with a key blind to mutations, the next walk
	// reuses it and the verifying collection panics).
	const drop = `
W0 = tensor.randn([256, 2048], device="cuda", requires_grad=True)
W1 = tensor.randn([2048, 256], device="cuda", requires_grad=True)
p = tensor.randn([2048], device="cuda", requires_grad=True)
keep = [tensor.zeros([1 << 20], device="cuda")]
calls = [0]
def region(h):
    calls[0] += 1
    if calls[0] == 2:
        keep.clear()
    return h * p
h0 = x.matmul(W0)
out = nn.checkpoint(region, h0)
h0 = None
loss = out.matmul(W1).sum()
out = None
loss.backward()
`
	with, withGPU := runLayout(t, "MEMSH_REACH_MEMO", "", "", src+drop)
	without, withoutGPU := runLayout(t, "MEMSH_REACH_MEMO", "0", "", src+drop)
	if with.ReusedWalks == 0 || without.ReusedWalks != 0 {
		t.Fatalf("reused walks: %d with the memo, %d without; want some, none", with.ReusedWalks, without.ReusedWalks)
	}
	if with.Reclaims != without.Reclaims || with.ReclaimedBytes != without.ReclaimedBytes || with.WalkReclaims != without.WalkReclaims {
		t.Errorf("with the memo %+v, without %+v: the same reclaims expected", with, without)
	}
	sameFigures(t, "with the memo, without", withGPU, withoutGPU)
	t.Logf("%d of %d reclaims reused a walk's frames and globals", with.ReusedWalks, with.Reclaims)
}

// While a backward pass without retain_graph runs, the walk stops at the
// nodes it ran and released, and the engine reports what is below them
// (graphRun in tensor/autograd): the nodes not run yet, below the ready
// and running ones, and the AccumulateGrad nodes run. A leaf that only
// the graph holds (w, dropped before backward) stays allocated with its
// gradient after its AccumulateGrad ran, through a later walk of the same
// pass, as in PyTorch, where loss.grad_fn still holds it; and the relu's
// output, which only its node (below a ready one) saved, stays until that
// node ran. Every proof and every freed allocation is checked by a
// collection.
func TestBackwardStopsAtRunNodes(t *testing.T) {
	t.Setenv("MEMSH_VERIFY_RECLAIM", "1")
	s := newLayoutSession(t, "sim:1GiB")
	const mib2 = 2 << 20
	if err := s.Exec("leaf.star", `
y = tensor.randn([1024, 512], device="cuda")
v = tensor.randn([512, 512], device="cuda", requires_grad=True)
x = tensor.randn([1024, 512], device="cuda")
w = tensor.randn([1024, 512], device="cuda", requires_grad=True)
loss = y.matmul(v).relu().sum() + (x * w).sum()
w = None
loss.backward()
after = cuda.memory_allocated()
loss = None
dropped = cuda.memory_allocated()
`); err != nil {
		t.Fatal(err)
	}
	after, dropped := s.Get("after"), s.Get("dropped")
	// y, x (2 MiB each), v and its gradient (1 MiB each), w and its
	// gradient (2 MiB each) while loss holds the graph; w and its gradient
	// go with it
	if want := 4*mib2 + 2*(1<<20) + 512; after.String() != fmt.Sprint(want) {
		t.Errorf("memory_allocated after backward: %s, want %d (w and its gradient kept by the graph)", after, want)
	}
	if want := 2*mib2 + 2*(1<<20); dropped.String() != fmt.Sprint(want) {
		t.Errorf("memory_allocated after loss = None: %s, want %d", dropped, want)
	}
	if st := s.Manager().Stats(); st.Reclaims == 0 {
		t.Errorf("no reclaims")
	}
}
