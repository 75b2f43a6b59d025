// Package optim is the Starlark binding of memsh's optimizers
// (tensor/optim): PyTorch's torch.optim, and the optimizers of Hugging
// Face transformers and bitsandbytes that people pick to save memory, in
// sub-modules named after their library. Module lists the members.
//
// params is an iterable of tensors (model.parameters()). foreach=None
// means the multi-tensor implementation when every parameter is on a CUDA
// device and the per-parameter loop otherwise, as PyTorch 2.x's default
// (Adafactor's None is its loop), foreach=False the per-parameter loop;
// they differ in their temporaries. An optimizer has step(),
// zero_grad(set_to_none=True), state (a dict from parameter to its state:
// tensors on the parameter's device, "step", a host number — a 0-dim
// device tensor with fused=True — and a paged optimizer's paged buffers
// as structs), param_groups and paged_bytes() (the state in bitsandbytes'
// paged memory, outside the caching allocator; 0 for the others).
package optim

import (
	"fmt"
	"strings"

	"go.starlark.net/starlark"
	"go.starlark.net/starlarkstruct"

	startensor "github.com/memsh/memsh/starlib/tensor"
	"github.com/memsh/memsh/tensor"
	"github.com/memsh/memsh/tensor/optim"
)

// Module is the optim module:
//
//	SGD(params, lr, momentum=0, dampening=0, weight_decay=0, nesterov=False, foreach=None)
//	    (momentum=0: no state, and a step that allocates nothing but weight decay's temporaries)
//	Adam(params, lr=0.001, betas=(0.9, 0.999), eps=1e-08, weight_decay=0, amsgrad=False, foreach=None, fused=None)
//	AdamW(params, lr=0.001, betas=(0.9, 0.999), eps=1e-08, weight_decay=0.01, amsgrad=False, foreach=None, fused=None)
//	    (fused=True: PyTorch 2.x's fused kernel, "step" a 0-dim float32 on the device, no temporaries)
//	Adafactor(params, lr=0.01, beta2_decay=-0.8, eps=(None, 0.001), d=1.0, weight_decay=0.0, foreach=None, maximize=False)
//	    (torch.optim.Adafactor, PyTorch 2.5+; adafactor.go)
//	GradScaler(device="cuda", init_scale=65536.0, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000, enabled=True)
//	    (grad_scaler.go)
//	transformers.Adafactor(params, lr=None, eps=(1e-30, 0.001), clip_threshold=1.0, decay_rate=-0.8, beta1=None,
//	    weight_decay=0.0, scale_parameter=True, relative_step=True, warmup_init=False)
//	    (transformers.optimization.Adafactor; adafactor.go)
//	bnb.Adam8bit(params, lr=0.001, betas=(0.9, 0.999), eps=1e-08, weight_decay=0, amsgrad=False, optim_bits=32,
//	    args=None, min_8bit_size=4096, is_paged=False)
//	bnb.AdamW8bit(... weight_decay=0.01 ...)  bnb.PagedAdam8bit(...)  bnb.PagedAdamW8bit(...)
//	    (bitsandbytes 0.46+; bnb.go)
var Module = &starlarkstruct.Module{
	Name: "optim",
	Members: starlark.StringDict{
		"SGD":   starlark.NewBuiltin("optim.SGD", newSGD),
		"Adam":  starlark.NewBuiltin("optim.Adam", newAdam(false)),
		"AdamW": starlark.NewBuiltin("optim.AdamW", newAdam(true)),
	},
}

// Optimizer is the Starlark value of an optimizer.
type Optimizer struct {
	o      optim.Optimizer
	params []*startensor.Tensor
	group  starlark.StringDict // the hyper-parameters, for param_groups
}

var (
	_ starlark.HasAttrs = (*Optimizer)(nil)
)

// StepHookKey is the thread-local key of a StepHook, which every
// optimizer's step() calls before it updates (nn.track registers the
// optimizer's state with it, as MemTracker's optimizer step pre-hook), and
// whose returned function it calls when the update is done.
const StepHookKey = "memsh.optim.step_hook"

// StepHook is the function StepHookKey holds.
type StepHook func(optim.Optimizer) (done func())

// Engine returns the engine optimizer.
func (o *Optimizer) Engine() optim.Optimizer { return o.o }

func (o *Optimizer) String() string        { return o.o.Name() + "(...)" }
func (o *Optimizer) Type() string          { return "optim." + o.o.Name() }
func (o *Optimizer) Freeze()               {}
func (o *Optimizer) Truth() starlark.Bool  { return true }
func (o *Optimizer) Hash() (uint32, error) { return 0, fmt.Errorf("unhashable: %s", o.Type()) }

func (o *Optimizer) AttrNames() []string {
	return []string{"paged_bytes", "param_groups", "state", "step", "zero_grad"}
}

// pagedMemory is an engine optimizer whose state is partly in paged
// (managed) memory, outside the caching allocator (bitsandbytes' paged
// optimizers).
type pagedMemory interface{ PagedBytes() uint64 }

func (o *Optimizer) Attr(name string) (starlark.Value, error) {
	switch name {
	case "step":
		return starlark.NewBuiltin(o.o.Name()+".step", func(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
			if err := starlark.UnpackArgs(b.Name(), args, kwargs); err != nil {
				return nil, err
			}
			if h, ok := thread.Local(StepHookKey).(StepHook); ok {
				defer h(o.o)()
			}
			if err := o.o.Step(); err != nil {
				return nil, fmt.Errorf("%s: %w", b.Name(), err)
			}
			return starlark.None, nil
			// pure: the step changes what no Starlark value refers to
			// but the optimizer's state, which the engine optimizer
			// notes itself (its Reach's mark): the reclaim keeps the
			// frames below while it runs
		}).DeclarePure().BindReceiver(o), nil // the receiver, for the reclaim's reach walk
	case "zero_grad":
		return starlark.NewBuiltin(o.o.Name()+".zero_grad", func(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
			setToNone := true
			if err := starlark.UnpackArgs(b.Name(), args, kwargs, "set_to_none?", &setToNone); err != nil {
				return nil, err
			}
			return starlark.None, optim.ZeroGrad(o.o.Params(), setToNone)
		}).BindReceiver(o), nil
	case "paged_bytes":
		return starlark.NewBuiltin(o.o.Name()+".paged_bytes", func(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
			if err := starlark.UnpackArgs(b.Name(), args, kwargs); err != nil {
				return nil, err
			}
			if pm, ok := o.o.(pagedMemory); ok {
				return starlark.MakeUint64(pm.PagedBytes()), nil
			}
			return starlark.MakeInt(0), nil
		}).BindReceiver(o), nil
	case "state":
		d := starlark.NewDict(len(o.params))
		for _, p := range o.params {
			st := o.o.State(p.Engine())
			if st == nil {
				continue
			}
			sd := starlark.NewDict(len(st))
			for k, v := range st {
				var sv starlark.Value
				switch v := v.(type) {
				case *tensor.Tensor:
					sv = startensor.Wrap(v)
				case float64:
					sv = starlark.Float(v)
				case *optim.PagedBuffer:
					sv = pagedValue(v)
				default:
					continue
				}
				_ = sd.SetKey(starlark.String(k), sv)
			}
			_ = d.SetKey(identity{p}, sd)
		}
		return d, nil
	case "param_groups":
		g := starlark.NewDict(len(o.group) + 1)
		ps := make([]starlark.Value, len(o.params))
		for i, p := range o.params {
			ps[i] = p
		}
		_ = g.SetKey(starlark.String("params"), starlark.NewList(ps))
		for k, v := range o.group {
			_ = g.SetKey(starlark.String(k), v)
		}
		return starlark.NewList([]starlark.Value{g}), nil
	}
	return nil, nil
}

// References lets reports and leak paths see the optimizer's state
// (".state[i].exp_avg").
func (o *Optimizer) References(edge func(suffix string, v starlark.Value)) {
	for i, p := range o.params {
		for k, v := range o.o.State(p.Engine()) {
			if t, ok := v.(*tensor.Tensor); ok {
				edge(fmt.Sprintf(".state[%d].%s", i, k), startensor.Wrap(t))
			}
		}
	}
}

// identity is a hashable key for a tensor in the state dict (tensors are
// unhashable in Starlark; PyTorch keys state by the parameter object).
type identity struct{ *startensor.Tensor }

func (k identity) Hash() (uint32, error) {
	p := k.Tensor.Engine().DataPtr()
	return uint32(p ^ p>>32), nil
}

// paramsArg reads an iterable of tensors.
func paramsArg(fname string, v starlark.Value) ([]*startensor.Tensor, []*tensor.Tensor, error) {
	it, ok := v.(starlark.Iterable)
	if !ok {
		return nil, nil, fmt.Errorf("%s: params argument given to the optimizer should be an iterable of Tensors or dicts, but got %s", fname, v.Type())
	}
	iter := it.Iterate()
	defer iter.Done()
	var vals []*startensor.Tensor
	var ts []*tensor.Tensor
	var x starlark.Value
	for iter.Next(&x) {
		t, ok := x.(*startensor.Tensor)
		if !ok {
			return nil, nil, fmt.Errorf("%s: optimizer can only optimize Tensors, but one of the params is %s", fname, x.Type())
		}
		vals = append(vals, t)
		ts = append(ts, t.Engine())
	}
	return vals, ts, nil
}

// foreachArg: a bool, or None: PyTorch 2.x's default
// (_default_to_fused_or_foreach), foreach when every parameter is on a
// CUDA device, the per-parameter loop otherwise (CPU parameters: FSDP2's
// CPU offload).
func foreachArg(fname string, v starlark.Value, ps []*tensor.Tensor) (bool, error) {
	switch v := v.(type) {
	case starlark.NoneType:
		for _, p := range ps {
			if !strings.HasPrefix(p.Device(), "cuda") {
				return false, nil
			}
		}
		return true, nil
	case starlark.Bool:
		return bool(v), nil
	}
	return false, fmt.Errorf("%s: for parameter foreach: got %s, want bool or None", fname, v.Type())
}

// number is a float parameter that also takes an int, as Python's.
type number float64

func (n *number) Unpack(v starlark.Value) error {
	f, ok := starlark.AsFloat(v)
	if !ok {
		return fmt.Errorf("got %s, want a number", v.Type())
	}
	*n = number(f)
	return nil
}

func newSGD(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	var paramsV starlark.Value
	var lrN, momN, dampN, wdN number
	var nesterov bool
	var foreachV starlark.Value = starlark.None
	if err := starlark.UnpackArgs(b.Name(), args, kwargs, "params", &paramsV, "lr", &lrN, "momentum?", &momN, "dampening?", &dampN,
		"weight_decay?", &wdN, "nesterov?", &nesterov, "foreach?", &foreachV, "maximize?", new(bool), "differentiable?", new(bool)); err != nil {
		return nil, err
	}
	lr, momentum, dampening, wd := float64(lrN), float64(momN), float64(dampN), float64(wdN)
	vals, ps, err := paramsArg(b.Name(), paramsV)
	if err != nil {
		return nil, err
	}
	foreach, err := foreachArg(b.Name(), foreachV, ps)
	if err != nil {
		return nil, err
	}
	o, err := optim.NewSGD(ps, lr, momentum, dampening, wd, nesterov, foreach)
	if err != nil {
		return nil, err
	}
	return &Optimizer{o: o, params: vals, group: starlark.StringDict{
		"lr": starlark.Float(lr), "momentum": starlark.Float(momentum), "dampening": starlark.Float(dampening),
		"weight_decay": starlark.Float(wd), "nesterov": starlark.Bool(nesterov), "foreach": foreachV,
	}}, nil
}

func newAdam(decoupled bool) func(*starlark.Thread, *starlark.Builtin, starlark.Tuple, []starlark.Tuple) (starlark.Value, error) {
	return func(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
		var paramsV starlark.Value
		lrN, epsN, wdN := number(0.001), number(1e-8), number(0.0)
		if decoupled {
			wdN = 0.01
		}
		var betas starlark.Tuple = starlark.Tuple{starlark.Float(0.9), starlark.Float(0.999)}
		var amsgrad, differentiable bool
		var foreachV, fusedV starlark.Value = starlark.None, starlark.None
		if err := starlark.UnpackArgs(b.Name(), args, kwargs, "params", &paramsV, "lr?", &lrN, "betas?", &betas, "eps?", &epsN,
			"weight_decay?", &wdN, "amsgrad?", &amsgrad, "foreach?", &foreachV, "maximize?", new(bool), "capturable?", new(bool),
			"differentiable?", &differentiable, "fused?", &fusedV); err != nil {
			return nil, err
		}
		fused := false
		switch v := fusedV.(type) {
		case starlark.NoneType:
		case starlark.Bool:
			fused = bool(v)
		default:
			return nil, fmt.Errorf("%s: for parameter fused: got %s, want bool or None", b.Name(), fusedV.Type())
		}
		if fused && foreachV == starlark.True {
			return nil, fmt.Errorf("%s: `fused` and `foreach` cannot be `True` together.", b.Name())
		}
		lr, eps, wd := float64(lrN), float64(epsN), float64(wdN)
		if len(betas) != 2 {
			return nil, fmt.Errorf("%s: betas: want a pair, got %d values", b.Name(), len(betas))
		}
		b1, ok1 := starlark.AsFloat(betas[0])
		b2, ok2 := starlark.AsFloat(betas[1])
		if !ok1 || !ok2 {
			return nil, fmt.Errorf("%s: betas: want two numbers", b.Name())
		}
		vals, ps, err := paramsArg(b.Name(), paramsV)
		if err != nil {
			return nil, err
		}
		foreach, err := foreachArg(b.Name(), foreachV, ps)
		if err != nil {
			return nil, err
		}
		o, err := optim.NewAdam(ps, lr, b1, b2, eps, wd, amsgrad, decoupled, foreach)
		if err != nil {
			return nil, err
		}
		if fused {
			if err := o.SetFused(differentiable); err != nil {
				return nil, err
			}
		}
		return &Optimizer{o: o, params: vals, group: starlark.StringDict{
			"lr": starlark.Float(lr), "betas": betas, "eps": starlark.Float(eps), "weight_decay": starlark.Float(wd),
			"amsgrad": starlark.Bool(amsgrad), "foreach": foreachV, "fused": fusedV,
		}}, nil
	}
}
