package autograd

import (
	"github.com/memsh/memsh/tensor"
)

// Activations and softmax: one ATen kernel forward, one backward kernel
// (one allocation) in the node, saving what derivatives.yaml saves.

// Gelu is gelu(a, approximate) ("none" or "tanh"): GeluBackward0 saves
// self; gelu_backward(grad, self, approximate), one allocation.
func Gelu(a *tensor.Tensor, approximate string) (*tensor.Tensor, error) {
	return unaryOp("GeluBackward0", a, false,
		func(t *tensor.Tensor) (*tensor.Tensor, error) { return tensor.Gelu(t, approximate) },
		func(g, x *tensor.Tensor) (*tensor.Tensor, error) { return tensor.GeluBackward(g, x, approximate) })
}

// Silu is silu(a): SiluBackward0 saves self; silu_backward(grad, self),
// one allocation.
func Silu(a *tensor.Tensor) (*tensor.Tensor, error) {
	return unaryOp("SiluBackward0", a, false, tensor.Silu, tensor.SiluBackward)
}

// Softmax is _softmax(a, dim): SoftmaxBackward0 saves the result;
// _softmax_backward_data(grad, result, dim), one allocation.
func Softmax(a *tensor.Tensor, dim int) (*tensor.Tensor, error) {
	return unaryOp("SoftmaxBackward0", a, true,
		func(t *tensor.Tensor) (*tensor.Tensor, error) { return tensor.Softmax(t, dim, false) },
		func(g, y *tensor.Tensor) (*tensor.Tensor, error) { return tensor.SoftmaxBackward(g, y, dim, false) })
}

// LogSoftmax is _log_softmax(a, dim): LogSoftmaxBackward0 saves the
// result; _log_softmax_backward_data(grad, result, dim), one allocation.
func LogSoftmax(a *tensor.Tensor, dim int) (*tensor.Tensor, error) {
	return unaryOp("LogSoftmaxBackward0", a, true,
		func(t *tensor.Tensor) (*tensor.Tensor, error) { return tensor.Softmax(t, dim, true) },
		func(g, y *tensor.Tensor) (*tensor.Tensor, error) { return tensor.SoftmaxBackward(g, y, dim, true) })
}

// SoftmaxDType is softmax(a, dim, dtype): with a dtype, a is converted
// first (a.to(dtype), ToCopyBackward0) and the converted copy is freed
// when the op returns unless the graph keeps it; log selects log_softmax.
func SoftmaxDType(a *tensor.Tensor, dim int, dt tensor.DType, log bool) (*tensor.Tensor, error) {
	defer setOptDType(a, &dt)()
	f := Softmax
	if log {
		f = LogSoftmax
	}
	if dt == tensor.Undefined || dt == a.DType() {
		return f(a, dim)
	}
	c, err := To(a, "", dt, false)
	if err != nil {
		return nil, err
	}
	defer a.Context().Hold(c)() // the cast lives to the end of the call
	return f(c, dim)
}
