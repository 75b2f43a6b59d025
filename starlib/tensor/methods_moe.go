package tensor

import (
	"fmt"
	"sort"

	"go.starlark.net/starlark"

	"github.com/memsh/memsh/tensor"
	"github.com/memsh/memsh/tensor/autograd"
)

// The ops a Mixture-of-Experts block needs (transformers'
// MixtralSparseMoeBlock), as Tensor methods and module functions:
//
//	topk(k, dim=-1, largest=True, sorted=True)   return_types.topk (values, indices): [.., k, ..] each; TopkBackward0 saves indices
//	nonzero(as_tuple=False)                      int64 [n, ndim] indices of the nonzero elements (as_tuple: a tuple of its ndim columns, views); fails on a meta device
//	nonzero_static(size, fill_value=-1)          nonzero with exactly size rows (PyTorch 2.1+): runs on meta devices too
//	index_add_(dim, index, source, alpha=1)      in place; IndexAddBackward0 saves index and source
//	index_add(dim, index, source, alpha=1)       a new tensor
//	greater(other)                               gt's alias: a bool tensor
//
// Module functions: tensor.topk(input, k, ...), tensor.nonzero(input,
// as_tuple=False), tensor.nonzero_static(input, size, fill_value=-1),
// tensor.index_add(input, dim, index, source, alpha=1),
// tensor.greater(input, other), and tensor.where(condition) — the
// one-argument where: nonzero(condition, as_tuple=True).
//
// A tensor also takes index tensors in t[...] (value.go).
func init() {
	for name, fn := range map[string]methodFn{
		"topk":           methodTopK,
		"nonzero":        methodNonzero,
		"nonzero_static": methodNonzeroStatic,
		"index_add_":     methodIndexAdd(true),
		"index_add":      methodIndexAdd(false),
		"greater":        compareMethod(tensor.CmpGt),
	} {
		methods[name] = fn
		attrNames = append(attrNames, name)
	}
	sort.Strings(attrNames)
	for _, name := range []string{"topk", "nonzero", "nonzero_static", "index_add", "greater"} {
		Module.Members[name] = starlark.NewBuiltin("tensor."+name, methodAsFunction(name))
		pureOps[name] = true
	}
}

// NewValuesIndices makes PyTorch's named pair torch.return_types.<kind>
// (values, indices) of two engine tensors, for the bindings in other
// packages that return one (nn.functional.route_topk).
func NewValuesIndices(kind string, values, indices *tensor.Tensor) starlark.Value {
	return &valuesIndices{kind: kind, values: Wrap(values), indices: Wrap(indices)}
}

func methodTopK(_ *starlark.Thread, fname string, t *Tensor, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	var k int
	dim := -1
	largest, sorted := true, true
	if err := starlark.UnpackArgs(fname, args, kwargs, "k", &k, "dim?", &dim, "largest?", &largest, "sorted?", &sorted); err != nil {
		return nil, err
	}
	vals, idx, err := autograd.TopK(t.t, k, dim, largest, sorted)
	if err != nil {
		return nil, rename(err, fname)
	}
	return NewValuesIndices("topk", vals, idx), nil
}

func methodNonzero(_ *starlark.Thread, fname string, t *Tensor, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	asTuple := false
	if err := starlark.UnpackArgs(fname, args, kwargs, "as_tuple?", &asTuple); err != nil {
		return nil, err
	}
	if asTuple {
		return nonzeroTuple(fname, t.t)
	}
	return resultAs(fname)(tensor.Nonzero(t.t))
}

// nonzeroTuple is nonzero(as_tuple=True) (ATen's nonzero_numpy): the
// columns of one nonzero() result, views; a 0-dim input counts as 1-D.
func nonzeroTuple(fname string, c *tensor.Tensor) (starlark.Value, error) {
	src := c
	if c.Dim() == 0 {
		v, err := tensor.Unsqueeze(c, 0)
		if err != nil {
			return nil, rename(err, fname)
		}
		src = v
	}
	nz, err := tensor.Nonzero(src)
	if err != nil {
		return nil, rename(err, fname)
	}
	out := make(starlark.Tuple, src.Dim())
	for j := range out {
		col, err := tensor.Select(nz, 1, j)
		if err != nil {
			return nil, rename(err, fname)
		}
		out[j] = Wrap(col)
	}
	return out, nil
}

func methodNonzeroStatic(_ *starlark.Thread, fname string, t *Tensor, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	var size int
	var fill int64 = -1
	if err := starlark.UnpackArgs(fname, args, kwargs, "size", &size, "fill_value?", &fill); err != nil {
		return nil, err
	}
	return resultAs(fname)(tensor.NonzeroStatic(t.t, size, fill))
}

func methodIndexAdd(inPlace bool) methodFn {
	return func(_ *starlark.Thread, fname string, t *Tensor, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
		var dim int
		var index, source *Tensor
		var alphaV starlark.Value
		if err := starlark.UnpackArgs(fname, args, kwargs, "dim", &dim, "index", &index, "source", &source, "alpha?", &alphaV); err != nil {
			return nil, err
		}
		alpha, err := floatArg(fname, "alpha", alphaV, 1)
		if err != nil {
			return nil, err
		}
		if inPlace {
			if err := autograd.IndexAdd_(t.t, dim, index.t, source.t, alpha); err != nil {
				return nil, rename(err, fname)
			}
			return t, nil
		}
		return resultAs(fname)(autograd.IndexAdd(t.t, dim, index.t, source.t, alpha))
	}
}

// indexTensors is t[...] with index tensors among the keys: PyTorch's
// applySlicing — left to right, an int selects (a view; a 0-dim integer
// tensor counts as its value), None inserts a dimension of size 1 (a
// view) and a tensor indexes the current dimension (a bool mask as many
// as it has) — then one index op over the tensors
// (autograd.AdvancedIndex: IndexBackward0).
func (t *Tensor) indexTensors(fname string, keys []starlark.Value) (*tensor.Tensor, error) {
	r := t.t
	var idx []*tensor.Tensor
	dim, covered := 0, 0 // the current dimension of r; the dimensions idx covers
	record := func(x *tensor.Tensor) {
		for covered < dim {
			idx = append(idx, nil)
			covered++
		}
		idx = append(idx, x)
		n := 1
		if x.DType() == tensor.Bool || x.DType() == tensor.Uint8 {
			n = x.Dim()
		}
		covered += n
		dim += n
	}
	tooMany := func() error {
		return fmt.Errorf("%s: too many indices for tensor of dimension %d", fname, t.t.Dim())
	}
	selectAt := func(i int64, ok bool, shown string) error {
		if dim >= r.Dim() {
			return tooMany()
		}
		size := r.Shape()[dim]
		if ok && i < 0 {
			i += int64(size)
		}
		if !ok || i < 0 || i >= int64(size) {
			return fmt.Errorf("%s: index %s is out of bounds for dimension %d with size %d", fname, shown, dim, size)
		}
		var err error
		r, err = autograd.Select(r, dim, int(i))
		return rename(err, fname)
	}
	for _, k := range keys {
		switch k := k.(type) {
		case starlark.NoneType:
			var err error
			if r, err = autograd.Unsqueeze(r, dim); err != nil {
				return nil, rename(err, fname)
			}
			dim++
		case starlark.Int:
			i, ok := k.Int64()
			if err := selectAt(i, ok, k.String()); err != nil {
				return nil, err
			}
		case *Tensor:
			x := k.t
			if x.Dim() == 0 && x.DType().IsInt() {
				s, err := x.Item()
				if err != nil {
					return nil, rename(err, fname)
				}
				if err := selectAt(s.Int64(), true, fmt.Sprint(s.Int64())); err != nil {
					return nil, err
				}
				continue
			}
			if dim >= r.Dim() && x.Dim() > 0 {
				return nil, tooMany()
			}
			record(x)
		default:
			return nil, fmt.Errorf("%s: got %s, want int, None or tensor (slices go alone: t[a:b])", fname, k.Type())
		}
	}
	if len(idx) == 0 {
		if r == t.t {
			return autograd.Index(t.t)
		}
		return r, nil
	}
	out, err := autograd.AdvancedIndex(r, idx)
	return out, rename(err, fname)
}
