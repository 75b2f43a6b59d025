package host

import (
	"errors"
	"strings"
	"testing"

	"github.com/memsh/memsh/backend"
)

func TestDevice(t *testing.T) {
	d := NewDevice()
	if d.Name() != "cpu" || d.Kind() != "cpu" {
		t.Errorf("Name, Kind = %q, %q; want cpu, cpu", d.Name(), d.Kind())
	}
	if desc := d.Description(); !strings.HasPrefix(desc, "host RAM (") || !strings.HasSuffix(desc, " GiB)") {
		t.Errorf("Description = %q", desc)
	}
	free, total, err := d.MemGetInfo()
	if err != nil {
		t.Fatal(err)
	}
	if total == 0 || free == 0 || free > total {
		t.Errorf("MemGetInfo = %d free, %d total", free, total)
	}
	if Total() != total {
		t.Errorf("Total() = %d, MemGetInfo total = %d", Total(), total)
	}
	if a := Available(); a == 0 || a > total {
		t.Errorf("Available() = %d, total %d", a, total)
	}

	for _, size := range []uint64{1, 63, 4096, MmapThreshold - 1, MmapThreshold, 3 << 20} {
		m, err := d.Malloc(size)
		if err != nil {
			t.Fatalf("Malloc(%d): %v", size, err)
		}
		if m.Ptr%Alignment != 0 {
			t.Errorf("Malloc(%d) = %#x, not %d-byte aligned", size, m.Ptr, Alignment)
		}
		if uint64(len(m.Host)) != size || uintptr(unsafePtr(m.Host)) != m.Ptr {
			t.Errorf("Malloc(%d): Host has %d bytes at %#x, Ptr %#x", size, len(m.Host), unsafePtr(m.Host), m.Ptr)
		}
		for i := range m.Host {
			m.Host[i] = byte(i)
		}
		if m.Host[size-1] != byte(size-1) {
			t.Errorf("Malloc(%d): memory does not hold what was written", size)
		}
		if err := d.Free(m, size); err != nil {
			t.Fatal(err)
		}
	}

	if _, err := d.Malloc(0); err == nil {
		t.Error("Malloc(0) succeeded; want an error")
	}
	for _, size := range []uint64{1 << 62, 1<<63 + 1} {
		m, err := d.Malloc(size)
		if !errors.Is(err, backend.ErrDeviceFull) {
			t.Errorf("Malloc(%#x) = %+v, %v; want an error wrapping ErrDeviceFull", size, m, err)
		}
	}
	if err := d.Free(backend.DeviceMem{}, 1); err == nil {
		t.Error("Free of a nil pointer succeeded")
	}
}
