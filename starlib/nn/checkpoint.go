package nn

import (
	"fmt"

	"go.starlark.net/starlark"

	startensor "github.com/memsh/memsh/starlib/tensor"
	"github.com/memsh/memsh/tensor"
	"github.com/memsh/memsh/tensor/autograd"
)

func init() { registerPure("checkpoint", nnCheckpoint) }

// nnCheckpoint is nn.checkpoint(fn, *args, use_reentrant=False,
// preserve_rng_state=True, **kwargs): torch.utils.checkpoint.checkpoint
// with PyTorch 2.x's non-reentrant semantics (tensor/autograd/checkpoint.go).
// It returns fn(*args, **kwargs); the tensors the region's nodes would save
// are not kept (only the tensor arguments, and what the result keeps), and
// the backward calls fn again on the same thread to recompute them, each
// recomputed tensor freed once the node that needs it has run. The
// generator's state is host state (no device bytes; PyTorch's 5056-byte
// get_rng_state() tensor is a CPU tensor). Only the non-reentrant variant
// exists: use_reentrant=True is an error, and None (PyTorch 2.4+ warns and
// takes True) means False here. No warning when no input requires grad (the
// region still records; parameters inside get gradients).
func nnCheckpoint(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	if len(args) == 0 {
		return nil, fmt.Errorf("%s: missing argument for fn", b.Name())
	}
	fn, ok := args[0].(starlark.Callable)
	if !ok {
		return nil, fmt.Errorf("%s: fn: got %s, want a callable", b.Name(), args[0].Type())
	}
	preserve := true
	var fkw []starlark.Tuple
	for _, kv := range kwargs {
		name, _ := starlark.AsString(kv[0])
		switch name {
		case "use_reentrant":
			switch v := kv[1].(type) {
			case starlark.NoneType:
			case starlark.Bool:
				if v {
					return nil, fmt.Errorf("%s: use_reentrant=True is not supported (memsh implements the non-reentrant checkpoint; pass use_reentrant=False)", b.Name())
				}
			default:
				return nil, fmt.Errorf("%s: use_reentrant: got %s, want bool or None", b.Name(), kv[1].Type())
			}
		case "preserve_rng_state":
			v, ok := kv[1].(starlark.Bool)
			if !ok {
				return nil, fmt.Errorf("%s: preserve_rng_state: got %s, want bool", b.Name(), kv[1].Type())
			}
			preserve = bool(v)
		case "context_fn", "determinism_check", "debug":
			return nil, fmt.Errorf("%s: %s is not supported", b.Name(), name)
		default:
			fkw = append(fkw, kv)
		}
	}
	c, err := ctxOf(thread, b.Name())
	if err != nil {
		return nil, err
	}
	// The tensor arguments are the region's inputs (PyTorch saves those;
	// the other arguments and the keyword arguments are kept as they are).
	skeleton := make(starlark.Tuple, len(args)-1)
	var pos []int
	var inputs []*tensor.Tensor
	for i, a := range args[1:] {
		if t, ok := a.(*startensor.Tensor); ok {
			pos = append(pos, i)
			inputs = append(inputs, t.Engine())
			skeleton[i] = starlark.None
		} else {
			skeleton[i] = a
		}
	}
	call := func(ins []*tensor.Tensor) (starlark.Value, error) {
		a := make(starlark.Tuple, len(skeleton))
		copy(a, skeleton)
		for j, i := range pos {
			a[i] = startensor.Wrap(ins[j])
		}
		return starlark.Call(thread, fn, a, fkw)
	}
	// The forward holds the inputs (they are its arguments) and the
	// frame, which the outputs' saved-tensor holders lead to. The
	// recomputation runs inside backward(), which is not transparent.
	thread.DeclareTransparent()
	return autograd.Checkpoint(c, inputs, call, preserve, starlark.Tuple{fn, skeleton, kwargsTuple(fkw)})
}

// kwargsTuple is kwargs as one Tuple of its pairs (a Starlark value).
func kwargsTuple(kwargs []starlark.Tuple) starlark.Tuple {
	t := make(starlark.Tuple, len(kwargs))
	for i, kv := range kwargs {
		t[i] = kv
	}
	return t
}
