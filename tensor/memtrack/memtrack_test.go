package memtrack_test

import (
	"runtime"
	"testing"

	"github.com/memsh/memsh/backend"
	"github.com/memsh/memsh/backend/host"
	"github.com/memsh/memsh/backend/sim"
	"github.com/memsh/memsh/tensor"
	"github.com/memsh/memsh/tensor/autograd"
	"github.com/memsh/memsh/tensor/memtrack"
	tnn "github.com/memsh/memsh/tensor/nn"
	"github.com/memsh/memsh/tensor/optim"
)

func r512(n int) uint64 { return uint64((n + 511) / 512 * 512) }

func check(t *testing.T, what string, s memtrack.Snapshot, want map[memtrack.Category]uint64) {
	t.Helper()
	var total uint64
	for c := range memtrack.NumCategories {
		total += want[c]
		if s.Bytes[c] != want[c] {
			t.Errorf("%s: %s = %d, want %d (%v)", what, c, s.Bytes[c], want[c], s)
		}
	}
	if s.Total != total {
		t.Errorf("%s: Total = %d, want %d", what, s.Total, total)
	}
}

// adamTracker returns an Adam (foreach) over params and a Tracker of
// cuda:0 that knows both, not started.
func adamTracker(t *testing.T, c *tensor.Context, params []*tensor.Tensor) (*optim.Adam, *memtrack.Tracker) {
	t.Helper()
	opt, err := optim.NewAdam(params, 1e-3, 0.9, 0.999, 1e-8, 0, false, false, true)
	if err != nil {
		t.Fatal(err)
	}
	tr, err := memtrack.New(c, "cuda:0")
	if err != nil {
		t.Fatal(err)
	}
	tr.AddParams(params...)
	tr.AddOptimizer(opt)
	return opt, tr
}

// TestMLPAdamStep tracks a Linear-ReLU-Linear step with Adam (foreach)
// and checks every figure against closed forms (the same as
// tensor/autograd's TestMLPClosedForms).
func TestMLPAdamStep(t *testing.T) {
	for _, meta := range []bool{false, true} {
		dev := sim.New(sim.Spec{Count: 1, Total: 1 << 30, Meta: meta})[0]
		gpu := backend.NewCachingAllocator(dev, 0)
		mgr := backend.NewManager(backend.Config{GPUs: []backend.Allocator{gpu}, Host: host.NewAllocator()})
		defer mgr.Close()
		c := tensor.NewContext(mgr)
		must := func(v *tensor.Tensor, err error) *tensor.Tensor {
			t.Helper()
			if err != nil {
				t.Fatal(err)
			}
			return v
		}
		const B, In, H, Out = 64, 512, 1024, 10
		w1, b1, err := tnn.NewLinearParams(c, In, H, true, "cuda:0", tensor.Float32)
		if err != nil {
			t.Fatal(err)
		}
		w2, b2, err := tnn.NewLinearParams(c, H, Out, true, "cuda:0", tensor.Float32)
		if err != nil {
			t.Fatal(err)
		}
		P := r512(H*In*4) + r512(H*4) + r512(Out*H*4) + r512(Out*4)
		X, BH, Y := r512(B*In*4), r512(B*H*4), r512(B*Out*4)
		x := must(tensor.Randn(c, []int{B, In}, tensor.Float32, "cuda:0"))
		params := []*tensor.Tensor{w1, b1, w2, b2}
		opt, tr := adamTracker(t, c, params)
		tr.Start()
		root, l1, act, l2 := tr.NewModule("MLP", "Sequential"), tr.NewModule("0", "Linear"), tr.NewModule("1", "ReLU"), tr.NewModule("2", "Linear")
		tr.Enter(root)
		tr.Enter(l1)
		h := must(autograd.Linear(x, w1, b1))
		tr.Exit()
		tr.Enter(act)
		r := must(autograd.Relu(h))
		h = nil
		tr.Exit()
		tr.Enter(l2)
		y := must(autograd.Linear(r, w2, b2))
		r = nil
		tr.Exit()
		tr.Exit()
		loss := must(autograd.Sum(y, nil, false, tensor.Undefined))
		y = nil
		// x is saved by the first addmm (for w1's gradient), relu's result
		// by relu and the second addmm; the loss is a temporary.
		check(t, "after forward", tr.Current(), map[memtrack.Category]uint64{
			memtrack.Parameter: P, memtrack.Activation: X + BH, memtrack.Temp: 512})
		// Per-module forward peaks: each module's output is a temporary
		// when it is allocated (saved only after the forward, or never).
		check(t, "0 forward", *l1.Forward, map[memtrack.Category]uint64{
			memtrack.Parameter: P, memtrack.Activation: X, memtrack.Temp: BH})
		check(t, "1 forward", *act.Forward, map[memtrack.Category]uint64{
			memtrack.Parameter: P, memtrack.Activation: X, memtrack.Temp: 2 * BH})
		check(t, "2 forward", *l2.Forward, map[memtrack.Category]uint64{
			memtrack.Parameter: P, memtrack.Activation: X + BH, memtrack.Temp: Y})
		check(t, "root forward", *root.Forward, map[memtrack.Category]uint64{
			memtrack.Parameter: P, memtrack.Activation: X, memtrack.Temp: 2 * BH})

		if err := autograd.Backward([]*tensor.Tensor{loss}, nil, false); err != nil {
			t.Fatal(err)
		}
		check(t, "after backward", tr.Current(), map[memtrack.Category]uint64{
			memtrack.Parameter: P, memtrack.Gradient: P, memtrack.Temp: 512, memtrack.Other: X})
		for _, m := range []*memtrack.Module{root, l1, act, l2} {
			if m.Backward == nil {
				t.Errorf("%s: no backward peak", m.Name)
			} else if m.Backward.Total > root.Backward.Total {
				t.Errorf("%s: backward peak %d above the root's %d", m.Name, m.Backward.Total, root.Backward.Total)
			}
		}
		for _, m := range []*memtrack.Module{root, l1, act, l2} {
			t.Logf("%s backward peak: %v", m.Name, m.Backward)
		}
		if err := opt.Step(); err != nil {
			t.Fatal(err)
		}
		rep := tr.Stop()
		// The foreach step's peak: the square roots of the second moments,
		// one parameter-sized temporary list.
		check(t, "peak", rep.Peak, map[memtrack.Category]uint64{
			memtrack.Parameter: P, memtrack.Gradient: P, memtrack.Optstate: 2 * P, memtrack.Temp: P + 512, memtrack.Other: X})
		check(t, "end", rep.End, map[memtrack.Category]uint64{
			memtrack.Parameter: P, memtrack.Gradient: P, memtrack.Optstate: 2 * P, memtrack.Temp: 512, memtrack.Other: X})
		if got := gpu.Allocated(); got != rep.End.Total {
			t.Errorf("allocated %d, end total %d", got, rep.End.Total)
		}
		if len(rep.Modules) != 4 {
			t.Errorf("modules: %d", len(rep.Modules))
		}
		// the tracker holds the optimizer and the parameters weakly: the
		// test holds them until the end
		runtime.KeepAlive(loss)
		runtime.KeepAlive(x)
		runtime.KeepAlive(opt)
		runtime.KeepAlive(params)
	}
}

// TestSnapshotFollowsReplacedRoles: a snapshot remembers each role's last
// memory (its memo); a gradient set to None and made again, and optimizer
// state made at the first step, must count in their new memory, and the
// freed memory not at all.
func TestSnapshotFollowsReplacedRoles(t *testing.T) {
	c := metaContext(t, 1<<30)
	const B, In, Out = 32, 256, 128
	w, b, err := tnn.NewLinearParams(c, In, Out, true, "cuda:0", tensor.Float32)
	if err != nil {
		t.Fatal(err)
	}
	params := []*tensor.Tensor{w, b}
	P := r512(Out*In*4) + r512(Out*4)
	opt, tr := adamTracker(t, c, params)
	x, err := tensor.Randn(c, []int{B, In}, tensor.Float32, "cuda:0")
	if err != nil {
		t.Fatal(err)
	}
	X := r512(B * In * 4)
	tr.Start()
	var state uint64
	for range 3 {
		y, err := autograd.Linear(x, w, b)
		if err != nil {
			t.Fatal(err)
		}
		loss, err := autograd.Sum(y, nil, false, tensor.Undefined)
		if err != nil {
			t.Fatal(err)
		}
		y = nil
		if err := autograd.Backward([]*tensor.Tensor{loss}, nil, false); err != nil {
			t.Fatal(err)
		}
		loss = nil
		check(t, "after backward", tr.Current(), map[memtrack.Category]uint64{
			memtrack.Parameter: P, memtrack.Gradient: P, memtrack.Optstate: state, memtrack.Other: X})
		if err := opt.Step(); err != nil {
			t.Fatal(err)
		}
		state = 2 * P // exp_avg and exp_avg_sq, from the first step on
		if err := optim.ZeroGrad(params, true); err != nil {
			t.Fatal(err)
		}
		check(t, "after zero_grad(set_to_none=True)", tr.Current(), map[memtrack.Category]uint64{
			memtrack.Parameter: P, memtrack.Optstate: state, memtrack.Other: X})
	}
	tr.Stop()
	runtime.KeepAlive(x)
}

// TestFailedAtTheOOM: the breakdown of a failed call is taken at its
// out-of-memory error, while the call's values still hold what they held:
// a collection between the failure and StopFailed, after they let go,
// does not turn the saved activations (tracked weakly) into temporaries.
func TestFailedAtTheOOM(t *testing.T) {
	c := metaContext(t, 64<<20)
	const B, In, Out = 64, 1024, 1024
	w, b, err := tnn.NewLinearParams(c, In, Out, true, "cuda:0", tensor.Float32)
	if err != nil {
		t.Fatal(err)
	}
	tr, err := memtrack.New(c, "cuda:0")
	if err != nil {
		t.Fatal(err)
	}
	tr.AddParams(w, b)
	tr.Start()
	func() {
		x, err := tensor.Randn(c, []int{B, In}, tensor.Float32, "cuda:0")
		if err != nil {
			t.Fatal(err)
		}
		y, err := autograd.Linear(x, w, b) // saves x for w's gradient
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tensor.Empty(c, []int{1 << 30}, tensor.Float32, "cuda:0"); !backend.IsOOM(err) {
			t.Fatalf("a 4 GiB tensor on a 64 MiB card: %v", err)
		}
		runtime.KeepAlive(y)
	}()
	runtime.GC() // the call's values are gone: the saved x's weak reference is cleared
	rep := tr.StopFailed()
	X, Y := r512(B*In*4), r512(B*Out*4)
	check(t, "failed", *rep.Failed, map[memtrack.Category]uint64{
		memtrack.Parameter: r512(Out*In*4) + r512(Out*4), memtrack.Activation: X, memtrack.Temp: Y})
}

// metaContext returns a tensor Context over one simulated meta GPU of
// total bytes (a caching allocator, the Manager's default peak mode), closed when
// the test ends.
func metaContext(t *testing.T, total uint64) *tensor.Context {
	dev := sim.New(sim.Spec{Count: 1, Total: total, Meta: true})[0]
	mgr := backend.NewManager(backend.Config{GPUs: []backend.Allocator{backend.NewCachingAllocator(dev, 0)}, Host: host.NewAllocator()})
	t.Cleanup(mgr.Close)
	return tensor.NewContext(mgr)
}
