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

	"go.starlark.net/starlark"
	"go.starlark.net/starlarkstruct"
	"go.starlark.net/syntax"

	"github.com/memsh/memsh/env"
)

// Module is the log module:
//
//	log.start(compact=False)  log every following top-level statement (and
//	                          the rest of this one); compact=True prints one
//	                          line per statement. Calling it while logging
//	                          switches the form.
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
//	                          system-wide, the busiest core for cpu_max)
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
	return startAt(e, compact, syntax.Position{}, nil)
}

// StartTo is Start with the lines written to w instead of the session's
// output (the CLI's --log writes to stderr or --log-file, so that stdout
// stays the script's own output).
func StartTo(e *env.Env, compact bool, w io.Writer) error {
	return startAt(e, compact, syntax.Position{}, w)
}

// startAt is Start for the statement at pos, writing to w (nil: e.Out).
func startAt(e *env.Env, compact bool, pos syntax.Position, w io.Writer) error {
	if e.Session == nil {
		return fmt.Errorf("log: no memsh session")
	}
	s := stateOf(e)
	if s.logger != nil {
		s.logger.compact = compact
		return nil
	}
	e.Manager.Reclaim()
	l := newLogger(e, compact)
	l.out = w
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
	if err := starlark.UnpackArgs(b.Name(), args, kwargs, "compact?", &compact); err != nil {
		return nil, err
	}
	e, err := env.Of(thread, b.Name())
	if err != nil {
		return nil, err
	}
	var pos syntax.Position
	if st := thread.CallStack(); len(st) > 0 {
		pos = st[0].Pos // the top-level statement
	}
	if err := startAt(e, compact, pos, nil); err != nil {
		return nil, fmt.Errorf("%s: %v", b.Name(), err)
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
	return starlarkstruct.FromStringDict(starlarkstruct.Default, fields)
}
