package tensor

import (
	"fmt"

	"go.starlark.net/starlark"
)

// valuesIndices is the result of max(dim), min(dim) and topk, PyTorch's
// named tuple torch.return_types.max: a pair (values, indices) that indexes,
// iterates and unpacks like a tuple (v, i = t.max(dim=1)) and has the
// attributes values and indices. Its type is "return_types.max" (or min,
// topk).
type valuesIndices struct {
	kind    string // "max", "min" or "topk"
	values  *Tensor
	indices *Tensor
}

var (
	_ starlark.Indexable = (*valuesIndices)(nil)
	_ starlark.Sequence  = (*valuesIndices)(nil)
	_ starlark.HasAttrs  = (*valuesIndices)(nil)
)

func (r *valuesIndices) String() string {
	return fmt.Sprintf("return_types.%s(values=%s, indices=%s)", r.kind, r.values, r.indices)
}

func (r *valuesIndices) Type() string          { return "return_types." + r.kind }
func (r *valuesIndices) Freeze()               {}
func (r *valuesIndices) Truth() starlark.Bool  { return true }
func (r *valuesIndices) Hash() (uint32, error) { return 0, fmt.Errorf("unhashable type: %s", r.Type()) }
func (r *valuesIndices) Len() int              { return 2 }

// Index returns values (0) or indices (1).
func (r *valuesIndices) Index(i int) starlark.Value {
	if i == 0 {
		return r.values
	}
	return r.indices
}

func (r *valuesIndices) Iterate() starlark.Iterator {
	return starlark.Tuple{r.values, r.indices}.Iterate()
}

func (r *valuesIndices) Attr(name string) (starlark.Value, error) {
	switch name {
	case "values":
		return r.values, nil
	case "indices":
		return r.indices, nil
	}
	return nil, nil
}

func (r *valuesIndices) AttrNames() []string { return []string{"indices", "values"} }

// References implements env/refpath's Referrer, so that leak reports
// and reports name the tensors inside (m.values, m.indices).
func (r *valuesIndices) References(edge func(suffix string, v starlark.Value)) {
	edge(".values", r.values)
	edge(".indices", r.indices)
}
