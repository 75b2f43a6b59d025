// Package cuda is the Starlark module `cuda`: torch.cuda's memory API over
// memsh's allocators, on real GPUs or the simulator.
package cuda

import (
	"fmt"
	"sort"
	"strings"

	"go.starlark.net/starlark"
	"go.starlark.net/starlarkstruct"

	"github.com/memsh/memsh/backend"
	"github.com/memsh/memsh/starlib/env"
)

// Module is the cuda module. Its functions, named as in torch.cuda (sizes
// in bytes; device is None for the current device, an int ordinal, or a
// string "cuda" / "cuda:N"):
//
//	is_available()                 True if there is at least one GPU
//	device_count()                 number of GPUs
//	current_device()               ordinal of the current GPU
//	set_device(device)             make device current
//	get_device_name(device=None)   the device's name
//	mem_get_info(device=None)      (free, total): device-wide, as cudaMemGetInfo
//	memory_allocated(device=None)  bytes in allocated blocks (after a reclaim)
//	max_memory_allocated(device=None)  exact peak of memory_allocated since start or reset
//	memory_reserved(device=None)   bytes held by the caching allocator
//	max_memory_reserved(device=None)   peak of memory_reserved
//	reset_peak_memory_stats(device=None)  restart the ".peak" statistics
//	memory_stats(device=None)      dict of PyTorch's memory_stats() keys
//	memory_summary(device=None)    a printable table of the main statistics
//	empty_cache()                  release cached segments with no allocated block (every GPU)
//	synchronize(device=None)       wait for the device (no-op on the simulator)
//	malloc(nbytes, device=None)    a raw buffer: .nbytes .device .free()
//
// Every figure is read after a reclaim, so memory no Starlark value can reach
// never counts, as in a reference-counted runtime.
var Module = &starlarkstruct.Module{
	Name: "cuda",
	Members: starlark.StringDict{
		"is_available":            starlark.NewBuiltin("cuda.is_available", isAvailable),
		"device_count":            starlark.NewBuiltin("cuda.device_count", deviceCount),
		"current_device":          starlark.NewBuiltin("cuda.current_device", currentDevice),
		"set_device":              starlark.NewBuiltin("cuda.set_device", setDevice),
		"get_device_name":         starlark.NewBuiltin("cuda.get_device_name", getDeviceName),
		"mem_get_info":            starlark.NewBuiltin("cuda.mem_get_info", memGetInfo),
		"memory_allocated":        starlark.NewBuiltin("cuda.memory_allocated", figure(func(a backend.Allocator) uint64 { return a.Allocated() })),
		"max_memory_allocated":    starlark.NewBuiltin("cuda.max_memory_allocated", stat("allocated_bytes.all.peak")),
		"memory_reserved":         starlark.NewBuiltin("cuda.memory_reserved", figure(func(a backend.Allocator) uint64 { return a.Reserved() })),
		"max_memory_reserved":     starlark.NewBuiltin("cuda.max_memory_reserved", stat("reserved_bytes.all.peak")),
		"reset_peak_memory_stats": starlark.NewBuiltin("cuda.reset_peak_memory_stats", resetPeak),
		"memory_stats":            starlark.NewBuiltin("cuda.memory_stats", memoryStats),
		"memory_summary":          starlark.NewBuiltin("cuda.memory_summary", memorySummary),
		"empty_cache":             starlark.NewBuiltin("cuda.empty_cache", emptyCache),
		"synchronize":             starlark.NewBuiltin("cuda.synchronize", synchronize),
		"malloc":                  starlark.NewBuiltin("cuda.malloc", mallocBuiltin),
	},
}

type builtinFn = func(*starlark.Thread, *starlark.Builtin, starlark.Tuple, []starlark.Tuple) (starlark.Value, error)

func manager(thread *starlark.Thread, b *starlark.Builtin) (*backend.Manager, error) {
	e, err := env.Of(thread, b.Name())
	if err != nil {
		return nil, err
	}
	return e.Manager, nil
}

// Resolve returns the allocator of a device argument: None (current GPU),
// an int ordinal, or "cuda" / "cuda:N". param names the parameter in errors.
func Resolve(m *backend.Manager, builtin, param string, v starlark.Value) (backend.Allocator, error) {
	if m.NumGPUs() == 0 {
		return nil, fmt.Errorf("%s: no CUDA devices available", builtin)
	}
	var dev string
	switch v := v.(type) {
	case nil, starlark.NoneType:
		return m.GPU(m.Current()), nil
	case starlark.Int:
		i, ok := v.Int64()
		if !ok || i < 0 || i >= int64(m.NumGPUs()) {
			return nil, fmt.Errorf("%s: for parameter %s: invalid device ordinal %s (%d devices)", builtin, param, v, m.NumGPUs())
		}
		return m.GPU(int(i)), nil
	case starlark.String:
		dev = string(v)
	default:
		if s, ok := v.(fmt.Stringer); ok && v.Type() == "device" {
			dev = s.String()
		} else {
			return nil, fmt.Errorf("%s: for parameter %s: got %s, want int or string", builtin, param, v.Type())
		}
	}
	if !strings.HasPrefix(dev, "cuda") {
		return nil, fmt.Errorf("%s: for parameter %s: expected a CUDA device, got %q", builtin, param, dev)
	}
	a, err := m.Allocator(dev)
	if err != nil {
		return nil, fmt.Errorf("%s: for parameter %s: %v", builtin, param, err)
	}
	return a, nil
}

// deviceArg unpacks an optional device argument and resolves it.
func deviceArg(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (*backend.Manager, backend.Allocator, error) {
	var dev starlark.Value
	if err := starlark.UnpackArgs(b.Name(), args, kwargs, "device?", &dev); err != nil {
		return nil, nil, err
	}
	m, err := manager(thread, b)
	if err != nil {
		return nil, nil, err
	}
	a, err := Resolve(m, b.Name(), "device", dev)
	return m, a, err
}

func isAvailable(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	if err := starlark.UnpackArgs(b.Name(), args, kwargs); err != nil {
		return nil, err
	}
	m, err := manager(thread, b)
	if err != nil {
		return nil, err
	}
	return starlark.Bool(m.NumGPUs() > 0), nil
}

func deviceCount(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	if err := starlark.UnpackArgs(b.Name(), args, kwargs); err != nil {
		return nil, err
	}
	m, err := manager(thread, b)
	if err != nil {
		return nil, err
	}
	return starlark.MakeInt(m.NumGPUs()), nil
}

func currentDevice(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	if err := starlark.UnpackArgs(b.Name(), args, kwargs); err != nil {
		return nil, err
	}
	m, err := manager(thread, b)
	if err != nil {
		return nil, err
	}
	if m.NumGPUs() == 0 {
		return nil, fmt.Errorf("%s: no CUDA devices available", b.Name())
	}
	return starlark.MakeInt(m.Current()), nil
}

func setDevice(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	var dev starlark.Value
	if err := starlark.UnpackArgs(b.Name(), args, kwargs, "device", &dev); err != nil {
		return nil, err
	}
	m, err := manager(thread, b)
	if err != nil {
		return nil, err
	}
	a, err := Resolve(m, b.Name(), "device", dev)
	if err != nil {
		return nil, err
	}
	for i := 0; i < m.NumGPUs(); i++ {
		if m.GPU(i) == a {
			_ = m.SetCurrent(i)
		}
	}
	return starlark.None, nil
}

func getDeviceName(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	_, a, err := deviceArg(thread, b, args, kwargs)
	if err != nil {
		return nil, err
	}
	return starlark.String(a.Device().Description()), nil
}

func memGetInfo(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	m, a, err := deviceArg(thread, b, args, kwargs)
	if err != nil {
		return nil, err
	}
	m.Reclaim()
	free, total, err := a.Device().MemGetInfo()
	if err != nil {
		return nil, fmt.Errorf("%s: %v", b.Name(), err)
	}
	return starlark.Tuple{starlark.MakeUint64(free), starlark.MakeUint64(total)}, nil
}

func figure(get func(backend.Allocator) uint64) builtinFn {
	return func(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
		m, a, err := deviceArg(thread, b, args, kwargs)
		if err != nil {
			return nil, err
		}
		m.Reclaim()
		return starlark.MakeUint64(get(a)), nil
	}
}

func stat(key string) builtinFn {
	return func(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
		m, a, err := deviceArg(thread, b, args, kwargs)
		if err != nil {
			return nil, err
		}
		m.Reclaim()
		return starlark.MakeInt64(a.Stats()[key]), nil
	}
}

func resetPeak(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	m, a, err := deviceArg(thread, b, args, kwargs)
	if err != nil {
		return nil, err
	}
	m.Reclaim()
	a.ResetPeakStats()
	return starlark.None, nil
}

func memoryStats(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	m, a, err := deviceArg(thread, b, args, kwargs)
	if err != nil {
		return nil, err
	}
	m.Reclaim()
	st := a.Stats()
	keys := make([]string, 0, len(st))
	for k := range st {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	d := starlark.NewDict(len(keys))
	for _, k := range keys {
		_ = d.SetKey(starlark.String(k), starlark.MakeInt64(st[k]))
	}
	return d, nil
}

func memorySummary(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	m, a, err := deviceArg(thread, b, args, kwargs)
	if err != nil {
		return nil, err
	}
	m.Reclaim()
	return starlark.String(Summary(a)), nil
}

// Summary formats the main memory_stats() figures of an allocator as a
// table in the spirit of torch.cuda.memory_summary().
func Summary(a backend.Allocator) string {
	st := a.Stats()
	var sb strings.Builder
	fmt.Fprintf(&sb, "memsh memory summary, device %s (%s)\n", a.Device().Name(), a.Device().Description())
	fmt.Fprintf(&sb, "%-24s %14s %14s %14s %14s\n", "Metric", "Cur Usage", "Peak Usage", "Tot Alloc", "Tot Freed")
	rows := []struct{ label, key string }{
		{"Allocated memory", "allocated_bytes"},
		{"Active memory", "active_bytes"},
		{"Requested memory", "requested_bytes"},
		{"Reserved memory", "reserved_bytes"},
		{"Non-releasable memory", "inactive_split_bytes"},
	}
	for _, r := range rows {
		for _, pool := range []string{"all", "large_pool", "small_pool"} {
			label := r.label
			if pool != "all" {
				label = "  from " + strings.TrimSuffix(pool, "_pool") + " pool"
			}
			p := r.key + "." + pool + "."
			fmt.Fprintf(&sb, "%-24s %14s %14s %14s %14s\n", label,
				backend.FormatBytes(st[p+"current"]), backend.FormatBytes(st[p+"peak"]),
				backend.FormatBytes(st[p+"allocated"]), backend.FormatBytes(st[p+"freed"]))
		}
	}
	counts := []struct{ label, key string }{{"Allocations", "allocation"}, {"Active allocs", "active"}, {"GPU reserved segments", "segment"}, {"Non-releasable allocs", "inactive_split"}}
	for _, r := range counts {
		p := r.key + ".all."
		fmt.Fprintf(&sb, "%-24s %14d %14d %14d %14d\n", r.label, st[p+"current"], st[p+"peak"], st[p+"allocated"], st[p+"freed"])
	}
	fmt.Fprintf(&sb, "Device allocs: %d, device frees: %d, alloc retries: %d, OOMs: %d\n",
		st["num_device_alloc"], st["num_device_free"], st["num_alloc_retries"], st["num_ooms"])
	return sb.String()
}

func emptyCache(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	if err := starlark.UnpackArgs(b.Name(), args, kwargs); err != nil {
		return nil, err
	}
	m, err := manager(thread, b)
	if err != nil {
		return nil, err
	}
	m.Reclaim()
	for i := 0; i < m.NumGPUs(); i++ {
		m.GPU(i).EmptyCache()
	}
	return starlark.None, nil
}

func synchronize(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	_, _, err := deviceArg(thread, b, args, kwargs)
	if err != nil {
		return nil, err
	}
	return starlark.None, nil
}
