package record

import (
	"encoding/json"
	"fmt"

	"github.com/memsh/memsh/backend/host"
	"github.com/memsh/memsh/env"
)

// valuesKey is the State's key in env.Env.Values.
const valuesKey = "record"

// State is one Session's record keeping: the shard it runs, the --out
// writer and the points already recorded there, and the position of the
// running sweep point. The sweep module and the --out/--shard flags share
// it through env.Env.Values; it is used from the Session's goroutine only.
type State struct {
	env    *env.Env
	shard  Shard
	writer *Writer
	resume map[string]*Record
	totals map[string]uint64
	remove func()
	adjust func(*env.FinishEvent)
	err    error

	units   int      // top-level sweep units begun
	between int      // records written since the last unit began, outside units
	points  []*Point // running sweep points, outermost first
	muted   int      // Mute calls not undone: no record is written
}

// Mute stops records being written until unmute is called: a sweep's
// trial that is no point of its own (max_fit(replay=True)'s probe of
// when memory becomes garbage).
func (s *State) Mute() (unmute func()) {
	s.muted++
	return func() { s.muted-- }
}

// Point is a running sweep point: which sweep, its trial's name and its
// position. The sweep module pushes it with Enter around the point's trial.
type Point struct {
	Sweep string // the sweep's name
	Name  string // the trial's name ("bs=64")
	Unit  int    // the unit (-1 in a sweep nested in another sweep's point)
	Step  int    // the step within the unit
	// Baseline is each GPU's allocated bytes before the sweep, by device.
	Baseline map[string]int64
	n        int

	breakdown *Breakdown // set by nn.track during the point
}

// SetBreakdown attaches b to the running sweep point's record (the last
// call wins); outside a sweep point it does nothing.
func (s *State) SetBreakdown(b *Breakdown) {
	if n := len(s.points); n > 0 {
		s.points[n-1].breakdown = b
	}
}

// Of returns e's State, creating an empty one (no shard, no --out).
func Of(e *env.Env) *State {
	if s, ok := e.Values[valuesKey].(*State); ok {
		return s
	}
	s := &State{env: e}
	e.Values[valuesKey] = s
	return s
}

// SetShard makes the Session run only the units of sh.
func (s *State) SetShard(sh Shard) { s.shard = sh }

// Shard returns the shard the Session runs (the zero Shard: all units).
func (s *State) Shard() Shard { return s.shard }

// Out returns the --out file's name, or "".
func (s *State) Out() string {
	if s.writer == nil {
		return ""
	}
	return s.writer.Path()
}

// Open starts writing a record for every experiment and trial that
// finishes to path (appending; see OpenWriter), and loads the points it
// already holds for resume. The Env must belong to a Session.
func (s *State) Open(path string) error {
	if s.writer != nil {
		return fmt.Errorf("records already go to %s", s.writer.Path())
	}
	if s.env.Session == nil {
		return fmt.Errorf("records: no session")
	}
	w, recs, err := OpenWriter(path)
	if err != nil {
		return err
	}
	s.writer = w
	s.resume = map[string]*Record{}
	for _, r := range Merge(recs) {
		if r.Resumable() {
			s.resume[r.Key()] = r
		}
	}
	s.totals = map[string]uint64{"host": host.Total()}
	m := s.env.Manager
	for i := 0; i < m.NumGPUs(); i++ {
		d := m.GPU(i).Device()
		if _, total, err := d.MemGetInfo(); err == nil {
			s.totals[d.Name()] = total
		}
	}
	s.remove = s.env.Session.OnFinish(s.onFinish)
	return nil
}

// Close stops recording and closes the file.
func (s *State) Close() error {
	if s.writer == nil {
		return nil
	}
	s.remove()
	err := s.writer.Close()
	s.writer, s.remove = nil, nil
	return err
}

// SetAdjust makes f see every finish event before it is recorded; f may
// change the event's Status and Error (cmd/memsh records an experiment cut
// by an out-of-memory error as "oom").
func (s *State) SetAdjust(f func(*env.FinishEvent)) { s.adjust = f }

// Recorded returns the number of points loaded for resume.
func (s *State) Recorded() int { return len(s.resume) }

// Err returns the first error writing a record, or nil. A sweep stops
// when it sees one.
func (s *State) Err() error { return s.err }

// Lookup returns the record of a point that a previous run with the same
// --out finished as "ok" or "oom", or nil. stale reports a record of that
// point measured under other conditions (another device capacity, or other
// memory allocated before the sweep): it must run again.
func (s *State) Lookup(unit int, sweep string, params json.RawMessage, baseline map[string]int64) (r *Record, stale bool) {
	r = s.resume[Key(unit, sweep, params)]
	if r == nil {
		return nil, false
	}
	if !r.matches(baseline, s.totals) {
		return nil, true
	}
	return r, false
}

// BeginUnit starts the next sweep unit and reports whether this shard runs
// it. A sweep inside another sweep's point is part of that point: it gets
// unit -1 and always runs.
func (s *State) BeginUnit() (unit int, run bool) {
	if len(s.points) > 0 {
		return -1, true
	}
	u := s.units
	s.units++
	s.between = 0
	return u, s.shard.Owns(u)
}

// Nested reports whether a sweep point is running (a sweep started now is
// part of it).
func (s *State) Nested() bool { return len(s.points) > 0 }

// NextUnit is the unit the next top-level BeginUnit returns.
func (s *State) NextUnit() int { return s.units }

// Enter makes p the running point until Leave.
func (s *State) Enter(p *Point) { s.points = append(s.points, p) }

// Leave ends the running point.
func (s *State) Leave() {
	s.points[len(s.points)-1] = nil
	s.points = s.points[:len(s.points)-1]
}

// nextPos is the position of the record being written now.
func (s *State) nextPos() Pos {
	if len(s.points) > 0 {
		p := s.points[0]
		pos := Pos{p.Unit, p.Step, p.n}
		p.n++
		return pos
	}
	pos := Pos{s.units, -1, s.between}
	s.between++
	return pos
}

func (s *State) onFinish(e env.FinishEvent) {
	if s.writer == nil || s.muted > 0 {
		return
	}
	if s.adjust != nil {
		s.adjust(&e)
	}
	r, err := FromEvent(e, s.totals)
	if err == nil {
		r.Pos = s.nextPos()
		r.Shard = s.shard.String()
		if n := len(s.points); n > 0 && e.Kind == "trial" && e.Params != nil && e.Name == s.points[n-1].Name {
			r.Sweep = s.points[n-1].Sweep
			r.Baseline = s.points[n-1].Baseline
			r.Breakdown = s.points[n-1].breakdown
		}
		err = s.writer.Write(r)
	}
	if err != nil && s.err == nil {
		s.err = fmt.Errorf("--out %s: record %q not written: %v", s.writer.Path(), e.Name, err)
		fmt.Fprintf(s.env.Err, "memsh: %v\n", s.err)
	}
}
