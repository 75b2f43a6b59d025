package dist

import (
	"errors"

	"github.com/memsh/memsh/backend"
	"github.com/memsh/memsh/tensor"
	"github.com/memsh/memsh/tensor/autograd"
)

// ZeRO3 is DeepSpeed's ZeRO stage 3 (DeepSpeedZeroOptimizer_Stage3 with
// its DeepSpeedZeRoOffload and PartitionedParameterCoordinator) as it
// allocates on one rank, DeepSpeed 0.19 (docs/reference/deepspeed_zero3.md;
// rank r of N, e the model dtype's element size, c_p = ceil(n_p/N) the
// partition of a parameter of n_p elements, P = Σ c_p over the trainable
// ones):
//
//   - Construction: the model cast to the model dtype; each parameter's
//     partition (c_p elements, its own allocation) made and the full
//     parameter freed — it keeps its identity, now 0 elements (a model
//     built on the meta device is built as zero.Init builds it: per
//     parameter fp32, then the cast, then the partition); FusedAdam's
//     flag, the inf/nan tracker; the trainable partitions moved into one
//     flat buffer (P·e; their own freed, the cache emptied); per
//     sub-group (sub_group_size elements) the fp32 master, a converted
//     copy then its clone; a zero fp32 gradient of the largest made and
//     freed; the reduce bucket (reduce_bucket_size elements, permanent)
//     and the gradient partitions (P·e, permanent); each trainable
//     parameter gathered and freed once as its gradient hook is set.
//   - Forward and backward: each module gathers its own parameters
//     before its forward and in its backward (ZeRO3Module, zero3_fetch.go),
//     as the coordinator does: the first iteration records the modules'
//     order and releases a module's parameters after its forward and
//     after its backward; later ones prefetch along that trace and keep
//     parameters reused soon.
//   - Gradients: each copied into the bucket (its own tensor freed); at
//     the end of the backward the bucket reduce-scattered (a flat copy of
//     the chunks, freed) into the gradient partitions (zero3_step.go).
//   - step: the norm's float64 copies, per sub-group the gradient views
//     concatenated and cast to fp32, Adam's moments at the first step,
//     the master copied into the flat buffer; the persistent parameters
//     released and gathered again.
//
// Collectives run on the current stream (overlap_comm's side streams and
// their deferred frees are not modelled: memory_allocated is the same,
// reserved memory may differ); values are exact for one rank only.
type ZeRO3 struct {
	g   *Group
	cfg ZeRO3Config
	ctx *tensor.Context
	dev string

	params    []*Z3Param // in module.parameters() order (ds_id)
	byTensor  map[*tensor.Tensor]*Z3Param
	trainable []*Z3Param
	subgroups [][2]int // trainable index ranges
	P         int

	flat      *tensor.Tensor // lp_param_buffer
	masters   []*tensor.Tensor
	exp       [][2]*tensor.Tensor
	ipg       *tensor.Tensor // the reduce bucket
	ipgElems  int
	ipgParams []*Z3Param
	gradParts *tensor.Tensor // grad_partitions_flat_buffer
	reduced   bool           // a backward's gradients are in gradParts
	flag      *tensor.Tensor
	tracker   *tensor.Tensor
	norm      *tensor.Tensor
	empty     *tensor.Tensor // what a released parameter's data is

	coord   coordinator
	armed   bool // a backward's first gradient came (epilogue queued)
	removes []func()
	mark    backend.Mark
}

// Z3Param is one parameter under ZeRO-3.
type Z3Param struct {
	T         *tensor.Tensor // the module's parameter (its data swapped)
	id        int
	shape     []int
	n, c      int
	persist   bool
	trainable bool
	off       int            // in the flat buffer (trainable)
	part      *tensor.Tensor // ds_tensor
	// gathered is the storage T views while available: the gather
	// buffer (A_p elements) or the coalesced handle's copy (n_p)
	gathered *tensor.Tensor
	state    paramState
	handle   *gatherHandle // in flight
	// notBefore is the trace step before which the coordinator does not
	// release it (__most_recent_step_id_param_fetched_for)
	notBefore int
}

type paramState uint8

const (
	notAvailable paramState = iota
	inflight
	available
)

// ZeRO3Config is the DeepSpeed configuration of stage 3 memsh models
// (zero_optimization's keys, in elements; 0: DeepSpeed's default).
type ZeRO3Config struct {
	DType                     tensor.DType
	ReduceBucketSize          int // reduce_bucket_size, 5e8
	PrefetchBucketSize        int // stage3_prefetch_bucket_size, 5e7
	MaxLiveParameters         int // stage3_max_live_parameters, 1e9
	MaxReuseDistance          int // stage3_max_reuse_distance, 1e9
	ParamPersistenceThreshold int // stage3_param_persistence_threshold, 1e5
	SubGroupSize              int // sub_group_size, 1e9
}

// The stage-3 defaults of DeepSpeed 0.19's zero/config.py.
const (
	DefaultPrefetchBucketSize        = 50_000_000
	DefaultMaxLiveParameters         = 1_000_000_000
	DefaultMaxReuseDistance          = 1_000_000_000
	DefaultParamPersistenceThreshold = 100_000
	DefaultSubGroupSize              = 1_000_000_000
)

func (c *ZeRO3Config) defaults() {
	for _, x := range []struct {
		v   *int
		def int
	}{{&c.ReduceBucketSize, DefaultReduceBucketSize}, {&c.PrefetchBucketSize, DefaultPrefetchBucketSize},
		{&c.MaxLiveParameters, DefaultMaxLiveParameters}, {&c.MaxReuseDistance, DefaultMaxReuseDistance},
		{&c.ParamPersistenceThreshold, DefaultParamPersistenceThreshold}, {&c.SubGroupSize, DefaultSubGroupSize}} {
		if *x.v <= 0 {
			*x.v = x.def
		}
	}
}

// NewZeRO3 partitions params (the model's, in module.parameters() order,
// each once) as deepspeed.initialize does with stage 3; a parameter that
// requires grad is trained. The parameters keep their identity (the
// modules and autograd hold them); their data is 0 elements until a
// module gathers them.
func (g *Group) NewZeRO3(params []*tensor.Tensor, cfg ZeRO3Config) (*ZeRO3, error) {
	if len(params) == 0 {
		return nil, errors.New("the model has no parameter")
	}
	cfg.defaults()
	ctx, dev := params[0].Context(), params[0].Device()
	z := &ZeRO3{g: g, cfg: cfg, ctx: ctx, dev: dev, byTensor: map[*tensor.Tensor]*Z3Param{}}
	z.coord.z = z
	// nothing reaches the engine until it is returned: it is a root of
	// the reach walk until then
	release := ctx.Root(z)
	defer release()
	var err error
	if z.empty, err = tensor.Empty(ctx, []int{0}, cfg.DType, dev); err != nil {
		return nil, err
	}
	persisted := 0
	for i, p := range params {
		zp := &Z3Param{T: p, id: i, shape: p.Shape(), n: p.Numel(), trainable: autograd.RequiresGrad(p), notBefore: -1}
		zp.c = (zp.n + g.Size - 1) / g.Size
		// mark_persistent_parameters: small ones stay gathered once
		// gathered (model_persistence_threshold: no limit)
		if zp.n <= cfg.ParamPersistenceThreshold {
			zp.persist = true
			persisted += zp.n
		}
		z.params = append(z.params, zp)
		z.byTensor[p] = zp
		if zp.trainable {
			zp.off = z.P
			z.P += zp.c
			z.trainable = append(z.trainable, zp)
		}
	}
	if len(z.trainable) == 0 {
		return nil, errors.New("no parameter requires a gradient")
	}
	if err := z.partitionAll(); err != nil {
		return nil, err
	}
	if err := z.buffers(); err != nil {
		return nil, err
	}
	for _, zp := range z.trainable {
		// create_reduce_and_remove_grad_hooks: gathered, hooked, freed
		if err := z.gatherSync(zp); err != nil {
			return nil, err
		}
		remove, err := autograd.RegisterPostAccumulateGradHook(zp.T, z.gradHook, z)
		if err != nil {
			z.Remove()
			return nil, err
		}
		z.removes = append(z.removes, remove)
		z.free(zp)
	}
	z.changed()
	return z, nil
}

// partitionAll casts the model and makes each parameter's partition,
// freeing the full parameter (Init(module=model)), after FusedAdam's
// flag; on the meta device, as zero.Init builds each parameter before
// deepspeed.initialize: in fp32, cast, partitioned, then the flag.
func (z *ZeRO3) partitionAll() error {
	ctx, dt := z.ctx, z.cfg.DType
	if tensor.Deferred(z.params[0].T) {
		for _, zp := range z.params {
			full, err := tensor.Empty(ctx, zp.shape, tensor.Float32, z.dev)
			if err != nil {
				return err
			}
			rel := ctx.Hold(full)
			cast, err := tensor.Empty(ctx, zp.shape, dt, z.dev)
			rel()
			tensor.Dropped(full)
			if err != nil {
				return err
			}
			zp.T.SetData(cast)
			if err := z.partition(zp); err != nil {
				return err
			}
		}
		return z.makeFlag()
	}
	for _, zp := range z.params {
		// _cast_module_mixed_precision: the new tensor, the old freed
		if p := zp.T; p.DType() != dt && p.DType().IsFloat() {
			old := tensor.Alias(p)
			c, err := tensor.To(p, "", dt, false)
			if err != nil {
				return err
			}
			p.SetData(c)
			tensor.Dropped(old)
		}
	}
	if err := z.makeFlag(); err != nil {
		return err
	}
	for _, zp := range z.params {
		if err := z.partition(zp); err != nil {
			return err
		}
	}
	return nil
}

// partition makes zp's partition (c_p elements: this rank's slice of the
// flattened parameter, the padding past n_p left as it is) and frees the
// full parameter (_partition_param).
func (z *ZeRO3) partition(zp *Z3Param) error {
	part, err := tensor.Empty(z.ctx, []int{zp.c}, z.cfg.DType, z.dev)
	if err != nil {
		return err
	}
	if zp.T.HasData() && part.HasData() {
		start, k := ChunkSize(zp.n, z.g.Size, z.g.Rank)
		if k > 0 {
			src, err := tensor.Reshape(zp.T, []int{zp.n})
			if err == nil {
				src, err = tensor.Narrow(src, 0, start, k)
			}
			var dst *tensor.Tensor
			if err == nil {
				dst, err = tensor.Narrow(part, 0, 0, k)
			}
			if err == nil {
				_, err = dst.Copy_(src)
			}
			if err != nil {
				return err
			}
		}
	}
	zp.part = part
	z.free(zp)
	return nil
}

func (z *ZeRO3) makeFlag() error {
	if z.flag != nil {
		return nil
	}
	f, err := tensor.Zeros(z.ctx, []int{1}, tensor.Int32, z.dev)
	z.flag = f
	z.changed()
	return err
}

// buffers makes the optimizer's side: the inf/nan tracker, the flat
// buffer of the trainable partitions, the fp32 masters per sub-group, the
// reduce bucket and the gradient partitions.
func (z *ZeRO3) buffers() error {
	ctx, dev, dt := z.ctx, z.dev, z.cfg.DType
	var err error
	if z.tracker, err = tensor.Zeros(ctx, []int{}, tensor.Bool, dev); err != nil {
		return err
	}
	z.changed()
	// sub-groups: closed once they reach sub_group_size elements
	start, size := 0, 0
	for i, zp := range z.trainable {
		size += zp.c
		if size >= z.cfg.SubGroupSize || i == len(z.trainable)-1 {
			z.subgroups = append(z.subgroups, [2]int{start, i + 1})
			start, size = i+1, 0
		}
	}
	// defragment: the partitions copied to the host and freed, the cache
	// emptied (no peak reset), then the flat buffer, the partitions its
	// views
	var host []*tensor.Tensor
	var old []*tensor.Tensor
	for _, zp := range z.trainable {
		if zp.part.HasData() {
			h, err := tensor.To(zp.part, "cpu", tensor.Undefined, true)
			if err != nil {
				return err
			}
			host = append(host, h)
		}
		old = append(old, zp.part)
		zp.part = nil
	}
	tensor.Dropped(old...)
	clear(old)
	if mgr := ctx.Manager; mgr != nil {
		mgr.Reclaim()
		if a, err := mgr.Allocator(dev); err == nil {
			a.EmptyCache()
		}
	}
	if z.flat, err = tensor.Empty(ctx, []int{z.P}, dt, dev); err != nil {
		return err
	}
	z.changed()
	for i, zp := range z.trainable {
		v, err := tensor.Narrow(z.flat, 0, zp.off, zp.c)
		if err != nil {
			return err
		}
		if i < len(host) && v.HasData() {
			if _, err := v.Copy_(host[i]); err != nil {
				return err
			}
		}
		zp.part = v
	}
	// the fp32 masters: per sub-group a converted copy, then its clone
	// (the converted one dropped when the next is made)
	var conv *tensor.Tensor
	relConv := func() {}
	maxG := 0
	for _, sg := range z.subgroups {
		v, err := z.subgroupView(z.flat, sg)
		if err != nil {
			relConv()
			return err
		}
		c, err := tensor.To(v, "", tensor.Float32, true)
		relConv()
		if conv != nil {
			tensor.Dropped(conv)
		}
		if err != nil {
			return err
		}
		conv = c
		relConv = ctx.Hold(conv)
		m, err := tensor.Clone(conv)
		if err != nil {
			relConv()
			return err
		}
		z.masters = append(z.masters, m)
		z.changed()
		maxG = max(maxG, v.Numel())
	}
	relConv()
	tensor.Dropped(conv)
	z.exp = make([][2]*tensor.Tensor, len(z.subgroups))
	z.changed()
	// initialize_optimizer_states: a zero fp32 gradient, dropped
	zg, err := tensor.Zeros(ctx, []int{maxG}, tensor.Float32, dev)
	if err != nil {
		return err
	}
	tensor.Dropped(zg)
	if z.ipg, err = tensor.Empty(ctx, []int{z.cfg.ReduceBucketSize}, dt, dev); err != nil {
		return err
	}
	z.changed()
	if z.gradParts, err = tensor.Zeros(ctx, []int{z.P}, dt, dev); err != nil {
		return err
	}
	z.changed()
	return nil
}

// subgroupView is sub-group sg's slice of a flat buffer of P elements.
func (z *ZeRO3) subgroupView(flat *tensor.Tensor, sg [2]int) (*tensor.Tensor, error) {
	a := z.trainable[sg[0]].off
	last := z.trainable[sg[1]-1]
	return tensor.Narrow(flat, 0, a, last.off+last.c-a)
}

// free releases zp's gathered storage (free_param): its data becomes
// 0 elements.
func (z *ZeRO3) free(zp *Z3Param) {
	old := tensor.Alias(zp.T)
	zp.T.SetData(z.empty)
	zp.T.ReachChanged()
	tensor.Dropped(old)
	if zp.gathered != nil {
		tensor.Dropped(zp.gathered)
		zp.gathered = nil
	}
	zp.state = notAvailable
	z.changed()
}

// gatherSync is the synchronous all-gather of one parameter
// (_allgather_params_sequential): a buffer of c_p·N elements, T a view
// of its first n_p.
func (z *ZeRO3) gatherSync(zp *Z3Param) error {
	buf, err := tensor.Empty(z.ctx, []int{zp.c * z.g.Size}, z.cfg.DType, z.dev)
	if err != nil {
		return err
	}
	if err := z.fill(buf, zp); err != nil {
		return err
	}
	return z.install(zp, buf)
}

// fill puts every rank's partition of zp into buf (this rank's, N times:
// values are exact for one rank).
func (z *ZeRO3) fill(buf *tensor.Tensor, zp *Z3Param) error {
	if !buf.HasData() || !zp.part.HasData() {
		return nil
	}
	for r := range z.g.Size {
		dst, err := tensor.Narrow(buf, 0, r*zp.c, zp.c)
		if err == nil {
			_, err = dst.Copy_(zp.part)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// install makes zp's data the first n_p elements of buf, shaped.
func (z *ZeRO3) install(zp *Z3Param, buf *tensor.Tensor) error {
	v, err := tensor.Narrow(buf, 0, 0, zp.n)
	if err == nil {
		v, err = tensor.View(v, zp.shape)
	}
	if err != nil {
		return err
	}
	zp.T.SetData(v)
	zp.T.ReachChanged()
	zp.gathered = buf
	zp.state = available
	z.changed()
	return nil
}

// Remove unregisters the gradient hooks.
func (z *ZeRO3) Remove() {
	for _, f := range z.removes {
		f()
	}
	z.removes = nil
}

// changed: what the engine holds changed.
func (z *ZeRO3) changed() { tensor.NoteHeld(z.ctx, &z.mark) }

// Reach walks the engine's tensors (tensor.ReachRoot).
func (z *ZeRO3) Reach(r *tensor.Reacher) {
	if !r.Visit(&z.mark) {
		return
	}
	for _, t := range []*tensor.Tensor{z.flat, z.ipg, z.gradParts, z.flag, z.tracker, z.norm, z.empty} {
		r.Tensor(t)
	}
	for _, t := range z.masters {
		r.Tensor(t)
	}
	for _, e := range z.exp {
		r.Tensor(e[0])
		r.Tensor(e[1])
	}
	for _, zp := range z.params {
		r.Tensor(zp.T)
		r.Tensor(zp.part)
		r.Tensor(zp.gathered)
		if h := zp.handle; h != nil {
			r.Tensor(h.flat)
		}
	}
}

// CommTensors calls fn with the reduce bucket (memtrack.CommHolder).
func (z *ZeRO3) CommTensors(fn func(*tensor.Tensor)) {
	if z.ipg != nil {
		fn(z.ipg)
	}
}

// ParamTensors calls fn with the parameters' partitions (what memtrack
// counts as parameters, beside the gathered parameters the modules
// hold).
func (z *ZeRO3) ParamTensors(fn func(*tensor.Tensor)) {
	if z.flat != nil {
		fn(z.flat)
	}
	for _, zp := range z.params {
		if !zp.trainable && zp.part != nil {
			fn(zp.part)
		}
	}
}

// GradTensors calls fn with the gradient partitions (what memtrack
// counts as gradients).
func (z *ZeRO3) GradTensors(fn func(*tensor.Tensor)) {
	if z.gradParts != nil {
		fn(z.gradParts)
	}
}

// StateTensors calls fn with the optimizer's state: the fp32 masters and
// the moments (what memtrack counts as Optstate).
func (z *ZeRO3) StateTensors(fn func(*tensor.Tensor)) {
	for _, t := range z.masters {
		fn(t)
	}
	for _, e := range z.exp {
		for _, t := range e {
			if t != nil {
				fn(t)
			}
		}
	}
}
