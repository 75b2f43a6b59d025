package tensor

// AutogradMeta is a tensor's autograd state. Package tensor/autograd owns
// its meaning (requires_grad, grad, grad_fn, output_nr, retains_grad); the
// engine only carries it, so that ops know nothing of autograd.
type AutogradMeta struct {
	// RequiresGrad is a leaf's requires_grad flag (a non-leaf requires grad
	// through its GradFn).
	RequiresGrad bool
	// Grad is the accumulated gradient (.grad), or nil.
	Grad *Tensor
	// GradFn is the node that made the tensor, nil for a leaf.
	GradFn GradNode
	// OutputNr is which output of GradFn the tensor is.
	OutputNr int
	// RetainsGrad: retain_grad() was called on this non-leaf.
	RetainsGrad bool
	// Accumulator is a leaf's AccumulateGrad node, made on first use.
	Accumulator GradNode
	// IsParameter marks an nn.Parameter.
	IsParameter bool
	// PostAccumulateGradHooks run, in registration order, after a backward
	// accumulated the leaf's gradient
	// (Tensor.register_post_accumulate_grad_hook).
	PostAccumulateGradHooks []*PostAccumulateGradHook
}

// PostAccumulateGradHook is a leaf's post-accumulate-grad hook: Fn is
// called with the leaf; Held is what the layer above keeps for it (a
// Starlark callable), which the reach walk walks (Reacher.Value).
type PostAccumulateGradHook struct {
	Fn   func(*Tensor) error
	Held any
}

// GradNode is a node of the autograd graph (implemented by package
// tensor/autograd); the reach walk visits it (ReachNode) without a type
// assertion.
type GradNode interface {
	Name() string
	ReachNode
}

// Autograd returns t's autograd state, or nil if t never took part in
// autograd.
func (t *Tensor) Autograd() *AutogradMeta { return t.ag }

// SetAutograd replaces t's autograd state.
func (t *Tensor) SetAutograd(m *AutogradMeta) {
	t.ag = m
	t.reshaped()
}

// EnsureAutograd returns t's autograd state, creating it if needed.
func (t *Tensor) EnsureAutograd() *AutogradMeta {
	if t.ag == nil {
		t.ag = &AutogradMeta{}
		t.reshaped()
	}
	return t.ag
}
