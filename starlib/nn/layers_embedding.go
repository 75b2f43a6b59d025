package nn

import (
	"fmt"

	"go.starlark.net/starlark"

	"github.com/memsh/memsh/tensor"
	"github.com/memsh/memsh/tensor/autograd"
)

// Embedding:
//
//	nn.functional.embedding(input, weight, padding_idx=None)
//	    input int64/int32 indices of any shape, weight [num_embeddings, dim];
//	    the result is input.shape + [dim] (one allocation, index_select of the rows).
//	    Saved as in PyTorch's derivatives.yaml for embedding (indices); the backward
//	    allocates the dense [num_embeddings, dim] gradient (padding_idx's row stays 0).
//	nn.Embedding(num_embeddings, embedding_dim, padding_idx=None, device=None, dtype=None)
//	    weight ~ N(0, 1), the padding_idx row zeroed (PyTorch's reset_parameters).
func init() {
	registerF("embedding", embeddingBuiltin)
	registerPure("Embedding", newEmbedding)
}

// paddingIdx resolves padding_idx as F.embedding does (negative counts
// from the end; None is -1).
func paddingIdx(fname string, v starlark.Value, num int) (int64, error) {
	if v == nil || v == starlark.None {
		return -1, nil
	}
	p, err := starlark.AsInt32(v)
	if err != nil {
		return 0, fmt.Errorf("%s: padding_idx: got %s, want int or None", fname, v.Type())
	}
	if p >= num || p < -num {
		return 0, fmt.Errorf("%s: Padding_idx must be within num_embeddings", fname)
	}
	if p < 0 {
		p += num
	}
	return int64(p), nil
}

func embeddingBuiltin(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	var x, w starlark.Value
	var pv starlark.Value = starlark.None
	if err := starlark.UnpackArgs(b.Name(), args, kwargs, "input", &x, "weight", &w, "padding_idx?", &pv); err != nil {
		return nil, err
	}
	xt, err := tensorArg(b.Name(), "input", x)
	if err != nil {
		return nil, err
	}
	wt, err := tensorArg(b.Name(), "weight", w)
	if err != nil {
		return nil, err
	}
	if wt.Dim() != 2 {
		return nil, fmt.Errorf("%s: 'weight' must be 2-D", b.Name())
	}
	p, err := paddingIdx(b.Name(), pv, wt.Shape()[0])
	if err != nil {
		return nil, err
	}
	out, err := autograd.Embedding(wt, xt, p)
	return wrap(out, tensor.Renamed(err, b.Name()))
}

func newEmbedding(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	var num, dim int
	var pv, devV, dtV starlark.Value = starlark.None, starlark.None, starlark.None
	if err := starlark.UnpackArgs(b.Name(), args, kwargs, "num_embeddings", &num, "embedding_dim", &dim, "padding_idx?", &pv, "device?", &devV, "dtype?", &dtV); err != nil {
		return nil, err
	}
	if num < 0 || dim < 0 {
		return nil, fmt.Errorf("%s: num_embeddings and embedding_dim must be non-negative, got %d and %d", b.Name(), num, dim)
	}
	p, err := paddingIdx(b.Name(), pv, num)
	if err != nil {
		return nil, err
	}
	c, device, dt, err := factory(thread, b.Name(), devV, dtV)
	if err != nil {
		return nil, err
	}
	w, err := tensor.Empty(c, []int{num, dim}, dt, device)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", b.Name(), err)
	}
	if err := tensor.Normal_(w, 0, 1); err != nil {
		return nil, fmt.Errorf("%s: %w", b.Name(), err)
	}
	if p >= 0 {
		row, err := tensor.Select(w, 0, int(p))
		if err != nil {
			return nil, err
		}
		if _, err := row.Mul_(tensor.Float(0)); err != nil {
			return nil, err
		}
	}
	m := newModule("Embedding")
	if _, err := newParameter(w, true); err != nil {
		return nil, fmt.Errorf("%s: %w", b.Name(), err)
	}
	m.param("weight", w)
	m.set("num_embeddings", starlark.MakeInt(num), kindAttr)
	m.set("embedding_dim", starlark.MakeInt(dim), kindAttr)
	m.set("padding_idx", pv, kindAttr)
	m.extra = func(m *Layer) string {
		if p >= 0 {
			return fmt.Sprintf("%d, %d, padding_idx=%d", num, dim, p)
		}
		return fmt.Sprintf("%d, %d", num, dim)
	}
	m.forward = func(thread *starlark.Thread, m *Layer, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
		var x starlark.Value
		if err := starlark.UnpackPositionalArgs("Embedding", args, kwargs, 1, &x); err != nil {
			return nil, err
		}
		xt, err := tensorArg("Embedding", "input", x)
		if err != nil {
			return nil, err
		}
		out, err := autograd.Embedding(m.tensorOf("weight"), xt, p)
		return wrap(out, tensor.Renamed(err, "Embedding"))
	}
	return m, nil
}
