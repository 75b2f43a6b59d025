package dist

import (
	"errors"
	"fmt"
	"slices"

	"github.com/memsh/memsh/backend"
	"github.com/memsh/memsh/tensor"
	"github.com/memsh/memsh/tensor/autograd"
)

// DDP's defaults (torch.nn.parallel.DistributedDataParallel).
const (
	// DefaultBucketCapBytes is bucket_cap_mb=25.
	DefaultBucketCapBytes = 25 << 20
	// DefaultFirstBucketBytes is dist._DEFAULT_FIRST_BUCKET_BYTES, the
	// first bucket's limit after the rebuild.
	DefaultFirstBucketBytes = 1 << 20
	// DefaultBroadcastBucketBytes is DDP's broadcast_bucket_size, the
	// buckets of its parameter and buffer broadcasts.
	DefaultBroadcastBucketBytes = 250 << 20
)

// ReducerOptions are DistributedDataParallel's arguments that change its
// memory.
type ReducerOptions struct {
	// BucketCapBytes is bucket_cap_mb in bytes (0: 25 MiB).
	BucketCapBytes int64
	// GradientAsBucketView: after their reduction, gradients are views
	// into the buckets rather than tensors of their own
	// (gradient_as_bucket_view).
	GradientAsBucketView bool
}

// Reducer is the C++ Reducer a DistributedDataParallel module owns: it
// keeps the gradients of the trainable parameters in flat buckets and
// all-reduces each bucket once all its gradients are in. Memory, as
// PyTorch's reducer.cpp allocates it:
//
//   - At construction one bucket per dtype holds every trainable
//     parameter (the first iteration's limit is sys.maxsize when
//     find_unused_parameters is False): as many bytes as the parameters.
//   - In a backward that follows a synchronised forward (Prepare), each
//     parameter's post-accumulate-grad hook copies its gradient into its
//     bucket view, divided by world_size (mul_out, nothing allocated);
//     with gradient_as_bucket_view the gradient then becomes that view
//     and the tensor AccumulateGrad made is freed. A bucket is
//     all-reduced in place when its last gradient arrives; after the
//     last bucket the gradients get the reduced values back (in place,
//     or already the views).
//   - The first synchronised forward after that backward rebuilds the
//     buckets in the order the gradients became ready, with limits of
//     1 MiB for the first and bucket_cap_mb for the others: the bucket
//     indices are broadcast (two int32 device tensors, n+1 and the bucket
//     count, freed), the old buckets are let go (freed, unless gradients
//     still view them) and the new ones allocated.
//
// The all-reduce runs on the current stream (see the package doc).
type Reducer struct {
	g       *Group
	params  []*tensor.Tensor
	index   map[*tensor.Tensor]int
	opts    ReducerOptions
	buckets []*bucket
	where   []slot // where[i]: parameter i's bucket and place in it
	removes []func()

	// expect: hooks are armed (a synchronised forward happened and its
	// backward has not finished).
	expect  bool
	ready   []bool
	nReady  int
	next    int   // the next bucket to all-reduce (in bucket order)
	order   []int // the gradient-ready order of the first reduced backward
	rebuilt bool
	// mark is where reach walks met the reducer; its buckets changing is
	// noted on it (changed).
	mark backend.Mark
}

type bucket struct {
	flat    *tensor.Tensor
	views   []*tensor.Tensor
	params  []int
	pending int
}

type slot struct{ bucket, pos int }

// NewReducer builds the reducer of a DDP module whose trainable
// parameters are params (in registration order; each once) and registers
// its gradient hooks. The caller has verified and broadcast the module's
// state (VerifyParamShapes, BroadcastCoalesced) as DDP's constructor does
// before building it.
func (g *Group) NewReducer(params []*tensor.Tensor, opts ReducerOptions) (*Reducer, error) {
	if len(params) == 0 {
		return nil, errors.New("DistributedDataParallel is not needed when a module doesn't have any parameter that requires a gradient.")
	}
	if opts.BucketCapBytes <= 0 {
		opts.BucketCapBytes = DefaultBucketCapBytes
	}
	r := &Reducer{g: g, params: slices.Clone(params), index: map[*tensor.Tensor]int{}, opts: opts}
	for i, p := range r.params {
		r.index[p] = i
	}
	// DDP reverses the assignment, approximating the order gradients
	// become ready; with one bucket per dtype only the dtypes' order moves.
	buckets := assignBuckets(r.params, nil, []int64{noLimit})
	slices.Reverse(buckets)
	if err := r.initBuckets(buckets); err != nil {
		return nil, err
	}
	for _, p := range r.params {
		remove, err := autograd.RegisterPostAccumulateGradHook(p, r.hook, r)
		if err != nil {
			r.Remove()
			return nil, err
		}
		r.removes = append(r.removes, remove)
	}
	r.ready = make([]bool, len(r.params))
	return r, nil
}

// initBuckets allocates a flat tensor per bucket, in order, and makes each
// parameter's view into it; with gradient_as_bucket_view a gradient that
// exists already (a rebuild after a backward whose gradients were kept) is
// copied into its view and becomes it.
func (r *Reducer) initBuckets(assign [][]int) error {
	ctx := r.params[0].Context()
	r.buckets = make([]*bucket, 0, len(assign))
	r.where = make([]slot, len(r.params))
	var held []*tensor.Tensor
	for bi, idx := range assign {
		n := 0
		for _, i := range idx {
			n += r.params[i].Numel()
		}
		p0 := r.params[idx[0]]
		release := ctx.Hold(held...)
		flat, err := tensor.Empty(ctx, []int{n}, p0.DType(), p0.Device())
		release()
		if err != nil {
			r.buckets = nil
			tensor.Dropped(held...)
			return err
		}
		held = append(held, flat)
		b := &bucket{flat: flat, params: idx}
		off := 0
		for pos, i := range idx {
			p := r.params[i]
			v, err := tensor.Narrow(flat, 0, off, p.Numel())
			if err == nil {
				v, err = tensor.View(v, p.Shape())
			}
			if err != nil {
				return err
			}
			off += p.Numel()
			b.views = append(b.views, v)
			r.where[i] = slot{bi, pos}
			if r.opts.GradientAsBucketView {
				if gr := autograd.Grad(p); gr != nil && gr.Storage() != v.Storage() {
					if _, err := v.Copy_(gr); err != nil {
						return err
					}
					if err := r.setGrad(p, v); err != nil {
						return err
					}
				}
			}
		}
		r.buckets = append(r.buckets, b)
	}
	r.changed()
	r.resetCounts()
	return nil
}

// changed tells the Manager that what the reducer holds changed: what an
// earlier reach walk found through it is looked at again.
func (r *Reducer) changed() { tensor.NoteHeld(r.params[0].Context(), &r.mark) }

func (r *Reducer) resetCounts() {
	for _, b := range r.buckets {
		b.pending = len(b.params)
	}
	clear(r.ready)
	r.nReady, r.next = 0, 0
}

// setGrad makes v p's gradient, letting the old one go.
func (r *Reducer) setGrad(p, v *tensor.Tensor) error {
	old := autograd.Grad(p)
	if err := autograd.SetGrad(p, v); err != nil {
		return err
	}
	p.ReachChanged()
	if old != nil && old.Storage() != v.Storage() {
		tensor.Dropped(old)
	}
	return nil
}

// hook is each parameter's post-accumulate-grad hook (the reducer's
// autograd_hook and mark_variable_ready).
func (r *Reducer) hook(p *tensor.Tensor) error {
	if !r.expect {
		return nil
	}
	i, ok := r.index[p]
	if !ok {
		return nil
	}
	if r.ready[i] {
		return errors.New("DistributedDataParallel: Expected to mark a variable ready only once. This error is caused by a module parameter used in more than one reentrant backward pass or outside the forward function, or by running backward twice on a graph DDP prepared once.")
	}
	r.ready[i] = true
	r.nReady++
	if !r.rebuilt {
		r.order = append(r.order, i)
	}
	s := r.where[i]
	b := r.buckets[s.bucket]
	view := b.views[s.pos]
	if gr := autograd.Grad(p); gr != nil {
		if gr.Storage() != view.Storage() {
			// at::mul_out(bucket_view, grad, 1 / world_size): the scalar
			// is a host tensor; nothing is allocated on the device
			if _, err := tensor.BinaryOut(tensor.OpMul, gr, tensor.Float(1/float64(r.g.Size)), view); err != nil {
				return err
			}
			if r.opts.GradientAsBucketView {
				if err := r.setGrad(p, view); err != nil {
					return err
				}
			}
		}
	} else if _, err := view.Zero_(); err != nil {
		return err
	}
	b.pending--
	for r.next < len(r.buckets) && r.buckets[r.next].pending == 0 {
		if err := r.g.AllReduce(r.buckets[r.next].flat, Sum); err != nil {
			return err
		}
		r.next++
	}
	if r.nReady == len(r.params) {
		return r.finalize()
	}
	return nil
}

// finalize is finalize_backward: without gradient_as_bucket_view each
// gradient gets its reduced bucket view back, in place.
func (r *Reducer) finalize() error {
	r.expect = false
	if !r.opts.GradientAsBucketView {
		for i, p := range r.params {
			s := r.where[i]
			if gr := autograd.Grad(p); gr != nil {
				if _, err := gr.Copy_(r.buckets[s.bucket].views[s.pos]); err != nil {
					return err
				}
			}
		}
	}
	r.resetCounts()
	return nil
}

// Prepare is what DDP's forward does before the module's forward when
// autograd records (gradEnabled) and gradients are synchronised (sync
// false inside no_sync): it fails if the previous synchronised backward
// left gradients unreduced, rebuilds the buckets once after the first
// reduced backward, and arms the hooks for the coming backward. It is the
// caller's part to broadcast the buffers (BroadcastCoalesced).
func (r *Reducer) Prepare(gradEnabled, sync bool) error {
	if r.expect && r.nReady > 0 {
		return errors.New("DistributedDataParallel: Expected to have finished reduction in the prior iteration before starting a new one. This error indicates that your module has parameters that were not used in producing loss. You can enable unused parameter detection by passing the keyword argument `find_unused_parameters=True` to `torch.nn.parallel.DistributedDataParallel`, and by making sure all `forward` function outputs participate in calculating loss.")
	}
	if !gradEnabled {
		return nil
	}
	// the first forward under grad after a reduced backward rebuilds
	if gradEnabled && !r.rebuilt && len(r.order) == len(r.params) {
		if err := r.rebuild(); err != nil {
			return err
		}
	}
	// A forward whose backward never ran (evaluation under grad, a
	// discarded loss) leaves the hooks armed with nothing ready, as
	// PyTorch's prepare_for_backward does again at the next forward.
	r.expect = sync
	return nil
}

// rebuild is Reducer::rebuild_buckets with sync_bucket_indices.
func (r *Reducer) rebuild() error {
	r.rebuilt = true
	assign := assignBuckets(r.params, r.order, []int64{DefaultFirstBucketBytes, r.opts.BucketCapBytes})
	ctx, dev := r.params[0].Context(), r.params[0].Device()
	// sync_bucket_indices: the indices and the bucket sizes, int32
	// device tensors broadcast from rank 0, freed when it returns
	idx, err := tensor.Empty(ctx, []int{len(r.params) + 1}, tensor.Int32, dev)
	if err != nil {
		return err
	}
	release := ctx.Hold(idx)
	sizes, err := tensor.Empty(ctx, []int{len(assign)}, tensor.Int32, dev)
	release()
	tensor.Dropped(idx, sizes)
	if err != nil {
		return err
	}
	old := r.buckets
	r.buckets = nil
	r.changed()
	for _, b := range old {
		if !r.opts.GradientAsBucketView || !r.viewedBy(b) {
			tensor.Dropped(b.flat)
		}
	}
	clear(old) // no Go reference keeps them
	return r.initBuckets(assign)
}

// viewedBy reports whether a gradient is a view into b.
func (r *Reducer) viewedBy(b *bucket) bool {
	for _, i := range b.params {
		if gr := autograd.Grad(r.params[i]); gr != nil && gr.Storage() == b.flat.Storage() {
			return true
		}
	}
	return false
}

// Buckets returns the buckets' sizes in bytes, in order.
func (r *Reducer) Buckets() []int64 {
	out := make([]int64, len(r.buckets))
	for i, b := range r.buckets {
		out[i] = int64(b.flat.NBytes())
	}
	return out
}

// Rebuilt reports whether the buckets were rebuilt in gradient order.
func (r *Reducer) Rebuilt() bool { return r.rebuilt }

// CommTensors calls fn with each bucket (memtrack.CommHolder).
func (r *Reducer) CommTensors(fn func(*tensor.Tensor)) {
	for _, b := range r.buckets {
		fn(b.flat)
	}
}

// Remove unregisters the hooks (the Reducer's destructor).
func (r *Reducer) Remove() {
	for _, f := range r.removes {
		f()
	}
	r.removes = nil
}

// Reach walks the buckets, for the reclaim proof (tensor.ReachRoot).
func (r *Reducer) Reach(rc *tensor.Reacher) {
	if !rc.Visit(&r.mark) {
		return
	}
	for _, b := range r.buckets {
		rc.Tensor(b.flat)
		for _, v := range b.views {
			rc.Tensor(v)
		}
	}
}

// String describes the buckets.
func (r *Reducer) String() string {
	return fmt.Sprintf("Reducer(buckets=%v, rebuilt=%v)", r.Buckets(), r.rebuilt)
}
