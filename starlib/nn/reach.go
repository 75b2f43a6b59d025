package nn

import "github.com/memsh/memsh/env"

// Reach walks the module's parameters, buffers, children, other
// attributes and its forward function, for the reclaim proof (env.Walker).
func (m *Layer) Reach(w *env.Walker) {
	if env.Seen(w, m) {
		return
	}
	for _, v := range m.entries { // any order: the walk only collects
		w.Value(v)
	}
	w.Value(m.userForward)
}
