package tensor

import (
	"runtime"
	"slices"
	"strings"
)

// Data-dependent index ops: nonzero (and the one-argument where built on
// it), nonzero_static, one_hot. nonzero's result size depends on the
// values, so it cannot run on a meta device; nonzero_static's size is an
// argument, so it runs everywhere.

// Nonzero is torch.nonzero(t): the int64 indices of t's nonzero elements,
// [n, t.Dim()] in row-major order of the elements (a 0-dim t gives
// [n, 0]). On a CUDA device the result is laid out as CUDA's nonzero
// writes it, the transpose of a contiguous [t.Dim(), n] (strides (1, n)),
// so its columns — torch.where(t)'s tensors — are contiguous; on the CPU
// it is contiguous. CUDA's kernel also takes, on simulated GPUs that model
// its own allocations (presets), a contiguous copy of a non-contiguous t,
// the 4-byte count of nonzeros and cub's temporary storage for the count
// and for the selection (each modelled as one 1-byte request: cub asks for
// 1 byte for an input of one tile and a few hundred bytes beyond, all
// within the allocator's 512-byte block up to about 10^6 elements) —
// allocated around the result and freed when the op returns, as
// nonzero_cuda_out_impl does. On a meta device it fails: the count is
// unknown there (NonzeroStatic takes it as an argument).
func Nonzero(t *Tensor) (*Tensor, error) {
	const fname = "tensor.nonzero"
	if err := t.checkLive(fname); err != nil {
		return nil, err
	}
	if t.isMeta() {
		return nil, errorf(fname, "device %s is meta: nonzero's result size depends on the values, which are not stored; use nonzero_static(input, size=N) with the count known (for a Mixture-of-Experts router, from its routing plan)", t.mem.Device())
	}
	if onGPU(t) != nil {
		return stagedTensor(t.ctx, fname, []*Tensor{t}, func(s *staging) (*Tensor, error) {
			return nonzero(fname, s.shadowOf(t))
		})
	}
	return nonzero(fname, t)
}

func nonzero(fname string, t *Tensor) (*Tensor, error) {
	var count int
	var flat []int
	collect := func() {
		if !t.hasData() {
			return
		}
		for i, b := range getBool(t) {
			if b {
				flat = append(flat, i)
			}
		}
		count = len(flat)
	}
	var out *Tensor
	var err error
	if strings.HasPrefix(t.mem.Device(), "cuda") {
		// nonzero_cuda_out_impl: self.contiguous(), the count, cub's
		// reduce storage (freed at once), the result, cub's select
		// storage (freed at once); the count and the copy go at return.
		tmp := newCUDATemps(t)
		defer tmp.close()
		if !t.isContiguous() {
			if _, err := tmp.take(uint64(t.NBytes()), "nonzero: contiguous copy"); err != nil {
				return nil, errorf(fname, "%w", err)
			}
		}
		if _, err := tmp.take(4, "nonzero: count"); err != nil {
			return nil, errorf(fname, "%w", err)
		}
		h, err := tmp.take(1, "nonzero: cub reduce storage")
		if err != nil {
			return nil, errorf(fname, "%w", err)
		}
		tmp.free(h)
		collect()
		if out, err = newTensor(t.ctx, fname, t.mem.Device(), Int64, []int{len(t.shape), count}); err != nil {
			return nil, err
		}
		out = out.viewOf([]int{count, len(t.shape)}, []int{1, max(count, 1)}, 0)
		out.view = false
		release := t.ctx.Hold(out)
		h, err = tmp.take(1, "nonzero: cub select storage")
		release()
		if err != nil {
			Dropped(out)
			return nil, errorf(fname, "%w", err)
		}
		tmp.free(h)
	} else {
		collect()
		if out, err = newTensor(t.ctx, fname, t.mem.Device(), Int64, []int{count, len(t.shape)}); err != nil {
			return nil, err
		}
	}
	writeNonzero(out, t.shape, flat, count, 0)
	runtime.KeepAlive(t)
	return out, t.ctx.interrupted(fname)
}

// writeNonzero writes the multi-indices of the flat element numbers flat
// (within shape) into out's first rows, and fill into the rest of its
// rows.
func writeNonzero(out *Tensor, shape []int, flat []int, rows int, fill int64) {
	if !out.hasData() || out.Numel() == 0 {
		return
	}
	nd := len(shape)
	vals := make([]float64, 0, rows*nd)
	for r := range rows {
		if r >= len(flat) {
			for range nd {
				vals = append(vals, float64(fill))
			}
			continue
		}
		f := flat[r]
		row := make([]float64, nd)
		for d := nd - 1; d >= 0; d-- {
			row[d] = float64(f % shape[d])
			f /= shape[d]
		}
		vals = append(vals, row...)
	}
	setF64(out, vals)
}

// NonzeroStatic is torch.nonzero_static(t, size=size, fill_value=fill)
// (PyTorch 2.1+): nonzero's indices in a result of exactly size rows —
// the first size nonzeros, then rows of fill — so its shape never depends
// on the values and it runs on a meta device too (allocating, writing
// nothing). Layout as Nonzero's. On presets, CUDA's
// nonzero_static_cuda_out_impl also takes a contiguous copy of a
// non-contiguous t, and, when the result is not empty, the per-block
// counts (4 bytes per block) and their int64 running sums (8 per block)
// for grid_size blocks of 512 threads × 16 elements spread over the
// card's multiprocessors (twice as many blocks for 1-byte dtypes), freed
// when it returns. Errors: size < 0 ("nonzero_static: 'size' must be an
// non-negative integer").
func NonzeroStatic(t *Tensor, size int, fill int64) (*Tensor, error) {
	const fname = "tensor.nonzero_static"
	if err := t.checkLive(fname); err != nil {
		return nil, err
	}
	if size < 0 {
		return nil, errorf(fname, "nonzero_static: 'size' must be an non-negative integer")
	}
	if onGPU(t) != nil {
		return stagedTensor(t.ctx, fname, []*Tensor{t}, func(s *staging) (*Tensor, error) {
			return nonzeroStatic(fname, s.shadowOf(t), size, fill)
		})
	}
	return nonzeroStatic(fname, t, size, fill)
}

func nonzeroStatic(fname string, t *Tensor, size int, fill int64) (*Tensor, error) {
	nd := len(t.shape)
	var out *Tensor
	var err error
	if strings.HasPrefix(t.mem.Device(), "cuda") {
		tmp := newCUDATemps(t)
		defer tmp.close()
		if !t.isContiguous() {
			if _, err := tmp.take(uint64(t.NBytes()), "nonzero_static: contiguous copy"); err != nil {
				return nil, errorf(fname, "%w", err)
			}
		}
		if out, err = newTensor(t.ctx, fname, t.mem.Device(), Int64, []int{nd, size}); err != nil {
			return nil, err
		}
		out = out.viewOf([]int{size, nd}, []int{1, max(size, 1)}, 0)
		out.view = false
		if sms, ok := presetSMs(t); ok && out.Numel() > 0 {
			release := t.ctx.Hold(out)
			grid := nonzeroStaticGrid(int64(t.Numel()), t.dtype.Size(), sms)
			_, err := tmp.take(uint64(4*grid), "nonzero_static: block counts")
			if err == nil {
				_, err = tmp.take(uint64(8*grid), "nonzero_static: block sums")
			}
			release()
			if err != nil {
				Dropped(out)
				return nil, errorf(fname, "%w", err)
			}
		}
	} else if out, err = newTensor(t.ctx, fname, t.mem.Device(), Int64, []int{size, nd}); err != nil {
		return nil, err
	}
	if t.hasData() {
		var flat []int
		for i, b := range getBool(t) {
			if b && len(flat) < size {
				flat = append(flat, i)
			}
		}
		writeNonzero(out, t.shape, flat, size, fill)
	}
	runtime.KeepAlive(t)
	return out, t.ctx.interrupted(fname)
}

// nonzeroStaticGrid is nonzero_static_cuda_out_impl's grid: blocks of
// 512 × 16 elements, at most one per multiprocessor (two for 1-byte
// elements) with each taking ceil(blocks/target) tiles.
func nonzeroStaticGrid(numel int64, elem, sms int) int64 {
	const tile = 512 * 16
	grid := ceilDiv(numel, tile)
	target := int64(sms)
	if elem == 1 {
		target *= 2
	}
	iters := ceilDiv(grid, target)
	if iters == 0 {
		return 0
	}
	return ceilDiv(numel, iters*tile)
}

// presetSMs returns the multiprocessor count of t's device when it is a
// simulated GPU that models PyTorch's CUDA kernels (presetAllocator).
func presetSMs(t *Tensor) (int, bool) {
	if presetAllocator(t) == nil {
		return 0, false
	}
	_, d := t.ctx.deviceOf(t.Device())
	sms, _, ok := d.(ReduceDevice).Multiprocessors()
	return sms, ok
}

// OneHot is F.one_hot(t, num_classes): an int64 tensor of t's shape plus
// a last dimension of num_classes, 1 at each of t's values and 0
// elsewhere: at::zeros of that shape, then scatter_ (one allocation). With
// num_classes −1 the count is t.max() + 1: a 0-dim int64 the reduction
// allocates (and frees), and the values must be readable (not on a meta
// device). On the CPU t.min() and t.max() are checked first (two 0-dim
// temporaries); CUDA checks neither (a device assert, which memsh reports
// with the CPU's message when it has the values). An empty t gives an
// uninitialised empty result of num_classes classes. Errors are
// PyTorch's: t not int64 ("one_hot is only applicable to index tensor of
// type LongTensor."), negative values ("Class values must be
// non-negative."), values ≥ num_classes ("Class values must be smaller
// than num_classes."), num_classes < 1 on CUDA ("num_classes should be
// positive"), an empty t without num_classes ("Can not infer total number
// of classes from empty tensor.").
func OneHot(t *Tensor, numClasses int) (*Tensor, error) {
	const fname = "nn.functional.one_hot"
	if err := t.checkLive(fname); err != nil {
		return nil, err
	}
	if t.dtype != Int64 {
		return nil, errorf(fname, "one_hot is only applicable to index tensor of type LongTensor.")
	}
	shape := slices.Clone(t.shape)
	if t.Numel() == 0 {
		if numClasses <= 0 {
			return nil, errorf(fname, "Can not infer total number of classes from empty tensor.")
		}
		return newTensor(t.ctx, fname, t.mem.Device(), Int64, append(shape, numClasses))
	}
	extreme := func(kind reduceKind) (int64, error) {
		v, _, err := extremeOp(kind, fname, t, 0, false, false)
		if err != nil {
			return 0, err
		}
		defer Dropped(v)
		s, err := item(fname, v)
		return s.i, err
	}
	cuda := strings.HasPrefix(t.mem.Device(), "cuda")
	if !cuda {
		lo, err := extreme(redMin)
		if err != nil {
			return nil, err
		}
		if lo < 0 {
			return nil, errorf(fname, "Class values must be non-negative.")
		}
	}
	if numClasses == -1 {
		hi, err := extreme(redMax)
		if err != nil {
			return nil, err
		}
		numClasses = int(hi) + 1
	} else if !cuda {
		hi, err := extreme(redMax)
		if err != nil {
			return nil, err
		}
		if int64(numClasses) <= hi {
			return nil, errorf(fname, "Class values must be smaller than num_classes.")
		}
	} else if numClasses < 1 {
		return nil, errorf(fname, "num_classes should be positive")
	}
	var vals []int64
	if t.hasData() || onGPU(t) != nil {
		var bad error
		err := hostCompute(fname, []*Tensor{t}, func(sh []*Tensor) {
			vals = getI64(sh[0])
			for _, v := range vals {
				switch {
				case v < 0:
					bad = errorf(fname, "Class values must be non-negative.")
				case v >= int64(numClasses):
					bad = errorf(fname, "Class values must be smaller than num_classes.")
				}
			}
		})
		if err == nil {
			err = bad
		}
		if err != nil {
			return nil, err
		}
	}
	out, err := Zeros(t.ctx, append(shape, numClasses), Int64, t.mem.Device())
	if err != nil {
		return nil, Renamed(err, fname)
	}
	if vals != nil {
		err = hostCompute(fname, []*Tensor{out}, func(sh []*Tensor) {
			res := make([]float64, out.Numel())
			for i, v := range vals {
				res[i*numClasses+int(v)] = 1
			}
			setF64(sh[0], res)
		})
		if err != nil {
			Dropped(out)
			return nil, err
		}
	}
	return out, nil
}
