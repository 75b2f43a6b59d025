package autograd

import (
	"sync"
	"sync/atomic"

	"github.com/memsh/memsh/tensor"
)

// An Observer hears what a memory breakdown (nn.track, package
// tensor/memtrack) needs from autograd: every tensor a node saves for its
// backward, the scope (the module running its forward) each new node is
// made in, and when the backward engine starts and ends each node. Any
// field may be nil.
type Observer struct {
	// Saved is called when a node saves a tensor for its backward.
	Saved func(s *SavedTensor)
	// Scope returns the current scope, stored on every new node (Node.Scope).
	Scope func() any
	// NodeStart and NodeEnd bracket the engine's evaluation of a node: its
	// apply, the reduction of its outputs to its inputs' shapes and the
	// accumulation of those in the next nodes' input buffers.
	NodeStart, NodeEnd func(n *Node)
}

var (
	observersMu sync.Mutex
	observers   = map[*tensor.Context]*Observer{}
	nObservers  atomic.Int32 // fast path: no Observer anywhere
)

// SetObserver makes o the Observer of ctx's graph (nil removes it) and
// returns a function that puts the previous one back.
func SetObserver(ctx *tensor.Context, o *Observer) (restore func()) {
	observersMu.Lock()
	defer observersMu.Unlock()
	prev := observers[ctx]
	set := func(o *Observer) {
		if observers[ctx] != nil {
			nObservers.Add(-1)
		}
		delete(observers, ctx)
		if o != nil {
			observers[ctx] = o
			nObservers.Add(1)
		}
	}
	set(o)
	return func() {
		observersMu.Lock()
		defer observersMu.Unlock()
		set(prev)
	}
}

func observerOf(ctx *tensor.Context) *Observer {
	if nObservers.Load() == 0 || ctx == nil {
		return nil
	}
	observersMu.Lock()
	defer observersMu.Unlock()
	return observers[ctx]
}

// Scope returns the scope the node was made in (see Observer.Scope), or
// nil.
func (n *Node) Scope() any { return n.scope }

// Tensor returns the saved tensor, or nil once its node released it (a
// backward without retain_graph). It does not check the version.
func (s *SavedTensor) Tensor() *tensor.Tensor {
	if s == nil || s.released {
		return nil
	}
	return s.t
}

// noteScope stores the observer's current scope on a new node.
func (n *Node) noteScope() {
	if o := observerOf(n.ctx); o != nil && o.Scope != nil {
		n.scope = o.Scope()
	}
}

// noteSaved tells the observer about a saved tensor.
func noteSaved(s *SavedTensor) {
	if o := observerOf(s.node.ctx); o != nil && o.Saved != nil {
		o.Saved(s)
	}
}
