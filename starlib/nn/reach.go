package nn

import (
	"github.com/memsh/memsh/env"
	startensor "github.com/memsh/memsh/starlib/tensor"
)

// Reach walks the module's parameters, buffers, children, other
// attributes and its forward function, for the reclaim proof (env.Walker).
// Children and tensors, most of what a model's modules hold, are walked
// directly rather than through Walker.Value's dispatch.
func (m *Layer) Reach(w *env.Walker) {
	if w.Stopped() || !w.Visit(&m.mark) {
		return
	}
	for _, v := range m.vals {
		switch v := v.(type) {
		case *Layer:
			v.Reach(w)
		case *startensor.Tensor:
			w.Tensor(v.Engine())
		default:
			w.Value(v)
		}
	}
	w.Value(m.userForward)
	if m.ddp != nil {
		w.Engine(m.ddp.reducer.Reach)
	}
	if m.zero != nil {
		w.Engine(m.zero.Reach)
	}
	if m.z3 != nil {
		// a ZeRO-3 model's module: the engine holds its partitions (its
		// gradient hooks on the parameters reach it too)
		w.Engine(m.z3.z.Reach)
	}
	if m.fsdp != nil {
		if g := m.fsdp.group; g != nil {
			w.Engine(g.Reach)
		}
		if c := m.fsdp.comm; c != nil {
			w.Engine(c.Reach)
		}
	}
}
