package tensor

import (
	"math"
	"testing"
)

// TestPhiloxKAT checks Philox-4x32-10 against Random123's known-answer
// vectors.
func TestPhiloxKAT(t *testing.T) {
	for _, c := range []struct {
		ctr  [4]uint32
		key  [2]uint32
		want [4]uint32
	}{
		{[4]uint32{0, 0, 0, 0}, [2]uint32{0, 0}, [4]uint32{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
		{[4]uint32{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, [2]uint32{0xffffffff, 0xffffffff}, [4]uint32{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
		{[4]uint32{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, [2]uint32{0xa4093822, 0x299f31d0}, [4]uint32{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
	} {
		if got := philox4x32(c.ctr, c.key); got != c.want {
			t.Errorf("philox(%x, %x) = %x, want %x", c.ctr, c.key, got, c.want)
		}
	}
}

// TestHalfConversions checks every float16 and bfloat16 value: widening
// and rounding back is the identity, and the midpoint between neighbours
// rounds to the even one.
func TestHalfConversions(t *testing.T) {
	for h := range 1 << 16 {
		h := uint16(h)
		f := f16ToF32(h)
		if f != f {
			if g := f32ToF16(f); g&0x7c00 != 0x7c00 || g&0x3ff == 0 {
				t.Fatalf("f16 NaN %#04x -> %#04x", h, g)
			}
			continue
		}
		if g := f32ToF16(f); g != h {
			t.Fatalf("f16 %#04x -> %v -> %#04x", h, f, g)
		}
		// Midpoint with the next value up in magnitude (finite ones).
		if h&0x7fff < 0x7bff {
			next := f16ToF32(h + 1)
			mid := float32((float64(f) + float64(next)) / 2)
			want := h
			if h&1 == 1 {
				want = h + 1
			}
			if g := f32ToF16(mid); g != want {
				t.Fatalf("f16 midpoint of %#04x and %#04x (%v) -> %#04x, want %#04x", h, h+1, mid, g, want)
			}
		}
		b := bf16ToF32(h)
		if b != b {
			continue
		}
		if g := f32ToBF16(b); g != h {
			t.Fatalf("bf16 %#04x -> %v -> %#04x", h, b, g)
		}
	}
	if got := f32ToF16(65520); got != 0x7c00 {
		t.Errorf("65520 -> %#04x, want inf", got)
	}
	if got := f32ToF16(65519.99); got != 0x7bff {
		t.Errorf("65519.99 -> %#04x, want 65504", got)
	}
	if got := f16ToF32(f32ToF16(float32(math.Inf(-1)))); !math.IsInf(float64(got), -1) {
		t.Errorf("-inf -> %v", got)
	}
}

// TestPromoteTypes spot-checks torch.promote_types.
func TestPromoteTypes(t *testing.T) {
	for _, c := range []struct{ a, b, want DType }{
		{Uint8, Int8, Int16}, {Uint8, Int32, Int32}, {Bool, Uint8, Uint8}, {Int64, Float16, Float16},
		{Float16, BFloat16, Float32}, {BFloat16, Float64, Float64}, {Int8, Int64, Int64}, {Bool, Bool, Bool},
	} {
		if got := promoteTypes(c.a, c.b); got != c.want {
			t.Errorf("promote(%s, %s) = %s, want %s", c.a, c.b, got, c.want)
		}
		if got := promoteTypes(c.b, c.a); got != c.want {
			t.Errorf("promote(%s, %s) = %s, want %s", c.b, c.a, got, c.want)
		}
	}
}

// TestComputeStride checks PyTorch's view stride rule.
func TestComputeStride(t *testing.T) {
	// A transposed 2x3 (strides 1, 2) cannot be flattened, but can be split.
	if st := computeStride([]int{3, 2}, []int{1, 3}, []int{6}); st != nil {
		t.Errorf("flatten of transposed: %v, want nil", st)
	}
	if st := computeStride([]int{4, 6}, []int{6, 1}, []int{2, 2, 3, 2}); len(st) != 4 || st[0] != 12 || st[1] != 6 || st[2] != 2 || st[3] != 1 {
		t.Errorf("split: %v", st)
	}
	if st := computeStride([]int{4, 3}, []int{1, 4}, []int{2, 2, 3}); len(st) != 3 || st[0] != 2 || st[1] != 1 || st[2] != 4 {
		t.Errorf("split transposed: %v", st)
	}
}
