package host

import (
	"testing"

	"github.com/memsh/memsh/backend"
)

// TestRetainedBlocks follows the retention rule (see RetainMin) through a
// sequence of Malloc and Free calls on a Device: which sizes are retained,
// reuse by size class (most recent first), the limit of twice the largest
// class freed, the oldest released first, and Trim.
func TestRetainedBlocks(t *testing.T) {
	Trim()
	retained.mu.Lock()
	retained.largest = 0 // as in a fresh process
	retained.mu.Unlock()
	d := NewDevice()
	alloc := func(size uint64) backend.DeviceMem {
		t.Helper()
		m, err := d.Malloc(size)
		if err != nil {
			t.Fatal(err)
		}
		if uint64(len(m.Host)) != size || m.Ptr%Alignment != 0 {
			t.Fatalf("Malloc(%d): %d bytes at %#x", size, len(m.Host), m.Ptr)
		}
		touch(m.Host)
		m.Host[size-1] = 1 // the last byte is usable
		return m
	}
	free := func(m backend.DeviceMem) {
		t.Helper()
		if err := d.Free(m, uint64(len(m.Host))); err != nil {
			t.Fatal(err)
		}
	}
	want := func(what string, n uint64) {
		t.Helper()
		if got := Retained(); got != n {
			t.Errorf("%s: Retained() = %d, want %d", what, got, n)
		}
	}

	// Too small, too large: never retained.
	free(alloc(RetainMin - 1))
	free(alloc(RetainMax + 1))
	want("after freeing blocks outside the range", 0)

	// A retained block comes back to a request of its class, not of
	// another; the class is the size rounded up to pages.
	a := alloc(1 * mib)
	free(a)
	want("after freeing 1 MiB", 1*mib)
	if b := alloc(1*mib - 100); b.Ptr != a.Ptr {
		t.Errorf("1 MiB − 100 B: got %#x, want the retained block %#x", b.Ptr, a.Ptr)
	} else {
		want("after taking it back", 0)
		free(b)
	}
	c := alloc(1*mib + 1) // class 1 MiB + 4 KiB: a block of its own
	if c.Ptr == a.Ptr {
		t.Errorf("1 MiB + 1 B got the 1 MiB block")
	}
	want("with the 1 MiB block still retained", 1*mib)
	free(c)
	want("after freeing 1 MiB + 1 B", 2*mib+pageSize)

	// The limit is twice the largest class freed: 2 MiB + 8 KiB now, so
	// a third 1 MiB block pushes out the oldest (the first one).
	e := alloc(768 * kib)
	free(e)
	want("after a third block over the limit", 1*mib+pageSize+768*kib)
	m := alloc(1 * mib) // a fresh block: no 1 MiB block is left to take
	want("after allocating 1 MiB again", 1*mib+pageSize+768*kib)
	free(m)

	// Two blocks of one class: the most recent comes back first.
	Trim()
	want("after Trim", 0)
	x, y := alloc(4*mib), alloc(4*mib)
	free(x)
	free(y)
	want("two 4 MiB blocks", 8*mib)
	if m := alloc(4 * mib); m.Ptr != y.Ptr {
		t.Errorf("got %#x, want the last freed %#x", m.Ptr, y.Ptr)
	} else {
		free(m)
	}

	// The limit never exceeds 2 × RetainMax.
	big := []backend.DeviceMem{alloc(RetainMax), alloc(RetainMax), alloc(RetainMax)}
	for _, m := range big {
		free(m)
	}
	want("three blocks of RetainMax", 2*RetainMax)
	Trim()
	want("after the last Trim", 0)
}

// TestRetainedBlocksResident frees a touched 32 MiB block: it stays
// resident (RSS does not fall) until Trim returns it, as glibc's free heap
// does under PyTorch until malloc_trim.
func TestRetainedBlocksResident(t *testing.T) {
	Trim()
	a := NewAllocator()
	settle()
	before := rss(t)
	b := mustMalloc(t, a, RetainMax)
	touch(b.Host)
	a.Free(b)
	kept := rss(t)
	Trim()
	after := rss(t)
	t.Logf("RSS before %.1f MiB, block freed and retained %.1f MiB, after Trim %.1f MiB",
		mibs(before), mibs(kept), mibs(after))
	near(t, "RSS with the block retained", kept, before+RetainMax)
	near(t, "RSS after Trim", after, before)
	if s := a.Stats(); s["reserved_bytes.all.current"] != 0 || s["allocated_bytes.all.current"] != 0 {
		t.Errorf("a retained block counts in the allocator: %v", s)
	}
}
