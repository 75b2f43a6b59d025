package nn

import (
	"fmt"

	"go.starlark.net/starlark"

	"github.com/memsh/memsh/tensor"
	"github.com/memsh/memsh/tensor/autograd"
)

func init() {
	registerPure("sdpa_kernel", sdpaKernel)
	register("sdpa_backend", sdpaBackend)
}

// sdpaKernel is nn.sdpa_kernel(backends, fn, *args, **kwargs):
// fn(*args, **kwargs) with only the given scaled_dot_product_attention
// backends enabled (torch.nn.attention.sdpa_kernel as a context manager
// around the call), restored afterwards, also on error. backends is
// "math", "flash", "efficient", "cudnn" or a list of them. A forced backend that
// cannot run the inputs fails as in PyTorch: "No available kernel.
// Aborting execution." with the reasons PyTorch warns about in the
// message.
func sdpaKernel(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	if len(args) < 2 {
		return nil, fmt.Errorf("%s: want backends and fn", b.Name())
	}
	var names []starlark.Value
	switch x := args[0].(type) {
	case starlark.String:
		names = []starlark.Value{x}
	case *starlark.List, starlark.Tuple:
		it := starlark.Iterate(x)
		var v starlark.Value
		for it.Next(&v) {
			names = append(names, v)
		}
		it.Done()
	default:
		return nil, fmt.Errorf("%s: for parameter backends: got %s, want a backend name or a list of them", b.Name(), args[0].Type())
	}
	var enabled tensor.SDPBackends
	for _, v := range names {
		s, ok := starlark.AsString(v)
		be, known := tensor.ParseSDPBackend(s)
		if !ok || !known {
			return nil, fmt.Errorf("%s: for parameter backends: unknown backend %s (want \"math\", \"flash\", \"efficient\" or \"cudnn\")", b.Name(), v)
		}
		enabled = enabled.With(be)
	}
	fn, ok := args[1].(starlark.Callable)
	if !ok {
		return nil, fmt.Errorf("%s: for parameter fn: got %s, want callable", b.Name(), args[1].Type())
	}
	c, err := ctxOf(thread, b.Name())
	if err != nil {
		return nil, err
	}
	prev := c.SDPDisabled
	c.SDPDisabled = tensor.AllSDPBackends &^ enabled
	defer func() { c.SDPDisabled = prev }()
	thread.DeclareTransparent()
	return starlark.Call(thread, fn, args[2:], kwargs)
}

// sdpaBackend is nn.sdpa_backend(query, key, value, attn_mask=None,
// dropout_p=0.0, is_causal=False, enable_gqa=False): the backend ("cudnn", "flash",
// "efficient" or "math") nn.functional.scaled_dot_product_attention would run for these
// inputs on their device now (torch._fused_sdp_choice), or PyTorch's
// error when none can.
func sdpaBackend(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	var qV, kV, vV starlark.Value
	var maskV starlark.Value = starlark.None
	dropoutP := 0.0
	isCausal, enableGQA := false, false
	if err := starlark.UnpackArgs(b.Name(), args, kwargs, "query", &qV, "key", &kV, "value", &vV,
		"attn_mask?", &maskV, "dropout_p?", &dropoutP, "is_causal?", &isCausal, "enable_gqa?", &enableGQA); err != nil {
		return nil, err
	}
	var ts [3]*tensor.Tensor
	for i, p := range []struct {
		name string
		v    starlark.Value
	}{{"query", qV}, {"key", kV}, {"value", vV}} {
		t, err := tensorArg(b.Name(), p.name, p.v)
		if err != nil {
			return nil, err
		}
		ts[i] = t
	}
	mask, err := optTensorArg(b.Name(), "attn_mask", maskV)
	if err != nil {
		return nil, err
	}
	be, err := autograd.SDPBackendFor(ts[0], ts[1], ts[2], mask, dropoutP, isCausal, enableGQA)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", b.Name(), err)
	}
	return starlark.String(be.String()), nil
}
