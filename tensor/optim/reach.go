package optim

import (
	"github.com/memsh/memsh/backend"
	"github.com/memsh/memsh/tensor"
)

// marked is an optimizer's mark for the reclaim's reach walk: a walk
// that keeps the frame that met the optimizer does not look into it
// again (backend.Frames), so the optimizer's step, which changes no
// reference of the values that hold it, keeps the frames of the
// functions below (the Starlark step() is a pure built-in). Every change
// to what the optimizer holds is noted: state made (grew: the frame is
// extended by the new tensors) or replaced or let go (changed: the frame
// is walked again).
type marked struct{ mark backend.Mark }

// visit reports whether the walk must look into the optimizer.
func (m *marked) visit(r *tensor.Reacher) bool { return r.Visit(&m.mark) }

// grew notes the state tensors ts made for a parameter of ctx (nil ones
// skipped).
func (m *marked) grew(ctx *tensor.Context, ts ...*tensor.Tensor) {
	tensor.NoteGrew(ctx, &m.mark, ts...)
}

// changed notes that the optimizer holds other state than when a walk
// last met it: a state tensor replaced or let go.
func (m *marked) changed(ctx *tensor.Context) { tensor.NoteHeld(ctx, &m.mark) }

// Reach passes the optimizer's parameters and state tensors to r, for the
// Manager's reclaim proof (tensor.Reacher).
func (o *Adam) Reach(r *tensor.Reacher) {
	if !o.visit(r) {
		return
	}
	for _, p := range o.params {
		r.Tensor(p)
	}
	for _, s := range o.byIndex {
		if s == nil {
			continue
		}
		r.Tensor(s.expAvg)
		r.Tensor(s.expAvgSq)
		r.Tensor(s.maxExpSq)
		r.Tensor(s.stepT)
	}
}

// Reach passes the optimizer's parameters and momentum buffers to r.
func (o *SGD) Reach(r *tensor.Reacher) {
	if !o.visit(r) {
		return
	}
	for _, p := range o.params {
		r.Tensor(p)
	}
	for _, b := range o.buf {
		r.Tensor(b)
	}
}

// Reach passes the scaler's scale, growth tracker and found_inf tensors
// to r.
func (g *GradScaler) Reach(r *tensor.Reacher) {
	r.Tensor(g.scale)
	r.Tensor(g.growthTracker)
	for _, s := range g.states {
		for _, t := range s.foundInf {
			r.Tensor(t)
		}
	}
}
