package nn

import (
	"fmt"

	"go.starlark.net/starlark"

	"github.com/memsh/memsh/tensor"
	"github.com/memsh/memsh/tensor/autograd"
)

func init() {
	registerPure("autocast", autocastFn)
}

// autocastFn is nn.autocast(fn, *args, dtype="bfloat16", enabled=True,
// device_type="cuda", cache_enabled=True, **kwargs): fn(*args, **kwargs)
// run inside torch.autocast(device_type, dtype, enabled, cache_enabled)
// (PyTorch 2.x semantics for CUDA; see tensor/autograd/autocast.go for the
// op lists): matmul-like ops on CUDA tensors run in dtype (float16 or
// bfloat16) on casts of their float32 inputs, softmax, log_softmax, sum,
// exp, log, layer_norm and the losses in float32. The casts of parameters
// are cached for the call and released when the outermost autocast call
// returns, unless the graph saved them (a bf16 Linear keeps the bf16
// copies of its input and weight for backward). Returns fn's result.
// Note: PyTorch's default dtype for CUDA autocast is float16; memsh's
// default here is bfloat16 (the usual choice on Ampere and later).
func autocastFn(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	fname := b.Name()
	if len(args) == 0 {
		return nil, fmt.Errorf("%s: missing argument for fn", fname)
	}
	fn, ok := args[0].(starlark.Callable)
	if !ok {
		return nil, fmt.Errorf("%s: for parameter fn: got %s, want a callable", fname, args[0].Type())
	}
	dtV := starlark.Value(starlark.String("bfloat16"))
	enabled, cacheEnabled := true, true
	deviceType := "cuda"
	var rest []starlark.Tuple
	for _, kv := range kwargs {
		k, _ := starlark.AsString(kv[0])
		switch k {
		case "dtype":
			dtV = kv[1]
		case "enabled", "cache_enabled":
			v, ok := kv[1].(starlark.Bool)
			if !ok {
				return nil, fmt.Errorf("%s: for parameter %s: got %s, want bool", fname, k, kv[1].Type())
			}
			if k == "enabled" {
				enabled = bool(v)
			} else {
				cacheEnabled = bool(v)
			}
		case "device_type":
			s, ok := starlark.AsString(kv[1])
			if !ok {
				return nil, fmt.Errorf("%s: for parameter device_type: got %s, want str", fname, kv[1].Type())
			}
			deviceType = s
		default:
			rest = append(rest, kv)
		}
	}
	if deviceType != "cuda" {
		return nil, fmt.Errorf("%s: for parameter device_type: only \"cuda\" autocast is modelled, got %q", fname, deviceType)
	}
	_, dt, err := deviceDType(thread, fname, nil, dtV)
	if err != nil {
		return nil, err
	}
	if dt == tensor.Undefined {
		dt = tensor.BFloat16
	}
	if err := autograd.AutocastDTypeOK(dt); err != nil {
		return nil, fmt.Errorf("%s: for parameter dtype: %w", fname, err)
	}
	ctx, err := ctxOf(thread, fname)
	if err != nil {
		return nil, err
	}
	st := ctx.AutocastOf()
	prevCache := st.CacheEnabled
	st.CacheEnabled = cacheEnabled
	defer func() { st.CacheEnabled = prevCache }()
	var res starlark.Value
	thread.DeclareTransparent() // the casts it keeps are the Context's cast cache
	if st.Nesting == 0 {
		// the outermost region: the reach walk credits its casts to this
		// frame (tensor.AutocastState.Owner)
		st.Owner = thread.DebugFrame(0).Stamp()
	}
	err = autograd.Autocast(ctx, enabled, dt, func() error {
		var err error
		res, err = starlark.Call(thread, fn, args[1:], rest)
		return err
	})
	if err != nil {
		return nil, err
	}
	return res, nil
}
