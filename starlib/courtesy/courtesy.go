// Package courtesy is the Starlark module `courtesy`, pytorch_memlab's
// Courtesy: move every GPU tensor to host memory to let another job use the
// GPU, then move them back.
package courtesy

import (
	"fmt"
	"strings"
	"weak"

	"go.starlark.net/starlark"
	"go.starlark.net/starlarkstruct"

	"github.com/memsh/memsh/backend"
	"github.com/memsh/memsh/env"
)

// Module is the courtesy module:
//
//	courtesy.yield_memory()  move every live GPU allocation (tensors and their
//	                         views, cuda.malloc buffers) to host memory, then
//	                         release the GPUs' cached segments; prints what
//	                         moved and what each GPU freed (allocated and
//	                         reserved bytes)
//	courtesy.restore()       move everything yield_memory moved, and that is
//	                         still alive, back to its GPU; prints what moved
//	courtesy.yielded()       the number of allocations waiting for restore
//
// Values keep their identity: a tensor's device reads "cpu" while yielded
// and its GPU again after restore. Either operation is all or nothing: if
// host or GPU memory runs out part way, what already moved goes back and
// the error is returned. The module remembers yielded memory only weakly,
// so a tensor dropped while yielded is reclaimed from host memory as usual.
var Module = &starlarkstruct.Module{
	Name: "courtesy",
	Members: starlark.StringDict{
		"yield_memory": starlark.NewBuiltin("courtesy.yield_memory", yieldMemory),
		"restore":      starlark.NewBuiltin("courtesy.restore", restore),
		"yielded":      starlark.NewBuiltin("courtesy.yielded", yielded),
	},
}

// moved is one allocation moved to host memory, and where it came from.
type moved struct {
	mem    weak.Pointer[backend.Memory]
	device string
}

type state struct{ moved []moved }

const valuesKey = "courtesy"

func stateOf(e *env.Env) *state {
	if s, ok := e.Values[valuesKey].(*state); ok {
		return s
	}
	s := &state{}
	e.Values[valuesKey] = s
	return s
}

func isGPU(device string) bool { return strings.HasPrefix(device, "cuda") }

// move migrates each memory to its target; on failure it moves back what
// already moved and returns the error.
func move(m *backend.Manager, mems []*backend.Memory, to func(int) string) error {
	from := make([]string, len(mems))
	for i, h := range mems {
		from[i] = h.Device()
		if err := m.Migrate(h, to(i)); err != nil {
			for j := i - 1; j >= 0; j-- {
				_ = m.Migrate(mems[j], from[j]) // its old place was just freed
			}
			return err
		}
	}
	return nil
}

type gpuFigures struct{ allocated, reserved []uint64 }

func readGPUs(m *backend.Manager) gpuFigures {
	var f gpuFigures
	for i := 0; i < m.NumGPUs(); i++ {
		f.allocated = append(f.allocated, m.GPU(i).Allocated())
		f.reserved = append(f.reserved, m.GPU(i).Reserved())
	}
	return f
}

func total(mems []*backend.Memory) uint64 {
	var n uint64
	for _, h := range mems {
		n += h.Size()
	}
	return n
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}

func yieldMemory(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	e, err := env.NoArgs(thread, b, args, kwargs)
	if err != nil {
		return nil, err
	}
	m := e.Manager
	m.Reclaim()
	before := readGPUs(m)
	var mems []*backend.Memory
	m.Live(func(h *backend.Memory) bool {
		if isGPU(h.Device()) && !h.Released() {
			mems = append(mems, h)
		}
		return true
	})
	from := make([]string, len(mems))
	for i, h := range mems {
		from[i] = h.Device()
	}
	if err := move(m, mems, func(int) string { return "cpu" }); err != nil {
		return nil, fmt.Errorf("%s: %w", b.Name(), err)
	}
	s := stateOf(e)
	for i, h := range mems {
		s.moved = append(s.moved, moved{mem: weak.Make(h), device: from[i]})
	}
	for i := 0; i < m.NumGPUs(); i++ {
		m.GPU(i).EmptyCache()
	}
	after := readGPUs(m)
	fmt.Fprintf(e.Out, "courtesy: moved %d allocation%s (%s) to host memory", len(mems), plural(len(mems)), backend.FormatBytes(int64(total(mems))))
	for i := range after.allocated {
		fmt.Fprintf(e.Out, "; %s freed %s allocated, %s reserved", m.GPU(i).Device().Name(),
			backend.FormatBytes(int64(before.allocated[i]-after.allocated[i])),
			backend.FormatBytes(int64(before.reserved[i]-after.reserved[i])))
	}
	fmt.Fprintln(e.Out)
	return starlark.None, nil
}

func restore(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	e, err := env.NoArgs(thread, b, args, kwargs)
	if err != nil {
		return nil, err
	}
	m := e.Manager
	m.Reclaim() // what was dropped while yielded is freed, not moved back
	s := stateOf(e)
	var mems []*backend.Memory
	var to []string
	for _, mv := range s.moved {
		if h := mv.mem.Value(); h != nil && !h.Released() && h.Device() == "cpu" {
			mems = append(mems, h)
			to = append(to, mv.device)
		}
	}
	if err := move(m, mems, func(i int) string { return to[i] }); err != nil {
		return nil, fmt.Errorf("%s: %w", b.Name(), err)
	}
	s.moved = nil
	fmt.Fprintf(e.Out, "courtesy: restored %d allocation%s (%s) to GPU memory\n", len(mems), plural(len(mems)), backend.FormatBytes(int64(total(mems))))
	return starlark.None, nil
}

func yielded(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	e, err := env.NoArgs(thread, b, args, kwargs)
	if err != nil {
		return nil, err
	}
	n := 0
	for _, mv := range stateOf(e).moved {
		if h := mv.mem.Value(); h != nil && !h.Released() && h.Device() == "cpu" {
			n++
		}
	}
	return starlark.MakeInt(n), nil
}
