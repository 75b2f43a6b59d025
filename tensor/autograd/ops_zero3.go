package autograd

import (
	"fmt"

	"github.com/memsh/memsh/tensor"
)

// LinearZeRO3 is DeepSpeed's LinearFunctionForZeroStage3 (ZeRO-3's
// F.linear with memory_efficient_linear, every nn.Linear of a stage-3
// model since DeepSpeed 0.19.4): x @ wᵀ (+ bias in place). Its ctx
// saves x and the weight and bias themselves — the parameter objects,
// not a view of their data — so a parameter the coordinator releases
// after the forward keeps no memory alive, and the backward reads what
// the pre-backward hook gathered again (w and bias are the node's held
// tensors: no version check). Backward: grad @ w for x, gradᵀ @ x (both
// folded to 2-D) for w, grad summed over the leading dims for bias.
func LinearZeRO3(x, w, bias *tensor.Tensor) (*tensor.Tensor, error) {
	ws, xs := w.Shape(), x.Shape()
	if len(ws) != 2 || len(xs) == 0 || xs[len(xs)-1] != ws[1] {
		return nil, fmt.Errorf("linear: cannot multiply an input of shape %v by a weight of shape %v", xs, ws)
	}
	n := newNode("LinearFunctionForZeroStage3Backward", x, w, bias)
	var sx *SavedTensor
	if n != nil {
		sx = n.save(x)
		n.held = []*tensor.Tensor{w}
		if bias != nil {
			n.held = append(n.held, bias)
		}
	}
	wt, err := transpose(w, 0, 1)
	if err != nil {
		return nil, err
	}
	out, err := tensor.Matmul(x, wt)
	if err != nil {
		return nil, err
	}
	if bias != nil {
		if _, err := tensor.BinaryInPlace(tensor.OpAdd, out, bias); err != nil {
			return nil, err
		}
	}
	if n == nil {
		return out, nil
	}
	in, o := ws[1], ws[0]
	n.apply = func(n *Node, g []*tensor.Tensor) ([]*tensor.Tensor, error) {
		res := make([]*tensor.Tensor, 3)
		w := n.held[0]
		ctx := ctxOf(n)
		if n.needsGrad(0) {
			r, err := mm(g[0], w)
			if err != nil {
				return nil, err
			}
			res[0] = r
		}
		defer ctx.Hold(res...)()
		if n.needsGrad(1) {
			xv, err := sx.Unpack()
			if err != nil {
				return nil, err
			}
			g2, err := reshape(g[0], []int{-1, o})
			if err == nil {
				g2, err = transpose(g2, 0, 1)
			}
			var x2 *tensor.Tensor
			if err == nil {
				x2, err = reshape(xv, []int{-1, in})
			}
			if err == nil {
				res[1], err = mm(g2, x2)
			}
			if err != nil {
				return nil, err
			}
		}
		if n.needsGrad(2) {
			defer ctx.Hold(res...)()
			r, err := sumTo(g[0], []int{o})
			if err != nil {
				return nil, err
			}
			res[2] = r
		}
		return res, nil
	}
	n.setOutputs(out)
	return out, nil
}
