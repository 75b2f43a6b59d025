package dist

import (
	"github.com/memsh/memsh/tensor"
	"github.com/memsh/memsh/tensor/autograd"
)

// ZeRO's backward and step (see zero.go).

// hook is each parameter's post-accumulate-grad hook: the bucket at the
// first gradient of a backward (and the epilogue queued for its end);
// stage 2 moves the gradient into the bucket.
func (z *ZeRO) hook(p *tensor.Tensor) error {
	ctx := p.Context()
	if !z.armed {
		z.armed = true
		if err := autograd.QueueCallback(ctx, z.epilogue); err != nil {
			return err
		}
		b, err := tensor.Empty(ctx, []int{z.bucket}, z.dt, p.Device())
		if err != nil {
			return err
		}
		z.ipg, z.ipgElems = b, 0
		z.changed()
	}
	if z.stage == 1 {
		return nil
	}
	return z.toBucket(z.index[p])
}

// toBucket copies parameter i's gradient into the bucket (flushing a full
// one first) and makes the gradient its view; a parameter larger than
// the bucket is reduced from its own gradient at the next flush.
func (z *ZeRO) toBucket(i int) error {
	p := z.params[i]
	g := autograd.Grad(p)
	if g == nil || p.Numel() == 0 {
		return nil
	}
	n := p.Numel()
	if n > z.bucket {
		z.large = append(z.large, i)
		return nil
	}
	if z.ipgElems+n > z.bucket {
		if err := z.reduceIPG(); err != nil {
			return err
		}
	}
	if err := moveGrad(p, g, z.ipg, z.ipgElems); err != nil {
		return err
	}
	z.ipgIdx = append(z.ipgIdx, i)
	z.ipgElems += n
	return nil
}

// moveGrad makes p's gradient g a view of buf at element off, with g's
// values, and lets g go (its tensor is freed unless something else holds
// it).
func moveGrad(p, g, buf *tensor.Tensor, off int) error {
	v, err := tensor.Narrow(buf, 0, off, p.Numel())
	if err == nil {
		v, err = tensor.View(v, p.Shape())
	}
	if err == nil && v.HasData() {
		_, err = v.Copy_(g)
	}
	if err == nil {
		err = autograd.SetGrad(p, v)
	}
	if err != nil {
		return err
	}
	p.ReachChanged()
	tensor.Dropped(g)
	return nil
}

// ranks returns the partitions parameter i spans.
func (z *ZeRO) ranks(i int) (lo, hi int) {
	return z.offs[i] / z.P, (z.offs[i] + z.params[i].Numel() - 1) / z.P
}

// reduceIPG is reduce_ipg_grads: the bucket's flat copy when it holds
// slices of two or more partitions (all-reduced, freed), each large
// parameter's likewise in sub-buckets of reduce_bucket_size, then each
// gradient kept (copied into grads_in_partition) or dropped.
func (z *ZeRO) reduceIPG() error {
	ctx, dev := z.flat.Context(), z.flat.Device()
	slices, last := 0, -1
	for _, i := range z.ipgIdx {
		lo, hi := z.ranks(i)
		slices += hi - lo + 1
		if lo == last {
			slices-- // merged with the previous parameter's slice
		}
		last = hi
	}
	if slices >= 2 {
		if err := z.transient(ctx, dev, z.ipgElems, z.dt); err != nil {
			return err
		}
	}
	for _, i := range z.large {
		// the slices of its own gradient, flattened in sub-buckets that
		// end once past reduce_bucket_size
		lo, hi := z.ranks(i)
		run, k := 0, 0
		for r := lo; r <= hi; r++ {
			a := max(z.offs[i], r*z.P)
			b := min(z.offs[i]+z.params[i].Numel(), (r+1)*z.P)
			run += b - a
			k++
			if run > z.bucket || r == hi {
				if k >= 2 {
					if err := z.transient(ctx, dev, run, z.dt); err != nil {
						return err
					}
				}
				run, k = 0, 0
			}
		}
	}
	for _, i := range append(z.ipgIdx, z.large...) {
		if err := z.dispose(i); err != nil {
			return err
		}
	}
	z.ipgIdx, z.large, z.ipgElems = z.ipgIdx[:0], z.large[:0], 0
	z.changed()
	return nil
}

// transient allocates n elements of dt and drops them: a flat copy a
// collective reads and lets go of.
func (z *ZeRO) transient(ctx *tensor.Context, dev string, n int, dt tensor.DType) error {
	t, err := tensor.Empty(ctx, []int{n}, dt, dev)
	tensor.Dropped(t)
	return err
}

// dispose keeps parameter i's reduced gradient when it touches this
// rank's partition (its full size copied into grads_in_partition,
// allocated at the first copy) or drops it.
func (z *ZeRO) dispose(i int) error {
	p := z.params[i]
	g := autograd.Grad(p)
	if g == nil {
		return nil
	}
	if !z.inPartition(i) {
		if err := autograd.SetGrad(p, nil); err != nil {
			return err
		}
		p.ReachChanged()
		tensor.Dropped(g)
		return nil
	}
	ctx, dev := p.Context(), p.Device()
	if z.gip == nil {
		G := 0
		for j := range z.params {
			if z.inPartition(j) {
				G += z.params[j].Numel()
			}
		}
		gip, err := tensor.Empty(ctx, []int{G}, z.dt, dev)
		if err != nil {
			return err
		}
		z.gip, z.gipOff = gip, 0
	}
	if err := moveGrad(p, g, z.gip, z.gipOff); err != nil {
		return err
	}
	z.gipOff += p.Numel()
	return nil
}

// epilogue ends a backward (independent_gradient_partition_epilogue):
// stage 1's gradients through the bucket in parameter order, the last
// bucket reduced, the views of this rank's partition of the gradients
// (averaged_gradients, a zero pad when they cover less than P), the
// bucket freed and the gradients cleared.
func (z *ZeRO) epilogue() error {
	if z.stage == 1 {
		for i := range z.params {
			if err := z.toBucket(i); err != nil {
				return err
			}
		}
	}
	if err := z.reduceIPG(); err != nil {
		return err
	}
	ctx, dev := z.flat.Context(), z.flat.Device()
	lo, hi := z.g.Rank*z.P, (z.g.Rank+1)*z.P
	z.averaged = z.averaged[:0]
	covered := 0
	for i, p := range z.params {
		g := autograd.Grad(p)
		if !z.inPartition(i) || g == nil {
			continue
		}
		a := max(z.offs[i], lo) - z.offs[i]
		b := min(z.offs[i]+p.Numel(), hi) - z.offs[i]
		flat, err := tensor.Reshape(g, []int{p.Numel()})
		if err == nil {
			flat, err = tensor.Narrow(flat, 0, a, b-a)
		}
		if err != nil {
			return err
		}
		z.averaged = append(z.averaged, flat)
		covered += b - a
	}
	if covered < z.P {
		pad, err := tensor.Zeros(ctx, []int{z.P - covered}, z.dt, dev)
		if err != nil {
			return err
		}
		z.averaged = append(z.averaged, pad)
	}
	tensor.Dropped(z.ipg)
	z.ipg = nil
	for _, p := range z.params {
		if autograd.Grad(p) != nil {
			if err := autograd.SetGrad(p, nil); err != nil {
				return err
			}
			p.ReachChanged()
		}
	}
	z.armed = false
	z.changed()
	return nil
}

// gradNorm is the engine's gradient norm (get_grad_norm_direct) over
// gradient views of sizes elements: each view's float64 copy and its
// one-element norm (the copy freed), the norms' stack, the 0-dim global
// norm the engine keeps in *keep (the last step's let go).
func gradNorm(ctx *tensor.Context, dev string, sizes []int, keep **tensor.Tensor) error {
	norm, err := gradNormTensors(ctx, dev, sizes)
	if err != nil {
		return err
	}
	if *keep != nil {
		tensor.Dropped(*keep)
	}
	*keep = norm
	return nil
}

func gradNormTensors(ctx *tensor.Context, dev string, sizes []int) (*tensor.Tensor, error) {
	var norms []*tensor.Tensor
	for _, n := range sizes {
		r := ctx.Hold(norms...)
		d, err := tensor.Empty(ctx, []int{n}, tensor.Float64, dev)
		var s *tensor.Tensor
		if err == nil {
			r2 := ctx.Hold(d)
			s, err = tensor.Empty(ctx, []int{1}, tensor.Float64, dev)
			r2()
		}
		r()
		tensor.Dropped(d)
		if err != nil {
			tensor.Dropped(norms...)
			return nil, err
		}
		norms = append(norms, s)
	}
	r := ctx.Hold(norms...)
	stack, err := tensor.Empty(ctx, []int{len(norms)}, tensor.Float64, dev)
	r()
	tensor.Dropped(norms...)
	if err != nil {
		return nil, err
	}
	r = ctx.Hold(stack)
	norm, err := tensor.Empty(ctx, []int{}, tensor.Float32, dev)
	r()
	tensor.Dropped(stack)
	return norm, err
}

// Step is the engine's step() (DeepSpeedZeroOptimizer.step): nothing
// without a backward since the last one.
func (z *ZeRO) Step() error {
	if len(z.averaged) == 0 {
		return nil
	}
	ctx, dev := z.flat.Context(), z.flat.Device()
	var held []*tensor.Tensor
	hold := func(ts ...*tensor.Tensor) func() { return ctx.Hold(ts...) }
	defer func() { tensor.Dropped(held...) }()
	// the overflow check: per view a float copy, three masks and a float
	// mask; the counter and the flags (0-dim and one-element tensors)
	if z.check {
		counter, err := tensor.Empty(ctx, []int{1}, tensor.Float32, dev)
		if err != nil {
			return err
		}
		rel := hold(counter)
		for _, x := range z.averaged {
			n := x.Numel()
			var tmp []*tensor.Tensor
			for _, s := range []struct {
				n  int
				dt tensor.DType
			}{{n, tensor.Float32}, {n, tensor.Bool}, {n, tensor.Bool}, {n, tensor.Bool}, {n, tensor.Float32}, {1, tensor.Float32}} {
				r := hold(tmp...)
				t, err := tensor.Empty(ctx, []int{s.n}, s.dt, dev)
				r()
				if err != nil {
					rel()
					tensor.Dropped(tmp...)
					return err
				}
				tmp = append(tmp, t)
			}
			// the float mask goes after max(), the rest when the check returns
			tensor.Dropped(tmp...)
		}
		r := hold(counter)
		flag, err := tensor.Empty(ctx, []int{1}, tensor.Bool, dev)
		r()
		rel()
		tensor.Dropped(counter, flag)
		if err != nil {
			return err
		}
	}
	// the norm: each view's float64 copy and its norm, then their stack
	sizes := make([]int, len(z.averaged))
	for i, x := range z.averaged {
		sizes[i] = x.Numel()
	}
	err := gradNorm(ctx, dev, sizes, &z.norm)
	if err != nil {
		return err
	}
	// the gradient partition, flat, in fp32
	flat := z.averaged[0]
	if len(z.averaged) > 1 {
		if flat, err = tensor.Cat(z.averaged, 0); err != nil {
			return err
		}
		held = append(held, flat)
	}
	g32 := flat
	if z.dt != tensor.Float32 {
		r := hold(flat)
		g32, err = tensor.To(flat, "", tensor.Float32, false)
		r()
		if err != nil {
			return err
		}
	}
	if len(z.averaged) > 1 && z.dt != tensor.Float32 {
		tensor.Dropped(flat)
		clear(held) // no Go reference keeps it
		held, flat = held[:0], nil
	}
	// averaged_gradients = None: grads_in_partition goes
	tensor.Dropped(z.averaged...)
	tensor.Dropped(z.gip)
	clear(z.averaged)
	z.averaged, z.gip = z.averaged[:0], nil
	z.changed()
	rel := hold(g32)
	if z.exp[0] == nil {
		for k := range z.exp {
			if z.exp[k], err = tensor.Zeros(ctx, []int{z.P}, tensor.Float32, dev); err != nil {
				rel()
				return err
			}
		}
		z.changed()
	}
	rel()
	tensor.Dropped(g32)
	g32 = nil
	// the master into this rank's partition of the flat buffer, then the
	// all-gather in place
	part, err := z.partition(z.flat)
	if err == nil && part.HasData() {
		_, err = part.Copy_(z.master)
	}
	return err
}
