package memtrace

import (
	"weak"

	"github.com/memsh/memsh/backend"
	"github.com/memsh/memsh/env"
)

// A running trace keeps a peak counter open on its allocator (in exact peak
// mode, allocations that would raise it reclaim first). fastai stops a trace
// in __del__; memsh closes the counter of a trace nothing refers to any more
// at the next memtrace() call or the end of the next top-level statement,
// from the session goroutine (never from a finalizer). The registry holds the
// trace only weakly, so it never changes what is reclaimed.

// cell holds a trace's open counter; the trace and the registry share it.
type cell struct{ peak *backend.Peak }

func (c *cell) close() {
	if c.peak != nil {
		c.peak.Close()
		c.peak = nil
	}
}

type entry struct {
	trace weak.Pointer[MemTrace]
	cell  *cell
}

type registry struct {
	entries []entry
	remove  func() // the statement hook, while there are entries
}

const valuesKey = "memtrace"

// register records t in its session's registry, sweeping dropped traces
// first, and makes sure the statement hook runs.
func register(e *env.Env, t *MemTrace) {
	r, _ := e.Values[valuesKey].(*registry)
	if r == nil {
		r = &registry{}
		e.Values[valuesKey] = r
	}
	r.sweep()
	r.entries = append(r.entries, entry{trace: weak.Make(t), cell: t.cell})
	if r.remove == nil && e.Session != nil {
		r.remove = e.Session.OnStatement(func(ev env.StatementEvent) {
			if ev.Start {
				return
			}
			r.sweep()
			if len(r.entries) == 0 && r.remove != nil {
				r.remove()
				r.remove = nil
			}
		})
	}
}

// sweep closes the counters of traces that are gone and forgets them.
func (r *registry) sweep() {
	kept := r.entries[:0]
	for _, en := range r.entries {
		if en.trace.Value() == nil {
			en.cell.close()
			continue
		}
		kept = append(kept, en)
	}
	clear(r.entries[len(kept):])
	r.entries = kept
}

// Open returns the number of traces of the session that are still
// referenced (for tests).
func Open(e *env.Env) int {
	r, _ := e.Values[valuesKey].(*registry)
	if r == nil {
		return 0
	}
	r.sweep()
	return len(r.entries)
}
