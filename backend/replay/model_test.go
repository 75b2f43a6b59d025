package replay

import (
	"testing"

	"github.com/memsh/memsh/backend"
	"github.com/memsh/memsh/backend/sim"
)

func TestFit3(t *testing.T) {
	for _, tc := range []struct {
		name string
		f    func(x int64) int64
	}{
		{"constant", func(x int64) int64 { return 7077888 }},
		{"linear", func(x int64) int64 { return 6291456 * x }},
		{"affine", func(x int64) int64 { return 1536*x + 512 }},
		{"quadratic", func(x int64) int64 { return 4*12*x*x + 8*x + 256 }},
		{"large", func(x int64) int64 { return 1 << 40 * x }},
	} {
		xs := [3]int64{32, 16, 8}
		var ys [3]int64
		for i, x := range xs {
			ys[i] = tc.f(x)
		}
		p := fit3(xs, ys)
		for _, x := range []int64{1, 3, 7, 9, 100, 1001, 4096} {
			got, ok := p.at(x)
			if want := tc.f(x); !ok || int64(got) != want {
				t.Errorf("%s at %d: got %d (%v), want %d", tc.name, x, got, ok, want)
			}
		}
	}
	// a rounding the three sizes share is not a polynomial elsewhere: the
	// prediction at an odd size is not a whole number, or wrong
	ceil4 := func(x int64) int64 { return (x + 3) / 4 * 4 * 1024 }
	p := fit3([3]int64{32, 16, 8}, [3]int64{ceil4(32), ceil4(16), ceil4(8)})
	if got, ok := p.at(9); ok && int64(got) == ceil4(9) {
		t.Errorf("ceil4 at 9 predicted right (%d): the test shows nothing", got)
	}
	// not whole: (x/2)
	h := fit3([3]int64{2, 4, 6}, [3]int64{1, 2, 3})
	if _, ok := h.at(3); ok {
		t.Error("x/2 at 3: want not a whole number")
	}
}

// TestReplayMatchesAllocator replays a small stream and compares it with
// the same allocations made through a Manager on the device it copies.
func TestReplayMatchesAllocator(t *testing.T) {
	sp, err := sim.ParseSpec("1GiB,meta")
	if err != nil {
		t.Fatal(err)
	}
	dev := sim.New(sp)[0]
	a := backend.NewCachingAllocator(dev, 0)
	m := backend.NewManager(backend.Config{GPUs: []backend.Allocator{a}, Peak: backend.PeakExact})
	sizes := []uint64{3 << 20, 512, 25 << 20, 1 << 20, 700 << 20, 5 << 20}
	rec := Record(m, 1)
	var hs []*backend.Memory
	for _, n := range sizes {
		h, err := m.Alloc("cuda:0", n)
		if err != nil {
			t.Fatal(err)
		}
		hs = append(hs, h)
	}
	m.Release(hs[2], "test")
	m.Release(hs[0], "test")
	h, err := m.Alloc("cuda:0", 20<<20)
	if err != nil {
		t.Fatal(err)
	}
	hs = append(hs, h)
	for _, h := range hs {
		m.Release(h, "test")
	}
	s := rec.Stop()
	if s.Why != "" {
		t.Fatal(s.Why)
	}
	p := programOf(s)
	plan := &Plan{Ops: p.ops, Pre: make([]int8, len(p.ops)), Alive: p.alive, Dead: p.dead, Keep: make([]bool, len(p.alive)), expect: p.pre}
	o, err := Replay(s.start.clone(), plan, backend.PeakExact)
	if err != nil {
		t.Fatal(err)
	}
	for id, b := range s.Blocks {
		if o.Blocks[id] != b {
			t.Errorf("allocation %d: replay %+v, allocator %+v", id, o.Blocks[id], b)
		}
	}
	if o.Peaks[0] != s.Peaks[0] {
		t.Errorf("peaks: replay %+v, allocator %+v", o.Peaks[0], s.Peaks[0])
	}
	// too large for the device: out of memory, with the allocator's error
	big := &Plan{Ops: []Op{{Kind: Alloc, ID: 0, Size: 2 << 30}}, Pre: []int8{0}, Alive: []int64{0}, Dead: []int64{never}, Keep: []bool{false}}
	o, err = Replay(s.start.clone(), big, backend.PeakExact)
	if err != nil || o.Status != "oom" || o.OOMError() == nil {
		t.Fatalf("2 GiB on 1 GiB: %+v, %v", o, err)
	}
}
