package sweep

import (
	"reflect"
	"runtime"
	"testing"
	"time"

	"go.starlark.net/starlark"

	"github.com/memsh/memsh/env"
)

// TestPointsRoundTrip stores points of every shape and reads them back
// unchanged.
func TestPointsRoundTrip(t *testing.T) {
	gpus := func(current int, figs ...env.Figures) *env.Data {
		d := &env.Data{Time: 1500 * time.Millisecond, Host: env.Figures{Device: "host", Used: 10, Consumed: -2, Peak: 12, Peaked: 3, Available: 99}}
		d.GPUs = figs
		if current >= 0 {
			d.GPU = &d.GPUs[current]
		}
		return d
	}
	f0 := env.Figures{Device: "cuda:0", Used: 512, Consumed: 512, Peak: 1024, Peaked: 512, Reclaimed: 7, Available: 1 << 30}
	f1 := env.Figures{Device: "cuda:1", Used: 0, Peak: 2048, Peaked: 2048, Available: 1 << 20}
	named := func(p *point) *point {
		p.name = pointName(p.keys, p.params)
		if p.data != nil && p.data.Name == "" {
			p.data.Name = p.name
		}
		return p
	}
	cases := []*point{
		named(&point{keys: []string{"bs"}, params: starlark.StringDict{"bs": starlark.MakeInt(64)}, status: "ok", value: starlark.String("v"), data: gpus(0, f0)}),
		named(&point{keys: []string{"bs"}, params: starlark.StringDict{"bs": starlark.MakeInt(128)}, status: "oom", err: "CUDA out of memory", data: gpus(1, f0, f1)}),
		named(&point{keys: []string{"bs", "confirm"}, params: starlark.StringDict{"bs": starlark.MakeInt(96), "confirm": starlark.True}, status: "ok", resumed: true, data: gpus(-1)}),
		named(&point{keys: []string{"lr", "seq"}, params: starlark.StringDict{"lr": starlark.Float(0.5), "seq": starlark.NewList([]starlark.Value{starlark.MakeInt(1)})}, status: "error", err: "boom"}),
		named(&point{keys: []string{"bs"}, params: starlark.StringDict{"bs": starlark.MakeInt(1)}, status: "ok", data: &env.Data{Name: "other name", Host: env.Figures{Device: "host"}, GPUs: []env.Figures{f1}}}),
	}
	var ps points
	// a grid's points refer to values stored once
	off := ps.addValues([]starlark.Value{starlark.MakeInt(8), starlark.MakeInt(16)})
	grid := named(&point{keys: []string{"bs"}, params: starlark.StringDict{"bs": starlark.MakeInt(16)}, pidx: []int32{off + 1}, status: "ok", data: gpus(0, f0)})
	cases = append(cases, grid)
	for _, p := range cases {
		ps.add(p)
	}
	grid.pidx = nil // not kept: read back as params
	if ps.len() != len(cases) {
		t.Fatalf("len = %d, want %d", ps.len(), len(cases))
	}
	for i, want := range cases {
		got := ps.at(i)
		if !reflect.DeepEqual(got, want) {
			t.Errorf("point %d:\n got %+v %+v\nwant %+v %+v", i, got, got.data, want, want.data)
		}
	}
	if len(ps.keySets) != 3 || len(ps.devices) != 3 {
		t.Errorf("keySets %v devices %v: want 3 distinct of each", ps.keySets, ps.devices)
	}
}

// TestPointsHeapPerPoint: a point costs the Go heap a fixed record and
// its parameter slots, well under the ~1 KB (a map, a struct, strings)
// it cost before.
func TestPointsHeapPerPoint(t *testing.T) {
	const n = 20000
	d := &env.Data{Host: env.Figures{Device: "host"}, GPUs: []env.Figures{{Device: "cuda:0", Peak: 1}}}
	d.GPU = &d.GPUs[0]
	var ps points
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for i := 0; i < n; i++ {
		p := &point{keys: []string{"n"}, params: starlark.StringDict{"n": starlark.MakeInt(i)}, status: "ok", data: d}
		p.name = pointName(p.keys, p.params)
		d.Name = p.name
		ps.add(p)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	per := float64(after.HeapAlloc-before.HeapAlloc) / n
	// pointRec (~96 B) + figs (56 B) + one interface slot (16 B), with
	// slice growth up to 2x: about 340 B at most.
	if per > 400 {
		t.Errorf("%.0f bytes of Go heap per point, want <= 400", per)
	}
	runtime.KeepAlive(&ps)
}
