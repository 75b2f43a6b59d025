// Package trace records a Session's memory timeline and writes it in the
// Chrome Trace Event format (JSON), which Perfetto UI (ui.perfetto.dev) and
// chrome://tracing open (--trace FILE.json).
//
// The trace holds, in process "memsh":
//
//   - counter tracks "cuda:N memory" (series allocated and reserved: the
//     caching allocator's allocated_bytes and reserved_bytes after every
//     allocation, free and segment change) and "host memory" (series rss:
//     the process's resident set size, sampled every HostInterval and at
//     every statement boundary; with a simulated GPU it includes the
//     simulator's resident data);
//   - slices on thread "statements" for every top-level statement (named by
//     its first source line) and on thread "experiments and trials" for
//     every experiment and trial (status, error, parameters and peaks in
//     args);
//   - instant events "OOM cuda:N" for every out-of-memory error.
//
// The size is bounded: at most MaxEvents events (DefaultMaxEvents, about
// 100 bytes each). A quarter of the budget holds slices and instants,
// oldest dropped first (their number is in otherData.dropped_slices); the
// rest holds counter samples, exact until the budget is reached, then
// aggregated into windows of doubling length that keep each window's
// maximum and last value, so no peak is ever lost (otherData.window_us is
// the final window length).
package trace

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/memsh/memsh/backend"
	"github.com/memsh/memsh/backend/host"
	"github.com/memsh/memsh/env"
	"github.com/memsh/memsh/fsafe"
	"github.com/memsh/memsh/record"
)

// DefaultMaxEvents bounds a trace's events (about 20 MB of JSON).
const DefaultMaxEvents = 200_000

// DefaultHostInterval is how often host RSS is sampled.
const DefaultHostInterval = 10 * time.Millisecond

// Options configure a Recorder.
type Options struct {
	// MaxEvents bounds the number of events written (0 means
	// DefaultMaxEvents; values below 1000 are raised to 1000).
	MaxEvents int
	// HostInterval is the host RSS sampling period (0 means
	// DefaultHostInterval; negative: sample only at statement boundaries).
	HostInterval time.Duration
	// Overwrite lets WriteFile replace an existing file that is not a
	// trace memsh wrote (memsh --force).
	Overwrite bool
}

// Thread ids of the trace's tracks.
const (
	pid       = 1
	tidStmt   = 1
	tidBlocks = 2
)

// Event is one Trace Event Format event.
type Event struct {
	Name string         `json:"name"`
	Cat  string         `json:"cat,omitempty"`
	Ph   string         `json:"ph"`
	Ts   json.Number    `json:"ts"`            // microseconds since the trace started
	Dur  *json.Number   `json:"dur,omitempty"` // complete events ("X"), microseconds
	Pid  int            `json:"pid"`
	Tid  int            `json:"tid"`
	S    string         `json:"s,omitempty"` // instant events' scope
	Args map[string]any `json:"args,omitempty"`
}

// Recorder records one Session's timeline. Start it with Start; it is safe
// for the Session's goroutine and its own sampler to use concurrently.
type Recorder struct {
	mu       sync.Mutex
	start    time.Time
	opts     Options
	counters *counters
	host     *track
	devices  map[string][2]*track // "cuda:0" -> its allocated and reserved tracks

	slices    []Event // ring buffer of slices and instants
	head      int     // index of the oldest when full
	maxSlices int
	dropped   int

	stmtStart time.Time
	sources   map[string][]string
	removes   []func()
	stop      chan struct{}
	done      chan struct{}
}

// Start begins recording the memory events of e's Manager and, when e
// belongs to a Session, its statements, experiments and trials.
func Start(e *env.Env, opts Options) *Recorder {
	if opts.MaxEvents == 0 {
		opts.MaxEvents = DefaultMaxEvents
	}
	opts.MaxEvents = max(opts.MaxEvents, 1000)
	if opts.HostInterval == 0 {
		opts.HostInterval = DefaultHostInterval
	}
	r := &Recorder{start: time.Now(), opts: opts, sources: map[string][]string{}, devices: map[string][2]*track{}}
	r.maxSlices = opts.MaxEvents / 4
	r.counters = newCounters((opts.MaxEvents - r.maxSlices - 16) / 2)
	r.host = r.counters.track("host memory", "rss")
	m := e.Manager
	for i := 0; i < m.NumGPUs(); i++ {
		a := m.GPU(i)
		t := r.deviceTracks(a.Device().Name())
		r.counters.add(t[0], 0, a.Allocated(), 0)
		r.counters.add(t[1], 0, a.Reserved(), 0)
	}
	r.sampleHost()
	r.removes = append(r.removes, m.Observe(r.onMemory))
	if s := e.Session; s != nil {
		r.removes = append(r.removes, s.OnStatement(r.onStatement), s.OnFinish(r.onFinish))
	}
	if opts.HostInterval > 0 {
		r.stop, r.done = make(chan struct{}), make(chan struct{})
		go r.sampler(opts.HostInterval)
	}
	return r
}

// Stop ends the recording; the Recorder can still be written.
func (r *Recorder) Stop() {
	for _, f := range r.removes {
		f()
	}
	r.removes = nil
	if r.stop != nil {
		close(r.stop)
		<-r.done
		r.stop = nil
	}
}

func (r *Recorder) sampler(every time.Duration) {
	defer close(r.done)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-r.stop:
			return
		case <-t.C:
			r.sampleHost()
		}
	}
}

// deviceTracks returns a device's two counter tracks, made on first use:
// "cuda:0 memory" with the one series "allocated", and "cuda:0 reserved"
// with the one series "reserved". Two counters, not one with two series:
// catapult (chrome://tracing) stacks the series of one counter, which would
// draw reserved on top of allocated. The allocated track keeps the name
// and series of the earlier single counter, so readers of
// "cuda:0 memory"/"allocated" (memsh plot's OOM markers) go on working;
// Perfetto names the tracks "cuda:0 memory allocated" and
// "cuda:0 reserved reserved" (counter name, space, series).
func (r *Recorder) deviceTracks(dev string) [2]*track {
	t, ok := r.devices[dev]
	if !ok {
		t = [2]*track{r.counters.track(dev+" memory", "allocated"), r.counters.track(dev+" reserved", "reserved")}
		r.devices[dev] = t
	}
	return t
}

func (r *Recorder) now() int64 { return int64(time.Since(r.start)) }

func (r *Recorder) sampleHost() {
	rss, err := host.RSS()
	if err != nil {
		return
	}
	r.mu.Lock()
	r.counters.add(r.host, r.now(), rss, 0)
	r.mu.Unlock()
}

// onMemory runs synchronously for every memory event, with the Manager
// locked.
func (r *Recorder) onMemory(e backend.Event) {
	if e.Device == "cpu" {
		return // host tensors show in host RSS
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	ts := r.now()
	t := r.deviceTracks(e.Device)
	r.counters.add(t[0], ts, e.Allocated, 0)
	r.counters.add(t[1], ts, e.Reserved, 0)
	if e.Kind == backend.EventOOM {
		r.addSlice(Event{Name: "OOM " + e.Device, Cat: "oom", Ph: "i", S: "p", Ts: us(ts), Pid: pid, Tid: tidBlocks,
			Args: map[string]any{"requested": e.Size, "allocated": e.Allocated, "reserved": e.Reserved}})
	}
}

func (r *Recorder) onStatement(e env.StatementEvent) {
	if e.Start {
		r.sampleHost()
		r.stmtStart = time.Now()
		return
	}
	end := r.now()
	r.sampleHost()
	begin := int64(r.stmtStart.Sub(r.start))
	args := map[string]any{"pos": e.Pos.String()}
	if e.Err != nil {
		args["error"] = e.Err.Error()
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.addSlice(Event{Name: r.statementName(e), Cat: "statement", Ph: "X", Ts: us(begin), Dur: durUS(end - begin),
		Pid: pid, Tid: tidStmt, Args: args})
}

func (r *Recorder) onFinish(e env.FinishEvent) {
	end := r.now()
	var begin int64
	args := map[string]any{"status": e.Status}
	if e.Error != "" {
		args["error"] = e.Error
	}
	if len(e.Params) > 0 {
		if p, err := record.Params(e.Params); err == nil {
			args["params"] = p
		}
	}
	if d := e.Data; d != nil {
		begin = end - int64(d.Time)
		for _, g := range d.GPUs {
			args[g.Device+" peak"] = g.Peak
		}
		args["host peak"] = d.Host.Peak
	}
	if len(e.Leaks) > 0 {
		args["leaks"] = e.Leaks
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.addSlice(Event{Name: e.Name, Cat: e.Kind, Ph: "X", Ts: us(max(begin, 0)), Dur: durUS(end - max(begin, 0)),
		Pid: pid, Tid: tidBlocks, Args: args})
}

// addSlice appends to the ring buffer of slices, dropping the oldest when
// it is full. r.mu is held.
func (r *Recorder) addSlice(e Event) {
	if len(r.slices) < r.maxSlices {
		r.slices = append(r.slices, e)
		return
	}
	r.slices[r.head] = e
	r.head = (r.head + 1) % len(r.slices)
	r.dropped++
}

// statementName is the statement's first source line (at most 80
// characters), or its position when the source cannot be read.
func (r *Recorder) statementName(e env.StatementEvent) string {
	file := e.Pos.Filename()
	lines, ok := r.sources[file]
	if !ok && file != "" && !strings.HasPrefix(file, "<") {
		if data, err := os.ReadFile(file); err == nil {
			lines = strings.Split(string(data), "\n")
		}
		r.sources[file] = lines
	}
	if l := int(e.Pos.Line); l >= 1 && l <= len(lines) {
		if s := strings.TrimSpace(lines[l-1]); s != "" {
			if len(s) > 80 {
				s = s[:77] + "..."
			}
			return s
		}
	}
	return fmt.Sprintf("%s:%d", filepath.Base(file), e.Pos.Line)
}

func us(ns int64) json.Number {
	return json.Number(strconv.FormatFloat(float64(ns)/1000, 'f', 3, 64))
}

func durUS(ns int64) *json.Number {
	d := us(max(ns, 0))
	return &d
}

// Events returns every event the trace would write, metadata first, then
// by time.
func (r *Recorder) Events() []Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	evs := []Event{
		{Name: "process_name", Ph: "M", Ts: "0", Pid: pid, Args: map[string]any{"name": "memsh"}},
		{Name: "thread_name", Ph: "M", Ts: "0", Pid: pid, Tid: tidStmt, Args: map[string]any{"name": "statements"}},
		{Name: "thread_name", Ph: "M", Ts: "0", Pid: pid, Tid: tidBlocks, Args: map[string]any{"name": "experiments and trials"}},
	}
	type timed struct {
		ts int64
		e  Event
	}
	var body []timed
	for _, t := range r.counters.tracks {
		for _, w := range t.windows {
			body = append(body, timed{w.maxTs, counterEvent(t, w.maxTs, w.max)})
			if w.points() == 2 {
				body = append(body, timed{w.lastTs, counterEvent(t, w.lastTs, w.last)})
			}
		}
	}
	for i := range r.slices {
		e := r.slices[(r.head+i)%len(r.slices)]
		f, _ := e.Ts.Float64()
		body = append(body, timed{int64(f * 1000), e})
	}
	sort.SliceStable(body, func(i, j int) bool { return body[i].ts < body[j].ts })
	for _, b := range body {
		evs = append(evs, b.e)
	}
	return evs
}

func counterEvent(t *track, ts int64, v [2]uint64) Event {
	args := map[string]any{t.keys[0]: v[0]}
	if len(t.keys) > 1 {
		args[t.keys[1]] = v[1]
	}
	return Event{Name: t.name, Ph: "C", Ts: us(ts), Pid: pid, Args: args}
}

// WriteTo writes the trace as a JSON object {"traceEvents": [...],
// "displayTimeUnit": "ms", "otherData": {...}}.
func (r *Recorder) WriteTo(w io.Writer) (int64, error) {
	evs := r.Events()
	r.mu.Lock()
	other := map[string]any{
		"tool":           "memsh",
		"max_events":     r.opts.MaxEvents,
		"window_us":      float64(r.counters.res) / 1000,
		"dropped_slices": r.dropped,
		"start":          r.start.UTC().Format(time.RFC3339Nano),
	}
	r.mu.Unlock()
	cw := &countWriter{w: w}
	bw := bufio.NewWriter(cw)
	enc := json.NewEncoder(bw)
	enc.SetEscapeHTML(false)
	bw.WriteString("{\"traceEvents\":[\n")
	for i, e := range evs {
		if i > 0 {
			bw.WriteString(",")
		}
		if err := enc.Encode(e); err != nil {
			return cw.n, err
		}
	}
	bw.WriteString("],\n\"displayTimeUnit\":\"ms\",\n\"otherData\":")
	if err := enc.Encode(other); err != nil {
		return cw.n, err
	}
	bw.WriteString("}\n")
	err := bw.Flush()
	return cw.n, err
}

// WriteFile writes the trace to path through a temporary file synced and
// renamed into place, so a reader never sees half a trace and a failed
// write leaves the previous trace whole. An existing file that is not a
// trace memsh wrote is not replaced unless Options.Overwrite.
func (r *Recorder) WriteFile(path string) error {
	return fsafe.WriteFile(path, fsafe.Trace, r.opts.Overwrite, func(w io.Writer) error {
		_, err := r.WriteTo(w)
		return err
	})
}

type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

func init() { fsafe.RegisterVerifier(fsafe.Trace, Verify) }

// Verify proves that r holds a trace memsh wrote: one JSON object with a
// traceEvents array and otherData.tool "memsh", and nothing after it.
func Verify(r io.Reader) error {
	var t struct {
		TraceEvents []json.RawMessage `json:"traceEvents"`
		OtherData   struct {
			Tool string `json:"tool"`
		} `json:"otherData"`
	}
	dec := json.NewDecoder(r)
	if err := dec.Decode(&t); err != nil {
		return errors.New("not a JSON trace")
	}
	if t.TraceEvents == nil || t.OtherData.Tool != "memsh" {
		return errors.New("no memsh mark (otherData.tool)")
	}
	if _, err := dec.Token(); err != io.EOF {
		return errors.New("something after the trace object")
	}
	return nil
}
