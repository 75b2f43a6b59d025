package dist

import (
	"fmt"
	"sync"
	"weak"

	"github.com/memsh/memsh/tensor"
	"github.com/memsh/memsh/tensor/autograd"
)

// Tensor parallelism as PyTorch 2.6's DTensor runs it on one rank of a
// 1-D mesh (docs/reference/tensor_parallel.md): a tensor stays a local
// tensor with a placement, and moving it between placements
// (Redistribute) runs the functional collectives, which allocate on the
// caller's side what _c10d_functional's ops allocate: all_gather_tensor
// a new output of world × the input (and, gathering on a dim other than
// 0, a cat of its chunks into that dim), reduce_scatter_tensor a new
// output of 1/world (scattering on a dim other than 0, first a cat of the
// input's chunks along dim 0), all_reduce a contiguous clone reduced in
// place. Values: every rank is taken to hold this rank's data (exact for
// a world of 1).

// PlacementKind is a placement's kind.
type PlacementKind uint8

// The placements of torch.distributed.tensor.
const (
	Replicate PlacementKind = iota // Replicate(): every rank holds the whole tensor
	Shard                          // Shard(dim): rank r holds the r-th torch.chunk of dim
	Partial                        // Partial(): every rank holds a summand
)

// Placement is a DTensor placement on a 1-D mesh.
type Placement struct {
	Kind PlacementKind
	Dim  int // Shard's dim (may be negative: from the end)
}

// ShardDim returns Shard(dim).
func ShardDim(dim int) Placement { return Placement{Kind: Shard, Dim: dim} }

// String is the placement as PyTorch prints it.
func (p Placement) String() string {
	switch p.Kind {
	case Shard:
		return fmt.Sprintf("Shard(dim=%d)", p.Dim)
	case Partial:
		return "Partial(sum)"
	}
	return "Replicate()"
}

// Equal reports whether p and q are one placement for a tensor of ndim
// dims (Shard(-1) is Shard(ndim-1)).
func (p Placement) Equal(q Placement, ndim int) bool {
	if p.Kind != q.Kind {
		return false
	}
	return p.Kind != Shard || p.dim(ndim) == q.dim(ndim)
}

func (p Placement) dim(ndim int) int {
	if p.Dim < 0 {
		return p.Dim + ndim
	}
	return p.Dim
}

// backwardTarget is the placement Redistribute's backward moves a
// gradient to: the forward's source, a Partial one as Replicate
// (Redistribute.backward normalizes it so).
func (p Placement) backwardTarget() Placement {
	if p.Kind == Partial {
		return Placement{Kind: Replicate}
	}
	return p
}

// ChunkSize returns the length of rank's torch.chunk of a dim of n
// elements over world ranks: ceil(n/world) for the first ranks, the rest
// for the one after them, none for the others.
func ChunkSize(n, world, rank int) (start, length int) {
	c := (n + world - 1) / world
	start = min(rank*c, n)
	return start, min(c, n-start)
}

// DistributeTensor is distribute_tensor(t, mesh, [p]) for this rank: a
// Shard(d) placement gives this rank's torch.chunk of dim d in a new
// tensor, mesh_scatter's output (the original is the caller's to drop);
// for d ≠ 0 every rank first makes a contiguous copy of each of the
// world's chunks (_split_tensor), freed after the scatter. Replicate
// gives t itself. On the meta device nothing is allocated: the chunk is
// a meta tensor (torchtitan parallelizes a model built on the meta
// device, then calls to_empty).
func (g *Group) DistributeTensor(t *tensor.Tensor, p Placement) (*tensor.Tensor, error) {
	switch p.Kind {
	case Replicate:
		return t, nil
	case Partial:
		return nil, fmt.Errorf("distribute_tensor: Partial() placement is not supported")
	}
	shape := t.Shape()
	d := p.dim(len(shape))
	if d < 0 || d >= len(shape) {
		return nil, fmt.Errorf("distribute_tensor: Shard(dim=%d) of a %d-dim tensor", p.Dim, len(shape))
	}
	start, n := ChunkSize(shape[d], g.Size, g.Rank)
	local := append([]int(nil), shape...)
	local[d] = n
	ctx := t.Context()
	if tensor.Deferred(t) {
		var out *tensor.Tensor
		err := tensor.MetaDevice(ctx, func() (err error) {
			out, err = tensor.Empty(ctx, local, t.DType(), t.Device())
			return err
		})
		return out, err
	}
	release := ctx.Hold()
	defer release()
	var copies []*tensor.Tensor
	if d != 0 {
		for r := range g.Size {
			s, k := ChunkSize(shape[d], g.Size, r)
			if k == 0 {
				continue
			}
			v, err := tensor.Narrow(t, d, s, k)
			if err != nil {
				return nil, err
			}
			c, err := tensor.Contiguous(v)
			if err != nil {
				return nil, err
			}
			copies = append(copies, c)
			ctx.Hold(c)
		}
	}
	out, err := tensor.Empty(ctx, local, t.DType(), t.Device())
	if err != nil || n == 0 {
		return out, err
	}
	if t.HasData() {
		src, err := tensor.Narrow(t, d, start, n)
		if err != nil {
			return nil, err
		}
		if _, err := out.Copy_(src); err != nil {
			return nil, err
		}
	}
	tensor.Dropped(copies...)
	return out, nil
}

// even checks that dim d of t splits evenly over the group: memsh models
// the even case (DTensor pads an uneven one).
func (g *Group) even(fname string, t *tensor.Tensor, d int) error {
	n := t.Shape()[d]
	if n%g.Size != 0 {
		return fmt.Errorf("%s: dim %d of size %d does not split evenly over %d ranks (uneven sharding of activations is not modelled)", fname, d, n, g.Size)
	}
	return nil
}

// allGatherTensor is funcol.all_gather_tensor(x, gather_dim=d): the
// output, world × x along dim 0 (every rank's x, rank after rank); for d
// ≠ 0 the cat of its world chunks along d, a second copy, after which
// the first is freed. x must be contiguous.
func (g *Group) allGatherTensor(x *tensor.Tensor, d int) (*tensor.Tensor, error) {
	shape := x.Shape()
	if len(shape) == 0 {
		return nil, fmt.Errorf("all_gather_tensor: a 0-dim tensor")
	}
	full := append([]int{g.Size * shape[0]}, shape[1:]...)
	out, err := tensor.Empty(x.Context(), full, x.DType(), x.Device())
	if err != nil {
		return nil, err
	}
	if err := g.AllGatherIntoTensor(out, x); err != nil {
		return nil, err
	}
	if d == 0 {
		return out, nil
	}
	release := x.Context().Hold(out)
	defer release()
	chunks := make([]*tensor.Tensor, g.Size)
	for r := range chunks {
		if chunks[r], err = tensor.Narrow(out, 0, r*shape[0], shape[0]); err != nil {
			return nil, err
		}
	}
	res, err := tensor.Cat(chunks, d)
	if err != nil {
		return nil, err
	}
	tensor.Dropped(out)
	return res, nil
}

// reduceScatterTensor is funcol.reduce_scatter_tensor(x, "sum",
// scatter_dim=d): for d ≠ 0 first the cat of x's world chunks along d
// into dim 0 (a copy; for d = 0 x made contiguous), then the output, a
// world-th of it (this rank's chunk summed over the ranks), after which
// the copy is freed.
func (g *Group) reduceScatterTensor(x *tensor.Tensor, d int) (*tensor.Tensor, error) {
	shape := x.Shape()
	in := x
	var err error
	if d != 0 {
		c := shape[d] / g.Size
		chunks := make([]*tensor.Tensor, g.Size)
		for r := range chunks {
			if chunks[r], err = tensor.Narrow(x, d, r*c, c); err != nil {
				return nil, err
			}
		}
		in, err = tensor.Cat(chunks, 0)
	} else {
		in, err = tensor.Contiguous(x)
	}
	if err != nil {
		return nil, err
	}
	release := x.Context().Hold(in)
	defer release()
	part := in.Shape()
	part[0] /= g.Size
	out, err := tensor.Empty(x.Context(), part, x.DType(), x.Device())
	if err != nil {
		return nil, err
	}
	if err := g.ReduceScatterTensor(out, in, Sum); err != nil {
		return nil, err
	}
	if in != x {
		tensor.Dropped(in)
	}
	return out, nil
}

// allReduce is funcol.all_reduce(x, "sum"): a contiguous clone of x,
// all-reduced in place.
func (g *Group) allReduce(x *tensor.Tensor) (*tensor.Tensor, error) {
	var out *tensor.Tensor
	var err error
	if x.IsContiguous() {
		out, err = tensor.Clone(x)
	} else {
		out, err = tensor.Contiguous(x)
	}
	if err != nil {
		return nil, err
	}
	return out, g.AllReduce(out, Sum)
}

// redistributeLocal is redistribute_local_tensor on a 1-D mesh: x, a
// local tensor placed as from, placed as to; x itself when the two are
// one.
func (g *Group) redistributeLocal(fname string, x *tensor.Tensor, from, to Placement) (*tensor.Tensor, error) {
	nd := x.Dim()
	if from.Equal(to, nd) {
		return x, nil
	}
	switch {
	case from.Kind == Shard && to.Kind == Replicate:
		// Shard._to_replicate_tensor: contiguous, then all-gathered on
		// the shard dim
		d := from.dim(nd)
		c, err := tensor.Contiguous(x)
		if err != nil {
			return nil, err
		}
		release := x.Context().Hold(c)
		defer release()
		out, err := g.allGatherTensor(c, d)
		if err == nil && c != x {
			tensor.Dropped(c)
		}
		return out, err
	case from.Kind == Partial && to.Kind == Replicate:
		return g.allReduce(x)
	case from.Kind == Partial && to.Kind == Shard:
		d := to.dim(nd)
		if err := g.even(fname, x, d); err != nil {
			return nil, err
		}
		return g.reduceScatterTensor(x, d)
	case from.Kind == Replicate && to.Kind == Shard:
		// Shard._replicate_to_shard: a clone of this rank's chunk
		d := to.dim(nd)
		start, n := ChunkSize(x.Shape()[d], g.Size, g.Rank)
		v, err := tensor.Narrow(x, d, start, n)
		if err != nil {
			return nil, err
		}
		return tensor.Clone(v)
	case from.Kind == Partial && to.Kind == Partial:
		return x, nil
	}
	return nil, fmt.Errorf("%s: redistributing %s to %s is not modelled", fname, from, to)
}

// GradPlacement is where a DTensor's gradient will arrive: set by the
// ops that consume it (a ColwiseParallel linear makes it Partial), read
// when the backward runs.
type GradPlacement struct{ P Placement }

// Redistribute is DTensor.redistribute of local tensor x from placement
// from to placement to (the Redistribute autograd Function): the
// forward's collective now; in the backward the gradient, which arrives
// placed as grad.P, is moved to from (Partial: to Replicate). It returns
// x itself when nothing moves.
func (g *Group) Redistribute(x *tensor.Tensor, from, to Placement, grad *GradPlacement) (*tensor.Tensor, error) {
	const fname = "redistribute"
	nd := x.Dim()
	if from.Equal(to, nd) {
		return x, nil
	}
	target := from.backwardTarget()
	return autograd.Function("RedistributeBackward", x,
		func() (*tensor.Tensor, error) { return g.redistributeLocal(fname, x, from, to) },
		func(gr *tensor.Tensor) (*tensor.Tensor, error) {
			return g.redistributeLocal(fname, gr, grad.P, target)
		})
}

// FromLocal is DTensor.from_local(x, mesh, [p], run_check=False) (the
// _FromTorchTensor Function): x itself in the forward; in the backward a
// gradient that arrives placed as grad.P other than p is moved to p
// first (a Partial gradient of a Replicate input: all-reduced).
func (g *Group) FromLocal(x *tensor.Tensor, p Placement, grad *GradPlacement) (*tensor.Tensor, error) {
	if !autograd.RequiresGrad(x) {
		return x, nil
	}
	return autograd.Function("FromTorchTensorBackward", x,
		func() (*tensor.Tensor, error) { return x, nil },
		func(gr *tensor.Tensor) (*tensor.Tensor, error) {
			return g.redistributeLocal("from_local", gr, grad.P, p)
		})
}

// MaskIDs is DTensor's embedding on a vocabulary sharded Shard(0)
// (MaskPartial._partition_value) for ids over vocab rows: the mask
// (True where an id is outside this rank's rows: ids < offset, ids >=
// offset + rows, the two compares' results freed after their or) and
// the local ids (a clone of ids, minus the offset: a second copy, the
// clone freed; masked positions set to 0 in place). The caller keeps the
// mask until the output's reduction (ApplyMask). Not modelled: the
// masked assignment's index temporaries (nonzero's indices of the
// masked positions).
func (g *Group) MaskIDs(ids *tensor.Tensor, vocab int) (local, mask *tensor.Tensor, err error) {
	start, n := ChunkSize(vocab, g.Size, g.Rank)
	ctx := ids.Context()
	lt, err := tensor.Lt(ids, tensor.Int(int64(start)))
	if err != nil {
		return nil, nil, err
	}
	release := ctx.Hold(lt)
	defer release()
	ge, err := tensor.Ge(ids, tensor.Int(int64(start+n)))
	if err != nil {
		return nil, nil, err
	}
	ctx.Hold(ge)
	if mask, err = tensor.Binary(tensor.OpAdd, lt, ge); err != nil {
		return nil, nil, err
	}
	tensor.Dropped(lt, ge)
	ctx.Hold(mask)
	c, err := tensor.Clone(ids)
	if err != nil {
		return nil, nil, err
	}
	ctx.Hold(c)
	if local, err = tensor.Binary(tensor.OpSub, c, tensor.Int(int64(start))); err != nil {
		return nil, nil, err
	}
	tensor.Dropped(c)
	if local.HasData() {
		if err := tensor.MaskedFill_(local, mask, tensor.Int(0)); err != nil {
			return nil, nil, err
		}
	}
	return local, mask, nil
}

// MaskedEmbedding is DTensor's embedding of ids over weight, this rank's
// Shard(0) rows of a vocab-row table (the MaskPartial strategy): the
// masked ids and the mask (MaskIDs), the local embedding — full size,
// [*ids' shape, dim], the masked ids freed as it returns — with its
// masked rows zeroed and the mask freed (ApplyMask), ready for the
// output's reduction. Its backward (EmbeddingBackward0, the original
// ids saved) is the all-Replicate strategy DTensor picks: the gradient
// of the whole table, [vocab, dim]. The weight's gradient is the view of
// this rank's rows, so the whole table lives as long as .grad does, as
// PyTorch's Replicate gradient does (until zero_grad; FSDP2's
// post-backward clones the rows out of it and drops it: TPGradView).
// Not modelled: the clone of the rows each foreach optimizer op makes
// of it without FSDP2.
func (g *Group) MaskedEmbedding(weight, ids *tensor.Tensor, vocab int, paddingIdx int64) (*tensor.Tensor, error) {
	start, n := ChunkSize(vocab, g.Size, g.Rank)
	ctx := ids.Context()
	return autograd.Function("EmbeddingBackward0", weight,
		func() (*tensor.Tensor, error) {
			local, mask, err := g.MaskIDs(ids, vocab)
			if err != nil {
				return nil, err
			}
			release := ctx.Hold(local, mask)
			defer release()
			out, err := tensor.Embedding(weight, local)
			if err != nil {
				return nil, err
			}
			tensor.Dropped(local)
			if err := ApplyMask(out, mask); err != nil {
				return nil, err
			}
			tensor.Dropped(mask)
			return out, nil
		},
		func(gr *tensor.Tensor) (*tensor.Tensor, error) {
			full, err := tensor.EmbeddingDenseBackward(gr, ids, vocab, paddingIdx)
			if err != nil {
				return nil, err
			}
			rows, err := tensor.Narrow(full, 0, start, n)
			if err == nil {
				Tag(rows, DTensor{Placement: Placement{Kind: Replicate}})
			}
			return rows, err
		}, ids)
}

// TPGradView reports whether gr is a tensor-parallel gradient placed
// otherwise than its parameter (MaskedEmbedding's whole-table gradient,
// of which gr views this rank's rows), which FSDP2's post-backward
// redistributes to the parameter's placement — a clone of the rows —
// before it reduces it (_get_grad_inner_tensor).
func TPGradView(gr *tensor.Tensor) bool {
	d, ok := TagOf(gr)
	return ok && d.Placement.Kind == Replicate
}

// ApplyMask is MaskPartial's mask applied before the reduction: the rows
// of out (an embedding's output, [*ids' shape, dim]) at masked ids set to
// 0 in place (index temporaries not modelled, as in MaskIDs).
func ApplyMask(out, mask *tensor.Tensor) error {
	if !out.HasData() {
		return nil
	}
	m, err := tensor.Unsqueeze(mask, -1)
	if err != nil {
		return err
	}
	if m, err = tensor.Expand(m, out.Shape()); err != nil {
		return err
	}
	return tensor.MaskedFill_(out, m, tensor.Int(0))
}

// tags are the placements of tensors a style left as DTensors
// (use_local_output=False): the next style takes them as placed there.
var tags = struct {
	sync.Mutex
	m map[weak.Pointer[tensor.Tensor]]DTensor
}{m: map[weak.Pointer[tensor.Tensor]]DTensor{}}

// DTensor is what a tensor that stays a DTensor carries: its placement,
// and where its gradient will arrive (the Redistribute that made it reads
// it; nil for a from_local one).
type DTensor struct {
	Placement Placement
	Grad      *GradPlacement
}

// Tag marks t as a DTensor placed as d.
func Tag(t *tensor.Tensor, d DTensor) {
	tags.Lock()
	defer tags.Unlock()
	if len(tags.m) > 1024 {
		for k := range tags.m {
			if k.Value() == nil {
				delete(tags.m, k)
			}
		}
	}
	tags.m[weak.Make(t)] = d
}

// TagOf returns t's DTensor placement, if a style left it one.
func TagOf(t *tensor.Tensor) (DTensor, bool) {
	tags.Lock()
	defer tags.Unlock()
	d, ok := tags.m[weak.Make(t)]
	return d, ok
}
