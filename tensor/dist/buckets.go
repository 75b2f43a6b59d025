package dist

import (
	"math"
	"slices"

	"github.com/memsh/memsh/tensor"
)

// bucketKey groups tensors that may share a flat buffer: PyTorch buckets
// tensors of one dtype on one device together.
func bucketKey(t *tensor.Tensor) string { return t.DType().String() + "@" + t.Device() }

// assignBuckets is c10d's compute_bucket_assignment_by_size: it walks the
// tensors in order (order nil: index order), adding each to the open
// bucket of its dtype and device, and closes a bucket as soon as its bytes
// reach its limit — the first bucket of a kind limits[0], the next
// limits[1], and so on, the last limit for all after. A bucket may
// therefore exceed its limit by its last tensor. The buckets left open
// close at the end. With order nil the buckets are sorted by their
// smallest index (as PyTorch sorts them); with an order (the
// gradient-ready order of a rebuild) they stay in the order they closed,
// the ones left open last, in the order their kind first appeared
// (PyTorch takes those from a hash map, in no defined order; a model of
// one dtype has one).
func assignBuckets(ts []*tensor.Tensor, order []int, limits []int64) [][]int {
	ready := order != nil
	if !ready {
		order = make([]int, len(ts))
		for i := range order {
			order[i] = i
		}
	}
	type open struct {
		idx   []int
		bytes int64
		limit int // index into limits
	}
	accs := map[string]*open{}
	var kinds []string
	var out [][]int
	for _, i := range order {
		k := bucketKey(ts[i])
		a := accs[k]
		if a == nil {
			a = &open{}
			accs[k] = a
			kinds = append(kinds, k)
		}
		a.idx = append(a.idx, i)
		a.bytes += int64(ts[i].NBytes())
		if a.bytes >= limits[a.limit] {
			out = append(out, a.idx)
			a.idx, a.bytes = nil, 0
			if a.limit+1 < len(limits) {
				a.limit++
			}
		}
	}
	for _, k := range kinds {
		if a := accs[k]; len(a.idx) > 0 {
			out = append(out, a.idx)
		}
	}
	if ready {
		return out
	}
	slices.SortStableFunc(out, func(a, b []int) int { return slices.Min(a) - slices.Min(b) })
	return out
}

// noLimit is sys.maxsize, DDP's bucket limit for its first iteration.
const noLimit = math.MaxInt64

// flatten is torch._utils._flatten_dense_tensors: one new 1-D tensor with
// the tensors' elements one after another (torch.cat of their flat views).
func flatten(ts []*tensor.Tensor) (*tensor.Tensor, error) {
	flat := make([]*tensor.Tensor, len(ts))
	for i, t := range ts {
		v, err := tensor.Reshape(t, []int{t.Numel()})
		if err != nil {
			return nil, err
		}
		flat[i] = v
	}
	return tensor.Cat(flat, 0)
}

// BroadcastCoalesced is c10d's broadcast_coalesced, which DDP uses to make
// every rank start from rank 0's parameters and buffers
// (_sync_module_states, and _sync_buffers before a forward): the tensors
// in buckets of bufferBytes (DDP's 250 MiB, per dtype and device,
// assignBuckets), each bucket flattened into a new tensor and broadcast,
// at most two buckets in flight — a third waits for the first, whose flat
// copy is then freed. Each rank already holds the same values, so nothing
// is copied back; the flat copies are what it allocates.
func (g *Group) BroadcastCoalesced(ts []*tensor.Tensor, bufferBytes int64) error {
	if len(ts) == 0 {
		return nil
	}
	ctx := ts[0].Context()
	const maxInFlight = 2
	var inFlight []*tensor.Tensor
	finish := func() {
		tensor.Dropped(inFlight[0])
		inFlight[0] = nil // no Go reference keeps it
		inFlight = inFlight[1:]
	}
	defer func() {
		for len(inFlight) > 0 {
			finish()
		}
	}()
	for _, b := range assignBuckets(ts, nil, []int64{bufferBytes}) {
		if len(inFlight) >= maxInFlight {
			finish()
		}
		group := make([]*tensor.Tensor, len(b))
		for i, j := range b {
			group[i] = ts[j]
		}
		release := ctx.Hold(inFlight...)
		f, err := flatten(group)
		release()
		if err != nil {
			return err
		}
		inFlight = append(inFlight, f)
	}
	return nil
}

// VerifyParamShapes is c10d's verify_params_across_processes, the first
// thing DDP's constructor does: the parameter count all-gathered (an int64
// device tensor and world_size outputs like it) and the shapes' metadata
// (2 × Σ dims int64s, built on the host, cloned and copied to the
// device) broadcast from rank 0. On the device: 8 bytes, world_size × 8
// bytes and 16 × Σ dims bytes, all freed when it returns; the host
// tensors are not modelled. Every rank holds the same model, so the check
// passes.
func (g *Group) VerifyParamShapes(params []*tensor.Tensor) error {
	if len(params) == 0 {
		return nil
	}
	ctx, dev := params[0].Context(), params[0].Device()
	var made []*tensor.Tensor
	defer func() { tensor.Dropped(made...) }()
	alloc := func(n int) error {
		release := ctx.Hold(made...)
		defer release()
		t, err := tensor.Empty(ctx, []int{n}, tensor.Int64, dev)
		if err != nil {
			return err
		}
		made = append(made, t)
		return nil
	}
	if err := alloc(1); err != nil { // param_size_tensor
		return err
	}
	for range g.Size { // the all-gather's outputs
		if err := alloc(1); err != nil {
			return err
		}
	}
	dims := 0
	for _, p := range params {
		dims += 2 * p.Dim()
	}
	return alloc(dims) // metadata_dev
}
