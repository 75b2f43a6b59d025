package dist

import (
	"slices"

	"github.com/memsh/memsh/tensor"
	"github.com/memsh/memsh/tensor/autograd"
)

// ZeRO-3's gradients and step (docs/reference/deepspeed_zero3.md §4-5).

// gradHook is each trainable parameter's post-accumulate-grad hook
// (reduce_independent_p_g_buckets_and_remove_grads): the epilogue queued
// at a backward's first gradient; a bucket without room reduced first;
// the gradient copied into the bucket (its own tensor freed), or, larger
// than the bucket's room, kept for the next reduction.
func (z *ZeRO3) gradHook(t *tensor.Tensor) error {
	zp := z.byTensor[t]
	g := autograd.Grad(t)
	if zp == nil || g == nil {
		return nil
	}
	if !z.armed {
		z.armed = true
		if err := autograd.QueueCallback(z.ctx, z.epilogue); err != nil {
			return err
		}
	}
	R := z.cfg.ReduceBucketSize
	if z.ipgElems > 0 && z.ipgElems+zp.n > R {
		if err := z.reduce(); err != nil {
			return err
		}
	}
	if z.ipgElems+zp.n <= R {
		if err := moveGrad(t, g, z.ipg, z.ipgElems); err != nil {
			return err
		}
		z.ipgElems += zp.n
	}
	z.ipgParams = append(z.ipgParams, zp)
	z.changed()
	return nil
}

// reduce is __reduce_and_partition_ipg_grads: the bucket's gradients (by
// ds_id) reduce-scattered — one gradient of a multiple of N elements in
// place, else each cut into N chunks of c_p (a short one padded: a small
// tensor each, freed on return) and their chunks concatenated rank by
// rank (Σ c_p·N elements, freed on return) — and this rank's chunk of
// each copied into its gradient partition; the gradients cleared (a
// gradient outside the bucket freed).
func (z *ZeRO3) reduce() error {
	ps := slices.Clone(z.ipgParams)
	slices.SortFunc(ps, func(a, b *Z3Param) int { return a.id - b.id })
	z.ipgParams, z.ipgElems = z.ipgParams[:0], 0
	if len(ps) == 0 {
		return nil
	}
	N := z.g.Size
	ctx, dev, dt := z.ctx, z.dev, z.cfg.DType
	var grads []*tensor.Tensor
	for _, p := range ps {
		grads = append(grads, autograd.Grad(p.T))
	}
	release := ctx.Hold(grads...)
	defer release()
	if !(len(ps) == 1 && ps[0].n%N == 0) {
		var pads []*tensor.Tensor
		total := 0
		for _, p := range ps {
			total += p.c
			for r := range N {
				if _, k := ChunkSize(p.n, N, r); k < p.c {
					pad, err := tensor.Empty(ctx, []int{p.c - k}, dt, dev)
					if err != nil {
						return err
					}
					pads = append(pads, pad)
					ctx.Hold(pad)
				}
			}
		}
		cat, err := tensor.Empty(ctx, []int{total * N}, dt, dev)
		if err != nil {
			return err
		}
		if cat.HasData() {
			// this rank's chunk of each gradient, averaged over the ranks
			// (which hold the same values)
			for i, p := range ps {
				g := grads[i]
				if g == nil {
					continue
				}
				flat, err := tensor.Reshape(g, []int{p.n})
				if err != nil {
					return err
				}
				start, k := ChunkSize(p.n, N, z.g.Rank)
				if k > 0 {
					src, err := tensor.Narrow(flat, 0, start, k)
					var dst *tensor.Tensor
					if err == nil {
						dst, err = tensor.Narrow(z.gradParts, 0, p.off, k)
					}
					if err == nil {
						_, err = dst.Copy_(src)
					}
					if err != nil {
						return err
					}
				}
			}
		}
		tensor.Dropped(cat)
		tensor.Dropped(pads...)
	} else if g := grads[0]; g != nil && z.gradParts.HasData() {
		flat, err := tensor.Reshape(g, []int{ps[0].n})
		if err == nil {
			start, k := ChunkSize(ps[0].n, N, z.g.Rank)
			var src, dst *tensor.Tensor
			if src, err = tensor.Narrow(flat, 0, start, k); err == nil {
				if dst, err = tensor.Narrow(z.gradParts, 0, ps[0].off, k); err == nil {
					_, err = dst.Copy_(src)
				}
			}
		}
		if err != nil {
			return err
		}
	}
	for i, p := range ps {
		if grads[i] == nil {
			continue
		}
		if err := autograd.SetGrad(p.T, nil); err != nil {
			return err
		}
		p.T.ReachChanged()
		tensor.Dropped(grads[i])
	}
	z.reduced = true
	z.changed()
	return nil
}

// epilogue ends a backward (independent_gradient_partition_epilogue,
// then backward_epilogue): the bucket's last gradients reduced, then the
// parameters of modules without a post-backward released.
func (z *ZeRO3) epilogue() error {
	z.armed = false
	if err := z.reduce(); err != nil {
		return err
	}
	return z.releaseLeftovers()
}

// Step is the engine's step() (DeepSpeedZeroOptimizer_Stage3.step):
// every gathered parameter released; the norm (per parameter a float64
// copy of its gradient partition, freed; the norms' stack; the global
// norm kept); per sub-group the gradient partitions concatenated (when
// more than one) and cast to fp32, the concatenation freed, Adam's
// moments at the first step, the master copied into the flat buffer,
// the fp32 gradient freed; then the persistent parameters gathered
// again. Nothing without a backward since the last step.
func (z *ZeRO3) Step() error {
	if !z.reduced {
		return nil
	}
	if err := z.releaseAll(); err != nil {
		return err
	}
	ctx, dev := z.ctx, z.dev
	sizes := make([]int, len(z.trainable))
	for i, p := range z.trainable {
		sizes[i] = p.c
	}
	if err := gradNorm(ctx, dev, sizes, &z.norm); err != nil {
		return err
	}
	z.changed()
	for gi, sg := range z.subgroups {
		view, err := z.subgroupView(z.gradParts, sg)
		if err != nil {
			return err
		}
		flat := view
		if sg[1]-sg[0] > 1 {
			// flatten of the per-parameter views: a copy (torch.cat)
			if flat, err = tensor.Clone(view); err != nil {
				return err
			}
		}
		rel := ctx.Hold(flat)
		g32, err := tensor.To(flat, "", tensor.Float32, true)
		rel()
		if flat != view {
			tensor.Dropped(flat)
		}
		if err != nil {
			return err
		}
		rel = ctx.Hold(g32)
		if z.exp[gi][0] == nil {
			for k := range 2 {
				if z.exp[gi][k], err = tensor.Zeros(ctx, []int{g32.Numel()}, tensor.Float32, dev); err != nil {
					rel()
					return err
				}
			}
			z.changed()
		}
		rel()
		// the master into the flat buffer's bfloat16 partitions, in place
		if part, err := z.subgroupView(z.flat, sg); err == nil && part.HasData() {
			if _, err := part.Copy_(z.masters[gi]); err != nil {
				return err
			}
		} else if err != nil {
			return err
		}
		tensor.Dropped(g32)
	}
	z.reduced = false
	// _post_step: the persistent parameters gathered again
	for _, p := range z.params {
		if p.persist {
			if err := z.gatherSync(p); err != nil {
				return err
			}
		}
	}
	return nil
}
