package tensor

import "github.com/memsh/memsh/backend"

// Reacher walks what holds device memory, for the Manager's proof that a
// reclaim would find nothing (backend.ReachFunc): the layer above starts
// it at its roots, calls Tensor for every tensor it reaches, and Drain at
// the end. It only follows references that exist; what it cannot look
// into it skips, which leaves that memory unreached and sends the reclaim
// to the collector.
type Reacher struct {
	// Epoch identifies this walk: autograd nodes remember the epoch they
	// were walked in, so a graph is walked once however many tensors
	// share it.
	Epoch uint64
	// Memory is called for every allocation reached.
	Memory func(*backend.Memory)
	// Other, if not nil, is called for values the engine keeps for the
	// layer above (what saved-tensor hooks packed).
	Other func(any)

	pending []ReachNode
}

// ReachNode is implemented by autograd nodes (package tensor/autograd):
// Reach calls r.Tensor for each tensor the node keeps alive (saved
// tensors, an AccumulateGrad node's variable) and r.Node for the nodes its
// edges lead to.
type ReachNode interface {
	Reach(r *Reacher)
}

// Tensor walks t: its memory, and its gradient, grad_fn and gradient
// accumulator when it has autograd state (nodes are walked by Drain).
func (r *Reacher) Tensor(t *Tensor) {
	for t != nil {
		if t.mem != nil {
			r.Memory(t.mem)
		}
		ag := t.ag
		if ag == nil {
			return
		}
		r.Node(ag.GradFn)
		r.Node(ag.Accumulator)
		t = ag.Grad
	}
}

// Node queues an autograd node (a GradNode) for Drain.
func (r *Reacher) Node(n any) {
	if rn, ok := n.(ReachNode); ok {
		r.pending = append(r.pending, rn)
	}
}

// Drain walks the queued nodes and all they lead to.
func (r *Reacher) Drain() {
	for len(r.pending) > 0 {
		n := r.pending[len(r.pending)-1]
		r.pending = r.pending[:len(r.pending)-1]
		n.Reach(r)
	}
}

// Context walks what the Context itself keeps alive: the tensors held in
// flight (Hold), the autocast cast cache (casts of parameters, held
// until the outermost autocast region ends) and the cuBLAS workspaces.
func (r *Reacher) Context(c *Context) {
	if c == nil {
		return
	}
	for _, t := range c.inFlight {
		r.Tensor(t)
	}
	if c.Autocast != nil {
		for _, t := range c.Autocast.Cache {
			r.Tensor(t)
		}
	}
	if c.blas != nil {
		for _, m := range c.blas.ws {
			r.Memory(m)
		}
	}
}

// Hold keeps ts reachable from the Context until the returned release is
// called: for tensors that Go code computes with while it allocates more,
// which only its local variables hold (the Go collector sees those; the
// reclaim proof does not). Calls nest: release in the reverse order;
// releasing a hold also releases the holds made after it.
func (c *Context) Hold(ts ...*Tensor) (release func()) {
	n := len(c.inFlight)
	c.inFlight = append(c.inFlight, ts...)
	return func() {
		clear(c.inFlight[n:])
		c.inFlight = c.inFlight[:n]
	}
}
