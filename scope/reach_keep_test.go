package scope_test

import (
	"fmt"
	"io"
	"testing"

	"go.starlark.net/starlark"

	"github.com/memsh/memsh/backend"
	"github.com/memsh/memsh/scope"
)

// The tests of the walks that keep what cannot have changed since the
// last one (backend.Frames; scope/reach.go's frameCache, reach_engine.go,
// reach_pins.go): each keeps its figures equal to those of walks that
// keep nothing, and walks less.

// TestDeepRecursionKeepsFrames: in a recursion that keeps tensors per
// level (and builds a list of its own with append, a go.starlark.net
// method: pure, and the list is not watched yet), a reclaim does not
// walk again the frames that have not run since the last walk
// (backend.Frames), so the frames walked over the whole recursion grow
// linearly with its depth (issue 13: deep recursion costs linear time in
// depth), and the peak stays exact: two tensors of 256 bytes per level,
// each rounded up to the allocator's 512-byte blocks.
func TestDeepRecursionKeepsFrames(t *testing.T) {
	for _, depth := range []int{300, 1000} {
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

// TestForwardKeepsFrames: in a model's training step (modules with
// Starlark forwards calling built-in layers, nn.functional and tensor
// methods, under bf16 autocast, with and without checkpointing, the model
// held by the step function's frame), exact mode's reclaims keep the
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
	with, without := compareKeeping(t, src)
	// most frames of a walk are kept, and the graph, tensors and
	// modules below them are not looked into again (since autocast's
	// casts are kept with the nn.autocast call's frame, a walk no longer
	// meets them at all, where it met them and passed over them: fewer
	// values kept, 2,416 where 4,836 were, and fewer walked, 29,931
	// where 33,475 were)
	if with.FramesKept < 2*with.FramesWalked || with.ValuesKept < 5*with.Reclaims || 4*with.ValuesWalked > without.ValuesWalked {
		t.Errorf("%d frames walked, %d kept, %d values kept, %d walked (%d without keeping) over %d reclaims: want at least twice as many frames kept as walked, five values kept per reclaim and a quarter of the values walked at most",
			with.FramesWalked, with.FramesKept, with.ValuesKept, with.ValuesWalked, without.ValuesWalked, with.Reclaims)
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

// compareKeeping runs src in exact mode keeping what walks found
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
// allocator figures. (Checkpointed, each region's recomputation runs
// Starlark code above backward(): the memo and its frame, below the
// engine's, hold through it unless that code changes an existing value,
// and the recomputation's frames are walked at each walk: 49,386 values
// walked, where 111,788 were when the memo was made again after each
// recomputation and walked apart.)
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
		// most of the graph's nodes are kept frames at each walk
		if with.FramesKept < 3*with.FramesWalked || 4*with.ValuesWalked > 3*without.ValuesWalked {
			t.Errorf("checkpoint=%s: %d frames walked, %d kept; %d values walked, %d without keeping: want three times as many frames kept as walked, and at most three quarters of the values",
				ckpt, with.FramesWalked, with.FramesKept, with.ValuesWalked, without.ValuesWalked)
		}
		t.Logf("checkpoint=%s: %d reclaims: %d frames walked, %d kept; %d values walked (%d without keeping)", ckpt, with.Reclaims, with.FramesWalked, with.FramesKept, with.ValuesWalked, without.ValuesWalked)
	}
}

// TestBackwardWalksGradientsOnce: during backward() the memo's frame (the
// storages the frames and globals reach, and the parameters' autograd
// state) is kept from walk to walk, and a parameter given its gradient
// extends it (tensor.Tensor.ReachGrew) instead of every walk walking every
// parameter's gradient again: the values a backward pass walks grow with
// the model's depth, not with its square. Four times the blocks walk at
// most five times the values (16 times, were each walk to walk every
// parameter), with the same figures as walks keeping nothing.
func TestBackwardWalksGradientsOnce(t *testing.T) {
	walksLinearly(t, `
C = 128
blocks = [nn.Sequential(nn.Linear(C, C), nn.GELU(), nn.Linear(C, C)).to("cuda") for _ in range(N)]
x = tensor.randn([4096, C], device = "cuda")
h = x
for b in blocks:
    h = h + b(h)
loss = h.pow(2).mean()
h = None
`, "loss.backward()")
}

// walksLinearly runs src after prelude, in which N is 8 and then 32
// blocks, keeping what walks found and keeping nothing (under
// MEMSH_VERIFY_RECLAIM, .ci/run's step, every walk checked by a
// collection); checks that both make the same reclaims and figures, that src
// reclaims at least three times per block, and that the values its walks
// look into at 32 blocks are at most five times those at 8 (linear in
// the blocks, not quadratic).
func walksLinearly(t *testing.T, prelude, src string) {
	t.Helper()
	walked := map[int]int{}
	for _, n := range []int{8, 32} {
		pre := fmt.Sprintf("N = %d\n", n) + prelude
		with, withGPU := runLayout(t, "MEMSH_REACH_KEEP", "", pre, src)
		without, withoutGPU := runLayout(t, "MEMSH_REACH_KEEP", "0", pre, src)
		if with.Reclaims != without.Reclaims || with.ReclaimedBytes != without.ReclaimedBytes {
			t.Errorf("%d blocks: keeping %+v, not keeping %+v: the same reclaims expected", n, with, without)
		}
		sameFigures(t, fmt.Sprintf("%d blocks: keeping frames, not", n), withGPU, withoutGPU)
		if with.Reclaims < 3*n {
			t.Fatalf("%d blocks: %d reclaims, want at least %d", n, with.Reclaims, 3*n)
		}
		walked[n] = with.ValuesWalked
		t.Logf("%d blocks: %d reclaims, %d values walked (%d without keeping)", n, with.Reclaims, with.ValuesWalked, without.ValuesWalked)
	}
	if walked[32] > 5*walked[8] {
		t.Errorf("values walked: %d for 8 blocks, %d for 32: want at most 5 times as many", walked[8], walked[32])
	}
}

// TestAutocastCastsKeptWithTheirCall: autocast's cast cache holds a cast
// of each parameter a forward pass under nn.autocast used, until the
// outermost region is left; the walk credits the casts to the frame of the
// nn.autocast call (tensor.AutocastState.Owner), kept while it waits and
// extended by the casts made since the last walk, instead of walking
// every cast at every reclaim: the values a forward pass walks grow with
// the model's depth, not with its square. Under no_grad (the casts are
// cached all the same, and no graph grows with the forward pass), four
// times the blocks walk at most five times the values (about 9 times
// when each walk walked the cache), with the same figures as walks
// keeping nothing.
func TestAutocastCastsKeptWithTheirCall(t *testing.T) {
	walksLinearly(t, `
C = 128
blocks = [nn.Sequential(nn.Linear(C, C), nn.GELU(), nn.Linear(C, C)).to("cuda") for _ in range(N)]
x = tensor.randn([4096, C], device = "cuda")
def forward():
    h = x
    for b in blocks:
        h = h + b(h)
    return h.float().pow(2).mean()
`, `loss = tensor.no_grad(nn.autocast, forward, dtype = "bfloat16")`)
}

// TestLayoutSkipsFruitlessPeakReclaims: in exact mode, an allocation
// over 1 MiB that would raise a peak reclaims first only when something
// may have become garbage since exact mode's last reclaim (its clock
// moved or Go code noted garbage): AdamW's first step makes its 2 × 16
// moments of 2 MiB one after another in Go code that drops nothing, and
// reclaims for none but the first (before: one reclaim per moment), with
// the peak exact. A smaller allocation still reclaims for a peak: where's
// backward drops a 0-dim scalar_tensor(0) without a note, and the second
// one's allocation frees the first, as PyTorch has (the golden
// op_where's peak).
func TestLayoutSkipsFruitlessPeakReclaims(t *testing.T) {
	s, st, peak := firstAdamWStep(t, 16, "[512, 1024]") // 2 MiB each
	if st.PeakReclaims > 2 {
		t.Errorf("%d reclaims for a peak in the first step (%+v): want at most 2", st.PeakReclaims, st)
	}
	// parameters, gradients, both moments and the foreach step's list of
	// the second moments' roots (torch._foreach_sqrt): 5 × 16 × 2 MiB
	if want := fmt.Sprint(5 * 16 * 2 << 20); peak != want {
		t.Errorf("peak %s, want %s", peak, want)
	}
	err := s.Exec("where.star", `
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

// TestQuietOptimizerStep: an optimizer's step is a Quiet region
// (backend.Manager.Quiet): it runs no Starlark and notes what it lets
// go of, so exact mode reclaims before a peak only once something may
// have become garbage. A foreach AdamW step over 200 small parameters
// (each below the 1 MiB from which exact mode decides by the layout
// clock) raises the peak at each moment and each square root it makes,
// a reclaim walking every frame each before; the figures are the same.
func TestQuietOptimizerStep(t *testing.T) {
	_, st, peak := firstAdamWStep(t, 200, "[64]") // 256 B each
	if st.PeakReclaims > 4 {
		t.Errorf("%d reclaims for a peak in the first step (%+v): want at most 4", st.PeakReclaims, st)
	}
	// parameters, gradients, both moments and the list of the second
	// moments' roots: 5 × 200 blocks of 512 bytes
	if want := fmt.Sprint(5 * 200 * 512); peak != want {
		t.Errorf("peak %s, want %s", peak, want)
	}
}

// firstAdamWStep runs the first step of a foreach AdamW over n parameters
// of shape (a Starlark list) on sim:4GiB in exact mode, each with a
// gradient of ones, under MEMSH_VERIFY_RECLAIM, and returns the Session,
// the step's reclaim counts and its peak allocated bytes.
func firstAdamWStep(t *testing.T, n int, shape string) (*scope.Session, backend.ManagerStats, string) {
	t.Helper()
	t.Setenv("MEMSH_VERIFY_RECLAIM", "1")
	s := newLayoutSession(t, "sim:4GiB")
	err := s.Exec("setup.star", fmt.Sprintf(`
ps = [tensor.randn(%[2]s, device = "cuda", requires_grad = True) for _ in range(%[1]d)]
opt = optim.AdamW(ps)
for p in ps:
    p.grad = tensor.ones(%[2]s, device = "cuda")
cuda.reset_peak_memory_stats()
`, n, shape))
	if err != nil {
		t.Fatal(err)
	}
	before := s.Manager().Stats()
	if err := s.Exec("step.star", "opt.step()\npeak = cuda.max_memory_allocated()"); err != nil {
		t.Fatal(err)
	}
	return s, s.Manager().Stats().Since(before), s.Globals()["peak"].String()
}

// runLayout runs prelude, then src, in a Session on sim:4GiB in exact
// peak mode with the environment variable env set to value, and returns
// the Manager's statistics of src's run and the GPU's allocator
// statistics at the end. The device is meta-backed (sim:4GiB,meta): the
// allocations, reclaims and walks are those of a device with data, and
// no kernel computes (the matrix products were nine tenths of these
// tests' time).
func runLayout(t *testing.T, env, value, prelude, src string) (backend.ManagerStats, map[string]int64) {
	t.Helper()
	t.Setenv(env, value)
	s := newLayoutSession(t, "sim:4GiB,meta")
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

// newLayoutSession returns a Session on device in exact peak mode with
// its output discarded, closed when the test ends.
func newLayoutSession(t *testing.T, device string) *scope.Session {
	t.Helper()
	s, err := scope.New(scope.Options{Device: device, Peak: backend.PeakExact, Out: io.Discard, Err: io.Discard})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// TestInPlaceOpsKeepFrames: an in-place op (index_add_, +=) notes the
// change of its receiver alone (ReachChanged), so in a loop at the top of
// a deep recursion, rewriting a tensor local to the top frame, a reclaim
// walks again only the frames from the one that met the receiver up, not
// every frame (as when an in-place op moved starlark.Mutations: a Mixture
// of Experts' index_add_ loop walked its whole forward graph at each
// allocation); every proof is checked by a collection.
func TestInPlaceOpsKeepFrames(t *testing.T) {
	t.Setenv("MEMSH_VERIFY_RECLAIM", "1")
	const depth, n = 200, 40
	s, _ := newSession(t, "sim:1GiB")
	err := s.Exec("inplace.star", fmt.Sprintf(`
def inner(n):
    acc = tensor.zeros([64], device="cuda")
    idx = tensor.arange(64, device="cuda")
    for i in range(n):
        x = tensor.ones([64], device="cuda")
        acc.index_add_(0, idx, x)
        acc += x
        x = None
    return acc.sum().item()
def f(d):
    if d == 0:
        return inner(%d)
    return f(d - 1)
total = f(%d)
`, n, depth))
	if err != nil {
		t.Fatal(err)
	}
	if got := s.Globals()["total"].String(); got != fmt.Sprintf("%d.0", 64*2*n) {
		t.Errorf("total %s, want %d", got, 64*2*n)
	}
	st := s.Manager().Stats()
	// the first reclaim in inner walks the stack once; the loop's walk
	// only inner's frame and the built-in's
	if limit := 2*depth + 20*n; st.FramesWalked > limit {
		t.Errorf("%d frames walked, %d kept over %d reclaims: want at most %d", st.FramesWalked, st.FramesKept, st.Reclaims, limit)
	}
	t.Logf("%d reclaims, %d frames walked, %d kept", st.Reclaims, st.FramesWalked, st.FramesKept)
}
