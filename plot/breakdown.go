package plot

import (
	"fmt"

	gplot "gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"

	"github.com/memsh/memsh/record"
)

// Breakdown charts the memory breakdowns (nn.track) of a sweep's points:
// one stacked bar per point that has one, in the records' order, its
// peak bytes split by MemTracker's categories (Parameter at the bottom,
// then Buffer, Gradient, Activation, Temp, Optstate, Other). It returns
// nil when no point has a breakdown.
func Breakdown(recs []*record.Record) (*gplot.Plot, error) {
	var pts []*record.Record
	maxTotal := 0.0
	for _, r := range record.Merge(recs) {
		if r.Kind == "trial" && r.Sweep != "" && r.Breakdown != nil {
			pts = append(pts, r)
			maxTotal = max(maxTotal, float64(r.Breakdown.Peak["Total"]))
		}
	}
	if len(pts) == 0 {
		return nil, nil
	}
	div, unit := byteUnit(maxTotal)
	p := gplot.New()
	p.Title.Text = fmt.Sprintf("sweep %q: peak memory by category (nn.track, %s)", pts[0].Sweep, pts[0].Breakdown.Device)
	p.Y.Label.Text = "peak allocated (" + unit + ")"
	names := make([]string, len(pts))
	for i, r := range pts {
		names[i] = r.Name
	}
	p.NominalX(names...)
	p.Legend.Top = true
	w := vg.Points(max(8, 240/float64(len(pts))))
	var below *plotter.BarChart
	for _, st := range breakdownStacks(pts, div) {
		bc, err := plotter.NewBarChart(st.values, w)
		if err != nil {
			return nil, err
		}
		bc.Color = seriesColor(st.index)
		bc.LineStyle.Width = 0
		if below != nil {
			bc.StackOn(below)
		}
		below = bc
		p.Add(bc)
		p.Legend.Add(st.category, bc)
	}
	return p, nil
}

type stack struct {
	category string
	index    int // in record.BreakdownCategories, for its colour
	values   plotter.Values
}

// breakdownStacks are the bars' stacks, bottom first: one per category
// that is not 0 at every point, values divided by div.
func breakdownStacks(pts []*record.Record, div float64) []stack {
	var out []stack
	for i, c := range record.BreakdownCategories {
		vs := make(plotter.Values, len(pts))
		nonzero := false
		for j, r := range pts {
			vs[j] = float64(r.Breakdown.Peak[c]) / div
			nonzero = nonzero || vs[j] > 0
		}
		if nonzero {
			out = append(out, stack{c, i, vs})
		}
	}
	return out
}
