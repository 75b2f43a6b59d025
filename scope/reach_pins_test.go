package scope_test

import (
	"fmt"
	"runtime"
	"strings"
	"testing"
	"unsafe"

	"go.starlark.net/starlark"
)

// TestGrowthPeaksExact: in exact mode every allocation that would raise a
// peak reclaims first, also while memory only grows, so a tensor dropped
// while a list or dict grows never counts toward the peak (a 64 KiB
// window after a reclaim that found nothing let it). Each iteration keeps
// a 256-byte tensor (one 512-byte block) in the container and makes a
// temporary whose input is dropped at the end of its expression; a name
// re-bound drops the last iteration's result after the new one is made.
// The growing containers are pinned (reach_pins.go): the values the
// walks look into grow linearly in n, where walking the container at
// every reclaim would be n²/2. Under MEMSH_VERIFY_RECLAIM (a step of
// .ci/run) a collection checks every walk.
func TestGrowthPeaksExact(t *testing.T) {
	const n = 1500
	cases := []struct {
		name, src string
		blocks    int // the peak over what was allocated before, in 512-byte blocks
		// the most values the walks may look into, over n (100 when 0):
		// walking the containers at every reclaim would be about 2n/2
		// values a reclaim over n reclaims (a tensor is two values)
		walked int
	}{
		// at the last add: n kept, the add's input, the last result and
		// the new one
		{"a global list appended to in a top-level loop", `
xs = []
for i in range(N):
    xs.append(tensor.zeros([64], device="cuda"))
    tmp = tensor.zeros([64], device="cuda") + 1
`, n + 3, 0},
		{"a function's dict", `
def f():
    ys = {}
    for i in range(N):
        ys[str(i)] = tensor.zeros([64], device="cuda")
        t = tensor.zeros([64], device="cuda") * 2
    return ys
ys = f()
`, n + 3, 0},
		// at the last add: n-1 kept, the add's input and its result
		{"a comprehension", `
zs = [tensor.zeros([64], device="cuda") + 1 for i in range(N)]
`, n + 1, 0},
		// rows of 20 appended empty, then filled: more rows than pins,
		// each pinned once its first append is logged (its growth taken
		// in by the outer list's frame, reach_pins.go), a finished row's
		// pin folded into the outer list's frame when the pins are full;
		// no temporaries. (Before the growth log, each row's first append
		// made the next walk walk everything: 391,084 values here.)
		{"a list of rows filled after they are appended", `
rows = []
for i in range(N // 20):
    row = []
    rows.append(row)
    for j in range(20):
        row.append(tensor.zeros([64], device="cuda"))
`, n, 40},
		{"a list extended in a function, and +=", `
def g(out):
    for i in range(N // 2):
        out.extend([tensor.zeros([64], device="cuda")])
        out += [tensor.ones([64], device="cuda") - 1]
    return out
ws = g([])
`, n + 1, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s, _ := newSession(t, "sim:1GiB")
			s.Set("N", starlark.MakeInt(n))
			src := c.src + `
peak = cuda.max_memory_allocated()
`
			before := s.Manager().Stats()
			if err := s.Exec("grow.star", src); err != nil {
				t.Fatal(err)
			}
			st := s.Manager().Stats().Since(before)
			got, _ := starlark.AsInt32(s.Get("peak"))
			if want := c.blocks * 512; got != want {
				t.Errorf("peak %d, want %d (%d blocks of 512 bytes)", got, want, c.blocks)
			}
			if st.PeakReclaims < n {
				t.Errorf("%d peak reclaims, want at least %d", st.PeakReclaims, n)
			}
			limit := 100 * n
			if c.walked > 0 {
				limit = c.walked * n
			}
			if st.ValuesWalked > limit {
				t.Errorf("%d values walked over %d reclaims, want at most %d (linear in n)", st.ValuesWalked, st.Reclaims, limit)
			}
			t.Logf("%d reclaims, %d values walked, %d collections", st.Reclaims, st.ValuesWalked, st.Collections())
		})
	}
}

// TestPinsLetGo: a pinned container that is no longer reachable (a
// function's list after it returns) is freed by the next walk, which
// walks again keeping nothing (backend.Walk.Retry); one mutated other
// than by appends (pop, a replaced value, clear) moves
// starlark.Mutations, so no walk keeps what it reached before. Every
// walk is checked with a collection (MEMSH_VERIFY_RECLAIM).
func TestPinsLetGo(t *testing.T) {
	t.Setenv("MEMSH_VERIFY_RECLAIM", "1")
	s, _ := newSession(t, "sim:1GiB")
	src := `
def g(n):
    zs = []
    for i in range(n):
        zs.append(tensor.zeros([64], device="cuda"))
    return len(zs)
g(600)
a = cuda.memory_allocated()
keep = [tensor.zeros([64], device="cuda") for i in range(600)]
d = {i: tensor.zeros([64], device="cuda") for i in range(600)}
keep.pop()
keep.append(tensor.zeros([128], device="cuda"))
d[0] = None
d[600] = tensor.zeros([64], device="cuda")
keep[1] = None
keep.append(tensor.zeros([64], device="cuda"))
b = cuda.memory_allocated()
d.clear()
c = cuda.memory_allocated()
`
	before := s.Manager().Stats()
	if err := s.Exec("pins.star", src); err != nil {
		t.Fatal(err)
	}
	st := s.Manager().Stats().Since(before)
	for name, want := range map[string]int{
		"a": 0,
		// keep: 599 of 256 bytes (600 made, one popped, one replaced by
		// None, one appended) and one of 512; d: 600 (one replaced by
		// None, one added)
		"b": (599 + 1 + 600) * 512,
		"c": (599 + 1) * 512,
	} {
		got, _ := starlark.AsInt32(s.Get(name))
		if got != want {
			t.Errorf("%s = %d, want %d", name, got, want)
		}
	}
	if st.RetriedWalks == 0 {
		t.Errorf("no walk made again after g's list went: %+v", st)
	}
	t.Logf("%d reclaims, %d walks made again", st.Reclaims, st.RetriedWalks)
}

// TestPinCollected: a pinned dict that the Go collector takes before the
// next walk (pins are held weakly) is dropped at that walk's start
// without a walk made again, and the frames above it — the globals' and
// the stack's, which sit above the pins — are numbered otherwise from
// then on: none of them is kept. Here the dict was the only pin, the top
// one. A walk that kept the frames by their old numbers (once the only
// behaviour when the pin that went was the top one, or the last) took the
// dict's frame for the globals' and its tensor for held, and kept no
// frame for outer's, one below the frames it walked again: outer's tensor
// was freed while reachable. go_gc runs a Go collection and nothing
// else; it is pure (it moves no Mutations), as are the calls between two
// walks of a forward pass. The figures are in 512-byte blocks.
func TestPinCollected(t *testing.T) {
	s, _ := newSession(t, "sim:1GiB")
	s.Set("go_gc", starlark.NewBuiltin("go_gc", func(*starlark.Thread, *starlark.Builtin, starlark.Tuple, []starlark.Tuple) (starlark.Value, error) {
		runtime.GC()
		return starlark.None, nil
	}).DeclarePure())
	src := `
def f():
    d = {}
    a = tensor.zeros([64], device="cuda")  # a walk meets d empty
    d["k"] = tensor.zeros([64], device="cuda")
    b = tensor.zeros([64], device="cuda")  # meets it longer: pinned
    c = tensor.zeros([64], device="cuda")  # the pin's frame holds d["k"]
    return 0

def main():
    keep = tensor.zeros([64], device="cuda")
    f()
    go_gc()  # d is collected; a, b, c and d["k"] are garbage
    e = tensor.zeros([64], device="cuda")  # a peak: the walk frees them
    return cuda.memory_allocated(), keep, e

def outer():
    held = tensor.zeros([64], device="cuda")
    got, keep, e = main()
    return got, held.sum().item()

got, total = outer()
`
	before := s.Manager().Stats()
	if err := s.Exec("collected.star", src); err != nil {
		t.Fatal(err)
	}
	st := s.Manager().Stats().Since(before)
	// held, keep and e: three blocks
	if got, _ := starlark.AsInt32(s.Get("got")); got != 3*512 {
		t.Errorf("memory_allocated() after the walk = %d, want %d (held, keep and e)", got, 3*512)
	}
	if st.Collections() != 0 {
		t.Errorf("%d reclaims were collections, want none (the walks free what the collector took): %+v", st.Collections(), st)
	}
}

// TestGrowthLogSound: lists that grow without moving starlark.Mutations
// (their appends logged for the next walk, reach_pins.go) are never
// freed while reachable and are freed once not: rows reachable only
// through the outer list's pin, growing round-robin (their pins come and
// go, folded into the outer list's frame); a list two pins reach (the
// walk after its growth keeps nothing); a function's list growing below
// the frame that appends (the globals and the stack walked again); rows
// dropped. Every walk is checked with a collection
// (MEMSH_VERIFY_RECLAIM), and the figures are closed forms in 512-byte
// blocks.
func TestGrowthLogSound(t *testing.T) {
	t.Setenv("MEMSH_VERIFY_RECLAIM", "1")
	s, _ := newSession(t, "sim:1GiB")
	src := `
outer = []
for i in range(100):
    outer.append([])
for k in range(5):
    for i in range(100):
        outer[i].append(tensor.zeros([64], device="cuda"))
a = cuda.memory_allocated()
a_peak = cuda.max_memory_allocated()
outer = None

inner = []
p1 = [inner] + [None] * 70
p2 = [None] * 70 + [inner]
inner = None
for i in range(200):
    p1[0].append(tensor.zeros([64], device="cuda"))
    if i % 50 == 0:
        p2.append(None)
b = cuda.memory_allocated()
p1 = None
b1 = cuda.memory_allocated()
p2 = None
b2 = cuda.memory_allocated()

def push(xs):
    xs.append(tensor.zeros([64], device="cuda"))
def fill(n):
    xs = []
    for i in range(n):
        push(xs)
    return xs
fill(300)
c = cuda.memory_allocated()
kept = fill(300)
d = cuda.memory_allocated()

rows = []
for i in range(80):
    row = []
    rows.append(row)
    for j in range(10):
        row.append(tensor.zeros([64], device="cuda"))
e = cuda.memory_allocated()
rows.pop()
row = None
f = cuda.memory_allocated()
rows = None
g = cuda.memory_allocated()
`
	if err := s.Exec("growth.star", src); err != nil {
		t.Fatal(err)
	}
	const blk = 512
	for name, want := range map[string]int{
		"a": 500 * blk, "a_peak": 500 * blk,
		"b": 200 * blk, "b1": 200 * blk, "b2": 0,
		"c": 0, "d": 300 * blk,
		"e": (300 + 800) * blk, "f": (300 + 790) * blk, "g": 300 * blk,
	} {
		got, _ := starlark.AsInt32(s.Get(name))
		if got != want {
			t.Errorf("%s = %d, want %d (%d blocks)", name, got, want, want/blk)
		}
	}
}

// TestGrowthLogShared: a list that two pins' frames met grows while the
// pins are full (64 long global lists, none of which may go), so it
// stays unpinned and each append is logged: each walk after one keeps
// nothing, and nothing reachable is freed (MEMSH_VERIFY_RECLAIM checks
// every walk with a collection).
func TestGrowthLogShared(t *testing.T) {
	t.Setenv("MEMSH_VERIFY_RECLAIM", "1")
	s, _ := newSession(t, "sim:1GiB")
	var src strings.Builder
	src.WriteString(`
inner = []
p1 = [inner] + [None] * 70
p2 = [None] * 70 + [inner]
inner = None
t = tensor.zeros([64], device="cuda")
`)
	for i := range 62 {
		fmt.Fprintf(&src, "l%d = [None] * 64\nt = tensor.zeros([64], device=\"cuda\")\n", i)
	}
	src.WriteString(`
t = None
for i in range(200):
    p1[0].append(tensor.zeros([64], device="cuda"))
a = cuda.memory_allocated()
p1 = None
b = cuda.memory_allocated()
p2 = None
c = cuda.memory_allocated()
`)
	before := s.Manager().Stats()
	if err := s.Exec("shared.star", src.String()); err != nil {
		t.Fatal(err)
	}
	st := s.Manager().Stats().Since(before)
	for name, want := range map[string]int{"a": 200 * 512, "b": 200 * 512, "c": 0} {
		got, _ := starlark.AsInt32(s.Get(name))
		if got != want {
			t.Errorf("%s = %d, want %d", name, got, want)
		}
	}
	// every walk while the list grows walks the 64 pins whole
	if st.ValuesWalked < 200*64*64 {
		t.Errorf("%d values walked over %d reclaims: the walks kept the pins' frames", st.ValuesWalked, st.Reclaims)
	}
	t.Logf("%d reclaims, %d values walked", st.Reclaims, st.ValuesWalked)
}

// TestListSize: the growth log's fields (starlark.List.LogGrowth,
// GrowthMark) keep a list in Go's 48-byte size class, as a session may
// hold millions of small lists.
func TestListSize(t *testing.T) {
	if n := unsafe.Sizeof(starlark.List{}); n > 48 {
		t.Errorf("starlark.List is %d bytes, want at most 48", n)
	}
}
