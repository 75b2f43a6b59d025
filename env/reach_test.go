package env

import (
	"testing"
	"time"

	"go.starlark.net/starlark"

	"github.com/memsh/memsh/backend"
)

// TestWalkerStop: a walk whose Stop says so gives up as past its
// deadline (Finish false, Stopped true) once it has visited
// minWalkValues values; one whose Stop says no, with all the time in the
// world, finishes; Restart keeps Stop.
func TestWalkerStop(t *testing.T) {
	elems := make([]starlark.Value, 20000)
	for i := range elems {
		elems[i] = starlark.NewList([]starlark.Value{starlark.MakeInt(i)})
	}
	list := starlark.NewList(elems)
	far := time.Now().Add(time.Hour)
	for _, stop := range []bool{false, true} {
		asked := 0
		w := NewWalker(1, far, func(*backend.Memory) {})
		w.Stop = func() bool { asked++; return stop }
		w.Value(list)
		done := w.Finish()
		w.Done()
		if done == stop || w.Stopped() != stop || asked == 0 {
			t.Errorf("Stop says %v: Finish %v, Stopped %v, asked %d times", stop, done, w.Stopped(), asked)
		}
		// a restarted walker (the Session reuses one) keeps its Stop
		asked = 0
		w.Restart(2, far, func(*backend.Memory) {})
		w.Value(list)
		if done := w.Finish(); done == stop || asked == 0 {
			t.Errorf("Stop says %v, after Restart: Finish %v, asked %d times", stop, done, asked)
		}
		w.Done()
	}
}
