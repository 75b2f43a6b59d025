// Package log is memsh's per-input logger and the Starlark module `log`:
// after each REPL input or top-level script statement it prints host and
// GPU memory consumed, peaked and used, the wall time and the mean and
// busiest-core CPU %, as ipygpulogger, ipyexperiments' CellLogger and
// ipython_memory_usage do in IPython — with exact peaks (see Logger).
//
// The CLI turns it on with --log or --log=compact, the REPL with
// :log on|compact|off; Go code with Start and Stop.
package log

import (
	"fmt"
	"io"
	"math"

	"go.starlark.net/starlark"
	"go.starlark.net/starlarkstruct"
	"go.starlark.net/syntax"

	bhost "github.com/memsh/memsh/backend/host"
	"github.com/memsh/memsh/env"
	"github.com/memsh/memsh/starlib/numarg"
)

// Module is the log module:
//
//	log.start(compact=False, seed=None, perf=None)
//	                          log every following top-level statement (and
//	                          the rest of this one); compact=True prints one
//	                          line per statement. Calling it while logging
//	                          switches the form (and the seed and counters
//	                          when given). seed=N reseeds the random
//	                          generators (tensor.manual_seed) before every
//	                          input, as CellLogger's cl_set_seed, so each
//	                          input is reproducible; seed=False stops that.
//	                          perf=True counts cache-misses per input,
//	                          perf=["instructions", ...] any `perf list`
//	                          names (ipython_memory_usage's perf variant,
//	                          through perf_event_open): the line shows each
//	                          count per second of wall time; perf=False
//	                          stops counting. An error says why when the
//	                          kernel forbids counters (perf_event_paranoid).
//	log.stop()                stop logging (nothing is printed for the
//	                          statement that stops it)
//	log.running()             whether the logger is on
//	log.data()                the last logged statement's figures, or None:
//	                          struct(name, time, host, gpu, gpus, cpu_mean,
//	                          cpu_max, cpu_process), name the statement's
//	                          "file:line", time in seconds, host, gpu and
//	                          each of gpus a struct(device, used, consumed,
//	                          peak, peaked, reclaimed, available) in bytes,
//	                          CPU figures in percent (cpu_mean and cpu_max
//	                          system-wide, the busiest core for cpu_max),
//	                          perf a dict {event: count} (empty without
//	                          perf=), and ipygpulogger's fields, in bytes
//	                          and seconds: gen_mem_used_delta,
//	                          gen_mem_peaked, gen_mem_used (host),
//	                          gpu_mem_used_delta, gpu_mem_peaked,
//	                          gpu_mem_used (the current GPU; 0 without
//	                          one), time_delta; *_peaked is its definition,
//	                          max(0, peak - used at the end); CellLogger's
//	                          cpu_mem_used_delta, cpu_mem_peaked_delta,
//	                          cpu_mem_used_total, gpu_mem_peaked_delta,
//	                          gpu_mem_used_total (*_peaked_delta is memsh's
//	                          peaked)
var Module = &starlarkstruct.Module{
	Name: "log",
	Members: starlark.StringDict{
		"start":   starlark.NewBuiltin("log.start", start),
		"stop":    starlark.NewBuiltin("log.stop", stop),
		"running": starlark.NewBuiltin("log.running", running),
		"data":    starlark.NewBuiltin("log.data", data),
	},
}

type state struct {
	logger *Logger
	last   *Record
	seed   *int64 // reseed before every input
}

const valuesKey = "log"

func stateOf(e *env.Env) *state {
	if s, ok := e.Values[valuesKey].(*state); ok {
		return s
	}
	s := &state{}
	e.Values[valuesKey] = s
	return s
}

// Start turns the logger of e's Session on (compact: one line per
// statement), or switches its form if it is already on. The statement
// running now, if any, is measured from here and logged when it ends.
func Start(e *env.Env, compact bool) error {
	return StartWith(e, Options{Compact: compact})
}

// Options configure the logger (StartWith).
type Options struct {
	Compact bool
	// Perf names the hardware or software counters to report per input
	// (`perf list` names; see backend/host.ParsePerfEvent); nil counts
	// nothing, and KeepPerf keeps the counters of a running logger.
	Perf     []string
	KeepPerf bool
	// Out is where the lines go (nil: the session's output). The CLI's
	// --log writes to stderr or --log-file, so that stdout stays the
	// script's own output.
	Out io.Writer
}

// StartTo is Start with the lines written to w instead of the session's
// output.
func StartTo(e *env.Env, compact bool, w io.Writer) error {
	return StartWith(e, Options{Compact: compact, Out: w})
}

// StartWith is Start with options. With Perf it fails, without starting
// the logger, when the kernel refuses the counters; the error says why
// (naming perf_event_paranoid).
func StartWith(e *env.Env, o Options) error {
	return startAt(e, o, syntax.Position{})
}

// SetSeed makes the logger reseed the session's random generators with
// seed before every input (CellLogger's cl_set_seed), from the next input
// on, while the logger is on; it is kept across log.stop() and log.start().
// The REPL's `:log seed N` calls it. The generators are reseeded through
// env.Env.Seed (nothing happens while that is nil).
func SetSeed(e *env.Env, seed int64) { stateOf(e).seed = &seed }

// ClearSeed stops the reseeding (`:log seed off`).
func ClearSeed(e *env.Env) { stateOf(e).seed = nil }

// SeedOf returns the seed the logger reseeds with, if any.
func SeedOf(e *env.Env) (int64, bool) {
	if p := stateOf(e).seed; p != nil {
		return *p, true
	}
	return 0, false
}

// PerfEvents returns the counters the running logger reports (nil if none
// or off).
func PerfEvents(e *env.Env) []string {
	l := stateOf(e).logger
	if l == nil || l.perf == nil {
		return nil
	}
	var out []string
	for _, ev := range l.perf.Events() {
		out = append(out, ev.Name)
	}
	return out
}

// startAt is StartWith for the statement at pos.
func startAt(e *env.Env, o Options, pos syntax.Position) error {
	if e.Session == nil {
		return fmt.Errorf("log: no memsh session")
	}
	var perf *bhost.PerfCounters
	if len(o.Perf) > 0 {
		p, err := bhost.OpenPerf(o.Perf)
		if err != nil {
			return err
		}
		perf = p
	}
	s := stateOf(e)
	if l := s.logger; l != nil {
		l.compact = o.Compact
		if !o.KeepPerf {
			l.setPerf(perf)
		} else if perf != nil {
			perf.Close()
		}
		return nil
	}
	e.Manager.Reclaim()
	l := newLogger(e, o.Compact)
	l.setPerf(perf)
	l.out = o.Out
	l.remove = e.Session.OnStatement(l.onStatement)
	s.logger = l
	l.begin(pos)
	return nil
}

// Stop turns the logger off; it reports whether it was on.
func Stop(e *env.Env) bool {
	s := stateOf(e)
	if s.logger == nil {
		return false
	}
	s.logger.close()
	s.logger = nil
	return true
}

// Mode returns "off", "on" or "compact".
func Mode(e *env.Env) string {
	s := stateOf(e)
	switch {
	case s.logger == nil:
		return "off"
	case s.logger.compact:
		return "compact"
	}
	return "on"
}

// Last returns the last logged statement's record, or nil.
func Last(e *env.Env) *Record { return stateOf(e).last }

func start(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	var compact bool
	var seedV, perfV starlark.Value = starlark.None, starlark.None
	if len(args) > 1 { // seed and perf are keyword-only
		return nil, fmt.Errorf("%s: got %d arguments, want at most 1", b.Name(), len(args))
	}
	if err := starlark.UnpackArgs(b.Name(), args, kwargs, "compact?", &compact, "seed?", &seedV, "perf?", &perfV); err != nil {
		return nil, err
	}
	e, err := env.Of(thread, b.Name())
	if err != nil {
		return nil, err
	}
	o := Options{Compact: compact, KeepPerf: perfV == starlark.None}
	switch v := perfV.(type) {
	case starlark.NoneType:
	case starlark.Bool:
		if v {
			o.Perf = []string{bhost.DefaultPerfEvent}
		}
	case starlark.String:
		o.Perf = []string{string(v)}
	case *starlark.List, starlark.Tuple:
		it := starlark.Iterate(v)
		defer it.Done()
		var x starlark.Value
		for it.Next(&x) {
			name, ok := starlark.AsString(x)
			if !ok {
				return nil, fmt.Errorf("%s: for parameter perf: got a list with %s, want event names (strings)", b.Name(), x.Type())
			}
			o.Perf = append(o.Perf, name)
		}
	default:
		return nil, fmt.Errorf("%s: for parameter perf: got %s, want bool, string or list of event names", b.Name(), perfV.Type())
	}
	var seed *int64
	switch v := seedV.(type) {
	case starlark.NoneType:
	case starlark.Bool:
		if v {
			return nil, fmt.Errorf("%s: for parameter seed: got True, want an int (or False to stop reseeding)", b.Name())
		}
	default:
		n, err := numarg.Count(b.Name(), "seed", v, math.MinInt64, math.MaxInt64)
		if err != nil {
			return nil, err
		}
		seed = &n
	}
	var pos syntax.Position
	if st := thread.CallStack(); len(st) > 0 {
		pos = st[0].Pos // the top-level statement
	}
	if err := startAt(e, o, pos); err != nil {
		return nil, fmt.Errorf("%s: %v", b.Name(), err)
	}
	if seed != nil {
		SetSeed(e, *seed)
	} else if seedV == starlark.False {
		ClearSeed(e)
	}
	return starlark.None, nil
}

func stop(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	e, err := env.NoArgs(thread, b, args, kwargs)
	if err != nil {
		return nil, err
	}
	Stop(e)
	return starlark.None, nil
}

func running(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	e, err := env.NoArgs(thread, b, args, kwargs)
	if err != nil {
		return nil, err
	}
	return starlark.Bool(Mode(e) != "off"), nil
}

func data(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	e, err := env.NoArgs(thread, b, args, kwargs)
	if err != nil {
		return nil, err
	}
	r := Last(e)
	if r == nil {
		return starlark.None, nil
	}
	return r.Value(), nil
}

// Value returns the record as log.data() does.
func (r *Record) Value() starlark.Value {
	d := r.Data.Value().(*starlarkstruct.Struct)
	fields := starlark.StringDict{}
	d.ToStringDict(fields)
	fields["cpu_mean"] = starlark.Float(r.CPU.SystemPercent)
	fields["cpu_max"] = starlark.Float(r.CPU.MaxCorePercent)
	fields["cpu_process"] = starlark.Float(r.CPU.ProcessPercent)
	perf := starlark.NewDict(len(r.Perf))
	for _, c := range r.Perf {
		_ = perf.SetKey(starlark.String(c.Event), starlark.MakeUint64(c.Count))
	}
	fields["perf"] = perf
	// ipygpulogger's and CellLogger's names (docs/peers.md).
	h := r.Data.Host
	var g env.Figures
	if r.Data.GPU != nil {
		g = *r.Data.GPU
	}
	i := starlark.MakeInt64
	fields["gen_mem_used_delta"] = i(h.Consumed)
	fields["gen_mem_peaked"] = i(max(0, h.Peak-h.Used))
	fields["gen_mem_used"] = i(h.Used)
	fields["gpu_mem_used_delta"] = i(g.Consumed)
	fields["gpu_mem_peaked"] = i(max(0, g.Peak-g.Used))
	fields["gpu_mem_used"] = i(g.Used)
	fields["time_delta"] = starlark.Float(r.Data.Time.Seconds())
	fields["cpu_mem_used_delta"] = i(h.Consumed)
	fields["cpu_mem_peaked_delta"] = i(h.Peaked)
	fields["cpu_mem_used_total"] = i(h.Used)
	fields["gpu_mem_peaked_delta"] = i(g.Peaked)
	fields["gpu_mem_used_total"] = i(g.Used)
	return starlarkstruct.FromStringDict(starlarkstruct.Default, fields)
}
