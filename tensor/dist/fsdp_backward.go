package dist

import (
	"github.com/memsh/memsh/tensor"
	"github.com/memsh/memsh/tensor/autograd"
)

// FSDP2's backward (see fsdp.go): the pre-backward's unshard and
// prefetch, the post-backward's reduce-scatter, the root's final
// callback.

// PreBackward is FSDPParamGroup.pre_backward: unshard and wait, then
// prefetch the group whose forward ran before this one (its all-gather).
func (fg *FSDPGroup) PreBackward() error {
	if fg.state == statePreBackward {
		return nil
	}
	fg.state = statePreBackward
	if err := fg.Unshard(); err != nil {
		return err
	}
	if err := fg.WaitForUnshard(); err != nil {
		return err
	}
	if k := len(fg.postForwardIdx); k > 0 {
		i := fg.postForwardIdx[k-1]
		fg.postForwardIdx = fg.postForwardIdx[:k-1]
		if i > 0 {
			t := fg.Comm.postForwardOrder[i-1]
			prev := t.state
			t.state = statePreBackward
			err := t.Unshard()
			t.state = prev
			return err
		}
	}
	return nil
}

// PostBackward is FSDPParamGroup.post_backward with foreach_reduce.
func (fg *FSDPGroup) PostBackward() error {
	if fg.state == statePostBackward {
		return nil
	}
	fg.state = statePostBackward
	ctx, dev := fg.ctx(), fg.Device()
	c := fg.Comm
	var withGrad []*FSDPParam
	var grads []*tensor.Tensor
	// the local list unsharded_grads holds the gradients until they are
	// copied into the reduce-scatter input
	release := ctx.Hold()
	for _, p := range fg.Params {
		if p.Unsharded == nil {
			continue
		}
		if gr := autograd.Grad(p.Unsharded); gr != nil {
			if TPGradView(gr) {
				// redistributed to the parameter's placement: a clone
				rows, err := tensor.Clone(gr)
				if err != nil {
					release()
					return err
				}
				tensor.Dropped(gr)
				gr = rows
			}
			withGrad = append(withGrad, p)
			grads = append(grads, gr)
			ctx.Hold(gr)
			if err := autograd.SetGrad(p.Unsharded, nil); err != nil {
				release()
				return err
			}
			p.Unsharded.ReachChanged()
		}
	}
	held := true
	letGo := func() {
		if held {
			release()
			tensor.Dropped(grads...)
			clear(grads) // no Go reference keeps them
			held = false
		}
	}
	defer letGo()
	if err := fg.Reshard(); err != nil {
		return err
	}
	if c.reduceScatterState != nil {
		tensor.Dropped(c.reduceScatterState)
		c.reduceScatterState = nil
		c.changed(ctx)
	}
	if len(withGrad) == 0 {
		return nil
	}
	n := fg.g.Size
	S := 0
	for _, p := range withGrad {
		S += p.s
	}
	rdt := fg.mp.ReduceDType
	if rdt == tensor.Undefined {
		rdt = grads[0].DType()
	}
	in, err := tensor.Empty(ctx, []int{n * S}, rdt, dev)
	if err != nil {
		return err
	}
	if in.HasData() {
		if err := chunkCat(in, grads, withGrad, n, S); err != nil {
			return err
		}
	}
	letGo() // unsharded_grads.clear()
	releaseIn := ctx.Hold(in)
	defer releaseIn()
	var out *tensor.Tensor
	if err := fg.onStream(c.rs, func() error {
		o, err := tensor.Empty(ctx, []int{S}, rdt, dev)
		if err != nil {
			return err
		}
		if o.HasData() {
			// reduce-scatter, averaged over the ranks: this rank's chunk
			src, err := tensor.View(in, []int{n, S})
			if err == nil {
				src, err = tensor.Select(src, 0, fg.g.Rank)
			}
			if err == nil {
				_, err = o.Copy_(src)
			}
			if err != nil {
				return err
			}
		}
		if pdt := withGrad[0].dtype; pdt != rdt {
			release := ctx.Hold(o)
			cast, err := tensor.To(o, "", pdt, false)
			release()
			tensor.Dropped(o)
			if err != nil {
				return err
			}
			o = cast
		}
		out = o
		return nil
	}); err != nil {
		return err
	}
	used := false
	releaseOut := ctx.Hold(out)
	defer releaseOut()
	off := 0
	for _, p := range withGrad {
		v, err := tensor.Narrow(out, 0, off, p.localNumel())
		if err == nil {
			v, err = tensor.View(v, p.Sharded.Shape())
		}
		if err != nil {
			return err
		}
		off += p.s
		old := autograd.Grad(p.Sharded)
		if fg.off.Enabled {
			// the view copied to the host (non-blocking into pinned
			// memory unless it is added to a gradient); no view of the
			// reduce-scatter output survives
			if v, err = tensor.To(v, "cpu", tensor.Undefined, false); err != nil {
				return err
			}
		}
		if old != nil {
			_, err := old.Add_(v)
			if fg.off.Enabled {
				tensor.Dropped(v)
			}
			if err != nil {
				return err
			}
			continue
		}
		if err := autograd.SetGrad(p.Sharded, v); err != nil {
			return err
		}
		p.Sharded.ReachChanged()
		if !fg.off.Enabled {
			used = true // a view of out is the gradient
		}
	}
	releaseOut()
	if !used {
		tensor.Dropped(out)
	}
	c.reduceScatterState = in
	c.changed(ctx)
	return nil
}

// chunkCat is _chunk_cat's copy-in: each gradient padded to its shard's
// N rows and split, rank r's chunks side by side in row r.
func chunkCat(in *tensor.Tensor, grads []*tensor.Tensor, ps []*FSDPParam, n, S int) error {
	rows, err := tensor.View(in, []int{n, S})
	if err != nil {
		return err
	}
	if _, err := rows.Zero_(); err != nil {
		return err
	}
	off := 0
	for i, p := range ps {
		flat, err := tensor.Reshape(grads[i], []int{grads[i].Numel()})
		if err != nil {
			return err
		}
		for r := range n {
			lo := min(r*p.s, flat.Numel())
			hi := min(lo+p.s, flat.Numel())
			if hi <= lo {
				break
			}
			src, err := tensor.Narrow(flat, 0, lo, hi-lo)
			if err != nil {
				return err
			}
			row, err := tensor.Select(rows, 0, r)
			if err == nil {
				row, err = tensor.Narrow(row, 0, off, hi-lo)
			}
			if err == nil {
				_, err = row.Copy_(src)
			}
			if err != nil {
				return err
			}
		}
		off += p.s
	}
	return nil
}

// PostBackwardPending reports whether the final callback must run the
// group's post-backward: it is still unsharded (the root; a group kept
// unsharded after its forward whose inputs needed no gradient).
func (fg *FSDPGroup) PostBackwardPending() bool { return fg.unsharded }

// FinalizeBackward ends the group's backward: an unconsumed prefetch
// freed, the forward order forgotten.
func (fg *FSDPGroup) FinalizeBackward() {
	if fg.agResult != nil {
		tensor.Dropped(fg.agResult)
		fg.agResult = nil
		fg.Comm.changed(fg.ctx())
	}
	fg.postForwardIdx = nil
	fg.state = stateIdle
}

// QueueFinalCallback queues the root's final callback once per backward
// (FSDPState._register_root_post_backward_final_callback): each group
// still unsharded runs its post-backward, every group finalizes, and the
// last reduce-scatter input is freed.
func (c *FSDPComm) QueueFinalCallback(ctx *tensor.Context) error {
	if c.callbackQueued {
		return nil
	}
	c.callbackQueued = true
	return autograd.QueueCallback(ctx, func() error {
		defer func() { c.callbackQueued = false }()
		for _, fg := range c.Groups {
			if fg.PostBackwardPending() {
				if err := fg.PostBackward(); err != nil {
					return err
				}
			}
		}
		for _, fg := range c.Groups {
			fg.FinalizeBackward()
		}
		c.postForwardOrder = nil
		if c.reduceScatterState != nil {
			tensor.Dropped(c.reduceScatterState)
			c.reduceScatterState = nil
			c.changed(ctx)
		}
		return nil
	})
}
