package scope

import (
	"math"
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
// place of a pin another pin reaches (a finished row of a list of rows):
// one that has not grown for idleWalks walks first, the highest of them
// (the fewest frames above it to walk again), else the one that grew
// least recently. At the next walk the frame of a pin that reached it
// (its parent) takes its elements in (a fold), and keeps them.
//
// A list a walk met that starts growing would still move Mutations at its
// first append, and the next walk would walk every frame again (a list
// of rows appended empty, then filled: once per row). Such a list's
// appends are logged instead (starlark.List.LogGrowth, pinSet.growth)
// and the next walk looks at the lists logged: each list a pin's frame
// met carries that frame's mark (starlark.List.SetGrowthMark: the pin's
// id, which changes whenever the pin is walked whole, so that a mark
// names the frame that met the list, not an older one), and that pin's
// frame, kept, takes the list's elements in, as for a fold; a list no
// pin's frame met was met by the globals' or the stack's frames, which
// that walk walks again (loose); a list two pins' frames met makes that
// walk keep nothing (keepNone). The list is then pinned, when there is
// room, with the pin that met it reaching it (meets).
//
// Every pin is unpinned, and the log turned off, when a walk cannot keep
// frames (backward's engine frames, the memo, loading): unpinning moves
// Mutations, so that no frame kept relies on a pin's frame. Pinned
// containers (and folds' pins) are held weakly between walks: a pin does
// not keep one alive for the Go collector.

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
	// idleWalks is how many walks a pin must have gone without growing
	// for the room it takes to go before older ones (pinSet.end).
	idleWalks = 8
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
	// id names the pin's frame in the growth marks of the lists its
	// walks met (starlark.List.SetGrowthMark): a new one whenever the pin
	// is walked whole
	id uint64
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
	// mutations is the Session's Mutations domain, which unpinning moves
	mutations *starlark.MutationCounter
	all       []pin
	// renumbered: pins were added or dropped since the last walk began
	// (begin), the collector's taking one included; valid is then how
	// many bottom pins keep their frame numbers. Every frame above them,
	// the globals' and the stack's too, was numbered otherwise.
	renumbered bool
	valid      int
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
	// growth: the lists whose appends the next walk looks at
	// (starlark.List.LogGrowth) instead of every frame that reaches them;
	// grownNow: those the running walk drained from it (candidates to
	// pin); extra: what each kept pin's frame takes in at this walk —
	// the lists that grew that it met, and the evicted pins folded into
	// it
	growth   starlark.GrowthLog
	grownNow []*starlark.List
	extra    [maxPins][]pinnable
	ids      uint64 // the last pin id given
	epoch    uint64 // the walks that walked every pin whole
	// folds: pins that left to make room, each for its frame to be
	// walked into the frame of a pin that reaches it (its parent), at the
	// next walk; keepNone: a parent is gone, or a list that grew is
	// marked by two pins, so that walk keeps nothing
	folds    []fold
	keepNone bool
	// loose: a list that grew is no pin's (the frames that met it are
	// the globals' or the stack's, walked again)
	loose bool
}

// sharedMark is the bit of a growth mark that says two pins' frames met
// the list; the other bits are the epoch of the mark (pinSet.epoch), for
// it is stale once a walk walked every pin whole. Pin ids stay below it.
const sharedMark = 1 << 63

// shared reports whether a growth mark says two pins' frames hold the
// list.
func (p *pinSet) shared(m uint64) bool { return m == sharedMark|p.epoch }

// newID returns a new pin frame id.
func (p *pinSet) newID() uint64 {
	p.ids++
	return p.ids
}

// fold is an evicted pin (child) whose elements the next walk walks into
// the frame of a pin that reaches it (parent), both held weakly.
type fold struct{ parent, child pin }

// begin starts a walk that uses the pins: it resolves them (a list the
// collector took is dropped) and makes w ask about each list it meets.
// It returns how many pins there are and how many bottom frames keep
// their numbers: all of them (math.MaxInt) unless pins were added or
// dropped since the last walk began — at the top of the pins as well as
// below others, and all of them: the globals' and the stack's frames sit
// above the pins, so they move too.
func (p *pinSet) begin(w *env.Walker) (n, stand int) {
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
	p.keepNone, p.loose = false, false
	if len(p.all) == 0 {
		p.epoch++
	}
	// The lists appended to since the last walk without moving Mutations
	// (starlark.List.LogGrowth): the pin whose frame met one (its growth
	// mark) takes its elements in (walk) — every allocation counts once,
	// in the lowest frame that reaches it, so a kept frame above that
	// reaches the list too needs nothing more; one that no pin's frame
	// met was met by the globals' or the stack's, which are walked again
	// (loose, frameCache.walk); one that two pins' frames met makes the
	// walk keep nothing (keepNone). Each is pinned after the walk, when
	// there is room.
	for _, l := range p.growth.Drain(true) {
		if l.Pinned() {
			continue
		}
		p.grownNow = append(p.grownNow, l)
		p.lens[uintptr(unsafe.Pointer(l))] = -1 // it grew: a candidate when met
		m := l.GrowthMark()
		if p.shared(m) {
			p.keepNone = true
		} else if k := p.marked(m); k >= 0 {
			p.extra[k] = append(p.extra[k], l)
		} else {
			p.loose = true
		}
	}
	for _, f := range p.folds {
		par, ch := f.parent.value(), f.child.value()
		if ch == nil {
			continue // collected: nothing to walk
		}
		k, ok := -1, false
		if par != nil {
			k, ok = p.index[key(par)]
		}
		if !ok || ch.Pinned() {
			p.keepNone = true
			break
		}
		p.extra[k] = append(p.extra[k], ch)
	}
	clear(p.folds)
	p.folds = p.folds[:0]
	stand = math.MaxInt
	if p.renumbered {
		stand = p.valid
	}
	p.renumbered, p.valid = false, len(p.all)
	return len(p.all), stand
}

// marked returns the pin whose frame a growth mark names — the frame is
// still the one that met the list — or -1.
func (p *pinSet) marked(m uint64) int {
	if m == 0 || m&sharedMark != 0 {
		return -1
	}
	for k, pn := range p.all {
		if pn.id == m {
			return k
		}
	}
	return -1
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
			p.valid, p.renumbered = min(p.valid, k), true
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
		if lst, isList := l.(*starlark.List); isList {
			lst.LogGrowth(&p.growth) // its appends: the next walk looks at it
			if p.cur >= 0 {
				// met in a pin's frame: marked with it, or shared when
				// another pin's frame met it too
				pn := &p.all[p.cur]
				if m := lst.GrowthMark(); p.shared(m) || (m != pn.id && p.marked(m) >= 0) {
					lst.SetGrowthMark(sharedMark | p.epoch)
				} else {
					lst.SetGrowthMark(pn.id)
				}
			}
		}
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
// and false when the walk was stopped (an interrupt).
func (p *pinSet) walk(w *env.Walker, frames *backend.Frames, kept int) (int, bool) {
	if kept == 0 {
		p.epoch++ // every pin is walked whole: the shared marks are stale
	}
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
			if grew := l.Len() > pn.n; grew || len(p.extra[k]) > 0 {
				if grew {
					pn.grew = p.walks
				}
				frames.Extend(k)
				w.Tail(l, pn.n)
				for _, x := range p.extra[k] {
					w.Value(x)
				}
				w.Settle()
				if w.Stopped() {
					frames.Drop(k)
					p.cur = -1
					return k, false
				}
				kept = frames.EndExtend()
			}
		} else {
			frames.Enter(k)
			pn.meets, pn.id = 0, p.newID()
			w.Value(l)
			w.Settle()
			if w.Stopped() {
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
		clear(p.grownNow)
		p.grownNow = p.grownNow[:0]
		for k := range p.extra {
			clear(p.extra[k])
			p.extra[k] = p.extra[k][:0]
		}
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
	unmet := ^live & all
	drop := unmet
	retry = drop != 0
	// room for the candidates that grew: a pin that another pin reaches
	// and that did not grow in this walk goes — the highest of those
	// that have not grown for idleWalks walks (the fewest frames above it
	// to walk again), else the one that grew least recently (a finished
	// row of a list of rows: the outer list's frame takes it in at the
	// next walk, then keeps it)
	var nested uint64
	for _, pn := range p.all {
		nested |= pn.meets
	}
	for need := len(p.all) + bits.OnesCount64(p.grown) - maxPins; need > bits.OnesCount64(drop); {
		old, at, idle := -1, p.walks, -1
		for k, pn := range p.all {
			if drop&(1<<k) == 0 && nested&(1<<k) != 0 {
				if pn.grew < at {
					old, at = k, pn.grew
				}
				if pn.grew+idleWalks < p.walks {
					idle = k
				}
			}
		}
		if idle >= 0 {
			old = idle // the highest: the fewest frames above it to walk again
		}
		if old < 0 {
			break
		}
		drop |= 1 << old
	}
	if drop != 0 {
		// an evicted pin's frame is walked into the frame of a pin that
		// reaches it at the next walk (pinSet.walk), instead of every
		// frame being walked again
		orphan := unmet != 0
		for k := range p.all {
			if drop&(1<<k) == 0 || unmet&(1<<k) != 0 {
				continue
			}
			parent := -1
			for j, pn := range p.all {
				if drop&(1<<j) == 0 && live&(1<<j) != 0 && pn.meets&(1<<k) != 0 {
					parent = j
					break
				}
			}
			if parent < 0 {
				orphan = true
				continue
			}
			p.folds = append(p.folds, fold{parent: newPin(p.values[parent]), child: newPin(p.values[k])})
			p.all[parent].meets |= p.all[k].meets // the pins the child's frame met: the parent's now
		}
		for k := range p.all {
			if drop&(1<<k) != 0 {
				p.values[k].Pin(false)
			}
		}
		p.remove(drop)
		if orphan {
			p.mutations.Add(1) // no frame kept relies on those pins
		}
	}
	for i, l := range p.cand {
		if len(p.all) < maxPins && !l.Pinned() && (p.grown&(1<<i) != 0 || len(p.all)+bits.OnesCount64(p.grown>>i) < maxPins) {
			l.Pin(true)
			p.valid, p.renumbered = min(p.valid, len(p.all)), true
			p.all = append(p.all, newPin(l))
			p.all[len(p.all)-1].grew, p.all[len(p.all)-1].id = p.walks, p.newID()
			if lst, ok := l.(*starlark.List); ok {
				// a list a pin's frame met (its growth mark): that pin
				// reaches the new one, whose frame stands for it from now on
				if k := p.marked(lst.GrowthMark()); k >= 0 {
					p.all[k].meets |= 1 << (len(p.all) - 1)
				}
			}
		}
	}

	if len(p.lens) >= maxLens {
		clear(p.lens) // (a walk of many containers: remember the next ones)
	}
	return retry
}

// unpinAll unpins every list, for a walk that cannot keep frames, and
// turns the growth log off (appends move Mutations again).
func (p *pinSet) unpinAll() {
	p.growth.Drain(false)
	clear(p.folds)
	p.folds = p.folds[:0]
	if len(p.all) == 0 {
		return
	}
	for _, pn := range p.all {
		if v := pn.value(); v != nil {
			v.Pin(false)
		}
	}
	clear(p.all)
	p.all, p.valid, p.renumbered = p.all[:0], 0, true
	p.mutations.Add(1)
}
