package autograd

import (
	"github.com/memsh/memsh/tensor"
)

// Advanced indexing and index_add with PyTorch's nodes: what a
// Mixture-of-Experts block (transformers' MixtralSparseMoeBlock) does to
// gather its experts' tokens and add their outputs back.

// AdvancedIndex is ATen's index(a, indices) (tensor.AdvancedIndex: nil
// entries are whole dimensions). IndexBackward0 saves the index tensors
// and a's sizes, as derivatives.yaml does for index.Tensor; backward
// index_backward: zeros of a's sizes with the gradient accumulated at the
// indices (tensor.IndexBackward).
func AdvancedIndex(a *tensor.Tensor, indices []*tensor.Tensor) (*tensor.Tensor, error) {
	n := newNode("IndexBackward0", a)
	var saved []*SavedTensor
	if n != nil {
		saved = make([]*SavedTensor, len(indices))
		for i, x := range indices {
			saved[i] = n.save(x) // nil saves nothing
		}
	}
	out, err := tensor.AdvancedIndex(a, indices)
	if err != nil || n == nil {
		return out, err
	}
	shape := a.Shape()
	n.setOutputs(out)
	n.apply = func(n *Node, g []*tensor.Tensor) ([]*tensor.Tensor, error) {
		ix := make([]*tensor.Tensor, len(saved))
		for i, s := range saved {
			t, err := s.Unpack()
			if err != nil {
				return nil, err
			}
			ix[i] = t
		}
		r, err := tensor.IndexBackward(g[0], shape, ix)
		return []*tensor.Tensor{r}, err
	}
	return out, nil
}

// IndexAdd is torch.index_add(a, dim, index, source, alpha=alpha): a new
// tensor. IndexAddBackward0 saves index and source (for source's gradient
// only, as derivatives.yaml's formula uses them: grad.index_select(dim,
// index).expand_as(source), one allocation of source's shape) — so the
// source stays alive until backward; self's gradient is the incoming one.
func IndexAdd(a *tensor.Tensor, dim int, index, source *tensor.Tensor, alpha float64) (*tensor.Tensor, error) {
	n, si, ss := indexAddNode(a, index, source)
	out, err := tensor.IndexAdd(a, dim, index, source, alpha)
	if err != nil || n == nil {
		return out, err
	}
	n.apply = indexAddBackward(dim, alpha, source.Dim(), si, ss)
	n.setOutputs(out)
	return out, nil
}

// IndexAdd_ is a.index_add_(dim, index, source, alpha=alpha) in place:
// IndexAddBackward0 (as IndexAdd's) becomes a's grad_fn — also when a
// itself does not require grad (MoE's zeros that the experts' outputs are
// added into).
func IndexAdd_(a *tensor.Tensor, dim int, index, source *tensor.Tensor, alpha float64) error {
	if !recording(a, source) {
		return tensor.IndexAdd_(a, dim, index, source, alpha)
	}
	if err := checkInPlace(a); err != nil {
		return err
	}
	n, si, ss := indexAddNode(a, index, source)
	if err := tensor.IndexAdd_(a, dim, index, source, alpha); err != nil {
		return err
	}
	n.apply = indexAddBackward(dim, alpha, source.Dim(), si, ss)
	rebase(n, a)
	return nil
}

func indexAddNode(a, index, source *tensor.Tensor) (n *Node, si, ss *SavedTensor) {
	n = newNode("IndexAddBackward0", a, nil, source)
	if n != nil && n.needsGrad(2) {
		si = n.save(index)
		ss = n.save(source)
	}
	return n, si, ss
}

func indexAddBackward(dim int, alpha float64, sourceDim int, si, ss *SavedTensor) func(n *Node, g []*tensor.Tensor) ([]*tensor.Tensor, error) {
	return func(n *Node, g []*tensor.Tensor) ([]*tensor.Tensor, error) {
		res := make([]*tensor.Tensor, 3)
		if n.needsGrad(0) {
			res[0] = g[0]
		}
		if !n.needsGrad(2) {
			return res, nil
		}
		ix, err := si.Unpack()
		if err != nil {
			return nil, err
		}
		src, err := ss.Unpack()
		if err != nil {
			return nil, err
		}
		var r *tensor.Tensor
		if sourceDim > 0 {
			if r, err = tensor.IndexSelect(g[0], dim, ix); err != nil {
				return nil, err
			}
			if r, err = expand(r, src.Shape()); err != nil {
				return nil, err
			}
		} else {
			sq := ix
			if ix.Dim() > 0 {
				if sq, err = squeeze(ix, 0); err != nil {
					return nil, err
				}
			}
			if r, err = tensor.IndexSelect(g[0], dim, sq); err != nil {
				return nil, err
			}
		}
		if alpha != 1 {
			// maybe_multiply: grad * alpha, a second allocation
			if r, err = mulScalar(r, tensor.Float(alpha)); err != nil {
				return nil, err
			}
		}
		res[2] = r
		return res, nil
	}
}
