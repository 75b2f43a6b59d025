package plot

import (
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"

	gplot "gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
)

// traceFile is the part of a Trace Event Format file a timeline reads.
type traceFile struct {
	TraceEvents []struct {
		Name string         `json:"name"`
		Ph   string         `json:"ph"`
		Ts   json.Number    `json:"ts"`
		Raw  map[string]any `json:"args"`
	} `json:"traceEvents"`
}

// Timeline charts memory over time from a Chrome Trace Event file as
// --trace writes it: every counter series ("cuda:0 memory allocated",
// "cuda:0 memory reserved", "host memory rss", ...) as a step line against
// seconds since the trace started, and each "OOM ..." instant event as a
// red cross at the device's allocated bytes at that moment.
func Timeline(r io.Reader) (*gplot.Plot, error) {
	var tf traceFile
	dec := json.NewDecoder(r)
	dec.UseNumber()
	if err := dec.Decode(&tf); err != nil {
		return nil, fmt.Errorf("not a trace: %v", err)
	}
	series := map[string]plotter.XYs{}
	var names []string
	type oom struct {
		device string
		t      float64
	}
	var ooms []oom
	maxY, maxT := 0.0, 0.0
	for _, e := range tf.TraceEvents {
		ts, err := e.Ts.Float64()
		if err != nil {
			continue
		}
		t := ts / 1e6
		maxT = max(maxT, t)
		switch e.Ph {
		case "C":
			for k, v := range e.Raw {
				n, ok := v.(json.Number)
				if !ok {
					continue
				}
				f, err := n.Float64()
				if err != nil {
					continue
				}
				name := e.Name + " " + k
				if _, ok := series[name]; !ok {
					names = append(names, name)
				}
				series[name] = append(series[name], plotter.XY{X: t, Y: f})
				maxY = max(maxY, f)
			}
		case "i", "I":
			if dev, ok := strings.CutPrefix(e.Name, "OOM "); ok {
				ooms = append(ooms, oom{dev, t})
			}
		}
	}
	if len(names) == 0 {
		return nil, fmt.Errorf("the trace has no memory counters")
	}
	sort.Strings(names)
	unit, unitName := byteUnit(maxY)

	p := gplot.New()
	p.Title.Text = "Memory over time"
	p.X.Label.Text = "time (s)"
	p.Y.Label.Text = "bytes (" + unitName + ")"
	p.X.Min, p.Y.Min = 0, 0
	p.Y.Max = maxY / unit * 1.3 // headroom for the legend
	p.Legend.Top = true
	p.Legend.Left = true
	for i, name := range names {
		xys := series[name]
		sort.SliceStable(xys, func(a, b int) bool { return xys[a].X < xys[b].X })
		for j := range xys {
			xys[j].Y /= unit
		}
		if last := xys[len(xys)-1]; last.X < maxT {
			xys = append(xys, plotter.XY{X: maxT, Y: last.Y}) // hold the last value to the end
		}
		series[name] = xys
		l, err := plotter.NewLine(xys)
		if err != nil {
			return nil, err
		}
		l.StepStyle = plotter.PostStep
		l.Color = seriesColor(i)
		l.Width = vg.Points(1.2)
		p.Add(l)
		p.Legend.Add(name, l)
	}
	if len(ooms) > 0 {
		var pts plotter.XYs
		for _, o := range ooms {
			pts = append(pts, plotter.XY{X: o.t, Y: valueAt(series[o.device+" memory allocated"], o.t)})
		}
		sc, err := oomScatter(pts)
		if err != nil {
			return nil, err
		}
		p.Add(sc)
		p.Legend.Add("out of memory", sc)
	}
	return p, nil
}

// valueAt is the step function's value at t: the last point at or before t.
func valueAt(xys plotter.XYs, t float64) float64 {
	v := 0.0
	for _, xy := range xys {
		if xy.X > t {
			break
		}
		v = xy.Y
	}
	return v
}
