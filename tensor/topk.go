package tensor

import (
	"cmp"
	"math"
	"slices"
)

// Top-k selection: torch.topk, and memsh's routing plans for
// Mixture-of-Experts routers (RouteTopK), which allocate what topk
// allocates but choose their indices from a fixed plan instead of the
// values.

// TopK is torch.topk(t, k, dim, largest, sorted): the k largest (or, with
// largest false, smallest) elements of every slice along dim and their
// int64 indices, both of t's shape with dim resized to k and contiguous.
// The values are allocated first, then the indices; nothing else (CUDA's
// topk for MoE-sized slices — fewer than 100,000 elements per slice or
// more than 10 slices — makes no temporaries). NaN counts as larger than
// every number, as in PyTorch; among equal values the lower index comes
// first. With sorted false the order is unspecified in PyTorch; memsh
// returns them sorted. Errors: k outside [0, size of dim] ("selected
// index k out of range"), dim out of range.
func TopK(t *Tensor, k, dim int, largest, sorted bool) (values, indices *Tensor, err error) {
	const fname = "tensor.topk"
	return topkOp(fname, t, k, dim, func(sh []*Tensor, outer, n, inner int) {
		v := getF64(sh[2])
		vals := make([]float64, 0, outer*k*inner)
		idx := make([]float64, 0, outer*k*inner)
		order := make([]int, n)
		for o := range outer {
			for in := range inner {
				at := func(i int) float64 { return v[(o*n+i)*inner+in] }
				for i := range order {
					order[i] = i
				}
				slices.SortStableFunc(order, func(a, b int) int {
					c := cmpNaNLast(at(a), at(b))
					if largest {
						c = -c
					}
					return c
				})
				for j := range k {
					vals = append(vals, at(order[j]))
					idx = append(idx, float64(order[j]))
				}
			}
		}
		setF64(sh[0], transposeKInner(vals, outer, k, inner))
		setF64(sh[1], transposeKInner(idx, outer, k, inner))
	})
}

// cmpNaNLast orders numbers ascending with NaN above every number.
func cmpNaNLast(a, b float64) int {
	an, bn := math.IsNaN(a), math.IsNaN(b)
	switch {
	case an && bn:
		return 0
	case an:
		return 1
	case bn:
		return -1
	}
	return cmp.Compare(a, b)
}

// transposeKInner reorders values collected as [outer][inner][k] into the
// row-major [outer][k][inner] of the result.
func transposeKInner(v []float64, outer, k, inner int) []float64 {
	if inner == 1 {
		return v
	}
	out := make([]float64, len(v))
	for o := range outer {
		for in := range inner {
			for j := range k {
				out[(o*k+j)*inner+in] = v[(o*inner+in)*k+j]
			}
		}
	}
	return out
}

// Routing plans for RouteTopK.
const (
	// RouteBalanced: token t's j-th choice is expert (t·k + j) mod E, so
	// every expert gets ⌊N·k/E⌋ or ⌈N·k/E⌉ of the N tokens' choices and a
	// token's k experts are distinct (k ≤ E).
	RouteBalanced = "balanced"
	// RouteWorst: every token picks experts 0, 1, ..., k−1, the most
	// tokens the router can send to the same experts.
	RouteWorst = "worst"
)

// RoutePlan returns the expert of token t's j-th choice under plan for E
// experts and k choices per token.
func RoutePlan(plan string, t, j, k, experts int) int {
	if plan == RouteWorst {
		return j
	}
	return (t*k + j) % experts
}

// RouteCounts returns how many of tokens' choices (k each) each of the
// experts gets under plan: RouteBalanced gives expert e ⌊tokens·k/E⌋,
// plus one for the first tokens·k mod E experts; RouteWorst gives the
// first k experts every token and the others none.
func RouteCounts(plan string, tokens, k, experts int) []int {
	out := make([]int, experts)
	if plan == RouteWorst {
		for e := range min(k, experts) {
			out[e] = tokens
		}
		return out
	}
	total := tokens * k
	for e := range out {
		out[e] = total / experts
		if e < total%experts {
			out[e]++
		}
	}
	return out
}

// RouteTopK is memsh's topk whose indices follow a fixed routing plan
// (RouteBalanced or RouteWorst) instead of the values: for probs of shape
// [..., E] (the router's probabilities over E experts, the last dim), row
// t's indices are RoutePlan(plan, t, j, k, E) for j < k and its values the
// probabilities at them. It allocates exactly what TopK(probs, k, -1)
// allocates (values, then int64 indices, [..., k] each): a
// Mixture-of-Experts router's routing is data dependent, and a plan makes
// it known in advance, also on a meta device. Errors as TopK's, and an
// unknown plan.
func RouteTopK(probs *Tensor, k int, plan string) (values, indices *Tensor, err error) {
	const fname = "nn.functional.route_topk"
	if plan != RouteBalanced && plan != RouteWorst {
		return nil, nil, errorf(fname, "routing must be %q or %q, got %q", RouteBalanced, RouteWorst, plan)
	}
	if probs.Dim() == 0 {
		return nil, nil, errorf(fname, "probs must have at least one dimension (the experts), got a 0-dim tensor")
	}
	return topkOp(fname, probs, k, -1, func(sh []*Tensor, outer, n, _ int) {
		v := getF64(sh[2])
		vals := make([]float64, 0, outer*k)
		idx := make([]float64, 0, outer*k)
		for t := range outer {
			for j := range k {
				e := RoutePlan(plan, t, j, k, n)
				vals = append(vals, v[t*n+e])
				idx = append(idx, float64(e))
			}
		}
		setF64(sh[0], vals)
		setF64(sh[1], idx)
	})
}

// topkOp checks topk's arguments, allocates the values and the indices
// (t's shape, dim resized to k) and fills them with fill(sh: values,
// indices, t; t viewed as [outer, n, inner] around dim) when they hold
// data.
func topkOp(fname string, t *Tensor, k, dim int, fill func(sh []*Tensor, outer, n, inner int)) (*Tensor, *Tensor, error) {
	if err := t.checkLive(fname); err != nil {
		return nil, nil, err
	}
	d, err := wrapDim(fname, dim, len(t.shape))
	if err != nil {
		return nil, nil, err
	}
	size := 1
	if len(t.shape) > 0 {
		size = t.shape[d]
	}
	if k < 0 || k > size {
		return nil, nil, errorf(fname, "selected index k out of range")
	}
	shape := slices.Clone(t.shape)
	if len(shape) > 0 {
		shape[d] = k
	}
	// Both results are validated before either is allocated.
	if _, err := checkSize(fname, shape, Int64); err != nil {
		return nil, nil, err
	}
	vals, err := newTensor(t.ctx, fname, t.mem.Device(), t.dtype, shape)
	if err != nil {
		return nil, nil, err
	}
	release := t.ctx.Hold(vals)
	idx, err := newTensor(t.ctx, fname, t.mem.Device(), Int64, shape)
	release()
	if err != nil {
		return nil, nil, err
	}
	if k > 0 {
		outer, n, inner := splitDim(t.shape, d)
		if len(t.shape) == 0 {
			outer, n, inner = 1, 1, 1
		}
		if err := hostCompute(fname, []*Tensor{vals, idx, t}, func(sh []*Tensor) { fill(sh, outer, n, inner) }); err != nil {
			Dropped(vals, idx)
			return nil, nil, err
		}
	}
	return vals, idx, nil
}
