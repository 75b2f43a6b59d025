package plot

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/memsh/memsh/record"
)

const mib = 1 << 20

func point(sweep string, params string, status string, peak, total, base int64) *record.Record {
	r := &record.Record{Kind: "trial", Name: params, Sweep: sweep, Params: json.RawMessage(params), Status: status,
		GPUs: []record.Figures{{Device: "cuda:0", Peak: peak, Total: total}}}
	if base > 0 {
		r.Baseline = map[string]int64{"cuda:0": base}
	}
	return r
}

func TestSweepChart(t *testing.T) {
	var recs []*record.Record
	for i, n := range []int{1, 2, 4, 8, 16, 32} {
		recs = append(recs, point("mlp", fmt.Sprintf(`{"batch":%d}`, n), "ok", int64(n)*20*mib, 1024*mib, 0))
		recs[i].Pos = record.Pos{0, i, 0}
	}
	recs = append(recs, point("mlp", `{"batch":64}`, "oom", 1000*mib, 1024*mib, 0))
	recs = append(recs, &record.Record{Kind: "experiment", Name: "setup", Status: "ok"}) // not a sweep point
	p, err := Sweep(recs, "")
	if err != nil {
		t.Fatal(err)
	}
	if p.X.Label.Text != "batch" || !strings.Contains(p.Y.Label.Text, "(GiB)") {
		t.Errorf("axes %q, %q", p.X.Label.Text, p.Y.Label.Text)
	}
	dir := t.TempDir()
	svg := filepath.Join(dir, "s.svg")
	if err := Save(p, svg, 0, 0); err != nil {
		t.Fatal(err)
	}
	data, _ := os.ReadFile(svg)
	for _, want := range []string{"<svg", "cuda:0 capacity (1.00 GiB)", "out of memory", "Peak memory per point of sweep"} {
		if !bytes.Contains(data, []byte(want)) {
			t.Errorf("the SVG lacks %q", want)
		}
	}
	png := filepath.Join(dir, "s.png")
	if err := Save(p, png, 0, 0); err != nil {
		t.Fatal(err)
	}
	data, _ = os.ReadFile(png)
	if !bytes.HasPrefix(data, []byte("\x89PNG\r\n\x1a\n")) || len(data) < 1000 {
		t.Errorf("not a PNG: %d bytes", len(data))
	}
	if err := Save(p, filepath.Join(dir, "s.gif"), 0, 0); err == nil || !strings.Contains(err.Error(), "want .svg or .png") {
		t.Errorf("Save .gif: %v", err)
	}
}

func TestSweepChartSeriesAndBaseline(t *testing.T) {
	var recs []*record.Record
	for _, seq := range []int{128, 512} {
		for _, b := range []int{1, 2, 4} {
			recs = append(recs, point(fmt.Sprintf("seq=%d", seq), fmt.Sprintf(`{"batch":%d}`, b), "ok", 900*mib+int64(b*seq)*mib/64, 1024*mib, 900*mib))
		}
	}
	p, err := Sweep(recs, "batch")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(p.Y.Label.Text, "above what was held before the sweep") {
		t.Errorf("y label %q: a common baseline must be subtracted", p.Y.Label.Text)
	}
	var buf bytes.Buffer
	w, err := p.WriterTo(400, 300, "svg")
	if err != nil {
		t.Fatal(err)
	}
	w.WriteTo(&buf)
	for _, want := range []string{"seq=128", "seq=512", "baseline (124.00 MiB of 1.00 GiB)"} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("the chart lacks %q", want)
		}
	}
	// grid points: the parameter with the most values is x, the other splits lines
	grid := []*record.Record{
		point("alloc", `{"copies":1,"n":128}`, "ok", 128*mib, 1024*mib, 0),
		point("alloc", `{"copies":1,"n":256}`, "ok", 256*mib, 1024*mib, 0),
		point("alloc", `{"copies":1,"n":512}`, "ok", 512*mib, 1024*mib, 0),
		point("alloc", `{"copies":2,"n":128}`, "ok", 256*mib, 1024*mib, 0),
		point("alloc", `{"copies":2,"n":256}`, "ok", 512*mib, 1024*mib, 0),
		point("alloc", `{"copies":2,"n":512}`, "oom", 1024*mib, 1024*mib, 0),
	}
	if p, err = Sweep(grid, ""); err != nil || p.X.Label.Text != "n" {
		t.Fatalf("grid chart: x %q, %v", p.X.Label.Text, err)
	}
}

func TestSweepChartErrors(t *testing.T) {
	if _, err := Sweep([]*record.Record{{Kind: "experiment", Name: "e"}}, ""); err == nil || !strings.Contains(err.Error(), "no sweep points") {
		t.Errorf("no points: %v", err)
	}
	recs := []*record.Record{point("f", `{"n":1}`, "ok", mib, 1024*mib, 0)}
	if _, err := Sweep(recs, "batch"); err == nil || !strings.Contains(err.Error(), `no numeric parameter "batch"`) {
		t.Errorf("unknown x: %v", err)
	}
}

const traceJSON = `{"traceEvents":[
{"name":"process_name","ph":"M","ts":0,"pid":1,"tid":0,"args":{"name":"memsh"}},
{"name":"cuda:0 memory","ph":"C","ts":0,"pid":1,"tid":0,"args":{"allocated":0,"reserved":0}},
{"name":"host memory","ph":"C","ts":10,"pid":1,"tid":0,"args":{"rss":20971520}},
{"name":"cuda:0 memory","ph":"C","ts":1000,"pid":1,"tid":0,"args":{"allocated":536870912,"reserved":536870912}},
{"name":"OOM cuda:0","ph":"i","s":"p","ts":1500,"pid":1,"tid":2,"args":{"requested":1073741824}},
{"name":"stmt","cat":"statement","ph":"X","ts":5,"dur":2000,"pid":1,"tid":1},
{"name":"cuda:0 memory","ph":"C","ts":2000,"pid":1,"tid":0,"args":{"allocated":0,"reserved":536870912}}
],"displayTimeUnit":"ms"}`

func TestTimelineChart(t *testing.T) {
	p, err := Timeline(strings.NewReader(traceJSON))
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	w, err := p.WriterTo(400, 300, "svg")
	if err != nil {
		t.Fatal(err)
	}
	w.WriteTo(&buf)
	for _, want := range []string{"cuda:0 memory allocated", "cuda:0 memory reserved", "host memory rss", "out of memory", "time (s)"} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("the timeline lacks %q", want)
		}
	}
	if _, err := Timeline(strings.NewReader(`{"traceEvents":[]}`)); err == nil || !strings.Contains(err.Error(), "no memory counters") {
		t.Errorf("empty trace: %v", err)
	}
	if _, err := Timeline(strings.NewReader(`nope`)); err == nil || !strings.Contains(err.Error(), "not a trace") {
		t.Errorf("bad trace: %v", err)
	}
}

// Red marks out-of-memory points only: no series or capacity line is red.
func TestOnlyOOMIsRed(t *testing.T) {
	for i := range 2 * len(palette) {
		r, g, b, _ := seriesColor(i).RGBA()
		if r>>8 > 180 && g>>8 < 110 && b>>8 < 110 {
			t.Errorf("series color %d is red: %v", i, seriesColor(i))
		}
	}
}
