package scope_test

import (
	"fmt"
	"io"
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
// (MEMSH_RECLAIM=gc) and once as usual, in exact and in layout peak mode;
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
		for _, mode := range []backend.PeakMode{backend.PeakExact, backend.PeakLayout} {
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
					if got[i] != want[i] {
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

// TestDeepRecursionKeepsFrames: in a recursion that keeps tensors per
// level (and builds a list of its own with append, a go.starlark.net
// method: pure, and the list is not watched yet), a reclaim does not
// walk again the frames that have not run since the last walk
// (backend.Frames), so the frames walked over the whole recursion grow
// linearly with its depth (issue 13: deep recursion costs linear time in
// depth), and the peak stays exact: two tensors of 256 bytes per level,
// each rounded up to the allocator's 512-byte blocks.
func TestDeepRecursionKeepsFrames(t *testing.T) {
	t.Setenv("MEMSH_VERIFY_RECLAIM", "1")
	for _, depth := range []int{500, 2000} {
		s, _ := newSession(t, "sim:1GiB")
		err := s.Exec("deep.star", fmt.Sprintf(`
def f(n):
    t = tensor.zeros([64], device="cuda")
    u = t + 1
    seen = []          # a list of its own, changed by a built-in method
    seen.append(len(str(n)))
    if n == 0:
        return cuda.max_memory_allocated()
    return f(n - 1)
peak = f(%d)
`, depth))
		if err != nil {
			t.Fatal(err)
		}
		// each level holds t and u at its peak; the innermost level's u
		// is the last allocation
		want := int64(2 * (depth + 1) * 512)
		if got := s.Globals()["peak"]; got.String() != fmt.Sprint(want) {
			t.Errorf("depth %d: peak %s, want %d", depth, got, want)
		}
		st := s.Manager().Stats()
		// two peak reclaims per level (t, u), each walking the frames that
		// ran since the last (the caller, the new frame, the built-in
		// allocating); walking every frame at each reclaim would be depth²
		if limit := 6*depth + 64; st.FramesWalked > limit || st.FramesKept == 0 {
			t.Errorf("depth %d: %d frames walked, %d kept over %d reclaims: want at most %d walked", depth, st.FramesWalked, st.FramesKept, st.Reclaims, limit)
		}
		t.Logf("depth %d: %d reclaims, %d frames walked, %d kept", depth, st.Reclaims, st.FramesWalked, st.FramesKept)
	}
}

// TestKeptFramesSeeMutations: frames kept from an earlier walk stay
// right when code above them changes what they reach — a list or dict of
// waiting frames gains or loses a tensor, built-ins that are not pure
// (backward, an optimizer step) give parameters gradients and state in
// the middle of a recursion — every proof and every walk-freed
// allocation checked by a collection, and the peaks exact. The list and
// the dict change through their own methods, which are pure built-ins:
// what moves starlark.Mutations is that a walk watched them (without it
// the dropped tensor counts toward the peak and the verification panics).
func TestKeptFramesSeeMutations(t *testing.T) {
	t.Setenv("MEMSH_VERIFY_RECLAIM", "1")
	s, _ := newSession(t, "sim:1GiB")
	err := s.Exec("mutations.star", `
KiB = 1024
def grow(n):
    # a tensor of n KiB, made in a pure built-in: a reclaim there may keep frames
    return tensor.zeros([n * KiB // 4], device="cuda")

def deep(n, lst, d, fn):
    t = grow(16)
    if n > 0:
        return deep(n - 1, lst, d, fn)
    return fn(lst, d)

def swap(lst, d):
    lst.pop(0)                # 64 KiB dropped, held by a waiting frame's list
    d.update(k = grow(32))    # 32 KiB kept, only through a waiting frame's dict
    big = grow(512)           # raises the peak: the 64 KiB must be gone, the 32 KiB kept
    peak = cuda.max_memory_allocated()
    big = None
    return peak

lst = [grow(64)]
d = {}
base = cuda.memory_allocated()
cuda.reset_peak_memory_stats()
peak = deep(40, lst, d, swap)
after = cuda.memory_allocated()
kept_ok = d["k"].numel() == 32 * KiB // 4

m = nn.Linear(64, 64, device="cuda")
opt = optim.AdamW(m.parameters())
def train(lst, d):
    x = tensor.randn([8, 64], device="cuda")
    m(x).sum().backward()
    opt.step()
    big = grow(1024)          # raises the peak after backward and step changed m's parameters
    n = 0
    for p in m.parameters():
        n += p.grad.numel()
    return n
ngrad = deep(40, lst, d, train)
`)
	if err != nil {
		t.Fatal(err)
	}
	g := s.Globals()
	// at the peak: the 41 tensors of the recursion (16 KiB each), the
	// 32 KiB tensor and the 512 KiB one, but not the dropped 64 KiB
	base := g["base"].(starlark.Int)
	b, _ := base.Int64()
	if want := b - 64*1024 + 41*16*1024 + 32*1024 + 512*1024; g["peak"].String() != fmt.Sprint(want) {
		t.Errorf("peak in the recursion %s, want %d (base %d)", g["peak"], want, b)
	}
	if want := b - 64*1024 + 32*1024; g["after"].String() != fmt.Sprint(want) {
		t.Errorf("allocated after the recursion %s, want %d", g["after"], want)
	}
	if g["kept_ok"] != starlark.True || g["ngrad"].String() != "4160" {
		t.Errorf("kept_ok %s, ngrad %s: want True, 4160", g["kept_ok"], g["ngrad"])
	}
	if st := s.Manager().Stats(); st.FramesKept == 0 {
		t.Errorf("no frame kept: %+v", st)
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
`, "opt.step()", backend.PeakLayout},
		{"rms_norm in a checkpointed region", `
blk = nn.Sequential(nn.RMSNorm(1024), nn.Linear(1024, 1024)).to("cuda")
x = tensor.randn([256, 1024], device="cuda", requires_grad=True)
`, `y = nn.autocast(lambda: nn.checkpoint(blk, x).sum(), dtype="bfloat16")`, backend.PeakLayout},
		{"a convolutional block", `
blk = nn.Sequential(nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2)).to("cuda")
x = tensor.randn([64, 16, 32, 32], device="cuda")
`, "blk(x).sum().backward()", backend.PeakExact},
		{"a convolutional block, layout mode", `
blk = nn.Sequential(nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2)).to("cuda")
x = tensor.randn([64, 16, 32, 32], device="cuda")
`, "blk(x).sum().backward()", backend.PeakLayout},
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
`, `o = nn.sdpa_kernel("flash", nn.functional.scaled_dot_product_attention, q, q, q)`, backend.PeakLayout},
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
// across a checkpointed region's recomputation, which runs Starlark code
// inside backward (the memo is made again after it).
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
	// not be reused after it (with a key blind to Starlark steps, calls
	// and mutations, the next walk reuses it and the verifying collection
	// panics).
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

// TestForwardKeepsFrames: in a model's training step (modules with
// Starlark forwards calling built-in layers, nn.functional and tensor
// methods, under bf16 autocast, with and without checkpointing, the model
// held by the step function's frame), layout mode's reclaims keep the
// credits of the frames below the running one — module calls, the
// functional forms and the tensor methods that make new tensors are
// pure, and autocast's casts are noted as held garbage — and do not look
// again into the graph, tensors and modules that a kept frame reached
// (backend.Frames.Visit). The reclaims and every allocator figure are
// those of walks that keep nothing (MEMSH_REACH_KEEP=0), and every proof
// and walk-freed allocation is checked by a collection.
func TestForwardKeepsFrames(t *testing.T) {
	t.Setenv("MEMSH_VERIFY_RECLAIM", "1")
	const src = `
def attention(self, x):
    B, T, C = x.shape
    q, k, v = self.qkv(x).split(C, dim = 2)
    q = q.view(B, T, 4, C // 4).transpose(1, 2)
    k = k.view(B, T, 4, C // 4).transpose(1, 2)
    v = v.view(B, T, 4, C // 4).transpose(1, 2)
    att = q.matmul(k.transpose(-2, -1)) * 0.25
    att = att.masked_fill(self.mask.eq(0), float("-inf")).softmax(-1)
    y = att.matmul(v).transpose(1, 2).contiguous().view(B, T, C)
    return self.proj(y)

def mlp(self, x):
    return self.down(nn.functional.gelu(self.up(x)))

def block(self, x):
    x = x + self.attn(self.ln1(x))
    return x + self.mlp(self.ln2(x))

def gpt(self, x):
    for b in self.h:
        x = nn.checkpoint(b, x) if self.ckpt else b(x)
    return self.head(self.ln(x))

def model(ckpt):
    C, T = 128, 64
    blocks = [nn.Module(block,
        ln1 = nn.LayerNorm(C, device = "cuda"),
        attn = nn.Module(attention, qkv = nn.Linear(C, 3 * C, device = "cuda"), proj = nn.Linear(C, C, device = "cuda"),
                         mask = tensor.ones(T, T, device = "cuda").tril()),
        ln2 = nn.LayerNorm(C, device = "cuda"),
        mlp = nn.Module(mlp, up = nn.Linear(C, 4 * C, device = "cuda"), down = nn.Linear(4 * C, C, device = "cuda")),
    ) for _ in range(4)]
    return nn.Module(gpt, h = nn.ModuleList(blocks), ln = nn.LayerNorm(C, device = "cuda"), head = nn.Linear(C, 256, device = "cuda"), ckpt = ckpt)

def train(ckpt):
    m = model(ckpt)
    opt = optim.AdamW(m.parameters())
    x = tensor.randn([8, 64, 128], device = "cuda")
    y = tensor.randint(0, 256, [8 * 64], device = "cuda")
    for _ in range(2):
        loss = nn.autocast(lambda: nn.functional.cross_entropy(m(x).view(-1, 256), y))
        loss.backward()
        opt.step()
        opt.zero_grad()
    return cuda.max_memory_allocated()

peaks = [train(False), train(True)]
`
	with, _ := compareKeeping(t, src)
	// most frames of a walk are kept, and the graph, tensors and
	// modules below them are not looked into again
	if with.FramesKept < 2*with.FramesWalked || with.ValuesKept < 10*with.Reclaims {
		t.Errorf("%d frames walked, %d kept, %d values kept over %d reclaims: want at least twice as many frames kept as walked and ten values kept per reclaim",
			with.FramesWalked, with.FramesKept, with.ValuesKept, with.Reclaims)
	}
}

// TestGlobalsKept: walks keep what they found in the globals (a frame of
// their own below the call stack's) while no global is bound and no value
// they reach changes: in training steps called from the top level, with
// the model, the optimizer and 2,000 result records in globals, the walks
// look into fewer than half the values that walks keeping nothing do (the
// frames alone would save little: the stack is two frames deep when a
// layer runs); a top-level loop that re-binds a global tensor drops the
// old one at the assignment. Figures as in TestForwardKeepsFrames.
func TestGlobalsKept(t *testing.T) {
	t.Setenv("MEMSH_VERIFY_RECLAIM", "1")
	const src = `
C = 128
layers = []
for _ in range(8):
    layers += [nn.Linear(C, 4 * C, device = "cuda"), nn.GELU(), nn.Linear(4 * C, C, device = "cuda")]
m = nn.Sequential(*layers)
opt = optim.AdamW(m.parameters())
records = [dict(i = i, name = "trial %d" % i, peak = i * 1024) for i in range(2000)]
x = tensor.randn([64, 64, C], device = "cuda")
def step():
    loss = m(x).pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
big = None
for i in range(3):
    step()
    big = tensor.zeros([1 << 20], device = "cuda")
    records.append(dict(i = i, peak = cuda.max_memory_allocated()))
`
	with, without := compareKeeping(t, src)
	if 2*with.ValuesWalked >= without.ValuesWalked {
		t.Errorf("%d values walked over %d reclaims, %d without keeping: want fewer than half", with.ValuesWalked, with.Reclaims, without.ValuesWalked)
	}
}

// compareKeeping runs src in layout mode keeping what walks found
// (backend.Frames) and keeping nothing (MEMSH_REACH_KEEP=0), checks that
// the reclaims and every allocator figure are the same, and returns the
// runs' statistics.
func compareKeeping(t *testing.T, src string) (with, without backend.ManagerStats) {
	t.Helper()
	with, withGPU := runLayout(t, "MEMSH_REACH_KEEP", "", "", src)
	without, withoutGPU := runLayout(t, "MEMSH_REACH_KEEP", "0", "", src)
	if without.FramesKept != 0 || without.ValuesKept != 0 {
		t.Fatalf("MEMSH_REACH_KEEP=0 kept %d frames, %d values", without.FramesKept, without.ValuesKept)
	}
	// (which reclaims a walk settles and which a collection does may
	// differ: a walk that keeps nothing can run out of time)
	if with.Reclaims != without.Reclaims || with.ReclaimedBytes != without.ReclaimedBytes {
		t.Errorf("keeping %+v, not keeping %+v: the same reclaims expected", with, without)
	}
	sameFigures(t, "keeping frames, not", withGPU, withoutGPU)
	t.Logf("%d reclaims: %d frames walked, %d kept; %d values kept, %d walked (%d without keeping)",
		with.Reclaims, with.FramesWalked, with.FramesKept, with.ValuesKept, with.ValuesWalked, without.ValuesWalked)
	return with, without
}

// TestBackwardKeepsEngineFrames: while backward() runs, the nodes of the
// graph not run yet are frames of the walk (the engine's, kept until a
// node runs, a checkpoint holder of theirs changes or a gradient they
// reach is replaced), so a walk between two nodes looks again only into
// the node that ran: over a backward pass of 24 blocks, with and without
// checkpointing, most frames are kept at each walk and the walks look into
// fewer values than walks keeping nothing do, with the same reclaims and
// allocator figures.
func TestBackwardKeepsEngineFrames(t *testing.T) {
	t.Setenv("MEMSH_VERIFY_RECLAIM", "1")
	const setup = `
C = 256
blocks = [nn.Sequential(nn.LayerNorm(C), nn.Linear(C, 4 * C), nn.GELU(), nn.Linear(4 * C, C)).to("cuda") for _ in range(24)]
x = tensor.randn([512, C], device = "cuda")
def forward(ckpt):
    h = x
    for b in blocks:
        h = h + (nn.checkpoint(b, h) if ckpt else b(h))
    return h.pow(2).mean()
`
	for _, ckpt := range []string{"False", "True"} {
		prelude := setup + "loss = forward(" + ckpt + ")\n"
		with, withGPU := runLayout(t, "MEMSH_REACH_KEEP", "", prelude, "loss.backward()")
		without, withoutGPU := runLayout(t, "MEMSH_REACH_KEEP", "0", prelude, "loss.backward()")
		if with.Reclaims != without.Reclaims || with.ReclaimedBytes != without.ReclaimedBytes {
			t.Errorf("checkpoint=%s: keeping %+v, not keeping %+v: the same reclaims expected", ckpt, with, without)
		}
		sameFigures(t, "checkpoint="+ckpt+": keeping frames, not", withGPU, withoutGPU)
		// most of the graph's nodes are kept frames at each walk (what is
		// left to walk each time is mostly the parameters' gradients,
		// which AccumulateGrad changes)
		if with.FramesKept < 3*with.FramesWalked || 4*with.ValuesWalked > 3*without.ValuesWalked {
			t.Errorf("checkpoint=%s: %d frames walked, %d kept; %d values walked, %d without keeping: want three times as many frames kept as walked, and at most three quarters of the values",
				ckpt, with.FramesWalked, with.FramesKept, with.ValuesWalked, without.ValuesWalked)
		}
		t.Logf("checkpoint=%s: %d reclaims: %d frames walked, %d kept; %d values walked (%d without keeping)", ckpt, with.Reclaims, with.FramesWalked, with.FramesKept, with.ValuesWalked, without.ValuesWalked)
	}
}

// TestLayoutSkipsFruitlessPeakReclaims: in layout mode, an allocation
// over 1 MiB that would raise a peak reclaims first only when something
// may have become garbage since layout mode's last reclaim (its clock
// moved or Go code noted garbage): AdamW's first step makes its 2 × 16
// moments of 2 MiB one after another in Go code that drops nothing, and
// reclaims for none but the first (before: one reclaim per moment), with
// the peak exact. A smaller allocation still reclaims for a peak: where's
// backward drops a 0-dim scalar_tensor(0) without a note, and the second
// one's allocation frees the first, as PyTorch has (the golden
// op_where's peak in exact mode, here in layout mode).
func TestLayoutSkipsFruitlessPeakReclaims(t *testing.T) {
	t.Setenv("MEMSH_VERIFY_RECLAIM", "1")
	s := newLayoutSession(t, "sim:4GiB")
	err := s.Exec("setup.star", `
ps = [tensor.randn([512, 1024], device = "cuda", requires_grad = True) for _ in range(16)]   # 2 MiB each
opt = optim.AdamW(ps)
for p in ps:
    p.grad = tensor.ones([512, 1024], device = "cuda")
cuda.reset_peak_memory_stats()
`)
	if err != nil {
		t.Fatal(err)
	}
	before := s.Manager().Stats()
	if err := s.Exec("step.star", "opt.step()\npeak = cuda.max_memory_allocated()"); err != nil {
		t.Fatal(err)
	}
	st := s.Manager().Stats().Since(before)
	if st.PeakReclaims > 2 {
		t.Errorf("%d reclaims for a peak in the first step (%+v): want at most 2", st.PeakReclaims, st)
	}
	// parameters, gradients, both moments and the foreach step's list of
	// the second moments' roots (torch._foreach_sqrt): 5 × 16 × 2 MiB
	if got, want := s.Globals()["peak"].String(), fmt.Sprint(5*16*2<<20); got != want {
		t.Errorf("peak %s, want %s", got, want)
	}
	err = s.Exec("where.star", `
c = tensor.randn(64, 1024, device="cuda").gt(0)
x = tensor.randn(64, 1024, device="cuda", requires_grad=True)
y = tensor.randn(64, 1024, device="cuda", requires_grad=True)
out = tensor.where(c, x, y)
start = cuda.memory_allocated()
cuda.reset_peak_memory_stats()
out.backward(tensor.ones(64, 1024, device="cuda"))
rise = cuda.max_memory_allocated() - start
`)
	if err != nil {
		t.Fatal(err)
	}
	// the incoming gradient, x's and y's gradients (256 KiB each) and one
	// 512-byte block for the scalar: never both scalars at once
	if got, want := s.Globals()["rise"].String(), fmt.Sprint(3*256<<10+512); got != want {
		t.Errorf("where's backward raised the peak by %s, want %s", got, want)
	}
}

// runLayout runs prelude, then src, in a Session on sim:4GiB in layout
// mode with the environment variable env set to value, and returns the
// Manager's statistics of src's run and the GPU's allocator statistics
// at the end.
func runLayout(t *testing.T, env, value, prelude, src string) (backend.ManagerStats, map[string]int64) {
	t.Helper()
	t.Setenv(env, value)
	s := newLayoutSession(t, "sim:4GiB")
	if prelude != "" {
		if err := s.Exec("prelude.star", prelude); err != nil {
			t.Fatal(err)
		}
	}
	before := s.Manager().Stats()
	if err := s.Exec("run.star", src); err != nil {
		t.Fatal(err)
	}
	return s.Manager().Stats().Since(before), s.Manager().GPU(0).Stats()
}

// sameFigures checks that two runs' allocator statistics agree on the
// figures a reclaim decides (peaks, what is left, retries, the count of
// allocations); runs names them, "first, second".
func sameFigures(t *testing.T, runs string, a, b map[string]int64) {
	t.Helper()
	for _, k := range []string{"allocated_bytes.all.peak", "reserved_bytes.all.peak", "allocated_bytes.all.current", "num_alloc_retries", "allocation.all.allocated"} {
		if a[k] != b[k] {
			t.Errorf("%s: %d, %d (%s)", k, a[k], b[k], runs)
		}
	}
}

// newLayoutSession returns a Session on device in layout peak mode with
// its output discarded, closed when the test ends.
func newLayoutSession(t *testing.T, device string) *scope.Session {
	t.Helper()
	s, err := scope.New(scope.Options{Device: device, Peak: backend.PeakLayout, Out: io.Discard, Err: io.Discard})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}
