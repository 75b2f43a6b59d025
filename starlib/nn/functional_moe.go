package nn

import (
	"fmt"

	"go.starlark.net/starlark"

	startensor "github.com/memsh/memsh/starlib/tensor"
	"github.com/memsh/memsh/tensor"
	"github.com/memsh/memsh/tensor/autograd"
)

// Mixture-of-Experts routing:
//
//	nn.functional.one_hot(tensor, num_classes=-1)
//	    int64 [..., num_classes]: at::zeros then scatter_ (one allocation); num_classes -1
//	    reads the values (t.max() + 1), so a meta device needs num_classes
//	nn.functional.route_topk(probs, k, routing="balanced")
//	    topk whose indices follow a fixed routing plan: return_types.topk (values, indices)
//	    over probs' last dim (the experts), with exactly topk's allocations and node
//	    (TopkBackward0 saves the indices). routing "balanced": token t's j-th choice is
//	    expert (t·k + j) mod E — every expert gets ⌊N·k/E⌋ or ⌈N·k/E⌉ of the N tokens'
//	    choices, a token's k experts distinct; "worst": every token picks experts 0..k−1.
//	    The values are the probabilities at the plan's experts, in the plan's order.
//	    A router's real choice depends on the values; the plan makes the tokens per
//	    expert known in advance (nonzero_static's size on a meta device).
//	nn.functional.route_counts(tokens, k, experts, routing="balanced")
//	    the plan's tokens per expert: a list of E ints (Starlark, no tensor)
func init() {
	registerF("one_hot", func(_ *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
		var x starlark.Value
		numClasses := -1
		if err := starlark.UnpackArgs(b.Name(), args, kwargs, "tensor", &x, "num_classes?", &numClasses); err != nil {
			return nil, err
		}
		t, err := tensorArg(b.Name(), "tensor", x)
		if err != nil {
			return nil, err
		}
		return wrapAs(b.Name())(tensor.OneHot(t, numClasses))
	})
	registerF("route_topk", func(_ *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
		var x starlark.Value
		var k int
		routing := tensor.RouteBalanced
		if err := starlark.UnpackArgs(b.Name(), args, kwargs, "probs", &x, "k", &k, "routing?", &routing); err != nil {
			return nil, err
		}
		t, err := tensorArg(b.Name(), "probs", x)
		if err != nil {
			return nil, err
		}
		if routing != tensor.RouteBalanced && routing != tensor.RouteWorst {
			return nil, fmt.Errorf("%s: for parameter routing: want %q or %q, got %q", b.Name(), tensor.RouteBalanced, tensor.RouteWorst, routing)
		}
		vals, idx, err := autograd.RouteTopK(t, k, routing)
		if err != nil {
			return nil, tensor.Renamed(err, b.Name())
		}
		return startensor.NewValuesIndices("topk", vals, idx), nil
	})
	registerF("route_counts", func(_ *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
		var tokens, k, experts int
		routing := tensor.RouteBalanced
		if err := starlark.UnpackArgs(b.Name(), args, kwargs, "tokens", &tokens, "k", &k, "experts", &experts, "routing?", &routing); err != nil {
			return nil, err
		}
		if routing != tensor.RouteBalanced && routing != tensor.RouteWorst {
			return nil, fmt.Errorf("%s: for parameter routing: want %q or %q, got %q", b.Name(), tensor.RouteBalanced, tensor.RouteWorst, routing)
		}
		switch {
		case tokens < 0:
			return nil, fmt.Errorf("%s: for parameter tokens: must be >= 0, got %d", b.Name(), tokens)
		case experts < 1:
			return nil, fmt.Errorf("%s: for parameter experts: must be >= 1, got %d", b.Name(), experts)
		case k < 0 || k > experts:
			return nil, fmt.Errorf("%s: for parameter k: must be in [0, experts=%d], got %d", b.Name(), experts, k)
		}
		counts := tensor.RouteCounts(routing, tokens, k, experts)
		out := make([]starlark.Value, len(counts))
		for i, c := range counts {
			out[i] = starlark.MakeInt(c)
		}
		return starlark.NewList(out), nil
	})
}
