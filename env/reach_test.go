package env

import (
	"testing"
	"time"

	"go.starlark.net/starlark"

	"github.com/memsh/memsh/backend"
)

// TestWalkerStop: a walk whose Stop says so gives up (Finish false,
// Stopped true) once it has visited minWalkValues values; one whose Stop
// says no finishes; Restart keeps Stop.
func TestWalkerStop(t *testing.T) {
	elems := make([]starlark.Value, 20000)
	for i := range elems {
		elems[i] = starlark.NewList([]starlark.Value{starlark.MakeInt(i)})
	}
	list := starlark.NewList(elems)
	for _, stop := range []bool{false, true} {
		asked := 0
		w := NewWalker(1, func(*backend.Memory) {})
		w.Stop = func() bool { asked++; return stop }
		w.Value(list)
		done := w.Finish()
		w.Done()
		if done == stop || w.Stopped() != stop || asked == 0 {
			t.Errorf("Stop says %v: Finish %v, Stopped %v, asked %d times", stop, done, w.Stopped(), asked)
		}
		// a restarted walker (the Session reuses one) keeps its Stop
		asked = 0
		w.Restart(2, func(*backend.Memory) {})
		w.Value(list)
		if done := w.Finish(); done == stop || asked == 0 {
			t.Errorf("Stop says %v, after Restart: Finish %v, asked %d times", stop, done, asked)
		}
		w.Done()
	}
}

// TestWalkerHasNoDeadline: a walk that takes long (here its Stop sleeps
// a millisecond at each of its ~80 asks) still finishes: giving up for
// time would leave the reclaim to the collector, whose verdict differs
// from the walk's (backend.ReachFunc), so figures would follow the
// machine's load.
func TestWalkerHasNoDeadline(t *testing.T) {
	elems := make([]starlark.Value, 20000)
	for i := range elems {
		elems[i] = starlark.NewList([]starlark.Value{starlark.MakeInt(i)})
	}
	w := NewWalker(1, func(*backend.Memory) {})
	asked := 0
	w.Stop = func() bool { asked++; time.Sleep(time.Millisecond); return false }
	w.Value(starlark.NewList(elems))
	if done := w.Finish(); !done || w.Stopped() || asked < 10 {
		t.Errorf("a slow walk: Finish %v, Stopped %v, Stop asked %d times; want it to finish", done, w.Stopped(), asked)
	}
	w.Done()
}
