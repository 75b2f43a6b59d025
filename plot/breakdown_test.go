package plot

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/memsh/memsh/record"
)

// TestBreakdownChart: a sweep whose points carry nn.track breakdowns gets
// a second panel, one stacked bar per point, a stack per category present.
func TestBreakdownChart(t *testing.T) {
	var recs []*record.Record
	for i, n := range []int{16, 32, 64} {
		r := point("mlp", fmt.Sprintf(`{"batch":%d}`, n), "ok", int64(n)*mib, 1024*mib, 0)
		r.Pos = record.Pos{0, i, 0}
		r.Breakdown = &record.Breakdown{Device: "cuda:0", Peak: map[string]int64{
			"Parameter": 8 * mib, "Gradient": 8 * mib, "Activation": int64(n) * mib / 2, "Optstate": 16 * mib, "Total": 32*mib + int64(n)*mib/2}}
		recs = append(recs, r)
	}
	plots, err := Sweeps(recs, "", "")
	if err != nil {
		t.Fatal(err)
	}
	if len(plots) != 2 {
		t.Fatalf("%d panels, want the sweep and its breakdown", len(plots))
	}
	st := breakdownStacks(recs, mib)
	var cats []string
	for _, x := range st {
		cats = append(cats, x.category)
	}
	if fmt.Sprint(cats) != "[Parameter Gradient Activation Optstate]" { // categories at 0 everywhere are left out
		t.Fatalf("stacks %v", cats)
	}
	if st[2].values[2] != 32 || st[2].values[0] != 8 { // Activation, MiB
		t.Errorf("activation stack %v", st[2].values)
	}
	svg := filepath.Join(t.TempDir(), "b.svg")
	if err := SaveAll(plots, svg, 0, 0, false); err != nil {
		t.Fatal(err)
	}
	data, _ := os.ReadFile(svg)
	for _, want := range []string{"Parameter", "Optstate", "peak memory by category", "{&#34;batch&#34;:64}"} {
		if !bytes.Contains(data, []byte(want)) {
			t.Errorf("the SVG lacks %q", want)
		}
	}
	// Without breakdowns: the sweep panel alone.
	for _, r := range recs {
		r.Breakdown = nil
	}
	if plots, err := Sweeps(recs, "", ""); err != nil || len(plots) != 1 {
		t.Errorf("without breakdowns: %d panels, %v", len(plots), err)
	}
}
