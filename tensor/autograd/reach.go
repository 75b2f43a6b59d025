package autograd

import "github.com/memsh/memsh/tensor"

// Mark marks n as met by the walk (tensor.ReachNode): false when the
// walk need not look into it (tensor.Reacher.Visit), or when it is from's
// AccumulateGrad node and holds nothing else.
func (n *Node) Mark(r *tensor.Reacher, from *tensor.Tensor) bool {
	if n == nil {
		return false
	}
	if e := n.pendingOf; e != nil && e.framed == r.Epoch {
		return false // a frame of its own in this walk (engine.ReachFrame)
	}
	if !r.Visit(&n.mark) {
		return false
	}
	return from == nil || n.variable != from || len(n.saved) > 0 || len(n.next) > 0
}

// Reach walks n for the Manager's reclaim proof (tensor.Reacher), once per
// walk: the tensors it saved (or what saved-tensor hooks packed for it),
// an AccumulateGrad node's variable, and the nodes its edges lead to. What
// a node's backward closure captures besides its saved tensors is not
// walked: it stays unreached, and the reclaim falls back to the collector.
func (n *Node) Reach(r *tensor.Reacher) {
	if n == nil {
		return
	}
	for _, t := range n.held {
		r.Tensor(t)
	}
	for _, h := range n.preHooks {
		if h.held != nil {
			r.Value(h.held)
		}
	}
	if n.doneIn != nil && n.doneIn.active {
		// ran and released by the backward that is running: what is
		// below it, that run reports (graphRun)
		if n.variable != nil {
			r.Tensor(n.variable)
		}
		return
	}
	for _, s := range n.saved {
		if s == nil {
			continue
		}
		if s.t != nil {
			r.Tensor(s.t)
		}
		if h := s.hooked; h != nil {
			switch p := h.packed.(type) {
			case *tensor.Tensor:
				r.Tensor(p)
			case *ckptHolder:
				// a checkpointed region's saved tensor: what the
				// recomputation produced for it, and the region's inputs
				if len(p.handles) > 0 { // most are empty: no map iteration
					for _, t := range p.handles {
						r.Tensor(t)
					}
				}
				if f := p.frame; f != nil && f.reached != r.Epoch {
					// once per walk for all the frame's holders
					f.reached = r.Epoch
					r.Node(f.saver)
					if f.keep != nil {
						r.Value(f.keep)
					}
				}
			case nil:
			default:
				r.Value(p)
			}
			if h.gradFn != nil {
				r.Node(h.gradFn)
			}
		}
	}
	if n.variable != nil {
		r.Tensor(n.variable)
	}
	for _, e := range n.next {
		if e.Node != nil {
			r.Node(e.Node)
		}
	}
}
