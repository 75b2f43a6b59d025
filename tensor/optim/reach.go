package optim

import "github.com/memsh/memsh/tensor"

// Reach passes the optimizer's parameters and state tensors to r, for the
// Manager's reclaim proof (tensor.Reacher).
func (o *Adam) Reach(r *tensor.Reacher) {
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
