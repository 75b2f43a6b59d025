package sweep

import (
	"fmt"
	"math"
	"slices"

	"github.com/memsh/memsh/backend"

	"go.starlark.net/starlark"
	"go.starlark.net/starlarkstruct"
)

// maxSize is the largest value max_fit tries: doubling stops there.
const maxSize = 1 << 62

// sweep.max_fit(fn, low=1, high=None, mode="power", margin=0.0,
// max_trials=25, name="", search="exact", confirm=None, fresh=False)
// finds the largest int n in [low, high] for which fn(n) runs without
// running out of memory. See Module.
func maxFit(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
	var fn starlark.Callable
	var highV, marginV, confirmV, freshV starlark.Value = starlark.None, starlark.Float(0), starlark.None, starlark.False
	low, mode, maxTrials, name, search, replayOn := 1, "power", 25, "", "exact", false
	if err := starlark.UnpackArgs(b.Name(), args, kwargs, "fn", &fn, "low?", &low, "high?", &highV,
		"mode?", &mode, "margin?", &marginV, "max_trials?", &maxTrials, "name?", &name, "search?", &search, "confirm?", &confirmV, "fresh?", &freshV,
		"replay?", &replayOn); err != nil {
		return nil, err
	}
	fresh, freshSearch, err := parseFresh(b.Name(), freshV)
	if err != nil {
		return nil, err
	}
	if search != "exact" && search != "lazy" && search != "layout" {
		return nil, fmt.Errorf("%s: for parameter search: unknown search %q (want \"exact\", \"lazy\" or \"layout\")", b.Name(), search)
	}
	// confirm: whether the boundary is confirmed by exact-mode trials;
	// by default only after a lazy search
	confirm := search == "lazy"
	switch c := confirmV.(type) {
	case starlark.NoneType:
	case starlark.Bool:
		confirm = bool(c)
	default:
		return nil, fmt.Errorf("%s: for parameter confirm: got %s, want bool or None", b.Name(), confirmV.Type())
	}
	high := maxSize
	switch h := highV.(type) {
	case starlark.NoneType:
	case starlark.Int:
		v, ok := h.Int64()
		if !ok || v > maxSize {
			return nil, fmt.Errorf("%s: for parameter high: %s out of range", b.Name(), h)
		}
		high = int(v)
	default:
		return nil, fmt.Errorf("%s: for parameter high: got %s, want int or None", b.Name(), highV.Type())
	}
	if low < 1 {
		return nil, fmt.Errorf("%s: for parameter low: got %d, want an int >= 1", b.Name(), low)
	}
	if low > high {
		return nil, fmt.Errorf("%s: low (%d) > high (%d)", b.Name(), low, high)
	}
	if mode != "power" && mode != "binsearch" && mode != "interpolate" {
		return nil, fmt.Errorf("%s: for parameter mode: unknown mode %q (want \"power\", \"binsearch\" or \"interpolate\")", b.Name(), mode)
	}
	margin, ok := starlark.AsFloat(marginV)
	if !ok {
		return nil, fmt.Errorf("%s: for parameter margin: got %s, want float", b.Name(), marginV.Type())
	}
	if !(margin >= 0 && margin < 1) {
		return nil, fmt.Errorf("%s: for parameter margin: got %g, want 0 <= margin < 1", b.Name(), margin)
	}
	if maxTrials < 1 {
		return nil, fmt.Errorf("%s: for parameter max_trials: got %d, want an int >= 1", b.Name(), maxTrials)
	}
	if name == "" {
		name = fn.Name()
	}
	param := "value"
	if f, ok := fn.(*starlark.Function); ok && f.NumParams() > 0 {
		param, _ = f.Param(0)
	}

	r, err := newRunner(thread, b.Name(), name, fn)
	if err != nil {
		return nil, err
	}
	defer r.close()
	r.fresh, r.freshSearch = fresh, freshSearch
	r.replayFields = replayOn || showReplayFields
	r.measurePeaks = mode == "interpolate"
	header := fmt.Sprintf("%s %q (%s, low=%d", b.Name(), name, mode, low)
	if high != maxSize {
		header += fmt.Sprintf(", high=%d", high)
	}
	header += ")"
	unit, mine := r.rec.BeginUnit()
	if !mine {
		fmt.Fprintf(r.env.Out, "%s: unit %d runs on shard %d/%d, not on this one (%s)\n", header, unit,
			unit%r.rec.Shard().Count, r.rec.Shard().Count, r.rec.Shard())
		return fitResult(nil, -1, -1, low, margin, true), nil
	}
	r.bar = newProgress(r.env.Err, -1)

	fit, oom := -1, -1 // largest n that ran, smallest n above it that ran out of memory
	var ooms []int     // the sizes that ran out of memory
	step := 0
	var rp *replayer     // replay=True
	var ip *interpolator // mode="interpolate"
	if mode == "interpolate" {
		ip = &interpolator{low: low, high: high}
	}
	try := func(n int) (string, error) {
		var p *point
		var err error
		if rp != nil {
			p, err = rp.try(n, fit, oom)
		} else {
			p, err = r.run([]string{param}, starlark.StringDict{param: starlark.MakeInt(n)}, nil, starlark.Tuple{starlark.MakeInt(n)}, nil, unit, step)
			step++
		}
		if err != nil {
			return "", err
		}
		if p.status == "oom" {
			ooms = append(ooms, n)
		}
		narrow(&fit, &oom, n, p.status, ooms)
		if ip != nil {
			ip.add(n, p)
		}
		return p.status, nil
	}
	fail := func(err error) (starlark.Value, error) {
		r.finish(header)
		return nil, err
	}

	// search="lazy": the search trials run in lazy peak mode (no reclaim
	// before each peak-raising allocation: fast, but their peak figures
	// may include garbage, and garbage freed late changes which blocks
	// the allocator picks). search="exact": in the session's mode.
	// confirm: a search not in exact mode is then confirmed in exact
	// mode, where reserved memory and OOMs are a reference-counted run's.
	// search="layout" (exact mode's former name): every trial runs in
	// exact mode, whatever the session's.
	mgr := r.env.Manager
	session := mgr.PeakMode()
	searchMode := session
	switch {
	case search == "lazy":
		searchMode = backend.PeakLazy
	case search == "layout":
		searchMode = backend.PeakExact
	}
	if confirm && searchMode == backend.PeakExact {
		return nil, fmt.Errorf("%s: for parameter confirm: the search runs in exact peak mode, whose trials need no confirmation", b.Name())
	}
	if searchMode != session || confirm {
		mgr.SetPeakMode(searchMode)
		defer mgr.SetPeakMode(session)
	}
	var replayNote string
	if replayOn {
		if searchMode == backend.PeakLazy {
			replayNote = "replay=True: every trial ran in full (the search's trials run in lazy peak mode, which replay does not model)"
		} else {
			rp = &replayer{r: r, param: param, unit: unit, step: &step, mode: searchMode}
		}
	}
	// onward goes on from the trials so far to the boundary: the
	// interpolator's sizes, or bisection between fit and oom
	onward := func() error {
		if ip != nil {
			for step < maxTrials {
				n, more := ip.next(fit, oom)
				if !more {
					break
				}
				if rp != nil {
					rp.predicted = ip.estimated()
				}
				if _, err := try(n); err != nil {
					return err
				}
			}
			return nil
		}
		for oom >= 0 && oom-fit > 1 && step < maxTrials {
			if _, err := try(fit + (oom-fit)/2); err != nil {
				return err
			}
		}
		return nil
	}
	// Power (and binsearch's start): double from low until the first
	// OOM (or high).
	for n := low; ip == nil && step < maxTrials; {
		status, err := try(n)
		if err != nil {
			return fail(err)
		}
		if status != "ok" || n >= high {
			break
		}
		if n > high/2 {
			n = high
		} else {
			n *= 2
		}
	}
	// Binsearch: bisect between the last fit and the first OOM;
	// interpolate: the whole search.
	if ip != nil || (mode == "binsearch" && fit >= 0) {
		if err := onward(); err != nil {
			return fail(err)
		}
	}
	if rp != nil {
		// the boundary by full trials; where one disagrees, replay is
		// off and the search goes on from the full trials
		var err error
		if fit, oom, err = rp.confirm(fit, oom); err != nil {
			return fail(err)
		}
		if mode != "power" && fit >= 0 {
			if err := onward(); err != nil {
				return fail(err)
			}
		}
	}

	var footer []string
	if rp != nil {
		replayNote = rp.footer()
	}
	if replayNote != "" {
		footer = append(footer, replayNote)
	}
	if confirm {
		mgr.SetPeakMode(backend.PeakExact)
		var err error
		if fit, oom, err = confirmExact(r, param, unit, &step, low, high, fit, oom, maxTrials); err != nil {
			return fail(err)
		}
		footer = append(footer, fmt.Sprintf("search trials ran in %s peak mode; the boundary was confirmed by exact-mode trials (confirm=True)", searchMode))
	}
	converged := fit == high || (oom >= 0 && (mode == "power" || oom-fit <= 1))
	if fit < 0 && oom == low {
		converged = true
	}
	res := fitResult(r, fit, oom, low, margin, false)
	best, _ := res.(*starlarkstruct.Struct).Attr("best")
	switch {
	case fit < 0:
		footer = append(footer, fmt.Sprintf("nothing fits: %s=%d already runs out of memory", param, low))
	case margin > 0:
		footer = append(footer, fmt.Sprintf("largest %s that fits: %d; best with margin %g: %s", param, fit, margin, best))
	default:
		footer = append(footer, fmt.Sprintf("largest %s that fits: %d", param, fit))
	}
	if !converged {
		footer = append(footer, fmt.Sprintf("stopped after max_trials=%d trials before finding the boundary", maxTrials))
	}
	if hole := slices.Min(append([]int{math.MaxInt}, ooms...)); fit >= 0 && hole < fit {
		footer = append(footer, fmt.Sprintf("the sizes that train are not an interval: %s=%d ran out of memory, %d trains (the caching allocator's blocks fall otherwise)", param, hole, fit))
	}
	r.finish(header, footer...)
	return res, nil
}

// fitResult builds struct(best, fit, oom, trials).
func fitResult(r *runner, fit, oom, low int, margin float64, skipped bool) starlark.Value {
	var best, fitV, oomV starlark.Value = starlark.None, starlark.None, starlark.None
	if fit >= 0 {
		fitV = starlark.MakeInt(fit)
		b := int(math.Floor(float64(fit) * (1 - margin)))
		best = starlark.MakeInt(max(b, low))
	}
	if oom >= 0 {
		oomV = starlark.MakeInt(oom)
	}
	trials := starlark.NewList(nil)
	if r != nil {
		trials = r.trialValues()
	}
	return starlarkstruct.FromStringDict(starlarkstruct.Default, starlark.StringDict{
		"best":    best,
		"fit":     fitV,
		"oom":     oomV,
		"trials":  trials,
		"skipped": starlark.Bool(skipped),
	})
}

// confirmExact re-runs the boundary found by a lazy search in exact peak
// mode — fit must run and fit+1 run out of memory — and, where exact
// mode disagrees (the allocator's fragmentation differs when garbage is
// freed later), moves the boundary with exact-mode trials until it
// holds. Its trials carry confirm=True, so records keep them
// apart from the search's.
func confirmExact(r *runner, param string, unit int, step *int, low, high, fit, oom, maxTrials int) (int, int, error) {
	keys := []string{param, "confirm"}
	try := func(n int) (string, error) {
		p, err := r.run(keys, starlark.StringDict{param: starlark.MakeInt(n), "confirm": starlark.True}, nil, starlark.Tuple{starlark.MakeInt(n)}, nil, unit, *step)
		*step++
		if err != nil {
			return "", err
		}
		return p.status, nil
	}
	okE, oomE := -1, -1 // exact knowledge: largest n that ran, smallest that did not
	if fit >= 0 {
		st, err := try(fit)
		if err != nil {
			return 0, 0, err
		}
		if st == "ok" {
			okE = fit
		} else {
			oomE = fit
		}
	}
	if oom >= 0 && okE >= 0 {
		st, err := try(oom)
		if err != nil {
			return 0, 0, err
		}
		if st == "ok" {
			okE = oom
		} else {
			oomE = oom
		}
	}
	if fit < 0 && oom == low {
		// Nothing fit lazily: confirm low itself.
		st, err := try(low)
		if err != nil {
			return 0, 0, err
		}
		if st == "ok" {
			okE = low
		} else {
			oomE = low
		}
	}
	for tries := 0; tries < maxTrials; tries++ {
		var n int
		switch {
		case okE >= 0 && oomE == okE+1, oomE == low, okE == high:
			return okE, oomE, nil
		case okE >= 0 && oomE >= 0:
			n = okE + (oomE-okE)/2
		case okE >= 0: // the boundary is above: step up, then bisect
			n = min(high, okE+max(1, okE/8))
		case oomE >= 0: // below
			n = max(low, oomE-max(1, oomE/8))
			if n == oomE {
				return okE, oomE, nil
			}
		default:
			return fit, oom, nil
		}
		st, err := try(n)
		if err != nil {
			return 0, 0, err
		}
		if st == "ok" {
			okE = n
		} else {
			oomE = n
		}
	}
	return okE, oomE, nil
}

// parseFresh reads max_fit's fresh: True (every trial as in a fresh
// process), False, or "search" (the first trial only).
func parseFresh(fname string, v starlark.Value) (fresh, search bool, err error) {
	switch x := v.(type) {
	case starlark.Bool:
		return bool(x), false, nil
	case starlark.String:
		if x == "search" {
			return false, true, nil
		}
	}
	return false, false, fmt.Errorf("%s: for parameter fresh: got %s, want True, False or \"search\"", fname, v.String())
}

// narrow moves a search's bounds by a trial at n of status: fit is the
// largest size that ran ("ok"), oom the smallest that ran out of memory
// ("oom"); -1 while there is none.
//
// A size that trains above the smallest that ran out of memory (the sizes
// that train are not an interval: max_fit(mode="interpolate") tries the
// size above a boundary it did not expect) moves oom to the smallest out-
// of-memory size above it in ooms, the out-of-memory sizes so far, or -1.
func narrow(fit, oom *int, n int, status string, ooms []int) {
	switch status {
	case "ok":
		*fit = max(*fit, n)
		if *oom >= 0 && *oom < *fit {
			*oom = -1
			for _, m := range ooms {
				if m > *fit && (*oom < 0 || m < *oom) {
					*oom = m
				}
			}
		}
	case "oom":
		if n > *fit && (*oom < 0 || n < *oom) {
			*oom = n
		}
	}
}
