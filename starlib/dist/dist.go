// Package dist is memsh's "dist" Starlark module: torch.distributed for one
// rank of an N-rank job (package tensor/dist): a process group whose
// collectives allocate what PyTorch's NCCL process group allocates on the
// caller's side and move no data (every rank holds the same values).
package dist

import (
	"fmt"

	"go.starlark.net/starlark"
	"go.starlark.net/starlarkstruct"

	"github.com/memsh/memsh/env"
	startensor "github.com/memsh/memsh/starlib/tensor"
	tdist "github.com/memsh/memsh/tensor/dist"
)

// Module is the "dist" Starlark module (torch.distributed's names):
//
//	init_process_group(world_size=None, rank=0, backend="nccl")
//	                           this Session is rank of a group of world_size
//	                           (None: one rank per GPU of the Session, as
//	                           torchrun --nproc-per-node on a machine with
//	                           --device sim:8xH100's eight GPUs; rank r
//	                           computes on cuda:0 as its process would)
//	is_initialized()           whether a group was initialised
//	get_world_size()           the group's size (1 without one)
//	get_rank()                 this rank (0 without a group)
//	destroy_process_group()    leave the group
//	all_reduce(tensor, op="sum")                      in place; sum: world_size × tensor
//	all_gather_into_tensor(output_tensor, input_tensor)  output: world_size × input's elements
//	reduce_scatter_tensor(output, input, op="sum")    input: world_size × output's elements
//	broadcast(tensor, src=0)                          every rank has src's values already
//	barrier()                                         returns at once
//	init_device_mesh(device_type, mesh_shape, mesh_dim_names=None)  a DeviceMesh over the job's ranks (mesh.go)
//
// Collectives need contiguous tensors and allocate nothing (NCCL's
// buffers are outside the caching allocator); they run on the current stream
// and complete at once (the allocator's streams: cuda.Stream).
// Errors name the function: "dist.all_gather_into_tensor: output tensor
// size must be equal to world_size times input tensor size ...".
var Module = &starlarkstruct.Module{
	Name: "dist",
	Members: starlark.StringDict{
		"init_process_group":     starlark.NewBuiltin("dist.init_process_group", initGroup),
		"is_initialized":         starlark.NewBuiltin("dist.is_initialized", isInitialized),
		"get_world_size":         starlark.NewBuiltin("dist.get_world_size", worldSize),
		"get_rank":               starlark.NewBuiltin("dist.get_rank", rank),
		"destroy_process_group":  starlark.NewBuiltin("dist.destroy_process_group", destroy),
		"all_reduce":             starlark.NewBuiltin("dist.all_reduce", allReduce),
		"all_gather_into_tensor": starlark.NewBuiltin("dist.all_gather_into_tensor", allGather),
		"reduce_scatter_tensor":  starlark.NewBuiltin("dist.reduce_scatter_tensor", reduceScatter),
		"broadcast":              starlark.NewBuiltin("dist.broadcast", broadcast),
		"barrier":                starlark.NewBuiltin("dist.barrier", barrier),
		"init_device_mesh":       starlark.NewBuiltin("dist.init_device_mesh", initDeviceMesh),
	},
}

// groupKey is the env.Values key of the Session's group.
const groupKey = "dist.group"

// Group returns the Session's process group, or nil.
func Group(e *env.Env) *tdist.Group {
	g, _ := e.Values[groupKey].(*tdist.Group)
	return g
}

// GroupOf returns the process group builtin b runs over, and the
// Session's env: mesh's (a 1-D DeviceMesh, given as b's parameter
// param) or, for None, the Session's default group — an error naming b
// when there is none, as torch.distributed's.
func GroupOf(thread *starlark.Thread, b *starlark.Builtin, param string, mesh starlark.Value) (*tdist.Group, *env.Env, error) {
	e, err := env.Of(thread, b.Name())
	if err != nil {
		return nil, nil, err
	}
	switch m := mesh.(type) {
	case *Mesh:
		g, err := m.Group(b.Name())
		return g, e, err
	case nil, starlark.NoneType:
	default:
		return nil, e, fmt.Errorf("%s: %s: got %s, want a 1-D DeviceMesh (dist.init_device_mesh; None: the whole process group)", b.Name(), param, mesh.Type())
	}
	g := Group(e)
	if g == nil {
		return nil, e, fmt.Errorf("%s: Default process group has not been initialized, please make sure to call init_process_group.", b.Name())
	}
	return g, e, nil
}

func initGroup(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	var r int
	var sizeV starlark.Value = starlark.None
	backend := "nccl"
	if err := starlark.UnpackArgs(b.Name(), args, kwargs, "world_size?", &sizeV, "rank?", &r, "backend?", &backend); err != nil {
		return nil, err
	}
	e, err := env.Of(thread, b.Name())
	if err != nil {
		return nil, err
	}
	size := 0
	if sizeV == starlark.None {
		if size = e.Manager.NumGPUs(); size == 0 {
			return nil, fmt.Errorf("%s: world_size: the Session has no GPU to give one rank each; give world_size", b.Name())
		}
	} else if err := starlark.AsInt(sizeV, &size); err != nil {
		return nil, fmt.Errorf("%s: for parameter world_size: got %s, want int or None", b.Name(), sizeV.Type())
	}
	if Group(e) != nil {
		return nil, fmt.Errorf("%s: trying to initialize the default process group twice!", b.Name())
	}
	switch backend {
	case "nccl", "fake", "gloo":
	default:
		return nil, fmt.Errorf("%s: for parameter backend: unknown backend %q (want \"nccl\", \"gloo\" or \"fake\")", b.Name(), backend)
	}
	g, err := tdist.New(size, r, backend)
	if err != nil {
		return nil, fmt.Errorf("%s: %v", b.Name(), err)
	}
	e.Values[groupKey] = g
	return starlark.None, nil
}

func isInitialized(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	e, err := env.NoArgs(thread, b, args, kwargs)
	if err != nil {
		return nil, err
	}
	return starlark.Bool(Group(e) != nil), nil
}

func worldSize(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	e, err := env.NoArgs(thread, b, args, kwargs)
	if err != nil {
		return nil, err
	}
	if g := Group(e); g != nil {
		return starlark.MakeInt(g.Size), nil
	}
	return starlark.MakeInt(1), nil
}

func rank(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	e, err := env.NoArgs(thread, b, args, kwargs)
	if err != nil {
		return nil, err
	}
	if g := Group(e); g != nil {
		return starlark.MakeInt(g.Rank), nil
	}
	return starlark.MakeInt(0), nil
}

func destroy(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	e, err := env.NoArgs(thread, b, args, kwargs)
	if err != nil {
		return nil, err
	}
	delete(e.Values, groupKey)
	return starlark.None, nil
}

func opArg(b *starlark.Builtin, s string) (tdist.ReduceOp, error) {
	op, ok := tdist.ParseReduceOp(s)
	if !ok {
		return 0, fmt.Errorf("%s: for parameter op: unknown reduction %q (want \"sum\", \"avg\", \"max\", \"min\" or \"product\")", b.Name(), s)
	}
	return op, nil
}

func allReduce(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	var t *startensor.Tensor
	op := "sum"
	if err := starlark.UnpackArgs(b.Name(), args, kwargs, "tensor", &t, "op?", &op); err != nil {
		return nil, err
	}
	o, err := opArg(b, op)
	if err != nil {
		return nil, err
	}
	g, _, err := GroupOf(thread, b, "", nil)
	if err != nil {
		return nil, err
	}
	return starlark.None, g.AllReduce(t.Engine(), o)
}

func allGather(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	var out, in *startensor.Tensor
	if err := starlark.UnpackArgs(b.Name(), args, kwargs, "output_tensor", &out, "input_tensor", &in); err != nil {
		return nil, err
	}
	g, _, err := GroupOf(thread, b, "", nil)
	if err != nil {
		return nil, err
	}
	return starlark.None, g.AllGatherIntoTensor(out.Engine(), in.Engine())
}

func reduceScatter(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	var out, in *startensor.Tensor
	op := "sum"
	if err := starlark.UnpackArgs(b.Name(), args, kwargs, "output", &out, "input", &in, "op?", &op); err != nil {
		return nil, err
	}
	o, err := opArg(b, op)
	if err != nil {
		return nil, err
	}
	g, _, err := GroupOf(thread, b, "", nil)
	if err != nil {
		return nil, err
	}
	return starlark.None, g.ReduceScatterTensor(out.Engine(), in.Engine(), o)
}

func broadcast(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	var t *startensor.Tensor
	src := 0
	if err := starlark.UnpackArgs(b.Name(), args, kwargs, "tensor", &t, "src?", &src); err != nil {
		return nil, err
	}
	g, _, err := GroupOf(thread, b, "", nil)
	if err != nil {
		return nil, err
	}
	return starlark.None, g.Broadcast(t.Engine(), src)
}

func barrier(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	if err := starlark.UnpackArgs(b.Name(), args, kwargs); err != nil {
		return nil, err
	}
	_, _, err := GroupOf(thread, b, "", nil)
	return starlark.None, err
}
