package tensor

import (
	"runtime"
	"slices"
)

// Views and copies: view, reshape, transpose, permute, squeeze, ..., to,
// clone, contiguous, cat, stack.

// wrapDim turns a possibly negative dim into an index in [0, ndim) (a
// 0-dim tensor accepts 0 and -1), with PyTorch's error.
func wrapDim(fname string, dim, ndim int) (int, error) {
	n := max(ndim, 1)
	if dim < -n || dim >= n {
		return 0, errorf(fname, "dimension out of range (expected to be in range of [%d, %d], but got %d)", -n, n-1, dim)
	}
	if dim < 0 {
		dim += n
	}
	return dim, nil
}

// inferShape resolves a single -1 in shape for a tensor of n elements.
func inferShape(fname string, shape []int, n int) ([]int, error) {
	shape = slices.Clone(shape)
	infer := -1
	prod := 1
	for i, s := range shape {
		switch {
		case s == -1:
			if infer >= 0 {
				return nil, errorf(fname, "only one dimension can be inferred")
			}
			infer = i
		case s < 0:
			return nil, errorf(fname, "invalid shape dimension %d", s)
		default:
			if s > 0 && prod > maxBytes/s {
				return nil, errorf(fname, "shape '%s' is invalid for input of size %d", fmtShape(shape), n)
			}
			prod *= s
		}
	}
	if infer >= 0 {
		if prod == 0 || n%prod != 0 {
			return nil, errorf(fname, "shape '%s' is invalid for input of size %d", fmtShape(shape), n)
		}
		shape[infer] = n / prod
	} else if prod != n {
		return nil, errorf(fname, "shape '%s' is invalid for input of size %d", fmtShape(shape), n)
	}
	return shape, nil
}

// computeStride is PyTorch's at::detail::computeStride: the strides that
// let newShape view memory laid out as (oldShape, oldStrides), or nil.
func computeStride(oldShape, oldStrides, newShape []int) []int {
	if len(oldShape) == 0 {
		return contiguousStrides(newShape)
	}
	n := numel(oldShape)
	if n == 0 {
		if slices.Equal(oldShape, newShape) {
			return slices.Clone(oldStrides)
		}
		return contiguousStrides(newShape)
	}
	newStrides := make([]int, len(newShape))
	viewD := len(newShape) - 1
	chunkBase := oldStrides[len(oldStrides)-1]
	tensorNumel, viewNumel := 1, 1
	for d := len(oldShape) - 1; d >= 0; d-- {
		tensorNumel *= oldShape[d]
		if d == 0 || (oldShape[d-1] != 1 && oldStrides[d-1] != tensorNumel*chunkBase) {
			for viewD >= 0 && (viewNumel < tensorNumel || newShape[viewD] == 1) {
				newStrides[viewD] = viewNumel * chunkBase
				viewNumel *= newShape[viewD]
				viewD--
			}
			if viewNumel != tensorNumel {
				return nil
			}
			if d > 0 {
				chunkBase = oldStrides[d-1]
				tensorNumel, viewNumel = 1, 1
			}
		}
	}
	if viewD != -1 {
		return nil
	}
	return newStrides
}

// viewAs returns t viewed with a new shape (-1 inferred); with copyOK it
// falls back to a contiguous copy when no view is possible (reshape).
func viewAs(fname string, t *Tensor, shapeIn []int, copyOK bool) (*Tensor, error) {
	if err := t.checkView(fname); err != nil {
		return nil, err
	}
	shape, err := inferShape(fname, shapeIn, t.Numel())
	if err != nil {
		return nil, err
	}
	if st := computeStride(t.shape, t.strides, shape); st != nil {
		return t.viewOf(shape, st, t.offset), nil
	}
	if !copyOK {
		return nil, errorf(fname, "view size is not compatible with input tensor's size and stride (at least one dimension spans across two contiguous subspaces); use reshape instead")
	}
	c, err := copyTo(fname, t, t.mem.Device(), t.dtype)
	if err != nil {
		return nil, err
	}
	c.shape, c.strides = shape, contiguousStrides(shape)
	return c, nil
}

// transposed returns the view of t with dims d0 and d1 swapped.
func transposed(fname string, t *Tensor, d0, d1 int) (*Tensor, error) {
	if err := t.checkView(fname); err != nil {
		return nil, err
	}
	a, err := wrapDim(fname, d0, len(t.shape))
	if err != nil {
		return nil, err
	}
	b, err := wrapDim(fname, d1, len(t.shape))
	if err != nil {
		return nil, err
	}
	shape, strides := slices.Clone(t.shape), slices.Clone(t.strides)
	if len(shape) > 0 {
		shape[a], shape[b] = shape[b], shape[a]
		strides[a], strides[b] = strides[b], strides[a]
	}
	return t.viewOf(shape, strides, t.offset), nil
}

// transposeAll reverses the dimensions (Tensor.T).
func transposeAll(t *Tensor) *Tensor {
	shape, strides := slices.Clone(t.shape), slices.Clone(t.strides)
	slices.Reverse(shape)
	slices.Reverse(strides)
	return t.viewOf(shape, strides, t.offset)
}

// permuted returns the view of t with dims reordered.
func permuted(fname string, t *Tensor, dims []int) (*Tensor, error) {
	if err := t.checkView(fname); err != nil {
		return nil, err
	}
	if len(dims) != len(t.shape) {
		return nil, errorf(fname, "number of dims don't match in permute (tensor has %d, got %d)", len(t.shape), len(dims))
	}
	seen := make([]bool, len(dims))
	shape, strides := make([]int, len(dims)), make([]int, len(dims))
	for i, d := range dims {
		w, err := wrapDim(fname, d, len(dims))
		if err != nil {
			return nil, err
		}
		if seen[w] {
			return nil, errorf(fname, "repeated dim in permute")
		}
		seen[w] = true
		shape[i], strides[i] = t.shape[w], t.strides[w]
	}
	return t.viewOf(shape, strides, t.offset), nil
}

// expanded returns the view of t broadcast to sizes (-1 keeps a size).
func expanded(fname string, t *Tensor, sizes []int) (*Tensor, error) {
	if err := t.checkView(fname); err != nil {
		return nil, err
	}
	if len(sizes) < len(t.shape) {
		return nil, errorf(fname, "the number of sizes provided (%d) must be greater or equal to the number of dimensions in the tensor (%d)", len(sizes), len(t.shape))
	}
	k := len(sizes) - len(t.shape)
	shape, strides := make([]int, len(sizes)), make([]int, len(sizes))
	for i, s := range sizes {
		if i < k {
			if s < 0 {
				return nil, errorf(fname, "the expanded size of the tensor (%d) isn't allowed in a leading, non-existing dimension %d", s, i)
			}
			shape[i] = s
			continue
		}
		old := t.shape[i-k]
		switch {
		case s == -1 || s == old:
			shape[i], strides[i] = old, t.strides[i-k]
		case old == 1 && s >= 0:
			shape[i] = s
		default:
			return nil, errorf(fname, "the expanded size of the tensor (%d) must match the existing size (%d) at non-singleton dimension %d; target sizes: %s; tensor sizes: %s",
				s, old, i, fmtShape(sizes), fmtShape(t.shape))
		}
	}
	if _, err := checkSize(fname, shape, t.dtype); err != nil {
		return nil, err
	}
	return t.viewOf(shape, strides, t.offset), nil
}

// narrowed is the view t.narrow(dim, start, length): length elements of
// dimension dim from start (negative start counts from the end).
func narrowed(fname string, t *Tensor, dim, start, length int) (*Tensor, error) {
	if err := t.checkView(fname); err != nil {
		return nil, err
	}
	if len(t.shape) == 0 {
		return nil, errorf(fname, "narrow() cannot be applied to a 0-dim tensor")
	}
	d, err := wrapDim(fname, dim, len(t.shape))
	if err != nil {
		return nil, err
	}
	size := t.shape[d]
	if start < -size || start > size {
		return nil, errorf(fname, "start out of range (expected to be in range of [%d, %d], but got %d)", -size, size, start)
	}
	if start < 0 {
		start += size
	}
	if length < 0 {
		return nil, errorf(fname, "narrow(): length must be non-negative, got %d", length)
	}
	if start > size-length {
		return nil, errorf(fname, "start (%d) + length (%d) exceeds dimension size (%d)", start, length, size)
	}
	shape := slices.Clone(t.shape)
	shape[d] = length
	return t.viewOf(shape, slices.Clone(t.strides), t.offset+start*t.strides[d]), nil
}

// selected is the view t.select(dim, index): dimension dim removed at
// index (negative counts from the end).
func selected(fname string, t *Tensor, dim, index int) (*Tensor, error) {
	if err := t.checkView(fname); err != nil {
		return nil, err
	}
	if len(t.shape) == 0 {
		return nil, errorf(fname, "select() cannot be applied to a 0-dim tensor")
	}
	d, err := wrapDim(fname, dim, len(t.shape))
	if err != nil {
		return nil, err
	}
	size := t.shape[d]
	if index < -size || index >= size {
		return nil, errorf(fname, "index %d out of range for tensor of size %s at dimension %d", index, fmtShape(t.shape), d)
	}
	if index < 0 {
		index += size
	}
	shape := slices.Delete(slices.Clone(t.shape), d, d+1)
	strides := slices.Delete(slices.Clone(t.strides), d, d+1)
	return t.viewOf(shape, strides, t.offset+index*t.strides[d]), nil
}

// copyTo returns a new contiguous copy of src on device with dtype dt.
// Copying from a meta device to a device that stores values is an error (the
// values are unknown); meta to meta only allocates.
func copyTo(fname string, src *Tensor, device string, dt DType) (*Tensor, error) {
	return copyToFormat(fname, src, device, dt, false)
}

// copyToPreserve is copyTo with memory_format=torch.preserve_format
// (Tensor.to, torch.clone): the copy keeps a dense src's strides, and gets
// dense strides in src's own order otherwise.
func copyToPreserve(fname string, src *Tensor, device string, dt DType) (*Tensor, error) {
	return copyToFormat(fname, src, device, dt, true)
}

// copyToFormat is copyTo into a contiguous tensor, or one laid out as
// preserveStrides says when preserve is set. Real GPUs' driver copies are
// contiguous.
func copyToFormat(fname string, src *Tensor, device string, dt DType, preserve bool) (*Tensor, error) {
	if out, ok, err := gpuCopyTo(fname, src, device, dt); ok { // gpu_copy.go: real GPUs
		return out, err
	}
	if err := src.checkLive(fname); err != nil {
		return nil, err
	}
	if src.Numel() > 0 && !src.hasData() && !deviceIsMeta(src.ctx, device) {
		return nil, noDataError(src.ctx, fname, src.mem.Device())
	}
	out, err := newTensor(src.ctx, fname, device, dt, src.shape)
	if err != nil {
		return nil, err
	}
	if preserve {
		withStrides(out, preserveStrides(src))
	}
	if out.hasData() && out.Numel() > 0 {
		if src.hasData() {
			copyKernel(layoutOf(out, out.shape), dt, layoutOf(src, out.shape), src.dtype, out.shape)
		} else {
			fillKernel(layoutOf(out, out.shape), dt, 0, out.shape)
		}
	}
	runtime.KeepAlive(src)
	if err := src.ctx.interrupted(fname); err != nil {
		return nil, err
	}
	return out, nil
}

// concat is cat: inputs promote to a common dtype and must be on one
// device; 1-D empty tensors are skipped as in PyTorch.
func concat(fname string, all []*Tensor, dim int) (*Tensor, error) {
	var ts []*Tensor
	for _, t := range all {
		if !(len(t.shape) == 1 && t.shape[0] == 0) {
			ts = append(ts, t)
		}
	}
	if len(ts) == 0 {
		ts = all[:1]
	}
	ref := ts[0]
	if len(ref.shape) == 0 {
		return nil, errorf(fname, "zero-dimensional tensor (at position 0) cannot be concatenated")
	}
	d, err := wrapDim(fname, dim, len(ref.shape))
	if err != nil {
		return nil, err
	}
	ops := make([]operand, len(all))
	for i, t := range all {
		ops[i] = operand{t: t}
	}
	device := ""
	for _, t := range all {
		if device == "" {
			device = t.mem.Device()
		} else if t.mem.Device() != device {
			return nil, errorf(fname, "expected all tensors to be on the same device, but found at least two devices, %s and %s", device, t.mem.Device())
		}
	}
	common := promote(ops...)
	shape := slices.Clone(ref.shape)
	shape[d] = 0
	for i, t := range ts {
		if len(t.shape) != len(ref.shape) {
			return nil, errorf(fname, "tensors must have same number of dimensions: got %d and %d", len(ref.shape), len(t.shape))
		}
		for j := range t.shape {
			if j != d && t.shape[j] != ref.shape[j] {
				return nil, errorf(fname, "sizes of tensors must match except in dimension %d; expected size %d but got size %d for tensor number %d in the list", d, ref.shape[j], t.shape[j], i)
			}
		}
		if shape[d] > maxBytes-t.shape[d] {
			return nil, errorf(fname, "the result's dimension %d has more than 2^62 elements", d)
		}
		shape[d] += t.shape[d]
	}
	out, err := newTensor(ref.ctx, fname, device, common, shape)
	if err != nil {
		return nil, err
	}
	if out.hasData() && out.Numel() > 0 {
		pos := 0
		for _, t := range ts {
			part := out.viewOf(slices.Clone(t.shape), out.strides, out.offset+pos*out.strides[d])
			pos += t.shape[d]
			if t.Numel() > 0 {
				copyKernel(layoutOf(part, t.shape), common, layoutOf(t, t.shape), t.dtype, t.shape)
			}
		}
	}
	runtime.KeepAlive(all)
	if err := ref.ctx.interrupted(fname); err != nil {
		return nil, err
	}
	return out, nil
}

// unsqueezed is the view of t with a size-1 dimension inserted at d
// (0 <= d <= ndim).
func unsqueezed(t *Tensor, d int) *Tensor {
	st := 1
	if d < len(t.shape) {
		st = t.strides[d] * t.shape[d]
	}
	shape := slices.Insert(slices.Clone(t.shape), d, 1)
	strides := slices.Insert(slices.Clone(t.strides), d, st)
	return t.viewOf(shape, strides, t.offset)
}
