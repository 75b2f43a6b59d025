package tensor

import (
	"fmt"
	"sort"

	"go.starlark.net/starlark"

	"github.com/memsh/memsh/tensor"
	"github.com/memsh/memsh/tensor/autograd"
)

// Indexing and masking methods, differentiable (tensor/autograd records
// PyTorch's nodes):
//
//	split(split_size_or_sections, dim=0)  a tuple of views (SplitBackward0 / SplitWithSizesBackward0)
//	chunk(chunks, dim=0)                  a tuple of views (SplitBackward0)
//	masked_fill(mask, value)              a new tensor (broadcast with the bool mask); MaskedFillBackward0 saves mask
//	masked_fill_(mask, value)             in place, returns t
//	triu(diagonal=0) tril(diagonal=0)     new tensors; the backward saves nothing
//	where(condition, other)               torch.where(condition, t, other); WhereBackward0 saves condition
//	index_select(dim, index)              a new tensor; IndexSelectBackward0 saves index
//
// Module functions: the same as tensor.<name>(input, ...), plus
// tensor.where(condition, input, other) (numbers allowed for input and
// other: a 0-dim device tensor is made for each, as ATen's Scalar
// overloads do), tensor.where(condition) (nonzero(condition,
// as_tuple=True): the columns of one int64 result, views) and tensor.randint(low=0, high, size, dtype=None,
// device=None) (int64 unless dtype says otherwise).
func init() {
	for name, fn := range map[string]methodFn{
		"split":        methodSplit,
		"chunk":        methodChunk,
		"masked_fill":  methodMaskedFill(false),
		"masked_fill_": methodMaskedFill(true),
		"triu":         methodTriangle(true),
		"tril":         methodTriangle(false),
		"where":        methodWhere,
		"index_select": methodIndexSelect,
	} {
		methods[name] = fn
		attrNames = append(attrNames, name)
	}
	sort.Strings(attrNames)
	for _, name := range []string{"split", "chunk", "masked_fill", "triu", "tril", "index_select"} {
		Module.Members[name] = starlark.NewBuiltin("tensor."+name, methodAsFunction(name))
	}
	Module.Members["where"] = starlark.NewBuiltin("tensor.where", whereFunction)
}

func tensorTuple(fname string) func(ts []*tensor.Tensor, err error) (starlark.Value, error) {
	return func(ts []*tensor.Tensor, err error) (starlark.Value, error) { return tensorTupleOf(fname, ts, err) }
}

func tensorTupleOf(fname string, ts []*tensor.Tensor, err error) (starlark.Value, error) {
	if err != nil {
		return nil, rename(err, fname)
	}
	out := make(starlark.Tuple, len(ts))
	for i, t := range ts {
		out[i] = Wrap(t)
	}
	return out, nil
}

func methodSplit(_ *starlark.Thread, fname string, t *Tensor, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	var sv starlark.Value
	dim := 0
	if err := starlark.UnpackArgs(fname, args, kwargs, "split_size_or_sections", &sv, "dim?", &dim); err != nil {
		return nil, err
	}
	if i, ok := sv.(starlark.Int); ok {
		n, ok := i.Int64()
		if !ok {
			return nil, fmt.Errorf("%s: split_size_or_sections: %s out of range", fname, i)
		}
		return tensorTuple(fname)(autograd.Split(t.t, int(n), nil, dim))
	}
	sizes, err := shapeArg(fname, "split_size_or_sections", sv)
	if err != nil {
		return nil, err
	}
	if sizes == nil {
		sizes = []int{}
	}
	return tensorTuple(fname)(autograd.Split(t.t, 0, sizes, dim))
}

func methodChunk(_ *starlark.Thread, fname string, t *Tensor, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	var chunks int
	dim := 0
	if err := starlark.UnpackArgs(fname, args, kwargs, "chunks", &chunks, "dim?", &dim); err != nil {
		return nil, err
	}
	return tensorTuple(fname)(autograd.Chunk(t.t, chunks, dim))
}

func maskArg(fname string, v starlark.Value) (*tensor.Tensor, error) {
	m, ok := v.(*Tensor)
	if !ok {
		return nil, fmt.Errorf("%s: for parameter mask: got %s, want tensor", fname, v.Type())
	}
	return m.t, nil
}

func methodMaskedFill(inPlace bool) methodFn {
	return func(_ *starlark.Thread, fname string, t *Tensor, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
		var mv, vv starlark.Value
		if err := starlark.UnpackArgs(fname, args, kwargs, "mask", &mv, "value", &vv); err != nil {
			return nil, err
		}
		m, err := maskArg(fname, mv)
		if err != nil {
			return nil, err
		}
		var v tensor.Scalar
		if vt, ok := vv.(*Tensor); ok {
			if vt.t.Dim() != 0 {
				return nil, fmt.Errorf("%s: only supports a 0-dimensional value tensor, but got tensor with %d dimension(s).", fname, vt.t.Dim())
			}
			if v, err = vt.t.Item(); err != nil {
				return nil, rename(err, fname)
			}
		} else if v, err = scalarArg(vv); err != nil {
			return nil, fmt.Errorf("%s: for parameter value: got %s, want number", fname, vv.Type())
		}
		if inPlace {
			if err := autograd.MaskedFill_(t.t, m, v); err != nil {
				return nil, rename(err, fname)
			}
			return t, nil
		}
		return resultAs(fname)(autograd.MaskedFill(t.t, m, v))
	}
}

func methodTriangle(upper bool) methodFn {
	return func(_ *starlark.Thread, fname string, t *Tensor, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
		k := 0
		if err := starlark.UnpackArgs(fname, args, kwargs, "diagonal?", &k); err != nil {
			return nil, err
		}
		return resultAs(fname)(autograd.Triangle(t.t, k, upper))
	}
}

func methodIndexSelect(_ *starlark.Thread, fname string, t *Tensor, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	var dim int
	var iv starlark.Value
	if err := starlark.UnpackArgs(fname, args, kwargs, "dim", &dim, "index", &iv); err != nil {
		return nil, err
	}
	it, ok := iv.(*Tensor)
	if !ok {
		return nil, fmt.Errorf("%s: for parameter index: got %s, want tensor", fname, iv.Type())
	}
	return resultAs(fname)(autograd.IndexSelect(t.t, dim, it.t))
}

// whereOperand reads where's input/other: a tensor or a number.
func whereOperand(fname, param string, v starlark.Value) (*tensor.Tensor, tensor.Scalar, error) {
	if t, ok := v.(*Tensor); ok {
		return t.t, tensor.Scalar{}, nil
	}
	s, err := scalarArg(v)
	if err != nil {
		return nil, s, fmt.Errorf("%s: for parameter %s: got %s, want tensor or number", fname, param, v.Type())
	}
	return nil, s, nil
}

func where(fname string, cv, xv, yv starlark.Value) (starlark.Value, error) {
	c, ok := cv.(*Tensor)
	if !ok {
		return nil, fmt.Errorf("%s: for parameter condition: got %s, want tensor", fname, cv.Type())
	}
	x, sx, err := whereOperand(fname, "input", xv)
	if err != nil {
		return nil, err
	}
	y, sy, err := whereOperand(fname, "other", yv)
	if err != nil {
		return nil, err
	}
	return resultAs(fname)(autograd.Where(c.t, x, y, sx, sy))
}

func methodWhere(_ *starlark.Thread, fname string, t *Tensor, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	var cv, yv starlark.Value
	if err := starlark.UnpackArgs(fname, args, kwargs, "condition", &cv, "other", &yv); err != nil {
		return nil, err
	}
	return where(fname, cv, t, yv)
}

// whereFunction is tensor.where(condition, input, other), and
// tensor.where(condition): nonzero(condition, as_tuple=True).
func whereFunction(_ *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	var cv, xv, yv starlark.Value
	if err := starlark.UnpackArgs(b.Name(), args, kwargs, "condition", &cv, "input?", &xv, "other?", &yv); err != nil {
		return nil, err
	}
	if xv == nil && yv == nil {
		c, ok := cv.(*Tensor)
		if !ok {
			return nil, fmt.Errorf("%s: for parameter condition: got %s, want tensor", b.Name(), cv.Type())
		}
		return nonzeroTuple(b.Name(), c.t)
	}
	if xv == nil || yv == nil {
		return nil, fmt.Errorf("%s: takes condition alone or condition, input and other", b.Name())
	}
	return where(b.Name(), cv, xv, yv)
}
