package scope

import (
	"github.com/memsh/memsh/backend"
	"github.com/memsh/memsh/env"
	"github.com/memsh/memsh/tensor"
)

// While backward() runs, the nodes of the graph it has not run yet are
// frames of the reach walk of their own (tensor.FramedRoot), below the
// globals and the call stack's (frameCache.walk's frames below) or, in a
// walk made while backward() is the innermost frame, below the memo's
// roots (reachMemo): kept until the engine says what they reach changed.

// engineKey is what must not have moved since the last walk for a walk
// to keep the credits of the autograd engine's frames (walkEngineFrames):
// the same engine walked them, and no existing Starlark value changed
// (the thread's Mutations, starlark.Thread.Mutations: the frames reach a checkpoint's function and
// arguments) and no tensor the memo met gained or replaced its autograd
// state or storage (tensor.Context.ReachShape). What the engine changes in them
// (a node run, a checkpoint holder given its tensor, a gradient replaced)
// it tells the Manager itself, which forgets those frames' credits.
type engineKey struct {
	root                  tensor.FramedRoot
	mutations, reachShape uint64
	base                  int // the Frames number of its frame 0
}

// engineFrames returns the running autograd engine's frames
// (tensor.FramedRoot: the nodes of its graph not run yet) as the frames
// below a walk's (belowFrames), numbered from base in frames, and tells
// the engine the walk walks them. Their credits may be kept if the last
// walk walked them too, numbered alike, and nothing they reach moved
// (engineKey); none when no engine runs.
func (s *Session) engineFrames(w *env.Walker, frames *backend.Frames, base int) belowFrames {
	fr := s.tctx.Framed()
	if fr == nil {
		// after a backward, the last walk's frames were numbered above
		// its engine's: none is kept
		keepable := s.engine == engineKey{}
		s.engine, s.engineN = engineKey{}, 0
		return belowFrames{keepable: keepable}
	}
	fr.BeginFrames(w.Epoch(), base)
	key := engineKey{fr, s.thread.Mutations(), s.tctx.ReachShape(), base}
	// the engine's frames only go, from the top (a node runs); more of
	// them than at the last walk means that walk numbered others there
	// (the engine had not counted its graph yet)
	n := fr.Frames()
	keepable := key == s.engine && n <= s.engineN && !s.keepOff
	s.engine, s.engineN = key, n
	return belowFrames{n: n, keepable: keepable, walk: func(kept int) bool {
		return s.walkEngineFrames(w, frames, fr, kept, base)
	}}
}

// walkEngineFrames walks the engine's frames from kept up, frame i
// credited to frame base+i of backend.Frames (what made the walk of the
// kept ones incomplete applies again), and reports false if the walk was
// stopped.
func (s *Session) walkEngineFrames(w *env.Walker, frames *backend.Frames, fr tensor.FramedRoot, kept, base int) bool {
	s.engineWhy = s.engineWhy[:min(kept, len(s.engineWhy))]
	// what made the walk incomplete before the frames (the memo's roots)
	// is charged to them too: a kept frame must not hide an incomplete
	// walk of its own
	why := w.Why()
	if kept > 0 && why == "" {
		if why = s.engineWhy[kept-1]; why != "" {
			w.Incomplete(why)
		}
	}
	for i := kept; i < fr.Frames(); i++ {
		frames.Enter(base + i)
		w.Engine(func(r *tensor.Reacher) { fr.ReachFrame(r, i) })
		w.Settle()
		if w.Stopped() {
			frames.Drop(base + i)
			s.engine = engineKey{}
			return false
		}
		if why == "" {
			why = w.Why()
		}
		s.engineWhy = append(s.engineWhy, why)
	}
	return true
}
