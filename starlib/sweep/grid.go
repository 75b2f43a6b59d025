package sweep

import (
	"fmt"

	"go.starlark.net/starlark"
	"go.starlark.net/starlarkstruct"
)

// maxPoints bounds the size of a grid.
const maxPoints = 1 << 24

// sweep.grid(fn, **values) runs fn(**point) for every combination of the
// values (each a list, tuple or other iterable; the last parameter varies
// fastest) and returns struct(trials). See Module.
func grid(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	if len(args) == 0 {
		return nil, fmt.Errorf("%s: missing argument for fn", b.Name())
	}
	if len(args) > 1 {
		return nil, fmt.Errorf("%s: got %d positional arguments, want 1 (fn); give the values as name=[...]", b.Name(), len(args))
	}
	fn, ok := args[0].(starlark.Callable)
	if !ok {
		return nil, fmt.Errorf("%s: for parameter fn: got %s, want callable", b.Name(), args[0].Type())
	}
	if len(kwargs) == 0 {
		return nil, fmt.Errorf("%s: no parameters to sweep (give them as name=[values, ...])", b.Name())
	}
	keys := make([]string, len(kwargs))
	values := make([][]starlark.Value, len(kwargs))
	total := 1
	for i, kv := range kwargs {
		k, _ := starlark.AsString(kv[0])
		keys[i] = k
		it, ok := kv[1].(starlark.Iterable)
		if _, isStr := kv[1].(starlark.String); isStr || !ok {
			return nil, fmt.Errorf("%s: for parameter %s: got %s, want a list of values", b.Name(), k, kv[1].Type())
		}
		iter := it.Iterate()
		var x starlark.Value
		for iter.Next(&x) {
			values[i] = append(values[i], x)
			if len(values[i]) > maxPoints {
				break
			}
		}
		iter.Done()
		if len(values[i]) == 0 {
			return nil, fmt.Errorf("%s: for parameter %s: no values", b.Name(), k)
		}
		total *= len(values[i])
		if total > maxPoints {
			return nil, fmt.Errorf("%s: more than %d points", b.Name(), maxPoints)
		}
	}

	r, err := newRunner(thread, b.Name(), fn.Name(), fn)
	if err != nil {
		return nil, err
	}
	defer r.close()
	header := fmt.Sprintf("%s %q: %d points", b.Name(), fn.Name(), total)
	sh := r.rec.Shard()
	if sh.Sharded() && !r.rec.Nested() {
		// This shard's share of the points, for the header and the bar.
		mine := 0
		start := r.rec.NextUnit()
		for u := start; u < start+total; u++ {
			if sh.Owns(u) {
				mine++
			}
		}
		header += fmt.Sprintf(", %d on shard %s", mine, sh)
		r.bar = newProgress(r.env.Err, mine)
	} else {
		r.bar = newProgress(r.env.Err, total)
	}

	// The values are kept once, in the runner's point store; each point
	// refers to its parameters by index.
	off := make([]int32, len(keys))
	lens := make([]int, len(keys))
	for i := range values {
		off[i], lens[i] = r.points.addValues(values[i]), len(values[i])
	}
	values = nil
	idx := make([]int, len(keys))
	for n := 0; n < total; n++ {
		params := make(starlark.StringDict, len(keys))
		kw := make([]starlark.Tuple, len(keys))
		pidx := make([]int32, len(keys))
		for i, k := range keys {
			pidx[i] = off[i] + int32(idx[i])
			params[k] = r.points.pvals[pidx[i]]
			kw[i] = starlark.Tuple{starlark.String(k), params[k]}
		}
		// next combination, last parameter fastest
		for i := len(idx) - 1; i >= 0; i-- {
			idx[i]++
			if idx[i] < lens[i] {
				break
			}
			idx[i] = 0
		}
		unit, mine := r.rec.BeginUnit()
		if !mine {
			continue
		}
		if _, err := r.run(keys, params, pidx, nil, kw, unit, 0); err != nil {
			r.finish(header)
			return nil, err
		}
	}
	r.finish(header)
	return starlarkstruct.FromStringDict(starlarkstruct.Default, starlark.StringDict{
		"trials": r.trialValues(),
	}), nil
}
