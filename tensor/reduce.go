package tensor

import (
	"runtime"
	"unsafe"
)

// Reductions and value extraction: sum, mean, max, min, item, tolist.

// dimSet returns which of ndim dimensions dims names (nil or empty: all
// of them, as PyTorch reduces everything for an empty list).
func dimSet(fname string, dims []int, ndim int) ([]bool, error) {
	red := make([]bool, ndim)
	if len(dims) == 0 {
		for i := range red {
			red[i] = true
		}
		return red, nil
	}
	for _, d := range dims {
		w, err := wrapDim(fname, d, ndim)
		if err != nil {
			return nil, err
		}
		if ndim == 0 {
			continue
		}
		if red[w] {
			return nil, errorf(fname, "dim %d appears multiple times in the list of dims", w)
		}
		red[w] = true
	}
	return red, nil
}

// reducedShape is the result shape of a reduction.
func reducedShape(shape []int, red []bool, keepdim bool) []int {
	out := []int{}
	for d, s := range shape {
		switch {
		case !red[d]:
			out = append(out, s)
		case keepdim:
			out = append(out, 1)
		}
	}
	return out
}

// reduce implements sum and mean over dims (nil: all), with dtype dt
// (Undefined: the default).
func reduce(kind reduceKind, fname string, t *Tensor, dims []int, keepdim bool, dtArg DType) (*Tensor, error) {
	if err := t.checkLive(fname); err != nil {
		return nil, err
	}
	red, err := dimSet(fname, dims, len(t.shape))
	if err != nil {
		return nil, err
	}
	def := t.dtype
	if kind == redSum && !def.IsFloat() {
		def = Int64
	}
	dt := orDefault(dtArg, def)
	if kind == redMean && !dt.IsFloat() {
		return nil, errorf(fname, "could not infer output dtype: input dtype must be a floating point dtype, got %s", dt)
	}
	out, err := newTensor(t.ctx, fname, t.mem.Device(), dt, reducedShape(t.shape, red, keepdim))
	if err != nil {
		return nil, err
	}
	if out.hasData() && out.Numel() > 0 {
		reduceKernel(kind, t, red, out.mem.Pointer(), dt, nil)
	}
	runtime.KeepAlive(t)
	if err := t.ctx.interrupted(fname); err != nil {
		return nil, err
	}
	return out, nil
}

// extreme implements max and min: with no dim (withDim false), a 0-dim
// tensor; with dim, the values and their int64 indices.
func extreme(kind reduceKind, fname string, t *Tensor, dim int, withDim, keepdim bool) (*Tensor, *Tensor, error) {
	if err := t.checkLive(fname); err != nil {
		return nil, nil, err
	}
	var dims []int
	if withDim {
		dims = []int{dim}
	}
	red, err := dimSet(fname, dims, len(t.shape))
	if err != nil {
		return nil, nil, err
	}
	if t.Numel() == 0 {
		if !withDim {
			return nil, nil, errorf(fname, "expected reduction dim to be specified for input.numel() == 0")
		}
		for d, r := range red {
			if r && t.shape[d] == 0 {
				return nil, nil, errorf(fname, "cannot compute over an empty dimension (dim %d has size 0)", d)
			}
		}
	}
	if !withDim {
		keepdim = false
	}
	shape := reducedShape(t.shape, red, keepdim)
	// Both results are validated before either is allocated.
	if _, err := checkSize(fname, shape, Int64); err != nil {
		return nil, nil, err
	}
	vals, err := newTensor(t.ctx, fname, t.mem.Device(), t.dtype, shape)
	if err != nil {
		return nil, nil, err
	}
	var idx *Tensor
	var idxP unsafe.Pointer
	if withDim {
		if idx, err = newTensor(t.ctx, fname, t.mem.Device(), Int64, shape); err != nil {
			return nil, nil, err
		}
		idxP = idx.mem.Pointer()
	}
	if vals.hasData() && vals.Numel() > 0 {
		reduceKernel(kind, t, red, vals.mem.Pointer(), t.dtype, idxP)
	}
	runtime.KeepAlive(t)
	if err := t.ctx.interrupted(fname); err != nil {
		return nil, nil, err
	}
	return vals, idx, nil
}

// scalarAt reads the element at p as a Scalar of dtype dt.
func scalarAt(dt DType, p unsafe.Pointer) Scalar {
	return Scalar{dt: dt, f: loadF64[dt](p), i: loadI64[dt](p)}
}

func item(fname string, t *Tensor) (Scalar, error) {
	if err := t.checkLive(fname); err != nil {
		return Scalar{}, err
	}
	if n := t.Numel(); n != 1 {
		return Scalar{}, errorf(fname, "a tensor with %d elements cannot be converted to a number", n)
	}
	if err := t.needData(fname); err != nil {
		return Scalar{}, err
	}
	v := scalarAt(t.dtype, elemAddr(t.mem.Pointer(), t.offset, t.dtype.Size()))
	runtime.KeepAlive(t)
	return v, nil
}

// values returns the elements in row-major order.
func values(fname string, t *Tensor) ([]Scalar, error) {
	if err := t.needData(fname); err != nil {
		return nil, err
	}
	out := make([]Scalar, 0, t.Numel())
	forEachElem(t, func(p elemPtr) bool {
		out = append(out, scalarAt(t.dtype, p))
		return true
	})
	runtime.KeepAlive(t)
	return out, nil
}

// The reductions, public API. dims nil (or empty) reduces every
// dimension; keepdim keeps reduced dimensions with size 1.

// Sum is torch.sum: dtype dt (Undefined: t's dtype, int64 for integer and
// bool tensors).
func Sum(t *Tensor, dims []int, keepdim bool, dt DType) (*Tensor, error) {
	const fname = "tensor.sum"
	if onGPU(t) != nil {
		if len(dims) == 0 && !keepdim && dt == Undefined {
			if r, ok, err := nativeSum(fname, t); ok {
				return r, err
			}
		}
		return stagedTensor(t.ctx, fname, []*Tensor{t}, func(s *staging) (*Tensor, error) {
			return reduce(redSum, fname, s.shadowOf(t), dims, keepdim, dt)
		})
	}
	out, err := reduce(redSum, fname, t, dims, keepdim, dt)
	if err != nil {
		return nil, err
	}
	// A simulated GPU's share of PyTorch's reduce kernel: its scratch
	// (reduce_scratch.go), allocated while out is held.
	release := t.ctx.Hold(out)
	err = reductionScratch(t, dims)
	release()
	if err != nil {
		return nil, Renamed(err, fname)
	}
	return out, nil
}

// Mean is torch.mean: dtype dt (Undefined: t's, which must be floating
// point).
func Mean(t *Tensor, dims []int, keepdim bool, dt DType) (*Tensor, error) {
	const fname = "tensor.mean"
	if onGPU(t) != nil {
		return stagedTensor(t.ctx, fname, []*Tensor{t}, func(s *staging) (*Tensor, error) {
			return reduce(redMean, fname, s.shadowOf(t), dims, keepdim, dt)
		})
	}
	return reduce(redMean, fname, t, dims, keepdim, dt)
}

// Max is torch.max(t): the largest element as a 0-dim tensor.
func Max(t *Tensor) (*Tensor, error) {
	v, _, err := extremeOp(redMax, "tensor.max", t, 0, false, false)
	return v, err
}

// Min is torch.min(t): the smallest element as a 0-dim tensor.
func Min(t *Tensor) (*Tensor, error) {
	v, _, err := extremeOp(redMin, "tensor.min", t, 0, false, false)
	return v, err
}

// MaxDim is torch.max(t, dim, keepdim): the largest values along dim and
// their int64 indices (both allocated).
func MaxDim(t *Tensor, dim int, keepdim bool) (values, indices *Tensor, err error) {
	return extremeOp(redMax, "tensor.max", t, dim, true, keepdim)
}

// MinDim is torch.min(t, dim, keepdim) (see MaxDim).
func MinDim(t *Tensor, dim int, keepdim bool) (values, indices *Tensor, err error) {
	return extremeOp(redMin, "tensor.min", t, dim, true, keepdim)
}

func extremeOp(kind reduceKind, fname string, t *Tensor, dim int, withDim, keepdim bool) (*Tensor, *Tensor, error) {
	if onGPU(t) != nil {
		var v, i *Tensor
		err := staged(t.ctx, fname, []*Tensor{t}, func(s *staging) error {
			sv, si, err := extreme(kind, fname, s.shadowOf(t), dim, withDim, keepdim)
			if err != nil {
				return err
			}
			if v, err = s.back(fname, sv); err != nil {
				return err
			}
			i, err = s.back(fname, si)
			return err
		})
		return v, i, err
	}
	return extreme(kind, fname, t, dim, withDim, keepdim)
}
