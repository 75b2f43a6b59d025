package dist

import (
	"errors"
	"fmt"

	"github.com/memsh/memsh/backend"
	"github.com/memsh/memsh/tensor"
	"github.com/memsh/memsh/tensor/autograd"
)

// ZeRO stages 1 and 2 as DeepSpeed's DeepSpeedZeroOptimizer allocates on
// one rank (DeepSpeed 0.19, docs/reference/deepspeed_zero.md; rank r of
// N; one parameter group; e the model dtype's element size):
//
//   - Construction: each trainable parameter cast to the model dtype
//     (the new tensor, then the old one freed); the cached segments
//     released and the peak statistics reset (DeepSpeed's empty_cache);
//     the parameters flattened into one buffer of A elements, A = Ψ
//     rounded up to a multiple of 2N (a zero pad tensor first, freed), and
//     repointed as views into it (their storages freed); the fp32 master
//     copy of this rank's partition of P = A/N elements (a clone of the
//     partition, P·4 bytes, the clone freed); FusedAdam's 4-byte flag; a
//     zero fp32 gradient of the master made and freed.
//   - Backward: at the first gradient of each backward the reduce bucket,
//     reduce_bucket_size elements of the model dtype. Stage 2: each
//     gradient is copied into the bucket (its own tensor freed); a full
//     bucket, and the last one when the backward ends, is reduced — a
//     flat copy of it when it holds slices of two ranks' partitions or
//     more, all-reduced and freed — and the gradients of the parameters
//     that touch this rank's partition are copied into grads_in_partition
//     (their full sizes: G_r elements, allocated at the first copy), the
//     others dropped. Stage 1: the gradients stay full size until the
//     backward ends, then go through the bucket the same way in
//     parameter order. The bucket is freed when the backward ends.
//   - step: (with the overflow check, fp16 and bf16) per gradient view of
//     n elements a float copy, three bool masks and a float mask (11·n
//     bytes, freed); the norm's float64 copy of each view (8·n, freed);
//     the views concatenated (P·e, when more than one) and cast to fp32
//     (P·4), grads_in_partition freed; Adam's two moments (2·P·4) at the
//     first step; the fp32 gradient freed; the master copied into this
//     rank's partition and all-gathered in place.
//
// The collectives run on the current stream; memory is exact, values
// are not modelled beyond one rank (the dist package's rule).
type ZeRO struct {
	g      *Group
	stage  int
	dt     tensor.DType
	bucket int // reduce_bucket_size, elements
	check  bool
	params []*tensor.Tensor
	offs   []int // each parameter's offset in the flat buffer
	A, P   int
	flat   *tensor.Tensor
	master *tensor.Tensor
	flag   *tensor.Tensor // FusedAdam's _dummy_overflow_buf
	exp    [2]*tensor.Tensor
	norm   *tensor.Tensor // _global_grad_norm

	ipg      *tensor.Tensor // the reduce bucket while a backward runs
	ipgElems int
	ipgIdx   []int // the parameters in the bucket, in order
	large    []int // parameters larger than the bucket, reduced from their gradients
	gip      *tensor.Tensor
	gipOff   int
	averaged []*tensor.Tensor
	armed    bool // a backward's first gradient came (callback queued)
	index    map[*tensor.Tensor]int
	removes  []func()
	mark     backend.Mark
}

// DefaultReduceBucketSize is DeepSpeed's zero_optimization.reduce_bucket_size
// default, in elements (5e8).
const DefaultReduceBucketSize = 500_000_000

// ZeROConfig is the DeepSpeed configuration memsh models.
type ZeROConfig struct {
	Stage int // zero_optimization.stage: 1, 2 or 3 (NewZeRO3)
	// DType is the model dtype (bf16.enabled: BFloat16, fp16.enabled:
	// Float16, else Float32).
	DType tensor.DType
	// ReduceBucketSize is zero_optimization.reduce_bucket_size in
	// elements (0: 5e8).
	ReduceBucketSize int
	// Stage 3's settings (ZeRO3Config; 0: DeepSpeed's defaults).
	PrefetchBucketSize, MaxLiveParameters, MaxReuseDistance, ParamPersistenceThreshold, SubGroupSize int
}

// NewZeRO wraps the trainable parameters params (in registration order)
// as deepspeed.initialize does; set swaps a parameter's data (the module
// keeps the same parameter objects).
func (g *Group) NewZeRO(params []*tensor.Tensor, cfg ZeROConfig) (*ZeRO, error) {
	if cfg.Stage != 1 && cfg.Stage != 2 {
		return nil, fmt.Errorf("zero_optimization.stage %d: memsh models stages 1 and 2", cfg.Stage)
	}
	if len(params) == 0 {
		return nil, errors.New("no parameter requires a gradient")
	}
	if cfg.ReduceBucketSize <= 0 {
		cfg.ReduceBucketSize = DefaultReduceBucketSize
	}
	z := &ZeRO{g: g, stage: cfg.Stage, dt: cfg.DType, bucket: cfg.ReduceBucketSize, check: cfg.DType != tensor.Float32, params: params, index: map[*tensor.Tensor]int{}}
	ctx, dev := params[0].Context(), params[0].Device()
	// the module cast: the new tensor, then the old one freed
	for _, p := range params {
		if p.DType() == z.dt {
			continue
		}
		old := tensor.Alias(p)
		c, err := tensor.To(p, "", z.dt, false)
		if err != nil {
			return nil, err
		}
		p.SetData(c)
		tensor.Dropped(old)
	}
	// DeepSpeed's empty_cache(): the cached segments released, the peaks
	// reset
	if mgr := ctx.Manager; mgr != nil {
		if a, err := mgr.Allocator(dev); err == nil {
			mgr.Reclaim()
			a.EmptyCache()
			mgr.ResetPeakStats(a)
		}
	}
	// flatten, aligned to 2N elements
	psi := 0
	for i, p := range params {
		z.index[p] = i
		z.offs = append(z.offs, psi)
		psi += p.Numel()
	}
	align := 2 * g.Size
	z.A = (psi + align - 1) / align * align
	z.P = z.A / g.Size
	parts := make([]*tensor.Tensor, 0, len(params)+1)
	for _, p := range params {
		v, err := tensor.Reshape(p, []int{p.Numel()})
		if err != nil {
			return nil, err
		}
		parts = append(parts, v)
	}
	var pad *tensor.Tensor
	if z.A > psi {
		var err error
		if pad, err = tensor.Zeros(ctx, []int{z.A - psi}, z.dt, dev); err != nil {
			return nil, err
		}
		parts = append(parts, pad)
	}
	release := ctx.Hold(pad)
	flat, err := tensor.Cat(parts, 0)
	release()
	tensor.Dropped(pad)
	if err != nil {
		return nil, err
	}
	z.flat = flat
	for i, p := range params {
		v, err := tensor.Narrow(flat, 0, z.offs[i], p.Numel())
		if err == nil {
			v, err = tensor.View(v, p.Shape())
		}
		if err != nil {
			return nil, err
		}
		old := tensor.Alias(p)
		p.SetData(v)
		tensor.Dropped(old)
	}
	// the fp32 master partition: a clone of the partition, cast
	part, err := z.partition(flat)
	if err != nil {
		return nil, err
	}
	release = ctx.Hold(flat)
	defer release()
	clone, err := tensor.Clone(part)
	if err != nil {
		return nil, err
	}
	if z.dt == tensor.Float32 {
		z.master = clone
	} else {
		rel := ctx.Hold(clone)
		z.master, err = tensor.To(clone, "", tensor.Float32, false)
		rel()
		tensor.Dropped(clone)
		if err != nil {
			return nil, err
		}
	}
	// FusedAdam's overflow flag, then initialize_optimizer_states' zero
	// gradient of the master, made and dropped
	rel := ctx.Hold(z.master)
	if z.flag, err = tensor.Zeros(ctx, []int{1}, tensor.Int32, dev); err == nil {
		rel2 := ctx.Hold(z.flag)
		var zg *tensor.Tensor
		zg, err = tensor.Zeros(ctx, []int{z.P}, tensor.Float32, dev)
		rel2()
		tensor.Dropped(zg)
	}
	rel()
	if err != nil {
		return nil, err
	}
	for _, p := range params {
		remove, err := autograd.RegisterPostAccumulateGradHook(p, z.hook, z)
		if err != nil {
			z.Remove()
			return nil, err
		}
		z.removes = append(z.removes, remove)
	}
	return z, nil
}

// partition is this rank's P elements of t (a flat buffer of A).
func (z *ZeRO) partition(t *tensor.Tensor) (*tensor.Tensor, error) {
	return tensor.Narrow(t, 0, z.g.Rank*z.P, z.P)
}

// inPartition: parameter i has elements in this rank's partition.
func (z *ZeRO) inPartition(i int) bool {
	lo, hi := z.g.Rank*z.P, (z.g.Rank+1)*z.P
	return z.offs[i] < hi && z.offs[i]+z.params[i].Numel() > lo
}

// Remove unregisters the gradient hooks.
func (z *ZeRO) Remove() {
	for _, f := range z.removes {
		f()
	}
	z.removes = nil
}

// changed: what the engine holds changed.
func (z *ZeRO) changed() { tensor.NoteHeld(z.flat.Context(), &z.mark) }

// Reach walks the engine's tensors (tensor.ReachRoot).
func (z *ZeRO) Reach(r *tensor.Reacher) {
	if !r.Visit(&z.mark) {
		return
	}
	for _, t := range []*tensor.Tensor{z.flat, z.master, z.flag, z.exp[0], z.exp[1], z.norm, z.ipg, z.gip} {
		r.Tensor(t)
	}
	for _, t := range z.averaged {
		r.Tensor(t)
	}
	for _, p := range z.params {
		r.Tensor(p)
	}
}

// CommTensors calls fn with the reduce bucket while it lives
// (memtrack.CommHolder).
func (z *ZeRO) CommTensors(fn func(*tensor.Tensor)) {
	if z.ipg != nil {
		fn(z.ipg)
	}
}

// StateTensors calls fn with the optimizer's state: the fp32 master and
// the moments (what memtrack counts as Optstate).
func (z *ZeRO) StateTensors(fn func(*tensor.Tensor)) {
	for _, t := range []*tensor.Tensor{z.master, z.exp[0], z.exp[1]} {
		if t != nil {
			fn(t)
		}
	}
}
