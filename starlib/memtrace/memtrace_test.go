package memtrace_test

import (
	"io"
	"testing"

	"github.com/memsh/memsh/scope"
	"github.com/memsh/memsh/starlib/memtrace"
)

// TestDroppedTraceClosesItsCounter: fastai stops a trace in __del__; memsh
// closes the peak counter of a trace nothing refers to at the end of the
// next statement (from the session goroutine), so forgotten traces do not
// pile up counters that make exact-mode allocations reclaim.
func TestDroppedTraceClosesItsCounter(t *testing.T) {
	s, err := scope.New(scope.Options{Device: "sim:1GiB", Out: io.Discard, Err: io.Discard})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	peaks := s.Manager().GPU(0).Peaks()
	base := peaks.Len() // the Manager's own counter for max_memory_allocated
	if err := s.Exec("t.star", "a = memtrace()\nb = memtrace()\nb.stop()"); err != nil {
		t.Fatal(err)
	}
	if n := memtrace.Open(s.Env()); n != 2 {
		t.Errorf("%d traces registered, want 2", n)
	}
	if peaks.Len()-base != 1 {
		t.Errorf("%d counters open with one running and one stopped trace, want 1", peaks.Len()-base)
	}
	if err := s.Exec("t.star", "a = None\nb = None\ngc()\nx = 1"); err != nil {
		t.Fatal(err)
	}
	if n := memtrace.Open(s.Env()); n != 0 {
		t.Errorf("%d traces registered after dropping them, want 0", n)
	}
	if peaks.Len() != base {
		t.Errorf("%d counters still open after the traces were dropped, want 0", peaks.Len()-base)
	}
}
