package sim

import "testing"

// TestVASpace: large segments are placed top-down and a freed range is
// reused from its top; medium ones (over 2 MiB, up to 20 MiB) after the
// first go upwards; freed ranges coalesce and go back to the unreserved
// space when they reach its top (backend/sim/va.go, as the CUDA driver
// placed PyTorch's segments on an H100).
func TestVASpace(t *testing.T) {
	const mib = 1 << 20
	v := newVASpace()
	a := v.alloc(100 * mib)
	b := v.alloc(100 * mib)
	c := v.alloc(2*mib - 100) // a small-pool segment: rounded to 2 MiB, top-down
	if a != vaTop-100*mib || b != a-100*mib || c != b-2*mib {
		t.Fatalf("top-down: %#x %#x %#x", a, b, c)
	}
	m1, m2, m3 := v.alloc(20*mib), v.alloc(20*mib), v.alloc(19*mib)
	if m1 != c-20*mib || m2 != vaMediumBase || m3 != m2+20*mib {
		t.Fatalf("medium: %#x %#x %#x", m1, m2, m3)
	}
	v.free(a)
	if d := v.alloc(50 * mib); d != a+50*mib {
		t.Fatalf("reuse: got %#x, want the top of the freed range %#x", d, a+50*mib)
	}
	e := v.alloc(60 * mib) // does not fit the 50 MiB left: below everything
	if e != m1-60*mib {
		t.Fatalf("no fit: got %#x, want %#x", e, m1-60*mib)
	}
	// free the lowest: the space below b goes back, except what is live
	v.free(e)
	v.free(m1)
	if v.low != c {
		t.Fatalf("low %#x after freeing the two lowest, want %#x", v.low, c)
	}
	v.free(b)
	v.free(c)
	if v.low != a+50*mib || len(v.gaps) != 0 {
		t.Fatalf("low %#x, gaps %v: want %#x (the live 50 MiB) and none (b, c, a's lower half and the bottom coalesced)", v.low, v.gaps, a+50*mib)
	}
	v.free(a + 50*mib)
	if v.low != vaTop || len(v.gaps) != 0 || len(v.live) != 0 {
		t.Fatalf("after freeing all: low %#x gaps %v live %v", v.low, v.gaps, v.live)
	}
}
