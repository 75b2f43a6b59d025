package optim

import (
	"github.com/memsh/memsh/tensor"
)

// frame emulates a Python function's local tensor variables, so that an
// optimizer's temporaries live exactly as long as PyTorch's: a variable
// keeps its tensor until it is rebound or deleted, or the function
// returns, and a tensor is freed when no variable holds it any more. The
// frame is a root of the reclaim's reach walk while it is open (the walk
// sees what the variables hold), and a tensor the frame made (bind with
// made = true) is handed back to the Manager (tensor.Dropped) when its
// last variable lets go: a tensor it did not make (a gradient, a state)
// is only unbound.
type frame struct {
	ctx     *tensor.Context
	names   []string // in order of first binding: Python frees its locals in that order at return
	vars    map[string]*tensor.Tensor
	made    map[*tensor.Tensor]bool
	release func()
}

// newFrame opens a frame on ctx (nil: a frame that holds nothing, for
// optimizers with no tensors).
func newFrame(ctx *tensor.Context) *frame {
	f := &frame{ctx: ctx, vars: map[string]*tensor.Tensor{}, made: map[*tensor.Tensor]bool{}}
	if ctx != nil {
		f.release = ctx.Root(f)
	}
	return f
}

// Reach reports the variables' tensors to the walk (tensor.ReachRoot).
func (f *frame) Reach(r *tensor.Reacher) {
	for _, n := range f.names {
		if t := f.vars[n]; t != nil {
			r.Tensor(t)
		}
	}
}

// set binds name to t (Python's `name = t`): the previous value is let go
// after t is bound, as Python's assignment does. made says whether the
// frame's code made t.
func (f *frame) set(name string, t *tensor.Tensor, made bool) {
	old, seen := f.vars[name]
	if !seen {
		f.names = append(f.names, name)
	}
	f.vars[name] = t
	if made && t != nil {
		f.made[t] = true
	}
	f.letGo(old)
}

// get returns name's tensor (nil when unbound).
func (f *frame) get(name string) *tensor.Tensor { return f.vars[name] }

// del unbinds name (`del name`, or a name going out of use).
func (f *frame) del(name string) {
	old := f.vars[name]
	f.vars[name] = nil
	f.letGo(old)
}

// letGo frees t when no variable holds it and the frame made it.
func (f *frame) letGo(t *tensor.Tensor) {
	if t == nil {
		return
	}
	for _, v := range f.vars {
		if v == t {
			return
		}
	}
	if f.made[t] {
		delete(f.made, t)
		tensor.Dropped(t)
		if f.ctx != nil && f.ctx.Manager != nil {
			f.ctx.Manager.NoteGarbage()
		}
	}
}

// close is the function's return: the variables are let go in the order
// they were first bound, and the frame stops being a root.
func (f *frame) close() {
	for _, n := range f.names {
		f.del(n)
	}
	if f.release != nil {
		f.release()
		f.release = nil
	}
}
