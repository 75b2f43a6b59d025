package tensor

import (
	"runtime"
	"slices"
	"strings"
)

// Advanced indexing (ATen's index with index tensors), its backward
// (index_put_ with accumulate=True, as CUDA runs it), and index_add_.

// AdvancedIndex is ATen's index(t, indices): indices[d] (nil: the whole
// dimension) indexes dimension d of t (a bool or uint8 mask covers as many
// dimensions as it has, replaced by the columns of its nonzero(), which is
// allocated and fails on a meta device). The int64 (or int32) index
// tensors broadcast together; the result has, where they sit next to each
// other, their broadcast shape in place of the dimensions they index, and
// otherwise the broadcast shape first, then t's other dimensions. One
// contiguous allocation (besides a mask's nonzero). Negative indices count
// from the end. Errors are PyTorch's: index dtype ("tensors used as
// indices must be long, int, byte or bool tensors"), too many indices, a
// mask's shape, shapes that do not broadcast, an index out of bounds.
func AdvancedIndex(t *Tensor, indices []*Tensor) (*Tensor, error) {
	const fname = "tensor index"
	if err := t.checkLive(fname); err != nil {
		return nil, err
	}
	ix, masks, err := expandIndices(fname, t, indices)
	if err != nil {
		return nil, err
	}
	defer func() { Dropped(masks...) }()
	release := t.ctx.Hold(masks...)
	defer release()
	plan, err := planIndex(fname, t.shape, ix)
	if err != nil {
		return nil, err
	}
	out, err := newTensor(t.ctx, fname, t.mem.Device(), t.dtype, plan.outShape)
	if err != nil {
		return nil, err
	}
	ins := append([]*Tensor{out, t}, ix...)
	var bad error
	err = hostCompute(fname, ins, func(sh []*Tensor) {
		vals, err := plan.values(sh[2:])
		if err != nil {
			bad = err
			return
		}
		src := getF64(sh[1])
		res := make([]float64, 0, out.Numel())
		plan.each(vals, func(srcFlat, _ int) { res = append(res, src[srcFlat]) })
		setF64(sh[0], res)
	})
	if err == nil {
		err = bad
	}
	if err != nil {
		Dropped(out)
		return nil, err
	}
	return out, nil
}

// expandIndices checks the index tensors' dtypes and count and replaces
// every bool or uint8 mask by the columns of its nonzero() (as ATen's
// expandTensors): it returns one entry per indexed dimension (nil for a
// whole one) and the nonzero results it made.
func expandIndices(fname string, t *Tensor, indices []*Tensor) (ix, made []*Tensor, err error) {
	for _, x := range indices {
		if x == nil {
			ix = append(ix, nil)
			continue
		}
		if err := x.checkLive(fname); err != nil {
			return nil, made, err
		}
		if err := checkSameDevice(fname, t, x); err != nil {
			return nil, made, err
		}
		switch x.dtype {
		case Int64, Int32:
			ix = append(ix, x)
		case Bool, Uint8:
			for j := range x.shape {
				src := len(ix) + j
				if src >= len(t.shape) || x.shape[j] != t.shape[src] {
					return nil, made, errorf(fname, "The shape of the mask %s at index %d does not match the shape of the indexed tensor %s at index %d", fmtShape(x.shape), j, fmtShape(t.shape), src)
				}
			}
			nz, err := Nonzero(x)
			if err != nil {
				return nil, made, Renamed(err, fname)
			}
			made = append(made, nz)
			for j := range x.shape {
				c, err := Select(nz, 1, j)
				if err != nil {
					return nil, made, err
				}
				ix = append(ix, c)
			}
		default:
			return nil, made, errorf(fname, "tensors used as indices must be long, int, byte or bool tensors")
		}
	}
	if len(ix) > len(t.shape) {
		return nil, made, errorf(fname, "too many indices for tensor of dimension %d (got %d)", len(t.shape), len(ix))
	}
	return ix, made, nil
}

// indexPlan is where advanced indexing reads: the result's shape and,
// for each result element, the source element.
type indexPlan struct {
	shape    []int // the indexed tensor's
	ix       []*Tensor
	dims     []int // the indexed dimensions, ascending
	bshape   []int // the index tensors' broadcast shape
	front    bool  // the broadcast dimensions come first (indexed dimensions not adjacent)
	outShape []int
}

func planIndex(fname string, shape []int, ix []*Tensor) (*indexPlan, error) {
	p := &indexPlan{shape: shape, ix: ix}
	var shapes [][]int
	for d, x := range ix {
		if x != nil {
			p.dims = append(p.dims, d)
			shapes = append(shapes, x.shape)
		}
	}
	if len(p.dims) == 0 {
		p.outShape = slices.Clone(shape)
		return p, nil
	}
	b, err := broadcastShapes(fname, shapes...)
	if err != nil {
		strs := make([]string, len(shapes))
		for i, s := range shapes {
			strs[i] = fmtShape(s)
		}
		return nil, errorf(fname, "shape mismatch: indexing tensors could not be broadcast together with shapes %s", strings.Join(strs, ", "))
	}
	p.bshape = b
	first, last := p.dims[0], p.dims[len(p.dims)-1]
	p.front = last-first+1 != len(p.dims)
	if p.front {
		p.outShape = slices.Clone(b)
		for d, s := range shape {
			if d >= len(ix) || ix[d] == nil {
				p.outShape = append(p.outShape, s)
			}
		}
	} else {
		p.outShape = append(append(slices.Clone(shape[:first]), b...), shape[last+1:]...)
	}
	return p, nil
}

// values reads the index tensors broadcast to the common shape, wrapped
// to non-negative and checked against their dimensions.
func (p *indexPlan) values(ix []*Tensor) ([][]int, error) {
	out := make([][]int, len(p.dims))
	k := 0
	for d, x := range ix {
		if x == nil {
			continue
		}
		vals := getI64(broadcastView(x, p.bshape))
		w := make([]int, len(vals))
		size := p.shape[d]
		for i, v := range vals {
			if v < -int64(size) || v >= int64(size) {
				return nil, errorf("tensor index", "index %d is out of bounds for dimension %d with size %d", v, d, size)
			}
			if v < 0 {
				v += int64(size)
			}
			w[i] = int(v)
		}
		out[k] = w
		k++
	}
	return out, nil
}

// each calls f for every result element in row-major order with the flat
// (row-major) number of the source element it reads and of the element
// of the broadcast index shape it uses.
func (p *indexPlan) each(vals [][]int, f func(srcFlat, b int)) {
	nd := len(p.shape)
	strides := contiguousStrides(p.shape)
	indexed := make([]bool, nd)
	for _, d := range p.dims {
		indexed[d] = true
	}
	var free []int // the dimensions not indexed, in order
	for d := range nd {
		if !indexed[d] {
			free = append(free, d)
		}
	}
	nb := numel(p.bshape)
	if len(p.dims) == 0 {
		nb = 1
	}
	// the result's dimensions: free dims before the broadcast block, the
	// block, free dims after it
	nBefore := 0
	if !p.front && len(p.dims) > 0 {
		nBefore = p.dims[0]
	}
	outer := 1
	for _, d := range free[:nBefore] {
		outer *= p.shape[d]
	}
	inner := 1
	for _, d := range free[nBefore:] {
		inner *= p.shape[d]
	}
	freeOff := func(dims []int, flat int) int {
		off := 0
		for i := len(dims) - 1; i >= 0; i-- {
			s := p.shape[dims[i]]
			off += (flat % s) * strides[dims[i]]
			flat /= s
		}
		return off
	}
	for o := range outer {
		ob := freeOff(free[:nBefore], o)
		for b := range nb {
			ib := ob
			for k, d := range p.dims {
				ib += vals[k][b] * strides[d]
			}
			for in := range inner {
				f(ib+freeOff(free[nBefore:], in), b)
			}
		}
	}
}

// IndexBackward is IndexBackward0's gradient, index_backward:
// grad.new_zeros(shape) (the indexed tensor's shape), then
// _index_put_impl_(zeros, indices, g, accumulate=True, unsafe=True) — one
// allocation that stays. On simulated GPUs that model CUDA's kernels
// (presets), index_put_with_sort_kernel's temporaries come around it, all
// freed when it returns: per index tensor (broadcast to n elements) its
// remainder (freed after) times its stride, summed into the first
// (8n bytes each); a contiguous copy of a non-contiguous g; the sorted
// indices, their original positions and an arange (8n each); cub's radix
// sort storage (modelled as its alternate key and value buffers, 16n
// bytes; its histograms are not). A mask among indices is expanded with
// nonzero() again, as ATen does.
func IndexBackward(g *Tensor, shape []int, indices []*Tensor) (*Tensor, error) {
	const fname = "tensor.index_put_"
	z, err := Zeros(g.ctx, shape, g.dtype, g.mem.Device())
	if err != nil {
		return nil, Renamed(err, fname)
	}
	release := g.ctx.Hold(z)
	defer release()
	ix, masks, err := expandIndices(fname, z, indices)
	if err != nil {
		Dropped(z)
		return nil, err
	}
	defer func() { Dropped(masks...) }()
	defer g.ctx.Hold(masks...)()
	plan, err := planIndex(fname, shape, ix)
	if err != nil {
		Dropped(z)
		return nil, err
	}
	if err := indexPutSortTemporaries(z, g, plan); err != nil {
		Dropped(z)
		return nil, Renamed(err, fname)
	}
	var bad error
	err = hostCompute(fname, append([]*Tensor{z, g}, ix...), func(sh []*Tensor) {
		vals, err := plan.values(sh[2:])
		if err != nil {
			bad = err
			return
		}
		dst := getF64(sh[0])
		src := getF64(sh[1])
		i := 0
		plan.each(vals, func(srcFlat, _ int) {
			dst[srcFlat] += src[i]
			i++
		})
		setF64(sh[0], dst)
	})
	if err == nil {
		err = bad
	}
	if err != nil {
		Dropped(z)
		return nil, err
	}
	return z, nil
}

// indexPutSortTemporaries allocates and frees, on presets, what CUDA's
// index_put_with_sort_kernel takes besides its output (see IndexBackward).
func indexPutSortTemporaries(z, g *Tensor, plan *indexPlan) error {
	tmp := newCUDATemps(z)
	if tmp == nil || len(plan.dims) == 0 {
		return nil
	}
	defer tmp.close()
	n := uint64(numel(plan.bshape)) * 8
	linear := -1
	for range plan.dims {
		rem, err := tmp.take(n, "index_put_: remainder")
		if err != nil {
			return err
		}
		m, err := tmp.take(n, "index_put_: linear index")
		if err != nil {
			return err
		}
		tmp.free(rem)
		if linear < 0 {
			linear = m
			continue
		}
		tmp.free(m) // added into the first
	}
	var steps []int
	if !g.isContiguous() {
		h, err := tmp.take(uint64(g.NBytes()), "index_put_: contiguous grad")
		if err != nil {
			return err
		}
		steps = append(steps, h)
	}
	sliceSize := 1
	for d, s := range plan.shape {
		if d > plan.dims[len(plan.dims)-1] {
			sliceSize *= s
		}
	}
	if n == 0 || sliceSize == 0 {
		return nil
	}
	// the sorted indices, their positions and an arange, freed in reverse
	// at the block's end; cub's storage freed after the sort
	var sort []int
	for _, what := range []string{"sorted indices", "original positions", "arange"} {
		h, err := tmp.take(n, "index_put_: "+what)
		if err != nil {
			return err
		}
		sort = append(sort, h)
	}
	cub, err := tmp.take(2*n, "index_put_: cub radix sort storage")
	if err != nil {
		return err
	}
	tmp.free(cub)
	for i := len(sort) - 1; i >= 0; i-- {
		tmp.free(sort[i])
	}
	for _, h := range steps {
		tmp.free(h)
	}
	tmp.free(linear)
	return nil
}

// IndexAdd_ is self.index_add_(dim, index, source, alpha=alpha): for each
// i, self's slice index[i] along dim += alpha · source's slice i. index is
// a vector (or 0-dim) of int64 or int32; source has self's shape with dim
// resized to index's length (a 0-dim source with a one-element index).
// Nothing is allocated. Errors are PyTorch's ("index_add_(): ...", "index
// out of range in self").
func IndexAdd_(self *Tensor, dim int, index, source *Tensor, alpha float64) error {
	const fname = "tensor.index_add_"
	d, err := checkIndexAdd(fname, self, dim, index, source)
	if err != nil {
		return err
	}
	return indexAddValues(fname, self, d, index, source, alpha)
}

// IndexAdd is torch.index_add(self, dim, index, source, alpha=alpha): a
// copy of self (one contiguous allocation) with IndexAdd_ applied.
func IndexAdd(self *Tensor, dim int, index, source *Tensor, alpha float64) (*Tensor, error) {
	const fname = "tensor.index_add"
	d, err := checkIndexAdd(fname, self, dim, index, source)
	if err != nil {
		return nil, err
	}
	out, err := newTensor(self.ctx, fname, self.mem.Device(), self.dtype, self.shape)
	if err != nil {
		return nil, err
	}
	if _, err := out.Copy_(self); err != nil {
		Dropped(out)
		return nil, Renamed(err, fname)
	}
	if err := indexAddValues(fname, out, d, index, source, alpha); err != nil {
		Dropped(out)
		return nil, err
	}
	return out, nil
}

func checkIndexAdd(fname string, self *Tensor, dim int, index, source *Tensor) (int, error) {
	for _, x := range []*Tensor{self, index, source} {
		if err := x.checkLive(fname); err != nil {
			return 0, err
		}
	}
	d, err := wrapDim(fname, dim, len(self.shape))
	if err != nil {
		return 0, err
	}
	if index.Dim() > 1 {
		return 0, errorf(fname, "index_add_(): Index is supposed to be a vector")
	}
	if index.dtype != Int64 && index.dtype != Int32 {
		return 0, errorf(fname, "index_add_(): Expected dtype int32/int64 for index")
	}
	if self.dtype != source.dtype {
		return 0, errorf(fname, "index_add_(): self (%s) and source (%s) must have the same scalar type", dtypeTitle(self.dtype), dtypeTitle(source.dtype))
	}
	if err := checkSameDevice(fname, self, index, source); err != nil {
		return 0, err
	}
	if d != 0 && d >= source.Dim() {
		return 0, errorf(fname, "index_add_(): Indexing dim %d is out of bounds of the source tensor with dim %d", d, source.Dim())
	}
	n := 1
	if source.Dim() > 0 {
		n = source.shape[d]
	}
	if index.Numel() != n {
		return 0, errorf(fname, "index_add_(): Number of indices (%d) should be equal to source.size(dim): (%d), for dim: %d", index.Numel(), n, d)
	}
	if source.Dim() > 0 {
		same := self.Dim() == source.Dim()
		for i := 0; same && i < self.Dim(); i++ {
			same = i == d || self.shape[i] == source.shape[i]
		}
		if !same {
			return 0, errorf(fname, "source tensor shape must match self tensor shape, excluding the specified dimension. Got self.shape = %s source.shape = %s", fmtShape(self.shape), fmtShape(source.shape))
		}
	}
	return d, nil
}

// indexAddValues adds alpha·source into self's slices along d at index
// (a 0-dim source is added to every element of its slice).
func indexAddValues(fname string, self *Tensor, d int, index, source *Tensor, alpha float64) error {
	var bad error
	err := hostCompute(fname, []*Tensor{self, index, source}, func(sh []*Tensor) {
		idx := getI64(sh[1])
		outer, n, inner := splitDim(self.shape, d)
		if self.Dim() == 0 {
			outer, n, inner = 1, 1, 1
		}
		for _, v := range idx {
			if v < -int64(n) || v >= int64(n) {
				bad = errorf(fname, "index out of range in self")
				return
			}
		}
		dv, sv := getF64(sh[0]), getF64(sh[2])
		scalar := source.Dim() == 0
		for o := range outer {
			for k, v := range idx {
				if v < 0 {
					v += int64(n)
				}
				db := (o*n + int(v)) * inner
				sb := (o*len(idx) + k) * inner
				for j := range inner {
					s := 0.0
					if scalar {
						s = sv[0]
					} else {
						s = sv[sb+j]
					}
					dv[db+j] += alpha * s
				}
			}
		}
		setF64(sh[0], dv)
	})
	if err == nil {
		err = bad
	}
	if err == nil {
		self.st.BumpVersion()
	}
	runtime.KeepAlive(index)
	return err
}
