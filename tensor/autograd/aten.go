package autograd

import (
	"github.com/memsh/memsh/tensor"
)

// The engine calls autograd's formulas make, in one place. Each is one
// ATen op: its allocations are the ones PyTorch's op makes.

func add(a, b *tensor.Tensor) (*tensor.Tensor, error) { return tensor.Add(a, b) }
func sub(a, b *tensor.Tensor) (*tensor.Tensor, error) { return tensor.Sub(a, b) }
func mul(a, b *tensor.Tensor) (*tensor.Tensor, error) { return tensor.Mul(a, b) }
func div(a, b *tensor.Tensor) (*tensor.Tensor, error) { return tensor.Div(a, b) }
func neg(a *tensor.Tensor) (*tensor.Tensor, error)    { return tensor.Neg(a) }

func addScalar(a *tensor.Tensor, s tensor.Scalar) (*tensor.Tensor, error)  { return tensor.Add(a, s) }
func subScalar(a *tensor.Tensor, s tensor.Scalar) (*tensor.Tensor, error)  { return tensor.Sub(a, s) }
func mulScalar(a *tensor.Tensor, s tensor.Scalar) (*tensor.Tensor, error)  { return tensor.Mul(a, s) }
func divScalar(a *tensor.Tensor, s tensor.Scalar) (*tensor.Tensor, error)  { return tensor.Div(a, s) }
func rsubScalar(a *tensor.Tensor, s tensor.Scalar) (*tensor.Tensor, error) { return tensor.Sub(s, a) }

func addInPlace(a, b *tensor.Tensor) error {
	_, err := a.Add_(b)
	return err
}

func mm(a, b *tensor.Tensor) (*tensor.Tensor, error)  { return tensor.Matmul(a, b) }
func bmm(a, b *tensor.Tensor) (*tensor.Tensor, error) { return tensor.Matmul(a, b) }

func addmm(bias, a, b *tensor.Tensor) (*tensor.Tensor, error) { return tensor.Addmm(bias, a, b) }

func sum(t *tensor.Tensor, dims []int, keepdim bool) (*tensor.Tensor, error) {
	return tensor.Sum(t, dims, keepdim, t.DType())
}

func mean(t *tensor.Tensor, dims []int, keepdim bool) (*tensor.Tensor, error) {
	return tensor.Mean(t, dims, keepdim, t.DType())
}

func view(t *tensor.Tensor, shape []int) (*tensor.Tensor, error)    { return tensor.View(t, shape) }
func reshape(t *tensor.Tensor, shape []int) (*tensor.Tensor, error) { return tensor.Reshape(t, shape) }
func transpose(t *tensor.Tensor, d0, d1 int) (*tensor.Tensor, error) {
	return tensor.Transpose(t, d0, d1)
}
func permute(t *tensor.Tensor, dims []int) (*tensor.Tensor, error) { return tensor.Permute(t, dims) }
func expand(t *tensor.Tensor, shape []int) (*tensor.Tensor, error) { return tensor.Expand(t, shape) }
func unsqueeze(t *tensor.Tensor, d int) (*tensor.Tensor, error)    { return tensor.Unsqueeze(t, d) }
func squeeze(t *tensor.Tensor, d int) (*tensor.Tensor, error)      { return tensor.Squeeze(t, []int{d}) }
func narrow(t *tensor.Tensor, d, start, n int) (*tensor.Tensor, error) {
	return tensor.Narrow(t, d, start, n)
}
func selectIndex(t *tensor.Tensor, d, i int) (*tensor.Tensor, error) { return tensor.Select(t, d, i) }
func clone(t *tensor.Tensor) (*tensor.Tensor, error)                 { return tensor.Clone(t) }
func cat(ts []*tensor.Tensor, d int) (*tensor.Tensor, error)         { return tensor.Cat(ts, d) }
func stack(ts []*tensor.Tensor, d int) (*tensor.Tensor, error)       { return tensor.Stack(ts, d) }

func zerosLike(t *tensor.Tensor) (*tensor.Tensor, error) {
	return tensor.ZerosLike(t, t.DType(), t.Device())
}
func zeros(like *tensor.Tensor, shape []int, dt tensor.DType) (*tensor.Tensor, error) {
	return tensor.Zeros(like.Context(), shape, dt, like.Device())
}
func copyInto(dst, src *tensor.Tensor) error {
	_, err := dst.Copy_(src)
	return err
}

func onesLike(t *tensor.Tensor) (*tensor.Tensor, error) {
	return tensor.OnesLike(t, t.DType(), t.Device())
}

func toDType(t *tensor.Tensor, device string, dt tensor.DType) (*tensor.Tensor, error) {
	return tensor.To(t, device, dt, false)
}

func powScalar(t *tensor.Tensor, e float64) (*tensor.Tensor, error) { return tensor.PowScalar(t, e) }

func unary(op string, t *tensor.Tensor) (*tensor.Tensor, error) {
	switch op {
	case "exp":
		return tensor.Exp(t)
	case "log":
		return tensor.Log(t)
	case "tanh":
		return tensor.Tanh(t)
	case "sigmoid":
		return tensor.Sigmoid(t)
	case "sqrt":
		return tensor.Sqrt(t)
	case "relu":
		return tensor.Relu(t)
	case "abs":
		return tensor.Abs(t)
	case "rsqrt":
		return tensor.Rsqrt(t)
	case "sign":
		return tensor.Sign(t)
	}
	panic("autograd: unknown unary op " + op)
}

// backwardKernel runs one of ATen's fused backward kernels
// (threshold_backward, tanh_backward, sigmoid_backward): one allocation.
func backwardKernel(op string, g, y *tensor.Tensor) (*tensor.Tensor, error) {
	return tensor.BackwardKernel(op, g, y)
}

// hold keeps ts (nil ones skipped) reachable for the reclaim's proof
// until the returned release (tensor.Context.Hold): a formula's Go locals
// that it computes with while it allocates more, which a C++ formula's
// temporaries or results would keep alive. Without it the reclaim cannot
// prove them reachable and falls back to a Go collection.
func hold(ts ...*tensor.Tensor) (release func()) {
	for _, t := range ts {
		if t != nil {
			return t.Context().Hold(ts...)
		}
	}
	return func() {}
}
