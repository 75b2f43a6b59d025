package sweep

import (
	"slices"
	"time"

	"go.starlark.net/starlark"

	"github.com/memsh/memsh/env"
)

// points holds a sweep's finished points in a compact form that the Go
// collector need not scan: one pointer-free record per point, with
// parameter values, returned values, error texts and figures in shared
// arenas. A reclaim that collects marks the whole Go heap, so a sweep
// that kept a map, a struct and their strings per point (as it once did)
// made each later point slower: measured with that build, 0.9 ms per point
// at the start of a 10,000-point grid, 2.3 ms at its end. Now the cost
// stays flat (BenchmarkGridPerPointCost; bench/README.md, "Reclaims proven
// without a collection").
type points struct {
	recs    []pointRec
	keySets [][]string       // distinct parameter-name lists (a grid has one; max_fit two)
	pvals   []starlark.Value // parameter values (a grid's value lists, each once)
	params  []int32          // each point's parameter values (indices into pvals), len(keys) per point
	values  []starlark.Value // the non-None values fn returned
	texts   []string         // error messages and data names that differ from the point's name
	devices []string         // distinct device names of the figures
	gpuFigs []figs           // GPU figures, per point in device order
}

// pointRec is one point; it holds no pointers.
type pointRec struct {
	keys     int32 // index into keySets
	params   int32 // offset into params
	value    int32 // index into values, -1 for None
	err      int32 // index into texts, -1 for none
	dataName int32 // index into texts, -1 when the data is named after the point
	status   uint8 // statusOK, statusOOM, statusError
	resumed  bool
	hasData  bool
	// unrecorded: its record could not be written to --out
	unrecorded bool
	gpus       int32 // offset into figs
	ngpus      int32
	current    int32 // index of data.GPU among the point's GPU figures, -1 for none
	time       time.Duration
	host       figs
}

// figs is env.Figures without its device name (an index into devices).
type figs struct {
	device                                             int32
	used, consumed, peak, peaked, reclaimed, available int64
}

const (
	statusOK uint8 = iota
	statusOOM
	statusError
)

var statusNames = [...]string{statusOK: "ok", statusOOM: "oom", statusError: "error"}

func statusCode(s string) uint8 {
	switch s {
	case "oom":
		return statusOOM
	case "error":
		return statusError
	}
	return statusOK
}

// len is the number of points.
func (ps *points) len() int { return len(ps.recs) }

// add stores p.
func (ps *points) add(p *point) {
	r := pointRec{
		keys:       ps.keySet(p.keys),
		params:     int32(len(ps.params)),
		value:      -1,
		err:        -1,
		dataName:   -1,
		status:     statusCode(p.status),
		resumed:    p.resumed,
		unrecorded: p.unrecorded,
		current:    -1,
	}
	if p.pidx != nil {
		ps.params = append(ps.params, p.pidx...)
	} else {
		for _, k := range p.keys {
			ps.params = append(ps.params, int32(len(ps.pvals)))
			ps.pvals = append(ps.pvals, p.params[k])
		}
	}
	if p.value != nil && p.value != starlark.None {
		r.value = int32(len(ps.values))
		ps.values = append(ps.values, p.value)
	}
	if p.err != "" {
		r.err = ps.text(p.err)
	}
	if d := p.data; d != nil {
		r.hasData = true
		if d.Name != p.name {
			r.dataName = ps.text(d.Name)
		}
		r.time = d.Time
		r.host = ps.pack(d.Host)
		r.gpus, r.ngpus = int32(len(ps.gpuFigs)), int32(len(d.GPUs))
		for i := range d.GPUs {
			ps.gpuFigs = append(ps.gpuFigs, ps.pack(d.GPUs[i]))
			if d.GPU == &d.GPUs[i] || (d.GPU != nil && r.current < 0 && *d.GPU == d.GPUs[i]) {
				r.current = int32(i)
			}
		}
	}
	ps.recs = append(ps.recs, r)
}

// at rebuilds point i.
func (ps *points) at(i int) *point {
	r := &ps.recs[i]
	keys := ps.keySets[r.keys]
	p := &point{keys: keys, params: make(starlark.StringDict, len(keys)), status: statusNames[r.status], resumed: r.resumed, unrecorded: r.unrecorded}
	for j, k := range keys {
		p.params[k] = ps.pvals[ps.params[int(r.params)+j]]
	}
	p.name = pointName(keys, p.params)
	if r.value >= 0 {
		p.value = ps.values[r.value]
	}
	if r.err >= 0 {
		p.err = ps.texts[r.err]
	}
	if r.hasData {
		d := &env.Data{Name: p.name, Time: r.time, Host: ps.unpack(r.host)}
		if r.dataName >= 0 {
			d.Name = ps.texts[r.dataName]
		}
		for _, f := range ps.gpuFigs[r.gpus : r.gpus+r.ngpus] {
			d.GPUs = append(d.GPUs, ps.unpack(f))
		}
		if r.current >= 0 {
			d.GPU = &d.GPUs[r.current]
		}
		p.data = d
	}
	return p
}

// addValues stores parameter values once, for points that refer to them
// by index (point.pidx), and returns the index of the first.
func (ps *points) addValues(vs []starlark.Value) int32 {
	off := int32(len(ps.pvals))
	ps.pvals = append(ps.pvals, vs...)
	return off
}

func (ps *points) keySet(keys []string) int32 {
	for i, ks := range ps.keySets {
		if slices.Equal(ks, keys) {
			return int32(i)
		}
	}
	ps.keySets = append(ps.keySets, append([]string(nil), keys...))
	return int32(len(ps.keySets) - 1)
}

func (ps *points) text(s string) int32 {
	ps.texts = append(ps.texts, s)
	return int32(len(ps.texts) - 1)
}

func (ps *points) pack(f env.Figures) figs {
	d := -1
	for i, name := range ps.devices {
		if name == f.Device {
			d = i
			break
		}
	}
	if d < 0 {
		ps.devices = append(ps.devices, f.Device)
		d = len(ps.devices) - 1
	}
	return figs{device: int32(d), used: f.Used, consumed: f.Consumed, peak: f.Peak, peaked: f.Peaked, reclaimed: f.Reclaimed, available: f.Available}
}

func (ps *points) unpack(f figs) env.Figures {
	return env.Figures{Device: ps.devices[f.device], Used: f.used, Consumed: f.consumed, Peak: f.peak, Peaked: f.peaked, Reclaimed: f.reclaimed, Available: f.available}
}
