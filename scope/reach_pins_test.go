package scope_test

import (
	"testing"

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
// every reclaim would be n²/2. MEMSH_VERIFY_RECLAIM checks every walk
// with a collection.
func TestGrowthPeaksExact(t *testing.T) {
	t.Setenv("MEMSH_VERIFY_RECLAIM", "1")
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
		// rows of 20 appended empty, then filled: more rows than pins, each
		// pinned while it grows (reach_pins.go), a walk of everything once
		// or twice per row (its first append; a finished row's pin going
		// when the pins are full); no temporaries
		{"a list of rows filled after they are appended", `
rows = []
for i in range(N // 20):
    row = []
    rows.append(row)
    for j in range(20):
        row.append(tensor.zeros([64], device="cuda"))
`, n, 400},
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
