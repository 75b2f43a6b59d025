package tensor

import (
	"fmt"
	"runtime"
	"unsafe"

	"go.starlark.net/starlark"
)

// Reductions and value extraction: sum, mean, max, min, item, tolist.

// dimsArg reads dim=None (all dimensions), an int, or a list/tuple of ints,
// and returns which dimensions are reduced.
func dimsArg(fname string, v starlark.Value, ndim int) ([]bool, error) {
	red := make([]bool, ndim)
	if v == nil || v == starlark.None {
		for i := range red {
			red[i] = true
		}
		return red, nil
	}
	var dims []int
	switch v := v.(type) {
	case starlark.Int:
		var d int
		if err := starlark.AsInt(v, &d); err != nil {
			return nil, fmt.Errorf("%s: for parameter dim: %v", fname, err)
		}
		dims = []int{d}
	case starlark.Tuple, *starlark.List:
		var err error
		if dims, err = intsArg(fname, "dim", starlark.Tuple{v}, true); err != nil {
			return nil, err
		}
		if len(dims) == 0 { // PyTorch: an empty list reduces everything
			return dimsArg(fname, nil, ndim)
		}
	default:
		return nil, fmt.Errorf("%s: for parameter dim: got %s, want int, tuple of ints or None", fname, v.Type())
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
			return nil, fmt.Errorf("%s: dim %d appears multiple times in the list of dims", fname, w)
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

// reduce implements sum and mean: (dim=None, keepdim=False, dtype=None).
func reduce(kind reduceKind, fname string, t *Tensor, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	var dimV, dtV starlark.Value
	keepdim := false
	if err := starlark.UnpackArgs(fname, args, kwargs, "dim?", &dimV, "keepdim?", &keepdim, "dtype?", &dtV); err != nil {
		return nil, err
	}
	if err := t.checkLive(fname); err != nil {
		return nil, err
	}
	red, err := dimsArg(fname, dimV, len(t.shape))
	if err != nil {
		return nil, err
	}
	def := t.dtype
	if kind == redSum && !def.IsFloat() {
		def = Int64
	}
	dt, err := dtypeArg(fname, dtV, def)
	if err != nil {
		return nil, err
	}
	if kind == redMean && !dt.IsFloat() {
		return nil, fmt.Errorf("%s: could not infer output dtype: input dtype must be a floating point dtype, got %s", fname, dt)
	}
	out, err := newTensor(t.env, fname, t.mem.Device(), dt, reducedShape(t.shape, red, keepdim))
	if err != nil {
		return nil, err
	}
	if out.hasData() && out.Numel() > 0 {
		reduceKernel(kind, t, red, out.mem.Pointer(), dt, nil)
	}
	runtime.KeepAlive(t)
	return out, nil
}

// extreme implements max and min: with no dim, a 0-dim tensor; with dim,
// the pair (values, indices) as PyTorch's named tuple (indices are int64).
func extreme(kind reduceKind, fname string, t *Tensor, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	var dimV starlark.Value
	keepdim := false
	if err := starlark.UnpackArgs(fname, args, kwargs, "dim?", &dimV, "keepdim?", &keepdim); err != nil {
		return nil, err
	}
	if err := t.checkLive(fname); err != nil {
		return nil, err
	}
	if dimV != nil && dimV != starlark.None {
		if _, ok := dimV.(starlark.Int); !ok {
			return nil, fmt.Errorf("%s: for parameter dim: got %s, want int", fname, dimV.Type())
		}
	}
	red, err := dimsArg(fname, dimV, len(t.shape))
	if err != nil {
		return nil, err
	}
	withDim := dimV != nil && dimV != starlark.None
	if t.Numel() == 0 {
		if !withDim {
			return nil, fmt.Errorf("%s: expected reduction dim to be specified for input.numel() == 0", fname)
		}
		for d, r := range red {
			if r && t.shape[d] == 0 {
				return nil, fmt.Errorf("%s: cannot compute over an empty dimension (dim %d has size 0)", fname, d)
			}
		}
	}
	if !withDim {
		keepdim = false
	}
	shape := reducedShape(t.shape, red, keepdim)
	// Both results are validated before either is allocated.
	if _, err := checkSize(fname, shape, Int64); err != nil {
		return nil, err
	}
	vals, err := newTensor(t.env, fname, t.mem.Device(), t.dtype, shape)
	if err != nil {
		return nil, err
	}
	var idx *Tensor
	var idxP unsafe.Pointer
	if withDim {
		if idx, err = newTensor(t.env, fname, t.mem.Device(), Int64, shape); err != nil {
			return nil, err
		}
		idxP = idx.mem.Pointer()
	}
	if vals.hasData() && vals.Numel() > 0 {
		reduceKernel(kind, t, red, vals.mem.Pointer(), t.dtype, idxP)
	}
	runtime.KeepAlive(t)
	if withDim {
		name := "max"
		if kind == redMin {
			name = "min"
		}
		return &valuesIndices{kind: name, values: vals, indices: idx}, nil
	}
	return vals, nil
}

// scalarValue converts the element at p to a Starlark number.
func scalarValue(dt DType, p unsafe.Pointer) starlark.Value {
	switch {
	case dt == Bool:
		return starlark.Bool(ld[uint8](p) != 0)
	case dt.IsFloat():
		return starlark.Float(loadF64[dt](p))
	}
	return starlark.MakeInt64(loadI64[dt](p))
}

func item(fname string, t *Tensor) (starlark.Value, error) {
	if err := t.checkLive(fname); err != nil {
		return nil, err
	}
	if n := t.Numel(); n != 1 {
		return nil, fmt.Errorf("%s: a tensor with %d elements cannot be converted to a number", fname, n)
	}
	if err := t.needData(fname); err != nil {
		return nil, err
	}
	v := scalarValue(t.dtype, elemAddr(t.mem.Pointer(), t.offset, t.dtype.Size()))
	runtime.KeepAlive(t)
	return v, nil
}

// tolist returns nested lists of numbers (a number for a 0-dim tensor).
func tolist(fname string, t *Tensor) (starlark.Value, error) {
	if err := t.needData(fname); err != nil {
		return nil, err
	}
	if t.Numel() > 1<<26 {
		return nil, fmt.Errorf("%s: tensor has %d elements; tolist is limited to 2^26", fname, t.Numel())
	}
	base, size := t.mem.Pointer(), t.dtype.Size()
	var rec func(d, off int) starlark.Value
	rec = func(d, off int) starlark.Value {
		if d == len(t.shape) {
			return scalarValue(t.dtype, elemAddr(base, off, size))
		}
		elems := make([]starlark.Value, t.shape[d])
		for i := range elems {
			elems[i] = rec(d+1, off+i*t.strides[d])
		}
		return starlark.NewList(elems)
	}
	v := rec(0, t.offset)
	runtime.KeepAlive(t)
	return v, nil
}
