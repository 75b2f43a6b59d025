// Package gpu is the Starlark module `gpu`: fastai's GPU memory helpers
// (gpu_mem_get, gpu_mem_get_all, gpu_with_max_free_mem, preload_pytorch,
// ipyexperiments' gpu_mem_leave_free_mbs) over the Session's devices. On
// real GPUs the figures come from NVML (device-wide, other processes
// included) or, without NVML, from the driver's cuMemGetInfo; on the
// simulator from the simulated device. Results have the same shapes on
// every backend.
package gpu

import (
	"fmt"

	"go.starlark.net/starlark"
	"go.starlark.net/starlarkstruct"

	"github.com/memsh/memsh/backend"
	"github.com/memsh/memsh/backend/cuda"
	"github.com/memsh/memsh/backend/nvml"
	"github.com/memsh/memsh/env"
	scuda "github.com/memsh/memsh/starlib/cuda"
)

// Module is the gpu module. Sizes are in bytes; id is None (the current
// device), an int ordinal or a device string "cuda" / "cuda:N"; a bad id is
// an error naming the function and the parameter. Every figure is taken
// after a reclaim, so tensors nothing refers to do not count.
//
//	count()                 number of GPUs of the session
//	mem(id=None)            struct(total, free, used): device-wide; used = total - free;
//	                        without any GPU struct(total=0, free=0, used=0), as
//	                        fastai's gpu_mem_get (a bad id is still an error)
//	mem_all()               [mem(0), mem(1), ...]
//	free(id=None)           mem(id).free
//	used(id=None)           mem(id).used
//	mem_no_cache(id=None)   mem(id) after emptying the allocator's cache (cuda.empty_cache()),
//	free_no_cache(id=None)  so memory cached but unallocated counts as free (fastai's
//	used_no_cache(id=None)  gpu_mem_get_free_no_cache / gpu_mem_get_used_no_cache)
//	set_target_gpu(id)      make id the current device, the one mem(), free(), used(),
//	                        the logger's gpu figures, memtrace and report() measure by
//	                        default (pytorch_memlab's set_target_gpu; cuda.set_device)
//	with_max_free()         (id, free) of the GPU with the most free memory (the
//	                        lowest id among equals), or (None, 0) without a GPU
//	info(id=None)           struct(id, device, name, uuid, backend, source, meta, total, free,
//	                        used, reserved, nvml_used, utilization, compute_capability,
//	                        driver, nvml_index, mig, context); fields a backend cannot
//	                        give are None (see info's docs below)
//	processes(id=None)      [struct(pid, used, name, self)]: processes using the device
//	                        (NVML; on the simulator, this process)
//	preload(id=None)        create the device's CUDA context now, as PyTorch's first
//	                        CUDA call would, and report its cost:
//	                        struct(device, created, bytes, seconds, workspace, source)
//	leave_free(nbytes, id=None)  allocate a buffer so that only about nbytes of the
//	                        device stay free (to reproduce a smaller card's OOMs);
//	                        returns the buffer (.nbytes .device .free())
//
// Sources: "nvml" (a real GPU with NVML), "driver" (cuMemGetInfo; creates
// the context) or "sim".
var Module = &starlarkstruct.Module{
	Name: "gpu",
	Members: starlark.StringDict{
		"count":          starlark.NewBuiltin("gpu.count", count),
		"mem":            starlark.NewBuiltin("gpu.mem", mem),
		"mem_all":        starlark.NewBuiltin("gpu.mem_all", memAll),
		"free":           starlark.NewBuiltin("gpu.free", field(func(m memory) uint64 { return m.free })),
		"used":           starlark.NewBuiltin("gpu.used", field(func(m memory) uint64 { return m.used })),
		"with_max_free":  starlark.NewBuiltin("gpu.with_max_free", withMaxFree),
		"info":           starlark.NewBuiltin("gpu.info", info),
		"processes":      starlark.NewBuiltin("gpu.processes", processes),
		"preload":        starlark.NewBuiltin("gpu.preload", preload),
		"leave_free":     starlark.NewBuiltin("gpu.leave_free", leaveFree),
		"mem_no_cache":   starlark.NewBuiltin("gpu.mem_no_cache", noCache(memStruct)),
		"free_no_cache":  starlark.NewBuiltin("gpu.free_no_cache", noCache(func(m memory) starlark.Value { return starlark.MakeUint64(m.free) })),
		"used_no_cache":  starlark.NewBuiltin("gpu.used_no_cache", noCache(func(m memory) starlark.Value { return starlark.MakeUint64(m.used) })),
		"set_target_gpu": starlark.NewBuiltin("gpu.set_target_gpu", setTargetGPU),
	},
}

func manager(thread *starlark.Thread, b *starlark.Builtin) (*backend.Manager, error) {
	e, err := env.Of(thread, b.Name())
	if err != nil {
		return nil, err
	}
	return e.Manager, nil
}

// device resolves an optional id argument (after reclaiming) and returns
// the device's allocator and ordinal.
func device(thread *starlark.Thread, b *starlark.Builtin, idV starlark.Value) (*backend.Manager, backend.Allocator, int, error) {
	m, err := manager(thread, b)
	if err != nil {
		return nil, nil, 0, err
	}
	a, err := scuda.Resolve(m, b.Name(), "id", idV)
	if err != nil {
		return nil, nil, 0, err
	}
	for i := range m.NumGPUs() {
		if m.GPU(i) == a {
			m.Reclaim()
			return m, a, i, nil
		}
	}
	return nil, nil, 0, fmt.Errorf("%s: for parameter id: not a GPU", b.Name())
}

// idArg unpacks (id=None) and resolves it.
func idArg(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (*backend.Manager, backend.Allocator, int, error) {
	var idV starlark.Value
	if err := starlark.UnpackArgs(b.Name(), args, kwargs, "id?", &idV); err != nil {
		return nil, nil, 0, err
	}
	return device(thread, b, idV)
}

func count(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	e, err := env.NoArgs(thread, b, args, kwargs)
	if err != nil {
		return nil, err
	}
	m := e.Manager
	return starlark.MakeInt(m.NumGPUs()), nil
}

func memStruct(m memory) starlark.Value {
	return starlarkstruct.FromStringDict(starlarkstruct.Default, starlark.StringDict{
		"total": starlark.MakeUint64(m.total),
		"free":  starlark.MakeUint64(m.free),
		"used":  starlark.MakeUint64(m.used),
	})
}

func memoryErr(b *starlark.Builtin, err error) error { return fmt.Errorf("%s: %v", b.Name(), err) }

// mem(id=None) returns struct(total, free, used) of the device.
var mem = memoryBuiltin(memStruct)

// field returns a builtin f(id=None) giving one figure of mem().
func field(get func(memory) uint64) func(*starlark.Thread, *starlark.Builtin, starlark.Tuple, []starlark.Tuple) (starlark.Value, error) {
	return memoryBuiltin(func(m memory) starlark.Value { return starlark.MakeUint64(get(m)) })
}

// memoryBuiltin returns a builtin f(id=None) that reads the device's memory
// and converts it with conv. Without any GPU it converts zeros, as fastai's
// gpu_mem_get returns GPUMemory(0, 0, 0).
func memoryBuiltin(conv func(memory) starlark.Value) func(*starlark.Thread, *starlark.Builtin, starlark.Tuple, []starlark.Tuple) (starlark.Value, error) {
	return readMemory(conv, false)
}

// noCache is memoryBuiltin after emptying the device's allocator cache.
func noCache(conv func(memory) starlark.Value) func(*starlark.Thread, *starlark.Builtin, starlark.Tuple, []starlark.Tuple) (starlark.Value, error) {
	return readMemory(conv, true)
}

func readMemory(conv func(memory) starlark.Value, emptyCache bool) func(*starlark.Thread, *starlark.Builtin, starlark.Tuple, []starlark.Tuple) (starlark.Value, error) {
	return func(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
		var idV starlark.Value
		if err := starlark.UnpackArgs(b.Name(), args, kwargs, "id?", &idV); err != nil {
			return nil, err
		}
		if m, err := manager(thread, b); err != nil {
			return nil, err
		} else if m.NumGPUs() == 0 {
			return conv(memory{}), nil
		}
		_, a, _, err := device(thread, b, idV)
		if err != nil {
			return nil, err
		}
		if emptyCache {
			a.EmptyCache()
		}
		mm, err := memoryOf(a.Device())
		if err != nil {
			return nil, memoryErr(b, err)
		}
		return conv(mm), nil
	}
}

func memAll(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	e, err := env.NoArgs(thread, b, args, kwargs)
	if err != nil {
		return nil, err
	}
	m := e.Manager
	m.Reclaim()
	out := make([]starlark.Value, m.NumGPUs())
	for i := range out {
		mm, err := memoryOf(m.GPU(i).Device())
		if err != nil {
			return nil, memoryErr(b, err)
		}
		out[i] = memStruct(mm)
	}
	return starlark.NewList(out), nil
}

func withMaxFree(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	e, err := env.NoArgs(thread, b, args, kwargs)
	if err != nil {
		return nil, err
	}
	m := e.Manager
	m.Reclaim()
	best, bestFree := -1, uint64(0)
	for i := range m.NumGPUs() {
		mm, err := memoryOf(m.GPU(i).Device())
		if err != nil {
			return nil, memoryErr(b, err)
		}
		if best < 0 || mm.free > bestFree {
			best, bestFree = i, mm.free
		}
	}
	if best < 0 {
		return starlark.Tuple{starlark.None, starlark.MakeInt(0)}, nil
	}
	return starlark.Tuple{starlark.MakeInt(best), starlark.MakeUint64(bestFree)}, nil
}

func optUint(v uint64, ok bool) starlark.Value {
	if !ok {
		return starlark.None
	}
	return starlark.MakeUint64(v)
}

func optString(s string) starlark.Value {
	if s == "" {
		return starlark.None
	}
	return starlark.String(s)
}

// info(id=None) describes a GPU. Fields:
//
//	id, device            the ordinal and "cuda:N"
//	name, uuid            the device's name; its UUID (None on the simulator)
//	backend, source       "cuda" or "sim"; where total/free/used come from
//	meta                  True on a simulator that allocates sizes only and computes
//	                      no values (sim:...,meta); False otherwise
//	total, free, used     as mem()
//	reserved, nvml_used   NVML's v2 figures: memory the driver reserves, and NVML's
//	                      used (which then excludes reserved); None without them
//	utilization           struct(gpu, memory) in percent (NVML), or None
//	compute_capability    "9.0", or None; driver: the CUDA version "12.4", or None
//	nvml_index            the GPU's NVML index (CUDA_VISIBLE_DEVICES renumbers CUDA's
//	                      ordinals, not NVML's), or None
//	mig                   the MIG devices of the GPU: [struct(uuid, name, total, free, used)]
//	context               None until the CUDA context exists, then struct(seconds,
//	                      workspace, kernels_error): the time it took, memsh's workspace
//	                      on the device, and why memsh's kernels could not be loaded
//	                      (None when they were; ops then run on the CPU through host
//	                      copies); on the simulator struct(seconds=0.0, workspace=0,
//	                      kernels_error=None) always
func info(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	_, a, id, err := idArg(thread, b, args, kwargs)
	if err != nil {
		return nil, err
	}
	d := a.Device()
	mm, err := memoryOf(d)
	if err != nil {
		return nil, memoryErr(b, err)
	}
	f := starlark.StringDict{
		"id": starlark.MakeInt(id), "device": starlark.String(d.Name()), "name": starlark.String(d.Description()),
		"uuid": starlark.None, "backend": starlark.String(d.Kind()), "source": starlark.String(mm.source),
		"total": starlark.MakeUint64(mm.total), "free": starlark.MakeUint64(mm.free), "used": starlark.MakeUint64(mm.used),
		"reserved": starlark.None, "nvml_used": starlark.None, "utilization": starlark.None,
		"compute_capability": starlark.None, "driver": starlark.None, "nvml_index": starlark.None,
		"mig": starlark.NewList(nil), "context": starlark.None,
	}
	if d.Kind() == "sim" {
		f["context"] = contextStruct(0, 0, nil)
	}
	meta, _ := d.(interface{ Meta() bool })
	f["meta"] = starlark.Bool(meta != nil && meta.Meta())
	if c, ok := d.(*cuda.Device); ok {
		f["uuid"] = starlark.String(c.UUID())
		major, minor := c.ComputeCapability()
		f["compute_capability"] = starlark.String(fmt.Sprintf("%d.%d", major, minor))
		f["driver"] = starlark.String(c.Driver().VersionString())
		if c.HasContext() {
			ci, err := c.Context()
			if err == nil {
				f["context"] = contextStruct(ci.Time.Seconds(), ci.Workspace, ci.ModuleErr)
			}
		}
		if v := c.NVML(); v != nil {
			nvmlInfo(f, v)
		}
	}
	return starlarkstruct.FromStringDict(starlarkstruct.Default, f), nil
}

func contextStruct(seconds float64, workspace uint64, kernelsErr error) starlark.Value {
	var ke starlark.Value = starlark.None
	if kernelsErr != nil {
		ke = starlark.String(kernelsErr.Error())
	}
	return starlarkstruct.FromStringDict(starlarkstruct.Default, starlark.StringDict{
		"seconds": starlark.Float(seconds), "workspace": starlark.MakeUint64(workspace), "kernels_error": ke,
	})
}

// nvmlInfo adds NVML's figures to info's fields.
func nvmlInfo(f starlark.StringDict, v *nvml.Device) {
	f["nvml_index"] = starlark.MakeInt(v.Index)
	if m, err := v.Memory(); err == nil {
		f["nvml_used"] = starlark.MakeUint64(m.Used)
		f["reserved"] = optUint(m.Reserved, m.V2)
	}
	if u, err := v.Utilization(); err == nil {
		f["utilization"] = starlarkstruct.FromStringDict(starlarkstruct.Default, starlark.StringDict{
			"gpu": starlark.MakeInt(int(u.GPU)), "memory": starlark.MakeInt(int(u.Memory)),
		})
	}
	migs, _ := v.MIGDevices()
	var l []starlark.Value
	for _, m := range migs {
		mem, err := m.Memory()
		if err != nil {
			continue
		}
		l = append(l, starlarkstruct.FromStringDict(starlarkstruct.Default, starlark.StringDict{
			"uuid": starlark.String(m.UUID), "name": starlark.String(m.Name),
			"total": starlark.MakeUint64(mem.Total), "free": starlark.MakeUint64(mem.Free), "used": starlark.MakeUint64(mem.Total - mem.Free),
		}))
	}
	f["mig"] = starlark.NewList(l)
}

// processes(id=None) lists the processes using a GPU:
// struct(pid, used, name, self); used is None when NVML cannot tell, name
// "" when unknown, self True for this process. In a container NVML may
// list host pids (self then stays False) or none.
func processes(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	_, a, _, err := idArg(thread, b, args, kwargs)
	if err != nil {
		return nil, err
	}
	ps, err := processesOf(a.Device())
	if err != nil {
		return nil, fmt.Errorf("%s: %v", b.Name(), err)
	}
	out := make([]starlark.Value, len(ps))
	for i, p := range ps {
		out[i] = starlarkstruct.FromStringDict(starlarkstruct.Default, starlark.StringDict{
			"pid": starlark.MakeUint64(uint64(p.pid)), "used": optUint(p.used, p.usedKnown),
			"name": starlark.String(p.name), "self": starlark.Bool(p.self),
		})
	}
	return starlark.NewList(out), nil
}

// preload(id=None) creates the device's CUDA context (primary context,
// memsh's kernels, its workspace) as PyTorch's first CUDA operation would,
// so that later measurements do not include it, and returns
// struct(device, created, bytes, seconds, workspace, source): created is
// False when the context already existed (bytes is then 0); bytes is the
// device memory it took (None when unknown), workspace the part that is
// memsh's own. On the simulator the context is the spec's ctx= and
// always exists.
func preload(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	_, a, _, err := idArg(thread, b, args, kwargs)
	if err != nil {
		return nil, err
	}
	r, err := preloadDevice(a.Device())
	if err != nil {
		return nil, fmt.Errorf("%s: %v", b.Name(), err)
	}
	return starlarkstruct.FromStringDict(starlarkstruct.Default, starlark.StringDict{
		"device": starlark.String(a.Device().Name()), "created": starlark.Bool(r.created),
		"bytes": optUint(r.bytes, r.known), "seconds": starlark.Float(r.seconds.Seconds()),
		"workspace": starlark.MakeUint64(r.workspace), "source": starlark.String(r.source),
	}), nil
}

// set_target_gpu(id) makes id (an ordinal or "cuda:N") the current device.
func setTargetGPU(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	var idV starlark.Value
	if err := starlark.UnpackArgs(b.Name(), args, kwargs, "id", &idV); err != nil {
		return nil, err
	}
	m, _, i, err := device(thread, b, idV)
	if err != nil {
		return nil, err
	}
	if err := m.SetCurrent(i); err != nil {
		return nil, fmt.Errorf("%s: %v", b.Name(), err)
	}
	return starlark.None, nil
}
