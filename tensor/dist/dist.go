// Package dist models torch.distributed for one rank of a job: a process
// group of world size N (Group) whose collectives allocate on the caller's
// side what PyTorch's NCCL process group allocates there — nothing for
// all_reduce, all_gather_into_tensor and reduce_scatter_tensor on
// contiguous tensors (NCCL's own buffers are outside the caching
// allocator) — and move no data between ranks. The ranks of a
// data-parallel group hold the same values, so on a device with data a
// collective computes what the job would: all_reduce's sum is N times the
// tensor, all_gather_into_tensor N copies of the input, reduce_scatter's
// sum N times this rank's chunk.
//
// The caching allocator has streams (backend.Stream, record_stream), but
// the collectives do not use them yet: a collective's kernels run on
// NCCL's stream in PyTorch; memsh's complete at once on the current
// stream, as if the GPU had caught up before the next allocation.
package dist

import (
	"fmt"

	"github.com/memsh/memsh/tensor"
)

// ReduceOp is a collective's reduction (torch.distributed.ReduceOp).
type ReduceOp int

// The reductions.
const (
	Sum ReduceOp = iota
	Avg
	Max
	Min
	Product
)

// ParseReduceOp reads a reduction's name ("sum", "avg", "max", "min",
// "product"; PyTorch's enum names SUM ... too).
func ParseReduceOp(s string) (ReduceOp, bool) {
	switch s {
	case "sum", "SUM":
		return Sum, true
	case "avg", "AVG":
		return Avg, true
	case "max", "MAX":
		return Max, true
	case "min", "MIN":
		return Min, true
	case "product", "PRODUCT":
		return Product, true
	}
	return 0, false
}

// Group is one rank's view of a process group.
type Group struct {
	Size, Rank int
	Backend    string // "nccl"
}

// New returns rank's view of a group of size ranks.
func New(size, rank int, backend string) (*Group, error) {
	if size < 1 {
		return nil, fmt.Errorf("world_size must be >= 1, got %d", size)
	}
	if rank < 0 || rank >= size {
		return nil, fmt.Errorf("rank %d is out of range for world_size %d", rank, size)
	}
	if backend == "" {
		backend = "nccl"
	}
	return &Group{Size: size, Rank: rank, Backend: backend}, nil
}

func checkContiguous(fname, which string, t *tensor.Tensor) error {
	if !t.IsContiguous() {
		return fmt.Errorf("%s: Tensors must be contiguous (%s is not)", fname, which)
	}
	return nil
}

// AllReduce is dist.all_reduce(t, op): in place. With data, the sum is
// Size × t, the average and the extrema t itself, the product t^Size.
func (g *Group) AllReduce(t *tensor.Tensor, op ReduceOp) error {
	const fname = "dist.all_reduce"
	if err := checkContiguous(fname, "tensor", t); err != nil {
		return err
	}
	if !t.HasData() || g.Size == 1 {
		return nil
	}
	switch op {
	case Sum:
		_, err := tensor.BinaryInPlace(tensor.OpMul, t, tensor.Int(int64(g.Size)))
		return err
	case Product:
		for i := 1; i < g.Size; i++ {
			c, err := tensor.Clone(t)
			if err != nil {
				return err
			}
			if _, err := tensor.BinaryInPlace(tensor.OpMul, t, c); err != nil {
				return err
			}
			tensor.Dropped(c)
		}
	}
	return nil
}

// AllGatherIntoTensor is dist.all_gather_into_tensor(output, input):
// output (Size × input's elements, of input's dtype) gets every rank's
// input, rank after rank; nothing is allocated.
func (g *Group) AllGatherIntoTensor(out, in *tensor.Tensor) error {
	const fname = "dist.all_gather_into_tensor"
	if err := checkContiguous(fname, "output", out); err != nil {
		return err
	}
	if err := checkContiguous(fname, "input", in); err != nil {
		return err
	}
	if out.DType() != in.DType() {
		return fmt.Errorf("%s: output tensor must have the same type as input tensor", fname)
	}
	if out.Numel() != g.Size*in.Numel() {
		return fmt.Errorf("%s: output tensor size must be equal to world_size times input tensor size (%d != %d × %d)", fname, out.Numel(), g.Size, in.Numel())
	}
	if !out.HasData() || in.Numel() == 0 {
		return nil
	}
	flat, err := tensor.Reshape(out, []int{g.Size, in.Numel()})
	if err != nil {
		return err
	}
	src, err := tensor.Reshape(in, []int{in.Numel()})
	if err != nil {
		return err
	}
	for r := range g.Size {
		row, err := tensor.Select(flat, 0, r)
		if err != nil {
			return err
		}
		if _, err := row.Copy_(src); err != nil {
			return err
		}
	}
	return nil
}

// ReduceScatterTensor is dist.reduce_scatter_tensor(output, input, op):
// input holds Size chunks of output's elements; output gets the reduction
// over the ranks of this rank's chunk (the sum: Size × the chunk).
func (g *Group) ReduceScatterTensor(out, in *tensor.Tensor, op ReduceOp) error {
	const fname = "dist.reduce_scatter_tensor"
	if err := checkContiguous(fname, "output", out); err != nil {
		return err
	}
	if err := checkContiguous(fname, "input", in); err != nil {
		return err
	}
	if out.DType() != in.DType() {
		return fmt.Errorf("%s: input tensor must be the same type as the output tensor", fname)
	}
	if in.Numel() != g.Size*out.Numel() {
		return fmt.Errorf("%s: input tensor must be the same size as output size times world size (%d != %d × %d)", fname, in.Numel(), out.Numel(), g.Size)
	}
	if !out.HasData() || out.Numel() == 0 {
		return nil
	}
	flat, err := tensor.Reshape(in, []int{g.Size, out.Numel()})
	if err != nil {
		return err
	}
	chunk, err := tensor.Select(flat, 0, g.Rank)
	if err != nil {
		return err
	}
	dst, err := tensor.Reshape(out, []int{out.Numel()})
	if err != nil {
		return err
	}
	if _, err := dst.Copy_(chunk); err != nil {
		return err
	}
	if op == Sum && g.Size > 1 {
		_, err = tensor.BinaryInPlace(tensor.OpMul, dst, tensor.Int(int64(g.Size)))
	}
	return err
}

// Broadcast is dist.broadcast(t, src): every rank gets src's tensor,
// which all ranks already hold; nothing changes.
func (g *Group) Broadcast(t *tensor.Tensor, src int) error {
	if src < 0 || src >= g.Size {
		return fmt.Errorf("dist.broadcast: src %d is out of range for world_size %d", src, g.Size)
	}
	return checkContiguous("dist.broadcast", "tensor", t)
}
