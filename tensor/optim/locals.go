package optim

import (
	"slices"

	"github.com/memsh/memsh/tensor"
)

// frame emulates a Python function's local variables that hold tensors or
// lists of tensors, so that an optimizer's temporaries live exactly as
// long as PyTorch's: a variable keeps its value until it is rebound or
// deleted, or the function returns, and a tensor is freed when nothing in
// the frame holds it any more. The frame is a root of the reclaim's reach
// walk while it is open (the walk sees what the variables hold), and a
// tensor the frame's code made (made = true, or build) is handed back to
// the Manager (tensor.Dropped) when the last variable lets go of it: a
// tensor it did not make (a gradient, a state) is only unbound.
type frame struct {
	ctx      *tensor.Context
	names    []string // in order of first binding: Python frees its locals in that order at return
	vars     map[string]*tensor.Tensor
	lists    map[string][]*tensor.Tensor
	building []*tensor.Tensor // a list comprehension's elements so far
	made     map[*tensor.Tensor]bool
	release  func()
}

// newFrame opens a frame on ctx.
func newFrame(ctx *tensor.Context) *frame {
	f := &frame{ctx: ctx, vars: map[string]*tensor.Tensor{}, lists: map[string][]*tensor.Tensor{}, made: map[*tensor.Tensor]bool{}}
	if ctx != nil {
		f.release = ctx.Root(f)
	}
	return f
}

// Reach reports what the variables hold to the walk (tensor.ReachRoot).
func (f *frame) Reach(r *tensor.Reacher) {
	for _, n := range f.names {
		if t := f.vars[n]; t != nil {
			r.Tensor(t)
		}
		for _, t := range f.lists[n] {
			r.Tensor(t)
		}
	}
	for _, t := range f.building {
		r.Tensor(t)
	}
}

func (f *frame) declare(name string) {
	if !slices.Contains(f.names, name) {
		f.names = append(f.names, name)
	}
}

// set binds name to t (Python's `name = t`; t nil binds a non-tensor):
// the previous value is let go after t is bound, as Python's assignment
// does. made says whether the frame's code made t.
func (f *frame) set(name string, t *tensor.Tensor, made bool) {
	f.declare(name)
	old := f.vars[name]
	f.vars[name] = t
	if made && t != nil {
		f.made[t] = true
	}
	f.letGo(old)
}

// get returns name's tensor (nil when unbound).
func (f *frame) get(name string) *tensor.Tensor { return f.vars[name] }

// del unbinds name (`del name`).
func (f *frame) del(name string) {
	old := f.vars[name]
	delete(f.vars, name)
	f.letGo(old)
	if ts, ok := f.lists[name]; ok {
		delete(f.lists, name)
		f.letGoList(ts)
	}
}

// build adds t, which the frame's code made, to the list being built (a
// list comprehension or a foreach op's result list, element by element).
func (f *frame) build(t *tensor.Tensor) {
	f.building = append(f.building, t)
	f.made[t] = true
}

// setList binds name to the list built since the last setList and lets
// go of the list name held (its elements last first, as CPython frees a
// list).
func (f *frame) setList(name string) []*tensor.Tensor {
	f.declare(name)
	ts := f.building
	f.building = nil
	old := f.lists[name]
	f.lists[name] = ts
	f.letGoList(old)
	return ts
}

// aliasList binds dst to src's list (`dst = src`).
func (f *frame) aliasList(dst, src string) {
	f.declare(dst)
	old := f.lists[dst]
	f.lists[dst] = f.lists[src]
	f.letGoList(old)
}

// list returns name's list.
func (f *frame) list(name string) []*tensor.Tensor { return f.lists[name] }

func (f *frame) letGoList(ts []*tensor.Tensor) {
	for i := len(ts) - 1; i >= 0; i-- {
		f.letGo(ts[i])
	}
}

// holds reports whether a variable, a list or the list being built holds t.
func (f *frame) holds(t *tensor.Tensor) bool {
	for _, v := range f.vars {
		if v == t {
			return true
		}
	}
	for _, l := range f.lists {
		if slices.Contains(l, t) {
			return true
		}
	}
	return slices.Contains(f.building, t)
}

// letGo frees t when nothing in the frame holds it and the frame made it.
func (f *frame) letGo(t *tensor.Tensor) {
	if t == nil || f.holds(t) || !f.made[t] {
		return
	}
	delete(f.made, t)
	tensor.Dropped(t)
	if f.ctx != nil && f.ctx.Manager != nil {
		f.ctx.Manager.NoteHeldGarbage() // the frame, a root, alone held it
	}
}

// close is the function's return: the variables are let go in the order
// they were first bound, and the frame stops being a root.
func (f *frame) close() {
	for _, n := range f.names {
		f.del(n)
	}
	b := f.building
	f.building = nil
	f.letGoList(b)
	if f.release != nil {
		f.release()
		f.release = nil
	}
}
