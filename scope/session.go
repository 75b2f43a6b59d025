// Package scope is memsh's executor: the Session, which owns one live map of
// Starlark globals, a thread, a device set and the stack of open
// experiments, and runs source one top-level statement at a time against the
// live map so that it knows exactly which names each statement bound.
//
// A Session is the unit an embedding Go program creates; the REPL and the
// script runner are thin users of it. Experiments (experiment(), trial())
// live here because they are made of the executor's binding records.
package scope

import (
	"fmt"
	"io"
	"io/fs"
	"os"
	"sort"
	"strings"
	"sync"

	"go.starlark.net/starlark"
	"go.starlark.net/syntax"

	"github.com/memsh/memsh/backend"
	"github.com/memsh/memsh/backend/host"
	"github.com/memsh/memsh/env"
	"github.com/memsh/memsh/starlib"
	startensor "github.com/memsh/memsh/starlib/tensor"
	"github.com/memsh/memsh/tensor"
)

// Starlark's built-ins and operators ask before a large Go allocation a
// script's values size (a repetition, list(range(n)), a list's growth, a
// string built): past a host memory limit (RLIMIT_AS, RLIMIT_DATA, the
// memory cgroup, the RAM available) that is a Starlark error naming the
// built-in and the size, not the Go runtime's fatal out-of-memory.
func init() { starlark.HostAlloc = host.CheckAlloc }

// Options configure a Session.
type Options struct {
	// Device picks the GPU backend, as the --device flag: "auto" (the
	// default), "sim", "sim:SPEC" (see backend/sim), or "cpu" (no GPU).
	Device string
	// Peak is the peak mode (--peak): backend.PeakExact (default) or PeakLazy.
	Peak backend.PeakMode
	// Out receives print() output and reports; Err receives notices such as
	// the auto device line. Both default to the process's stdout / stderr.
	Out, Err io.Writer
	// Quiet suppresses experiment reports (--quiet); data() and finish()
	// still return the figures.
	Quiet bool
	// Argv is bound to the global argv (a list of strings) when non-nil.
	Argv []string
	// MaxSteps, if non-zero, limits the Starlark execution steps of each
	// top-level statement (--max-steps).
	MaxSteps uint64
	// Builtins are extra predeclared names for embedders (and tests): they
	// behave like memsh's own builtins and are not user globals.
	Builtins starlark.StringDict
	// LoadPath lists extra directories load() may resolve modules in
	// (--load-path), besides the main script's directory (the working
	// directory for a REPL or -c code).
	LoadPath []string
	// Library is a file tree load() resolves a relative module path in
	// when the load roots do not have it (memsh's model library,
	// load("models/llama.star", ...), embedded in the binary); its modules'
	// own loads resolve in it only. Its files are named "memsh:PATH" in
	// tracebacks. nil: none.
	Library fs.FS
}

// Session is one memsh interpreter: live globals, a thread, devices and the
// experiment stack. Its methods must be called from one goroutine at a time,
// except Interrupt.
type Session struct {
	opts   Options
	out    io.Writer
	thread *starlark.Thread
	// stepBase is the steps the main thread ran before the last reset
	// of its step count (--max-steps), for the stamp clock (reach.go).
	stepBase uint64
	// roots are what Go code asked the reach walk to visit (Root).
	roots []*env.Reacher
	// walker is the reach walk's, reused from walk to walk.
	walker *env.Walker
	frames frameCache // what the last walk found in the frames it walked (reach.go)
	// mutations is the Session's Mutations domain
	// (starlark.Thread.SetMutations): its threads' calls move it, and no
	// other Session's code does
	mutations starlark.MutationCounter
	memo      *walkMemo // what a walk during backward() found in the frames and globals (reach_memo.go)
	// memoFramed: the last walk credited what memo stands for to
	// backend.Frames' frame 0 (reach_memo.go)
	memoFramed bool
	// engine: the autograd engine whose frames the last walk walked, and
	// why those frames' walks were incomplete (reach_engine.go)
	engine    engineKey
	engineN   int // how many frames it had then
	engineWhy []string
	memoOff   bool // MEMSH_REACH_MEMO=0: no memo
	keepOff   bool // MEMSH_REACH_KEEP=0: walks keep no frame's credits (reach.go)
	// globalsGen moves whenever the roots that are not frames may change
	// (globalsKey, reach.go).
	globalsGen uint64
	env        *env.Env
	tctx       *tensor.Context // the tensor Context (its interrupt flag is set by Interrupt)
	mgr        *backend.Manager
	rss        *host.PeakRSS
	devices    []backend.Device

	builtins starlark.StringDict // predeclared names memsh provides
	live     starlark.StringDict // builtins overlaid with user globals: every program's predeclared map and module globals
	user     map[string]bool     // names in live that the user bound
	reopen   map[posKey]string   // the running statement's (or script's) `NAME = experiment(...)` call sites
	file     *fileRun            // the script running as one program (execFile), if any

	stmtHooks   []*stmtHook
	finishHooks []*finishHook

	mainDir string              // the main script's directory: the first load root ("" : the working directory)
	sources map[string][]string // the lines of pseudo-files ("<stdin-3>", "<cmd>") by name

	loaded  map[string]*loadEntry // load() results by real path; nil entry: loading
	loadMu  sync.Mutex            // guards loading (Interrupt runs on another goroutine)
	loading []*starlark.Thread    // threads running a load() now

	stack   []*Experiment // open experiments, outermost first
	unnamed int           // experiments given a default name so far
	pending []pendingOp   // name deletions and restores to apply after the running statement
	running bool          // a top-level statement is executing
	// reclaimDue: a statement stopped by Ctrl-C left its temporaries for
	// the next Exec (or Settle) to reclaim, so that the interrupt returns
	// at once (endStmt)
	reclaimDue bool
}

// metaOnly reports whether every GPU is simulated in meta mode: the
// session's host is then meta too (host.NewMetaDevice), so that "cpu"
// tensors (a CPU-offloaded model's parameters, gradients and optimizer
// states) have sizes and no values, as the GPUs' tensors.
func metaOnly(gpus []backend.Device) bool {
	for _, d := range gpus {
		if m, ok := d.(interface{ Meta() bool }); !ok || !m.Meta() {
			return false
		}
	}
	return len(gpus) > 0
}

// New creates a Session on the devices opts.Device selects.
func New(opts Options) (*Session, error) {
	if opts.Out == nil {
		opts.Out = os.Stdout
	}
	if opts.Err == nil {
		opts.Err = os.Stderr
	}
	gpus, notice, err := OpenDevices(opts.Device)
	if err != nil {
		return nil, err
	}
	if notice != "" {
		fmt.Fprintln(opts.Err, notice)
	}
	return NewWithDevices(opts, gpus)
}

// NewWithDevices creates a Session over the given GPU devices (each served
// by a caching allocator; ordinals in slice order) and host memory.
func NewWithDevices(opts Options, gpus []backend.Device) (*Session, error) {
	if opts.Out == nil {
		opts.Out = os.Stdout
	}
	if opts.Err == nil {
		opts.Err = os.Stderr
	}
	allocs := make([]backend.Allocator, len(gpus))
	for i, d := range gpus {
		allocs[i] = backend.NewCachingAllocator(d, i)
	}
	hostAlloc := host.NewAllocator()
	if metaOnly(gpus) {
		hostAlloc = host.NewMetaAllocator()
	}
	mgr := backend.NewManager(backend.Config{GPUs: allocs, Host: hostAlloc, Peak: opts.Peak})
	s := &Session{
		opts:    opts,
		out:     opts.Out,
		mgr:     mgr,
		rss:     host.NewPeakRSS(),
		devices: gpus,
		user:    map[string]bool{},
	}
	mgr.SetReach(s.reach)
	mgr.SetForget(func() { // a collection must not see what the memo holds
		if s.memo != nil {
			s.memo.weaken()
		}
	})
	s.memoOff = os.Getenv("MEMSH_REACH_MEMO") == "0"
	s.keepOff = os.Getenv("MEMSH_REACH_KEEP") == "0"
	s.env = env.New(mgr, opts.Out)
	s.env.Err = opts.Err
	s.env.Session = s
	// The tensor context, and the per-input logger's seed (log.start(seed=N),
	// :log seed N) reseeding the tensor generator as tensor.manual_seed(N).
	startensor.Install(s.env)
	// Ctrl-C also stops the running kernel (Interrupt); the flag is
	// cleared as each statement starts and ends.
	s.tctx = startensor.Context(s.env)
	s.OnStatement(func(env.StatementEvent) { s.tctx.ClearInterrupt() })
	s.thread = &starlark.Thread{
		Name:  "memsh",
		Print: func(_ *starlark.Thread, msg string) { fmt.Fprintln(s.out, msg) },
		Load:  s.load,
	}
	env.Install(s.thread, s.env)
	s.thread.SetLocal(sessionKey, s)
	s.thread.SetMutations(&s.mutations)
	s.frames.pins.mutations = &s.mutations
	// Layout mode reclaims before an allocation only when Starlark code
	// ran (an instruction: an operator's pops drop its operands, a store
	// its old value) or a call began or ended since its last reclaim (or
	// Go code noted garbage): nothing else drops what Starlark holds.
	th := s.thread
	mgr.SetLayoutClock(s.layoutClock)
	// Allocations, and built-in functions' frames as they are entered,
	// are stamped with the step count, so that a reclaim can tell what
	// running Go code may hold (reach.go).
	// A top-level assignment stores into the live globals, which are
	// every program's module globals (Program.InitLive, patch 7 of
	// third_party/go.starlark.net); OnSetGlobal (patch 4) marks the name
	// as the user's.
	th.OnSetGlobal = s.setGlobal
	// A script runs as one program that calls back before each of its
	// top-level statements (exec.go).
	th.OnStatement = s.nextStmt
	mgr.SetStampClock(s.stamp)
	th.Stamp = s.stamp
	s.tctx.SetStampClock(s.stamp)

	s.builtins = starlib.Predeclared()
	for k, v := range s.sessionBuiltins() {
		s.builtins[k] = v
	}
	for k, v := range opts.Builtins {
		s.builtins[k] = v
	}
	for k, v := range augBuiltins() {
		s.builtins[k] = v
	}
	if opts.Argv != nil {
		l := make([]starlark.Value, len(opts.Argv))
		for i, a := range opts.Argv {
			l[i] = starlark.String(a)
		}
		s.builtins["argv"] = starlark.NewList(l)
	}
	s.live = make(starlark.StringDict, len(s.builtins)+64)
	for k, v := range s.builtins {
		s.live[k] = v
	}
	return s, nil
}

const sessionKey = "memsh.session"

func sessionOf(thread *starlark.Thread) *Session {
	s, _ := thread.Local(sessionKey).(*Session)
	return s
}

// Manager returns the Session's memory manager.
func (s *Session) Manager() *backend.Manager { return s.mgr }

// Env returns the state the Session shares with its Starlark modules.
func (s *Session) Env() *env.Env { return s.env }

// Thread returns the Session's Starlark thread (for starlark.Call from Go).
func (s *Session) Thread() *starlark.Thread { return s.thread }

// Devices returns the GPU devices, by ordinal.
func (s *Session) Devices() []backend.Device { return s.devices }

// SetOutput redirects print() output and reports.
func (s *Session) SetOutput(w io.Writer) {
	s.out = w
	s.env.Out = w
}

// Output returns where print() output and reports go.
func (s *Session) Output() io.Writer { return s.out }

// Get returns the user global name, or nil.
func (s *Session) Get(name string) starlark.Value {
	if !s.user[name] {
		return nil
	}
	return s.live[name]
}

// Set binds a user global from Go; a nil v deletes it. It must not be
// called while a statement runs.
func (s *Session) Set(name string, v starlark.Value) {
	s.globalsGen++
	if v == nil {
		if s.user[name] {
			delete(s.live, name)
			delete(s.user, name)
		}
		return
	}
	s.live[name] = v
	s.user[name] = true
}

// Globals returns a new dict of the user globals (what the Starlark builtin
// globals() returns), without memsh's builtins.
func (s *Session) Globals() starlark.StringDict {
	g := make(starlark.StringDict, len(s.user))
	for name := range s.user {
		g[name] = s.live[name]
	}
	return g
}

// Names returns every name visible to Starlark code, sorted: user globals,
// memsh's builtins and the universe (for completion).
func (s *Session) Names() []string {
	seen := map[string]bool{}
	for k := range s.live {
		if !strings.HasPrefix(k, "·") {
			seen[k] = true
		}
	}
	for k := range starlark.Universe {
		seen[k] = true
	}
	names := make([]string, 0, len(seen))
	for k := range seen {
		names = append(names, k)
	}
	sort.Strings(names)
	return names
}

// Lookup returns the value of a visible name: a user global, a memsh
// builtin or a universe builtin.
func (s *Session) Lookup(name string) starlark.Value {
	if strings.HasPrefix(name, "·") {
		return nil
	}
	if v, ok := s.live[name]; ok {
		return v
	}
	return starlark.Universe[name]
}

// Experiments returns the open experiments, outermost first.
func (s *Session) Experiments() []*Experiment {
	return append([]*Experiment(nil), s.stack...)
}

// Interrupt cancels the running statement (Ctrl-C). It is safe to call from
// another goroutine; the statement fails with an "interrupted" error and the
// Session reclaims and stays usable.
func (s *Session) Interrupt() {
	s.thread.Cancel("interrupted")
	s.tctx.Interrupt() // the running kernel, op or backward pass stops too
	s.loadMu.Lock()
	defer s.loadMu.Unlock()
	for _, t := range s.loading {
		t.Cancel("interrupted")
	}
}

// Settle reclaims what a statement stopped by Ctrl-C (Interrupt) left
// behind. Exec does that itself before it runs anything, and the REPL
// before a colon command; a Go program that reads the Session's figures
// after an interrupted Exec calls it first (after a statement that failed
// for any other reason, Exec reclaimed before it returned).
func (s *Session) Settle() {
	if s.reclaimDue && !s.running {
		s.reclaimDue = false
		s.mgr.Reclaim()
	}
}

// Close finishes open experiments quietly and frees all memory.
func (s *Session) Close() {
	for len(s.stack) > 0 {
		e := s.stack[len(s.stack)-1]
		e.quiet = true
		_, _ = e.finish(nil, nil)
	}
	s.live = nil
	s.user = nil
	s.memo = nil
	s.frames.pins.unpinAll() // and its growth log off: appends move Mutations again
	s.mgr.Close()
	host.Trim() // the freed host blocks glibc-style retention kept (backend/host)
}

// fileOptions turns every Starlark dialect option on, as memsh's scripts
// expect (sets, while loops, top-level control flow, recursion).
var fileOptions = &syntax.FileOptions{
	Set:               true,
	While:             true,
	TopLevelControl:   true,
	GlobalReassign:    true,
	LoadBindsGlobally: true,
	Recursion:         true,
}
