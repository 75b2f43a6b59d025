package scope

import (
	"math/bits"
	"unsafe"
	"weak"

	"go.starlark.net/starlark"

	"github.com/memsh/memsh/backend"
	"github.com/memsh/memsh/env"
)

// A list or dict that grows in a loop (results appended, a comprehension
// being built, d[k] = t) would make every reclaim walk it whole again —
// the frame that holds it has run, and an append to a watched list moves
// starlark.Mutations — so that building a list of n tensors, each
// allocation raising a peak, costs n²/2 visits. A list or dict that a
// walk finds longer than when a walk last met it, or a long one (while
// there is room), is therefore pinned (starlark.List.Pin, Dict.Pin): from
// the next walk on it is a frame of its own (backend.Frames), numbered below
// every other, walked first; its appends (a dict's new keys) no longer
// move Mutations, and a walk that keeps its frame visits only the
// elements appended since (Frames.Extend), while the rest of the walk
// does not look into it again (env.Walker.Containers).
//
// A pinned frame stands for the container's elements only while the
// container is reachable: a walk that did not meet a pin elsewhere (it
// was dropped) unpins it and asks the Manager to walk again, keeping no
// frame (backend.Walk.Retry). A pin met only from another pin's elements
// (a list of long lists) stands if that pin does; what each pin's walks
// met is kept with it, for when its frame is kept. A pin that another
// pin's elements reach is not looked into from there either, though the
// other pin's frame may be lower: each walk walks every pin, kept or
// not, so what a pin's frame holds is never left to a frame that is not
// walked again. When the pins are full, a container that grows takes the
// place of a pin another pin reaches (a finished row of a list of rows:
// the other pin's frame then walks it whole once, and keeps it), the one
// that grew least recently first. Every pin is unpinned when a walk cannot keep frames
// (backward's engine frames, the memo, loading): unpinning moves
// Mutations, so that no frame kept relies on a pin's frame.
// Pinned containers are held weakly between walks: a pin does not keep
// one alive for the Go collector.

const (
	// pinMin is the length from which a list or dict a walk meets is
	// pinned.
	pinMin = 64
	// maxPins bounds the pins (a bit each in pinSet's masks).
	maxPins = 64
	// maxCand bounds the containers a walk pins.
	maxCand = 8
	// maxLens bounds the lengths pinSet remembers.
	maxLens = 1 << 16
)

// pinnable is a container that can be pinned: *starlark.List or
// *starlark.Dict.
type pinnable interface {
	starlark.Value
	Len() int
	Pin(on bool)
	Pinned() bool
}

// pin is a pinned list or dict, one frame of backend.Frames.
type pin struct {
	l   weak.Pointer[starlark.List] // the list, or
	d   weak.Pointer[starlark.Dict] // the dict
	n   int                         // the elements the walks have walked
	why string                      // why the walk up to this pin was incomplete, if it was
	// meets: the pins its elements reach (a bit each), since the walk
	// that last walked it whole
	meets uint64
	grew  uint64 // the walk (pinSet.walks) that last found it longer
}

func newPin(v pinnable) pin {
	if l, ok := v.(*starlark.List); ok {
		return pin{l: weak.Make(l)}
	}
	return pin{d: weak.Make(v.(*starlark.Dict))}
}

// value returns the pinned container, or nil when the collector took it.
func (pn *pin) value() pinnable {
	if l := pn.l.Value(); l != nil {
		return l
	}
	if d := pn.d.Value(); d != nil {
		return d
	}
	return nil
}

// key is the map key of a pinned container.
func key(v pinnable) unsafe.Pointer {
	if l, ok := v.(*starlark.List); ok {
		return unsafe.Pointer(l)
	}
	return unsafe.Pointer(v.(*starlark.Dict))
}

// pinSet is the frameCache's pinned lists and dicts, and the running walk's state.
type pinSet struct {
	all []pin
	// valid: the bottom pins whose frame numbers have not changed since
	// the last walk (the pins after them were added or dropped)
	valid int
	// while a walk runs (active)
	active bool
	values []pinnable // all's containers
	index  map[unsafe.Pointer]int
	cur    int // the pin being walked, -1 when none
	// outside: the pins met outside the pins' walks, or by a kept frame
	// when it was walked (frameCache.walk)
	outside uint64
	// cand: the containers to pin after the walk, and which of them
	// grew since a walk met them (a growing one may take an old pin's
	// place)
	cand  []pinnable
	grown uint64
	// walks counts the walks; lens is the length of each unpinned list
	// and dict a walk met when it last met it (by address: an entry may
	// be stale, which at worst pins a list that did not grow)
	walks uint64
	lens  map[uintptr]int
}

// begin starts a walk that uses the pins: it resolves them (a list the
// collector took is dropped) and makes w ask about each list it meets.
// It returns how many pins there are and how many bottom frames keep
// their numbers.
func (p *pinSet) begin(w *env.Walker) (n, valid int) {
	p.active, p.cur, p.outside, p.grown = true, -1, 0, 0
	p.walks++
	if p.index == nil {
		p.index, p.lens = map[unsafe.Pointer]int{}, map[uintptr]int{}
	}
	var gone uint64
	for k := range p.all {
		if p.all[k].value() == nil {
			gone |= 1 << k
		}
	}
	p.remove(gone)
	for k := range p.all {
		v := p.all[k].value()
		p.index[key(v)] = k
		p.values = append(p.values, v)
	}
	w.Containers = p.meet
	return len(p.all), p.valid
}

// remove drops the pins of the set bits (without unpinning them) and
// renumbers the others' meets; the frames from the lowest one up are
// numbered otherwise from then on (valid).
func (p *pinSet) remove(drop uint64) {
	if drop == 0 {
		return
	}
	var to [maxPins]int // old index -> new, -1 for dropped
	kept := p.all[:0]
	for k, pn := range p.all {
		if drop&(1<<k) != 0 {
			to[k] = -1
			p.valid = min(p.valid, k)
			continue
		}
		to[k] = len(kept)
		kept = append(kept, pn)
	}
	clear(p.all[len(kept):])
	p.all = kept
	for i := range p.all {
		var m uint64
		for k := range maxPins {
			if p.all[i].meets&(1<<k) != 0 && to[k] >= 0 {
				m |= 1 << to[k]
			}
		}
		p.all[i].meets = m
	}
}

// meet is env.Walker.Containers: a pin other than the one being walked
// is not looked into (its frame stands for it).
func (p *pinSet) meet(v starlark.Value) bool {
	l, ok := v.(pinnable)
	if !ok {
		return false
	}
	k, ok := p.index[key(l)]
	if !ok {
		// a long container, or one that grew since a walk met it, is
		// pinned after the walk
		n, id := l.Len(), uintptr(key(l))
		prev, met := p.lens[id]
		if met || len(p.lens) < maxLens {
			p.lens[id] = n
		}
		// (a long one only while there is room for it: it must not take
		// the place of one that grows)
		grew := met && n > prev
		if (grew || (n >= pinMin && len(p.all)+len(p.cand) < maxPins)) && len(p.cand) < maxCand && !l.Pinned() {
			for i, c := range p.cand {
				if c == l {
					if grew {
						p.grown |= 1 << i
					}
					return false
				}
			}
			if grew {
				p.grown |= 1 << len(p.cand)
			}
			p.cand = append(p.cand, l)
		}
		return false
	}
	if k == p.cur {
		return false
	}
	if p.cur < 0 {
		p.outside |= 1 << k
	} else {
		p.all[p.cur].meets |= 1 << k
	}
	return true
}

// walk walks the pins, the bottom frames of backend.Frames: a kept one
// only for the elements appended since the last walk, the others whole.
// kept is how many frames the walk keeps; it returns how many it keeps
// after (fewer when an extension took values over from a frame above),
// and false when the walk ran out of time.
func (p *pinSet) walk(w *env.Walker, frames *backend.Frames, kept int) (int, bool) {
	for k := range p.all {
		pn, l := &p.all[k], p.values[k]
		p.cur = k
		if k < kept && l.Len() < pn.n {
			kept = k // shorter: mutated, which Mutations should have said
			frames.Drop(k)
		}
		if k < kept {
			if pn.why != "" {
				w.Incomplete(pn.why)
			}
			if l.Len() > pn.n {
				pn.grew = p.walks
				frames.Extend(k)
				w.Tail(l, pn.n)
				w.Settle()
				if w.Exhausted() {
					frames.Drop(k)
					p.cur = -1
					return k, false
				}
				kept = frames.EndExtend()
			}
		} else {
			frames.Enter(k)
			pn.meets = 0
			w.Value(l)
			w.Settle()
			if w.Exhausted() {
				frames.Drop(k)
				p.cur = -1
				return k, false
			}
		}
		pn.n, pn.why = l.Len(), w.Why()
	}
	p.cur = -1
	return kept, true
}

// end ends the walk: it unpins the pins the walk did not meet (and
// reports retry: the walk counted their frames), and pins the long lists
// and dicts it met, when the walk was done.
func (p *pinSet) end(w *env.Walker, done bool) (retry bool) {
	if !p.active {
		return false
	}
	w.Containers = nil
	defer func() {
		p.active = false
		clear(p.index)
		clear(p.values)
		p.values = p.values[:0]
		clear(p.cand)
		p.cand = p.cand[:0]
	}()
	if !done {
		return false
	}
	// a pin is reachable if met outside the pins, or from a reachable pin
	live := p.outside
	for changed := true; changed; {
		changed = false
		for k, pn := range p.all {
			if live&(1<<k) != 0 && pn.meets&^live != 0 {
				live |= pn.meets
				changed = true
			}
		}
	}
	all := uint64(1)<<len(p.all) - 1 // a shift by 64 gives 0
	p.valid = len(p.all)
	drop := ^live & all
	retry = drop != 0
	// room for the candidates that grew: a pin that another pin reaches
	// and that did not grow in this walk goes, the one that grew least
	// recently first (a finished row of a list of rows: the outer
	// list's frame walks it once more, then keeps it)
	var nested uint64
	for _, pn := range p.all {
		nested |= pn.meets
	}
	for need := len(p.all) + bits.OnesCount64(p.grown) - maxPins; need > bits.OnesCount64(drop); {
		old, at := -1, p.walks
		for k, pn := range p.all {
			if drop&(1<<k) == 0 && nested&(1<<k) != 0 && pn.grew < at {
				old, at = k, pn.grew
			}
		}
		if old < 0 {
			break
		}
		drop |= 1 << old
	}
	if drop != 0 {
		for k := range p.all {
			if drop&(1<<k) != 0 {
				p.values[k].Pin(false)
			}
		}
		p.remove(drop)
		starlark.Mutated() // no frame kept relies on those pins
	}
	for i, l := range p.cand {
		if len(p.all) < maxPins && !l.Pinned() && (p.grown&(1<<i) != 0 || len(p.all)+bits.OnesCount64(p.grown>>i) < maxPins) {
			l.Pin(true)
			p.all = append(p.all, newPin(l))
			p.all[len(p.all)-1].grew = p.walks
		}
	}
	if len(p.lens) >= maxLens {
		clear(p.lens) // (a walk of many containers: remember the next ones)
	}
	return retry
}

// unpinAll unpins every list, for a walk that cannot keep frames.
func (p *pinSet) unpinAll() {
	if len(p.all) == 0 {
		return
	}
	for _, pn := range p.all {
		if v := pn.value(); v != nil {
			v.Pin(false)
		}
	}
	clear(p.all)
	p.all, p.valid = p.all[:0], 0
	starlark.Mutated()
}
