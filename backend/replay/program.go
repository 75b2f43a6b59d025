package replay

import (
	"fmt"
	"math"
	"sort"

	"github.com/memsh/memsh/backend"
)

// never is the moment of a death no recording shows.
const never = math.MaxInt64

// program is a stream split into what the trial's program does whatever
// the sizes — its allocations, the frees it makes itself, its own reclaims
// (Reclaim with TriggerOther: a statement's end, an experiment's), its
// empty_cache calls and driver memory — and what the reclaims AllocOn
// made tell: when each allocation became garbage. Those reclaims run
// where the allocator's state asks for them, so at other sizes they run
// elsewhere, and what they free with them.
//
// Moments order the program's events and the reclaims: event i is at
// 2i, and AllocOn's reclaim before allocation event i at 2i-1 (nothing
// runs between it and the allocation). An allocation becomes garbage
// between two moments; a reclaim frees what became garbage before it.
type program struct {
	size int
	laws []LawCall
	ops  []Op   // the program's events (a Reclaim's Count is 0)
	pre  []bool // per event: an Alloc that AllocOn reclaimed before
	// per allocation ID: the last moment a reclaim found it live (at
	// least its allocation's moment), and the moment of the reclaim that
	// freed it (never when none did)
	alive, dead []int64
	why         string // why the stream is no program (malformed)
}

// programOf splits s.
func programOf(s *Stream) *program {
	p := &program{size: s.Size, laws: s.Laws}
	n := len(s.Blocks)
	p.alive = make([]int64, n)
	p.dead = make([]int64, n)
	end := make([]int64, n) // the moment it stopped being allocated
	for i := range p.dead {
		p.dead[i], end[i] = never, never
	}
	var reclaims []int64
	pending := false // AllocOn reclaimed: its allocation comes next
	for _, op := range s.Ops {
		switch op.Kind {
		case Reclaim:
			c := int(op.Count)
			if c > len(p.ops) {
				p.why = "a reclaim freed more than was freed"
				return p
			}
			frees := p.ops[len(p.ops)-c:]
			for _, f := range frees {
				if f.Kind != Free {
					p.why = "a reclaim's frees are not together"
					return p
				}
			}
			var m int64
			if op.Trigger == backend.TriggerOther {
				m = 2 * int64(len(p.ops)-c)
			} else {
				m = 2*int64(len(p.ops)-c) - 1
			}
			for _, f := range frees {
				p.dead[f.ID] = m
				end[f.ID] = m
			}
			p.ops, p.pre = p.ops[:len(p.ops)-c], p.pre[:len(p.pre)-c]
			reclaims = append(reclaims, m)
			if op.Trigger == backend.TriggerOther {
				p.ops = append(p.ops, Op{Kind: Reclaim, Trigger: backend.TriggerOther})
				p.pre = append(p.pre, false)
			} else {
				pending = true
			}
			continue
		case Alloc:
			p.alive[op.ID] = 2 * int64(len(p.ops))
		case Free:
			end[op.ID] = 2 * int64(len(p.ops))
		}
		p.ops = append(p.ops, op)
		p.pre = append(p.pre, pending && op.Kind == Alloc)
		pending = false
	}
	// the last reclaim before each allocation's end that did not free it
	for id := range p.alive {
		j := sort.Search(len(reclaims), func(k int) bool { return reclaims[k] >= end[id] })
		if j > 0 && reclaims[j-1] > p.alive[id] {
			p.alive[id] = reclaims[j-1]
		}
	}
	return p
}

// same reports, with the first difference, whether p and q are the same
// program but for the sizes.
func (p *program) same(q *program) (bool, string) {
	n := min(len(p.ops), len(q.ops))
	for i := 0; i < n; i++ {
		if !p.ops[i].same(q.ops[i]) {
			return false, fmt.Sprintf("event %d: %v at %d, %v at %d", i, p.ops[i], p.size, q.ops[i], q.size)
		}
	}
	if len(p.ops) != len(q.ops) {
		return false, fmt.Sprintf("%d events at %d, %d at %d", len(p.ops), p.size, len(q.ops), q.size)
	}
	return true, ""
}
