package sim

import (
	"errors"
	"strings"
	"testing"

	"github.com/memsh/memsh/backend"
	"github.com/memsh/memsh/backend/internal/pages"
)

func TestParseSpec(t *testing.T) {
	const gib = 1 << 30
	for _, tc := range []struct {
		in      string
		want    Spec
		wantErr string
	}{
		{"", Spec{Count: 1, Total: 16 * gib}, ""},
		{"16GiB", Spec{Count: 1, Total: 16 * gib}, ""},
		{"2x80GiB", Spec{Count: 2, Total: 80 * gib}, ""},
		{"16GiB,ctx=300MiB", Spec{Count: 1, Total: 16 * gib, Ctx: 300 << 20}, ""},
		{"80GiB,meta", Spec{Count: 1, Total: 80 * gib, Meta: true}, ""},
		{"4x1GiB,ctx=1MiB,meta", Spec{Count: 4, Total: gib, Ctx: 1 << 20, Meta: true}, ""},
		{"16GB", Spec{Count: 1, Total: 16e9}, ""}, // SI units are SI
		{"0x1GiB", Spec{}, "bad device count"},
		{"99x1GiB", Spec{}, "bad device count"},
		{"lots", Spec{}, "bad capacity"},
		{"0B", Spec{}, "bad capacity"},
		{"1GiB,ctx=2GiB", Spec{}, "does not fit"},
		{"1GiB,ctx=x", Spec{}, "bad context size"},
		{"1GiB,fast", Spec{}, "unknown option"},
	} {
		got, err := ParseSpec(tc.in)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("ParseSpec(%q) error = %v, want %q", tc.in, err, tc.wantErr)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("ParseSpec(%q) = %+v, %v; want %+v", tc.in, got, err, tc.want)
		}
		if back, err := ParseSpec(got.String()); err != nil || back != got {
			t.Errorf("ParseSpec(%q.String() = %q) = %+v, %v", tc.in, got.String(), back, err)
		}
	}
}

func TestDeviceMemory(t *testing.T) {
	const mib = 1 << 20
	sp, _ := ParseSpec("64MiB,ctx=4MiB")
	d := New(sp)[0]
	if d.Name() != "cuda:0" || d.Kind() != "sim" {
		t.Errorf("name %q kind %q", d.Name(), d.Kind())
	}
	free, total, _ := d.MemGetInfo()
	if total != 64*mib || free != 60*mib {
		t.Errorf("MemGetInfo = %d, %d; want 60 MiB free of 64 MiB", free, total)
	}
	m, err := d.Malloc(20 * mib)
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Host) != 20*mib || m.Ptr%pages.HugePage != 0 {
		t.Errorf("mapping: len %d ptr %#x (want 20 MiB, 2 MiB aligned)", len(m.Host), m.Ptr)
	}
	if r := d.Resident(); r != 0 {
		t.Errorf("untouched mapping resident: %d bytes, want 0", r)
	}
	for i := 0; i < 4*mib; i++ {
		m.Host[i] = 1
	}
	if r := d.Resident(); r < 4*mib || r > 6*mib {
		t.Errorf("after touching 4 MiB: resident %d, want 4 MiB (up to one extra huge page)", r)
	}
	free, _, _ = d.MemGetInfo()
	if free != 40*mib {
		t.Errorf("free after a 20 MiB malloc = %d, want 40 MiB", free)
	}
	if _, err := d.Malloc(41 * mib); !errors.Is(err, backend.ErrDeviceFull) {
		t.Errorf("41 MiB on 40 MiB free: err = %v, want ErrDeviceFull", err)
	}
	if err := d.Free(m, 20*mib); err != nil {
		t.Fatal(err)
	}
	if free, _, _ = d.MemGetInfo(); free != 60*mib || d.Resident() != 0 {
		t.Errorf("after free: free %d resident %d", free, d.Resident())
	}
}

func TestMetaDevice(t *testing.T) {
	sp, _ := ParseSpec("80GiB,meta")
	d := New(sp)[0]
	m, err := d.Malloc(70 << 30)
	if err != nil {
		t.Fatal(err)
	}
	if m.Host != nil || m.Ptr == 0 {
		t.Errorf("meta malloc: host %v ptr %#x; want no host view and a fake address", m.Host != nil, m.Ptr)
	}
	if free, _, _ := d.MemGetInfo(); free != 10<<30 {
		t.Errorf("free = %d, want 10 GiB", free)
	}
	if err := d.Free(m, 70<<30); err != nil {
		t.Fatal(err)
	}
}
