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
	"github.com/memsh/memsh/env"
	stensor "github.com/memsh/memsh/starlib/tensor"
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
//	memory_summary(device=None, abbreviated=False)  PyTorch's memory_summary table
//	empty_cache()                  release cached segments with no allocated block (every GPU)
//	clear_cublas_workspaces()      free the cuBLAS/cuBLASLt workspaces (torch._C._cuda_clearCublasWorkspaces): the next matrix product allocates them again, as in a fresh process; returns the bytes freed
//	synchronize(device=None)       wait for the device: every stream's work so far is done (the allocator's pending frees complete)
//	Stream(device=None) current_stream(device=None) default_stream(device=None)
//	set_stream(stream) stream(stream, fn, *args, **kwargs)   CUDA streams (stream.go); Tensor.record_stream(stream)
//	malloc(nbytes, device=None)    a raw buffer: .nbytes .device .free()
//	record_memory_history(enabled=True, max_entries=100000)  record allocator events with Starlark frames
//	dump_snapshot(path)            write a memory_viz snapshot (pickle) of segments, blocks and the recorded events
//
// Every figure is read after a reclaim, so memory no Starlark value can reach
// never counts, as in a reference-counted runtime. The functions that
// read or reset figures (and empty_cache and synchronize) change no
// Starlark value: they are declared pure (starlark.Builtin.DeclarePure),
// so that a reclaim made inside one keeps what it found for the next
// (docs/architecture.md, "How memory is accounted").
var Module = &starlarkstruct.Module{
	Name: "cuda",
	Members: starlark.StringDict{
		"is_available":            starlark.NewBuiltin("cuda.is_available", isAvailable).DeclarePure(),
		"device_count":            starlark.NewBuiltin("cuda.device_count", deviceCount).DeclarePure(),
		"current_device":          starlark.NewBuiltin("cuda.current_device", currentDevice).DeclarePure(),
		"set_device":              starlark.NewBuiltin("cuda.set_device", setDevice),
		"get_device_name":         starlark.NewBuiltin("cuda.get_device_name", getDeviceName).DeclarePure(),
		"mem_get_info":            starlark.NewBuiltin("cuda.mem_get_info", memGetInfo).DeclarePure(),
		"memory_allocated":        starlark.NewBuiltin("cuda.memory_allocated", figure(func(a backend.Allocator) uint64 { return a.Allocated() })).DeclarePure(),
		"max_memory_allocated":    starlark.NewBuiltin("cuda.max_memory_allocated", stat("allocated_bytes.all.peak")).DeclarePure(),
		"memory_reserved":         starlark.NewBuiltin("cuda.memory_reserved", figure(func(a backend.Allocator) uint64 { return a.Reserved() })).DeclarePure(),
		"max_memory_reserved":     starlark.NewBuiltin("cuda.max_memory_reserved", stat("reserved_bytes.all.peak")).DeclarePure(),
		"reset_peak_memory_stats": starlark.NewBuiltin("cuda.reset_peak_memory_stats", resetPeak).DeclarePure(),
		"memory_stats":            starlark.NewBuiltin("cuda.memory_stats", memoryStats).DeclarePure(),
		"memory_summary":          starlark.NewBuiltin("cuda.memory_summary", memorySummary).DeclarePure(),
		"empty_cache":             starlark.NewBuiltin("cuda.empty_cache", emptyCache).DeclarePure(),
		"clear_cublas_workspaces": starlark.NewBuiltin("cuda.clear_cublas_workspaces", clearCublasWorkspaces),
		"synchronize":             starlark.NewBuiltin("cuda.synchronize", synchronize).DeclarePure(),
		"malloc":                  starlark.NewBuiltin("cuda.malloc", mallocBuiltin),
		"record_memory_history":   starlark.NewBuiltin("cuda.record_memory_history", recordMemoryHistory),
		"dump_snapshot":           starlark.NewBuiltin("cuda.dump_snapshot", dumpSnapshot),
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
	e, err := env.NoArgs(thread, b, args, kwargs)
	if err != nil {
		return nil, err
	}
	m := e.Manager
	return starlark.Bool(m.NumGPUs() > 0), nil
}

func deviceCount(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	e, err := env.NoArgs(thread, b, args, kwargs)
	if err != nil {
		return nil, err
	}
	m := e.Manager
	return starlark.MakeInt(m.NumGPUs()), nil
}

func currentDevice(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	e, err := env.NoArgs(thread, b, args, kwargs)
	if err != nil {
		return nil, err
	}
	m := e.Manager
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
	m.ResetPeakStats(a)
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
	var dev starlark.Value
	var abbreviated bool
	if err := starlark.UnpackArgs(b.Name(), args, kwargs, "device?", &dev, "abbreviated?", &abbreviated); err != nil {
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
	m.Reclaim()
	return starlark.String(summary(a, abbreviated)), nil
}

// Summary is torch.cuda.memory_summary(device) for an allocator: PyTorch's
// 75-column table of memory_stats() — allocated, active, requested,
// reserved and non-releasable memory, then allocation, active, segment and
// non-releasable counts, each for all pools and the large and small pools,
// with current, peak, total allocated and total freed values — formatted as
// PyTorch formats it: sizes in the unit that keeps the row's "all" figure
// below 768 of it (B, KiB, MiB, ...; integer division), counts in units of
// 1000 (K, M) below 750 of them.
func Summary(a backend.Allocator) string { return summary(a, false) }

// summary is Summary; abbreviated leaves out the per-pool rows.
func summary(a backend.Allocator, abbreviated bool) string {
	st := a.Stats()
	index := 0
	fmt.Sscanf(a.Device().Name(), "cuda:%d", &index)

	formatSize := func(sz, pref int64) string {
		prefixes := []string{"B  ", "KiB", "MiB", "GiB", "TiB", "PiB"}
		prefix := prefixes[0]
		p := float64(pref)
		for _, np := range prefixes[1:] {
			if p < 768*1024 {
				break
			}
			prefix = np
			sz /= 1024
			p /= 1024
		}
		return fmt.Sprintf("%6d %s", sz, prefix)
	}
	formatCount := func(cnt, pref int64) string {
		prefixes := []string{" ", "K", "M"}
		prefix := prefixes[0]
		p := float64(pref)
		for _, np := range prefixes[1:] {
			if p < 750*1000 {
				break
			}
			prefix = np
			cnt /= 1000
			p /= 1000
		}
		return fmt.Sprintf("%7d %s ", cnt, prefix)
	}

	var lines []string
	add := func(format string, args ...any) { lines = append(lines, fmt.Sprintf(format, args...)) }
	add("%s", strings.Repeat("=", 75))
	add(" %16s memsh CUDA memory summary, device ID %-19d ", "", index)
	add("%s", strings.Repeat("-", 75))
	add("  %9s CUDA OOMs: %-12d | %6s cudaMalloc retries: %-8d  ", "", st["num_ooms"], "", st["num_alloc_retries"])
	add("%s", strings.Repeat("=", 75))
	add("        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  ")
	metrics := []struct {
		key, name string
		format    func(int64, int64) string
	}{
		{"allocated_bytes", "Allocated memory", formatSize},
		{"active_bytes", "Active memory", formatSize},
		{"requested_bytes", "Requested memory", formatSize},
		{"reserved_bytes", "GPU reserved memory", formatSize},
		{"inactive_split_bytes", "Non-releasable memory", formatSize},
		{"allocation", "Allocations", formatCount},
		{"active", "Active allocs", formatCount},
		{"segment", "GPU reserved segments", formatCount},
		{"inactive_split", "Non-releasable allocs", formatCount},
	}
	for _, mt := range metrics {
		add("%s", strings.Repeat("-", 75))
		subs := [][2]string{{"all", mt.name}}
		if !abbreviated {
			subs = append(subs, [2]string{"large_pool", "      from large pool"}, [2]string{"small_pool", "      from small pool"})
		}
		var pref [4]int64
		for i, sub := range subs {
			p := mt.key + "." + sub[0] + "."
			v := [4]int64{st[p+"current"], st[p+"peak"], st[p+"allocated"], st[p+"freed"]}
			if i == 0 {
				pref = v
			}
			add(" %-21s | %s | %s | %s | %s ", sub[1], mt.format(v[0], pref[0]), mt.format(v[1], pref[1]),
				mt.format(v[2], pref[2]), mt.format(v[3], pref[3]))
		}
	}
	for _, mt := range []struct{ key, name string }{{"oversize_allocations", "Oversize allocations"}, {"oversize_segments", "Oversize GPU segments"}} {
		add("%s", strings.Repeat("-", 75))
		p := mt.key + "."
		v := [4]int64{st[p+"current"], st[p+"peak"], st[p+"allocated"], st[p+"freed"]}
		add(" %-21s | %s | %s | %s | %s ", mt.name, formatCount(v[0], v[0]), formatCount(v[1], v[1]),
			formatCount(v[2], v[2]), formatCount(v[3], v[3]))
	}
	add("%s", strings.Repeat("=", 75))
	return "|" + strings.Join(lines, "|\n|") + "|\n"
}

func emptyCache(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	e, err := env.NoArgs(thread, b, args, kwargs)
	if err != nil {
		return nil, err
	}
	m := e.Manager
	m.Reclaim()
	for i := 0; i < m.NumGPUs(); i++ {
		m.GPU(i).EmptyCache()
	}
	return starlark.None, nil
}

// clearCublasWorkspaces frees the tensor engine's cuBLAS and cuBLASLt
// workspaces (tensor.Context.ClearBLASWorkspaces).
func clearCublasWorkspaces(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	e, err := env.NoArgs(thread, b, args, kwargs)
	if err != nil {
		return nil, err
	}
	return starlark.MakeUint64(stensor.Context(e).ClearBLASWorkspaces()), nil
}

func synchronize(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	m, a, err := deviceArg(thread, b, args, kwargs)
	if err != nil {
		return nil, err
	}
	if _, ok := a.(backend.StreamAllocator); ok {
		_ = m.Streams(a.Device().Name(), func(sa backend.StreamAllocator) error {
			sa.Synchronize()
			return nil
		})
	}
	return starlark.None, nil
}
