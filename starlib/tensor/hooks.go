package tensor

import (
	"fmt"

	"go.starlark.net/starlark"

	"github.com/memsh/memsh/tensor"
	"github.com/memsh/memsh/tensor/autograd"
)

// t.register_post_accumulate_grad_hook(hook) (PyTorch 2.1's
// Tensor.register_post_accumulate_grad_hook): after a backward
// accumulated a leaf's gradient into t.grad, hook(t) is called — t is the
// value the hook was registered on — and must return None. The pattern it
// exists for is the optimizer step fused into the backward: each
// parameter's hook steps its own optimizer and sets its gradient to None,
// so no more than the gradients in flight are ever allocated. Returns a
// handle whose .remove() unregisters the hook. Errors are PyTorch's: a
// non-leaf, or a tensor that does not require grad. The hook runs on the
// thread that registered it (methods_autograd.go lists the method).
func registerPostAccumulateGradHook(thread *starlark.Thread, fname string, t *Tensor, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	var hook starlark.Callable
	if err := starlark.UnpackArgs(fname, args, kwargs, "hook", &hook); err != nil {
		return nil, err
	}
	remove, err := autograd.RegisterPostAccumulateGradHook(t.t, func(*tensor.Tensor) error {
		r, err := starlark.Call(thread, hook, starlark.Tuple{t}, nil)
		if err != nil {
			return err
		}
		if r != starlark.None {
			return fmt.Errorf("%s: the hook returned %s, want None", fname, r.Type())
		}
		return nil
	}, starlark.Tuple{hook, t})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", fname, err)
	}
	return &RemovableHandle{remove: remove}, nil
}

// RemovableHandle is a registered hook's handle (type
// "RemovableHandle", torch.utils.hooks.RemovableHandle): .remove()
// unregisters the hook; a second remove does nothing.
type RemovableHandle struct {
	remove func()
}

var _ starlark.HasAttrs = (*RemovableHandle)(nil)

func (h *RemovableHandle) String() string       { return "<RemovableHandle>" }
func (h *RemovableHandle) Type() string         { return "RemovableHandle" }
func (h *RemovableHandle) Freeze()              {}
func (h *RemovableHandle) Truth() starlark.Bool { return true }
func (h *RemovableHandle) Hash() (uint32, error) {
	return 0, fmt.Errorf("unhashable type: RemovableHandle")
}
func (h *RemovableHandle) AttrNames() []string { return []string{"remove"} }

func (h *RemovableHandle) Attr(name string) (starlark.Value, error) {
	if name != "remove" {
		return nil, nil
	}
	return starlark.NewBuiltin("RemovableHandle.remove", func(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
		if err := starlark.UnpackArgs(b.Name(), args, kwargs); err != nil {
			return nil, err
		}
		h.remove()
		return starlark.None, nil
	}), nil
}
