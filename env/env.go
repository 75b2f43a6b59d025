// Package env is the layer shared by the Session (package scope) and the
// Starlark bindings (package starlib and below): the session environment
// (Env), the Session's events (StatementEvent, FinishEvent), and memsh's
// memory figures (Figures, Data; measure.go). It sits below both, so neither
// imports the other. Env carries a Session's shared state to the Starlark
// modules that run on its thread: the memory Manager, the output writer and per-session
// module settings. Modules read it with env.Of(thread); the Session installs
// it with env.Install. Nothing here is process-wide, so two Sessions in one
// process never see each other.
package env

import (
	"fmt"
	"io"
	"os"

	"go.starlark.net/starlark"
	"go.starlark.net/syntax"

	"github.com/memsh/memsh/backend"
	"github.com/memsh/memsh/fsafe"
)

const threadKey = "memsh.env"

// Env is a Session's state shared with its Starlark modules.
type Env struct {
	Manager *backend.Manager
	Out     io.Writer // where print() and reports go
	Err     io.Writer // where notices and progress bars go
	Session Session   // the Session, for modules that observe it

	// Files is where builtins that write files (cuda.dump_snapshot) may
	// write them: nil means the working directory only; memsh's --out-dir
	// adds a directory.
	Files *fsafe.Policy

	// DefaultDevice is the device tensors are created on when none is
	// given (tensor.set_default_device). "cpu" as in PyTorch.
	DefaultDevice string

	// Seed, when set, reseeds the session's random generators as
	// tensor.manual_seed(seed) does (the Philox key, counter back to 0).
	// The module that owns the generator installs it (the tensor module);
	// the per-input logger's seed option (ipygpulogger's cl_set_seed,
	// log.start(seed=N), the REPL's :log seed N) calls it before every
	// input. Nil until installed: there is then nothing to reseed.
	Seed func(seed int64)

	// Modules may keep per-session state here, keyed by module name.
	Values map[string]any
}

// New returns an Env over m writing to out (os.Stdout if nil).
func New(m *backend.Manager, out io.Writer) *Env {
	if out == nil {
		out = os.Stdout
	}
	return &Env{Manager: m, Out: out, Err: os.Stderr, DefaultDevice: "cpu", Values: map[string]any{}}
}

// Install makes e the Env of thread.
func Install(thread *starlark.Thread, e *Env) { thread.SetLocal(threadKey, e) }

// Of returns the Env of thread, or an error naming the builtin if the thread
// was not set up by a Session.
func Of(thread *starlark.Thread, builtin string) (*Env, error) {
	if e, ok := thread.Local(threadKey).(*Env); ok && e != nil {
		return e, nil
	}
	return nil, fmt.Errorf("%s: no memsh session on this thread", builtin)
}

// Holder is implemented by Starlark values that own device or host memory
// (tensors, cuda.malloc buffers). Experiments and reports use it to find
// which allocations a value keeps alive.
type Holder interface {
	starlark.Value
	HeldMemory() *backend.Memory
}

// Session is the view of the running memsh Session offered to modules that
// observe it (per-statement loggers, traces, output records, sweeps). It is
// implemented by *scope.Session; Env.Session is nil outside a Session.
type Session interface {
	// UserGlobals returns the user globals as globals() sees them now
	// (including the running statement's own bindings).
	UserGlobals(thread *starlark.Thread) starlark.StringDict
	// OnStatement registers f to be called before and after every
	// top-level statement, until remove is called.
	OnStatement(f func(StatementEvent)) (remove func())
	// OnFinish registers f to be called when an experiment or a trial
	// finishes, until remove is called.
	OnFinish(f func(FinishEvent)) (remove func())
	// Trial runs fn(*args, **kwargs) as trial() does, recording params with
	// the trial's FinishEvent, and returns the trial() result struct
	// (name, status, error, value, data).
	Trial(thread *starlark.Thread, name string, fn starlark.Callable, args starlark.Tuple, kwargs []starlark.Tuple, params starlark.StringDict) (starlark.Value, error)
	// Root makes r a root of the reclaim's reach walk (reach.go) until
	// release is called: for Go code that keeps Starlark values across
	// calls back into Starlark (a sweep's results), so that a built-in
	// can declare itself transparent (starlark.Thread.DeclareTransparent).
	Root(r Reacher) (release func())
}

// StatementEvent is sent before (Start true) and after each top-level
// statement.
type StatementEvent struct {
	Start    bool
	Pos, End syntax.Position // the statement's span
	Err      error           // after: the statement's error, or nil
	// First and Last mark the statements that begin and end an input: a
	// REPL input is one input whatever its statements; in a script each
	// top-level statement is one. Per-input tools (the logger) measure from
	// First's start to Last's end. After a failed statement Last is true.
	First, Last bool
}

// FinishEvent describes a finished experiment or trial.
type FinishEvent struct {
	Kind   string // "experiment" or "trial"
	Name   string
	Status string // trials: "ok", "oom" or "error"; experiments: "ok"
	Error  string // trials: the error message, or ""
	Params starlark.StringDict
	Data   *Data
	// Leaks lists memory allocated in the block and still reachable, as
	// "device bytes path" lines.
	Leaks []string
}

// NoArgs checks that builtin b was called without arguments and returns the
// thread's Env: the preamble of every argument-less module function.
func NoArgs(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (*Env, error) {
	if err := starlark.UnpackArgs(b.Name(), args, kwargs); err != nil {
		return nil, err
	}
	return Of(thread, b.Name())
}

// ErrorValue is an error that carries a value for code that handles the
// failure as data: nn.track's breakdown up to an out-of-memory error,
// which trial() returns as its .value.
type ErrorValue interface {
	error
	ErrorValue() starlark.Value
}

// InPlaceOperand is implemented by values whose augmented assignments
// update them in place, as PyTorch's tensors do: for such an x, memsh runs
// `x += y` (and -=, *=, /=, //=, %=, &=, |=, ^=, <<=, >>=) as
// x.InPlaceBinary(syntax.PLUS, y) and binds the target to its result,
// instead of Starlark's `x = x + y`, which would allocate a new value. op
// is the binary operator (syntax.PLUS for +=). The method returns the
// receiver itself; returning (nil, nil) declines, and the ordinary binary
// operator applies. Other values keep Starlark's meaning.
type InPlaceOperand interface {
	starlark.Value
	InPlaceBinary(op syntax.Token, y starlark.Value) (starlark.Value, error)
}
