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
		{"lots", Spec{}, "unknown GPU preset"},
		{"0B", Spec{}, "bad capacity"},
		{"1GiB,ctx=2GiB", Spec{}, "does not fit"},
		{"1GiB,ctx=x", Spec{}, "bad context size"},
		{"1GiB,fast", Spec{}, "unknown option"},
		// presets
		// presets: sm90 cards get PyTorch's 32 MiB cuBLAS workspace, others
		// 8 MiB + 128 KiB; every card the 1 MiB cuBLASLt one
		{"H100", Spec{Count: 1, Total: 85017493504, Ctx: 653066240, Handle: 64 << 20, Preset: "H100", Name: "NVIDIA H100 80GB HBM3", Cublas: 32 << 20, CublasLt: 1 << 20}, ""},
		{"h100", Spec{Count: 1, Total: 85017493504, Ctx: 653066240, Handle: 64 << 20, Preset: "H100", Name: "NVIDIA H100 80GB HBM3", Cublas: 32 << 20, CublasLt: 1 << 20}, ""},
		{"2xH100", Spec{Count: 2, Total: 85017493504, Ctx: 653066240, Handle: 64 << 20, Preset: "H100", Name: "NVIDIA H100 80GB HBM3", Cublas: 32 << 20, CublasLt: 1 << 20}, ""},
		{"H100,meta", Spec{Count: 1, Total: 85017493504, Ctx: 653066240, Handle: 64 << 20, Meta: true, Preset: "H100", Name: "NVIDIA H100 80GB HBM3", Cublas: 32 << 20, CublasLt: 1 << 20}, ""},
		{"H100,ctx=1GiB", Spec{Count: 1, Total: 85017493504, Ctx: gib, Handle: 64 << 20, Preset: "H100", Name: "NVIDIA H100 80GB HBM3", Cublas: 32 << 20, CublasLt: 1 << 20}, ""},
		{"8xH200,ctx=0B,meta", Spec{Count: 8, Total: 150109880320, Meta: true, Handle: 64 << 20, Preset: "H200", Name: "NVIDIA H200", Cublas: 32 << 20, CublasLt: 1 << 20}, ""},
		{"2xrtx4090", Spec{Count: 2, Total: 25757220864, Ctx: 400 << 20, Preset: "RTX4090", Name: "NVIDIA GeForce RTX 4090", Cublas: 8<<20 + 128<<10, CublasLt: 1 << 20}, ""},
		{"H100,cublas=0B,cublaslt=0B", Spec{Count: 1, Total: 85017493504, Ctx: 653066240, Handle: 64 << 20, Preset: "H100", Name: "NVIDIA H100 80GB HBM3"}, ""},
		{"16GiB,cublas=32MiB,cublaslt=1MiB", Spec{Count: 1, Total: 16 * gib, Cublas: 32 << 20, CublasLt: 1 << 20}, ""},
		{"16GiB,cublas=lots", Spec{}, "bad cublas workspace size"},
		{"H100,ctx=80GiB", Spec{}, "does not fit"},
		{"H100,turbo", Spec{}, "unknown option"},
		{"0xH100", Spec{}, "bad device count"},
		{"B200", Spec{}, "unknown GPU preset \"B200\" (known: A100-40GB, A100-80GB, H100, H200, L4, RTX4090, T4, V100-16GB; or a size such as 16GiB)"},
		{"2xA100", Spec{}, "unknown GPU preset \"A100\""},
		{"16XB", Spec{}, "bad capacity"},
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

// TestPresets checks every preset: its spec word, the device's name and
// memory, and that figures agree with their MiB sources.
func TestPresets(t *testing.T) {
	for _, tc := range []struct {
		key, name string
		total     uint64
		ctx       uint64
	}{
		// H100 and H200: torch 2.11's total_memory measured on the cards
		// (driver 580.159.04), and what a training process held outside
		// the allocator on the H100
		{"H100", "NVIDIA H100 80GB HBM3", 85017493504, 787283968 - 2*64<<20},
		{"H200", "NVIDIA H200", 150109880320, 787283968 - 2*64<<20},
		{"A100-80GB", "NVIDIA A100-SXM4-80GB", 81920 << 20, 400 << 20},
		{"A100-40GB", "NVIDIA A100-SXM4-40GB", 42505273344, 400 << 20}, // 40536.19 MiB
		{"L4", "NVIDIA L4", 23034 << 20, 400 << 20},
		{"RTX4090", "NVIDIA GeForce RTX 4090", 24564 << 20, 400 << 20},
		{"T4", "Tesla T4", 15843721216, 300 << 20},                    // 15109.75 MiB
		{"V100-16GB", "Tesla V100-SXM2-16GB", 16945512448, 300 << 20}, // 16160.5 MiB
	} {
		sp, err := ParseSpec(tc.key)
		if err != nil {
			t.Errorf("ParseSpec(%q): %v", tc.key, err)
			continue
		}
		if sp.Name != tc.name || sp.Total != tc.total || sp.Ctx != tc.ctx || sp.Count != 1 || sp.Meta {
			t.Errorf("ParseSpec(%q) = %+v; want %s, %d bytes, ctx %d bytes", tc.key, sp, tc.name, tc.total, tc.ctx)
		}
		if sp.String() != tc.key {
			t.Errorf("ParseSpec(%q).String() = %q", tc.key, sp.String())
		}
		d := New(sp)[0]
		if d.Description() != tc.name {
			t.Errorf("%s: Description() = %q, want %q", tc.key, d.Description(), tc.name)
		}
		free, total, _ := d.MemGetInfo()
		if total != tc.total || free != tc.total-tc.ctx {
			t.Errorf("%s: MemGetInfo() = %d, %d", tc.key, free, total)
		}
		p, ok := LookupPreset(tc.key)
		if !ok || p.Source == "" || p.CtxSource == "" {
			t.Errorf("%s: preset %+v has no source", tc.key, p)
		}
	}
	if len(Presets()) != 8 {
		t.Errorf("Presets() has %d presets, the test covers 8", len(Presets()))
	}
	meta, _ := ParseSpec("H100,meta")
	if d := New(meta)[0]; d.Description() != "NVIDIA H100 80GB HBM3" {
		t.Errorf("meta H100: Description() = %q", d.Description())
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

// TakeDriverMemory takes device memory outside the allocator (a cuBLAS
// handle's), which lowers what Malloc and MemGetInfo see, and refuses
// more than is free.
func TestTakeDriverMemory(t *testing.T) {
	sp, err := ParseSpec("H100,meta")
	if err != nil {
		t.Fatal(err)
	}
	d := New(sp)[0]
	if d.BLASHandleBytes() != 64<<20 {
		t.Errorf("BLASHandleBytes() = %d, want 64 MiB", d.BLASHandleBytes())
	}
	free0, _, _ := d.MemGetInfo()
	if err := d.TakeDriverMemory(64 << 20); err != nil {
		t.Fatal(err)
	}
	if free, _, _ := d.MemGetInfo(); free != free0-64<<20 {
		t.Errorf("free %d after taking 64 MiB of %d", free, free0)
	}
	if err := d.TakeDriverMemory(free0); !errors.Is(err, backend.ErrDeviceFull) {
		t.Errorf("taking more than is free: %v", err)
	}
	if _, err := d.Malloc(free0 - 32<<20); !errors.Is(err, backend.ErrDeviceFull) {
		t.Errorf("Malloc beyond what the handle left: %v", err)
	}
}
