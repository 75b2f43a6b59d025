package scope

import (
	"fmt"
	"math"
	"reflect"
	"slices"
	"sync"
	"unsafe"

	"go.starlark.net/starlark"

	"github.com/memsh/memsh/backend"
	"github.com/memsh/memsh/env"
	"github.com/memsh/memsh/tensor"
)

// reach is the Session's backend.ReachFunc: it walks the roots a Starlark
// value of the Session can be reached from — the globals the user bound,
// the running statement's bindings, loaded modules, the open experiments'
// saved globals and pending restores, the tensor Context's in-flight
// tensors and autocast cast cache, and the frames of every running
// function (the function and its whole frame: locals and operand stack) —
// with env.Walker, which goes on into containers, memsh's values, tensors
// and the autograd graph. See backend/reach.go for why this decides
// whether a reclaim needs the Go collector, and why it is sound whatever
// it fails to reach.
func (s *Session) reach(epoch uint64, visit func(*backend.Memory), frames *backend.Frames) backend.Walk {
	w := s.walker
	if w == nil {
		w = env.NewWalker(epoch, visit)
		w.Stop = s.tctx.Interrupted // Ctrl-C: the collector decides at once
		s.walker = w
	} else {
		w.Restart(epoch, visit)
	}
	defer w.Done()
	w.SetFrames(frames)
	var horizon uint64
	reused := false
	key, above, memo := s.memoKey()
	if memo {
		// backward() is running: what the frames and globals reach is
		// what an earlier walk during it found (reach_memo.go)
		horizon, reused = s.reachMemo(w, key, above, visit, frames)
	} else {
		s.memo, s.memoFramed = nil, false
		// every frame may grow: its values' growth noted between walks
		// extends it at the next (extendGrown)
		frames.SetGrowable(math.MaxInt)
		// The globals, then the main thread's frames bottom-up, each
		// credited with what it reaches (backend.Frames); those that
		// cannot have changed since the last walk are not walked again.
		var who string
		horizon, who = s.frames.walk(w, s.thread, s.stamp(), frames, len(s.loading) == 0 && !s.keepOff, s.engineFrames(w, frames, 0), s.tctx, s.reachGlobals, s.globalsKey())
		w.Outermost = who
		frames.Enter(-1)
	}
	for _, r := range s.roots {
		(*r).Reach(w)
	}
	w.Engine(func(r *tensor.Reacher) { r.Context(s.tctx) })
	if memo || !s.frames.castsDone {
		// the autocast cache's casts, when the frame of the call that
		// keeps them did not take them (frameCache.walkCasts)
		w.Engine(func(r *tensor.Reacher) { r.CastsFrom(s.tctx, 0) })
	}
	for _, t := range s.loading {
		var none frameCache
		none.walk(w, t, 0, nil, false, belowFrames{}, nil, nil, globalsKey{})
	}
	if b, who, ok := w.Bound(); ok && b <= horizon {
		// the autograd engine: its running node began at b
		horizon, w.Outermost = b, who
	}
	done := w.Finish()
	retry := s.frames.pins.end(w, done)
	return backend.Walk{
		Retry:   retry,
		Done:    done,
		Stopped: w.Stopped(),
		// A module being loaded runs on a thread of its own, whose steps
		// are not the stamp clock's.
		Complete: done && w.Complete() && len(s.loading) == 0,
		Horizon:  horizon,
		Spans:    slices.Clone(w.Spans()),
		Why:      w.Why(),
		Holder:   w.Outermost,
		Reused:   reused,
		Visited:  w.Visited(),
	}
}

// reachGlobals walks the roots that are not frames: the globals the user
// bound, loaded modules, the open experiments and the pending restores.
// Walks credit what it reaches to a frame of its own below the call
// stack's (frameCache.walk), kept while globalsKey stands.
func (s *Session) reachGlobals(w *env.Walker) {
	for name := range s.user {
		w.Value(s.live[name])
	}
	for _, e := range s.loaded {
		if e != nil {
			w.Values(e.globals)
		}
	}
	for _, e := range s.stack {
		w.Value(e)
	}
	for _, p := range s.pending {
		w.Value(p.seen)
		w.Value(p.restore)
	}
}

// globalsKey is what must not move for a walk to keep what the last one
// found in the globals (reachGlobals): the Session's count of changes to
// them (a global assigned, a statement begun or ended, an experiment
// opened or finished, Set) and their sizes. What the values they hold
// refer to is watched as the frames' is (starlark.Mutations).
type globalsKey struct {
	gen                                uint64
	live, user, loaded, stack, pending int
}

func (s *Session) globalsKey() globalsKey {
	return globalsKey{s.globalsGen, len(s.live), len(s.user), len(s.loaded), len(s.stack), len(s.pending)}
}

// stamp is the stamp clock of the Session's allocations and built-in
// frames: the steps the main thread has run (going on across the
// per-statement reset of --max-steps), plus its call entries and exits,
// plus the tensor Context's ticks (one per autograd node). Go code that
// runs now, outside any built-in (an operator on tensors, the Session
// between statements), stamps what it allocates with the current value;
// a built-in's Go code, what it allocates with its frame's stamp or
// later. Each term only grows, so the clock does.
func (s *Session) stamp() uint64 {
	return s.stepBase + s.thread.Steps + s.thread.Calls + s.tctx.Ticks()
}

// layoutClock is the layout clock (backend.Manager.SetLayoutClock):
// the steps the main thread has run (across the per-statement reset of
// --max-steps) plus its call entries and exits. It moves between two
// allocations whenever Starlark may have dropped a value: in
// `a * b + c * d` the product a * b is dropped by the instruction that
// adds, between the second product's allocation and the sum's.
func (s *Session) layoutClock() uint64 {
	return s.stepBase + s.thread.Steps + s.thread.Calls
}

// frameCache is what a walk found in the frames of the main thread, for
// the next walk to keep (backend.Frames): for each frame, numbered from
// the bottom of the stack, the least horizon of the frames up to it, the
// built-in that gave it, and why the walk of those frames was incomplete,
// if it was.
//
// A frame's values cannot change while it waits for the call above it:
// its locals, operand stack, arguments and loop iterables stay as they
// were (starlark.Thread.LowWater says which frames have not run since the
// last walk). What those values refer to can change only through code
// that changes an existing value — a list, dict or set that a walk met
// mutated (env.Walker watches them: starlark.List.Watch), a field or
// element assigned, a callable that is not pure run (starlark.IsPure:
// its entry and every return into it; modules, nn.functional and the
// tensor ops that make new tensors are pure) — which moves
// starlark.Mutations; and Go code that makes a value let go of memory
// notes it (backend.Manager.NoteGarbage), which makes the Manager forget
// the credits. So while Mutations has not moved, a walk keeps the frames
// below the low-water mark but one, and does not look again into the
// autograd nodes, tensors and modules an earlier walk met in a kept frame
// (backend.Frames.Visit). A walk made while a callable that is not pure
// runs (the reclaim was called from its Go code, which goes on after it)
// is not kept from. MEMSH_REACH_KEEP=0 keeps nothing (to compare).
type frameCache struct {
	thread    *starlark.Thread
	mutations uint64 // the thread's Mutations() after the last walk
	usable    bool   // the next walk may keep frames of the last one
	horizon   []uint64
	who, why  []string
	// the globals' key at the last walk (globalsKey), and why their walk
	// was incomplete, if it was
	globals    globalsKey
	globalsWhy string
	// the long lists and dicts walked as frames of their own
	// (reach_pins.go), and those the globals met when they were walked
	// and the stack's frames 0..i when they were (a kept frame still
	// reaches them)
	pins        pinSet
	globalsPins uint64
	stackPins   []uint64
	// the autocast cache's casts, credited to the frame of the
	// nn.autocast call that keeps them (tensor.AutocastState.Owner):
	// whether this walk did so (castsDone), and the last walk's owner,
	// that frame's index in the stack, the casts it met and the cache's
	// generation then (tensor.Casts)
	castsDone  bool
	castsOwner uint64
	castsAt    int
	castsN     int
	castsGen   uint64
}

// belowFrames are frames a walk puts below the globals and the call
// stack: the autograd engine's while backward() runs (engineFrames). n
// is how many; keepable, whether their credits may be kept (then the
// ones above may be too); walk walks those from kept up, and reports
// false when the walk was stopped (an interrupt).
type belowFrames struct {
	n        int
	keepable bool
	walk     func(kept int) bool
}

// walk walks the pinned lists and dicts (reach_pins.go: when it keeps what it can
// and there are no frames below), the frames below (below.walk), the
// globals (the roots that are not frames; nil for none), then the call
// stack of thread bottom-up, each frame as walkFrame does (and the frame
// of the nn.autocast call that keeps ctx's autocast cache, if ctx is not
// nil, its casts: walkCasts), keeping what it can of the last walk when
// keep is set and frames is not nil, and returns the horizon and the
// built-in that gave it. The pins are
// backend.Frames' bottom frames, kept while the thread's Mutations stands;
// the globals are a frame of their own above them and the frames below,
// and below the call stack's: kept while their key (gk) stands and the
// frames' rules allow keeping any frame; the stack's frame i is Frames'
// pins+below.n+1+i then.
func (c *frameCache) walk(w *env.Walker, thread *starlark.Thread, now uint64, frames *backend.Frames, keep bool, below belowFrames, ctx *tensor.Context, globals func(*env.Walker), gk globalsKey) (uint64, string) {
	c.castsDone = false
	if frames == nil {
		ctx = nil
	}
	depth := 0
	if thread != nil {
		depth = thread.CallStackDepth()
	}
	np, stand := 0, math.MaxInt // the pins, and the bottom frames whose numbers stand
	if frames != nil && keep && below.n == 0 {
		np, stand = c.pins.begin(w)
	} else {
		c.pins.unpinAll()
	}
	nb := np + below.n // the Frames number of the globals
	base := nb         // the Frames number of the stack's frame 0
	if globals != nil {
		base++
	}
	kept := 0 // Frames kept, the pins, the frames below and the globals' included
	if frames != nil {
		n := 0
		if below.keepable {
			n = nb
			same := keep && c.usable && c.thread == thread && thread.Mutations() == c.mutations && !c.pins.keepNone
			// a list that grew without moving Mutations (reach_pins.go):
			// the pin's frame that met it takes its elements in, or,
			// when none did, the globals and the stack are walked again
			if !same {
				n = below.n
			} else if (globals == nil || gk == c.globals) && !c.pins.loose {
				n = base + min(thread.LowWater()-1, len(c.horizon))
			}
			// pins added or gone (the collector took one): the frames
			// above them were numbered otherwise
			n = min(n, stand)
		}
		kept = frames.Keep(n)
		var ok bool
		if kept, ok = extendGrown(w, frames, kept); !ok {
			return now, ""
		}
	}
	if np > 0 {
		var ok bool
		if kept, ok = c.pins.walk(w, frames, kept); !ok {
			return now, ""
		}
	}
	if below.n > 0 && !below.walk(min(kept, below.n)) {
		return now, ""
	}
	if globals != nil {
		if kept > nb {
			if c.globalsWhy != "" {
				w.Incomplete(c.globalsWhy)
			}
			c.pins.outside |= c.globalsPins
		} else {
			if frames != nil {
				frames.Enter(nb)
			}
			met := c.pins.outside
			globals(w)
			w.Settle()
			c.globalsPins = c.pins.outside &^ met
			if w.Stopped() {
				if frames != nil {
					frames.Drop(nb)
				}
				return now, ""
			}
			c.globals, c.globalsWhy = gk, w.Why()
		}
	}
	if ctx != nil {
		var ok bool
		if kept, ok = c.extendCasts(w, frames, ctx, base, kept); !ok {
			return now, ""
		}
	}
	stackKept := max(0, kept-base)
	c.horizon, c.who, c.why = c.horizon[:stackKept], c.who[:stackKept], c.why[:stackKept]
	c.stackPins = c.stackPins[:min(stackKept, len(c.stackPins))]
	if n := len(c.stackPins); n > 0 {
		c.pins.outside |= c.stackPins[n-1]
	}
	// the frames' own bounds (the walk's now is not one: a kept frame's
	// bound must not be an earlier walk's now)
	horizon, who, why := uint64(math.MaxUint64), "", ""
	if stackKept > 0 {
		horizon, who, why = c.horizon[stackKept-1], c.who[stackKept-1], c.why[stackKept-1]
		if why != "" {
			w.Incomplete(why)
		}
	}
	for i := stackKept; i < depth && !w.Stopped(); i++ {
		if frames != nil {
			frames.Enter(base + i)
		}
		fr := thread.DebugFrame(depth - 1 - i)
		met := c.pins.outside
		b, by := walkFrame(w, fr, i == depth-1)
		if ctx != nil {
			c.walkCasts(w, ctx, fr, i)
		}
		horizon, who = lowerBound(horizon, who, b, by)
		w.Settle()
		if w.Stopped() {
			// cut short: the frame's credits are partial (the walk is not
			// Done; the frames below it can be kept next time)
			if frames != nil {
				frames.Drop(base + i)
			}
			break
		}
		if why == "" {
			why = w.Why()
		}
		c.horizon, c.who, c.why = append(c.horizon, horizon), append(c.who, who), append(c.why, why)
		below := uint64(0)
		if n := len(c.stackPins); n > 0 {
			below = c.stackPins[n-1]
		}
		c.stackPins = append(c.stackPins, below|c.pins.outside&^met)
	}
	c.thread, c.mutations, c.usable = thread, thread.Mutations(), keep && frames != nil && depth > 0 && starlark.IsPure(thread.DebugFrame(0).Callable())
	if thread != nil {
		thread.ResetLowWater()
	}
	return clampHorizon(horizon, who, now)
}

// The autocast cache's casts are held by the Context until the outermost
// autocast region is left, which is when the nn.autocast call that entered
// it returns: they are the values of that call's frame, its Owner
// (tensor.AutocastState), and credited to it. The frame is kept as any
// other (it waits for the function it called), and the casts made since
// the last walk extend it (backend.Frames.Extend): the cache only grows
// until it is cleared, which its owner's return does. Casts whose owner
// is no frame (a region entered from Go code), and every walk during
// backward(), walk the casts apart, after the frames (Session.reach).

// extendCasts extends the stack's kept frame that owns ctx's casts by the
// casts made since the last walk, if the owner is the last walk's; or, if
// the cache was cleared since (which only its owner's return does),
// forgets the frames from the owner's up. It returns the frames kept
// after, and false if the walk was stopped.
func (c *frameCache) extendCasts(w *env.Walker, frames *backend.Frames, ctx *tensor.Context, base, kept int) (int, bool) {
	casts, gen, owner := tensor.Casts(ctx)
	at := base + c.castsAt
	if owner == 0 || owner != c.castsOwner || at >= kept {
		return kept, true
	}
	if gen != c.castsGen || len(casts) < c.castsN {
		frames.Drop(at)
		return at, true
	}
	if len(casts) > c.castsN {
		frames.Extend(at)
		from := c.castsN
		w.Engine(func(r *tensor.Reacher) { r.CastsFrom(ctx, from) })
		w.Settle()
		if w.Stopped() {
			frames.Drop(at)
			return at, false
		}
		kept = frames.EndExtend()
		c.castsN = len(casts)
	}
	c.castsDone = true
	return kept, true
}

// walkCasts walks ctx's casts, as values of fr, the stack's frame i, if
// fr is the frame of the call that owns them.
func (c *frameCache) walkCasts(w *env.Walker, ctx *tensor.Context, fr starlark.DebugFrame, i int) {
	casts, gen, owner := tensor.Casts(ctx)
	if owner == 0 || c.castsDone || fr.Stamp() != owner {
		return
	}
	if _, ok := fr.Callable().(*starlark.Builtin); !ok {
		return
	}
	w.Engine(func(r *tensor.Reacher) { r.CastsFrom(ctx, 0) })
	c.castsDone, c.castsOwner, c.castsAt, c.castsN, c.castsGen = true, owner, i, len(casts), gen
}

// extendGrown extends each of the kept frames by the values noted grown
// in it since the last walk (backend.Frames.Grown: a leaf given its first
// gradient, the state an optimizer made), instead of walking it again,
// and returns the frames kept after (fewer if an extension took values
// over from a frame above), and false if the walk was stopped.
func extendGrown(w *env.Walker, frames *backend.Frames, kept int) (int, bool) {
	for i := 0; i < kept && frames.Growing(); i++ {
		grown := frames.Grown(i)
		if len(grown) == 0 {
			continue
		}
		frames.Extend(i)
		for _, v := range grown {
			walkGrown(w, v)
		}
		w.Settle()
		if w.Stopped() {
			frames.Drop(i)
			return i, false
		}
		kept = frames.EndExtend()
	}
	return kept, true
}

// walkGrown walks a value noted grown: a tensor's autograd state (its
// first gradient), or what an engine value came to hold
// (tensor.Grown).
func walkGrown(w *env.Walker, v any) {
	switch v := v.(type) {
	case *tensor.Tensor:
		w.Autograd(v)
	case tensor.ReachRoot:
		w.Engine(v.Reach)
	default:
		panic(fmt.Sprintf("scope: a value noted grown of type %T", v))
	}
}

// lowerBound returns the lower of the frames' bound so far (horizon, given
// by who) and a frame's (b, by), walking bottom-up: among equal stamps
// the outermost frame that names a built-in names it.
func lowerBound(horizon uint64, who string, b uint64, by string) (uint64, string) {
	if b < horizon || (b == horizon && who == "" && by != "") {
		return b, by
	}
	return horizon, who
}

// clampHorizon turns the frames' bound into the walk's horizon: now, the
// stamp clock's value, when no frame gives a lower one.
func clampHorizon(horizon uint64, who string, now uint64) (uint64, string) {
	if horizon > now || (horizon == now && who == "") {
		return now, ""
	}
	return horizon, who
}

// walkFrame walks one frame of a call stack: its callable (a function's
// defaults, free variables and module globals — for the outermost frame,
// the running top-level statement's or loaded module's — a bound
// method's receiver), the arguments of its call, and a Starlark
// function's frame's value slots and the values its for loops iterate.
//
// It returns the frame's bound on the horizon (backend.Walk) — the
// maximum stamp when it gives none — and its name: a built-in frame whose
// Go code may hold values no walk sees gives its entry stamp — every
// built-in but those that declared themselves transparent
// (starlark.Thread.DeclareTransparent) while they wait for the Starlark
// code they called; the innermost frame, when it is a built-in, is running
// its own Go code and counts too, unless it reports what it holds itself
// (starlark.Thread.DeclareReported: backward(), whose engine gives the
// Context a horizon of its own).
func walkFrame(w *env.Walker, fr starlark.DebugFrame, innermost bool) (uint64, string) {
	c := fr.Callable()
	w.Value(c)
	args, kwargs := fr.Args()
	w.Value(args)
	for _, kv := range kwargs {
		w.Value(kv)
	}
	fn, ok := c.(*starlark.Function)
	if !ok {
		if (innermost && !fr.Reported()) || !fr.Transparent() {
			return fr.Stamp(), c.Name()
		}
		return math.MaxUint64, ""
	}
	for _, v := range fr.Iterables() {
		w.Value(v)
	}
	for _, v := range frameSlots(w, fr, fn) {
		w.Value(v)
	}
	return math.MaxUint64, ""
}

// go.starlark.net gives each running function one array of value slots:
// its locals, then its operand stack (interp.go: space := make([]Value,
// nlocals+MaxStack); locals := space[:nlocals:nlocals]), and the frame
// keeps the locals slice. The operand stack holds the intermediate values
// of the expression being evaluated (the arguments of the call now
// running, a list being built by a comprehension); the Go collector sees
// the whole array, so the walk reads it whole too, through the offsets of
// the unexported fields found by reflection at the first walk. If the layout is not
// the one expected, only the locals are read (as starlark.DebugFrame
// gives them) and values on the stack stay unreached. A function without
// locals still has its frame's locals slice, empty, pointing at the start
// of the array (space[:0:0]), which is where the stack is read from.
var slotLayout = sync.OnceValue(func() (l struct {
	ok                        bool
	locals, funcode, maxStack uintptr
}) {
	thread := new(starlark.Thread)
	var frameType reflect.Type
	fn := starlark.NewBuiltin("probe", func(t *starlark.Thread, _ *starlark.Builtin, _ starlark.Tuple, _ []starlark.Tuple) (starlark.Value, error) {
		frameType = reflect.TypeOf(t.DebugFrame(0))
		return starlark.None, nil
	})
	if _, err := starlark.Call(thread, fn, nil, nil); err != nil || frameType == nil || frameType.Kind() != reflect.Pointer {
		return
	}
	lf, ok1 := frameType.Elem().FieldByName("locals")
	ff, ok2 := reflect.TypeFor[starlark.Function]().FieldByName("funcode")
	if !ok1 || !ok2 || lf.Type != reflect.TypeFor[[]starlark.Value]() || ff.Type.Kind() != reflect.Pointer {
		return
	}
	mf, ok3 := ff.Type.Elem().FieldByName("MaxStack")
	if !ok3 || mf.Type.Kind() != reflect.Int {
		return
	}
	l.ok, l.locals, l.funcode, l.maxStack = true, lf.Offset, ff.Offset, mf.Offset
	return
})

// frameSlots returns the value slots of fr, the frame of fn: locals and
// operand stack, or the locals alone when the layout is unknown.
func frameSlots(w *env.Walker, fr starlark.DebugFrame, fn *starlark.Function) []starlark.Value {
	layout := slotLayout()
	if !layout.ok {
		w.Incomplete("frame layout")
		out := make([]starlark.Value, 0, fr.NumLocals())
		for i := 0; i < fr.NumLocals(); i++ {
			_, v := fr.Local(i)
			out = append(out, v)
		}
		return out
	}
	p := reflect.ValueOf(fr).UnsafePointer()
	locals := *(*[]starlark.Value)(unsafe.Add(p, layout.locals))
	code := *(*unsafe.Pointer)(unsafe.Add(unsafe.Pointer(fn), layout.funcode))
	if locals == nil || code == nil {
		return nil // the frame is not running (its locals are cleared at return)
	}
	n := len(locals) + *(*int)(unsafe.Add(code, layout.maxStack))
	return unsafe.Slice(unsafe.SliceData(locals), n)
}
