package optim

import (
	"github.com/memsh/memsh/env"
	"github.com/memsh/memsh/tensor"
)

// Reach walks the optimizer's parameters and state, for the reclaim proof
// (env.Walker); an engine optimizer without a Reach method leaves its
// state unreached.
func (o *Optimizer) Reach(w *env.Walker) {
	for _, p := range o.params {
		w.Value(p)
	}
	w.Values(o.group)
	if r, ok := o.o.(interface{ Reach(*tensor.Reacher) }); ok {
		w.Engine(r.Reach)
	}
}

// Reach walks the scaler's tensors.
func (g *GradScaler) Reach(w *env.Walker) {
	if g.s != nil {
		w.Engine(g.s.Reach)
	}
}
