package optim

import (
	"github.com/memsh/memsh/env"
	"github.com/memsh/memsh/tensor"
)

// Reach walks the optimizer's parameters and state, for the reclaim proof
// (env.Walker): the engine optimizer's Reach, which walks both, unless a
// walk that keeps the frame that met it need not (its mark); an engine
// optimizer without a Reach method has its parameters walked, its state
// left unreached.
func (o *Optimizer) Reach(w *env.Walker) {
	w.Values(o.group)
	if r, ok := o.o.(interface{ Reach(*tensor.Reacher) }); ok {
		w.Engine(r.Reach)
		return
	}
	for _, p := range o.params {
		w.Value(p)
	}
}

// Reach walks the scaler's tensors.
func (g *GradScaler) Reach(w *env.Walker) {
	if g.s != nil {
		w.Engine(g.s.Reach)
	}
}
