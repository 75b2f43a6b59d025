package dist

import (
	"cmp"
	"fmt"

	"github.com/memsh/memsh/backend"
	"github.com/memsh/memsh/tensor"
	"github.com/memsh/memsh/tensor/autograd"
)

// FSDP2 (torch.distributed.fsdp.fully_shard) for one rank, as PyTorch
// 2.6's torch/distributed/fsdp/_fully_shard allocates on the device:
//
//   - fully_shard: a padded dim-0 shard per parameter (ceil(d0/N) rows, the
//     parameter's dtype, zero-filled), the sharded parameter a view of it.
//   - unshard (a group's forward, and its backward unless it stayed
//     unsharded): with a MixedPrecisionPolicy param_dtype, one flat cast
//     buffer of the group's padded shards (S elements) on the all-gather
//     copy-in stream; the all-gather buffer, N·S elements, on that stream
//     (the cast freed when the all-gather returns); then the copy-out: each
//     parameter's unsharded buffer, N × its padded shard in the compute
//     dtype on the current stream — allocated at the first unshard, its
//     storage resized back after — of which the unsharded parameter is a
//     view. In the forward the all-gather buffer is kept until the next
//     group's copy-out (the last one until the root's forward returns); in
//     the backward it is freed after the copy-out, and the group that ran
//     its forward before this one is prefetched (its all-gather buffer).
//   - reshard (after the forward with reshard_after_forward, which the
//     root never does, and after the backward): each unsharded buffer
//     resized to 0 bytes.
//   - post-backward (when the gradients of the group's inputs are about
//     to be computed, or at the end of the backward for a group without
//     such inputs, the root's): the unsharded gradients taken, the
//     parameters resharded, the previous group's reduce-scatter input
//     freed, this group's allocated (N·S elements of the reduce dtype,
//     current stream), the gradients copied in and freed, the
//     reduce-scatter output (S elements, reduce-scatter stream), cast to
//     the parameters' dtype if the reduce dtype differs; the sharded
//     gradients are views of it (added in place to existing ones). The
//     last reduce-scatter input is freed at the end of the backward.
//
// Streams: the all-gather and reduce-scatter buffers are allocated on
// streams of their own, so their blocks are cached apart from the
// compute stream's (reserved memory as PyTorch's); FSDP2 records no
// stream, so every free is immediate. Values: every rank's chunk of an
// all-gather is this rank's shard (the dist package's rule), so on a
// device with data the unsharded parameters are not the model's; the
// memory is exact.

// FSDPComm is what the groups under one root share (FSDPCommContext and
// the root state's bookkeeping).
type FSDPComm struct {
	copyIn, rs         backend.Stream
	streams            bool
	allGatherState     *tensor.Tensor // the forward's deferred all-gather buffer
	reduceScatterState *tensor.Tensor // the last reduce-scatter input
	postForwardOrder   []*FSDPGroup
	// Groups are the root's and the other states' groups, root first
	// (the final callback's order).
	Groups         []*FSDPGroup
	callbackQueued bool
	mark           backend.Mark
}

// NewFSDPComm returns the context the root makes at its lazy init.
func NewFSDPComm() *FSDPComm { return &FSDPComm{} }

// the groups' training states
const (
	stateIdle = iota
	stateForward
	statePreBackward
	statePostBackward
)

// FSDPGroup is the FSDPParamGroup of one fully_shard call: its managed
// parameters and their collectives.
type FSDPGroup struct {
	g      *Group
	Params []*FSDPParam
	mp     MixedPrecision
	// dev is the device the group computes on (its parameters' when
	// fully_shard ran); off its offload policy
	dev string
	off CPUOffload
	// ReshardAfterForward: the group frees its unsharded parameters
	// after its forward (the root's lazy init turns it off for the root).
	ReshardAfterForward bool
	Comm                *FSDPComm

	agResult        *tensor.Tensor // a pending all-gather's output
	unsharded       bool
	state           int
	postForwardIdx  []int
	reducedThisPass bool
	mark            backend.Mark
}

// NewFSDPGroup shards params (fully_shard's managed parameters, in
// order, on one device); set[i] puts a parameter where params[i] is held
// (on an error the caller puts params back with it); off is the offload
// policy.
func (g *Group) NewFSDPGroup(params []*tensor.Tensor, set []func(*tensor.Tensor) error, mp MixedPrecision, reshardAfterForward bool, off CPUOffload) (*FSDPGroup, error) {
	fg := &FSDPGroup{g: g, mp: mp, ReshardAfterForward: reshardAfterForward, dev: params[0].Device(), off: off}
	var made []*tensor.Tensor
	for i, p := range params {
		release := p.Context().Hold(made...)
		fp, err := newFSDPParam(p, g.Rank, g.Size, set[i], off)
		release()
		if err != nil {
			// the caller puts the parameters back
			tensor.Dropped(made...)
			return nil, err
		}
		made = append(made, fp.padded)
		fg.Params = append(fg.Params, fp)
	}
	return fg, nil
}

// InBackward reports whether the group is in its pre-backward (a forward
// then is activation checkpointing's recomputation, which the
// pre-backward's unshard serves).
func (fg *FSDPGroup) InBackward() bool { return fg.state == statePreBackward }

func (fg *FSDPGroup) ctx() *tensor.Context { return fg.Params[0].padded.Context() }

// Device is the device the group computes on: its all-gathers and
// reduce-scatters run there (the shards are on the host with offload).
func (fg *FSDPGroup) Device() string { return fg.dev }

// CheckOffload is lazy init's _validate_cpu_offload_params: with offload,
// every shard must be in host memory (a model built on the meta device
// materialized with to_empty(device="cpu")).
func (fg *FSDPGroup) CheckOffload() error {
	if !fg.off.Enabled {
		return nil
	}
	n, first := 0, ""
	for _, p := range fg.Params {
		if d := p.padded.Device(); d != "cpu" {
			n, first = n+1, cmp.Or(first, d)
		}
	}
	if n > 0 {
		return fmt.Errorf("FSDP parameters should be materialized on CPU when enabling CPU offloading. For example, load a CPU state dict or call module.to_empty(device=\"cpu\"). Found %d parameters on non-CPU device %s", n, first)
	}
	return nil
}

// onStream runs f with s the current stream of the group's device (the
// current one when the device has no streams).
func (fg *FSDPGroup) onStream(s backend.Stream, f func() error) error {
	if fg.Comm == nil || !fg.Comm.streams {
		return f()
	}
	mgr := fg.ctx().Manager
	var prev backend.Stream
	if err := mgr.Streams(fg.Device(), func(sa backend.StreamAllocator) error {
		var err error
		prev, err = sa.SetCurrentStream(s)
		return err
	}); err != nil {
		return err
	}
	defer mgr.Streams(fg.Device(), func(sa backend.StreamAllocator) error { //nolint:errcheck // restoring the stream it was
		_, err := sa.SetCurrentStream(prev)
		return err
	})
	return f()
}

// LazyInit makes the comm context's streams (FSDPCommContext.lazy_init).
func (c *FSDPComm) LazyInit(ctx *tensor.Context, device string) {
	if c.streams || ctx == nil || ctx.Manager == nil {
		return
	}
	_ = ctx.Manager.Streams(device, func(sa backend.StreamAllocator) error {
		c.copyIn, c.rs = sa.NewStream(), sa.NewStream()
		c.streams = true
		return nil
	})
}

// s is the group's padded shard elements.
func (fg *FSDPGroup) totalShard() int {
	n := 0
	for _, p := range fg.Params {
		n += p.s
	}
	return n
}

// agDType is the all-gather's dtype: the compute dtype (one per group).
func (fg *FSDPGroup) agDType() tensor.DType { return fg.Params[0].computeDType(fg.mp) }

// Unshard is FSDPParamGroup.unshard: the all-gather (nothing when the
// group is unsharded or one is pending).
func (fg *FSDPGroup) Unshard() error {
	if fg.unsharded || fg.agResult != nil {
		return nil
	}
	ctx, dev := fg.ctx(), fg.Device()
	n, S := fg.g.Size, fg.totalShard()
	stream := fg.Comm.copyIn
	return fg.onStream(stream, func() error {
		ins, srcs, err := fg.allGatherInputs()
		release := ctx.Hold(ins...)
		var out *tensor.Tensor
		if err == nil {
			out, err = tensor.Empty(ctx, []int{n * S}, fg.agDType(), dev)
		}
		release()
		if err == nil && out.HasData() {
			err = fg.fillAllGather(out, S, srcs)
		}
		tensor.Dropped(ins...) // freed when foreach_all_gather returns
		if err != nil {
			tensor.Dropped(out)
			return err
		}
		fg.agResult = out
		fg.Comm.changed(ctx)
		return nil
	})
}

// allGatherInputs is _get_param_all_gather_inputs: the tensors it
// allocates on the copy-in stream (ins) and each parameter's all-gather
// input (srcs). Without offload: with a param_dtype cast, one flat buffer
// of S elements that a foreach copy casts the shards into (the fast
// path); otherwise the shards themselves. With offload (no fast path):
// per parameter its shard copied to the device, then cast, the copy
// freed once the cast exists.
func (fg *FSDPGroup) allGatherInputs() (ins, srcs []*tensor.Tensor, err error) {
	ctx, dev := fg.ctx(), fg.Device()
	casts := fg.Params[0].castsForAllGather(fg.mp)
	if !fg.off.Enabled {
		for _, p := range fg.Params {
			srcs = append(srcs, p.padded)
		}
		if casts {
			c, err := tensor.Empty(ctx, []int{fg.totalShard()}, fg.mp.ParamDType, dev)
			if err != nil {
				return nil, nil, err
			}
			ins = append(ins, c)
		}
		return ins, srcs, nil
	}
	release := ctx.Hold()
	defer release()
	for _, p := range fg.Params {
		d, err := tensor.To(p.padded, dev, tensor.Undefined, false)
		if err == nil && casts {
			ctx.Hold(d)
			var c *tensor.Tensor
			c, err = tensor.To(d, "", fg.mp.ParamDType, false)
			tensor.Dropped(d)
			d = c
		}
		if err != nil {
			tensor.Dropped(ins...)
			return nil, nil, err
		}
		ctx.Hold(d)
		ins = append(ins, d)
	}
	return ins, ins, nil
}

// fillAllGather writes every rank's chunk: this rank's all-gather inputs
// srcs (each rank holding the same values, as the dist package assumes).
func (fg *FSDPGroup) fillAllGather(out *tensor.Tensor, S int, srcs []*tensor.Tensor) error {
	rows, err := tensor.View(out, []int{fg.g.Size, S})
	if err != nil {
		return err
	}
	off := 0
	for i, p := range fg.Params {
		src, err := tensor.View(srcs[i], []int{1, p.s})
		if err != nil {
			return err
		}
		dst, err := tensor.Narrow(rows, 1, off, p.s)
		if err == nil {
			src, err = tensor.Expand(src, []int{fg.g.Size, p.s})
		}
		if err == nil {
			_, err = dst.Copy_(src)
		}
		if err != nil {
			return err
		}
		off += p.s
	}
	return nil
}

// WaitForUnshard is FSDPParamGroup.wait_for_unshard: in the forward, the
// previous group's all-gather buffer freed; the copy-out into the
// unsharded buffers; the all-gather buffer kept for the next group (in
// the forward) or freed.
func (fg *FSDPGroup) WaitForUnshard() error {
	out := fg.agResult
	if out == nil {
		return nil
	}
	ctx := fg.ctx()
	c := fg.Comm
	if fg.state == stateForward && c.allGatherState != nil {
		tensor.Dropped(c.allGatherState)
		c.allGatherState = nil
		c.changed(ctx)
	}
	release := ctx.Hold(out)
	off := 0
	for _, p := range fg.Params {
		if err := p.copyOut(out, fg.g.Size, off, fg.agDType(), autograd.RequiresGrad(p.Sharded)); err != nil {
			release()
			return err
		}
		off += p.s
	}
	release()
	fg.unsharded = true
	fg.agResult = nil
	if fg.state == stateForward {
		c.allGatherState = out
	} else {
		tensor.Dropped(out)
	}
	c.changed(ctx)
	return nil
}

// Reshard frees the unsharded buffers and puts the sharded parameters
// back.
func (fg *FSDPGroup) Reshard() error {
	if !fg.unsharded {
		return nil
	}
	for _, p := range fg.Params {
		if err := p.free(); err != nil {
			return err
		}
	}
	fg.unsharded = false
	if fg.Comm != nil {
		fg.Comm.changed(fg.ctx())
	}
	return nil
}

// PreForward is FSDPParamGroup.pre_forward: unshard and wait (nothing in
// a checkpoint's recomputation during the backward).
func (fg *FSDPGroup) PreForward() error {
	if fg.state == statePreBackward {
		return nil
	}
	fg.state = stateForward
	if err := fg.Unshard(); err != nil {
		return err
	}
	return fg.WaitForUnshard()
}

// PostForward is FSDPParamGroup.post_forward: reshard (with
// ReshardAfterForward) and record the group's place in the forward order.
func (fg *FSDPGroup) PostForward() error {
	if fg.state == statePreBackward {
		return nil
	}
	if fg.ReshardAfterForward {
		if err := fg.Reshard(); err != nil {
			return err
		}
	}
	c := fg.Comm
	fg.postForwardIdx = append(fg.postForwardIdx, len(c.postForwardOrder))
	c.postForwardOrder = append(c.postForwardOrder, fg)
	fg.state = stateIdle
	return nil
}

// RootPostForward is what the root does after its forward: the last
// group's all-gather buffer freed.
func (c *FSDPComm) RootPostForward(ctx *tensor.Context) {
	if c.allGatherState != nil {
		tensor.Dropped(c.allGatherState)
		c.allGatherState = nil
		c.changed(ctx)
	}
}

// changed tells the Manager that what the context holds changed (and
// what its groups hold, which a walk may have met apart).
func (c *FSDPComm) changed(ctx *tensor.Context) {
	marks := []*backend.Mark{&c.mark}
	for _, fg := range c.Groups {
		marks = append(marks, &fg.mark)
	}
	tensor.NoteHeld(ctx, marks...)
}

// Reach walks the context's buffers (tensor.ReachRoot).
func (c *FSDPComm) Reach(r *tensor.Reacher) {
	if !r.Visit(&c.mark) {
		return
	}
	r.Tensor(c.allGatherState)
	r.Tensor(c.reduceScatterState)
	for _, fg := range c.Groups {
		fg.Reach(r)
	}
}

// Reach walks the group's parameters and buffers.
func (fg *FSDPGroup) Reach(r *tensor.Reacher) {
	if !r.Visit(&fg.mark) {
		return
	}
	r.Tensor(fg.agResult)
	for _, p := range fg.Params {
		r.Tensor(p.padded)
		r.Tensor(p.Sharded)
		r.Tensor(p.buf)
		r.Tensor(p.Unsharded)
	}
	if fg.Comm != nil {
		fg.Comm.Reach(r)
	}
}

// CommTensors calls fn with the collectives' buffers alive now
// (memtrack.CommHolder): the pending and deferred all-gather buffers and
// the last reduce-scatter input.
func (c *FSDPComm) CommTensors(fn func(*tensor.Tensor)) {
	for _, t := range []*tensor.Tensor{c.allGatherState, c.reduceScatterState} {
		if t != nil {
			fn(t)
		}
	}
	for _, fg := range c.Groups {
		if fg.agResult != nil {
			fn(fg.agResult)
		}
	}
}
