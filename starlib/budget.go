package starlib

import (
	"fmt"
	"io"

	"go.starlark.net/starlark"

	"github.com/memsh/memsh/backend"
	"github.com/memsh/memsh/env"
)

// A Budget is a limit on the peak allocated bytes of GPUs, as
// pytest-memray's limit_memory: after every top-level statement, and when
// an experiment or trial finishes, the exact peak of each watched device
// over that statement or block is compared with the limit. Each violation
// is printed to the session's error stream as it is found, naming the
// offending experiment or trial (and the statement it finished in) or the
// top-level statement (file:line), with its peak; the run goes on, and the
// CLI exits with status 3 at the end (BudgetExceeded). Peaks are of
// allocated bytes, absolute (not above the start of the statement), with
// garbage reclaimed at each statement start. Only new highs are reported:
// the first statement or block that went over, then any that went higher
// (live memory above the limit would otherwise name every later
// statement); and a statement in which an experiment or trial already
// exceeded is not reported again.
//
// budget(bytes, device=None) starts one from a script; memsh's
// --max-peak SIZE starts one before the script runs.
type Budget struct {
	Limit  uint64
	Device string // "" for every GPU

	e          *env.Env
	w          io.Writer
	peaks      []*backend.Peak // per watched GPU, reset at each statement start
	gpus       []backend.Allocator
	stmt       string // "file:line" of the running statement
	reported   bool   // a violation was reported in the running statement
	Violations []string
	Max        uint64 // the largest peak seen over any statement
	worst      uint64 // the largest peak reported
	remove     []func()
}

const budgetsKey = "budgets"

// StartBudget starts a budget of limit bytes on device ("" for every GPU)
// of e's Session; violations are printed to w (nil: e.Err).
func StartBudget(e *env.Env, limit uint64, device string, w io.Writer) (*Budget, error) {
	if e.Session == nil {
		return nil, fmt.Errorf("budget: no memsh session")
	}
	if w == nil {
		w = e.Err
	}
	b := &Budget{Limit: limit, Device: device, e: e, w: w}
	m := e.Manager
	m.Reclaim() // garbage is not part of what is measured
	for i := 0; i < m.NumGPUs(); i++ {
		a := m.GPU(i)
		if device == "" || a.Device().Name() == device {
			b.gpus = append(b.gpus, a)
			b.peaks = append(b.peaks, a.Peaks().New(a.Allocated(), a.Reserved()))
		}
	}
	if device != "" && len(b.gpus) == 0 {
		return nil, fmt.Errorf("budget: no device %q", device)
	}
	b.remove = append(b.remove, e.Session.OnStatement(b.onStatement), e.Session.OnFinish(b.onFinish))
	bs, _ := e.Values[budgetsKey].([]*Budget)
	e.Values[budgetsKey] = append(bs, b)
	return b, nil
}

// Stop ends the budget; what it found stays readable.
func (b *Budget) Stop() {
	for _, f := range b.remove {
		f()
	}
	b.remove = nil
	for _, p := range b.peaks {
		p.Close()
	}
}

// Exceeded reports whether some statement or block went over the limit.
func (b *Budget) Exceeded() bool { return len(b.Violations) > 0 }

// BudgetExceeded reports whether any budget of e's Session was exceeded.
func BudgetExceeded(e *env.Env) bool {
	bs, _ := e.Values[budgetsKey].([]*Budget)
	for _, b := range bs {
		if b.Exceeded() {
			return true
		}
	}
	return false
}

func (b *Budget) onStatement(ev env.StatementEvent) {
	if ev.Start {
		// Garbage left by earlier statements would count in the
		// figures the counters start from: a reference-counted run
		// would have freed it.
		b.e.Manager.Reclaim()
		for i, p := range b.peaks {
			p.Reset(b.gpus[i].Allocated(), b.gpus[i].Reserved())
		}
		b.stmt = fmt.Sprintf("%s:%d", ev.Pos.Filename(), ev.Pos.Line)
		b.reported = false
		return
	}
	if b.stmt == "" { // started inside this statement: measured from then
		b.stmt = fmt.Sprintf("%s:%d", ev.Pos.Filename(), ev.Pos.Line)
	}
	for i, p := range b.peaks {
		b.Max = max(b.Max, p.MaxAllocated)
		if p.MaxAllocated > b.Limit && p.MaxAllocated > b.worst && !b.reported {
			b.violate(b.stmt, b.gpus[i].Device().Name(), p.MaxAllocated)
		}
	}
	b.stmt = ""
}

func (b *Budget) onFinish(ev env.FinishEvent) {
	if ev.Data == nil || b.reported {
		return
	}
	for _, g := range ev.Data.GPUs {
		if (b.Device == "" || g.Device == b.Device) && g.Peak > 0 && uint64(g.Peak) > b.Limit && uint64(g.Peak) > b.worst {
			where := fmt.Sprintf("%s %q", ev.Kind, ev.Name)
			if b.stmt != "" {
				where += " (" + b.stmt + ")"
			}
			b.violate(where, g.Device, uint64(g.Peak))
			return
		}
	}
}

func (b *Budget) violate(where, device string, peak uint64) {
	b.reported = true
	b.worst = max(b.worst, peak)
	msg := fmt.Sprintf("%s: %s peak allocated %s exceeds the budget of %s", where, device,
		backend.FormatBytes(int64(peak)), backend.FormatBytes(int64(b.Limit)))
	b.Violations = append(b.Violations, msg)
	fmt.Fprintln(b.w, "memsh: memory budget exceeded:", msg)
}

// budget(bytes, device=None) limits the peak allocated bytes of each GPU
// (or of device, e.g. "cuda:1") over every later top-level statement and
// every experiment or trial, as pytest-memray's limit_memory: each
// violation is reported on stderr, naming the statement (file:line) or
// block and its peak, and memsh exits with status 3 at the end. The
// statement calling budget() is measured from the call on.
func budgetBuiltin(thread *starlark.Thread, fn *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	var limit int64
	var device starlark.Value = starlark.None
	if err := starlark.UnpackArgs(fn.Name(), args, kwargs, "bytes", &limit, "device?", &device); err != nil {
		return nil, err
	}
	if limit <= 0 {
		return nil, fmt.Errorf("%s: bytes must be positive, got %d", fn.Name(), limit)
	}
	dev := ""
	switch d := device.(type) {
	case starlark.NoneType:
	case starlark.String:
		dev = string(d)
		if dev == "cuda" {
			dev = "cuda:0"
		}
	default:
		return nil, fmt.Errorf("%s: for parameter device: got %s, want str or None", fn.Name(), device.Type())
	}
	e, err := env.Of(thread, fn.Name())
	if err != nil {
		return nil, err
	}
	if _, err := StartBudget(e, uint64(limit), dev, nil); err != nil {
		return nil, fmt.Errorf("%s: %v", fn.Name(), err)
	}
	return starlark.None, nil
}
