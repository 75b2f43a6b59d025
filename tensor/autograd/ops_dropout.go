package autograd

import (
	"fmt"

	"github.com/memsh/memsh/tensor"
)

// Dropout is dropout(x, p, train) with CUDA's dispatch (at::dropout):
//
//   - p == 0, not training, or an empty input: x itself (no node, no
//     allocation);
//   - p == 1: the composite path, x * zeros({}) — a 0-dim zero tensor (one
//     block, saved by MulBackward0 when x needs a gradient) and a zero
//     output;
//   - otherwise native_dropout: a bool mask then the output;
//     NativeDropoutBackward0 saves the mask (result1), and its backward is
//     native_dropout_backward(grad, mask, 1/(1-p)), one allocation.
//
// p outside [0, 1] is PyTorch's error.
func Dropout(x *tensor.Tensor, p float64, train bool) (*tensor.Tensor, error) {
	if p < 0 || p > 1 {
		return nil, fmt.Errorf("dropout probability has to be between 0 and 1, but got %s", pyFloat(p))
	}
	if err := x.CheckLive("tensor.dropout"); err != nil {
		return nil, err
	}
	if p == 0 || !train || x.Numel() == 0 {
		return x, nil
	}
	if p == 1 {
		z, err := tensor.Zeros(x.Context(), nil, x.DType(), x.Device())
		if err != nil {
			return nil, err
		}
		return Mul(x, z)
	}
	n := newNode("NativeDropoutBackward0", x)
	out, mask, err := tensor.NativeDropout(x, p)
	if err != nil || n == nil {
		return out, err
	}
	n.setOutputs(out, nil)
	sm := n.saveOutput(mask, 1)
	scale := 1 / (1 - p)
	n.apply = func(n *Node, g []*tensor.Tensor) ([]*tensor.Tensor, error) {
		if g[0] == nil {
			return []*tensor.Tensor{nil}, nil
		}
		mv, err := sm.Unpack()
		if err != nil {
			return nil, err
		}
		r, err := tensor.NativeDropoutBackward(g[0], mv, scale)
		return []*tensor.Tensor{r}, err
	}
	return out, nil
}

// pyFloat formats f as Python's repr of a float ("1.5", "2.0", "-0.1").
func pyFloat(f float64) string {
	s := fmt.Sprint(f)
	for _, c := range s {
		if c == '.' || c == 'e' || c == 'n' || c == 'I' {
			return s
		}
	}
	return s + ".0"
}
