package replay

import (
	"fmt"
	"math"
	"math/big"
	"slices"
	"sort"

	"github.com/memsh/memsh/backend"
)

// Probes is the number of recorded trials a Model is fitted on: each
// size's polynomial of degree 2 at most. A fourth verifies it (Dense).
const Probes = 3

// maxRequest is the largest size a prediction may give (backend's).
const maxRequest = 1 << 62

// Model predicts a trial's stream at any size from streams recorded at a
// few (Fit).
type Model struct {
	// Sizes are the recorded sizes it was fitted on and verified at, from
	// the largest down; Lo, the smallest, is the least size it predicts.
	Sizes []int
	Lo    int
	ops   []Op   // the program's events (sizes of the largest)
	polys []poly // per event: its Size as a function of the size (Alloc, Driver)
	// per event with a size law: the law, and its arguments' polynomials
	laws    map[int]backend.SizeLaw
	lawArgs map[int][]poly
	// pre, per event: whether AllocOn reclaimed before an Alloc in every
	// recording (1), in none (0), or in some (-1)
	pre []int8
	// per allocation: the last moment a recording found it live, and the
	// first a recording found it garbage (program)
	alive, dead []int64
	keep        []bool     // per allocation: outlives the trial (a library's workspace)
	progs       []*program // the recordings used, largest first
	dense       bool       // Dense verified it
}

// poly is (a·x² + b·x + c) / d in exact integers, d > 0; small says all
// four fit in int64 (the fast path).
type poly struct {
	a, b, c, d int64
	small      bool
	ba, bb, bc *big.Int // when not small
	bd         *big.Int
}

// Fit learns a Model from recorded streams of ok trials (any order; those
// that cannot be replayed or ran out of memory are passed over): the
// largest size and the next ones down while their program is the same,
// at least Probes of them; each size fitted on the three largest and
// verified on the rest, down to the first that differs. It returns nil
// and why when it cannot. The model is to be verified at one more size
// (Dense) before it predicts.
func Fit(streams []*Stream) (*Model, string) {
	var ss []*Stream
	for _, s := range streams {
		if s.Why != "" || s.OOM || s.Retried || slices.ContainsFunc(ss, func(t *Stream) bool { return t.Size == s.Size }) {
			continue
		}
		ss = append(ss, s)
	}
	sort.Slice(ss, func(i, j int) bool { return ss[i].Size > ss[j].Size })
	if len(ss) < Probes {
		return nil, fmt.Sprintf("%d recorded trials, %d needed", len(ss), Probes)
	}
	// a session's first trial creates the cuBLAS handles (driver
	// memory), the later ones do not: without them, it is theirs
	drivers := slices.ContainsFunc(ss[0].Ops, func(op Op) bool { return op.Kind == Driver })
	ps := make([]*program, len(ss))
	for i, s := range ss {
		ps[i] = s.program(!drivers)
		if ps[i].why != "" {
			return nil, ps[i].why
		}
	}
	top := ps[0]
	group := []*program{top}
	var why string
	for _, p := range ps[1:] {
		if ok, diff := top.same(p); !ok {
			why = "the recorded trials' programs differ (" + diff + ")"
			break
		}
		group = append(group, p)
	}
	if len(group) < Probes {
		if why == "" {
			why = fmt.Sprintf("%d recorded trials with the same program, %d needed", len(group), Probes)
		}
		return nil, why
	}
	m := &Model{ops: top.ops, polys: make([]poly, len(top.ops)), laws: map[int]backend.SizeLaw{}, lawArgs: map[int][]poly{}}
	x := [3]int64{int64(group[0].size), int64(group[1].size), int64(group[2].size)}
	for i, op := range top.ops {
		if op.Kind != Alloc && op.Kind != Driver && op.Kind != Guard {
			continue
		}
		if op.Kind == Guard && (group[1].ops[i] != op || group[2].ops[i] != op) {
			return nil, fmt.Sprintf("a kernel allocates otherwise at %d than at %d (%v, %v)", group[2].size, group[0].size, group[2].ops[i], op)
		}
		if op.Law != 0 {
			var calls [3]LawCall
			for j := range calls {
				calls[j] = group[j].laws[op.Law-1]
			}
			if calls[0].Law != calls[1].Law || calls[0].Law != calls[2].Law || len(calls[0].Args) != len(calls[1].Args) || len(calls[0].Args) != len(calls[2].Args) {
				return nil, fmt.Sprintf("the size law of %v differs between %d and %d", op, group[0].size, group[2].size)
			}
			m.laws[i] = calls[0].Law
			for k := range calls[0].Args {
				m.lawArgs[i] = append(m.lawArgs[i], fit3(x, [3]int64{calls[0].Args[k], calls[1].Args[k], calls[2].Args[k]}))
			}
			continue
		}
		y := [3]int64{int64(group[0].ops[i].Size), int64(group[1].ops[i].Size), int64(group[2].ops[i].Size)}
		m.polys[i] = fit3(x, y)
	}
	// verify downwards: the model holds from the smallest size verified
	used := group[:3]
	for _, p := range group[3:] {
		if w := m.check(p, used); w != "" {
			why = w
			break
		}
		used = append(used, p)
	}
	if w := m.hostSizes(used); w != "" {
		return nil, w
	}
	if w := m.merge(used); w != "" {
		return nil, w
	}
	for _, p := range used {
		m.Sizes = append(m.Sizes, p.size)
	}
	m.Lo = used[len(used)-1].size
	m.progs = used
	return m, ""
}

// check verifies the model's sizes at p.
func (m *Model) check(p *program, fitted []*program) string {
	for i, op := range m.ops {
		if op.Kind != Alloc && op.Kind != Driver && op.Kind != Guard {
			continue
		}
		got := p.ops[i].Size
		if op.Kind == Guard && p.ops[i] != op {
			return fmt.Sprintf("a kernel allocates otherwise at %d than at %d (%v, %v)", p.size, fitted[0].size, p.ops[i], op)
		}
		if op.Law != 0 {
			call := p.laws[op.Law-1]
			if call.Law != m.laws[i] {
				return fmt.Sprintf("the size law of %v differs between %d and %d", op, p.size, fitted[0].size)
			}
			args, ok := m.argsAt(i, int64(p.size))
			if !ok || !slices.Equal(args, call.Args) {
				return fmt.Sprintf("the size law's arguments of %v are not polynomials of degree 2 at most in the searched value (at %d: %v, predicted %v)", op, p.size, call.Args, args)
			}
			continue
		}
		want, ok := m.polys[i].at(int64(p.size))
		if !ok || want != got {
			return fmt.Sprintf("the size of %v is not a polynomial of degree 2 at most in the searched value (at %d: %d B, predicted from %d, %d, %d: %s)",
				op, p.size, got, fitted[0].size, fitted[1].size, fitted[2].size, predicted(want, ok))
		}
	}
	return ""
}

func predicted(v uint64, ok bool) string {
	if !ok {
		return "not a whole number of bytes"
	}
	return fmt.Sprintf("%d B", v)
}

// hostSizes requires the host allocations to keep their sizes, and to
// stay under the Manager's pacing: then when a full trial reclaims for
// them does not depend on the size either.
func (m *Model) hostSizes(used []*program) string {
	var total uint64
	for i, op := range m.ops {
		if op.Kind != Alloc || op.Dev != Host {
			continue
		}
		for _, p := range used[1:] {
			if p.ops[i].Size != used[0].ops[i].Size {
				return fmt.Sprintf("the trial's host allocations change size (%v)", op)
			}
		}
		total += op.Size
	}
	if total >= backend.DefaultPacing/2 {
		return "the trial allocates host memory enough to reclaim for"
	}
	return ""
}

// merge gathers what the recordings tell: when AllocOn reclaimed, and
// between which moments each allocation became garbage.
func (m *Model) merge(used []*program) string {
	n := len(used[0].alive)
	m.alive = make([]int64, n)
	m.dead = make([]int64, n)
	for id := range m.dead {
		m.dead[id] = never
	}
	for _, p := range used {
		for id := 0; id < n; id++ {
			m.alive[id] = max(m.alive[id], p.alive[id])
			m.dead[id] = min(m.dead[id], p.dead[id])
		}
	}
	for id := 0; id < n; id++ {
		if m.alive[id] >= m.dead[id] {
			return fmt.Sprintf("the recordings disagree on when allocation #%d became garbage", id)
		}
	}
	m.keep = make([]bool, n)
	for id := range m.keep {
		m.keep[id] = m.dead[id] == never
	}
	for _, op := range m.ops {
		if op.Kind == Free {
			m.keep[op.ID] = false
		}
	}
	m.pre = make([]int8, len(m.ops))
	for i, op := range m.ops {
		if op.Kind != Alloc {
			continue
		}
		var yes int
		for _, p := range used {
			if p.pre[i] {
				yes++
			}
		}
		switch yes {
		case 0:
		case len(used):
			m.pre[i] = 1
		default:
			m.pre[i] = -1
		}
	}
	return ""
}

// Predict returns the plan of a trial at size n, or why it cannot.
func (m *Model) Predict(n int) (*Plan, string) {
	if !m.dense {
		return nil, "the model is not verified"
	}
	return m.predict(n)
}

// PredictUnverified is Predict before Dense: from what the fitted
// trials tell (to decide whether verifying the model is worth a trial).
func (m *Model) PredictUnverified(n int) (*Plan, string) { return m.predict(n) }

func (m *Model) predict(n int) (*Plan, string) {
	if n < m.Lo {
		return nil, fmt.Sprintf("%d is below the recorded sizes", n)
	}
	p, stop, why := m.predictUpTo(n)
	if stop < len(p.Ops) {
		return nil, why
	}
	return p, ""
}

// predictUpTo predicts the program at n as far as it can: stop is the
// index of the first event it cannot tell (a kernel that chooses
// otherwise at n, a size that is not a whole number), len(ops) when none,
// and why says why.
func (m *Model) predictUpTo(n int) (p *Plan, stop int, why string) {
	p = m.plan(make([]Op, len(m.ops)))
	copy(p.Ops, m.ops)
	for i, op := range m.ops {
		if op.Kind != Alloc && op.Kind != Driver && op.Kind != Guard {
			continue
		}
		if op.Law != 0 {
			args, ok := m.argsAt(i, int64(n))
			if !ok {
				return p, i, fmt.Sprintf("the size law's arguments of %v at %d are not whole numbers", op, n)
			}
			v, ok := m.laws[i].Bytes(args)
			if op.Kind == Guard {
				if v != op.Size || ok != (op.Count == 1) {
					return p, i, fmt.Sprintf("at %d a kernel allocates otherwise than at %d (%v)", n, m.Sizes[0], op)
				}
				continue
			}
			if !ok {
				return p, i, fmt.Sprintf("at %d the program would not make %v (its size law)", n, op)
			}
			p.Ops[i].Size = v
			continue
		}
		v, ok := m.polys[i].at(int64(n))
		if !ok {
			return p, i, fmt.Sprintf("the size of %v at %d is not a whole number of bytes", op, n)
		}
		p.Ops[i].Size = v
	}
	return p, len(m.ops), ""
}

// argsAt is the arguments of event i's size law at size x.
func (m *Model) argsAt(i int, x int64) ([]int64, bool) {
	ps := m.lawArgs[i]
	args := make([]int64, len(ps))
	for k, p := range ps {
		v, ok := p.at(x)
		if !ok {
			return nil, false
		}
		args[k] = int64(v)
	}
	return args, true
}

func (m *Model) plan(ops []Op) *Plan {
	return &Plan{Ops: ops, Pre: m.pre, Alive: m.alive, Dead: m.dead, Keep: m.keep}
}

// fit3 is the polynomial of degree 2 at most through three points (the
// x distinct): Lagrange's form over the common denominator
// (x0-x1)(x0-x2)(x1-x2), reduced.
func fit3(x, y [3]int64) poly {
	if y[0] == y[1] && y[1] == y[2] {
		return poly{c: y[0], d: 1, small: true}
	}
	X := func(i int) *big.Int { return big.NewInt(x[i]) }
	Y := func(i int) *big.Int { return big.NewInt(y[i]) }
	sub := func(a, b *big.Int) *big.Int { return new(big.Int).Sub(a, b) }
	add := func(a, b *big.Int) *big.Int { return new(big.Int).Add(a, b) }
	mul := func(v ...*big.Int) *big.Int {
		r := big.NewInt(1)
		for _, w := range v {
			r.Mul(r, w)
		}
		return r
	}
	// weights: y0(x1-x2), -y1(x0-x2), y2(x0-x1)
	w0 := mul(Y(0), sub(X(1), X(2)))
	w1 := new(big.Int).Neg(mul(Y(1), sub(X(0), X(2))))
	w2 := mul(Y(2), sub(X(0), X(1)))
	A := add(add(w0, w1), w2)
	B := new(big.Int).Neg(add(add(mul(w0, add(X(1), X(2))), mul(w1, add(X(0), X(2)))), mul(w2, add(X(0), X(1)))))
	C := add(add(mul(w0, X(1), X(2)), mul(w1, X(0), X(2))), mul(w2, X(0), X(1)))
	D := mul(sub(X(0), X(1)), sub(X(0), X(2)), sub(X(1), X(2)))
	g := new(big.Int).GCD(nil, nil, new(big.Int).Abs(D), new(big.Int).Abs(A))
	g.GCD(nil, nil, g, new(big.Int).Abs(B))
	g.GCD(nil, nil, g, new(big.Int).Abs(C))
	if D.Sign() < 0 {
		g.Neg(g)
	}
	for _, v := range []*big.Int{A, B, C, D} {
		v.Quo(v, g)
	}
	p := poly{ba: A, bb: B, bc: C, bd: D}
	if A.IsInt64() && B.IsInt64() && C.IsInt64() && D.IsInt64() {
		p.a, p.b, p.c, p.d, p.small = A.Int64(), B.Int64(), C.Int64(), D.Int64(), true
	}
	return p
}

// at evaluates p at x: ok is false unless the value is a whole number in
// [0, maxRequest].
func (p poly) at(x int64) (uint64, bool) {
	if p.small {
		if p.a == 0 && p.b == 0 && p.d == 1 {
			return uint64(p.c), p.c >= 0
		}
		if v, ok := p.atSmall(x); ok {
			if v%p.d != 0 || v < 0 || v/p.d > maxRequest {
				return 0, false
			}
			return uint64(v / p.d), true
		}
	}
	ba, bb, bc, bd := p.ba, p.bb, p.bc, p.bd
	if ba == nil {
		ba, bb, bc, bd = big.NewInt(p.a), big.NewInt(p.b), big.NewInt(p.c), big.NewInt(p.d)
	}
	X := big.NewInt(x)
	v := new(big.Int).Mul(ba, X)
	v.Add(v, bb)
	v.Mul(v, X)
	v.Add(v, bc)
	q, r := new(big.Int).QuoRem(v, bd, new(big.Int))
	if r.Sign() != 0 || q.Sign() < 0 || !q.IsInt64() || q.Int64() > maxRequest {
		return 0, false
	}
	return uint64(q.Int64()), true
}

// atSmall is a·x² + b·x + c in int64, ok false on overflow.
func (p poly) atSmall(x int64) (int64, bool) {
	v, ok := mul64(p.a, x)
	if !ok {
		return 0, false
	}
	if v, ok = add64(v, p.b); !ok {
		return 0, false
	}
	if v, ok = mul64(v, x); !ok {
		return 0, false
	}
	return add64(v, p.c)
}

func mul64(a, b int64) (int64, bool) {
	if a == 0 || b == 0 {
		return 0, true
	}
	c := a * b
	if (a == -1 && b == math.MinInt64) || (b == -1 && a == math.MinInt64) || c/b != a {
		return 0, false
	}
	return c, true
}

func add64(a, b int64) (int64, bool) {
	c := a + b
	if (c > a) != (b > 0) {
		return 0, false
	}
	return c, true
}

// Verify replays the recording at size — one the model was fitted on,
// from the state it started in — and checks that the replay makes the
// reclaims AllocOn made and gives every allocation and segment the
// address and size the recording shows, and the same peaks: the replay's
// allocator, devices and reclaims are the full trial's. It returns why
// not, or "".
func (m *Model) Verify(s *Stream, mode backend.PeakMode) string {
	var p *program
	for _, q := range m.progs {
		if q.size == s.Size {
			p = q
		}
	}
	if p == nil || s.start == nil {
		return fmt.Sprintf("no recording at %d", s.Size)
	}
	st := s.start.clone() // Replay uses it up
	plan := m.plan(p.ops)
	plan.expect = p.pre
	o, err := Replay(st, plan, mode)
	if err != nil {
		return fmt.Sprintf("replaying the trial at %d: %v", s.Size, err)
	}
	if o.Status != "ok" {
		return fmt.Sprintf("replaying the trial at %d ran out of memory", s.Size)
	}
	for id, b := range s.Blocks {
		if o.Blocks[id] != b && !o.host[id] {
			return fmt.Sprintf("replaying the trial at %d put allocation #%d at %#x (%d B), the trial at %#x (%d B)",
				s.Size, id, o.Blocks[id].Addr, o.Blocks[id].Size, b.Addr, b.Size)
		}
	}
	if !slices.Equal(o.Segments, s.Segments) {
		return fmt.Sprintf("replaying the trial at %d took other segments", s.Size)
	}
	if !slices.Equal(o.Peaks, s.Peaks) {
		return fmt.Sprintf("replaying the trial at %d gave peaks %v, the trial %v", s.Size, o.Peaks, s.Peaks)
	}
	return ""
}

// Check compares the stream of a full trial with the model's prediction
// at its size, as far as the model predicts (up to a kernel that chooses
// otherwise there; for a trial that ran out of memory, up to its last
// allocation): the program's events with their sizes and, for a trial
// the model predicts whole, when its reclaims found each allocation
// garbage. A trial below the sizes the model was fitted on is not
// compared. It returns the first difference, or "".
func (m *Model) Check(s *Stream, oom bool) string {
	if s.Size < m.Lo || !m.dense {
		return ""
	}
	if s.Why != "" {
		return s.Why
	}
	plan, stop, _ := m.predictUpTo(s.Size)
	p := programOf(s)
	if p.why != "" {
		return p.why
	}
	n := len(p.ops)
	if oom {
		for n > 0 && p.ops[n-1].Kind != Alloc {
			n--
		}
	}
	for i := 0; i < min(n, stop); i++ {
		if a, b := p.ops[i], plan.Ops[i]; a != b {
			if i >= len(plan.Ops) {
				break
			}
			return fmt.Sprintf("the full trial at %d differs from the prediction at event %d: %v, predicted %v", s.Size, i, a, b)
		}
	}
	if oom || stop < len(plan.Ops) {
		return ""
	}
	if s.Retried {
		return fmt.Sprintf("the full trial at %d retried an allocation after a reclaim", s.Size)
	}
	if n != len(plan.Ops) {
		return fmt.Sprintf("the full trial at %d made %d events, %d predicted", s.Size, n, len(plan.Ops))
	}
	for id := range p.alive {
		if p.alive[id] >= m.dead[id] || m.alive[id] >= p.dead[id] {
			return fmt.Sprintf("the full trial at %d found allocation #%d garbage at another moment than the recordings", s.Size, id)
		}
	}
	return ""
}

// Dense adds what a trial run with a reclaim before every allocation
// (backend.Manager.SetDense) at a size the model predicts tells: when
// each allocation became garbage, to the allocation — so that a replay
// knows it wherever the allocator's state makes a full trial reclaim. The
// trial's program must be the model's. It returns why not, or "".
func (m *Model) Dense(s *Stream) string {
	if s.Why != "" {
		return s.Why
	}
	if s.OOM || s.Retried {
		return fmt.Sprintf("the trial at %d with a reclaim before every allocation ran out of memory", s.Size)
	}
	m.Lo = min(m.Lo, s.Size)
	plan, why := m.predict(s.Size)
	if plan == nil {
		return why
	}
	p := programOf(withoutDrivers(s))
	if p.why != "" {
		return p.why
	}
	if len(p.ops) != len(plan.Ops) {
		return fmt.Sprintf("the trial at %d with a reclaim before every allocation made %d events, %d predicted", s.Size, len(p.ops), len(plan.Ops))
	}
	for i, op := range p.ops {
		if op != plan.Ops[i] {
			return fmt.Sprintf("the trial at %d with a reclaim before every allocation differs from the prediction at event %d: %v, predicted %v", s.Size, i, op, plan.Ops[i])
		}
	}
	for id := range m.alive {
		a, d := max(m.alive[id], p.alive[id]), min(m.dead[id], p.dead[id])
		if a >= d {
			return fmt.Sprintf("the trial at %d with a reclaim before every allocation found allocation #%d garbage at another moment than the recordings", s.Size, id)
		}
		m.alive[id], m.dead[id] = a, d
	}
	m.dense = true
	return ""
}

// withoutDrivers returns s without its Driver events (a session's first
// trial creates the cuBLAS handles: memory the driver takes outside the
// allocator, which moves no block).
func withoutDrivers(s *Stream) *Stream {
	if !slices.ContainsFunc(s.Ops, func(op Op) bool { return op.Kind == Driver }) {
		return s
	}
	t := *s
	t.Ops = slices.DeleteFunc(slices.Clone(s.Ops), func(op Op) bool { return op.Kind == Driver })
	t.progs = [2]*program{}
	return &t
}

// DenseSize is the size at which to verify the model (Dense): odd when
// it can be, between the two largest sizes it was fitted on, where a
// rounding the three fitted sizes share would show.
func (m *Model) DenseSize() int {
	x0, x1 := m.Sizes[0], m.Sizes[1]
	switch {
	case x0-1 > x1:
		return x0 - 1
	case x0 > 1:
		return x0 + 1
	}
	return x0 + 1
}
