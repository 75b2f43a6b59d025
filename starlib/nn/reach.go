package nn

import "github.com/memsh/memsh/env"

// Reach walks the module's parameters, buffers, children, other
// attributes and its forward function, for the reclaim proof (env.Walker).
func (m *Layer) Reach(w *env.Walker) {
	if m.reached == w.Epoch() {
		return
	}
	m.reached = w.Epoch()
	for _, v := range m.vals {
		w.Value(v)
	}
	w.Value(m.userForward)
}
