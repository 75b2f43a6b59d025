// Package env carries a Session's shared state to the Starlark modules that
// run on its thread: the memory Manager, the output writer and per-session
// module settings. Modules read it with env.Of(thread); the Session installs
// it with env.Install. Nothing here is process-wide, so two Sessions in one
// process never see each other.
package env

import (
	"fmt"
	"io"
	"os"

	"go.starlark.net/starlark"

	"github.com/memsh/memsh/backend"
)

const threadKey = "memsh.env"

// Env is a Session's state shared with its Starlark modules.
type Env struct {
	Manager *backend.Manager
	Out     io.Writer // where print() and reports go

	// DefaultDevice is the device tensors are created on when none is
	// given (tensor.set_default_device). "cpu" as in PyTorch.
	DefaultDevice string

	// Modules may keep per-session state here, keyed by module name.
	Values map[string]any
}

// New returns an Env over m writing to out (os.Stdout if nil).
func New(m *backend.Manager, out io.Writer) *Env {
	if out == nil {
		out = os.Stdout
	}
	return &Env{Manager: m, Out: out, DefaultDevice: "cpu", Values: map[string]any{}}
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
