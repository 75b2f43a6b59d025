package nn

import (
	"fmt"

	"go.starlark.net/starlark"
	"go.starlark.net/starlarkstruct"

	"github.com/memsh/memsh/starlib/dist"
	startensor "github.com/memsh/memsh/starlib/tensor"
	"github.com/memsh/memsh/tensor"
	"github.com/memsh/memsh/tensor/autograd"
	tdist "github.com/memsh/memsh/tensor/dist"
)

// DeepSpeed is dist.deepspeed: DeepSpeed's ZeRO stages 1, 2 and 3 for
// one rank of the Session's process group (the engines: tensor/dist's
// ZeRO and ZeRO3):
//
//	initialize(model, config)   the engine: engine(x) runs the model,
//	                            engine.backward(loss), engine.step(),
//	                            engine.zero_grad(), engine.module
//
// config is DeepSpeed's dict: {"zero_optimization": {"stage": 1, 2 or
// 3, "reduce_bucket_size": 5e8, stage 3's "stage3_prefetch_bucket_size":
// 5e7, "stage3_max_live_parameters": 1e9, "stage3_max_reuse_distance":
// 1e9, "stage3_param_persistence_threshold": 1e5, "sub_group_size":
// 1e9}, "bf16": {"enabled": true}} (fp32 without "bf16"); the optimizer
// is DeepSpeed's FusedAdam ("optimizer": {"type": "AdamW"} or "Adam",
// the default here). Stage 3 partitions the model's parameters at
// initialize (a model built on the meta device is built as zero.Init
// builds it) and gathers each module's around its forward and backward;
// every nn.Linear then runs DeepSpeed's LinearFunctionForZeroStage3.
// DeepSpeed returns (engine, optimizer, dataloader, lr_scheduler);
// memsh the engine. Refused: stage 0, fp16 (its loss scaling skips
// steps on overflow), offload, overlap_comm for stages 1 and 2 (stage
// 3's, its default, runs on the current stream).
//
// zeroOptimizer is an engine's optimizer: stages 1 and 2 (tdist.ZeRO)
// or 3 (tdist.ZeRO3).
type zeroOptimizer interface {
	Step() error
	Reach(r *tensor.Reacher)
	CommTensors(fn func(*tensor.Tensor))
	StateTensors(fn func(*tensor.Tensor))
}

var DeepSpeed = &starlarkstruct.Module{Name: "dist.deepspeed", Members: starlark.StringDict{
	"initialize": starlark.NewBuiltin("dist.deepspeed.initialize", dsInitialize),
}}

// dsConfig reads the keys of a DeepSpeed config memsh models.
func dsConfig(fname string, d *starlark.Dict) (tdist.ZeROConfig, error) {
	cfg := tdist.ZeROConfig{DType: tensor.Float32}
	sub := func(key string) (*starlark.Dict, error) {
		v, ok, _ := d.Get(starlark.String(key))
		if !ok || v == starlark.None {
			return nil, nil
		}
		s, ok := v.(*starlark.Dict)
		if !ok {
			return nil, fmt.Errorf("%s: config[%q]: got %s, want dict", fname, key, v.Type())
		}
		return s, nil
	}
	enabled := func(key string) (bool, error) {
		s, err := sub(key)
		if s == nil || err != nil {
			return false, err
		}
		v, _, _ := s.Get(starlark.String("enabled"))
		return v == starlark.True, nil
	}
	if on, err := enabled("fp16"); err != nil || on {
		if err != nil {
			return cfg, err
		}
		return cfg, fmt.Errorf("%s: fp16: DeepSpeed's dynamic loss scaling (steps skipped on overflow) is not modelled; use bf16", fname)
	}
	if on, err := enabled("bf16"); err != nil {
		return cfg, err
	} else if on {
		cfg.DType = tensor.BFloat16
	}
	z, err := sub("zero_optimization")
	if err != nil {
		return cfg, err
	}
	if z == nil {
		return cfg, fmt.Errorf("%s: config has no zero_optimization (stage 0 is data parallelism: nn.parallel.DistributedDataParallel)", fname)
	}
	var overlap starlark.Value = starlark.None
	for _, kv := range z.Items() {
		k, _ := starlark.AsString(kv[0])
		switch k {
		case "stage":
			s, ok := starlark.AsInt32(kv[1])
			if ok != nil || s < 1 || s > 3 {
				return cfg, fmt.Errorf("%s: zero_optimization.stage %s: memsh models stages 1, 2 and 3", fname, kv[1])
			}
			cfg.Stage = s
		case "reduce_bucket_size", "stage3_prefetch_bucket_size", "stage3_max_live_parameters", "stage3_max_reuse_distance",
			"stage3_param_persistence_threshold", "sub_group_size":
			f, ok := starlark.AsFloat(kv[1])
			if !ok || f < 1 {
				return cfg, fmt.Errorf("%s: zero_optimization.%s: want a positive number of elements, got %s", fname, k, kv[1])
			}
			*map[string]*int{"reduce_bucket_size": &cfg.ReduceBucketSize, "stage3_prefetch_bucket_size": &cfg.PrefetchBucketSize,
				"stage3_max_live_parameters": &cfg.MaxLiveParameters, "stage3_max_reuse_distance": &cfg.MaxReuseDistance,
				"stage3_param_persistence_threshold": &cfg.ParamPersistenceThreshold, "sub_group_size": &cfg.SubGroupSize}[k] = int(f)
		case "contiguous_gradients", "reduce_scatter", "allgather_bucket_size", "allgather_partitions":
			// the defaults' memory; allgather_bucket_size is unused with
			// all_gather_into_tensor
		case "overlap_comm":
			overlap = kv[1]
		default:
			return cfg, fmt.Errorf("%s: zero_optimization.%s: not modelled", fname, k)
		}
	}
	if cfg.Stage == 0 {
		return cfg, fmt.Errorf("%s: zero_optimization.stage: give 1, 2 or 3", fname)
	}
	if overlap == starlark.True && cfg.Stage < 3 {
		return cfg, fmt.Errorf("%s: zero_optimization.overlap_comm: not modelled for stages 1 and 2", fname)
	}
	if cfg.Stage < 3 {
		for k, v := range map[string]int{"stage3_prefetch_bucket_size": cfg.PrefetchBucketSize, "stage3_max_live_parameters": cfg.MaxLiveParameters,
			"stage3_max_reuse_distance": cfg.MaxReuseDistance, "stage3_param_persistence_threshold": cfg.ParamPersistenceThreshold, "sub_group_size": cfg.SubGroupSize} {
			if v != 0 {
				return cfg, fmt.Errorf("%s: zero_optimization.%s: a stage 3 setting", fname, k)
			}
		}
	}
	if o, err := sub("optimizer"); err != nil {
		return cfg, err
	} else if o != nil {
		t, _, _ := o.Get(starlark.String("type"))
		if s, _ := starlark.AsString(t); s != "Adam" && s != "AdamW" {
			return cfg, fmt.Errorf("%s: optimizer.type %s: memsh models DeepSpeed's FusedAdam (Adam, AdamW)", fname, t)
		}
	}
	return cfg, nil
}

func dsInitialize(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	var mod *Layer
	var config *starlark.Dict
	if err := starlark.UnpackArgs(b.Name(), args, kwargs, "model", &mod, "config", &config); err != nil {
		return nil, err
	}
	cfg, err := dsConfig(b.Name(), config)
	if err != nil {
		return nil, err
	}
	g, _, err := dist.GroupOf(thread, b, "", nil)
	if err != nil {
		return nil, err
	}
	m := newModule("DeepSpeedEngine")
	if cfg.Stage == 3 {
		// under zero.Init (a model built on the meta device here) the
		// buffers are made on the device
		_, mods := mod.modulesPreorder("")
		for _, x := range mods {
			for i, n := range x.names {
				if x.kinds[n] != kindBuffer {
					continue
				}
				if t, ok := x.vals[i].(*startensor.Tensor); ok && tensor.Deferred(t.Engine()) {
					if err := tensor.Materialize(t.Engine()); err != nil {
						return nil, fmt.Errorf("%s: %w", b.Name(), err)
					}
				}
			}
		}
		z, err := g.NewZeRO3(mod.Parameters(), tdist.ZeRO3Config{DType: cfg.DType, ReduceBucketSize: cfg.ReduceBucketSize,
			PrefetchBucketSize: cfg.PrefetchBucketSize, MaxLiveParameters: cfg.MaxLiveParameters, MaxReuseDistance: cfg.MaxReuseDistance,
			ParamPersistenceThreshold: cfg.ParamPersistenceThreshold, SubGroupSize: cfg.SubGroupSize})
		if err != nil {
			return nil, fmt.Errorf("%s: %w", b.Name(), err)
		}
		installZ3(mod, z)
		m.zero = z
	} else {
		var params []*tensor.Tensor
		for _, p := range mod.Parameters() {
			if autograd.RequiresGrad(p) {
				params = append(params, p)
			}
		}
		z, err := g.NewZeRO(params, cfg)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", b.Name(), err)
		}
		m.zero = z
	}
	m.child("module", mod)
	m.training = mod.training
	m.forward = func(thread *starlark.Thread, m *Layer, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
		thread.DeclareTransparent()
		return starlark.Call(thread, m.entry("module"), args, kwargs)
	}
	return m, nil
}

// dsBackward is engine.backward(loss): loss / gradient_accumulation_steps
// (returned) and its product with the loss scale (1.0), then the
// backward.
func dsBackward(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	var loss *startensor.Tensor
	if err := starlark.UnpackArgs(b.Name(), args, kwargs, "loss", &loss); err != nil {
		return nil, err
	}
	l := loss.Engine()
	div, err := autograd.Binary(tensor.OpDiv, l, tensor.Float(1))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", b.Name(), err)
	}
	scaled, err := autograd.Binary(tensor.OpMul, div, tensor.Float(1))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", b.Name(), err)
	}
	c := l.Context()
	release := c.Hold(div, scaled)
	// the engine reports what it holds (as tensor.backward does); div
	// and scaled are held
	thread.DeclareReported()
	err = autograd.Backward([]*tensor.Tensor{scaled}, nil, false)
	release()
	tensor.Dropped(scaled)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", b.Name(), err)
	}
	return startensor.Wrap(div), nil
}

func dsStep(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	if err := starlark.UnpackArgs(b.Name(), args, kwargs); err != nil {
		return nil, err
	}
	if err := b.Receiver().(*Layer).zero.Step(); err != nil {
		return nil, fmt.Errorf("%s: %w", b.Name(), err)
	}
	return starlark.None, nil
}

// z3Hook is what a ZeRO-3 engine keeps on each module of its model.
type z3Hook struct {
	z    *tdist.ZeRO3
	mod  *tdist.ZeRO3Module
	root bool
	ctx  *tensor.Context
}

// installZ3 registers every module of root with z (DeepSpeedZeRoOffload's
// setup_zero_stage3_hooks): each module's own parameters; the root resets
// the trace at its forward.
func installZ3(root *Layer, z *tdist.ZeRO3) {
	var ctx *tensor.Context
	if ps := root.Parameters(); len(ps) > 0 {
		ctx = ps[0].Context()
	}
	_, mods := root.modulesPreorder("")
	for _, x := range mods {
		var own []*tensor.Tensor
		for i, n := range x.names {
			if x.kinds[n] != kindParam {
				continue
			}
			if t, ok := x.vals[i].(*startensor.Tensor); ok {
				own = append(own, t.Engine())
			}
		}
		x.z3 = &z3Hook{z: z, mod: z.Module(own), root: x == root, ctx: ctx}
	}
}

// z3Call runs m's forward between the coordinator's hooks: the root's
// reset_step, the fetch of its parameters, the post-backward release on
// its inputs (once every input's gradient came), the release after the
// forward, the pre-backward fetch on its outputs.
func (m *Layer) z3Call(thread *starlark.Thread, args starlark.Tuple, run func(starlark.Tuple) (starlark.Value, error)) (starlark.Value, error) {
	h := m.z3
	z, mod := h.z, h.mod
	thread.DeclareTransparent()
	if h.root {
		z.ResetStep()
	}
	if err := z.Fetch(mod, false); err != nil {
		return nil, err
	}
	grad := h.ctx != nil && autograd.GradEnabled(h.ctx)
	if grad {
		var ins []*tensor.Tensor
		for _, a := range args {
			if t, ok := a.(*startensor.Tensor); ok && autograd.GradFn(t.Engine()) != nil {
				ins = append(ins, t.Engine())
			}
		}
		left := len(ins)
		for _, t := range ins {
			if _, err := autograd.RegisterPreHook(t, func() error {
				if left--; left == 0 {
					return z.Release(mod, true)
				}
				return nil
			}, z, true); err != nil {
				return nil, err
			}
		}
	}
	out, err := run(args)
	if err != nil {
		return nil, err
	}
	if err := z.Release(mod, false); err != nil {
		return nil, err
	}
	if grad {
		fired := false
		for _, t := range outputTensors(out) {
			if autograd.GradFn(t) == nil {
				continue
			}
			if _, err := autograd.RegisterPreHook(t, func() error {
				if fired {
					return nil
				}
				fired = true
				return z.Fetch(mod, true)
			}, z, false); err != nil {
				return nil, err
			}
		}
	}
	return out, nil
}
