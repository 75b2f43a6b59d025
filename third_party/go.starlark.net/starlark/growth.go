package starlark

import (
	"sync"
	"weak"
)

// memsh: A GrowthLog collects the lists appended to while watched and not
// pinned whose growth one walker has undertaken to look at (List.LogGrowth):
// an append to such a list records the list here, once until the log is
// drained, instead of moving the Mutations counter. memsh's reclaim walks
// what its log holds at its next walk (and pins it), so that a list that
// starts growing makes the next walk look at that list, not at every
// frame that reaches it. A log that is off (a new one, or Drain(false))
// records nothing: appends move the counter as before. Safe for
// concurrent use.
type GrowthLog struct {
	mu    sync.Mutex
	on    bool
	lists []weak.Pointer[List]
}

// sharedGrowth marks a list that two logs asked for: its appends move
// the Mutations counter.
var sharedGrowth = new(GrowthLog)

// record logs l and reports whether it did (the log is on).
func (g *GrowthLog) record(l *List) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.on {
		return false
	}
	g.lists = append(g.lists, weak.Make(l))
	return true
}

// Drain empties the log, turns it on or off for the appends that follow,
// and returns the lists it held that are still alive; each one's next
// append is logged again (while the log is on).
func (g *GrowthLog) Drain(on bool) []*List {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.on = on
	var out []*List
	for _, p := range g.lists {
		if l := p.Value(); l != nil {
			l.logged = false
			out = append(out, l)
		}
	}
	clear(g.lists)
	g.lists = g.lists[:0]
	return out
}

// memsh: LogGrowth makes appends to l, while l is watched and not pinned,
// record l in g (once until g is drained) instead of moving the Mutations
// counter, while g is on. A list two logs asked for moves the counter.
func (l *List) LogGrowth(g *GrowthLog) {
	switch l.growth {
	case nil:
		l.growth = g
	case g:
	default:
		l.growth = sharedGrowth
	}
}

// memsh: GrowthMark returns the number SetGrowthMark last stored on l (0
// at first): a walker's note of where it met l (memsh: the frame of the
// pin that met it).
func (l *List) GrowthMark() uint64 { return l.mark }

// memsh: SetGrowthMark stores a number on l for its walker (see
// GrowthMark).
func (l *List) SetGrowthMark(m uint64) { l.mark = m }
