// Package nn holds the engine side of memsh's layers: parameter creation
// with PyTorch's default initialisations (torch.nn.init and each layer's
// reset_parameters). Forward computations are autograd ops
// (tensor/autograd); the module tree and the Starlark layer values live in
// the binding (starlib/nn). The package knows nothing of Starlark.
package nn

import (
	"math"

	"github.com/memsh/memsh/tensor"
)

// KaimingUniform_ fills t from U(-b, b) with b = gain·√(3/fan_in), gain =
// √(2/(1+a²)) (torch.nn.init.kaiming_uniform_ with nonlinearity
// "leaky_relu"); a zero fan-in leaves t unchanged, as PyTorch.
func KaimingUniform_(t *tensor.Tensor, a float64, fanIn int) error {
	if fanIn == 0 || t.Numel() == 0 {
		return nil
	}
	gain := math.Sqrt(2 / (1 + a*a))
	bound := gain * math.Sqrt(3/float64(fanIn))
	return tensor.Uniform_(t, -bound, bound)
}

// BiasUniform_ fills t from U(-1/√fan_in, 1/√fan_in) (the bias init of
// Linear and Conv); a zero fan-in gives bound 0.
func BiasUniform_(t *tensor.Tensor, fanIn int) error {
	bound := 0.0
	if fanIn > 0 {
		bound = 1 / math.Sqrt(float64(fanIn))
	}
	return tensor.Uniform_(t, -bound, bound)
}

// NewLinearParams makes nn.Linear's weight [out, in] and, with bias, its
// bias [out], initialised as Linear.reset_parameters. Both are leaves
// that require grad, marked as parameters.
func NewLinearParams(c *tensor.Context, in, out int, bias bool, device string, dt tensor.DType) (w, b *tensor.Tensor, err error) {
	if w, err = Param(c, []int{out, in}, device, dt); err != nil {
		return nil, nil, err
	}
	if err = KaimingUniform_(w, math.Sqrt(5), in); err != nil {
		return nil, nil, err
	}
	if bias {
		defer c.Hold(w)()
		if b, err = Param(c, []int{out}, device, dt); err != nil {
			return nil, nil, err
		}
		if err = BiasUniform_(b, in); err != nil {
			return nil, nil, err
		}
	}
	return w, b, nil
}

// Param allocates an uninitialised parameter (torch.empty) and marks it a
// leaf that requires grad.
func Param(c *tensor.Context, shape []int, device string, dt tensor.DType) (*tensor.Tensor, error) {
	t, err := tensor.Empty(c, shape, dt, device)
	if err != nil {
		return nil, err
	}
	MarkParameter(t)
	return t, nil
}

// MarkParameter makes t an nn.Parameter: a leaf that requires grad.
func MarkParameter(t *tensor.Tensor) {
	m := t.EnsureAutograd()
	m.RequiresGrad = true
	m.IsParameter = true
}

// Filled allocates a parameter or buffer filled with v (ones_/zeros_).
func Filled(c *tensor.Context, shape []int, v float64, device string, dt tensor.DType, param bool) (*tensor.Tensor, error) {
	t, err := tensor.Full(c, shape, tensor.Float(v), dt, device)
	if err != nil {
		return nil, err
	}
	if param {
		MarkParameter(t)
	}
	return t, nil
}
