package tensor

import "github.com/memsh/memsh/env"

// Reach walks the engine tensor, for the reclaim proof (env.Walker).
func (t *Tensor) Reach(w *env.Walker) { w.Tensor(t.t) }

// Reach walks both tensors of a (values, indices) result.
func (r *valuesIndices) Reach(w *env.Walker) {
	w.Value(r.values)
	w.Value(r.indices)
}
