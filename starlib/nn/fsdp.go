package nn

import (
	"fmt"
	"strings"

	"go.starlark.net/starlark"
	"go.starlark.net/starlarkstruct"

	"github.com/memsh/memsh/backend"
	"github.com/memsh/memsh/starlib/dist"
	startensor "github.com/memsh/memsh/starlib/tensor"
	"github.com/memsh/memsh/tensor"
	"github.com/memsh/memsh/tensor/autograd"
	tdist "github.com/memsh/memsh/tensor/dist"
)

// FSDP is dist.fsdp (torch.distributed.fsdp), FSDP2 for one rank of the
// Session's process group (the engine: tensor/dist's FSDPGroup):
//
//	fully_shard(module, mesh=None, reshard_after_forward=True, mp_policy=None, offload_policy=None)
//	    shards the parameters module manages (its own and its submodules'
//	    not managed by an inner fully_shard) on dim 0 over mesh (a 1-D
//	    DeviceMesh, the data-parallel dim of a 2-D one; None: the whole
//	    process group) and returns module,
//	    whose calls then all-gather them around its forward and backward
//	    and reduce-scatter their gradients (PyTorch 2.6's allocations)
//	MixedPrecisionPolicy(param_dtype=None, reduce_dtype=None, output_dtype=None, cast_forward_inputs=True)
//	CPUOffloadPolicy(pin_memory=True)
//	    offload_policy's CPU offload: the shards, their gradients and the
//	    optimizer states in host memory, the optimizer step on the CPU
//	    (a model built on the meta device is materialized with
//	    to_empty(device="cpu"); its buffers stay on the GPU)
//	OffloadPolicy()
//	    no offload (the default)
//
// As torchtitan applies it: fully_shard each transformer block, then the
// root model. The first sharded module called is the root: it keeps its
// parameters unsharded after its forward (PyTorch 2.4-2.7) and frees the
// last reduce-scatter input at the end of the backward. Refused:
// output_dtype.
var FSDP = &starlarkstruct.Module{Name: "dist.fsdp", Members: starlark.StringDict{
	"fully_shard":          starlark.NewBuiltin("dist.fsdp.fully_shard", fullyShard),
	"MixedPrecisionPolicy": starlark.NewBuiltin("dist.fsdp.MixedPrecisionPolicy", mixedPrecisionPolicy),
	"CPUOffloadPolicy":     starlark.NewBuiltin("dist.fsdp.CPUOffloadPolicy", cpuOffloadPolicy),
	"OffloadPolicy":        starlark.NewBuiltin("dist.fsdp.OffloadPolicy", offloadPolicy),
}}

func cpuOffloadPolicy(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	pin := true
	if err := starlark.UnpackArgs(b.Name(), args, kwargs, "pin_memory?", &pin); err != nil {
		return nil, err
	}
	return starlarkstruct.FromStringDict(starlark.String("CPUOffloadPolicy"), starlark.StringDict{"pin_memory": starlark.Bool(pin)}), nil
}

func offloadPolicy(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	if err := starlark.UnpackArgs(b.Name(), args, kwargs); err != nil {
		return nil, err
	}
	return starlarkstruct.FromStringDict(starlark.String("OffloadPolicy"), starlark.StringDict{}), nil
}

// offloadArg is fully_shard's offload_policy: None or OffloadPolicy() (no
// offload) or CPUOffloadPolicy.
func offloadArg(fname string, v starlark.Value) (tdist.CPUOffload, error) {
	if v == starlark.None {
		return tdist.CPUOffload{}, nil
	}
	st, ok := v.(*starlarkstruct.Struct)
	if ok && st.Constructor() == starlark.String("OffloadPolicy") {
		return tdist.CPUOffload{}, nil
	}
	if !ok || st.Constructor() != starlark.String("CPUOffloadPolicy") {
		return tdist.CPUOffload{}, fmt.Errorf("%s: offload_policy: got %s, want dist.fsdp.CPUOffloadPolicy or OffloadPolicy", fname, v.Type())
	}
	pin, _ := st.Attr("pin_memory")
	return tdist.CPUOffload{Enabled: true, PinMemory: pin == starlark.True}, nil
}

// fsdpState is what fully_shard keeps on a module (FSDPState).
type fsdpState struct {
	group *tdist.FSDPGroup // nil when the module manages no parameter
	comm  *tdist.FSDPComm  // set by the root's lazy init
	root  bool
	cast  tensor.DType // cast_forward_inputs' param_dtype (Undefined: none)
	ctx   *tensor.Context
}

func policyDType(fname, param string, v starlark.Value) (tensor.DType, error) {
	if v == nil || v == starlark.None {
		return tensor.Undefined, nil
	}
	s, ok := starlark.AsString(v)
	if !ok {
		s = v.String()
	}
	d, ok := tensor.ParseDType(strings.TrimPrefix(s, "torch."))
	if !ok {
		return tensor.Undefined, fmt.Errorf("%s: %s: unknown dtype %s", fname, param, v)
	}
	return d, nil
}

func mixedPrecisionPolicy(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	var pd, rd, od starlark.Value = starlark.None, starlark.None, starlark.None
	cast := true
	if err := starlark.UnpackArgs(b.Name(), args, kwargs, "param_dtype?", &pd, "reduce_dtype?", &rd, "output_dtype?", &od, "cast_forward_inputs?", &cast); err != nil {
		return nil, err
	}
	for _, x := range []struct {
		n string
		v starlark.Value
	}{{"param_dtype", pd}, {"reduce_dtype", rd}, {"output_dtype", od}} {
		if _, err := policyDType(b.Name(), x.n, x.v); err != nil {
			return nil, err
		}
	}
	return starlarkstruct.FromStringDict(starlark.String("MixedPrecisionPolicy"), starlark.StringDict{
		"param_dtype": pd, "reduce_dtype": rd, "output_dtype": od, "cast_forward_inputs": starlark.Bool(cast),
	}), nil
}

func fullyShard(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	var mod *Layer
	raf := true
	var mpV, offload, mesh starlark.Value = starlark.None, starlark.None, starlark.None
	if err := starlark.UnpackArgs(b.Name(), args, kwargs, "module", &mod, "mesh?", &mesh, "reshard_after_forward?", &raf, "mp_policy?", &mpV, "offload_policy?", &offload); err != nil {
		return nil, err
	}
	off, err := offloadArg(b.Name(), offload)
	if err != nil {
		return nil, err
	}
	mp := tdist.NoMixedPrecision
	cast := tensor.Undefined
	if mpV != starlark.None {
		st, ok := mpV.(*starlarkstruct.Struct)
		if !ok || st.Constructor() != starlark.String("MixedPrecisionPolicy") {
			return nil, fmt.Errorf("%s: mp_policy: got %s, want dist.fsdp.MixedPrecisionPolicy", b.Name(), mpV.Type())
		}
		get := func(n string) starlark.Value { v, _ := st.Attr(n); return v }
		var err error
		if mp.ParamDType, err = policyDType(b.Name(), "param_dtype", get("param_dtype")); err != nil {
			return nil, err
		}
		if mp.ReduceDType, err = policyDType(b.Name(), "reduce_dtype", get("reduce_dtype")); err != nil {
			return nil, err
		}
		if get("output_dtype") != starlark.None {
			return nil, fmt.Errorf("%s: MixedPrecisionPolicy's output_dtype is not modelled", b.Name())
		}
		if get("cast_forward_inputs") == starlark.True {
			cast = mp.ParamDType
		}
	}
	g, e, err := dist.GroupOf(thread, b, "mesh", mesh)
	if err != nil {
		return nil, err
	}
	if mod.fsdp != nil {
		return nil, fmt.Errorf("%s: fully_shard has already been applied to this %s", b.Name(), mod.typ)
	}
	params, sets, err := managedParams(mod)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", b.Name(), err)
	}
	st := &fsdpState{cast: cast, ctx: startensor.Context(e)}
	if len(params) > 0 {
		// fully_shard's list of the original parameters holds them until
		// it returns; then they are freed together (if nothing else holds
		// them)
		ctx := params[0].Context()
		release := ctx.Hold(params...)
		st.group, err = g.NewFSDPGroup(params, sets, mp, raf, off)
		release()
		if err != nil {
			for i, p := range params { // the module as it was
				_ = sets[i](p)
			}
			return nil, fmt.Errorf("%s: %w", b.Name(), err)
		}
		tensor.Dropped(params...)
	}
	mod.fsdp = st
	return mod, nil
}

// managedParams lists the parameters fully_shard(m) manages — m's and its
// submodules', not those under a module already sharded — in the order
// FSDP2 collects them (post-order over the modules, each module's own
// parameters), each once, with the function that puts a parameter on
// every module holding it.
func managedParams(m *Layer) (params []*tensor.Tensor, sets []func(*tensor.Tensor) error, err error) {
	type holder struct {
		mod  *Layer
		name string
	}
	holders := map[*tensor.Tensor][]holder{}
	seen := map[*Layer]bool{}
	var walk func(x *Layer)
	walk = func(x *Layer) {
		if seen[x] {
			return
		}
		seen[x] = true
		for i, n := range x.names {
			if c, ok := x.vals[i].(*Layer); ok && x.kinds[n] == kindModule && c.fsdp == nil {
				walk(c)
			}
		}
		for i, n := range x.names {
			if x.kinds[n] != kindParam {
				continue
			}
			t, ok := x.vals[i].(*startensor.Tensor)
			if !ok {
				continue
			}
			p := t.Engine()
			if _, ok := holders[p]; !ok {
				params = append(params, p)
			}
			holders[p] = append(holders[p], holder{x, n})
		}
	}
	walk(m)
	for _, p := range params {
		if !strings.HasPrefix(p.Device(), "cuda") {
			return nil, nil, fmt.Errorf("module's parameters must be on a CUDA device (found one on %s)", p.Device())
		}
		hs := holders[p]
		ctx := p.Context() // not p: the closure must not keep the original
		var marks []*backend.Mark
		for _, h := range hs {
			marks = append(marks, &h.mod.mark)
		}
		sets = append(sets, func(t *tensor.Tensor) error {
			v := startensor.Wrap(t)
			for _, h := range hs {
				h.mod.set(h.name, v, kindParam)
			}
			tensor.NoteHeld(ctx, marks...)
			return nil
		})
	}
	return params, sets, nil
}

// fsdpCall runs m's forward under FSDP2's hooks (FSDPState._pre_forward
// and _post_forward): the root's lazy init, the unshard, the
// post-backward hook on the inputs, the forward, the reshard, the
// pre-backward hook on the outputs, and the root's post-forward.
func (m *Layer) fsdpCall(thread *starlark.Thread, args starlark.Tuple, kwargs []starlark.Tuple, run func(starlark.Tuple) (starlark.Value, error)) (starlark.Value, error) {
	st := m.fsdp
	fg := st.group
	if st.comm == nil {
		if err := m.fsdpLazyInit(); err != nil {
			return nil, err
		}
	}
	if fg != nil && fg.InBackward() {
		// activation checkpointing's recomputation: the pre-backward
		// unsharded the parameters
		return run(args)
	}
	thread.DeclareTransparent()
	if st.cast != tensor.Undefined {
		var err error
		if args, err = castInputs(args, st.cast); err != nil {
			return nil, err
		}
	}
	if fg != nil {
		if err := fg.PreForward(); err != nil {
			return nil, err
		}
		if autograd.GradEnabled(st.ctx) {
			for _, a := range args {
				if t, ok := a.(*startensor.Tensor); ok && autograd.GradFn(t.Engine()) != nil {
					if _, err := autograd.RegisterPreHook(t.Engine(), fg.PostBackward, fg, true); err != nil {
						return nil, err
					}
				}
			}
		}
	}
	out, err := run(args)
	if err != nil {
		return nil, err
	}
	if fg != nil {
		if err := fg.PostForward(); err != nil {
			return nil, err
		}
	}
	comm, ctx := st.comm, st.ctx
	if autograd.GradEnabled(ctx) {
		pre := func() error {
			if err := comm.QueueFinalCallback(ctx); err != nil {
				return err
			}
			if fg != nil {
				return fg.PreBackward()
			}
			return nil
		}
		for _, t := range outputTensors(out) {
			if autograd.GradFn(t) != nil {
				if _, err := autograd.RegisterPreHook(t, pre, comm, false); err != nil {
					return nil, err
				}
			}
		}
	}
	if st.root {
		comm.RootPostForward(ctx)
	}
	return out, nil
}

// fsdpLazyInit is the root's FSDPState._lazy_init: m is the root; the
// sharded modules below it share its comm context (root first, then in
// named_modules order), and the root keeps its parameters unsharded
// after the forward. With CPU offload every shard must be on the CPU.
func (m *Layer) fsdpLazyInit() error {
	_, mods := m.modulesPreorder("")
	for _, x := range mods {
		if x.fsdp != nil && x.fsdp.comm == nil && x.fsdp.group != nil {
			if err := x.fsdp.group.CheckOffload(); err != nil {
				return fmt.Errorf("fully_shard: %w", err)
			}
		}
	}
	comm := tdist.NewFSDPComm()
	for _, x := range mods {
		if x.fsdp == nil || x.fsdp.comm != nil {
			continue
		}
		x.fsdp.comm = comm
		if g := x.fsdp.group; g != nil {
			g.Comm = comm
			comm.Groups = append(comm.Groups, g)
		}
	}
	m.fsdp.root = true
	if g := m.fsdp.group; g != nil {
		g.ReshardAfterForward = false
	}
	if len(comm.Groups) > 0 { // on the device a group computes on
		comm.LazyInit(m.fsdp.ctx, comm.Groups[0].Device())
	}
	return nil
}

// castInputs casts the floating-point tensor arguments to dt
// (cast_forward_inputs).
func castInputs(args starlark.Tuple, dt tensor.DType) (starlark.Tuple, error) {
	out := append(starlark.Tuple(nil), args...) // the caller's tuple stays
	for i, a := range args {
		t, ok := a.(*startensor.Tensor)
		if !ok || !t.Engine().DType().IsFloat() || t.Engine().DType() == dt {
			continue
		}
		c, err := autograd.To(t.Engine(), "", dt, false)
		if err != nil {
			return nil, err
		}
		out[i] = startensor.Wrap(c)
	}
	return out, nil
}

// outputTensors lists the tensors of a forward's result (a tensor, or a
// tuple or list of values, searched one level deep).
func outputTensors(v starlark.Value) []*tensor.Tensor {
	var out []*tensor.Tensor
	add := func(x starlark.Value) {
		if t, ok := x.(*startensor.Tensor); ok {
			out = append(out, t.Engine())
		}
	}
	switch v := v.(type) {
	case starlark.Tuple:
		for _, x := range v {
			add(x)
		}
	case *starlark.List:
		for i := range v.Len() {
			add(v.Index(i))
		}
	default:
		add(v)
	}
	return out
}
