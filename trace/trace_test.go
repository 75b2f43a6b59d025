package trace_test

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/memsh/memsh/scope"
	"github.com/memsh/memsh/trace"
)

type traceFile struct {
	TraceEvents     []map[string]any `json:"traceEvents"`
	DisplayTimeUnit string           `json:"displayTimeUnit"`
	OtherData       map[string]any   `json:"otherData"`
}

// run executes src (written to a file, so statements get their source
// line as name) in a fresh Session recorded by a trace, and returns the
// parsed trace after checking that every event is well-formed Trace Event
// Format.
func run(t *testing.T, src string, opts trace.Options) (*traceFile, *scope.Session) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "job.star")
	if err := os.WriteFile(path, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	s, err := scope.New(scope.Options{Device: "sim:1GiB", Out: &out, Err: &out})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	opts.HostInterval = -1
	rec := trace.Start(s.Env(), opts)
	if err := s.Exec(path, nil); err != nil {
		t.Fatal(err)
	}
	rec.Stop()
	file := filepath.Join(t.TempDir(), "trace.json")
	if err := rec.WriteFile(file); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var tf traceFile
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&tf); err != nil {
		t.Fatalf("the trace is not valid JSON: %v", err)
	}
	if tf.DisplayTimeUnit != "ms" || tf.OtherData["tool"] != "memsh" {
		t.Errorf("displayTimeUnit %q, otherData %v", tf.DisplayTimeUnit, tf.OtherData)
	}
	checkFormat(t, tf.TraceEvents)
	return &tf, s
}

// checkFormat checks each event against the Trace Event Format: name,
// ph, ts, pid and tid; "X" events have a non-negative dur; counters have
// numeric args; instants a scope; and events come in time order.
func checkFormat(t *testing.T, evs []map[string]any) {
	t.Helper()
	last := -1.0
	for i, e := range evs {
		name, _ := e["name"].(string)
		ph, _ := e["ph"].(string)
		ts, tsOK := e["ts"].(float64)
		_, pidOK := e["pid"].(float64)
		_, tidOK := e["tid"].(float64)
		if name == "" || !tsOK || !pidOK || !tidOK || ts < 0 {
			t.Fatalf("event %d is not a trace event: %v", i, e)
		}
		switch ph {
		case "M":
			continue
		case "X":
			if d, ok := e["dur"].(float64); !ok || d < 0 {
				t.Errorf("complete event without dur: %v", e)
			}
		case "C":
			args, _ := e["args"].(map[string]any)
			if len(args) == 0 {
				t.Errorf("counter without values: %v", e)
			}
			for k, v := range args {
				if _, ok := v.(float64); !ok {
					t.Errorf("counter %s series %s is not a number: %v", name, k, v)
				}
			}
		case "i":
			if s := e["s"]; s != "g" && s != "p" && s != "t" {
				t.Errorf("instant event with scope %v", s)
			}
		default:
			t.Errorf("unexpected phase %q in %v", ph, e)
		}
		if ts < last {
			t.Errorf("event %d at %v µs comes after one at %v µs", i, ts, last)
		}
		last = ts
	}
}

func counterMax(evs []map[string]any, name, series string) (maxV, lastV float64, n int) {
	for _, e := range evs {
		if e["ph"] == "C" && e["name"] == name {
			v := e["args"].(map[string]any)[series].(float64)
			maxV, lastV = max(maxV, v), v
			n++
		}
	}
	return
}

func TestTraceContents(t *testing.T) {
	tf, _ := run(t, `x = tensor.zeros([64, 1024, 1024], device="cuda")
def big():
    return tensor.zeros([512, 1024, 1024], device="cuda")
r = trial(big, name="too big")
e = experiment("block", quiet=True)
y = cuda.malloc(100 * MiB)
e.finish()
x = None
gc()
`, trace.Options{})
	evs := tf.TraceEvents
	maxA, lastA, n := counterMax(evs, "cuda:0 memory", "allocated")
	if maxA != 356*(1<<20) || lastA != 0 || n < 4 {
		t.Errorf("cuda:0 allocated: max %v, last %v in %d samples; want max 356 MiB (x + y), last 0", maxA, lastA, n)
	}
	// One series per counter: catapult stacks the series of one counter.
	for _, e := range evs {
		if e["ph"] == "C" && len(e["args"].(map[string]any)) != 1 {
			t.Errorf("counter event with %d series: %v", len(e["args"].(map[string]any)), e)
		}
	}
	maxR, _, _ := counterMax(evs, "cuda:0 reserved", "reserved")
	if maxR < maxA {
		t.Errorf("reserved max %v < allocated max %v", maxR, maxA)
	}
	if _, _, n := counterMax(evs, "host memory", "rss"); n == 0 {
		t.Error("no host RSS samples")
	}
	want := map[string]bool{
		`x = tensor.zeros([64, 1024, 1024], device="cuda")`: false,
		`r = trial(big, name="too big")`:                    false,
		"too big":                                           false,
		"block":                                             false,
		"OOM cuda:0":                                        false,
	}
	for _, e := range evs {
		name, _ := e["name"].(string)
		if _, ok := want[name]; !ok {
			continue
		}
		want[name] = true
		args, _ := e["args"].(map[string]any)
		switch name {
		case "too big":
			if e["ph"] != "X" || e["cat"] != "trial" || args["status"] != "oom" || e["tid"].(float64) != 2 {
				t.Errorf("trial slice: %v", e)
			}
		case "block":
			if e["cat"] != "experiment" || args["cuda:0 peak"].(float64) != 356*(1<<20) {
				t.Errorf("experiment slice: %v", e)
			}
		case "OOM cuda:0":
			if e["ph"] != "i" || args["requested"].(float64) != 2<<30 {
				t.Errorf("OOM instant: %v", e)
			}
		default:
			if pos, _ := args["pos"].(string); e["ph"] != "X" || e["cat"] != "statement" || !strings.Contains(pos, "job.star:") {
				t.Errorf("statement slice: %v", e)
			}
		}
	}
	for name, seen := range want {
		if !seen {
			t.Errorf("no event %q in the trace", name)
		}
	}
}

// The trace stays within MaxEvents however many events happen, and its
// aggregated counters keep the exact peak.
func TestTraceBounded(t *testing.T) {
	tf, s := run(t, `cuda.reset_peak_memory_stats()
keep = []
for i in range(3000):
    b = cuda.malloc((i % 7 + 1) * 4096)
    if i % 3 == 0:
        keep.append(b)
    if i == 1777:
        spike = cuda.malloc(300 * MiB)
        spike = None
peak = cuda.max_memory_allocated()
final = cuda.memory_allocated()
`+strings.Repeat("z = 1\n", 400), trace.Options{MaxEvents: 1000})
	evs := tf.TraceEvents
	if len(evs) > 1000+3 {
		t.Errorf("%d events, bound 1000 (+3 metadata)", len(evs))
	}
	peak, _ := s.Get("peak").(interface{ String() string })
	maxA, lastA, _ := counterMax(evs, "cuda:0 memory", "allocated")
	if got := int64(maxA); peak == nil || peak.String() != formatInt(got) {
		t.Errorf("trace peak %d, cuda.max_memory_allocated() %v: the aggregated trace lost the peak", got, peak)
	}
	if final := s.Get("final").String(); formatInt(int64(lastA)) != final {
		t.Errorf("last allocated sample %v, final allocated %s", lastA, final)
	}
	if w, _ := tf.OtherData["window_us"].(float64); w <= 0 {
		t.Errorf("otherData.window_us = %v, want the aggregation window", tf.OtherData["window_us"])
	}
	if d, _ := tf.OtherData["dropped_slices"].(float64); d < 150 {
		t.Errorf("otherData.dropped_slices = %v; 400+ statements must overflow 250 slices", d)
	}
}

func formatInt(n int64) string {
	b, _ := json.Marshal(n)
	return string(b)
}
