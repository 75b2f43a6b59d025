package tensor

import "slices"

// The memory layout of a new result, as ATen gives it: what decides
// whether a later .contiguous(), .view() or reshape copies. PyTorch's
// elementwise ops (TensorIterator) lay a new output out in the order of
// its inputs' strides, so that x.transpose(1, 2) * 2 is a transposed
// tensor, not a contiguous one; a copy that keeps the memory format
// (Tensor.to, torch.clone: memory_format=torch.preserve_format) keeps a
// dense input's strides.

// iterStrides is the strides TensorIterator gives a new output of shape
// computed from ins (nil entries are numbers; they and 0-dim tensors
// broadcast, taking no part): nil (contiguous) when every input tensor
// has the output's shape and is contiguous or there is nothing to order, the
// strides of the inputs when all are non-overlapping and dense with the
// same strides (compute_fast_setup_type), and otherwise dense strides in
// the dimension order of reorder_dimensions: dimensions sorted fastest
// first by comparing the inputs' byte strides in order, a broadcast
// (stride 0) input skipped, the first strict difference deciding, equal
// strides put the smaller dimension first.
func iterStrides(shape []int, ins ...*Tensor) []int {
	var ts []*Tensor
	for _, t := range ins {
		if t != nil && len(t.shape) > 0 {
			ts = append(ts, t)
		}
	}
	nd := len(shape)
	if nd <= 1 || len(ts) == 0 {
		return nil
	}
	sameShape := true
	for _, t := range ts {
		if !slices.Equal(t.shape, shape) {
			sameShape = false
		}
	}
	if sameShape {
		allContig, sameDense := true, true
		for _, t := range ts {
			allContig = allContig && t.isContiguous()
			sameDense = sameDense && t.IsNonOverlappingAndDense() && slices.Equal(t.strides, ts[0].strides)
		}
		if allContig {
			return nil
		}
		if sameDense {
			return slices.Clone(ts[0].strides)
		}
	}
	// TensorIterator's dimensions are reversed: iterator dim i is tensor
	// dim nd-1-i; perm[0] is the fastest-moving dimension.
	bytes := make([][]int, len(ts))
	for i, t := range ts {
		st := broadcastStrides(t, shape)
		b := make([]int, nd)
		for d := range nd {
			b[nd-1-d] = st[d] * t.dtype.Size()
		}
		bytes[i] = b
	}
	ishape := make([]int, nd)
	for d := range nd {
		ishape[nd-1-d] = shape[d]
	}
	shouldSwap := func(d0, d1 int) int {
		for _, b := range bytes {
			s0, s1 := b[d0], b[d1]
			if s0 == 0 || s1 == 0 {
				continue
			}
			if s0 < s1 {
				return -1
			}
			if s0 > s1 {
				return 1
			}
			if ishape[d0] > ishape[d1] {
				return 1
			}
		}
		return 0
	}
	perm := make([]int, nd)
	for i := range perm {
		perm[i] = i
	}
	for i := 1; i < nd; i++ {
		d1 := i
		for d0 := i - 1; d0 >= 0; d0-- {
			c := shouldSwap(perm[d0], perm[d1])
			if c > 0 {
				perm[d0], perm[d1] = perm[d1], perm[d0]
				d1 = d0
			} else if c < 0 {
				break
			}
		}
	}
	// dense strides in perm's order, mapped back to tensor dimensions
	st := make([]int, nd)
	acc := 1
	for _, id := range perm {
		d := nd - 1 - id
		st[d] = acc
		acc *= max(shape[d], 1)
	}
	return st
}

// preserveStrides is the layout memory_format=torch.preserve_format gives
// a copy of t (Tensor.to's _to_copy, torch.clone's empty_like), nil for
// contiguous: t's strides when t is non-overlapping and dense, otherwise
// ATen's infer_dense_strides — dense strides that keep t's dimension order,
// ties and size-1 dimensions broken as TensorIterator breaks them.
func preserveStrides(t *Tensor) []int {
	switch {
	case t.isContiguous():
		return nil
	case t.IsNonOverlappingAndDense():
		return slices.Clone(t.strides)
	}
	return iterStrides(t.shape, t)
}

// isContiguousStrides reports whether strides are the contiguous strides
// of shape (size-1 dimensions' strides ignored, as is_contiguous does).
func isContiguousStrides(shape, strides []int) bool {
	want := contiguousStrides(shape)
	for d := range shape {
		if shape[d] != 1 && strides[d] != want[d] {
			return false
		}
	}
	return true
}

// withStrides gives a freshly allocated (dense, contiguous) t the strides
// st (nil: it stays contiguous): the same storage, the elements laid out in
// another order.
func withStrides(t *Tensor, st []int) {
	if st != nil && !isContiguousStrides(t.shape, st) {
		t.strides = st
	}
}
