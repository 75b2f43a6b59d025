package plot

import (
	"encoding/json"
	"fmt"
	"math"
	"sort"
	"strings"

	gplot "gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"

	"github.com/memsh/memsh/backend"
	"github.com/memsh/memsh/record"
)

// Sweeps charts each sweep among recs in a panel of its own (Sweep of its
// points, param naming x as there), in the order the sweeps first appear;
// name, when not "", picks the sweep of that name alone.
func Sweeps(recs []*record.Record, param, name string) ([]*gplot.Plot, error) {
	var names []string
	bySweep := map[string][]*record.Record{}
	for _, r := range record.Merge(recs) {
		if r.Kind != "trial" || r.Sweep == "" {
			continue
		}
		if _, ok := bySweep[r.Sweep]; !ok {
			names = append(names, r.Sweep)
		}
		bySweep[r.Sweep] = append(bySweep[r.Sweep], r)
	}
	if name != "" {
		if _, ok := bySweep[name]; !ok {
			if len(names) == 0 {
				return nil, fmt.Errorf("no sweep %q: the records hold no sweep points", name)
			}
			return nil, fmt.Errorf("no sweep %q in the records (they hold %s)", name, quoteAll(names))
		}
		names = []string{name}
	}
	if len(names) == 0 {
		return nil, fmt.Errorf("no sweep points in the records (run sweep.max_fit or sweep.grid with --out)")
	}
	var plots []*gplot.Plot
	for _, n := range names {
		p, err := Sweep(bySweep[n], param)
		if err != nil {
			if len(names) > 1 {
				err = fmt.Errorf("sweep %q: %v", n, err)
			}
			return nil, err
		}
		plots = append(plots, p)
		// A panel of its points' nn.track breakdowns, when they have any.
		if b, err := Breakdown(bySweep[n]); err != nil {
			return nil, err
		} else if b != nil {
			plots = append(plots, b)
		}
	}
	return plots, nil
}

func quoteAll(names []string) string {
	q := make([]string, len(names))
	for i, n := range names {
		q[i] = fmt.Sprintf("%q", n)
	}
	return strings.Join(q, ", ")
}

// Sweep charts the sweep points among recs (records as --out writes them;
// several files' records may be concatenated: they are merged first):
// for every sweep, each device's peak allocated bytes against the swept
// parameter x, a line through the points that ran, a red cross at the
// device's capacity for each point that ran out of memory, and a dashed
// line at each device's capacity. x is the parameter named param, or, when
// param is "", the numeric parameter with the most distinct values; the
// other parameters that vary split the points into separate lines. The
// x axis is logarithmic (base 2) when x spans a factor of 16 or more.
func Sweep(recs []*record.Record, param string) (*gplot.Plot, error) {
	var pts []*sweepPoint
	for _, r := range record.Merge(recs) {
		if r.Kind != "trial" || r.Sweep == "" {
			continue
		}
		sp, err := newSweepPoint(r)
		if err != nil {
			return nil, err
		}
		pts = append(pts, sp)
	}
	if len(pts) == 0 {
		return nil, fmt.Errorf("no sweep points in the records (run sweep.max_fit or sweep.grid with --out)")
	}
	x := param
	if x == "" {
		x = pickX(pts)
		if x == "" {
			return nil, fmt.Errorf("the sweep points have no numeric parameter to plot against")
		}
	}
	for _, p := range pts {
		v, ok := p.num[x]
		if !ok {
			return nil, fmt.Errorf("point %s of sweep %q has no numeric parameter %q", p.rec.Name, p.rec.Sweep, x)
		}
		p.x = v
	}

	// Series: by sweep, the other varying parameters and device.
	varying := varyingParams(pts, x)
	sweeps := map[string]bool{}
	devices := map[string]int64{} // device -> capacity
	var devOrder []string
	minX, maxX := math.Inf(1), math.Inf(-1)
	for _, p := range pts {
		sweeps[p.rec.Sweep] = true
		for _, g := range p.rec.GPUs {
			if _, ok := devices[g.Device]; !ok {
				devOrder = append(devOrder, g.Device)
			}
			devices[g.Device] = max(devices[g.Device], g.Total)
		}
		minX, maxX = math.Min(minX, p.x), math.Max(maxX, p.x)
	}
	if len(devOrder) == 0 {
		return nil, fmt.Errorf("the sweep points have no GPU figures")
	}
	// When memory was held before the sweeps, the same on each device for
	// every point, plot what the points added to it against what was free.
	base := commonBaseline(pts, devOrder)
	maxY := 0.0
	for _, p := range pts {
		for _, g := range p.rec.GPUs {
			maxY = max(maxY, float64(g.Peak-base[g.Device]), float64(devices[g.Device]-base[g.Device]))
		}
	}
	unit, unitName := byteUnit(maxY)

	type series struct {
		label string
		ok    plotter.XYs
		oom   plotter.XYs
	}
	var order []string
	all := map[string]*series{}
	for _, p := range pts {
		for _, g := range p.rec.GPUs {
			var parts []string
			if len(sweeps) > 1 {
				parts = append(parts, p.rec.Sweep)
			}
			for _, k := range varying {
				parts = append(parts, k+"="+p.text[k])
			}
			if len(devOrder) > 1 || len(parts) == 0 {
				parts = append(parts, g.Device)
			}
			label := strings.Join(parts, " ")
			s := all[label]
			if s == nil {
				s = &series{label: label}
				all[label] = s
				order = append(order, label)
			}
			switch p.rec.Status {
			case "ok":
				s.ok = append(s.ok, plotter.XY{X: p.x, Y: float64(g.Peak-base[g.Device]) / unit})
			case "oom":
				y := float64(devices[g.Device] - base[g.Device])
				if devices[g.Device] == 0 {
					y = maxY
				}
				s.oom = append(s.oom, plotter.XY{X: p.x, Y: y / unit})
			}
		}
	}

	p := gplot.New()
	if len(sweeps) == 1 {
		p.Title.Text = fmt.Sprintf("Peak memory per point of sweep %q", pts[0].rec.Sweep)
	} else {
		p.Title.Text = "Peak memory per sweep point"
	}
	p.X.Label.Text = x
	p.Y.Label.Text = "peak allocated (" + unitName + ")"
	if len(base) > 0 {
		p.Y.Label.Text = "peak allocated above what was held before the sweep (" + unitName + ")"
	}
	p.Y.Min = 0
	p.Y.Max = maxY / unit * 1.35 // headroom for the legend, above the capacity line
	p.Legend.Top = true
	p.Legend.Left = true
	if minX > 0 && maxX/minX >= 16 {
		p.X.Scale = gplot.LogScale{}
		p.X.Tick.Marker = log2Ticks{}
	}
	var ooms plotter.XYs
	for i, label := range order {
		s := all[label]
		sort.Slice(s.ok, func(a, b int) bool { return s.ok[a].X < s.ok[b].X })
		if len(s.ok) > 0 {
			l, sc, err := plotter.NewLinePoints(s.ok)
			if err != nil {
				return nil, err
			}
			l.Color, sc.Color = seriesColor(i), seriesColor(i)
			sc.Shape = draw.CircleGlyph{}
			sc.Radius = vg.Points(2.5)
			p.Add(l, sc)
			p.Legend.Add(label, l, sc)
		}
		ooms = append(ooms, s.oom...)
	}
	for i, d := range devOrder {
		if devices[d] == 0 {
			continue
		}
		l, err := capacityLine(minX, maxX, float64(devices[d]-base[d])/unit, seriesColor(len(order)+i))
		if err != nil {
			return nil, err
		}
		p.Add(l)
		label := capacityLabel(d, devices[d])
		if base[d] > 0 {
			label = fmt.Sprintf("%s capacity less the sweep's baseline (%s of %s)", d,
				backend.FormatBytes(devices[d]-base[d]), backend.FormatBytes(devices[d]))
		}
		p.Legend.Add(label, l)
	}
	if len(ooms) > 0 {
		sc, err := oomScatter(ooms)
		if err != nil {
			return nil, err
		}
		p.Add(sc)
		p.Legend.Add("out of memory", sc)
	}
	return p, nil
}

// commonBaseline returns each device's memory held before the sweeps when
// some is held and every point saw the same figure on that device, else
// an empty map (plot absolute peaks).
func commonBaseline(pts []*sweepPoint, devices []string) map[string]int64 {
	base := map[string]int64{}
	for _, d := range devices {
		b, same := int64(-1), true
		for _, p := range pts {
			v := p.rec.Baseline[d]
			if b >= 0 && v != b {
				same = false
				break
			}
			b = v
		}
		if !same {
			return map[string]int64{}
		}
		if b > 0 {
			base[d] = b
		}
	}
	return base
}

type sweepPoint struct {
	rec  *record.Record
	num  map[string]float64 // numeric parameters
	text map[string]string  // every parameter as text
	x    float64
}

func newSweepPoint(r *record.Record) (*sweepPoint, error) {
	sp := &sweepPoint{rec: r, num: map[string]float64{}, text: map[string]string{}}
	if len(r.Params) == 0 {
		return sp, nil
	}
	dec := json.NewDecoder(strings.NewReader(string(r.Params)))
	dec.UseNumber()
	var m map[string]any
	if err := dec.Decode(&m); err != nil {
		return nil, fmt.Errorf("point %s: bad params: %v", r.Name, err)
	}
	for k, v := range m {
		switch v := v.(type) {
		case json.Number:
			if f, err := v.Float64(); err == nil {
				sp.num[k] = f
			}
			sp.text[k] = v.String()
		case string:
			sp.text[k] = v
		default:
			b, _ := json.Marshal(v)
			sp.text[k] = string(b)
		}
	}
	return sp, nil
}

// pickX is the numeric parameter with the most distinct values (ties: by
// name).
func pickX(pts []*sweepPoint) string {
	distinct := map[string]map[float64]bool{}
	for _, p := range pts {
		for k, v := range p.num {
			if distinct[k] == nil {
				distinct[k] = map[float64]bool{}
			}
			distinct[k][v] = true
		}
	}
	best, n := "", 0
	for k, vs := range distinct {
		if len(vs) > n || (len(vs) == n && k < best) {
			best, n = k, len(vs)
		}
	}
	return best
}

// varyingParams lists the parameters other than x that take more than one
// value, sorted.
func varyingParams(pts []*sweepPoint, x string) []string {
	values := map[string]map[string]bool{}
	for _, p := range pts {
		for k, v := range p.text {
			if k == x {
				continue
			}
			if values[k] == nil {
				values[k] = map[string]bool{}
			}
			values[k][v] = true
		}
	}
	var out []string
	for k, vs := range values {
		if len(vs) > 1 {
			out = append(out, k)
		}
	}
	sort.Strings(out)
	return out
}
