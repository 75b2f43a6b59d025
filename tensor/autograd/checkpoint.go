package autograd

import (
	"fmt"
	"strings"
	"weak"

	"github.com/memsh/memsh/tensor"
)

// Activation checkpointing: PyTorch 2.x's non-reentrant
// torch.utils.checkpoint.checkpoint (use_reentrant=False), built, as there,
// on saved-tensor hooks (torch/utils/checkpoint.py: _checkpoint_hook,
// _CheckpointFrame, _recomputation_hook, with early stop on, the default).
//
// Forward: the tensor inputs are saved by an input-saver node
// (_NoopSaveInputs: through the hooks of an enclosing checkpoint, if any),
// then fn runs under the checkpoint's pack hook, which replaces every
// tensor a node saves by a holder owning no storage; so after the forward
// only the inputs (while the region's graph lives) and what fn's outputs
// keep stay alive. With preserveRNG the generator's state (host state) is
// stashed.
//
// Backward: the first unpack of any holder in a graph task (one Backward
// call) reruns fn with grad mode on, under the stashed generator state
// (the current one is restored afterwards: fork_rng) and under the
// recomputation hook, which gives the n-th tensor saved in the rerun to the
// n-th holder and stops the rerun as soon as the last holder has its
// tensor (early stop: ops after the last save do not run). The rerun's own
// graph and outputs are dropped. Each recomputed tensor is owned by its
// holder (PyTorch: a WeakKeyDictionary keyed by the holder's handle) and
// is let go when it is unpacked, so it lives until the node that unpacked
// it has run; one never unpacked goes with its holder when that node's
// saved tensors are released. The frame (and with it the saved inputs)
// lives as long as a saved tensor of the region does.

// CheckpointError is PyTorch's torch.utils.checkpoint.CheckpointError.
type CheckpointError struct{ Msg string }

func (e *CheckpointError) Error() string { return e.Msg }

// Checkpoint runs fn(inputs) as a checkpointed region and returns its
// result; in the backward, fn is called again with the same inputs to
// recompute what the region's nodes saved, and its result is dropped. fn
// must do the same ops each time. inputs are the region's tensor arguments
// (PyTorch saves only those; fn's other arguments are fn's to keep). With
// grad mode off fn just runs. Without any input requiring grad the region
// still records (parameters inside get gradients); PyTorch 2.x warns in
// that case only for use_reentrant=True, memsh never warns.
//
// keep, if not nil, is what fn holds besides inputs (the layer above's
// function and its other arguments): the frame keeps it for the reclaim's
// reach walk (tensor.Reacher.Value), as long as fn can be rerun.
func Checkpoint[T any](ctx *tensor.Context, inputs []*tensor.Tensor, fn func(inputs []*tensor.Tensor) (T, error), preserveRNG bool, keep any) (T, error) {
	var rng tensor.RNGSnapshot
	if preserveRNG {
		rng = ctx.SnapshotRNG()
	}
	if !GradEnabled(ctx) {
		return fn(inputs)
	}
	f := &ckptFrame{
		ctx:      ctx,
		keep:     keep,
		preserve: preserveRNG,
		rng:      rng,
		// The recomputation re-enters the forward's autocast state, as
		// torch.utils.checkpoint does (device_autocast_kwargs), so that it
		// saves what the forward saved.
		autocastOn:   ctx.Autocast != nil && ctx.Autocast.Enabled && !ctx.Autocast.Excluded,
		autocastDT:   ctx.AutocastOf().DType,
		isRecomputed: map[uint64]bool{},
		counter:      map[uint64]int{},
	}
	f.saver = &Node{name: "_NoopSaveInputsBackward", seq: seqCounter.Add(1), nOutputs: 1}
	for _, in := range inputs {
		f.saver.save(in)
	}
	f.recompute = func(ins []*tensor.Tensor) error {
		_, err := fn(ins)
		return err
	}
	var out T
	err := WithSavedTensorHooks(ctx, f.checkpointHooks(), func() error {
		var err error
		out, err = fn(inputs)
		return err
	})
	f.forwardDone = true
	return out, err
}

// ckptFrame is one checkpointed call (_CheckpointFrame).
type ckptFrame struct {
	ctx       *tensor.Context
	saver     *Node // its saved tensors are the inputs
	recompute func(inputs []*tensor.Tensor) error
	keep      any    // what recompute holds besides the inputs (Checkpoint)
	reached   uint64 // the epoch of the last reach walk that visited it
	preserve  bool
	rng       tensor.RNGSnapshot

	autocastOn bool         // autocast was on in the forward
	autocastDT tensor.DType // and its dtype

	holders      []weak.Pointer[ckptHolder] // one per tensor saved in the forward, in order
	metas        []savedMeta                // their shapes, dtypes, devices
	isRecomputed map[uint64]bool            // by graph task
	counter      map[uint64]int             // tensors saved so far by the rerun of a graph task
	forwardDone  bool
	ignoreSaved  bool // a backward inside the forward saw a mismatch (ignore_saved_mismatch)
}

// ckptHolder stands for one saved tensor (_Holder). handles holds, per
// graph task, the recomputed tensor; the key stays with a nil value once
// it has been unpacked.
type ckptHolder struct {
	handles map[uint64]*tensor.Tensor
	// owner is the node whose saved tensor the holder is (Node.save):
	// giving the holder its tensor or taking it changes what the node
	// reaches (changed).
	owner *Node
	// frame is the call the holder belongs to (the reclaim proof walks
	// its saved inputs through it; the unpack hook holds the frame as
	// long as the holder anyway).
	frame *ckptFrame
}

// stopRecomputation ends a rerun from inside the recomputation pack hook
// (_StopRecomputationError); err is set when the rerun failed.
type stopRecomputation struct {
	f   *ckptFrame
	err error
}

type savedMeta struct {
	shape  []int
	dtype  tensor.DType
	device string
}

func metaOfSaved(t *tensor.Tensor) savedMeta {
	return savedMeta{shape: t.Shape(), dtype: t.DType(), device: t.Device()}
}

func (m savedMeta) equal(o savedMeta) bool {
	return sameShape(m.shape, o.shape) && m.dtype == o.dtype && m.device == o.device
}

// String prints the metadata as PyTorch's metadata_fn dict.
func (m savedMeta) String() string {
	dev := fmt.Sprintf("device(type='%s')", m.device)
	if typ, idx, ok := strings.Cut(m.device, ":"); ok {
		dev = fmt.Sprintf("device(type='%s', index=%s)", typ, idx)
	}
	return fmt.Sprintf("{'shape': %s, 'dtype': torch.%s, 'device': %s}", sizeString(m.shape), m.dtype, dev)
}

// checkpointHooks are the forward's hooks (_checkpoint_hook).
func (f *ckptFrame) checkpointHooks() *SavedTensorHooks {
	return &SavedTensorHooks{
		Pack: func(t *tensor.Tensor) any {
			h := &ckptHolder{handles: map[uint64]*tensor.Tensor{}, frame: f}
			f.holders = append(f.holders, weak.Make(h))
			f.metas = append(f.metas, metaOfSaved(t))
			return h
		},
		Unpack: func(p any) (*tensor.Tensor, error) {
			h := p.(*ckptHolder)
			gid := currentGraphTask(f.ctx)
			if !f.isRecomputed[gid] {
				if err := f.rerun(gid); err != nil {
					return nil, err
				}
				f.isRecomputed[gid] = true
				if err := f.check(gid); err != nil {
					return nil, err
				}
			}
			t, ok := h.handles[gid]
			if !ok {
				return nil, &CheckpointError{"torch.utils.checkpoint: the recomputation did not produce this saved tensor"}
			}
			if t == nil {
				return nil, &CheckpointError{"torch.utils.checkpoint: Unpack is being triggered for a tensor that was already unpacked once. If you are calling ctx.saved_tensors in backward, make sure to do so only once. Otherwise please open an issue with details on your use case."}
			}
			h.handles[gid] = nil // the holder lets go: the caller's reference is the last
			f.changed(h)
			return t, nil
		},
	}
}

// changed tells the Manager that h's owner reaches other memory now
// (backend.Manager.NoteChanged): a walk that kept the frame that met the
// owner would not see the holder's new tensor.
func (f *ckptFrame) changed(h *ckptHolder) {
	if f.ctx == nil || f.ctx.Manager == nil {
		return
	}
	if h.owner == nil {
		f.ctx.Manager.NoteChanged(nil)
		return
	}
	f.ctx.Manager.NoteChanged(&h.owner.mark)
}

// recomputationHooks are the rerun's hooks (_recomputation_hook).
func (f *ckptFrame) recomputationHooks(gid uint64) *SavedTensorHooks {
	return &SavedTensorHooks{
		Pack: func(x *tensor.Tensor) any {
			if RequiresGrad(x) {
				x = Detach(x)
			}
			idx := f.counter[gid]
			f.counter[gid]++
			if idx >= len(f.holders) {
				if !f.forwardDone {
					f.ignoreSaved = true
					return x
				}
				panic(stopRecomputation{f, &CheckpointError{"torch.utils.checkpoint: trying to save more tensors during recomputation than during the original forward pass."}})
			}
			if h := f.holders[idx].Value(); h != nil {
				h.handles[gid] = x
				f.changed(h)
			}
			if f.counter[gid] == len(f.holders) {
				panic(stopRecomputation{f: f})
			}
			return Detach(x)
		},
		Unpack: func(p any) (*tensor.Tensor, error) { return p.(*tensor.Tensor), nil },
	}
}

// rerun recomputes the region for graph task gid.
func (f *ckptFrame) rerun(gid uint64) error {
	ins := make([]*tensor.Tensor, len(f.saver.saved))
	for i, s := range f.saver.saved {
		t, err := s.Unpack()
		if err != nil {
			return err
		}
		ins[i] = t
	}
	prevGrad := SetGradEnabled(f.ctx, true)
	defer SetGradEnabled(f.ctx, prevGrad)
	if f.preserve {
		cur := f.ctx.SnapshotRNG()
		f.ctx.RestoreRNG(f.rng)
		defer f.ctx.RestoreRNG(cur)
	}
	// What the recomputation allocates, the node that unpacked does not
	// hold: the tensors it saves go to the holders, the rest is garbage.
	defer f.ctx.Unheld()()
	run := func() error {
		return WithSavedTensorHooks(f.ctx, f.recomputationHooks(gid), func() (err error) {
			defer func() {
				if r := recover(); r != nil {
					s, ok := r.(stopRecomputation)
					if !ok || s.f != f {
						panic(r)
					}
					err = s.err
				}
			}()
			return f.recompute(ins)
		})
	}
	if f.autocastOn {
		return Autocast(f.ctx, true, f.autocastDT, run)
	}
	return run()
}

// check compares what the rerun saved with the forward
// (check_recomputed_tensors_match).
func (f *ckptFrame) check(gid uint64) error {
	if f.ignoreSaved {
		return nil
	}
	if f.counter[gid] != len(f.holders) {
		return &CheckpointError{fmt.Sprintf("torch.utils.checkpoint: A different number of tensors was saved during the original forward and recomputation.\nNumber of tensors saved during forward: %d\nNumber of tensors saved during recomputation: %d",
			len(f.holders), f.counter[gid])}
	}
	var diff strings.Builder
	for i, w := range f.holders {
		h := w.Value()
		if h == nil {
			continue
		}
		x := h.handles[gid]
		if x == nil {
			continue
		}
		if got := metaOfSaved(x); !got.equal(f.metas[i]) {
			fmt.Fprintf(&diff, "tensor at position %d:\nsaved metadata: %s\nrecomputed metadata: %s\n", i, f.metas[i], got)
		}
	}
	if diff.Len() > 0 {
		return &CheckpointError{"torch.utils.checkpoint: Recomputed values for the following tensors have different metadata than during the forward pass.\n" + diff.String()}
	}
	return nil
}
