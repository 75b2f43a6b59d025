package autograd

import (
	"github.com/memsh/memsh/tensor"
)

// Losses. cross_entropy is CompositeImplicitAutograd in ATen: log_softmax
// (LogSoftmaxBackward0) then nll_loss_nd → nll_loss (NllLossBackward0),
// so its graph is those two nodes. mse_loss has its own node.

// logSoftmax is _log_softmax with LogSoftmaxBackward0 (saves its result;
// _log_softmax_backward_data(grad, result, dim): one allocation). Kept
// unexported: the public log_softmax belongs with the activations.
func logSoftmax(a *tensor.Tensor, dim int) (*tensor.Tensor, error) {
	n := newNode("LogSoftmaxBackward0", a)
	out, err := tensor.CELogSoftmax(a, dim)
	if err != nil || n == nil {
		return out, err
	}
	n.setOutputs(out)
	s := n.saveOutput(out, 0)
	n.apply = func(n *Node, g []*tensor.Tensor) ([]*tensor.Tensor, error) {
		y, err := s.Unpack()
		if err != nil {
			return nil, err
		}
		r, err := tensor.CELogSoftmaxBackward(g[0], y, dim)
		return []*tensor.Tensor{r}, err
	}
	return out, nil
}

// NllLoss is F.nll_loss(input, target, reduction, ignore_index) on
// log-probabilities [N, C] (or [C]): NllLossBackward0 saves self, target
// and total_weight (weight is None); the forward's total_weight (a 0-dim
// tensor) lives as long as the node.
func NllLoss(a, target *tensor.Tensor, red tensor.Reduction, ignoreIndex int64) (*tensor.Tensor, error) {
	release, err := castArgs(fp32, &a, &target)
	if err != nil {
		return nil, err
	}
	defer release()
	n := newNode("NllLossBackward0", a)
	var sSelf, sTarget *SavedTensor
	if n != nil {
		sSelf, sTarget = n.save(a), n.save(target)
	}
	out, tw, err := tensor.NllLoss(a, target, red, ignoreIndex)
	if err != nil || n == nil {
		return out, err
	}
	n.setOutputs(out)
	sTW := n.save(tw) // result1 of the forward, not differentiable
	n.apply = func(n *Node, g []*tensor.Tensor) ([]*tensor.Tensor, error) {
		x, err := sSelf.Unpack()
		if err != nil {
			return nil, err
		}
		t, err := sTarget.Unpack()
		if err != nil {
			return nil, err
		}
		w, err := sTW.Unpack()
		if err != nil {
			return nil, err
		}
		r, err := tensor.NllLossBackward(g[0], x, t, red, ignoreIndex, w)
		return []*tensor.Tensor{r}, err
	}
	return out, nil
}

// CrossEntropy is F.cross_entropy(input, target, ignore_index, reduction)
// with class-index targets: log_softmax(input, 1) then nll_loss. The
// log_softmax result is a C++ temporary kept only by the graph.
func CrossEntropy(a, target *tensor.Tensor, red tensor.Reduction, ignoreIndex int64) (*tensor.Tensor, error) {
	dim := 1
	if a.Dim() == 1 {
		dim = 0
	}
	if err := checkCrossEntropy(a, target); err != nil {
		return nil, err
	}
	lp, err := logSoftmax(a, dim)
	if err != nil {
		return nil, err
	}
	// held while nll_loss allocates, so that a reclaim then reaches it
	// instead of asking the collector whether this op still holds it
	defer lp.Context().Hold(lp)()
	return NllLoss(lp, target, red, ignoreIndex)
}

// checkCrossEntropy checks the arguments before anything is allocated
// (PyTorch checks them in nll_loss, after log_softmax; the check order
// changes no message).
func checkCrossEntropy(a, target *tensor.Tensor) error {
	return tensor.CheckNllLoss(a, target)
}

// MseLoss is F.mse_loss on operands of one shape (MseLossBackward0 saves
// self and target; self's gradient is mse_loss_backward(grad, self,
// target), target's mse_loss_backward(grad, target, self), one allocation
// each).
func MseLoss(a, b *tensor.Tensor, red tensor.Reduction) (*tensor.Tensor, error) {
	release, err := castArgs(fp32, &a, &b)
	if err != nil {
		return nil, err
	}
	defer release()
	n := newNode("MseLossBackward0", a, b)
	var sa, sb *SavedTensor
	if n != nil {
		sa, sb = n.save(a), n.save(b)
	}
	out, err := tensor.MseLoss(a, b, red)
	if err != nil || n == nil {
		return out, err
	}
	n.setOutputs(out)
	n.apply = func(n *Node, g []*tensor.Tensor) ([]*tensor.Tensor, error) {
		x, err := sa.Unpack()
		if err != nil {
			return nil, err
		}
		y, err := sb.Unpack()
		if err != nil {
			return nil, err
		}
		res := make([]*tensor.Tensor, 2)
		if n.needsGrad(0) {
			if res[0], err = tensor.MseLossBackward(g[0], x, y, red); err != nil {
				return nil, err
			}
		}
		if n.needsGrad(1) {
			if res[1], err = tensor.MseLossBackward(g[0], y, x, red); err != nil {
				return nil, err
			}
		}
		return res, nil
	}
	return out, nil
}
