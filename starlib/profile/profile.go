// Package profile is memsh's line-level memory profiler, pytorch_memlab's
// LineProfiler for Starlark: the global builtins profile, profiled and
// profile_report.
//
//	profile(fn, *args, **kwargs)   call fn once under the profiler, print its
//	                               tables and return fn's result
//	p = profiled(fn)               a function that profiles every call of
//	                               fn: p(*args, **kwargs) returns fn's result
//	p.report(columns=None)         print p's tables (maxima across calls)
//	p.data(columns=None)           the same figures as a list of
//	                               struct(function, file, line, device, lines),
//	                               lines a dict {line: {column: value}}
//	p.reset()                      forget p's calls; p.calls, p.fn
//	profile_report(columns=None)   print the tables of every profiled function
//	                               of the session still referenced
//	profiled(fn, every=N)          also print the tables (maxima so far) after
//	                               every N-th call
//	profile_every(N)               pytorch_memlab's @profile_every(N): returns
//	                               a function w, w(fn) == profiled(fn, every=N)
//	                               (Starlark has no decorators: f = profile_every(2)(f))
//
// A table covers one Starlark function on one device ("cpu" or a GPU) and
// has a row per source line: fn's own lines and those of every function it
// calls, each function in its own table. Figures are attributed from
// allocation call sites: the Manager reports every allocation, free and
// segment event synchronously, and the profiler charges it to the current
// line of every Starlark function on the call stack, so a line that calls a
// function is charged with what the callee did.
//
// Columns are cuda.memory_stats() keys (stat.pool.field or a scalar), by
// default active_bytes.all.peak, reserved_bytes.all.peak,
// allocated_bytes.all.allocated and allocation.all.allocated. For a line:
// .peak is the highest level reached right after an allocation charged to
// it (blank if none); .current the level after its last event; .allocated
// and .freed the sums of increases and decreases during it (bytes freed by
// a reclaim are charged to the line whose allocation reclaimed); num_ooms,
// num_device_alloc and num_device_free count events. A line executed
// several times in a call (a loop) accumulates; across calls each figure is
// the maximum over calls, as pytorch_memlab's @profile. active_* equals
// allocated_* (memsh frees at once), and inactive_split* and
// num_alloc_retries are not available per line.
//
// In exact peak mode (the default) an allocation during a profiled call
// that would raise a peak reclaims garbage first, so no line's peak
// includes memory a reference-counted runtime would already have freed;
// that costs a reclaim (a reach walk, rarely a full GC) per such
// allocation (see the benchmarks). --peak lazy skips it and says so.
//
// Source lines are read from the script file; for REPL inputs and -c code
// from the Session, which keeps their text.
package profile

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"weak"

	"go.starlark.net/starlark"
	"go.starlark.net/starlarkstruct"

	"github.com/memsh/memsh/backend"
	"github.com/memsh/memsh/env"
	"github.com/memsh/memsh/starlib/numarg"
)

// Builtins are the global builtins of the package.
var Builtins = starlark.StringDict{
	"profile":        starlark.NewBuiltin("profile", profileBuiltin),
	"profiled":       starlark.NewBuiltin("profiled", profiledBuiltin),
	"profile_report": starlark.NewBuiltin("profile_report", reportBuiltin),
	"profile_every":  starlark.NewBuiltin("profile_every", profileEvery),
}

func fnArg(builtin string, args starlark.Tuple) (*starlark.Function, error) {
	if len(args) == 0 {
		return nil, fmt.Errorf("%s: missing argument for fn", builtin)
	}
	switch fn := args[0].(type) {
	case *starlark.Function:
		return fn, nil
	case *Profiled:
		return fn.fn, nil
	}
	return nil, fmt.Errorf("%s: for parameter fn: got %s, want a Starlark function (def or lambda)", builtin, args[0].Type())
}

// profile(fn, *args, **kwargs) calls fn under the profiler, prints its
// tables (also when fn fails: the tables show where memory went before an
// out-of-memory error) and returns fn's result.
func profileBuiltin(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	fn, err := fnArg(b.Name(), args)
	if err != nil {
		return nil, err
	}
	e, err := env.Of(thread, b.Name())
	if err != nil {
		return nil, err
	}
	t := newTable(idOf(fn))
	v, err := call(e, thread, fn, args[1:], kwargs, t)
	if err == nil || len(t.lines) > 0 {
		t.write(e.Out, e.Session, defaultColumns(), e.Manager.PeakMode() == backend.PeakLazy)
	}
	return v, err
}

func defaultColumns() []column {
	cols := make([]column, len(DefaultColumns))
	for i, k := range DefaultColumns {
		cols[i], _ = parseColumn(k)
	}
	return cols
}

// columnsArg parses a columns argument: None or a list/tuple of
// memory_stats() keys.
// reportArgs unpacks (columns=None) for a report builtin and returns the
// columns and the thread's Env.
func reportArgs(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) ([]column, *env.Env, error) {
	var colsV starlark.Value
	if err := starlark.UnpackArgs(b.Name(), args, kwargs, "columns?", &colsV); err != nil {
		return nil, nil, err
	}
	cols, err := columnsArg(b.Name(), colsV)
	if err != nil {
		return nil, nil, err
	}
	e, err := env.Of(thread, b.Name())
	return cols, e, err
}

func columnsArg(builtin string, v starlark.Value) ([]column, error) {
	if v == nil || v == starlark.None {
		return defaultColumns(), nil
	}
	seq, ok := v.(starlark.Indexable)
	if _, isStr := v.(starlark.String); isStr || !ok {
		return nil, fmt.Errorf("%s: for parameter columns: got %s, want list of strings", builtin, v.Type())
	}
	if seq.Len() == 0 {
		return nil, fmt.Errorf("%s: for parameter columns: empty list", builtin)
	}
	cols := make([]column, seq.Len())
	for i := range cols {
		k, ok := starlark.AsString(seq.Index(i))
		if !ok {
			return nil, fmt.Errorf("%s: for parameter columns: got %s element, want string", builtin, seq.Index(i).Type())
		}
		c, err := parseColumn(k)
		if err != nil {
			return nil, fmt.Errorf("%s: for parameter columns: %v", builtin, err)
		}
		cols[i] = c
	}
	return cols, nil
}

// Profiled is the Starlark value profiled(fn) returns (type
// "profiled_function"): a callable that profiles every call of fn.
type Profiled struct {
	fn    *starlark.Function
	t     *table
	every int64 // print the tables after every every-th call; 0: never
}

var (
	_ starlark.Callable = (*Profiled)(nil)
	_ starlark.HasAttrs = (*Profiled)(nil)
)

// profiled(fn) returns a profiled function; see the package doc.
func profiledBuiltin(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	var fnv starlark.Value
	var everyV starlark.Value = starlark.MakeInt(0)
	if len(args) > 1 { // every is keyword-only
		return nil, fmt.Errorf("%s: got %d arguments, want at most 1", b.Name(), len(args))
	}
	if err := starlark.UnpackArgs(b.Name(), args, kwargs, "fn", &fnv, "every?", &everyV); err != nil {
		return nil, err
	}
	every, err := numarg.Count(b.Name(), "every", everyV, 0, math.MaxInt64)
	if err != nil {
		return nil, err
	}
	return newProfiled(thread, b, fnv, every)
}

func newProfiled(thread *starlark.Thread, b *starlark.Builtin, fnv starlark.Value, every int64) (starlark.Value, error) {
	fn, err := fnArg(b.Name(), starlark.Tuple{fnv})
	if err != nil {
		return nil, err
	}
	e, err := env.Of(thread, b.Name())
	if err != nil {
		return nil, err
	}
	p := &Profiled{fn: fn, t: newTable(idOf(fn)), every: every}
	reg := registryOf(e)
	reg.sweep()
	reg.list = append(reg.list, weak.Make(p))
	return p, nil
}

// CallInternal calls the function under the profiler.
func (p *Profiled) CallInternal(thread *starlark.Thread, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	e, err := env.Of(thread, p.Name())
	if err != nil {
		return nil, err
	}
	v, err := call(e, thread, p.fn, args, kwargs, p.t)
	if p.every > 0 && int64(p.t.calls)%p.every == 0 {
		p.t.write(e.Out, e.Session, defaultColumns(), e.Manager.PeakMode() == backend.PeakLazy)
	}
	return v, err
}

// profile_every(n) returns a function that wraps fn as profiled(fn,
// every=n): pytorch_memlab's @profile_every(n), which prints the line
// profile after every n-th call (maxima across all calls so far).
func profileEvery(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	var nV starlark.Value
	if err := starlark.UnpackArgs(b.Name(), args, kwargs, "n", &nV); err != nil {
		return nil, err
	}
	n, err := numarg.Count(b.Name(), "n", nV, 1, math.MaxInt64)
	if err != nil {
		return nil, err
	}
	return starlark.NewBuiltin(fmt.Sprintf("profile_every(%d)", n), func(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
		var fnv starlark.Value
		if err := starlark.UnpackArgs(b.Name(), args, kwargs, "fn", &fnv); err != nil {
			return nil, err
		}
		return newProfiled(thread, b, fnv, n)
	}), nil
}

func (p *Profiled) Name() string          { return p.fn.Name() }
func (p *Profiled) String() string        { return fmt.Sprintf("<profiled function %s>", p.fn.Name()) }
func (p *Profiled) Type() string          { return "profiled_function" }
func (p *Profiled) Freeze()               { p.fn.Freeze() }
func (p *Profiled) Truth() starlark.Bool  { return true }
func (p *Profiled) Hash() (uint32, error) { return 0, errors.New("unhashable type: profiled_function") }

// AttrNames implements starlark.HasAttrs.
func (p *Profiled) AttrNames() []string { return []string{"calls", "data", "fn", "report", "reset"} }

// Attr implements starlark.HasAttrs.
func (p *Profiled) Attr(name string) (starlark.Value, error) {
	switch name {
	case "calls":
		return starlark.MakeInt(p.t.calls), nil
	case "fn":
		return p.fn, nil
	case "report":
		return starlark.NewBuiltin("profiled_function.report", p.report).BindReceiver(p), nil
	case "data":
		return starlark.NewBuiltin("profiled_function.data", p.data).BindReceiver(p), nil
	case "reset":
		return starlark.NewBuiltin("profiled_function.reset", p.reset).BindReceiver(p), nil
	}
	return nil, nil
}

func (p *Profiled) report(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	cols, e, err := reportArgs(thread, b, args, kwargs)
	if err != nil {
		return nil, err
	}
	p.t.write(e.Out, e.Session, cols, e.Manager.PeakMode() == backend.PeakLazy)
	return starlark.None, nil
}

func (p *Profiled) reset(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	if err := starlark.UnpackArgs(b.Name(), args, kwargs); err != nil {
		return nil, err
	}
	p.t = newTable(idOf(p.fn))
	return starlark.None, nil
}

func (p *Profiled) data(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	var colsV starlark.Value
	if err := starlark.UnpackArgs(b.Name(), args, kwargs, "columns?", &colsV); err != nil {
		return nil, err
	}
	cols, err := columnsArg(b.Name(), colsV)
	if err != nil {
		return nil, err
	}
	return p.t.value(cols), nil
}

// value returns the tables as data: a list of struct(function, file, line,
// device, lines) with lines a dict {line: {column: value}} over the lines
// that had events (a .peak column is absent from lines without an
// allocation).
func (t *table) value(cols []column) starlark.Value {
	var out []starlark.Value
	for _, fn := range t.funcs {
		for _, dev := range t.devs[fn] {
			var nums []int
			for k := range t.lines {
				if k.fn == fn && k.dev == dev {
					nums = append(nums, int(k.line))
				}
			}
			slices.Sort(nums)
			lines := starlark.NewDict(len(nums))
			for _, n := range nums {
				a := t.lines[lineKey{fn: fn, dev: dev, line: int32(n)}]
				row := starlark.NewDict(len(cols))
				for _, c := range cols {
					if c.field == fPeak && c.scalar == scNone && !a.allocs {
						continue
					}
					_ = row.SetKey(starlark.String(c.key), starlark.MakeInt64(c.value(a)))
				}
				_ = lines.SetKey(starlark.MakeInt(n), row)
			}
			out = append(out, starlarkstruct.FromStringDict(starlarkstruct.Default, starlark.StringDict{
				"function": starlark.String(fn.name),
				"file":     starlark.String(fn.file),
				"line":     starlark.MakeInt(int(fn.line)),
				"device":   starlark.String(dev),
				"lines":    lines,
			}))
		}
	}
	return starlark.NewList(out)
}

// registry is the session's list of profiled functions, held weakly so it
// never keeps one (or what its function refers to) alive.
type registry struct{ list []weak.Pointer[Profiled] }

const valuesKey = "profile"

func registryOf(e *env.Env) *registry {
	r, _ := e.Values[valuesKey].(*registry)
	if r == nil {
		r = &registry{}
		e.Values[valuesKey] = r
	}
	return r
}

func (r *registry) sweep() {
	kept := r.list[:0]
	for _, w := range r.list {
		if w.Value() != nil {
			kept = append(kept, w)
		}
	}
	clear(r.list[len(kept):])
	r.list = kept
}

// profile_report(columns=None) prints the tables of every profiled
// function of the session that is still referenced, in creation order.
func reportBuiltin(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	cols, e, err := reportArgs(thread, b, args, kwargs)
	if err != nil {
		return nil, err
	}
	r := registryOf(e)
	r.sweep()
	n := 0
	for _, w := range r.list {
		if p := w.Value(); p != nil {
			p.t.write(e.Out, e.Session, cols, e.Manager.PeakMode() == backend.PeakLazy)
			n++
		}
	}
	if n == 0 {
		fmt.Fprintln(e.Out, "profile_report: no profiled functions")
	}
	return starlark.None, nil
}

// Reach walks the profiled function (env.Reacher): its defaults and
// captured variables.
func (p *Profiled) Reach(w *env.Walker) { w.Value(p.fn) }
