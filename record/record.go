// Package record is memsh's machine-readable output: one JSON object per
// finished experiment or trial, appended to a JSONL file (--out
// FILE.jsonl) and flushed to the operating system the moment the block
// finishes, so a killed run loses nothing it already measured.
//
// Records of sweep points (trials run by the sweep module) carry the
// sweep's name and the point's parameters. Re-running a script with the
// same --out skips every point already recorded as "ok" or "oom" (resume
// after a crash or a kill); a point recorded as "error" runs again.
//
// Every record also has a position, [unit, step, n], that orders records
// the way an unsharded run produces them: a sweep's points are units (a
// grid point is one unit; a whole max_fit search is one unit whose trials
// are its steps), counted in the order the script reaches them; records
// outside any unit get step -1 and the number of units begun so far. With
// --shard i/n a run executes only the units u with u mod n == i, and Merge
// combines the shards' files into what one unsharded run writes.
package record

import (
	"encoding/json"
	"fmt"
	"math"
	"math/big"
	"sort"
	"strconv"
	"strings"
	"time"

	"go.starlark.net/starlark"

	"github.com/memsh/memsh/env"
)

// Record is one finished experiment or trial as written to a JSONL file.
// Sizes are in bytes, times in seconds.
type Record struct {
	// Schema is the record format's version: SchemaVersion when written;
	// a record read without it is version 1.
	Schema int             `json:"schema,omitempty"`
	Kind   string          `json:"kind"`             // "experiment" or "trial"
	Name   string          `json:"name"`             // the block's name ("bs=64" for a sweep point)
	Sweep  string          `json:"sweep,omitempty"`  // the sweep a point belongs to
	Params json.RawMessage `json:"params,omitempty"` // the point's parameters: a JSON object, keys sorted
	Status string          `json:"status"`           // "ok", "oom" or "error"
	Error  string          `json:"error,omitempty"`  // the trial's error message
	Time   float64         `json:"time"`             // elapsed wall time, seconds
	At     string          `json:"at,omitempty"`     // when the block finished, RFC 3339 (UTC)
	Pos    Pos             `json:"pos"`              // order of the record in an unsharded run
	Shard  string          `json:"shard,omitempty"`  // "i/n" when written by a sharded run
	Host   Figures         `json:"host"`
	GPUs   []Figures       `json:"gpus"`
	Leaks  []string        `json:"leaks,omitempty"` // "device bytes path" for memory still reachable after the block
	// Baseline is, for a sweep point, each GPU's allocated bytes before
	// the sweep began (what the point's peak includes but did not cause).
	Baseline map[string]int64 `json:"baseline,omitempty"`
	// Breakdown is, for a sweep point that called nn.track, the last
	// breakdown it measured (schema 3).
	Breakdown *Breakdown `json:"breakdown,omitempty"`
}

// Breakdown is nn.track's memory breakdown (PyTorch MemTracker's
// categories): bytes by category name ("Parameter", "Buffer", "Gradient",
// "Activation", "Temp", "Optstate", "Other", "Total") at the peak and at
// the end, and each module's at the peak of its forward and backward.
type Breakdown struct {
	Device  string            `json:"device"`
	Peak    map[string]int64  `json:"peak"`
	End     map[string]int64  `json:"end"`
	Modules []ModuleBreakdown `json:"modules,omitempty"`
}

// ModuleBreakdown is one module's entry of a Breakdown.
type ModuleBreakdown struct {
	Name     string           `json:"name"`
	Type     string           `json:"type"`
	Forward  map[string]int64 `json:"forward,omitempty"`
	Backward map[string]int64 `json:"backward,omitempty"`
}

// BreakdownCategories are a Breakdown's categories, in MemTracker's order
// (without "Total").
var BreakdownCategories = []string{"Parameter", "Buffer", "Gradient", "Activation", "Temp", "Optstate", "Other"}

// SchemaVersion is the version of the records this memsh writes: 2 added
// the "schema" field itself, and experiments with status "oom" or "error"
// (an experiment cut by an out-of-memory error or still open when a script
// stopped on an error); 3 the optional "breakdown" of a sweep point that
// called nn.track.
const SchemaVersion = 3

// validate checks what every memsh record has.
func (r *Record) validate() error {
	switch {
	case r.Kind != "experiment" && r.Kind != "trial":
		if r.Kind == "" {
			return fmt.Errorf("no \"kind\"")
		}
		return fmt.Errorf("its kind is neither \"experiment\" nor \"trial\"")
	case r.Status != "ok" && r.Status != "oom" && r.Status != "error":
		return fmt.Errorf("its status is none of \"ok\", \"oom\", \"error\"")
	case r.Schema < 0 || r.Schema > SchemaVersion:
		return fmt.Errorf("schema %d: written by a newer memsh (this one reads up to %d)", r.Schema, SchemaVersion)
	}
	return nil
}

// Figures are one resource's figures (docs/starlark.md), as in env.Figures,
// plus the resource's capacity.
type Figures struct {
	Device    string `json:"device"` // "host", "cuda:0", ...
	Used      int64  `json:"used"`
	Consumed  int64  `json:"consumed"`
	Peak      int64  `json:"peak"`
	Peaked    int64  `json:"peaked"`
	Reclaimed int64  `json:"reclaimed"`
	Available int64  `json:"available"`
	Total     int64  `json:"total"` // device capacity, or the host's total RAM
}

// Pos is a record's position [unit, step, n]: see the package doc.
type Pos [3]int

// Less orders positions lexicographically.
func (p Pos) Less(q Pos) bool {
	for i := range p {
		if p[i] != q[i] {
			return p[i] < q[i]
		}
	}
	return false
}

// Resumable reports whether the record is a sweep point that a resumed
// run does not redo: one that finished "ok" or "oom".
func (r *Record) Resumable() bool {
	return r.Kind == "trial" && r.Sweep != "" && (r.Status == "ok" || r.Status == "oom")
}

// Key identifies a sweep point across runs: its sweep unit (the sweep's
// place in the script: two sweeps of one name, such as two lambdas, are
// different units), the sweep's name and the point's parameters.
func (r *Record) Key() string { return Key(r.Pos[0], r.Sweep, r.Params) }

// Key is the identity of the point params of sweep in unit.
func Key(unit int, sweep string, params json.RawMessage) string {
	return fmt.Sprintf("%d\x00%s\x00%s", unit, sweep, params)
}

// identity is what makes two records with the same position the same
// record (a re-run of it) rather than a collision of different scripts.
func (r *Record) identity() string {
	return fmt.Sprintf("%v\x00%s\x00%s\x00%s\x00%s", r.Pos, r.Kind, r.Name, r.Sweep, r.Params)
}

// matches reports whether r was measured under the conditions of the
// current run: every GPU's capacity the same, and (for a sweep point) the
// same bytes allocated on each GPU before the sweep.
func (r *Record) matches(baseline map[string]int64, totals map[string]uint64) bool {
	for _, g := range r.GPUs {
		if t, ok := totals[g.Device]; !ok || uint64(g.Total) != t {
			return false
		}
	}
	if len(r.GPUs) != len(totals)-1 { // totals also holds "host"
		return false
	}
	for dev, b := range baseline {
		if r.Baseline[dev] != b {
			return false
		}
	}
	return len(r.Baseline) == len(baseline)
}

// Data returns the record's figures as env.Data (for a resumed sweep
// point); current is the current GPU's device string, used to pick Data.GPU.
func (r *Record) Data(current string) *env.Data {
	d := &env.Data{Name: r.Name, Time: time.Duration(r.Time * float64(time.Second)), Host: r.Host.measure()}
	for _, g := range r.GPUs {
		d.GPUs = append(d.GPUs, g.measure())
	}
	for i := range d.GPUs {
		if d.GPUs[i].Device == current {
			d.GPU = &d.GPUs[i]
		}
	}
	if d.GPU == nil && len(d.GPUs) > 0 {
		d.GPU = &d.GPUs[0]
	}
	return d
}

func (f Figures) measure() env.Figures {
	return env.Figures{Device: f.Device, Used: f.Used, Consumed: f.Consumed, Peak: f.Peak,
		Peaked: f.Peaked, Reclaimed: f.Reclaimed, Available: f.Available}
}

func figures(f env.Figures, total uint64) Figures {
	return Figures{Device: f.Device, Used: f.Used, Consumed: f.Consumed, Peak: f.Peak, Peaked: f.Peaked,
		Reclaimed: f.Reclaimed, Available: f.Available, Total: int64(total)}
}

// FromEvent converts a finish event. totals gives each device's capacity
// by device name ("host", "cuda:0"); params are converted with Params.
func FromEvent(e env.FinishEvent, totals map[string]uint64) (*Record, error) {
	r := &Record{Schema: SchemaVersion, Kind: e.Kind, Name: e.Name, Status: e.Status, Error: e.Error, Leaks: e.Leaks,
		At: time.Now().UTC().Format(time.RFC3339Nano), GPUs: []Figures{}}
	if len(e.Params) > 0 {
		p, err := Params(e.Params)
		if err != nil {
			return nil, err
		}
		r.Params = p
	}
	if d := e.Data; d != nil {
		r.Time = d.Time.Seconds()
		r.Host = figures(d.Host, totals[d.Host.Device])
		for _, g := range d.GPUs {
			r.GPUs = append(r.GPUs, figures(g, totals[g.Device]))
		}
	}
	return r, nil
}

// Params encodes a point's parameters as a JSON object with sorted keys,
// the canonical form Key compares. Values may be None, bools, ints (of
// any size), floats, strings, and lists, tuples and string-keyed dicts of
// those; any other value is encoded as its str() text.
func Params(d starlark.StringDict) (json.RawMessage, error) {
	m := make(map[string]any, len(d))
	for k, v := range d {
		j, err := toJSON(v, 0)
		if err != nil {
			return nil, fmt.Errorf("parameter %s: %v", k, err)
		}
		m[k] = j
	}
	return json.Marshal(m) // encoding/json sorts map keys
}

func toJSON(v starlark.Value, depth int) (any, error) {
	if depth > 32 {
		return nil, fmt.Errorf("value nested too deeply")
	}
	switch v := v.(type) {
	case starlark.NoneType:
		return nil, nil
	case starlark.Bool:
		return bool(v), nil
	case starlark.Int:
		if i, ok := v.Int64(); ok {
			return i, nil
		}
		return json.Number(v.BigInt().String()), nil
	case starlark.Float:
		f := float64(v)
		if math.IsNaN(f) || math.IsInf(f, 0) {
			return v.String(), nil
		}
		if f == math.Trunc(f) && math.Abs(f) < 1e15 {
			// Keep floats distinct from ints in the canonical text: 2.0, not 2.
			return json.Number(strconv.FormatFloat(f, 'f', 1, 64)), nil
		}
		return f, nil
	case starlark.String:
		return string(v), nil
	case starlark.Indexable: // list, tuple
		out := make([]any, v.Len())
		for i := range out {
			x, err := toJSON(v.Index(i), depth+1)
			if err != nil {
				return nil, err
			}
			out[i] = x
		}
		return out, nil
	case *starlark.Dict:
		out := make(map[string]any, v.Len())
		for _, kv := range v.Items() {
			k, ok := starlark.AsString(kv[0])
			if !ok {
				return nil, fmt.Errorf("dict key %s is not a string", kv[0])
			}
			x, err := toJSON(kv[1], depth+1)
			if err != nil {
				return nil, err
			}
			out[k] = x
		}
		return out, nil
	}
	return v.String(), nil
}

// ParamValues decodes a record's parameters into Starlark values (numbers
// with no fraction become ints, others floats); nil when there are none.
func ParamValues(raw json.RawMessage) (*starlark.Dict, error) {
	d := starlark.NewDict(0)
	if len(raw) == 0 {
		return d, nil
	}
	dec := json.NewDecoder(strings.NewReader(string(raw)))
	dec.UseNumber()
	var m map[string]any
	if err := dec.Decode(&m); err != nil {
		return nil, err
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if err := d.SetKey(starlark.String(k), fromJSON(m[k])); err != nil {
			return nil, err
		}
	}
	return d, nil
}

func fromJSON(x any) starlark.Value {
	switch x := x.(type) {
	case nil:
		return starlark.None
	case bool:
		return starlark.Bool(x)
	case json.Number:
		s := string(x)
		if !strings.ContainsAny(s, ".eE") {
			if b, ok := new(big.Int).SetString(s, 10); ok {
				return starlark.MakeBigInt(b)
			}
		}
		f, _ := x.Float64()
		return starlark.Float(f)
	case string:
		return starlark.String(x)
	case []any:
		l := make([]starlark.Value, len(x))
		for i := range x {
			l[i] = fromJSON(x[i])
		}
		return starlark.NewList(l)
	case map[string]any:
		d := starlark.NewDict(len(x))
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			_ = d.SetKey(starlark.String(k), fromJSON(x[k]))
		}
		return d
	}
	return starlark.None
}
