package scope

import (
	"fmt"

	"go.starlark.net/starlark"

	"github.com/memsh/memsh/backend"
	"github.com/memsh/memsh/env"
)

var _ env.Session = (*Session)(nil)

type stmtHook struct{ f func(env.StatementEvent) }
type finishHook struct{ f func(env.FinishEvent) }

// OnStatement implements env.Session: f is called before and after every
// top-level statement until remove is called.
func (s *Session) OnStatement(f func(env.StatementEvent)) (remove func()) {
	h := &stmtHook{f}
	s.stmtHooks = append(s.stmtHooks, h)
	return func() { s.stmtHooks = removeHook(s.stmtHooks, h) }
}

// OnFinish implements env.Session: f is called when an experiment or trial
// finishes, until remove is called.
func (s *Session) OnFinish(f func(env.FinishEvent)) (remove func()) {
	h := &finishHook{f}
	s.finishHooks = append(s.finishHooks, h)
	return func() { s.finishHooks = removeHook(s.finishHooks, h) }
}

// Root implements env.Session: r is walked as a root of the reclaim's
// reach walk until release is called.
func (s *Session) Root(r env.Reacher) (release func()) {
	h := &r
	s.roots = append(s.roots, h)
	return func() { s.roots = removeHook(s.roots, h) }
}

// removeHook returns hs without h, in a new array, so the removed hook (and
// whatever its closure holds) is not kept reachable by the old one.
func removeHook[T comparable](hs []T, h T) []T {
	out := make([]T, 0, len(hs))
	for _, x := range hs {
		if x != h {
			out = append(out, x)
		}
	}
	return out
}

// statementEvent calls the statement hooks registered when it began (a
// hook that removes or adds one does not change the array it iterates:
// removeHook makes a new one, and append writes past its length).
func (s *Session) statementEvent(e env.StatementEvent) {
	for _, h := range s.stmtHooks {
		h.f(e)
	}
}

func (s *Session) finishEvent(e env.FinishEvent) {
	for _, h := range append([]*finishHook(nil), s.finishHooks...) {
		h.f(e)
	}
}

// UserGlobals implements env.Session.
func (s *Session) UserGlobals(thread *starlark.Thread) starlark.StringDict {
	return starlark.StringDict(s.currentView())
}

// Trial implements env.Session: it runs a trial as trial() does, recording
// params with its FinishEvent, and returns the trial() result struct.
func (s *Session) Trial(thread *starlark.Thread, name string, fn starlark.Callable, args starlark.Tuple, kwargs []starlark.Tuple, params starlark.StringDict) (starlark.Value, error) {
	r, err := s.RunTrial(thread, name, fn, args, kwargs, params)
	if err != nil {
		return nil, err
	}
	return r.Value(), nil
}

func leakLines(o *Outcome) []string {
	if o == nil {
		return nil
	}
	out := make([]string, len(o.Leaks))
	for i, l := range o.Leaks {
		out[i] = fmt.Sprintf("%s %s %s", l.Device, backend.FormatBytes(int64(l.Bytes)), l.Path)
	}
	return out
}
