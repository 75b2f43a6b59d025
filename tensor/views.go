package tensor

import "slices"

// Views and copies. The view functions allocate nothing: the result shares
// t's Storage (IsView is true). Dimensions may be negative (counting from
// the end) wherever PyTorch allows it; out-of-range ones are errors worded
// as PyTorch's ("dimension out of range (expected to be in range of
// [-2, 1], but got 2)"). Every function fails when t's memory was released.

// View is Tensor.view: t with a new shape of the same numel (one size may
// be -1, inferred). It fails when t's strides do not allow a view.
func View(t *Tensor, shape []int) (*Tensor, error) { return viewAs("tensor.view", t, shape, false) }

// Reshape is torch.reshape: a view when the strides allow one, otherwise
// a contiguous copy (which allocates numel × itemsize bytes).
func Reshape(t *Tensor, shape []int) (*Tensor, error) {
	return viewAs("tensor.reshape", t, shape, true)
}

// Flatten is torch.flatten: dimensions start..end (inclusive) merged into
// one, a view when possible (see Reshape). A 0-dim tensor becomes [1].
func Flatten(t *Tensor, start, end int) (*Tensor, error) {
	const fname = "tensor.flatten"
	if err := t.checkView(fname); err != nil {
		return nil, err
	}
	if len(t.shape) == 0 {
		return viewAs(fname, t, []int{1}, true)
	}
	s, err := wrapDim(fname, start, len(t.shape))
	if err != nil {
		return nil, err
	}
	e, err := wrapDim(fname, end, len(t.shape))
	if err != nil {
		return nil, err
	}
	if s > e {
		return nil, errorf(fname, "start_dim cannot come after end_dim")
	}
	if s == e {
		return t, nil
	}
	shape := slices.Clone(t.shape[:s])
	shape = append(shape, numel(t.shape[s:e+1]))
	shape = append(shape, t.shape[e+1:]...)
	return viewAs(fname, t, shape, true)
}

// Transpose is torch.transpose: dims d0 and d1 swapped.
func Transpose(t *Tensor, d0, d1 int) (*Tensor, error) {
	return transposed("tensor.transpose", t, d0, d1)
}

// T is torch.t: the transpose of a tensor of at most 2 dimensions (a view
// of t itself for fewer).
func T(t *Tensor) (*Tensor, error) {
	const fname = "tensor.t"
	if len(t.shape) > 2 {
		return nil, errorf(fname, "t() expects a tensor with <= 2 dimensions, but self is %dD", len(t.shape))
	}
	if len(t.shape) < 2 {
		if err := t.checkView(fname); err != nil {
			return nil, err
		}
		return t.viewOf(slices.Clone(t.shape), slices.Clone(t.strides), t.offset), nil
	}
	return transposed(fname, t, 0, 1)
}

// ReverseDims is Tensor.T: all dimensions reversed. It cannot fail.
func ReverseDims(t *Tensor) *Tensor { return transposeAll(t) }

// Permute is torch.permute: dimension i of the result is dims[i] of t.
func Permute(t *Tensor, dims []int) (*Tensor, error) { return permuted("tensor.permute", t, dims) }

// Expand is Tensor.expand: t broadcast to sizes (-1 keeps a size; new
// leading dimensions have stride 0).
func Expand(t *Tensor, sizes []int) (*Tensor, error) { return expanded("tensor.expand", t, sizes) }

// Narrow is torch.narrow: length elements of dimension dim from start
// (negative start counts from the end).
func Narrow(t *Tensor, dim, start, length int) (*Tensor, error) {
	return narrowed("tensor.narrow", t, dim, start, length)
}

// Select is torch.select: dimension dim removed at index (negative counts
// from the end).
func Select(t *Tensor, dim, index int) (*Tensor, error) {
	return selected("tensor.select", t, dim, index)
}

// Squeeze is torch.squeeze: the size-1 dimensions among dims removed (all
// size-1 dimensions when dims is nil).
func Squeeze(t *Tensor, dims []int) (*Tensor, error) {
	const fname = "tensor.squeeze"
	if err := t.checkView(fname); err != nil {
		return nil, err
	}
	drop := make([]bool, len(t.shape))
	if dims == nil {
		for d, s := range t.shape {
			drop[d] = s == 1
		}
	} else {
		red, err := dimSet(fname, dims, len(t.shape))
		if err != nil {
			return nil, err
		}
		for d, r := range red {
			drop[d] = r && t.shape[d] == 1
		}
	}
	var shape, strides []int
	for d, s := range t.shape {
		if !drop[d] {
			shape, strides = append(shape, s), append(strides, t.strides[d])
		}
	}
	return t.viewOf(shape, strides, t.offset), nil
}

// Unsqueeze is torch.unsqueeze: a size-1 dimension inserted at dim
// (-ndim-1 <= dim <= ndim).
func Unsqueeze(t *Tensor, dim int) (*Tensor, error) {
	const fname = "tensor.unsqueeze"
	if err := t.checkView(fname); err != nil {
		return nil, err
	}
	w, err := wrapDim(fname, dim, len(t.shape)+1)
	if err != nil {
		return nil, err
	}
	return unsqueezed(t, w), nil
}

// Index is t[i0, i1, ...] with int indices (negative ones count from the
// end): the view with the leading dimensions removed. With no index it is
// a view of all of t.
func Index(t *Tensor, idx ...int) (*Tensor, error) {
	const fname = "tensor index"
	if len(idx) > len(t.shape) {
		if len(t.shape) == 0 {
			return nil, errorf(fname, "invalid index of a 0-dim tensor")
		}
		return nil, errorf(fname, "too many indices for tensor of dimension %d", len(t.shape))
	}
	r := t
	for d, i := range idx {
		size := r.shape[0]
		if i < 0 {
			i += size
		}
		if i < 0 || i >= size {
			return nil, errorf(fname, "index %d is out of bounds for dimension %d with size %d", idx[d], d, size)
		}
		r = r.select0(i)
	}
	if r == t {
		r = t.viewOf(slices.Clone(t.shape), slices.Clone(t.strides), t.offset)
	}
	return r, nil
}

// Select0 is t[i] for 0 <= i < t.Shape()[0] (unchecked): a view.
func (t *Tensor) Select0(i int) *Tensor { return t.select0(i) }

// select0 is the view t[i] for a valid, non-negative i.
func (t *Tensor) select0(i int) *Tensor {
	return t.viewOf(slices.Clone(t.shape[1:]), slices.Clone(t.strides[1:]), t.offset+i*t.strides[0])
}

// Slice0 is t[start:end:step] along dimension 0 for bounds already
// clamped as Python's slice.indices does (step != 0): a view. A 0-dim
// tensor gives a view of itself.
func Slice0(t *Tensor, start, end, step int) *Tensor {
	if len(t.shape) == 0 {
		return t.viewOf(nil, nil, t.offset) // no dimension to slice
	}
	var n int
	if step > 0 {
		n = max(0, (end-start+step-1)/step)
	} else {
		n = max(0, (start-end-step-1)/(-step))
	}
	shape, strides := slices.Clone(t.shape), slices.Clone(t.strides)
	shape[0] = n
	strides[0] *= step
	off := t.offset
	if n > 0 {
		off += start * t.strides[0]
	}
	return t.viewOf(shape, strides, off)
}

// Contiguous is Tensor.contiguous: t itself when already contiguous, else
// a contiguous copy.
func Contiguous(t *Tensor) (*Tensor, error) {
	const fname = "tensor.contiguous"
	if err := t.checkLive(fname); err != nil {
		return nil, err
	}
	if t.isContiguous() {
		return t, nil
	}
	return copyTo(fname, t, t.mem.Device(), t.dtype)
}

// Clone is torch.clone (memory_format=torch.preserve_format): a copy on
// t's device with t's strides when t is dense, dense strides in t's order
// otherwise.
func Clone(t *Tensor) (*Tensor, error) {
	return copyToPreserve("tensor.clone", t, t.mem.Device(), t.dtype)
}

// To is Tensor.to: t on device ("" keeps t's device) with dtype dt
// (Undefined keeps t's dtype). Without copy it returns t itself when
// nothing changes; otherwise a new tensor laid out as _to_copy lays it out
// (memory_format=torch.preserve_format: a dense t's strides, dense strides
// in t's order otherwise). Copies to, from and between real GPUs are
// driver copies where the layouts allow (contiguous).
func To(t *Tensor, device string, dt DType, copy bool) (*Tensor, error) {
	const fname = "tensor.to"
	dt = orDefault(dt, t.dtype)
	if device == "" {
		device = t.mem.Device()
	} else {
		var err error
		if device, err = t.ctx.device(fname, device); err != nil {
			return nil, err
		}
	}
	if copy {
		return copyToPreserve(fname, t, device, dt)
	}
	if err := t.checkLive(fname); err != nil {
		return nil, err
	}
	if device == t.mem.Device() && dt == t.dtype {
		return t, nil
	}
	return copyToPreserve(fname, t, device, dt)
}

// Cat is torch.cat: tensors concatenated along an existing dimension dim,
// promoted to a common dtype, all on one device; 1-D empty tensors are
// skipped as in PyTorch.
func Cat(ts []*Tensor, dim int) (*Tensor, error) { return catStack("tensor.cat", ts, dim, false) }

// Stack is torch.stack: tensors of one shape concatenated along a new
// dimension dim.
func Stack(ts []*Tensor, dim int) (*Tensor, error) { return catStack("tensor.stack", ts, dim, true) }

func catStack(fname string, ts []*Tensor, dim int, stack bool) (*Tensor, error) {
	if len(ts) == 0 {
		return nil, errorf(fname, "expected a non-empty list of tensors")
	}
	if anyOnGPU(ts...) {
		return stagedTensor(ts[0].ctx, fname, ts, func(s *staging) (*Tensor, error) {
			sh := make([]*Tensor, len(ts))
			for i, t := range ts {
				sh[i] = s.shadowOf(t)
			}
			return catStackCPU(fname, sh, dim, stack)
		})
	}
	return catStackCPU(fname, ts, dim, stack)
}

func catStackCPU(fname string, ts []*Tensor, dim int, stack bool) (*Tensor, error) {
	for _, t := range ts {
		if err := t.checkLive(fname); err != nil {
			return nil, err
		}
	}
	if !stack {
		return concat(fname, ts, dim)
	}
	for i, t := range ts {
		if !slices.Equal(t.shape, ts[0].shape) {
			return nil, errorf(fname, "stack expects each tensor to be equal size, but got %s at entry 0 and %s at entry %d", fmtShape(ts[0].shape), fmtShape(t.shape), i)
		}
	}
	d, err := wrapDim(fname, dim, len(ts[0].shape)+1)
	if err != nil {
		return nil, err
	}
	us := make([]*Tensor, len(ts))
	for i, t := range ts {
		us[i] = unsqueezed(t, d)
	}
	return concat(fname, us, d)
}
