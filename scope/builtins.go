package scope

import (
	"errors"
	"fmt"
	"sort"
	"strings"

	"go.starlark.net/starlark"
	"go.starlark.net/starlarkstruct"

	"github.com/memsh/memsh/backend"
	"github.com/memsh/memsh/env"
	"github.com/memsh/memsh/env/refpath"
	"github.com/memsh/memsh/tensor"
)

// sessionBuiltins are the global builtins made of the Session itself:
// experiment, trial and globals.
func (s *Session) sessionBuiltins() starlark.StringDict {
	return starlark.StringDict{
		"experiment": starlark.NewBuiltin("experiment", experimentBuiltin),
		"trial":      starlark.NewBuiltin("trial", trialBuiltin),
		"globals":    starlark.NewBuiltin("globals", globalsBuiltin),
		"help":       starlark.NewBuiltin("help", helpBuiltin),
	}
}

func threadSession(thread *starlark.Thread, builtin string) (*Session, error) {
	if s := sessionOf(thread); s != nil {
		return s, nil
	}
	return nil, fmt.Errorf("%s: no memsh session on this thread", builtin)
}

// experiment(name="", keep=[], quiet=False, empty_cache=True) opens an experiment block and
// returns its handle: .name, .running, .keep(*names), .data(), .finish().
// Every name bound while it is open is recorded: at finish, created names
// are deleted, names that existed before are restored to their earlier
// values, and names passed to keep (here or with .keep) stay — also through
// the finish of experiments nested in this one. keep names given here may be
// bound later in the block; .keep requires them to exist. At finish the GPU
// allocators' cache is released (cuda.empty_cache()) before Available is
// read, as ipyexperiments does, unless empty_cache=False.
func experimentBuiltin(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	s, err := threadSession(thread, b.Name())
	if err != nil {
		return nil, err
	}
	var name string
	var keep starlark.Value
	var quiet bool
	emptyCache := true
	if err := starlark.UnpackArgs("experiment", args, kwargs, "name?", &name, "keep?", &keep, "quiet?", &quiet, "empty_cache?", &emptyCache); err != nil {
		return nil, err
	}
	var names []string
	if keep != nil {
		it, ok := keep.(starlark.Iterable)
		if _, isStr := keep.(starlark.String); isStr || !ok {
			return nil, fmt.Errorf("experiment: for parameter keep: got %s, want list of strings", keep.Type())
		}
		iter := it.Iterate()
		var x starlark.Value
		for iter.Next(&x) {
			n, ok := starlark.AsString(x)
			if !ok {
				iter.Done()
				return nil, fmt.Errorf("experiment: for parameter keep: got %s element, want string", x.Type())
			}
			names = append(names, n)
		}
		iter.Done()
	}
	s.finishReopened(thread)
	if name == "" {
		s.unnamed++
		name = fmt.Sprintf("experiment %d", s.unnamed)
	}
	return s.open(thread, name, names, quiet, emptyCache), nil
}

// finishReopened applies ipyexperiments' re-run rule: when this call is the
// right-hand side of `NAME = experiment(...)` and NAME is bound to an open
// experiment, that experiment finishes first (printing its report), as
// re-running a cell that creates an IPyExperiments object does.
func (s *Session) finishReopened(thread *starlark.Thread) {
	if !s.running || thread != s.thread || s.reopen == nil || thread.CallStackDepth() < 2 {
		return
	}
	name, ok := s.reopen[keyOf(thread.CallFrame(1).Pos)]
	if !ok {
		return
	}
	if old, ok := s.currentView()[name].(*Experiment); ok && old.running {
		_, _ = old.finish(thread, nil)
	}
}

// trial(fn, *args, name="", **kwargs) runs fn(*args, **kwargs) inside a
// fresh quiet experiment block, finishes it, and returns
// struct(name, status, error, value, data): status is "ok", "oom" (the
// call ran out of device or host memory; error holds the PyTorch-style
// message) or "error" (any other failure); value is fn's result (None on
// failure, or what the failure carries: trial(nn.track, fn, ...) gives
// the breakdown up to an out-of-memory error); data is the block's data
// as experiment.finish() returns it. An out-of-memory error is data, not
// a failure of trial.
func trialBuiltin(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	s, err := threadSession(thread, b.Name())
	if err != nil {
		return nil, err
	}
	if len(args) == 0 {
		return nil, fmt.Errorf("trial: missing argument for fn")
	}
	fn, ok := args[0].(starlark.Callable)
	if !ok {
		return nil, fmt.Errorf("trial: for parameter fn: got %s, want callable", args[0].Type())
	}
	name := ""
	var rest []starlark.Tuple
	for _, kv := range kwargs {
		if k, _ := starlark.AsString(kv[0]); k == "name" {
			n, ok := starlark.AsString(kv[1])
			if !ok {
				return nil, fmt.Errorf("trial: for parameter name: got %s, want string", kv[1].Type())
			}
			name = n
			continue
		}
		rest = append(rest, kv)
	}
	if name == "" {
		name = "trial " + fn.Name()
	}
	r, err := s.RunTrial(thread, name, fn, args[1:], rest, nil)
	if err != nil {
		return nil, err
	}
	return r.Value(), nil
}

// TrialResult is the outcome of one trial.
type TrialResult struct {
	Name   string
	Status string // "ok", "oom" or "error"
	Error  string
	Return starlark.Value // fn's result, None on failure
	Data   *env.Data
}

// Value returns struct(name, status, error, value, data).
func (r *TrialResult) Value() starlark.Value {
	var errv starlark.Value = starlark.None
	if r.Error != "" {
		errv = starlark.String(r.Error)
	}
	return starlarkstruct.FromStringDict(starlarkstruct.Default, starlark.StringDict{
		"name":   starlark.String(r.Name),
		"status": starlark.String(r.Status),
		"error":  errv,
		"value":  r.Return,
		"data":   r.Data.Value(),
	})
}

// RunTrial runs fn(args, kwargs) in a fresh quiet experiment named name and
// classifies the result; params are recorded with the trial's FinishEvent
// (a sweep's point). An interrupt (Ctrl-C) or step limit is not a trial
// outcome: it is returned as an error after the block is finished.
func (s *Session) RunTrial(thread *starlark.Thread, name string, fn starlark.Callable, args starlark.Tuple, kwargs []starlark.Tuple, params starlark.StringDict) (*TrialResult, error) {
	e := s.open(thread, name, nil, true, false)
	e.trial = true
	thread.DeclareTransparent() // the experiment is walked on the stack of open ones
	v, callErr := starlark.Call(thread, fn, args, kwargs)
	r := &TrialResult{Name: name, Status: "ok", Return: starlark.None}
	var extra []refpath.Root
	switch {
	case callErr == nil:
		r.Return = v
		extra = []refpath.Root{{Name: "<trial value>", Value: v}}
	case backend.IsOOM(callErr):
		r.Status, r.Error = "oom", oomMessage(callErr)
	default:
		r.Status, r.Error = "error", callErr.Error()
	}
	var ev env.ErrorValue
	if callErr != nil && errors.As(callErr, &ev) {
		r.Return = ev.ErrorValue() // what the failed call carries (nn.track's breakdown)
	}
	v = nil
	d, err := e.finish(thread, extra)
	if err != nil {
		return nil, err
	}
	r.Data = d
	if callErr != nil && isInterrupt(callErr) {
		return nil, callErr
	}
	s.finishEvent(env.FinishEvent{Kind: "trial", Name: name, Status: r.Status, Error: r.Error, Params: params, Data: d, Leaks: leakLines(e.outcome)})
	return r, nil
}

func oomMessage(err error) string {
	var o *backend.OOMError
	if errors.As(err, &o) {
		return o.Error()
	}
	return err.Error()
}

func isInterrupt(err error) bool {
	var ee *starlark.EvalError
	if errors.As(err, &ee) {
		err = ee.Unwrap()
	}
	return err != nil && (errors.Is(err, tensor.ErrInterrupted) || strings.Contains(err.Error(), "Starlark computation cancelled") || strings.Contains(err.Error(), "too many steps"))
}

func sortedKeys(m map[string]starlark.Value) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// Help is what help() prints: the main builtins in one screen. The REPL's
// :help prints it with the colon commands.
const Help = `memsh: Starlark with memory experiments.
  experiment(name)       open an experiment block; e.finish() reports and cleans up
  trial(fn, *args)       run fn in a block; OOM is data
  tensor.zeros(shape, dtype="float32", device="cuda")   (the default device is "cpu")
  cuda.memory_allocated(), cuda.memory_stats(), gc(), globals(), fmt_bytes(n)
  load("lib.star", "name")   a Starlark file from the script's directory (or --load-path)
  a += b                 in place on tensors, as in PyTorch`

// help() prints Help.
func helpBuiltin(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	if err := starlark.UnpackArgs("help", args, kwargs); err != nil {
		return nil, err
	}
	if thread.Print != nil {
		thread.Print(thread, Help)
	}
	return starlark.None, nil
}

// globals() returns a new dict of the user globals (memsh's builtins are
// not included).
func globalsBuiltin(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	s, err := threadSession(thread, b.Name())
	if err != nil {
		return nil, err
	}
	if err := starlark.UnpackArgs("globals", args, kwargs); err != nil {
		return nil, err
	}
	view := s.currentView()
	d := starlark.NewDict(len(view))
	for _, k := range sortedKeys(view) {
		_ = d.SetKey(starlark.String(k), view[k])
	}
	return d, nil
}
