package scope_test

import (
	"io"
	"testing"

	"go.starlark.net/starlark"

	"github.com/memsh/memsh/backend"
	"github.com/memsh/memsh/scope"
)

// TestSessionsKeepFramesApart: what one Session's code does moves its own
// Mutations domain (starlark.Thread.SetMutations: its calls of built-ins
// that are not pure) and its own Context's ReachShape (its tensors'
// autograd state), never another Session's, so the frames and the memo
// the other's walks keep stand (fit's advice runs its searches' Sessions
// side by side). A forward and backward pass calls poke between its
// layers and from hooks on its parameters' gradients; poke runs a backward pass in a second
// Session. The first Session's walks look into as many values, and make
// the same reclaims, as when poke does nothing, every proof checked by a
// collection.
func TestSessionsKeepFramesApart(t *testing.T) {
	t.Setenv("MEMSH_VERIFY_RECLAIM", "1")
	other := newLayoutSession(t, "sim:1GiB")
	if err := other.Exec("setup.star", `w = tensor.randn([64, 64], device = "cuda", requires_grad = True)`); err != nil {
		t.Fatal(err)
	}
	pokes := 0
	busy := starlark.NewBuiltin("poke", func(*starlark.Thread, *starlark.Builtin, starlark.Tuple, []starlark.Tuple) (starlark.Value, error) {
		pokes++
		return starlark.None, other.Exec("poke.star", "(w * 2).sum().backward()")
	}).DeclarePure()
	idle := starlark.NewBuiltin("poke", func(*starlark.Thread, *starlark.Builtin, starlark.Tuple, []starlark.Tuple) (starlark.Value, error) {
		return starlark.None, nil
	}).DeclarePure()
	const src = `
C = 128
blocks = [nn.Sequential(nn.Linear(C, C), nn.GELU(), nn.Linear(C, C)).to("cuda") for _ in range(16)]
def hook(p):
    poke()
for b in blocks:
    b[0].weight.register_post_accumulate_grad_hook(hook)
def step():
    h = tensor.randn([256, C], device = "cuda")
    for b in blocks:
        h = h + b(h)
        poke()
    loss = h.pow(2).mean()
    h = None
    loss.backward()
step()
step()
`
	run := func(poke *starlark.Builtin) backend.ManagerStats {
		s, err := scope.New(scope.Options{Device: "sim:1GiB", Peak: backend.PeakExact, Out: io.Discard, Err: io.Discard, Builtins: starlark.StringDict{"poke": poke}})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		before := s.Manager().Stats()
		if err := s.Exec("run.star", src); err != nil {
			t.Fatal(err)
		}
		return s.Manager().Stats().Since(before)
	}
	alone := run(idle)
	together := run(busy)
	if pokes < 64 {
		t.Fatalf("the other Session ran %d backward passes, want at least 64", pokes)
	}
	if together.ValuesWalked != alone.ValuesWalked || together.Reclaims != alone.Reclaims || together.ReclaimedBytes != alone.ReclaimedBytes {
		t.Errorf("with another Session busy: %d reclaims, %d values walked; alone: %d, %d", together.Reclaims, together.ValuesWalked, alone.Reclaims, alone.ValuesWalked)
	}
	t.Logf("%d reclaims, %d values walked; the other Session ran %d backward passes", together.Reclaims, together.ValuesWalked, pokes)
}
