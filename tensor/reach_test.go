package tensor

import (
	"testing"

	"github.com/memsh/memsh/backend"
)

// TestUnheldGaps: a stretch opened by Unheld is closed by its own done,
// even after Gaps dropped older stretches from the list; Gaps returns the
// stretches since a stamp, the open one last.
func TestUnheldGaps(t *testing.T) {
	c := NewContext(nil)
	clock := uint64(100)
	c.SetStampClock(func() uint64 { return clock + c.Ticks() })

	doneA := c.Unheld() // stamps 101..102
	doneA()
	region := c.Tick() // 103: a new node begins
	doneB := c.Unheld()
	if got := c.Gaps(region); len(got) != 1 || got[0] != (backend.Span{From: 104}) {
		t.Fatalf("gaps since %d while B is open: %v, want [{104 0}]", region, got)
	}
	doneB()
	if got := c.Gaps(region); len(got) != 1 || got[0] != (backend.Span{From: 104, To: 105}) {
		t.Fatalf("gaps since %d after B closed: %v, want [{104 105}]", region, got)
	}
	if got := c.Gaps(200); len(got) != 0 {
		t.Fatalf("gaps since 200: %v, want none (all closed before it)", got)
	}
}
