package sweep

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"go.starlark.net/starlark"
	"go.starlark.net/starlarkstruct"

	"github.com/memsh/memsh/backend"
	"github.com/memsh/memsh/backend/replay"
	"github.com/memsh/memsh/env"
)

// replayer is max_fit(replay=True)'s record and replay: the search's full
// trials record their streams of memory events; once replay.Probes of
// them, ok, have the same program but for the sizes, a replay.Model is
// fitted (pending), and verified by a trial at one more size with a
// reclaim before every allocation (dense) when a trial looks worth
// replaying (activate). Later trials are then answered by replaying the
// model's stream through a copy of the caching allocator (marked
// replayed), unless the replay runs out of memory (such a trial runs in
// full: it is cheap) or replay.Replay finds it unsafe. The boundary and
// each model's largest replayed trial are confirmed by full trials; one
// that disagrees with its replay, or a full trial whose stream is not
// what a model predicts, turns replay off, and every replayed trial runs
// again in full.
type replayer struct {
	r     *runner
	param string
	unit  int
	step  *int
	mode  backend.PeakMode

	streams []*replay.Stream // the ok full trials' streams no model predicts
	// models predict the trials, each from a few sizes on, while the
	// kernels allocate as at those sizes (replay.Model.Predict): past a
	// threshold where one allocates otherwise, another model
	models []*replay.Model
	// pending is the last model fitted, before its verification (activate)
	pending *replay.Model
	why     string // why there is no model (yet)
	off     string // why replay was turned off for good, or ""
	unsafe  int    // trials run in full because their replay was unsafe
	lastWhy string // the last such reason
	// denseRuns counts the trials run with a reclaim before every
	// allocation (dense)
	denseRuns int
	// predicted: the next trial is an interpolation search's prediction
	// of the boundary (max_fit(mode="interpolate")), which full trials
	// confirm anyway: not worth verifying a model for
	predicted bool
}

// try answers the trial at n: replayed when a model can, else in full
// (recorded). fit and oom are the search's boundary so far (-1: none).
func (rp *replayer) try(n, fit, oom int) (*point, error) {
	r := rp.r
	keys := []string{rp.param}
	params := starlark.StringDict{rp.param: starlark.MakeInt(n)}
	args := starlark.Tuple{starlark.MakeInt(n)}
	if err := rp.activate(n, fit, oom); err != nil {
		return nil, err
	}
	if len(rp.models) > 0 && rp.off == "" {
		plan, why := rp.predict(n)
		if plan != nil {
			p, done, err := rp.replay(keys, params, n, plan)
			if err != nil || done {
				return p, err
			}
		} else {
			rp.unsafe++
			rp.lastWhy = why
		}
	}
	p, err := r.runPoint(keys, params, nil, args, nil, rp.unit, *rp.step, n, nil)
	*rp.step++
	if err != nil {
		return nil, err
	}
	if err := rp.learn(p); err != nil {
		return nil, err
	}
	return p, nil
}

// replay answers the trial at n by replaying plan; done is false when the
// replay was unsafe (the trial must run in full).
func (rp *replayer) replay(keys []string, params starlark.StringDict, n int, plan *replay.Plan) (*point, bool, error) {
	r := rp.r
	p, resumed, err := r.begin(keys, params, nil, rp.unit)
	if err != nil || resumed {
		if err == nil {
			*rp.step++
		}
		return p, true, err
	}
	r.emptyCaches()
	t0 := time.Now()
	st, why := replay.Snapshot(r.env.Manager)
	if st == nil {
		rp.off = why
		return nil, false, nil
	}
	o, err := replay.Replay(st, plan, rp.mode)
	if err != nil {
		var u *replay.Unsafe
		if !errors.As(err, &u) {
			return nil, false, err
		}
		rp.unsafe++
		rp.lastWhy = u.Why
		return nil, false, nil
	}
	if o.Status != "ok" {
		// an out-of-memory trial runs in full: it ends at its failure,
		// so it is cheap, and its stream checks the model that far
		return nil, false, nil
	}
	*rp.step++
	p.replayed = true
	p.status = o.Status
	if o.Err != nil {
		p.err = oomText(o)
	}
	p.data = rp.data(p.name, o, time.Since(t0))
	p.reserved = make([]uint64, len(o.Peaks))
	for i, pk := range o.Peaks {
		p.reserved[i] = pk.Reserved
		p.peakAllocated = append(p.peakAllocated, pk.Allocated)
	}
	p.peakReserved = p.reserved
	r.points.add(p)
	r.bar.add()
	return p, true, nil
}

// oomText is the trial's error text for an out-of-memory replay, as a
// full trial's (scope's oomMessage).
func oomText(o *replay.Outcome) string {
	if e := o.OOMError(); e != nil {
		return e.Error()
	}
	return o.Err.Error()
}

// data is a replayed trial's figures, as a full trial's: each GPU's used,
// consumed, peak, peaked, reclaimed (nothing), available; the host's are
// not measured (zero).
func (rp *replayer) data(name string, o *replay.Outcome, d time.Duration) *env.Data {
	m := rp.r.env.Manager
	data := &env.Data{Name: name, Time: d, Host: env.Figures{Device: "host"}}
	for i := 0; i < m.NumGPUs(); i++ {
		start := m.GPU(i).Allocated()
		f := env.Figures{Device: m.GPU(i).Device().Name(), Used: int64(o.Allocated[i]), Peak: int64(o.Peaks[i].Allocated), Available: int64(o.Free[i])}
		f.Consumed = f.Used - int64(start)
		f.Peaked = max(0, max(0, f.Peak-int64(start))-max(0, f.Consumed))
		data.GPUs = append(data.GPUs, f)
	}
	if len(data.GPUs) > 0 {
		data.GPU = &data.GPUs[m.Current()]
	}
	return data
}

// predict returns the plan of the trial at n of the first model that
// predicts it, or why none does.
func (rp *replayer) predict(n int) (*replay.Plan, string) {
	var why string
	for _, m := range rp.models {
		plan, w := m.Predict(n)
		if plan != nil {
			return plan, ""
		}
		why = w
	}
	return nil, why
}

// learn takes a full trial's stream. One that a model predicts must match
// the prediction (replay.Model.Check), or replay turns off. An ok one no
// model predicts is a probe; once there are enough with the same program,
// a model is fitted on them, its probes replayed against their
// recordings, and verified at one more size by a trial with a reclaim
// before every allocation (dense).
func (rp *replayer) learn(p *point) error {
	s := p.stream
	if s == nil || rp.off != "" {
		return nil
	}
	claimed := false
	for _, m := range rp.models {
		if plan, _ := m.Predict(s.Size); plan != nil {
			claimed = true
		}
		if w := m.Check(s, p.status == "oom"); w != "" {
			rp.off = w
			return nil
		}
	}
	if claimed || p.status != "ok" {
		return nil
	}
	if s.Why != "" {
		rp.why = s.Why
		return nil
	}
	rp.streams = append(rp.streams, s)
	m, why := replay.Fit(rp.streams)
	if m == nil {
		rp.why = why
		return nil
	}
	for _, s := range rp.streams {
		if slices.Contains(m.Sizes, s.Size) {
			if w := m.Verify(s, rp.mode); w != "" {
				rp.off = w
				return nil
			}
		}
	}
	rp.pending = m
	return nil
}

// activate verifies the pending model (activate's trial with a reclaim
// before every allocation, dense, which also tells when each allocation
// becomes garbage) when the trial at n looks worth replaying: the model,
// unverified, replays it without running out of memory (or cannot tell),
// and the search may go on long enough for replays to pay for that
// trial — it has found no out-of-memory size yet, or its interval is
// still wide.
func (rp *replayer) activate(n, fit, oom int) error {
	m := rp.pending
	if m == nil || rp.off != "" || rp.denseRuns >= maxDense || (oom >= 0 && oom-fit <= 64) || rp.predicted {
		return nil
	}
	plan, _ := m.PredictUnverified(n)
	if plan == nil {
		return nil
	}
	rp.r.freshIfDue()
	rp.r.emptyCaches()
	// whether it runs out of memory, under either assumption on what the
	// recordings cannot tell yet: then it is a full trial, cheap
	short := true
	for _, assume := range []replay.Assumption{replay.AssumeLive, replay.AssumeGarbage} {
		st, why := replay.Snapshot(rp.r.env.Manager)
		if st == nil {
			rp.off = why
			return nil
		}
		p := *plan
		p.Assume = assume
		if o, err := replay.Replay(st, &p, rp.mode); err != nil || o.Status == "ok" {
			short = false
		}
	}
	if short {
		return nil
	}
	rp.pending = nil
	rp.denseRuns++
	ds, err := rp.dense(m.DenseSize())
	if err != nil {
		return err
	}
	if w := m.Dense(ds); w != "" {
		rp.why = w
		return nil
	}
	rp.models = append(rp.models, m)
	rp.streams = slices.DeleteFunc(rp.streams, func(s *replay.Stream) bool { return slices.Contains(m.Sizes, s.Size) })
	return nil
}

// maxDense bounds the trials with a reclaim before every allocation that
// a search runs to verify its models.
const maxDense = 3

// dense runs the trial at n with a reclaim before every allocation
// (backend.Manager.SetDense), recorded, and returns its stream. It is no
// point of the sweep: no row, no record (--out).
func (rp *replayer) dense(n int) (*replay.Stream, error) {
	r := rp.r
	mgr := r.env.Manager
	r.freshIfDue()
	r.emptyCaches()
	params := starlark.StringDict{rp.param: starlark.MakeInt(n)}
	name := pointName([]string{rp.param}, params) + " (replay: when memory becomes garbage)"
	unmute := r.rec.Mute()
	prev := mgr.SetDense(true)
	rec := replay.Record(mgr, n)
	v, err := r.env.Session.Trial(r.thread, name, r.fn, starlark.Tuple{starlark.MakeInt(n)}, nil, params)
	s := rec.Stop()
	mgr.SetDense(prev)
	unmute()
	if err != nil {
		return nil, err
	}
	p := &point{name: name, keys: []string{rp.param}, params: params}
	if st, ok := v.(*starlarkstruct.Struct); ok {
		p.value, _ = st.Attr("value")
	}
	if err := r.checkBaseline(p, nil); err != nil {
		return nil, err
	}
	return s, nil
}

// confirm runs in full the replayed points at fit and oom and, for each
// model, its largest replayed point (how far it extrapolated). A full
// trial that disagrees with its replay (status, peaks, error) or with the
// model's stream turns replay off; then every replayed point runs again
// in full and fit and oom are those of the full trials.
func (rp *replayer) confirm(fit, oom int) (int, int, error) {
	// the boundary, and how far each model reached: its largest
	// replayed trial
	sizes := []int{fit, oom}
	for _, m := range rp.models {
		top := -1
		for i := 0; i < rp.r.points.len(); i++ {
			q := rp.r.points.at(i)
			n, _ := starlark.AsInt32(q.params[rp.param])
			if plan, _ := m.Predict(n); q.replayed && plan != nil && n > top {
				top = n
			}
		}
		if top >= 0 && !slices.Contains(sizes, top) {
			sizes = append(sizes, top)
		}
	}
	for _, n := range sizes {
		if n < 0 || rp.off != "" {
			continue
		}
		i := rp.find(n)
		if i < 0 {
			continue
		}
		was := rp.r.points.at(i)
		if !was.replayed {
			continue
		}
		p, err := rp.full(n, i)
		if err != nil {
			return 0, 0, err
		}
		if w := same(was, p); w != "" {
			rp.off = fmt.Sprintf("the full trial at %d disagrees with its replay (%s)", n, w)
		}
	}
	if rp.off == "" {
		return fit, oom, nil
	}
	// replay is off: every replayed point again, in full
	for i := 0; i < rp.r.points.len(); i++ {
		q := rp.r.points.at(i)
		if !q.replayed {
			continue
		}
		n, _ := starlark.AsInt32(q.params[rp.param])
		if _, err := rp.full(n, i); err != nil {
			return 0, 0, err
		}
	}
	fit, oom = -1, -1
	var ooms []int
	for i := 0; i < rp.r.points.len(); i++ {
		q := rp.r.points.at(i)
		if n, _ := starlark.AsInt32(q.params[rp.param]); q.status == "oom" {
			ooms = append(ooms, n)
		}
	}
	for i := 0; i < rp.r.points.len(); i++ {
		q := rp.r.points.at(i)
		n, _ := starlark.AsInt32(q.params[rp.param])
		narrow(&fit, &oom, n, q.status, ooms)
	}
	return fit, oom, nil
}

// full runs the trial at n in full, recorded, in place of point i.
func (rp *replayer) full(n, i int) (*point, error) {
	at := i
	p, err := rp.r.runPoint([]string{rp.param}, starlark.StringDict{rp.param: starlark.MakeInt(n)}, nil, starlark.Tuple{starlark.MakeInt(n)}, nil, rp.unit, *rp.step, n, &at)
	*rp.step++
	if err != nil {
		return nil, err
	}
	if p.resumed {
		// a resumed point is added, not set: move it in place
		last := rp.r.points.len() - 1
		rp.r.points.recs[i] = rp.r.points.recs[last]
		rp.r.points.recs = rp.r.points.recs[:last]
		return p, nil
	}
	if err := rp.learn(p); err != nil {
		return nil, err
	}
	return p, nil
}

// find returns the index of the last point at n, or -1.
func (rp *replayer) find(n int) int {
	for i := rp.r.points.len() - 1; i >= 0; i-- {
		if v, _ := starlark.AsInt32(rp.r.points.at(i).params[rp.param]); v == n {
			return i
		}
	}
	return -1
}

// same compares a replayed point with the full trial at its size: status,
// error text, each GPU's figures but the time, and peak reserved bytes.
func same(replayed, full *point) string {
	if replayed.status != full.status {
		return fmt.Sprintf("%s replayed, %s in full", replayed.status, full.status)
	}
	if replayed.err != full.err {
		return fmt.Sprintf("error %q replayed, %q in full", replayed.err, full.err)
	}
	if !slices.Equal(replayed.reserved, full.reserved) {
		return fmt.Sprintf("peak reserved %v replayed, %v in full", replayed.reserved, full.reserved)
	}
	if len(replayed.data.GPUs) != len(full.data.GPUs) {
		return "other GPUs"
	}
	for i, g := range replayed.data.GPUs {
		if f := full.data.GPUs[i]; g != f {
			return fmt.Sprintf("%s: %+v replayed, %+v in full", g.Device, g, f)
		}
	}
	return ""
}

// footer says what replay did.
func (rp *replayer) footer() string {
	replayed, total := 0, rp.r.points.len()
	for i := 0; i < total; i++ {
		if rp.r.points.at(i).replayed {
			replayed++
		}
	}
	var b strings.Builder
	switch {
	case rp.off != "":
		fmt.Fprintf(&b, "replay=True: every trial ran in full; replay was turned off: %s", rp.off)
	case len(rp.models) == 0 && rp.pending != nil:
		sizes := make([]string, len(rp.pending.Sizes))
		for i, s := range rp.pending.Sizes {
			sizes[len(sizes)-1-i] = fmt.Sprint(s)
		}
		fmt.Fprintf(&b, "replay=True: every trial ran in full (a model of the step was fitted on the trials at %s, but no trial left was worth verifying it for: the boundary was near, or the trial would run out of memory, which a full trial answers as cheaply)", strings.Join(sizes, ", "))
	case len(rp.models) == 0 && rp.why == "":
		fmt.Fprintf(&b, "replay=True: every trial ran in full (no model of the step: fewer than three trials ran with one program)")
	case len(rp.models) == 0:
		fmt.Fprintf(&b, "replay=True: every trial ran in full (no model of the step: %s)", rp.why)
	default:
		var models []string
		for _, m := range rp.models {
			sizes := make([]string, len(m.Sizes))
			for i, s := range m.Sizes {
				sizes[len(sizes)-1-i] = fmt.Sprint(s)
			}
			models = append(models, fmt.Sprintf("%s (verified at %d)", strings.Join(sizes, ", "), m.DenseSize()))
		}
		fmt.Fprintf(&b, "replay=True: %d of %d trials replayed from the memory events of full trials at %s; the boundary confirmed by full trials",
			replayed, total, strings.Join(models, "; at "))
		if rp.unsafe > 0 {
			fmt.Fprintf(&b, "; %d trial(s) ran in full where a replay could differ (%s)", rp.unsafe, rp.lastWhy)
		}
	}
	return b.String()
}
