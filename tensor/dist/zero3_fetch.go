package dist

import (
	"math"
	"slices"

	"github.com/memsh/memsh/tensor"
)

// ZeRO-3's parameter coordinator (PartitionedParameterCoordinator,
// docs/reference/deepspeed_zero3.md §3): a module's own parameters are
// gathered before its forward and in its backward, and released after
// them. The first iteration records the modules' fetches, forward and
// backward (the trace); from the second the parameters are prefetched
// along it, stage3_prefetch_bucket_size elements at each fetch within
// stage3_max_live_parameters, and a module's parameters stay gathered
// when the trace uses them again within stage3_max_reuse_distance
// elements of parameters.

type traceMode uint8

const (
	traceInvalid traceMode = iota
	traceRecord
	traceComplete
)

// ZeRO3Module is a module's record for the coordinator: its own
// parameters, by ds_id.
type ZeRO3Module struct {
	params []*Z3Param
	// pending is the fetches in backward not released yet
	pending int
}

type traceEntry struct {
	p    *Z3Param
	step int
}

type coordinator struct {
	z      *ZeRO3
	mode   traceMode
	order  []*ZeRO3Module // __submodule_order
	trace  []traceEntry
	head   int // the fetch queue: trace[head:]
	step   int // __step_id
	avail  int // __n_available_params
	active []*ZeRO3Module
}

// gatherHandle is an all-gather in flight: one parameter's buffer, or a
// coalesced one's flat output for several.
type gatherHandle struct {
	flat   *tensor.Tensor // coalesced: Σ c_p·N elements
	params []*Z3Param
	waited bool
	left   int // parameters not yet taken by a module's fetch
}

// Module records a module whose own parameters are params (those of the
// model's the engine manages).
func (z *ZeRO3) Module(params []*tensor.Tensor) *ZeRO3Module {
	m := &ZeRO3Module{}
	for _, p := range params {
		if zp := z.byTensor[p]; zp != nil && !slices.Contains(m.params, zp) {
			m.params = append(m.params, zp)
		}
	}
	slices.SortFunc(m.params, func(a, b *Z3Param) int { return a.id - b.id })
	return m
}

// ResetStep is the root module's forward pre-hook (reset_step): the
// first iteration records the trace, the second completes it, each
// later one refills the fetch queue.
func (z *ZeRO3) ResetStep() {
	c := &z.coord
	switch c.mode {
	case traceInvalid:
		c.mode, c.order = traceRecord, nil
	case traceRecord:
		c.trace = c.trace[:0]
		for k, m := range c.order {
			for _, p := range m.params {
				c.trace = append(c.trace, traceEntry{p, k})
			}
		}
		c.mode = traceComplete
	}
	c.head, c.step, c.avail = 0, 0, 0
	for _, p := range z.params {
		p.notBefore = math.MinInt
	}
}

// Fetch gathers m's parameters before its forward (or, backward, before
// its backward), then prefetches along the trace.
func (z *ZeRO3) Fetch(m *ZeRO3Module, backward bool) error {
	c := &z.coord
	k := c.step
	switch c.mode {
	case traceRecord:
		c.order = append(c.order, m)
	case traceComplete:
		if k >= len(c.order) || c.order[k] != m {
			// the modules ran otherwise: the trace is recorded again
			c.mode = traceInvalid
		}
	}
	c.active = append(c.active, m)
	if backward {
		m.pending++
	}
	if c.mode == traceComplete {
		// the current fetch's entries leave the queue
		need := 0
		for _, p := range m.params {
			if p.notBefore < k {
				need++
			}
		}
		seen := map[*Z3Param]bool{}
		for c.head < len(c.trace) && len(seen) < need {
			e := c.trace[c.head]
			c.head++
			e.p.notBefore = e.step
			seen[e.p] = true
		}
	}
	var demand []*Z3Param
	for _, p := range m.params {
		if p.state == notAvailable {
			demand = append(demand, p)
		}
	}
	if len(demand) > 0 {
		if err := z.allGather(demand); err != nil {
			return err
		}
	}
	for _, p := range m.params {
		if err := z.take(p); err != nil {
			return err
		}
	}
	if c.mode == traceComplete {
		budget := min(z.cfg.MaxLiveParameters-c.avail, z.cfg.PrefetchBucketSize)
		var sel []*Z3Param
		numel := 0
		for c.head < len(c.trace) && numel < budget {
			e := c.trace[c.head]
			c.head++
			e.p.notBefore = max(e.p.notBefore, e.step)
			if e.p.state == notAvailable && !slices.Contains(sel, e.p) {
				sel = append(sel, e.p)
				numel += e.p.n
			}
		}
		if len(sel) > 0 {
			if err := z.allGather(sel); err != nil {
				return err
			}
		}
	}
	c.step++
	return nil
}

// allGather submits ps as one all_gather_coalesced: one parameter gets
// its buffer (c_p·N elements; its data a view of it), several one flat
// output (Σ c_p·N) whose per-parameter copies come at the first wait; on
// one rank the data is a view of the partition.
func (z *ZeRO3) allGather(ps []*Z3Param) error {
	slices.SortFunc(ps, func(a, b *Z3Param) int { return a.id - b.id })
	c := &z.coord
	for _, p := range ps {
		c.avail += p.n
	}
	if z.g.Size == 1 {
		for _, p := range ps {
			if err := z.install(p, p.part); err != nil {
				return err
			}
			p.gathered = nil
		}
		return nil
	}
	if len(ps) == 1 {
		p := ps[0]
		if err := z.gatherSync(p); err != nil {
			return err
		}
		p.state = inflight
		p.handle = &gatherHandle{params: ps, left: 1, waited: true}
		return nil
	}
	total := 0
	for _, p := range ps {
		total += p.c
	}
	flat, err := tensor.Empty(z.ctx, []int{total * z.g.Size}, z.cfg.DType, z.dev)
	if err != nil {
		return err
	}
	if flat.HasData() {
		// every rank's slot: its partitions one after another (this
		// rank's, on every rank)
		for r := range z.g.Size {
			off := r * total
			for _, p := range ps {
				dst, err := tensor.Narrow(flat, 0, off, p.c)
				if err == nil {
					_, err = dst.Copy_(p.part)
				}
				if err != nil {
					return err
				}
				off += p.c
			}
		}
	}
	h := &gatherHandle{flat: flat, params: slices.Clone(ps), left: len(ps)}
	for _, p := range ps {
		p.state, p.handle = inflight, h
	}
	z.changed()
	return nil
}

// take is a fetch's wait on p in flight: its registry entry popped; a
// coalesced handle's first wait gives every parameter in it its own copy
// (torch.cat of its N slices), and the flat output is freed once every
// one of them was taken.
func (z *ZeRO3) take(p *Z3Param) error {
	h := p.handle
	if h == nil {
		return nil
	}
	if err := z.wait(h); err != nil {
		return err
	}
	p.handle = nil
	h.left--
	if h.left == 0 && h.flat != nil {
		tensor.Dropped(h.flat)
		h.flat = nil
	}
	z.changed()
	return nil
}

// wait completes h: a coalesced gather's copies, every parameter
// available.
func (z *ZeRO3) wait(h *gatherHandle) error {
	if !h.waited {
		h.waited = true
		off := 0
		for _, q := range h.params {
			cp, err := tensor.Empty(z.ctx, []int{q.n}, z.cfg.DType, z.dev)
			if err != nil {
				return err
			}
			if cp.HasData() && h.flat.HasData() {
				for r := range z.g.Size {
					_, k := ChunkSize(q.n, z.g.Size, r)
					if k == 0 {
						continue
					}
					src, err := tensor.Narrow(h.flat, 0, r*z.flatChunk(h)+off, k)
					if err == nil {
						var dst *tensor.Tensor
						if dst, err = tensor.Narrow(cp, 0, r*q.c, k); err == nil {
							_, err = dst.Copy_(src)
						}
					}
					if err != nil {
						return err
					}
				}
			}
			if err := z.install(q, cp); err != nil {
				return err
			}
			off += q.c
		}
	}
	for _, q := range h.params {
		if q.state == inflight {
			q.state = available
		}
	}
	return nil
}

// flatChunk is a coalesced handle's elements per rank.
func (z *ZeRO3) flatChunk(h *gatherHandle) int {
	n := 0
	for _, q := range h.params {
		n += q.c
	}
	return n
}

// Release is a module's release after its forward or backward: every one
// of its parameters in the first iteration; from the second its
// non-persistent ones the trace does not use again soon (the
// prefetcher's marks, then the reuse distance).
func (z *ZeRO3) Release(m *ZeRO3Module, backward bool) error {
	c := &z.coord
	if i := slices.Index(c.active, m); i >= 0 {
		c.active = slices.Delete(c.active, i, i+1)
	}
	if backward && m.pending > 0 {
		m.pending--
	}
	cand := slices.Clone(m.params)
	if c.mode == traceComplete {
		cand = slices.DeleteFunc(cand, func(p *Z3Param) bool { return p.persist || p.notBefore > c.step })
		walked := 0
		for j := c.step; j < len(c.order) && walked < z.cfg.MaxReuseDistance; j++ {
			for _, p := range c.order[j].params {
				cand = slices.DeleteFunc(cand, func(q *Z3Param) bool { return q == p })
				walked += p.n
			}
		}
	}
	for _, p := range cand {
		if p.state != available || z.usedByActive(p) {
			continue
		}
		if err := z.take(p); err != nil {
			return err
		}
		z.free(p)
		c.avail -= p.n
	}
	return nil
}

func (z *ZeRO3) usedByActive(p *Z3Param) bool {
	for _, m := range z.coord.active {
		if slices.Contains(m.params, p) {
			return true
		}
	}
	return false
}

// releaseLeftovers is release_backward_leftovers: the modules fetched in
// the backward that had no post-backward (inputs that need no gradient).
func (z *ZeRO3) releaseLeftovers() error {
	for _, m := range slices.Clone(z.coord.active) {
		if m.pending > 0 {
			m.pending = 1
			if err := z.Release(m, true); err != nil {
				return err
			}
		}
	}
	return nil
}

// releaseAll is release_and_reset_all: in-flight gathers completed, then
// every gathered parameter released, persistent ones too.
func (z *ZeRO3) releaseAll() error {
	for _, p := range z.params {
		if h := p.handle; h != nil {
			if err := z.take(p); err != nil {
				return err
			}
		}
	}
	for _, p := range z.params {
		if p.state == available {
			z.free(p)
		}
	}
	c := &z.coord
	c.avail, c.active = 0, c.active[:0]
	return nil
}
