package backend_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/memsh/memsh/backend"
	"github.com/memsh/memsh/backend/host"
	"github.com/memsh/memsh/backend/sim"
)

func fill(b []byte) {
	for i := range b {
		b[i] = byte(i*7 + 3)
	}
}

func checkFill(t *testing.T, what string, b []byte) {
	t.Helper()
	for i := range b {
		if b[i] != byte(i*7+3) {
			t.Fatalf("%s: byte %d = %d, want %d", what, i, b[i], byte(i*7+3))
		}
	}
}

// TestMigrate moves an allocation from the GPU to host memory and back:
// the data, the handle's sequence number and the allocator figures follow
// exactly, observers see alloc-then-free with the handle's sequence number,
// and the moved memory is still reclaimed once unreachable.
func TestMigrate(t *testing.T) {
	m := newManager(t, "2x1GiB", backend.PeakExact)
	h, err := m.Alloc("cuda", 3*mib+100)
	if err != nil {
		t.Fatal(err)
	}
	fill(h.Bytes())
	seq := h.Seq()
	var events []string
	remove := m.Observe(func(e backend.Event) {
		events = append(events, fmt.Sprintf("%s:%s:%d:%d", e.Kind, e.Device, e.Size, e.Seq))
	})
	defer remove()

	if err := m.Migrate(h, "cpu"); err != nil {
		t.Fatal(err)
	}
	if h.Device() != "cpu" || h.Seq() != seq || h.Size() != 3*mib+100 {
		t.Errorf("after Migrate to cpu: device %s seq %d size %d", h.Device(), h.Seq(), h.Size())
	}
	checkFill(t, "on cpu", h.Bytes())
	if got := m.GPU(0).Allocated(); got != 0 {
		t.Errorf("cuda:0 allocated %d after moving off it, want 0", got)
	}
	if got := m.Host().Allocated(); got != 3*mib+100 {
		t.Errorf("host allocated %d, want %d", got, 3*mib+100)
	}
	want := fmt.Sprintf("alloc:cpu:%d:%d free:cuda:0:%d:%d", 3*mib+100, seq, 3*mib+512, seq)
	if got := strings.Join(events, " "); got != want {
		t.Errorf("events %s, want %s", got, want)
	}

	// To the second GPU, then back to the first.
	if err := m.Migrate(h, "cuda:1"); err != nil {
		t.Fatal(err)
	}
	if h.Device() != "cuda:1" || m.GPU(1).Allocated() != 3*mib+512 || m.Host().Allocated() != 0 {
		t.Errorf("on cuda:1: device %s, cuda:1 allocated %d, host %d", h.Device(), m.GPU(1).Allocated(), m.Host().Allocated())
	}
	checkFill(t, "on cuda:1", h.Bytes())
	if err := m.Migrate(h, "cuda"); err != nil {
		t.Fatal(err)
	}
	checkFill(t, "back on cuda:0", h.Bytes())
	if h.Device() != "cuda:0" || m.GPU(0).Allocated() != 3*mib+512 || m.GPU(1).Allocated() != 0 {
		t.Errorf("back: device %s, allocated %d / %d", h.Device(), m.GPU(0).Allocated(), m.GPU(1).Allocated())
	}

	// Same device: nothing happens.
	n := len(events)
	if err := m.Migrate(h, "cuda:0"); err != nil || len(events) != n {
		t.Errorf("Migrate to its own device: %v, %d new events", err, len(events)-n)
	}

	// Moved memory is still owned through the handle: dropping it frees it.
	h = nil
	if r := m.Reclaim(); r.Freed != 3*mib+100 || m.GPU(0).Allocated() != 0 {
		t.Errorf("reclaim after dropping the moved handle freed %d; cuda:0 allocated %d", r.Freed, m.GPU(0).Allocated())
	}
}

func TestMigrateErrors(t *testing.T) {
	m := newManager(t, "64MiB", backend.PeakExact)
	h, err := m.Alloc("cpu", 100*mib)
	if err != nil {
		t.Fatal(err)
	}
	fill(h.Bytes()[:4096])
	err = m.Migrate(h, "cuda")
	if !backend.IsOOM(err) {
		t.Fatalf("Migrate of 100 MiB to a 64 MiB GPU: %v, want an out-of-memory error", err)
	}
	if h.Device() != "cpu" || m.Host().Allocated() != 100*mib || m.GPU(0).Allocated() != 0 {
		t.Errorf("after a failed Migrate: device %s host %d gpu %d", h.Device(), m.Host().Allocated(), m.GPU(0).Allocated())
	}
	checkFill(t, "after failed Migrate", h.Bytes()[:4096])

	if err := m.Migrate(h, "cuda:3"); err == nil || !strings.Contains(err.Error(), `invalid device "cuda:3"`) {
		t.Errorf("Migrate to cuda:3: %v", err)
	}
	m.Release(h, "released by the test")
	if err := m.Migrate(h, "cuda"); err == nil || !strings.Contains(err.Error(), "released by the test") {
		t.Errorf("Migrate of released memory: %v", err)
	}
}

// copierDevice is a GPU whose memory is not host-accessible: data lives in a
// Go map and moves only through HostCopier.
type copierDevice struct {
	next   uintptr
	mem    map[uintptr][]byte
	copies int
}

func (d *copierDevice) Name() string        { return "cuda:0" }
func (d *copierDevice) Description() string { return "copier GPU" }
func (d *copierDevice) Kind() string        { return "cuda" }
func (d *copierDevice) MemGetInfo() (uint64, uint64, error) {
	return 1 << 30, 1 << 30, nil
}
func (d *copierDevice) Malloc(size uint64) (backend.DeviceMem, error) {
	p := d.next
	d.next += uintptr(size)
	d.mem[p] = make([]byte, size)
	return backend.DeviceMem{Ptr: p}, nil
}
func (d *copierDevice) Free(m backend.DeviceMem, size uint64) error {
	delete(d.mem, m.Ptr)
	return nil
}

// find returns the backing bytes from address p on.
func (d *copierDevice) find(p uintptr) []byte {
	for base, b := range d.mem {
		if p >= base && p < base+uintptr(len(b)) {
			return b[p-base:]
		}
	}
	panic("no such address")
}
func (d *copierDevice) CopyToHost(dst []byte, src uintptr) error {
	d.copies++
	copy(dst, d.find(src))
	return nil
}
func (d *copierDevice) CopyFromHost(dst uintptr, src []byte) error {
	d.copies++
	copy(d.find(dst), src)
	return nil
}

func TestMigrateThroughCopier(t *testing.T) {
	dev := &copierDevice{next: 1 << 40, mem: map[uintptr][]byte{}}
	m := backend.NewManager(backend.Config{GPUs: []backend.Allocator{backend.NewCachingAllocator(dev, 0)}, Host: host.NewAllocator()})
	defer m.Close()
	h, err := m.Alloc("cpu", 5000)
	if err != nil {
		t.Fatal(err)
	}
	fill(h.Bytes())
	if err := m.Migrate(h, "cuda"); err != nil {
		t.Fatal(err)
	}
	if h.HostAccessible() || dev.copies != 1 {
		t.Errorf("on the copier GPU: host-accessible %v, %d copies", h.HostAccessible(), dev.copies)
	}
	if err := m.Migrate(h, "cpu"); err != nil {
		t.Fatal(err)
	}
	if dev.copies != 2 {
		t.Errorf("%d copies, want 2", dev.copies)
	}
	checkFill(t, "after a round trip through the copier GPU", h.Bytes())
}

// A meta device stores no data: moving from it gives zeroed host memory.
func TestMigrateFromMeta(t *testing.T) {
	sp, _ := sim.ParseSpec("1GiB,meta")
	d := sim.New(sp)[0]
	m := backend.NewManager(backend.Config{GPUs: []backend.Allocator{backend.NewCachingAllocator(d, 0)}, Host: host.NewAllocator()})
	defer m.Close()
	h, err := m.Alloc("cuda", 4096)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Migrate(h, "cpu"); err != nil {
		t.Fatal(err)
	}
	for i, b := range h.Bytes() {
		if b != 0 {
			t.Fatalf("byte %d = %d after moving from a meta device, want 0", i, b)
		}
	}
	if err := m.Migrate(h, "cuda"); err != nil || h.HostAccessible() {
		t.Errorf("back to meta: %v, host-accessible %v", err, h.HostAccessible())
	}
}
