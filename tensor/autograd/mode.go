package autograd

import "github.com/memsh/memsh/tensor"

// GradEnabled reports whether ops in ctx record the graph
// (torch.is_grad_enabled).
func GradEnabled(ctx *tensor.Context) bool { return !ctx.GradDisabled }

// SetGradEnabled turns graph recording on or off and returns the previous
// state (torch.set_grad_enabled).
func SetGradEnabled(ctx *tensor.Context, on bool) (prev bool) {
	prev = !ctx.GradDisabled
	ctx.GradDisabled = !on
	return prev
}

// NoGrad runs f with graph recording off (torch.no_grad) and restores the
// previous state, also when f fails.
func NoGrad(ctx *tensor.Context, f func() error) error {
	prev := SetGradEnabled(ctx, false)
	defer SetGradEnabled(ctx, prev)
	return f()
}
