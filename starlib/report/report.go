// Package report is the global builtin report(device=None, verbose=False):
// pytorch_memlab's MemReporter for memsh. It lists every live tensor and
// buffer by name, with shape, dtype and size, per device; a tensor sharing
// the storage of another (a view, or the same storage reached twice) is
// shown as name(->other) with 0 bytes, so nothing is counted twice; each
// device ends with the total, the allocator's allocated figure and the gap
// between them explained exactly (rounding to allocator blocks, and
// allocations no name reaches).
//
// Names are reference paths (as scope/refpath gives them in leak reports)
// from the user globals — `x`, `cache["k"][3]`, `model.w`, `f.<free t>` —
// and then from the locals of the Starlark functions running report()
// (`fn:name`).
package report

import (
	"fmt"
	"io"
	"sort"
	"strings"

	"go.starlark.net/starlark"

	"github.com/memsh/memsh/backend"
	"github.com/memsh/memsh/env"
	"github.com/memsh/memsh/env/refpath"
	"github.com/memsh/memsh/starlib/tensor"
)

// Builtin is the global report(device=None, verbose=False). device is None
// (every device holding memory), "cpu", "cuda", "cuda:N" or a GPU ordinal.
// verbose adds each storage's allocator block size and lists the
// allocations no name reaches. It reclaims first, prints, and returns None.
var Builtin = starlark.NewBuiltin("report", reportBuiltin)

// Row is one tensor or buffer.
type Row struct {
	Name     string // reference path
	Shares   string // the name of the row owning the storage, or "" for the owner
	Shape    []int  // nil for a buffer
	DType    string // "float32", ..., or "buffer"
	Bytes    uint64 // the storage's bytes (as requested) for its owner; 0 for a sharer
	Block    uint64 // the allocator block's bytes for the owner; 0 for a sharer
	Elements uint64 // the storage's elements for the owner; 0 for a sharer or a raw buffer
}

// Unnamed is a live allocation that no name reaches.
type Unnamed struct {
	Seq          uint64 // the allocation's sequence number
	Bytes, Block uint64
}

// Device is one device's report. Allocated = Used + Rounding + UnnamedBytes
// + Other, where Other is 0 unless the allocator holds blocks that no live
// handle owns.
type Device struct {
	Device       string
	Rows         []Row
	Used         uint64 // Σ owners' Bytes: MemReporter's "Used Memory"
	Elements     uint64 // Σ owners' Elements: MemReporter's "Total Tensors"
	Allocated    uint64 // the allocator's allocated bytes (memory_allocated)
	Rounding     uint64 // Σ owners' Block − Bytes: 512-byte rounding, unsplit blocks
	Unnamed      []Unnamed
	UnnamedBytes uint64 // Σ unnamed blocks
	Other        int64
}

// Collect builds the report of device ("" for every device that holds
// memory) from roots. Call Manager.Reclaim first for exact figures.
func Collect(m *backend.Manager, roots []refpath.Root, device string) []Device {
	var devs []string
	if device != "" {
		devs = []string{device}
	} else {
		for i := 0; i < m.NumGPUs(); i++ {
			devs = append(devs, m.GPU(i).Device().Name())
		}
		devs = append(devs, "cpu")
	}
	byDev := map[string]*Device{}
	for _, d := range devs {
		byDev[d] = &Device{Device: d}
	}

	// A storage's owner is the first holder the breadth-first walk reaches
	// (a shortest path) that is not a view, or the first holder if all are
	// views; every other holder shares it.
	hs := holders(roots)
	owner := map[*backend.Memory]string{}
	for _, h := range hs {
		mem := h.value.HeldMemory()
		if t, ok := h.value.(*tensor.Tensor); ok && t.IsView() {
			continue
		}
		if _, ok := owner[mem]; !ok {
			owner[mem] = h.path
		}
	}
	for _, h := range hs {
		if mem := h.value.HeldMemory(); owner[mem] == "" {
			owner[mem] = h.path
		}
	}
	for _, h := range hs {
		mem := h.value.HeldMemory()
		d := byDev[mem.Device()]
		if d == nil || mem.Released() {
			continue
		}
		r := Row{Name: h.path, DType: "buffer"}
		elemSize := uint64(0) // a raw buffer has no elements
		if t, ok := h.value.(*tensor.Tensor); ok {
			e := t.Engine()
			r.Shape, r.DType = e.Shape(), e.DType().String()
			elemSize = uint64(max(e.DType().Size(), 1))
		}
		if o := owner[mem]; o != h.path {
			r.Shares = o
		} else {
			r.Bytes, r.Block = mem.Size(), mem.BlockSize()
			if elemSize > 0 {
				r.Elements = mem.Size() / elemSize
			}
			d.Used += r.Bytes
			d.Elements += r.Elements
			d.Rounding += r.Block - min(r.Block, r.Bytes)
		}
		d.Rows = append(d.Rows, r)
	}
	m.Live(func(mem *backend.Memory) bool {
		if d := byDev[mem.Device()]; d != nil && !mem.Released() {
			if _, named := owner[mem]; !named {
				d.Unnamed = append(d.Unnamed, Unnamed{Seq: mem.Seq(), Bytes: mem.Size(), Block: mem.BlockSize()})
				d.UnnamedBytes += mem.BlockSize()
			}
		}
		return true
	})

	var out []Device
	for _, name := range devs {
		d := byDev[name]
		if a, err := m.Allocator(name); err == nil {
			d.Allocated = a.Allocated()
		}
		d.Other = int64(d.Allocated) - int64(d.Used+d.Rounding+d.UnnamedBytes)
		if device == "" && len(d.Rows) == 0 && len(d.Unnamed) == 0 && d.Allocated == 0 {
			continue
		}
		d.Rows = grouped(d.Rows)
		out = append(out, *d)
	}
	return out
}

// grouped orders rows so that each storage's owner is followed by the rows
// sharing it, owners in the order the walk reached them.
func grouped(rows []Row) []Row {
	idx := map[string]int{}
	var groups [][]Row
	for _, r := range rows {
		key := r.Name
		if r.Shares != "" {
			key = r.Shares
		}
		i, ok := idx[key]
		if !ok {
			i = len(groups)
			idx[key] = i
			groups = append(groups, nil)
		}
		if r.Shares == "" { // the owner leads its group
			groups[i] = append([]Row{r}, groups[i]...)
		} else {
			groups[i] = append(groups[i], r)
		}
	}
	out := rows[:0:0]
	for _, g := range groups {
		out = append(out, g...)
	}
	return out
}

// Roots returns the report's roots on thread: the user globals (tensors
// that are not views first, so a storage is named after its base tensor
// rather than a view of it, then by name), then the locals of every
// Starlark function running, innermost last, named fn:local.
func Roots(thread *starlark.Thread, globals starlark.StringDict) []refpath.Root {
	names := make([]string, 0, len(globals))
	for k := range globals {
		names = append(names, k)
	}
	rank := func(n string) int {
		if t, ok := globals[n].(*tensor.Tensor); ok && !t.IsView() {
			return 0
		}
		return 1
	}
	sort.Slice(names, func(i, j int) bool {
		ri, rj := rank(names[i]), rank(names[j])
		if ri != rj {
			return ri < rj
		}
		return names[i] < names[j]
	})
	roots := make([]refpath.Root, 0, len(names))
	for _, n := range names {
		roots = append(roots, refpath.Root{Name: n, Value: globals[n]})
	}
	for i := thread.CallStackDepth() - 1; i >= 0; i-- {
		fr := thread.DebugFrame(i)
		fn, ok := fr.Callable().(*starlark.Function)
		if !ok {
			continue
		}
		for j := 0; j < fr.NumLocals(); j++ {
			b, v := fr.Local(j)
			if v != nil {
				roots = append(roots, refpath.Root{Name: fn.Name() + ":" + b.Name, Value: v})
			}
		}
	}
	return roots
}

func reportBuiltin(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	var devV starlark.Value
	var verbose bool
	if err := starlark.UnpackArgs(b.Name(), args, kwargs, "device?", &devV, "verbose?", &verbose); err != nil {
		return nil, err
	}
	e, err := env.Of(thread, b.Name())
	if err != nil {
		return nil, err
	}
	device := ""
	switch v := devV.(type) {
	case nil, starlark.NoneType:
	case starlark.Int:
		i, ok := v.Int64()
		if !ok || i < 0 || i >= int64(e.Manager.NumGPUs()) {
			return nil, fmt.Errorf("%s: for parameter device: invalid device ordinal %s (%d CUDA devices)", b.Name(), v, e.Manager.NumGPUs())
		}
		device = e.Manager.GPU(int(i)).Device().Name()
	case starlark.String:
		device, err = e.Manager.Canonical(string(v))
		if err != nil {
			return nil, fmt.Errorf("%s: for parameter device: %v", b.Name(), err)
		}
	default:
		return nil, fmt.Errorf("%s: for parameter device: got %s, want None, int or string", b.Name(), devV.Type())
	}
	if e.Session == nil {
		return nil, fmt.Errorf("%s: no memsh session", b.Name())
	}
	e.Manager.Reclaim()
	devs := Collect(e.Manager, Roots(thread, e.Session.UserGlobals(thread)), device)
	Write(e.Out, devs, verbose)
	return starlark.None, nil
}

const width = 84

// Write prints devices in MemReporter's layout.
func Write(w io.Writer, devs []Device, verbose bool) {
	if len(devs) == 0 {
		fmt.Fprintln(w, "No tensors or buffers on any device")
		return
	}
	rule := strings.Repeat("-", width)
	for _, d := range devs {
		if verbose {
			fmt.Fprintf(w, "%-40s%20s%10s%14s%14s\n", "Element type", "Size", "Dtype", "Used MEM", "Block")
		} else {
			fmt.Fprintf(w, "%-40s%20s%10s%14s\n", "Element type", "Size", "Dtype", "Used MEM")
		}
		fmt.Fprintln(w, rule)
		fmt.Fprintf(w, "Storage on %s\n", d.Device)
		for _, r := range d.Rows {
			name := r.Name
			if r.Shares != "" {
				name += "(->" + r.Shares + ")"
			}
			size := "-"
			if r.Shape != nil {
				size = shape(r.Shape)
			}
			fmt.Fprintf(w, "%-40s%20s%10s%14s", name, size, r.DType, backend.FormatBytes(int64(r.Bytes)))
			if verbose {
				fmt.Fprintf(w, "%14s", backend.FormatBytes(int64(r.Block)))
			}
			fmt.Fprintln(w)
		}
		if verbose {
			for _, u := range d.Unnamed {
				fmt.Fprintf(w, "%-40s%20s%10s%14s%14s\n", fmt.Sprintf("<unnamed allocation #%d>", u.Seq), "-", "-",
					backend.FormatBytes(int64(u.Bytes)), backend.FormatBytes(int64(u.Block)))
			}
		}
		fmt.Fprintln(w, rule)
		fmt.Fprintf(w, "Total Tensors: %d  Used Memory: %s\n", d.Elements, backend.FormatBytes(int64(d.Used)))
		fmt.Fprintf(w, "The allocated memory on %s: %s\n", d.Device, backend.FormatBytes(int64(d.Allocated)))
		if gap := int64(d.Allocated) - int64(d.Used); gap != 0 {
			var parts []string
			if d.Rounding > 0 {
				parts = append(parts, backend.FormatBytes(int64(d.Rounding))+" rounding up to allocator blocks (512-byte granularity, unsplit blocks)")
			}
			if len(d.Unnamed) > 0 {
				parts = append(parts, fmt.Sprintf("%s in %d allocation%s no name reaches (temporaries of the running statement, memory held outside Starlark)",
					backend.FormatBytes(int64(d.UnnamedBytes)), len(d.Unnamed), plural(len(d.Unnamed))))
			}
			if d.Other != 0 {
				parts = append(parts, backend.FormatBytes(d.Other)+" not owned by any live handle")
			}
			fmt.Fprintf(w, "Memory differs by %s: %s\n", backend.FormatBytes(gap), strings.Join(parts, "; "))
		}
		fmt.Fprintln(w, rule)
	}
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}

func shape(s []int) string {
	parts := make([]string, len(s))
	for i, n := range s {
		parts[i] = fmt.Sprint(n)
	}
	if len(s) == 1 {
		return "(" + parts[0] + ",)"
	}
	return "(" + strings.Join(parts, ", ") + ")"
}
