package tensor

import (
	"math"
	"runtime"
	"slices"
)

// Indexing kernels: randint, index_select (and embedding's forward),
// index_add_ (index_select's backward), embedding_dense_backward,
// masked_fill, triu/tril, where, scalar_tensor. Each allocates what ATen
// allocates; values go through hostCompute.

// checkIndex checks an index tensor's dtype (int64 or int32).
func checkIndex(fname, what string, idx *Tensor) error {
	if idx.dtype != Int64 && idx.dtype != Int32 {
		return errorf(fname, "Expected tensor for argument #1 '%s' to have one of the following scalar types: Long, Int; but got %s instead (while checking arguments for %s)", what, legacyTypeName(idx), fname[len("tensor."):])
	}
	return nil
}

// gatherRows copies rows idx of src (viewed as [src.shape[dim], ...] along
// dim) into out: out has src's shape with dim replaced by len(idx).
func gatherRows(out, src *Tensor, dim int, idx []int64) {
	v := getF64(src)
	outer, n, inner := splitDim(src.shape, dim)
	res := make([]float64, 0, outer*len(idx)*inner)
	for o := range outer {
		for _, i := range idx {
			base := (o*n + int(i)) * inner
			res = append(res, v[base:base+inner]...)
		}
	}
	setF64(out, res)
}

// IndexSelect is torch.index_select(t, dim, index) with a 1-D (or 0-dim)
// int64/int32 index: one allocation of t's shape with dim resized to
// index's length.
func IndexSelect(t *Tensor, dim int, index *Tensor) (*Tensor, error) {
	const fname = "tensor.index_select"
	for _, x := range []*Tensor{t, index} {
		if err := x.checkLive(fname); err != nil {
			return nil, err
		}
	}
	if err := checkIndex(fname, "index", index); err != nil {
		return nil, err
	}
	if index.Dim() > 1 {
		return nil, errorf(fname, "index_select(): Index is supposed to be a vector")
	}
	if err := checkSameDevice(fname, t, index); err != nil {
		return nil, err
	}
	d, err := wrapDim(fname, dim, len(t.shape))
	if err != nil {
		return nil, err
	}
	shape := slices.Clone(t.shape)
	if len(shape) > 0 {
		shape[d] = index.Numel()
	}
	out, err := newTensor(t.ctx, fname, t.mem.Device(), t.dtype, shape)
	if err != nil {
		return nil, err
	}
	var bad error
	err = hostCompute(fname, []*Tensor{out, t, index}, func(sh []*Tensor) {
		idx := getI64(sh[2])
		size := 1
		if len(t.shape) > 0 {
			size = t.shape[d]
		}
		for _, i := range idx {
			if i < 0 || i >= int64(size) {
				bad = errorf(fname, "index out of range in self")
				return
			}
		}
		gatherRows(sh[0], sh[1], d, idx)
	})
	if err == nil {
		err = bad
	}
	if err != nil {
		return nil, err
	}
	return out, nil
}

// Embedding is embedding(weight, indices): weight.index_select(0,
// indices.reshape(-1)) viewed as indices.shape + [dim]: one allocation.
func Embedding(weight, indices *Tensor) (*Tensor, error) {
	const fname = "tensor.embedding"
	for _, x := range []*Tensor{weight, indices} {
		if err := x.checkLive(fname); err != nil {
			return nil, err
		}
	}
	if err := checkIndex(fname, "indices", indices); err != nil {
		return nil, err
	}
	if weight.Dim() != 2 {
		return nil, errorf(fname, "'weight' must be 2-D")
	}
	flat, err := Reshape(indices, []int{-1})
	if err != nil {
		return nil, err
	}
	out, err := IndexSelect(weight, 0, flat)
	if err != nil {
		return nil, Renamed(err, fname)
	}
	shape := append(slices.Clone(indices.shape), weight.shape[1])
	return View(out, shape)
}

// indexAdd adds rows of src into dst along dim at idx (host values).
func indexAdd(dst, src *Tensor, dim int, idx []int64, skip int64) {
	dv, sv := getF64(dst), getF64(src)
	outer, n, inner := splitDim(dst.shape, dim)
	for o := range outer {
		for k, i := range idx {
			if i == skip {
				continue
			}
			db := (o*n + int(i)) * inner
			sb := (o*len(idx) + k) * inner
			for j := range inner {
				dv[db+j] += sv[sb+j]
			}
		}
	}
	setF64(dst, dv)
}

// IndexSelectBackward is index_select_backward(grad, self_sizes, dim,
// index): zeros(self_sizes).index_add_(dim, index, grad): one allocation.
func IndexSelectBackward(g *Tensor, shape []int, dim int, index *Tensor) (*Tensor, error) {
	const fname = "tensor.index_select_backward"
	d, err := wrapDim(fname, dim, len(shape))
	if err != nil {
		return nil, err
	}
	out, err := newTensor(g.ctx, fname, g.mem.Device(), g.dtype, slices.Clone(shape))
	if err != nil {
		return nil, err
	}
	err = hostCompute(fname, []*Tensor{out, g, index}, func(sh []*Tensor) {
		setF64(sh[0], make([]float64, out.Numel()))
		if len(shape) == 0 {
			setF64(sh[0], getF64(sh[1]))
			return
		}
		indexAdd(sh[0], sh[1], d, getI64(sh[2]), math.MinInt64)
	})
	return out, err
}

// EmbeddingDenseBackward is embedding_dense_backward(grad, indices,
// num_weights, padding_idx) as CUDA runs it: with at most 3072 indices
// (embedding_backward_feature_kernel) one allocation, the zero-filled
// [num_weights, dim] gradient. With more, the sort path first allocates
// sorted_indices and orig_indices (index dtype, one element per index)
// and an arange of the indices' count for the radix sort (freed after
// it), then the gradient; the sort's cub temporary storage and
// embedding_backward_cuda_kernel's segment buffers (sizes depend on the
// values) are not modelled. sorted/orig are freed when the op returns.
func EmbeddingDenseBackward(g, indices *Tensor, numWeights int, paddingIdx int64) (*Tensor, error) {
	const fname = "tensor.embedding_dense_backward"
	dim := 1
	if g.Dim() > 0 {
		dim = g.shape[len(g.shape)-1]
	}
	n := indices.Numel()
	var sorted, orig *Tensor
	guard(g, overLaw{3072}, int64(n)) // the kernel, by the indices' count
	if n > 3072 {
		var err error
		if sorted, err = newTensor(g.ctx, fname, indices.mem.Device(), indices.dtype, []int{n}); err != nil {
			return nil, err
		}
		// the sort's results are held until the op returns, so that a
		// reclaim while it allocates reaches them instead of asking the
		// collector; the arange is dropped after the sort
		defer g.ctx.Hold(sorted)()
		if orig, err = newTensor(g.ctx, fname, indices.mem.Device(), indices.dtype, []int{n}); err != nil {
			return nil, err
		}
		g.ctx.Hold(orig)
		ar, err := newTensor(g.ctx, fname, indices.mem.Device(), indices.dtype, []int{n})
		if err != nil {
			return nil, err
		}
		Dropped(ar)
	}
	out, err := newTensor(g.ctx, fname, g.mem.Device(), g.dtype, []int{numWeights, dim})
	if err != nil {
		return nil, err
	}
	err = hostCompute(fname, []*Tensor{out, g, indices}, func(sh []*Tensor) {
		setF64(sh[0], make([]float64, out.Numel()))
		indexAdd(sh[0], sh[1], 0, getI64(sh[2]), paddingIdx)
	})
	runtime.KeepAlive(sorted)
	runtime.KeepAlive(orig)
	return out, err
}
