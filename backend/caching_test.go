package backend

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
)

const (
	caKiB = uint64(1) << 10
	caMiB = uint64(1) << 20
	caGiB = uint64(1) << 30
)

// caFakeDevice is a Device with a fixed capacity. Addresses start at base and
// never repeat; each allocation is followed by a 2 MiB gap so segments are
// never adjacent. With host set, every allocation has a Host slice.
type caFakeDevice struct {
	capacity uint64
	host     bool
	failWith error // if set, Malloc fails with it (not ErrDeviceFull)

	used    uint64
	next    uintptr
	mallocs int
	frees   int
	sizes   []uint64 // sizes passed to Malloc, in order
	live    map[uintptr]uint64
	bufs    map[uintptr][]byte
}

func newCAFakeDevice(capacity uint64, host bool) *caFakeDevice {
	return &caFakeDevice{
		capacity: capacity, host: host, next: 0x7f0000000000,
		live: map[uintptr]uint64{}, bufs: map[uintptr][]byte{},
	}
}

func (d *caFakeDevice) Name() string        { return "cuda:0" }
func (d *caFakeDevice) Description() string { return "fake GPU" }
func (d *caFakeDevice) Kind() string        { return "sim" }
func (d *caFakeDevice) MemGetInfo() (free, total uint64, err error) {
	return d.capacity - d.used, d.capacity, nil
}

func (d *caFakeDevice) Malloc(size uint64) (DeviceMem, error) {
	if d.failWith != nil {
		return DeviceMem{}, d.failWith
	}
	if size == 0 {
		return DeviceMem{}, errors.New("fake: zero-size malloc")
	}
	if d.used+size > d.capacity {
		return DeviceMem{}, fmt.Errorf("fake: %d bytes: %w", size, ErrDeviceFull)
	}
	d.used += size
	d.mallocs++
	d.sizes = append(d.sizes, size)
	m := DeviceMem{Ptr: d.next}
	if d.host {
		m.Host = make([]byte, size)
		d.bufs[m.Ptr] = m.Host
	}
	d.live[m.Ptr] = size
	d.next += uintptr((size+2*caMiB-1)/(2*caMiB)*(2*caMiB) + 2*caMiB)
	return m, nil
}

func (d *caFakeDevice) Free(m DeviceMem, size uint64) error {
	got, ok := d.live[m.Ptr]
	if !ok || got != size {
		return fmt.Errorf("fake: bad free of %#x (%d bytes)", m.Ptr, size)
	}
	delete(d.live, m.Ptr)
	delete(d.bufs, m.Ptr)
	d.used -= size
	d.frees++
	return nil
}

func caMalloc(t testing.TB, a *CachingAllocator, size uint64) *Block {
	t.Helper()
	b, err := a.Malloc(size)
	if err != nil {
		t.Fatalf("Malloc(%d): %v", size, err)
	}
	return b
}

// caCheckInvariants recomputes what the allocator's statistics must be from
// its segments and checks the structure: blocks tile each segment, no two
// free blocks are adjacent, free blocks are in the pool trees.
func caCheckInvariants(t *testing.T, a *CachingAllocator) {
	t.Helper()
	var allocated, reserved, requested, nAlloc, nSeg, nSplit, splitBytes [3]int64
	for _, s := range a.Segments() {
		si := statLarge
		if s.Pool == "small" {
			si = statSmall
		}
		nSeg[si]++
		reserved[si] += int64(s.Size)
		ptr, total := s.Ptr, uint64(0)
		for i, b := range s.Blocks {
			if b.Ptr != ptr {
				t.Fatalf("segment %#x: block %d at %#x, want %#x", s.Ptr, i, b.Ptr, ptr)
			}
			if i > 0 && !b.Allocated && !s.Blocks[i-1].Allocated {
				t.Fatalf("segment %#x: adjacent free blocks %d and %d", s.Ptr, i-1, i)
			}
			if b.Allocated {
				nAlloc[si]++
				allocated[si] += int64(b.Size)
				requested[si] += int64(b.Requested)
			} else if len(s.Blocks) > 1 {
				nSplit[si]++
				splitBytes[si] += int64(b.Size)
			}
			ptr += uintptr(b.Size)
			total += b.Size
		}
		if total != s.Size {
			t.Fatalf("segment %#x: blocks add up to %d, want %d", s.Ptr, total, s.Size)
		}
	}
	nFree := 0
	for _, seg := range a.segs {
		for b := seg.head; b != nil; b = b.next {
			if !b.allocated {
				nFree++
				if !seg.pool.free.Has(b) {
					t.Fatalf("free block %#x (%d) not in its pool", b.ptr, b.size)
				}
			}
		}
	}
	if n := a.small.free.Len() + a.large.free.Len(); n != nFree {
		t.Fatalf("pools hold %d free blocks, segments %d", n, nFree)
	}
	for si := range 3 {
		if si == statAll {
			continue
		}
		for _, c := range []struct {
			name string
			arr  *statArray
			want int64
		}{
			{"allocation", &a.st.allocation, nAlloc[si]},
			{"active", &a.st.active, nAlloc[si]},
			{"segment", &a.st.segment, nSeg[si]},
			{"allocated_bytes", &a.st.allocatedBytes, allocated[si]},
			{"active_bytes", &a.st.activeBytes, allocated[si]},
			{"reserved_bytes", &a.st.reservedBytes, reserved[si]},
			{"requested_bytes", &a.st.requestedBytes, requested[si]},
			{"inactive_split", &a.st.inactiveSplit, nSplit[si]},
			{"inactive_split_bytes", &a.st.inactiveSplitBytes, splitBytes[si]},
		} {
			if got := c.arr[si].current; got != c.want {
				t.Fatalf("%s pool %d: current %d, want %d", c.name, si, got, c.want)
			}
			if all := c.arr[statAll].current; all != c.arr[statSmall].current+c.arr[statLarge].current {
				t.Fatalf("%s: all %d != small+large", c.name, all)
			}
		}
	}
}

func TestRoundSize(t *testing.T) {
	// On a fresh allocator: PyTorch's 512-byte rounding, plus the
	// unsplit remainder of a new large segment.
	for _, c := range []struct{ in, want uint64 }{
		{0, 0}, {1, 512}, {511, 512}, {512, 512}, {513, 1024}, {1000, 1024},
		{caMiB - 1, caMiB}, {caMiB, caMiB}, {caMiB + 1, caMiB + 512}, {9 * caMiB, 9 * caMiB},
		{10 * caMiB, 10 * caMiB}, {11 * caMiB, 12 * caMiB}, {15 * caMiB, 16 * caMiB},
		{19 * caMiB, 20 * caMiB}, {19*caMiB - 512, 19*caMiB - 512},
	} {
		a := NewCachingAllocator(newCAFakeDevice(caGiB, false), 0)
		if got := a.RoundSize(c.in); got != c.want {
			t.Errorf("RoundSize(%d) = %d, want %d", c.in, got, c.want)
		}
	}
	// With cached blocks it is the size of the block best fit would hand out.
	a := NewCachingAllocator(newCAFakeDevice(caGiB, false), 0)
	x := caMalloc(t, a, 3*caMiB)
	caMalloc(t, a, 2*caMiB)
	a.Free(x) // free: 3 MiB, then 15 MiB
	for _, c := range []struct{ in, want uint64 }{
		{2 * caMiB, 3 * caMiB}, {3*caMiB/2 + 512, 3*caMiB/2 + 512}, {5 * caMiB, 5 * caMiB}, {14 * caMiB, 15 * caMiB},
		{30 * caMiB, 30 * caMiB}, {4096, 4096},
	} {
		if got := a.RoundSize(c.in); got != c.want {
			t.Errorf("with a cache: RoundSize(%d) = %d, want %d", c.in, got, c.want)
		}
	}
}

func TestSegmentSizes(t *testing.T) {
	for _, c := range []struct {
		req       uint64
		seg       uint64
		pool      string
		blockSize uint64 // what allocated_bytes counts
	}{
		{1, 2 * caMiB, "small", 512},
		{512, 2 * caMiB, "small", 512},
		{64 * caKiB, 2 * caMiB, "small", 64 * caKiB},
		{caMiB, 2 * caMiB, "small", caMiB},
		{caMiB + 1, 20 * caMiB, "large", caMiB + 512},
		{9 * caMiB, 20 * caMiB, "large", 9 * caMiB},
		{10*caMiB - 1024, 20 * caMiB, "large", 10*caMiB - 1024},
		{10*caMiB - 1, 10 * caMiB, "large", 10 * caMiB}, // rounds up to 10 MiB
		{10 * caMiB, 10 * caMiB, "large", 10 * caMiB},
		{11 * caMiB, 12 * caMiB, "large", 12 * caMiB},         // remainder 1 MiB: not split
		{15 * caMiB, 16 * caMiB, "large", 16 * caMiB},         // the FACTS.md example
		{19*caMiB - 512, 20 * caMiB, "large", 19*caMiB - 512}, // remainder 1 MiB + 512: split
		{19 * caMiB, 20 * caMiB, "large", 20 * caMiB},
		{21 * caMiB, 22 * caMiB, "large", 22 * caMiB},
		{2 * caGiB, 2 * caGiB, "large", 2 * caGiB},
	} {
		t.Run(fmt.Sprint(c.req), func(t *testing.T) {
			d := newCAFakeDevice(16*caGiB, false)
			a := NewCachingAllocator(d, 0)
			if got := a.RoundSize(c.req); got != c.blockSize {
				t.Fatalf("RoundSize(%d) = %d, want %d", c.req, got, c.blockSize)
			}
			b := caMalloc(t, a, c.req)
			if d.mallocs != 1 || d.sizes[0] != c.seg {
				t.Fatalf("device mallocs %v, want one of %d", d.sizes, c.seg)
			}
			if b.Size != c.blockSize || b.Requested != c.req {
				t.Fatalf("block Size %d Requested %d, want %d %d", b.Size, b.Requested, c.blockSize, c.req)
			}
			segs := a.Segments()
			if len(segs) != 1 || segs[0].Pool != c.pool || segs[0].Size != c.seg {
				t.Fatalf("segments %+v", segs)
			}
			st := a.Stats()
			if st["allocated_bytes.all.current"] != int64(c.blockSize) ||
				st["requested_bytes.all.current"] != int64(c.req) ||
				st["reserved_bytes.all.current"] != int64(c.seg) ||
				st["reserved_bytes."+c.pool+"_pool.current"] != int64(c.seg) {
				t.Fatalf("stats %v", st)
			}
			caCheckInvariants(t, a)
		})
	}
}

// caBestFitLayout makes one 20 MiB large-pool segment holding, by address:
// keep 2 MiB | free 4 MiB | keep 2 MiB | free 3 MiB | keep 2 MiB | free 7 MiB.
func caBestFitLayout(t *testing.T) (*CachingAllocator, *caFakeDevice, uintptr) {
	d := newCAFakeDevice(caGiB, false)
	a := NewCachingAllocator(d, 0)
	var blocks []*Block
	for _, s := range []uint64{2, 4, 2, 3, 2} {
		blocks = append(blocks, caMalloc(t, a, s*caMiB))
	}
	a.Free(blocks[1])
	a.Free(blocks[3])
	if d.mallocs != 1 {
		t.Fatalf("layout took %d segments", d.mallocs)
	}
	return a, d, blocks[0].Ptr
}

func TestBestFit(t *testing.T) {
	// Free blocks: 4 MiB at +2 MiB, 3 MiB at +8 MiB, 7 MiB at +13 MiB.
	for _, c := range []struct {
		req       uint64
		offset    uint64 // of the block handed out, from the segment start
		blockSize uint64
		mallocs   int
	}{
		{3 * caMiB, 8 * caMiB, 3 * caMiB, 1},             // exact fit
		{5 * caMiB / 2, 8 * caMiB, 3 * caMiB, 1},         // remainder 0.5 MiB stays with the block
		{2 * caMiB, 8 * caMiB, 3 * caMiB, 1},             // remainder exactly 1 MiB: not split
		{3*caMiB/2 + 512, 8 * caMiB, 3*caMiB/2 + 512, 1}, // remainder 1.5 MiB - 512: split
		{7 * caMiB / 2, 2 * caMiB, 4 * caMiB, 1},         // 3 MiB too small: the 4 MiB block
		{4 * caMiB, 2 * caMiB, 4 * caMiB, 1},             // exact fit
		{5 * caMiB, 13 * caMiB, 5 * caMiB, 1},            // the 7 MiB block, split
		{6 * caMiB, 13 * caMiB, 7 * caMiB, 1},            // the 7 MiB block, unsplit
		{8 * caMiB, 22 * caMiB, 8 * caMiB, 2},            // nothing fits: a new segment (the fake leaves a 2 MiB gap)
	} {
		t.Run(FormatSize(c.req), func(t *testing.T) {
			a, d, base := caBestFitLayout(t)
			b := caMalloc(t, a, c.req)
			if got := uint64(b.Ptr - base); got != c.offset || b.Size != c.blockSize {
				t.Fatalf("got block at +%s of %s, want +%s of %s",
					FormatSize(got), FormatSize(b.Size), FormatSize(c.offset), FormatSize(c.blockSize))
			}
			if d.mallocs != c.mallocs {
				t.Fatalf("device mallocs %d, want %d", d.mallocs, c.mallocs)
			}
			caCheckInvariants(t, a)
		})
	}
}

func TestBestFitTieByAddress(t *testing.T) {
	// keep 2 | free 3 | keep 2 | free 3 | keep 2 | free 8 (MiB)
	a := NewCachingAllocator(newCAFakeDevice(caGiB, false), 0)
	var bs []*Block
	for _, s := range []uint64{2, 3, 2, 3, 2} {
		bs = append(bs, caMalloc(t, a, s*caMiB))
	}
	base := bs[0].Ptr
	a.Free(bs[3])
	a.Free(bs[1])
	for _, want := range []uint64{2 * caMiB, 7 * caMiB, 12 * caMiB} {
		b := caMalloc(t, a, 3*caMiB)
		if got := uint64(b.Ptr - base); got != want {
			t.Fatalf("3 MiB block at +%s, want +%s", FormatSize(got), FormatSize(want))
		}
	}
	caCheckInvariants(t, a)
}

func TestSplitThresholds(t *testing.T) {
	// Each case fills the free space of a fresh segment with a first
	// request, then asks for second; want is the size of the block the
	// second request gets and whether a free remainder stays behind it.
	for _, c := range []struct {
		name          string
		first, second uint64
		want          uint64
		remainder     uint64 // free bytes left after the second block; 0: none
	}{
		// Small pool: split when the remainder is >= 512 bytes. All sizes
		// are multiples of 512, so any remainder splits.
		{"small/remainder 512", caMiB, caMiB - 512, caMiB - 512, 512},
		{"small/remainder 0", caMiB, caMiB, caMiB, 0},
		{"small/remainder 1.5 MiB", 512, 512, 512, 2*caMiB - 1024},
		// Large pool: split only when the remainder is > 1 MiB.
		{"large/remainder 1 MiB", 2 * caMiB, 17 * caMiB, 18 * caMiB, 0},
		{"large/remainder 1 MiB + 512", 2 * caMiB, 17*caMiB - 512, 17*caMiB - 512, caMiB + 512},
		{"large/remainder 0.5 MiB", 2 * caMiB, 35 * caMiB / 2, 18 * caMiB, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			d := newCAFakeDevice(caGiB, false)
			a := NewCachingAllocator(d, 0)
			caMalloc(t, a, c.first)
			b := caMalloc(t, a, c.second)
			if d.mallocs != 1 {
				t.Fatalf("device mallocs %d, want 1", d.mallocs)
			}
			if b.Size != c.want {
				t.Fatalf("second block %d bytes, want %d", b.Size, c.want)
			}
			blocks := a.Segments()[0].Blocks
			last := blocks[len(blocks)-1]
			var rem uint64
			if !last.Allocated {
				rem = last.Size
			}
			if rem != c.remainder {
				t.Fatalf("free remainder %d, want %d (blocks %+v)", rem, c.remainder, blocks)
			}
			if got := a.Stats()["allocated_bytes.all.current"]; got != int64(b.Size+a.RoundSize(c.first)) {
				t.Fatalf("allocated_bytes %d", got)
			}
			caCheckInvariants(t, a)
		})
	}
}

type caBlockLayout struct {
	Size      uint64
	Allocated bool
}

func caLayout(a *CachingAllocator) [][]caBlockLayout {
	var out [][]caBlockLayout
	for _, s := range a.Segments() {
		var l []caBlockLayout
		for _, b := range s.Blocks {
			l = append(l, caBlockLayout{b.Size, b.Allocated})
		}
		out = append(out, l)
	}
	return out
}

func TestMergeOnFree(t *testing.T) {
	// Small pool segment: A 256 KiB | B 256 KiB | C 256 KiB | free 1.25 MiB.
	const k = 256 * caKiB
	rest := 2*caMiB - 3*k
	F := func(s uint64) caBlockLayout { return caBlockLayout{s, false} }
	U := func(s uint64) caBlockLayout { return caBlockLayout{s, true} }
	for _, c := range []struct {
		order string
		after [][]caBlockLayout // layout after each free
	}{
		{"B,A,C", [][]caBlockLayout{
			{U(k), F(k), U(k), F(rest)},
			{F(2 * k), U(k), F(rest)},
			{F(2 * caMiB)},
		}},
		{"A,C,B", [][]caBlockLayout{
			{F(k), U(k), U(k), F(rest)},
			{F(k), U(k), F(k + rest)},
			{F(2 * caMiB)},
		}},
		{"C,A,B", [][]caBlockLayout{
			{U(k), U(k), F(k + rest)},
			{F(k), U(k), F(k + rest)},
			{F(2 * caMiB)},
		}},
		{"A,B,C", [][]caBlockLayout{
			{F(k), U(k), U(k), F(rest)},
			{F(2 * k), U(k), F(rest)},
			{F(2 * caMiB)},
		}},
	} {
		t.Run(c.order, func(t *testing.T) {
			d := newCAFakeDevice(caGiB, false)
			a := NewCachingAllocator(d, 0)
			blocks := map[string]*Block{}
			for _, n := range []string{"A", "B", "C"} {
				blocks[n] = caMalloc(t, a, k)
			}
			for i, n := range strings.Split(c.order, ",") {
				a.Free(blocks[n])
				if got := caLayout(a); !reflect.DeepEqual(got, [][]caBlockLayout{c.after[i]}) {
					t.Fatalf("after freeing %s: %v, want %v", n, got, c.after[i])
				}
				caCheckInvariants(t, a)
			}
			st := a.Stats()
			if st["inactive_split.all.current"] != 0 || st["inactive_split_bytes.all.current"] != 0 ||
				st["allocated_bytes.all.current"] != 0 || st["active.all.current"] != 0 {
				t.Fatalf("stats after freeing all: %v", st)
			}
			// The merged segment serves a whole-segment-sized small request again.
			b := caMalloc(t, a, caMiB)
			if d.mallocs != 1 || b.Ptr != blocks["A"].Ptr {
				t.Fatalf("mallocs %d, ptr %#x", d.mallocs, b.Ptr)
			}
		})
	}
}

func TestReuseWithoutDeviceMalloc(t *testing.T) {
	for _, size := range []uint64{1, 64 * caKiB, caMiB, 5 * caMiB, 64 * caMiB} {
		t.Run(FormatSize(size), func(t *testing.T) {
			d := newCAFakeDevice(caGiB, false)
			a := NewCachingAllocator(d, 0)
			b := caMalloc(t, a, size)
			ptr := b.Ptr
			a.Free(b)
			for range 3 {
				b = caMalloc(t, a, size)
				if b.Ptr != ptr {
					t.Fatalf("reused block at %#x, want %#x", b.Ptr, ptr)
				}
				a.Free(b)
			}
			if d.mallocs != 1 || d.frees != 0 {
				t.Fatalf("device mallocs %d frees %d, want 1 0", d.mallocs, d.frees)
			}
			st := a.Stats()
			if st["num_device_alloc"] != 1 || st["allocation.all.allocated"] != 4 || st["allocation.all.freed"] != 4 {
				t.Fatalf("stats %v", st)
			}
		})
	}
}

func TestEmptyCache(t *testing.T) {
	d := newCAFakeDevice(caGiB, false)
	a := NewCachingAllocator(d, 0)
	keep := caMalloc(t, a, 4*caMiB)   // large segment 1, stays partly allocated
	tmp := caMalloc(t, a, 30*caMiB)   // large segment 2 (30 MiB)
	small := caMalloc(t, a, 4*caKiB)  // small segment
	small2 := caMalloc(t, a, 8*caKiB) // same small segment
	a.Free(tmp)
	a.Free(small)
	if a.Reserved() != 20*caMiB+30*caMiB+2*caMiB {
		t.Fatalf("reserved %d", a.Reserved())
	}
	a.EmptyCache()
	if d.frees != 1 || a.Reserved() != 22*caMiB || a.Allocated() != 4*caMiB+8*caKiB {
		t.Fatalf("after EmptyCache: frees %d reserved %d allocated %d", d.frees, a.Reserved(), a.Allocated())
	}
	a.Free(small2)
	a.EmptyCache()
	if d.frees != 2 || a.Reserved() != 20*caMiB {
		t.Fatalf("after second EmptyCache: frees %d reserved %d", d.frees, a.Reserved())
	}
	a.Free(keep)
	a.EmptyCache()
	if d.frees != 3 || a.Reserved() != 0 || len(a.Segments()) != 0 || len(d.live) != 0 {
		t.Fatalf("after last EmptyCache: frees %d reserved %d segments %d", d.frees, a.Reserved(), len(a.Segments()))
	}
	st := a.Stats()
	for k, want := range map[string]int64{
		"num_device_alloc": 3, "num_device_free": 3,
		"segment.all.current": 0, "segment.all.peak": 3, "segment.all.allocated": 3, "segment.all.freed": 3,
		"segment.large_pool.freed": 2, "segment.small_pool.freed": 1,
		"reserved_bytes.all.peak": int64(52 * caMiB), "reserved_bytes.all.freed": int64(52 * caMiB),
	} {
		if st[k] != want {
			t.Errorf("%s = %d, want %d", k, st[k], want)
		}
	}
	caCheckInvariants(t, a)
}

func TestRetryBeforeOOM(t *testing.T) {
	// 23 MiB device: a cached 2 MiB small segment leaves 21 MiB, too little
	// for a 22 MiB segment until the cache is released.
	d := newCAFakeDevice(23*caMiB, false)
	a := NewCachingAllocator(d, 0)
	a.Free(caMalloc(t, a, 100*caKiB))
	b := caMalloc(t, a, 21*caMiB)
	if b.Size != 22*caMiB {
		t.Fatalf("block %d", b.Size)
	}
	st := a.Stats()
	for k, want := range map[string]int64{
		"num_alloc_retries": 1, "num_ooms": 0, "num_device_alloc": 2, "num_device_free": 1,
		"reserved_bytes.all.current": int64(22 * caMiB), "reserved_bytes.all.peak": int64(22 * caMiB),
		"segment.small_pool.current": 0,
	} {
		if st[k] != want {
			t.Errorf("%s = %d, want %d", k, st[k], want)
		}
	}
	caCheckInvariants(t, a)
}

func TestOOM(t *testing.T) {
	d := newCAFakeDevice(16*caGiB, false)
	a := NewCachingAllocator(d, 0)
	// 1.5 GiB segment split into 1 GiB allocated + 512 MiB free (reserved but
	// unallocated, and not releasable); a 13 GiB block; a cached small
	// segment, released by the retry.
	a.Free(caMalloc(t, a, 3*caGiB/2))
	caMalloc(t, a, caGiB)
	caMalloc(t, a, 13*caGiB)
	a.Free(caMalloc(t, a, 1000))
	if d.used != 29*caGiB/2+2*caMiB {
		t.Fatalf("device used %d", d.used)
	}
	_, err := a.Malloc(2 * caGiB)
	if err == nil {
		t.Fatal("Malloc(2 GiB) succeeded")
	}
	want := "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 16.00 GiB of which 1.50 GiB is free. " +
		"Including non-memsh memory, this process has 14.50 GiB memory in use. " +
		"Of the allocated memory 14.00 GiB is allocated by memsh, and 512.00 MiB is reserved by memsh but unallocated. " +
		"If reserved but unallocated memory is large, memsh's allocator has no expandable_segments setting: " +
		"free or reorder long-lived tensors (cuda.memory_summary() and cuda.dump_snapshot() show the segments) to avoid fragmentation.  " +
		"See documentation for Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"
	if err.Error() != want {
		t.Fatalf("error\n%q\nwant\n%q", err.Error(), want)
	}
	var oom *OOMError
	if !errors.As(err, &oom) || !IsOOM(err) {
		t.Fatalf("error %T is not an *OOMError", err)
	}
	if *oom != (OOMError{Device: "cuda:0", Index: 0, Requested: 2 * caGiB, Total: 16 * caGiB, Free: 3 * caGiB / 2,
		Allocated: 14 * caGiB, Reserved: 29 * caGiB / 2, ProcessUsed: 29 * caGiB / 2, ProcessKnown: true}) {
		t.Fatalf("OOMError %+v", *oom)
	}
	st := a.Stats()
	for k, want := range map[string]int64{
		"num_alloc_retries": 1, "num_ooms": 1, "num_device_alloc": 3, "num_device_free": 1,
		"allocation.all.current": 2,
	} {
		if st[k] != want {
			t.Errorf("%s = %d, want %d", k, st[k], want)
		}
	}
	caCheckInvariants(t, a)

	// The requested size is what the caller asked for, and the GPU index is
	// the one given to NewCachingAllocator.
	a3 := NewCachingAllocator(newCAFakeDevice(caGiB, false), 3)
	_, err = a3.Malloc(caGiB + 1)
	if want := "CUDA out of memory. Tried to allocate 1.00 GiB. GPU 3 has a total capacity of 1024.00 MiB of which 1024.00 MiB is free. " +
		"Including non-memsh memory, this process has 0 bytes memory in use. " +
		"Of the allocated memory 0 bytes is allocated by memsh, and 0 bytes is reserved by memsh but unallocated. " + OOMAdvice + "  " + OOMDocs; err == nil || err.Error() != want {
		t.Fatalf("error %v, want %q", err, want)
	}
}

func TestHugeRequestIsOOM(t *testing.T) {
	d := newCAFakeDevice(caGiB, false)
	a := NewCachingAllocator(d, 0)
	a.Free(caMalloc(t, a, 4096)) // a cached segment, released by the failure
	for _, size := range []uint64{1<<62 + 1, 1<<64 - 1} {
		if got := a.RoundSize(size); got != size {
			t.Errorf("RoundSize(%d) = %d", size, got)
		}
		_, err := a.Malloc(size)
		var oom *OOMError
		if !errors.As(err, &oom) || oom.Requested != size {
			t.Fatalf("Malloc(%d): %v", size, err)
		}
	}
	if st := a.Stats(); st["num_ooms"] != 2 || st["num_alloc_retries"] != 2 || st["num_device_free"] != 1 || d.mallocs != 1 {
		t.Fatalf("stats %v", st)
	}
	caCheckInvariants(t, a)
}

func TestDeviceErrorIsWrapped(t *testing.T) {
	boom := errors.New("illegal address")
	d := newCAFakeDevice(caGiB, false)
	d.failWith = boom
	a := NewCachingAllocator(d, 0)
	_, err := a.Malloc(caMiB)
	if !errors.Is(err, boom) || IsOOM(err) {
		t.Fatalf("error %v", err)
	}
	if want := "cuda:0: allocating a 2.00 MiB segment: illegal address"; err.Error() != want {
		t.Fatalf("error %q, want %q", err, want)
	}
	if st := a.Stats(); st["num_ooms"] != 0 || st["num_alloc_retries"] != 0 || st["allocation.all.allocated"] != 0 {
		t.Fatalf("stats %v", st)
	}
}

func TestStats(t *testing.T) {
	d := newCAFakeDevice(caGiB, false)
	a := NewCachingAllocator(d, 0)
	x := caMalloc(t, a, 1000)    // small: 1024 of a new 2 MiB segment
	y := caMalloc(t, a, 3*caMiB) // large: 3 MiB of a new 20 MiB segment
	z := caMalloc(t, a, 300)     // small: 512 more of the small segment
	a.Free(x)                    // becomes an inactive split block
	a.Free(y)                    // merges back into a whole free segment
	a.EmptyCache()               // releases the large segment
	_ = z
	const small = int64(2 * caMiB)
	want := map[string]int64{
		"allocation.all.current": 1, "allocation.all.peak": 3, "allocation.all.allocated": 3, "allocation.all.freed": 2,
		"allocation.small_pool.current": 1, "allocation.small_pool.peak": 2, "allocation.small_pool.allocated": 2, "allocation.small_pool.freed": 1,
		"allocation.large_pool.current": 0, "allocation.large_pool.peak": 1, "allocation.large_pool.allocated": 1, "allocation.large_pool.freed": 1,

		"allocated_bytes.all.current": 512, "allocated_bytes.all.peak": 1024 + 3<<20 + 512,
		"allocated_bytes.all.allocated": 1024 + 3<<20 + 512, "allocated_bytes.all.freed": 1024 + 3<<20,
		"allocated_bytes.small_pool.current": 512, "allocated_bytes.small_pool.peak": 1536,
		"allocated_bytes.large_pool.current": 0, "allocated_bytes.large_pool.peak": 3 << 20, "allocated_bytes.large_pool.freed": 3 << 20,

		"active.all.current": 1, "active.all.peak": 3, "active_bytes.all.current": 512, "active_bytes.all.peak": 1024 + 3<<20 + 512,

		"requested_bytes.all.current": 300, "requested_bytes.all.peak": 1000 + 3<<20 + 300,
		"requested_bytes.all.allocated": 1300 + 3<<20, "requested_bytes.all.freed": 1000 + 3<<20,
		"requested_bytes.small_pool.current": 300, "requested_bytes.small_pool.peak": 1300,

		"segment.all.current": 1, "segment.all.peak": 2, "segment.all.allocated": 2, "segment.all.freed": 1,
		"segment.small_pool.current": 1, "segment.large_pool.current": 0, "segment.large_pool.peak": 1,
		"reserved_bytes.all.current": small, "reserved_bytes.all.peak": small + 20<<20,
		"reserved_bytes.all.allocated": small + 20<<20, "reserved_bytes.all.freed": 20 << 20,

		// Small segment: split on x (+1 block of 2 MiB - 1024), shrunk by z
		// (-512), x freed (+1 block of 1024). Large: split on y (+1 of 17
		// MiB), merged away on free (-1, -17 MiB).
		"inactive_split.all.current": 2, "inactive_split.all.peak": 3, "inactive_split.all.allocated": 3, "inactive_split.all.freed": 1,
		"inactive_split.small_pool.current": 2, "inactive_split.small_pool.peak": 2,
		"inactive_split.large_pool.current": 0, "inactive_split.large_pool.peak": 1, "inactive_split.large_pool.freed": 1,
		"inactive_split_bytes.small_pool.current": small - 512, "inactive_split_bytes.small_pool.peak": small - 512,
		"inactive_split_bytes.small_pool.allocated": small, "inactive_split_bytes.small_pool.freed": 512,
		"inactive_split_bytes.large_pool.current": 0, "inactive_split_bytes.large_pool.peak": 17 << 20,
		"inactive_split_bytes.large_pool.allocated": 17 << 20, "inactive_split_bytes.large_pool.freed": 17 << 20,
		"inactive_split_bytes.all.current": small - 512, "inactive_split_bytes.all.peak": small - 512 + 17<<20, // after x's free

		"num_alloc_retries": 0, "num_ooms": 0, "num_device_alloc": 2, "num_device_free": 1,
		"num_sync_all_streams": 0, "max_split_size": -1, "oversize_allocations.current": 0,
	}
	st := a.Stats()
	for k, w := range want {
		got, ok := st[k]
		if !ok {
			t.Errorf("no key %s", k)
		} else if got != w {
			t.Errorf("%s = %d, want %d", k, got, w)
		}
	}
	if len(st) != 9*3*4+4+2+8 {
		t.Errorf("%d keys", len(st))
	}
	for k := range st {
		if strings.HasPrefix(k, "allocated.") {
			t.Errorf("key %s: PyTorch calls the count stat \"allocation\"", k)
		}
	}
	caCheckInvariants(t, a)
}

func TestResetPeakStats(t *testing.T) {
	a := NewCachingAllocator(newCAFakeDevice(caGiB, false), 0)
	b := caMalloc(t, a, 50*caMiB)
	s := caMalloc(t, a, 10*caKiB)
	a.Free(b)
	a.EmptyCache()
	before := a.Stats()
	a.ResetPeakStats()
	after := a.Stats()
	for k, v := range after {
		if base, ok := strings.CutSuffix(k, ".peak"); ok {
			if v != after[base+".current"] {
				t.Errorf("%s = %d after reset, current %d", k, v, after[base+".current"])
			}
		} else if v != before[k] {
			t.Errorf("%s changed by reset: %d -> %d", k, before[k], v)
		}
	}
	if after["allocated_bytes.all.peak"] != int64(10*caKiB) || before["allocated_bytes.all.peak"] != int64(50*caMiB+10*caKiB) {
		t.Fatalf("peaks %d %d", before["allocated_bytes.all.peak"], after["allocated_bytes.all.peak"])
	}
	// Peaks grow again from the reset value.
	a.Free(caMalloc(t, a, 4*caMiB))
	if got := a.Stats()["allocated_bytes.all.peak"]; got != int64(4*caMiB+10*caKiB) {
		t.Fatalf("peak after reset and 4 MiB: %d", got)
	}
	_ = s
}

func TestPeakCounters(t *testing.T) {
	a := NewCachingAllocator(newCAFakeDevice(caGiB, false), 0)
	base := caMalloc(t, a, caMiB) // 1 MiB allocated, 2 MiB reserved
	p1 := a.Peaks().New(a.Allocated(), a.Reserved())
	p2 := a.Peaks().New(a.Allocated(), a.Reserved())
	a.Free(caMalloc(t, a, 30*caMiB)) // transient: 30 MiB block of a 30 MiB segment
	for i, p := range []*Peak{p1, p2} {
		if p.MaxAllocated != 31*caMiB || p.MaxReserved != 32*caMiB {
			t.Fatalf("counter %d: %d %d", i+1, p.MaxAllocated, p.MaxReserved)
		}
	}
	a.EmptyCache()
	p1.Reset(a.Allocated(), a.Reserved())
	x := caMalloc(t, a, 5*caMiB) // new 20 MiB segment
	if p1.MaxAllocated != 6*caMiB || p1.MaxReserved != 22*caMiB {
		t.Fatalf("counter 1 after reset: %d %d", p1.MaxAllocated, p1.MaxReserved)
	}
	if p2.MaxAllocated != 31*caMiB || p2.MaxReserved != 32*caMiB {
		t.Fatalf("counter 2 moved: %d %d", p2.MaxAllocated, p2.MaxReserved)
	}
	// A cache hit raises allocated only.
	a.Free(x)
	a.Free(caMalloc(t, a, 12*caMiB))
	if p1.MaxAllocated != 13*caMiB || p1.MaxReserved != 22*caMiB {
		t.Fatalf("counter 1 after cache hit: %d %d", p1.MaxAllocated, p1.MaxReserved)
	}
	p2.Close()
	p1.Close()
	a.Free(base)
}

func TestBlockHost(t *testing.T) {
	d := newCAFakeDevice(caGiB, true)
	a := NewCachingAllocator(d, 0)
	b1 := caMalloc(t, a, 1000)
	b2 := caMalloc(t, a, 3000)
	b3 := caMalloc(t, a, 3*caMiB)
	for _, b := range []*Block{b1, b2, b3} {
		if uint64(len(b.Host)) != b.Size || uint64(cap(b.Host)) != b.Size {
			t.Fatalf("block of %d: Host len %d cap %d", b.Size, len(b.Host), cap(b.Host))
		}
	}
	for i := range b1.Host {
		b1.Host[i] = 0xAA
	}
	for i := range b2.Host {
		b2.Host[i] = 0x55
	}
	// The Host views are the segment's memory at the block's offset.
	seg := d.bufs[b1.Ptr]
	if seg == nil {
		t.Fatal("b1 is not at the start of a segment")
	}
	off := b2.Ptr - b1.Ptr
	if off != 1024 || seg[0] != 0xAA || seg[1023] != 0xAA || seg[off] != 0x55 || seg[off+uintptr(b2.Size)-1] != 0x55 || seg[off+uintptr(b2.Size)] != 0 {
		t.Fatalf("segment bytes do not match the blocks' writes")
	}
	for i, v := range b2.Host {
		if v != 0x55 {
			t.Fatalf("b2.Host[%d] = %#x", i, v)
		}
	}
	// Appending to a Host slice cannot write into the next block.
	_ = append(b1.Host, 1)
	if b2.Host[0] != 0x55 {
		t.Fatal("append through b1.Host wrote into b2")
	}
	// A reused block sees its segment's bytes at its new offset.
	a.Free(b1)
	b4 := caMalloc(t, a, 512)
	if b4.Ptr != b1.Ptr || b4.Host[0] != 0xAA || len(b4.Host) != 512 {
		t.Fatalf("reused block: ptr %#x host[0] %#x len %d", b4.Ptr, b4.Host[0], len(b4.Host))
	}
	// Without host memory, Host is nil.
	a2 := NewCachingAllocator(newCAFakeDevice(caGiB, false), 0)
	if b := caMalloc(t, a2, 4096); b.Host != nil {
		t.Fatal("Host set without host memory")
	}
}

func caMustPanic(t *testing.T, substr string, f func()) {
	t.Helper()
	defer func() {
		t.Helper()
		r := recover()
		if r == nil {
			t.Fatalf("no panic, want one containing %q", substr)
		}
		if msg := fmt.Sprint(r); !strings.Contains(msg, substr) {
			t.Fatalf("panic %q, want one containing %q", msg, substr)
		}
	}()
	f()
}

func TestBadFree(t *testing.T) {
	d := newCAFakeDevice(caGiB, false)
	a := NewCachingAllocator(d, 0)
	other := NewCachingAllocator(newCAFakeDevice(caGiB, false), 1)

	b := caMalloc(t, a, 4096)
	a.Free(b)
	caMustPanic(t, "double free of a 4.00 KiB block", func() { a.Free(b) })
	// Still a double free after the memory went to another block.
	c := caMalloc(t, a, 4096)
	if c.Ptr != b.Ptr {
		t.Fatalf("expected reuse")
	}
	caMustPanic(t, "double free", func() { a.Free(b) })
	a.Free(c)

	caMustPanic(t, "did not hand out", func() { a.Free(&Block{Ptr: 0x1000, Size: 512}) })
	o := caMalloc(t, other, 4096)
	caMustPanic(t, "did not hand out", func() { a.Free(o) })
	other.Free(o)
	caMustPanic(t, "did not hand out", func() { a.Free(o) }) // freed by another allocator
	live := caMalloc(t, a, 4096)
	cp := *live
	caMustPanic(t, "did not hand out", func() { a.Free(&cp) })
	a.Free(live)
	caMustPanic(t, "nil", func() { a.Free(nil) })

	// Zero-size blocks: no memory, no stats, but still freed once only.
	z := caMalloc(t, a, 0)
	if z.Ptr != 0 || z.Size != 0 || z.Requested != 0 || z.Host != nil {
		t.Fatalf("zero block %+v", z)
	}
	if st := a.Stats(); st["allocation.all.current"] != 0 || st["allocation.all.allocated"] != 3 {
		t.Fatalf("stats after zero-size malloc: %v", st)
	}
	caMustPanic(t, "did not hand out", func() { other.Free(z) })
	a.Free(z)
	caMustPanic(t, "double free", func() { a.Free(z) })
	if d.mallocs != 1 {
		t.Fatalf("mallocs %d", d.mallocs)
	}
	caCheckInvariants(t, a)
}

func TestSegments(t *testing.T) {
	d := newCAFakeDevice(caGiB, false)
	a := NewCachingAllocator(d, 0)
	l1 := caMalloc(t, a, 5*caMiB)  // large segment at base
	s1 := caMalloc(t, a, 100)      // small segment at base+22 MiB
	s2 := caMalloc(t, a, 2000)     // same small segment
	l2 := caMalloc(t, a, 16*caMiB) // does not fit the 15 MiB free: a large segment at base+26 MiB
	a.Free(s1)
	base := l1.Ptr
	want := []SegmentInfo{
		{Ptr: base, Size: 20 * caMiB, Pool: "large", Blocks: []BlockInfo{
			{Ptr: base, Size: 5 * caMiB, Requested: 5 * caMiB, Allocated: true},
			{Ptr: base + uintptr(5*caMiB), Size: 15 * caMiB},
		}},
		{Ptr: base + uintptr(22*caMiB), Size: 2 * caMiB, Pool: "small", Blocks: []BlockInfo{
			{Ptr: base + uintptr(22*caMiB), Size: 512},
			{Ptr: s2.Ptr, Size: 2048, Requested: 2000, Allocated: true},
			{Ptr: s2.Ptr + 2048, Size: 2*caMiB - 2560},
		}},
		{Ptr: l2.Ptr, Size: 16 * caMiB, Pool: "large", Blocks: []BlockInfo{
			{Ptr: l2.Ptr, Size: 16 * caMiB, Requested: 16 * caMiB, Allocated: true},
		}},
	}
	if got := a.Segments(); !reflect.DeepEqual(got, want) {
		t.Fatalf("Segments:\n%+v\nwant\n%+v", got, want)
	}
	if l2.Ptr != base+uintptr(26*caMiB) || s2.Ptr != base+uintptr(22*caMiB)+512 {
		t.Fatalf("addresses: l2 %#x s2 %#x", l2.Ptr, s2.Ptr)
	}
	if len(NewCachingAllocator(d, 0).Segments()) != 0 {
		t.Fatal("fresh allocator has segments")
	}
}

func TestRoundSizeIsExact(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	a := NewCachingAllocator(newCAFakeDevice(64*caGiB, false), 0)
	var live []*Block
	for range 3000 {
		if len(live) > 0 && r.IntN(2) == 0 {
			i := r.IntN(len(live))
			a.Free(live[i])
			live[i] = live[len(live)-1]
			live = live[:len(live)-1]
			continue
		}
		size := caRandomSize(r)
		want := a.RoundSize(size)
		before := a.Allocated()
		b := caMalloc(t, a, size)
		if got := a.Allocated() - before; got != want || b.Size != want {
			t.Fatalf("Malloc(%d) added %d (block %d), RoundSize said %d", size, got, b.Size, want)
		}
		live = append(live, b)
	}
}

func caRandomSize(r *rand.Rand) uint64 {
	switch r.IntN(4) {
	case 0:
		return uint64(r.IntN(4096))
	case 1:
		return uint64(r.IntN(int(caMiB))) + 1
	case 2:
		return uint64(r.IntN(int(12*caMiB))) + 1
	default:
		return uint64(r.IntN(int(64*caMiB))) + 1
	}
}

// TestRandomInvariants runs random mallocs, frees and empty-cache calls on a
// small device (so OOMs and retries happen) and checks the structure and
// every current statistic against a recount after each step.
func TestRandomInvariants(t *testing.T) {
	for seed := range uint64(5) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			r := rand.New(rand.NewPCG(seed, 99))
			d := newCAFakeDevice(256*caMiB, true)
			a := NewCachingAllocator(d, 0)
			p := a.Peaks().New(0, 0)
			var live []*Block
			var maxAlloc, maxRes uint64
			ooms := 0
			for step := range 2000 {
				switch op := r.IntN(10); {
				case op < 5:
					b, err := a.Malloc(caRandomSize(r))
					if err != nil {
						if !IsOOM(err) {
							t.Fatalf("step %d: %v", step, err)
						}
						ooms++
						break
					}
					if b.Size > 0 {
						b.Host[0], b.Host[len(b.Host)-1] = byte(step), byte(step)
					}
					live = append(live, b)
				case op < 9 && len(live) > 0:
					i := r.IntN(len(live))
					b := live[i]
					if b.Size > 0 && (b.Host[0] != b.Host[len(b.Host)-1]) {
						t.Fatalf("step %d: block bytes overwritten", step)
					}
					a.Free(b)
					live[i] = live[len(live)-1]
					live = live[:len(live)-1]
				case op == 9:
					a.EmptyCache()
				}
				maxAlloc = max(maxAlloc, a.Allocated())
				maxRes = max(maxRes, a.Reserved())
				caCheckInvariants(t, a)
				if uint64(len(d.live)) != uint64(len(a.segs)) || d.used != a.Reserved() {
					t.Fatalf("step %d: device holds %d segments %d bytes, allocator %d %d", step, len(d.live), d.used, len(a.segs), a.Reserved())
				}
			}
			st := a.Stats()
			t.Logf("%d OOMs, %d retries, %d device mallocs", ooms, st["num_alloc_retries"], st["num_device_alloc"])
			if st["num_ooms"] != int64(ooms) || st["num_alloc_retries"] < int64(ooms) {
				t.Fatalf("num_ooms %d (want %d), num_alloc_retries %d", st["num_ooms"], ooms, st["num_alloc_retries"])
			}
			if p.MaxAllocated != maxAlloc || p.MaxReserved != maxRes ||
				st["allocated_bytes.all.peak"] != int64(maxAlloc) || st["reserved_bytes.all.peak"] != int64(maxRes) {
				t.Fatalf("peaks: counter %d %d, stats %d %d, want %d %d", p.MaxAllocated, p.MaxReserved,
					st["allocated_bytes.all.peak"], st["reserved_bytes.all.peak"], maxAlloc, maxRes)
			}
			for _, b := range live {
				a.Free(b)
			}
			a.EmptyCache()
			if a.Reserved() != 0 || len(d.live) != 0 || st["num_device_alloc"] == 0 {
				t.Fatalf("left: reserved %d device %d", a.Reserved(), len(d.live))
			}
			caCheckInvariants(t, a)
		})
	}
}
