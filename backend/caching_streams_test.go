package backend

import "testing"

// streamFigures are the figures a stream test checks after each step.
type streamFigures struct {
	allocated, active, reserved uint64
	pending                     int
}

func checkStreams(t *testing.T, what string, a *CachingAllocator, want streamFigures) {
	t.Helper()
	st := a.Stats()
	n, _ := a.PendingFrees()
	got := streamFigures{a.Allocated(), uint64(st["active_bytes.all.current"]), a.Reserved(), n}
	if got != want {
		t.Errorf("%s: %+v, want %+v", what, got, want)
	}
}

// A block freed on one stream is not reused by an allocation on another;
// the other stream gets a segment of its own (PyTorch's pools are ordered
// by stream first).
func TestStreamBlocksStayOnTheirStream(t *testing.T) {
	a := NewCachingAllocator(newCAFakeDevice(caGiB, false), 0)
	s := a.NewStream()
	b, err := a.Malloc(4 * caMiB)
	if err != nil {
		t.Fatal(err)
	}
	a.Free(b)
	checkStreams(t, "freed on the default stream", a, streamFigures{0, 0, 20 * caMiB, 0})
	if _, err := a.SetCurrentStream(s); err != nil {
		t.Fatal(err)
	}
	c, err := a.Malloc(4 * caMiB)
	if err != nil {
		t.Fatal(err)
	}
	// the default stream's 20 MiB segment is not reused: a second one
	checkStreams(t, "allocated on stream 1", a, streamFigures{4 * caMiB, 4 * caMiB, 40 * caMiB, 0})
	segs := a.Segments()
	if len(segs) != 2 || segs[0].Stream == segs[1].Stream {
		t.Errorf("segments %+v: want one per stream", segs)
	}
	// back on the default stream, its cached block serves again
	if _, err := a.SetCurrentStream(0); err != nil {
		t.Fatal(err)
	}
	d, err := a.Malloc(4 * caMiB)
	if err != nil {
		t.Fatal(err)
	}
	if d.Ptr != b.Ptr {
		t.Errorf("default stream: block at %#x, want the cached one at %#x", d.Ptr, b.Ptr)
	}
	checkStreams(t, "reused on the default stream", a, streamFigures{8 * caMiB, 8 * caMiB, 40 * caMiB, 0})
	a.Free(c)
	a.Free(d)
	a.EmptyCache()
	checkStreams(t, "after empty_cache", a, streamFigures{0, 0, 0, 0})
	if _, err := a.SetCurrentStream(2); err == nil {
		t.Error("SetCurrentStream(2) with one stream made: no error")
	}
}

// record_stream: the freed block leaves allocated_bytes at once but stays
// active and out of the pool until the recorded stream's event completes
// — here, once the stream is synchronized and the next Malloc processes
// the events.
func TestRecordStreamDefersReuse(t *testing.T) {
	a := NewCachingAllocator(newCAFakeDevice(caGiB, false), 0)
	comm := a.NewStream()
	b, err := a.Malloc(4 * caMiB)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.RecordStream(b, comm); err != nil {
		t.Fatal(err)
	}
	if err := a.RecordStream(b, 0); err != nil { // its own stream: nothing
		t.Fatal(err)
	}
	ptr := b.Ptr
	a.Free(b)
	checkStreams(t, "freed, recorded on stream 1", a, streamFigures{0, 4 * caMiB, 20 * caMiB, 1})
	// the same request cannot have it: the rest of the segment serves
	c, err := a.Malloc(4 * caMiB)
	if err != nil {
		t.Fatal(err)
	}
	if c.Ptr == ptr {
		t.Errorf("the pending block was reused before its stream's event")
	}
	checkStreams(t, "second block beside the pending one", a, streamFigures{4 * caMiB, 8 * caMiB, 20 * caMiB, 1})
	a.Free(c)
	// the default stream's synchronization does not complete stream 1's event
	a.SynchronizeStream(0)
	e, err := a.Malloc(512)
	if err != nil {
		t.Fatal(err)
	}
	a.Free(e)
	checkStreams(t, "default stream synchronized", a, streamFigures{0, 4 * caMiB, 22 * caMiB, 1})
	a.SynchronizeStream(comm)
	checkStreams(t, "stream 1 synchronized, before any Malloc", a, streamFigures{0, 4 * caMiB, 22 * caMiB, 1})
	f, err := a.Malloc(4 * caMiB)
	if err != nil {
		t.Fatal(err)
	}
	if f.Ptr != ptr {
		t.Errorf("after the event: block at %#x, want the freed one at %#x (merged back, best fit)", f.Ptr, ptr)
	}
	checkStreams(t, "reused after the event", a, streamFigures{4 * caMiB, 4 * caMiB, 22 * caMiB, 0})
	a.Free(f)
}

// An event recorded after a synchronization is not completed by it.
func TestEventAfterSynchronize(t *testing.T) {
	a := NewCachingAllocator(newCAFakeDevice(caGiB, false), 0)
	s := a.NewStream()
	a.Synchronize()
	b, _ := a.Malloc(2 * caMiB)
	if err := a.RecordStream(b, s); err != nil {
		t.Fatal(err)
	}
	a.Free(b)
	x, _ := a.Malloc(512)
	a.Free(x)
	if n, bytes := a.PendingFrees(); n != 1 || bytes != 2*caMiB {
		t.Errorf("pending %d (%d bytes), want 1 (2 MiB): the synchronization came before the event", n, bytes)
	}
	a.Synchronize()
	y, _ := a.Malloc(512)
	a.Free(y)
	if n, _ := a.PendingFrees(); n != 0 {
		t.Errorf("pending %d after the device's synchronization", n)
	}
}

// empty_cache and the retry of a refused device allocation wait for every
// event first (synchronize_and_free_events): a pending block's segment is
// released, and the request that needed its memory is served.
func TestPendingFreesReleasedByRetry(t *testing.T) {
	dev := newCAFakeDevice(40*caMiB, false)
	a := NewCachingAllocator(dev, 0)
	s := a.NewStream()
	b, err := a.Malloc(30 * caMiB)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.RecordStream(b, s); err != nil {
		t.Fatal(err)
	}
	a.Free(b)
	checkStreams(t, "pending 30 MiB", a, streamFigures{0, 30 * caMiB, 30 * caMiB, 1})
	// 20 MiB does not fit beside the pending segment: the retry waits
	// for the event, releases the segment and allocates a new one
	c, err := a.Malloc(20 * caMiB)
	if err != nil {
		t.Fatalf("after the retry: %v", err)
	}
	checkStreams(t, "served after the retry", a, streamFigures{20 * caMiB, 20 * caMiB, 20 * caMiB, 0})
	if got := a.Stats()["num_alloc_retries"]; got != 1 {
		t.Errorf("num_alloc_retries %d, want 1", got)
	}
	a.Free(c)

	// empty_cache waits for the events too
	e, _ := a.Malloc(4 * caMiB)
	if err := a.RecordStream(e, s); err != nil {
		t.Fatal(err)
	}
	a.Free(e)
	a.EmptyCache()
	checkStreams(t, "after empty_cache", a, streamFigures{0, 0, 0, 0})
}

// A pending block does not merge with a neighbour freed later; once its
// event completes it merges with both.
func TestPendingBlockDoesNotMerge(t *testing.T) {
	a := NewCachingAllocator(newCAFakeDevice(caGiB, false), 0)
	s := a.NewStream()
	x, _ := a.Malloc(2 * caMiB)
	y, _ := a.Malloc(2 * caMiB)
	z, _ := a.Malloc(2 * caMiB)
	if err := a.RecordStream(y, s); err != nil {
		t.Fatal(err)
	}
	a.Free(y)
	a.Free(x)
	a.Free(z)
	blocks := a.Segments()[0].Blocks
	if len(blocks) != 3 || !blocks[1].Pending || blocks[0].Allocated || blocks[2].Allocated {
		t.Fatalf("blocks %+v: want free, pending, free (the rest merged)", blocks)
	}
	a.SynchronizeStream(s)
	w, _ := a.Malloc(512)
	a.Free(w)
	if blocks := a.Segments()[0].Blocks; len(blocks) != 1 {
		t.Errorf("blocks %+v: want one free block once the event completed", blocks)
	}
}

// record_stream errors name what is wrong.
func TestRecordStreamErrors(t *testing.T) {
	a := NewCachingAllocator(newCAFakeDevice(caGiB, false), 0)
	b, _ := a.Malloc(1024)
	if err := a.RecordStream(b, 3); err == nil {
		t.Error("record_stream on a stream never made: no error")
	}
	a.Free(b)
	if err := a.RecordStream(b, 0); err == nil {
		t.Error("record_stream of a freed block: no error")
	}
	z, _ := a.Malloc(0)
	if err := a.RecordStream(z, 0); err != nil {
		t.Errorf("record_stream of an empty block: %v", err)
	}
}

// Clone copies the streams, the pending blocks and their events.
func TestCloneKeepsPendingFrees(t *testing.T) {
	a := NewCachingAllocator(newCAFakeDevice(caGiB, false), 0)
	s := a.NewStream()
	b, _ := a.Malloc(4 * caMiB)
	if err := a.RecordStream(b, s); err != nil {
		t.Fatal(err)
	}
	a.Free(b)
	c := a.Clone(newCAFakeDevice(caGiB, false))
	if n, bytes := c.PendingFrees(); n != 1 || bytes != 4*caMiB {
		t.Fatalf("clone: pending %d (%d bytes)", n, bytes)
	}
	c.SynchronizeStream(s)
	x, _ := c.Malloc(4 * caMiB)
	if x.Ptr != b.Ptr {
		t.Errorf("clone: block at %#x after the event, want %#x", x.Ptr, b.Ptr)
	}
	if n, _ := a.PendingFrees(); n != 1 {
		t.Errorf("the original lost its pending block")
	}
}
