package nn

import (
	"fmt"

	"go.starlark.net/starlark"
	"go.starlark.net/starlarkstruct"

	"github.com/memsh/memsh/env"
	"github.com/memsh/memsh/starlib/dist"
	startensor "github.com/memsh/memsh/starlib/tensor"
	"github.com/memsh/memsh/tensor"
	"github.com/memsh/memsh/tensor/autograd"
	tdist "github.com/memsh/memsh/tensor/dist"
)

// DeepSpeed is dist.deepspeed: DeepSpeed's ZeRO stages 1 and 2 for one
// rank of the Session's process group (the engine: tensor/dist's ZeRO):
//
//	initialize(model, config)   the engine: engine(x) runs the model,
//	                            engine.backward(loss), engine.step(),
//	                            engine.zero_grad(), engine.module
//
// config is DeepSpeed's dict: {"zero_optimization": {"stage": 1 or 2,
// "reduce_bucket_size": 5e8}, "bf16": {"enabled": true}} (fp32 without
// "bf16"); the optimizer is DeepSpeed's FusedAdam ("optimizer":
// {"type": "AdamW"} or "Adam", the default here). DeepSpeed returns
// (engine, optimizer, dataloader, lr_scheduler); memsh the engine.
// Refused: stage 0 and 3, fp16 (its loss scaling skips steps on
// overflow), offload, overlap_comm.
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
	for _, kv := range z.Items() {
		k, _ := starlark.AsString(kv[0])
		switch k {
		case "stage":
			s, ok := starlark.AsInt32(kv[1])
			if ok != nil || s < 1 || s > 2 {
				return cfg, fmt.Errorf("%s: zero_optimization.stage %s: memsh models stages 1 and 2", fname, kv[1])
			}
			cfg.Stage = s
		case "reduce_bucket_size":
			f, ok := starlark.AsFloat(kv[1])
			if !ok || f < 1 {
				return cfg, fmt.Errorf("%s: zero_optimization.reduce_bucket_size: want a positive number of elements, got %s", fname, kv[1])
			}
			cfg.ReduceBucketSize = int(f)
		case "contiguous_gradients", "reduce_scatter", "allgather_bucket_size", "allgather_partitions":
			// the defaults' memory; allgather_bucket_size is unused with
			// all_gather_into_tensor
		case "overlap_comm":
			if kv[1] == starlark.True {
				return cfg, fmt.Errorf("%s: zero_optimization.overlap_comm: not modelled", fname)
			}
		default:
			return cfg, fmt.Errorf("%s: zero_optimization.%s: not modelled", fname, k)
		}
	}
	if cfg.Stage == 0 {
		return cfg, fmt.Errorf("%s: zero_optimization.stage: give 1 or 2", fname)
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
	e, err := env.Of(thread, b.Name())
	if err != nil {
		return nil, err
	}
	g := dist.Group(e)
	if g == nil {
		return nil, fmt.Errorf("%s: Default process group has not been initialized, please make sure to call init_process_group.", b.Name())
	}
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
	m := newModule("DeepSpeedEngine")
	m.child("module", mod)
	m.zero = z
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
