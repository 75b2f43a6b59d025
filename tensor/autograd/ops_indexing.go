package autograd

import (
	"fmt"

	"github.com/memsh/memsh/tensor"
)

// Indexing and masking ops with PyTorch's backward nodes: embedding,
// index_select, masked_fill(_), triu/tril, where, split/chunk.

// Embedding is F.embedding(indices, weight, padding_idx) (paddingIdx −1:
// none). EmbeddingBackward0 saves indices (and weight's row count);
// backward is embedding_dense_backward, a dense [num_weights, dim]
// gradient (rows at padding_idx stay zero).
func Embedding(weight, indices *tensor.Tensor, paddingIdx int64) (*tensor.Tensor, error) {
	n := newNode("EmbeddingBackward0", weight, nil)
	var si *SavedTensor
	if n != nil {
		si = n.save(indices)
	}
	out, err := tensor.Embedding(weight, indices)
	if err != nil || n == nil {
		return out, err
	}
	numWeights := weight.Shape()[0]
	n.setOutputs(out)
	n.apply = func(n *Node, g []*tensor.Tensor) ([]*tensor.Tensor, error) {
		idx, err := si.Unpack()
		if err != nil {
			return nil, err
		}
		r, err := tensor.EmbeddingDenseBackward(g[0], idx, numWeights, paddingIdx)
		return []*tensor.Tensor{r, nil}, err
	}
	return out, nil
}

// IndexSelect is torch.index_select(t, dim, index). IndexSelectBackward0
// saves index; backward zeros(self sizes).index_add_(dim, index, grad).
func IndexSelect(a *tensor.Tensor, dim int, index *tensor.Tensor) (*tensor.Tensor, error) {
	n := newNode("IndexSelectBackward0", a, nil)
	var si *SavedTensor
	if n != nil {
		si = n.save(index)
	}
	out, err := tensor.IndexSelect(a, dim, index)
	if err != nil || n == nil {
		return out, err
	}
	shape := a.Shape()
	n.setOutputs(out)
	n.apply = func(n *Node, g []*tensor.Tensor) ([]*tensor.Tensor, error) {
		idx, err := si.Unpack()
		if err != nil {
			return nil, err
		}
		r, err := tensor.IndexSelectBackward(g[0], shape, dim, idx)
		return []*tensor.Tensor{r, nil}, err
	}
	return out, nil
}

// maskedFillBackward is grad.masked_fill(mask, 0).
func maskedFillBackward(s *SavedTensor) func(n *Node, g []*tensor.Tensor) ([]*tensor.Tensor, error) {
	return func(n *Node, g []*tensor.Tensor) ([]*tensor.Tensor, error) {
		m, err := s.Unpack()
		if err != nil {
			return nil, err
		}
		r, err := tensor.MaskedFill(g[0], m, tensor.Int(0))
		return []*tensor.Tensor{r, nil}, err
	}
}

// MaskedFill is t.masked_fill(mask, value): MaskedFillBackward0 saves
// mask (so a `mask == 0` temporary lives until backward).
func MaskedFill(a, mask *tensor.Tensor, v tensor.Scalar) (*tensor.Tensor, error) {
	n := newNode("MaskedFillBackward0", a, nil)
	var sm *SavedTensor
	if n != nil {
		sm = n.save(mask)
	}
	out, err := tensor.MaskedFill(a, mask, v)
	if err != nil || n == nil {
		return out, err
	}
	n.setOutputs(out)
	n.apply = maskedFillBackward(sm)
	return out, nil
}

// MaskedFill_ is t.masked_fill_(mask, value) in place (MaskedFillBackward0
// becomes t's grad_fn).
func MaskedFill_(a, mask *tensor.Tensor, v tensor.Scalar) error {
	if !recording(a) {
		return tensor.MaskedFill_(a, mask, v)
	}
	if err := checkInPlace(a); err != nil {
		return err
	}
	n := newNode("MaskedFillBackward0", a, nil)
	sm := n.save(mask)
	if err := tensor.MaskedFill_(a, mask, v); err != nil {
		return err
	}
	n.apply = maskedFillBackward(sm)
	rebase(n, a)
	return nil
}

// Triangle is t.triu(k) / t.tril(k): TriuBackward0 / TrilBackward0 save
// nothing; backward grad.triu(k) / grad.tril(k).
func Triangle(a *tensor.Tensor, k int, upper bool) (*tensor.Tensor, error) {
	name := "TrilBackward0"
	if upper {
		name = "TriuBackward0"
	}
	n := newNode(name, a)
	out, err := tensor.Triangle(a, k, upper)
	if err != nil || n == nil {
		return out, err
	}
	n.setOutputs(out)
	n.apply = func(n *Node, g []*tensor.Tensor) ([]*tensor.Tensor, error) {
		r, err := tensor.Triangle(g[0], k, upper)
		return []*tensor.Tensor{r}, err
	}
	return out, nil
}

// whereScalar is where(cond, x, s) or where(cond, s, x) with a number s,
// as ATen's Scalar overloads: at::scalar_tensor(s) on x's device (a
// temporary), then where.self.
func whereScalar(cond, x *tensor.Tensor, s tensor.Scalar, scalarFirst bool) (*tensor.Tensor, error) {
	st, err := tensor.ScalarTensor(x.Context(), s, x.DType(), x.Device())
	if err != nil {
		return nil, err
	}
	if scalarFirst {
		return tensor.Where(cond, st, x)
	}
	return tensor.Where(cond, x, st)
}

// Where is torch.where(cond, a, b); either of a and b may be a number
// (nil tensor, with its Scalar). WhereBackward0 saves condition; backward
// where(cond, grad, 0) for a and where(cond, 0, grad) for b, each making
// a 0-dim scalar_tensor(0) first.
func Where(cond, a, b *tensor.Tensor, sa, sb tensor.Scalar) (*tensor.Tensor, error) {
	var tmp *tensor.Tensor
	var err error
	switch {
	case a == nil && b == nil:
		if tmp, err = tensor.ScalarTensor(cond.Context(), sa, tensor.PromoteTypes(sa.DType(), sb.DType()), cond.Device()); err != nil {
			return nil, err
		}
		a = tmp
		if b, err = tensor.ScalarTensor(cond.Context(), sb, tmp.DType(), cond.Device()); err != nil {
			return nil, err
		}
	case a == nil:
		if a, err = tensor.ScalarTensor(b.Context(), sa, b.DType(), b.Device()); err != nil {
			return nil, err
		}
	case b == nil:
		if b, err = tensor.ScalarTensor(a.Context(), sb, a.DType(), a.Device()); err != nil {
			return nil, err
		}
	}
	// the scalars' tensors are Go locals while the result is made
	defer hold(a, b)()
	n := newNode("WhereBackward0", nil, a, b)
	var sc *SavedTensor
	if n != nil {
		sc = n.save(cond)
	}
	out, err := tensor.Where(cond, a, b)
	if err != nil || n == nil {
		return out, err
	}
	n.setOutputs(out)
	n.apply = func(n *Node, g []*tensor.Tensor) ([]*tensor.Tensor, error) {
		c, err := sc.Unpack()
		if err != nil {
			return nil, err
		}
		res := make([]*tensor.Tensor, 3)
		if n.needsGrad(1) {
			if res[1], err = whereScalar(c, g[0], tensor.Int(0), false); err != nil {
				return nil, err
			}
		}
		if n.needsGrad(2) {
			if res[2], err = whereScalar(c, g[0], tensor.Int(0), true); err != nil {
				return nil, err
			}
		}
		return res, nil
	}
	return out, nil
}

// Split is t.split(size, dim) (sizes nil) or t.split(sizes, dim) — views
// along dim. SplitBackward0 / SplitWithSizesBackward0: the outputs'
// gradients are concatenated (one allocation of the input's size), with
// zeros made first for outputs that got none.
func Split(a *tensor.Tensor, size int, sizes []int, dim int) ([]*tensor.Tensor, error) {
	shape := a.Shape()
	d := dim
	if d < 0 {
		d += len(shape)
	}
	if d < 0 || d >= len(shape) {
		_, err := tensor.Narrow(a, dim, 0, 0)
		return nil, err
	}
	name := "SplitWithSizesBackward0"
	if sizes == nil {
		name = "SplitBackward0"
		if size < 0 {
			return nil, idxErr("tensor.split", "split expects split_size be non-negative, but got split_size=%d", size)
		}
		if size == 0 && shape[d] != 0 {
			return nil, idxErr("tensor.split", "split_size can only be 0 if dimension size is 0, but got dimension size of %d", shape[d])
		}
		for off := 0; off < shape[d] || (off == 0 && shape[d] == 0); off += max(size, 1) {
			sizes = append(sizes, min(size, shape[d]-off))
			if shape[d] == 0 {
				break
			}
		}
	} else {
		sum := 0
		for _, s := range sizes {
			if s < 0 {
				return nil, idxErr("tensor.split", "split_with_sizes expects split_sizes have only non-negative entries, but got split_sizes=%v", sizes)
			}
			sum += s
		}
		if sum != shape[d] {
			return nil, idxErr("tensor.split", "split_with_sizes expects split_sizes to sum exactly to %d (input tensor's size at dimension %d), but got split_sizes=%s", shape[d], dim, tensor.SizeString(sizes))
		}
	}
	outs := make([]*tensor.Tensor, len(sizes))
	off := 0
	for i, s := range sizes {
		v, err := tensor.Narrow(a, d, off, s)
		if err != nil {
			return nil, err
		}
		outs[i] = v
		off += s
	}
	n := newNode(name, a)
	if n == nil {
		return outs, nil
	}
	// The node keeps the input's metadata, never the input: the views'
	// base is freed once no output is alive (as in PyTorch).
	dt, ctx, dev := a.DType(), a.Context(), a.Device()
	n.setOutputs(outs...)
	n.apply = func(n *Node, g []*tensor.Tensor) ([]*tensor.Tensor, error) {
		all := make([]*tensor.Tensor, len(sizes))
		for i, s := range sizes {
			if i < len(g) && g[i] != nil {
				all[i] = g[i]
				continue
			}
			gs := append([]int(nil), shape...)
			gs[d] = s
			z, err := tensor.Zeros(ctx, gs, dt, dev)
			if err != nil {
				return nil, err
			}
			all[i] = z
		}
		r, err := tensor.Cat(all, d)
		return []*tensor.Tensor{r}, err
	}
	return outs, nil
}

// Chunk is t.chunk(chunks, dim): split with size ceil(size/chunks)
// (SplitBackward0), as ATen's chunk.
func Chunk(a *tensor.Tensor, chunks, dim int) ([]*tensor.Tensor, error) {
	if chunks <= 0 {
		return nil, idxErr("tensor.chunk", "chunk expects `chunks` to be greater than 0, got: %d", chunks)
	}
	shape := a.Shape()
	d := dim
	if d < 0 {
		d += len(shape)
	}
	if d < 0 || d >= len(shape) {
		_, err := tensor.Narrow(a, dim, 0, 0)
		return nil, err
	}
	size := (shape[d] + chunks - 1) / chunks
	if size == 0 && shape[d] == 0 {
		sizes := make([]int, chunks)
		return Split(a, 0, sizes, d)
	}
	return Split(a, size, nil, d)
}

// idxErr is an op's error ("tensor.split: ...").
func idxErr(op, format string, args ...any) error {
	return &tensor.Error{Op: op, Err: fmt.Errorf(format, args...)}
}
