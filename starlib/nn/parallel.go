package nn

import (
	"fmt"
	"strings"

	"go.starlark.net/starlark"
	"go.starlark.net/starlarkstruct"

	"github.com/memsh/memsh/env"
	"github.com/memsh/memsh/starlib/dist"
	startensor "github.com/memsh/memsh/starlib/tensor"
	"github.com/memsh/memsh/tensor"
	"github.com/memsh/memsh/tensor/autograd"
	tdist "github.com/memsh/memsh/tensor/dist"
)

// Parallel is nn.parallel:
//
//	DistributedDataParallel(module, device_ids=None, output_device=None, broadcast_buffers=True,
//	    bucket_cap_mb=25, find_unused_parameters=False, gradient_as_bucket_view=False,
//	    static_graph=False)
//
// DistributedDataParallel wraps module for one rank of the Session's
// process group (dist.init_process_group): the module as .module (its
// parameters named "module.…"), calling it runs DDP's forward, and
// no_sync(fn, *args, **kwargs) calls fn with gradient synchronisation off
// (the with-block of PyTorch's no_sync()). Memory as PyTorch 2.x's DDP
// allocates it on the device (tensor/dist's Reducer): at construction the
// parameter-shape check's small tensors and the flattened broadcast of
// the parameters and buffers (250 MiB buckets, at most two at once), then
// one gradient bucket per dtype as large as the trainable parameters;
// before each forward the buffers' flattened broadcast (broadcast_buffers,
// when the module has buffers); the buckets rebuilt at the first forward
// after a reduced backward (1 MiB, then bucket_cap_mb, in gradient-ready
// order); in the backward each gradient copied into its bucket (with
// gradient_as_bucket_view the gradient then is the bucket's view and its
// own tensor is freed) and each bucket all-reduced in place.
// find_unused_parameters=True and static_graph=True are refused: memsh
// models the default reducer only.
var Parallel = &starlarkstruct.Module{Name: "nn.parallel", Members: starlark.StringDict{
	"DistributedDataParallel": starlark.NewBuiltin("nn.parallel.DistributedDataParallel", newDDP),
}}

func init() { Module.Members["parallel"] = Parallel }

// ddpState is what a DistributedDataParallel module keeps besides its
// child.
type ddpState struct {
	g                *tdist.Group
	reducer          *tdist.Reducer
	broadcastBuffers bool
	// syncBuffers is require_forward_param_sync: the last forward ran
	// under grad with synchronisation (initially true).
	syncBuffers bool
	noSync      bool // inside no_sync
}

func newDDP(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	var mod *Layer
	var deviceIDs, outputDevice starlark.Value = starlark.None, starlark.None
	broadcastBuffers, findUnused, asView, static := true, false, false, false
	var capMB starlark.Value = starlark.MakeInt(25)
	if err := starlark.UnpackArgs(b.Name(), args, kwargs, "module", &mod, "device_ids?", &deviceIDs, "output_device?", &outputDevice,
		"broadcast_buffers?", &broadcastBuffers, "bucket_cap_mb?", &capMB, "find_unused_parameters?", &findUnused,
		"gradient_as_bucket_view?", &asView, "static_graph?", &static); err != nil {
		return nil, err
	}
	if findUnused {
		return nil, fmt.Errorf("%s: find_unused_parameters=True is not modelled (memsh's reducer is the default one, which reduces every trainable parameter)", b.Name())
	}
	if static {
		return nil, fmt.Errorf("%s: static_graph=True is not modelled", b.Name())
	}
	mb, ok := starlark.AsFloat(capMB)
	if !ok || mb <= 0 {
		return nil, fmt.Errorf("%s: bucket_cap_mb must be a positive number, got %s", b.Name(), capMB)
	}
	g, _, err := dist.GroupOf(thread, b, "", nil)
	if err != nil {
		return nil, err
	}
	_, all := mod.namedTensors(kindParam, "", true)
	_, bufs := mod.namedTensors(kindBuffer, "", true)
	var params, trainable []*tensor.Tensor
	for _, t := range all {
		params = append(params, t.Engine())
		if autograd.RequiresGrad(t.Engine()) {
			trainable = append(trainable, t.Engine())
		}
	}
	if len(trainable) == 0 {
		return nil, fmt.Errorf("%s: DistributedDataParallel is not needed when a module doesn't have any parameter that requires a gradient.", b.Name())
	}
	for _, p := range params {
		if !strings.HasPrefix(p.Device(), "cuda") {
			// NCCL's collectives take device tensors only
			return nil, fmt.Errorf("%s: module's parameters must be on a CUDA device (found one on %s)", b.Name(), p.Device())
		}
	}
	// DDP's constructor: verify the shapes, broadcast the state, build
	// the reducer
	if err := g.VerifyParamShapes(trainable); err != nil {
		return nil, fmt.Errorf("%s: %w", b.Name(), err)
	}
	state := params
	if broadcastBuffers {
		state = append(state, engines(bufs)...)
	}
	if err := g.BroadcastCoalesced(state, tdist.DefaultBroadcastBucketBytes); err != nil {
		return nil, fmt.Errorf("%s: %w", b.Name(), err)
	}
	red, err := g.NewReducer(trainable, tdist.ReducerOptions{BucketCapBytes: int64(mb * (1 << 20)), GradientAsBucketView: asView})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", b.Name(), err)
	}
	m := newModule("DistributedDataParallel")
	m.child("module", mod)
	m.ddp = &ddpState{g: g, reducer: red, broadcastBuffers: broadcastBuffers, syncBuffers: true}
	m.training = mod.training
	m.forward = ddpForward
	return m, nil
}

func engines(ts []*startensor.Tensor) []*tensor.Tensor {
	out := make([]*tensor.Tensor, len(ts))
	for i, t := range ts {
		out[i] = t.Engine()
	}
	return out
}

// ddpForward is DistributedDataParallel.forward: _pre_forward (the
// reducer's rebuild and arming, the buffers' broadcast), the module's
// forward, _post_forward.
func ddpForward(thread *starlark.Thread, m *Layer, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	const fname = "DistributedDataParallel.forward"
	d := m.ddp
	// what the Go code below holds is reachable from m (the reducer) or
	// Held (the flat copies): the module's forward may free what it drops
	thread.DeclareTransparent()
	e, err := env.Of(thread, fname)
	if err != nil {
		return nil, err
	}
	grad := autograd.GradEnabled(startensor.Context(e))
	sync := !d.noSync
	if err := d.reducer.Prepare(grad, sync); err != nil {
		return nil, err
	}
	mod := m.entry("module").(*Layer)
	if d.syncBuffers && d.broadcastBuffers {
		if _, bufs := mod.namedTensors(kindBuffer, "", true); len(bufs) > 0 {
			if err := d.g.BroadcastCoalesced(engines(bufs), tdist.DefaultBroadcastBucketBytes); err != nil {
				return nil, fmt.Errorf("%s: %w", fname, err)
			}
		}
	}
	out, err := starlark.Call(thread, mod, args, kwargs)
	if err != nil {
		return nil, err
	}
	d.syncBuffers = grad && sync
	return out, nil
}

// ddpNoSync is DistributedDataParallel.no_sync(fn, *args, **kwargs):
// fn's forwards and backwards accumulate gradients in .grad without
// reducing them.
func ddpNoSync(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	m := b.Receiver().(*Layer)
	if len(args) == 0 {
		return nil, fmt.Errorf("%s: missing argument fn", b.Name())
	}
	fn, ok := args[0].(starlark.Callable)
	if !ok {
		return nil, fmt.Errorf("%s: fn must be callable, not %s", b.Name(), args[0].Type())
	}
	prev := m.ddp.noSync
	m.ddp.noSync = true
	defer func() { m.ddp.noSync = prev }()
	thread.DeclareTransparent()
	return starlark.Call(thread, fn, args[1:], kwargs)
}
