package host

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

// PerfEvent is a hardware or software performance counter, by its
// `perf list` name.
type PerfEvent struct {
	Name   string
	Type   uint32 // unix.PERF_TYPE_HARDWARE, _SOFTWARE, _HW_CACHE or _RAW
	Config uint64
}

// DefaultPerfEvent is the counter ipython_memory_usage's perf variant
// reports.
const DefaultPerfEvent = "cache-misses"

var perfNamed = map[string]PerfEvent{}

func init() {
	hw := map[uint64][]string{
		unix.PERF_COUNT_HW_CPU_CYCLES:              {"cycles", "cpu-cycles"},
		unix.PERF_COUNT_HW_INSTRUCTIONS:            {"instructions"},
		unix.PERF_COUNT_HW_CACHE_REFERENCES:        {"cache-references"},
		unix.PERF_COUNT_HW_CACHE_MISSES:            {"cache-misses"},
		unix.PERF_COUNT_HW_BRANCH_INSTRUCTIONS:     {"branch-instructions", "branches"},
		unix.PERF_COUNT_HW_BRANCH_MISSES:           {"branch-misses"},
		unix.PERF_COUNT_HW_BUS_CYCLES:              {"bus-cycles"},
		unix.PERF_COUNT_HW_STALLED_CYCLES_FRONTEND: {"stalled-cycles-frontend", "idle-cycles-frontend"},
		unix.PERF_COUNT_HW_STALLED_CYCLES_BACKEND:  {"stalled-cycles-backend", "idle-cycles-backend"},
		unix.PERF_COUNT_HW_REF_CPU_CYCLES:          {"ref-cycles"},
	}
	sw := map[uint64][]string{
		unix.PERF_COUNT_SW_CPU_CLOCK:        {"cpu-clock"},
		unix.PERF_COUNT_SW_TASK_CLOCK:       {"task-clock"},
		unix.PERF_COUNT_SW_PAGE_FAULTS:      {"page-faults", "faults"},
		unix.PERF_COUNT_SW_CONTEXT_SWITCHES: {"context-switches", "cs"},
		unix.PERF_COUNT_SW_CPU_MIGRATIONS:   {"cpu-migrations", "migrations"},
		unix.PERF_COUNT_SW_PAGE_FAULTS_MIN:  {"minor-faults"},
		unix.PERF_COUNT_SW_PAGE_FAULTS_MAJ:  {"major-faults"},
		unix.PERF_COUNT_SW_ALIGNMENT_FAULTS: {"alignment-faults"},
		unix.PERF_COUNT_SW_EMULATION_FAULTS: {"emulation-faults"},
	}
	for c, names := range hw {
		for _, n := range names {
			perfNamed[n] = PerfEvent{Name: n, Type: unix.PERF_TYPE_HARDWARE, Config: c}
		}
	}
	for c, names := range sw {
		for _, n := range names {
			perfNamed[n] = PerfEvent{Name: n, Type: unix.PERF_TYPE_SOFTWARE, Config: c}
		}
	}
	// Generic cache events: L1-dcache-load-misses, LLC-loads, dTLB-store-misses, ...
	caches := map[string]uint64{
		"L1-dcache": unix.PERF_COUNT_HW_CACHE_L1D, "L1-icache": unix.PERF_COUNT_HW_CACHE_L1I,
		"LLC": unix.PERF_COUNT_HW_CACHE_LL, "dTLB": unix.PERF_COUNT_HW_CACHE_DTLB,
		"iTLB": unix.PERF_COUNT_HW_CACHE_ITLB, "branch": unix.PERF_COUNT_HW_CACHE_BPU,
		"node": unix.PERF_COUNT_HW_CACHE_NODE,
	}
	ops := map[string]uint64{"load": unix.PERF_COUNT_HW_CACHE_OP_READ, "store": unix.PERF_COUNT_HW_CACHE_OP_WRITE,
		"prefetch": unix.PERF_COUNT_HW_CACHE_OP_PREFETCH}
	plural := map[string]string{"load": "loads", "store": "stores", "prefetch": "prefetches"}
	for cn, c := range caches {
		for on, o := range ops {
			access := PerfEvent{Type: unix.PERF_TYPE_HW_CACHE, Config: c | o<<8 | unix.PERF_COUNT_HW_CACHE_RESULT_ACCESS<<16}
			miss := PerfEvent{Type: unix.PERF_TYPE_HW_CACHE, Config: c | o<<8 | unix.PERF_COUNT_HW_CACHE_RESULT_MISS<<16}
			access.Name = cn + "-" + plural[on]
			miss.Name = cn + "-" + on + "-misses"
			perfNamed[access.Name], perfNamed[miss.Name] = access, miss
		}
	}
}

// PerfEventNames returns the names ParsePerfEvent knows (besides raw
// rNNNN events), sorted.
func PerfEventNames() []string {
	var out []string
	for n := range perfNamed {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

// ParsePerfEvent maps a `perf list` name to its counter: the generic
// hardware events (cycles, instructions, cache-references, cache-misses,
// branch-instructions, branch-misses, ...), the software events (cpu-clock,
// task-clock, page-faults, context-switches, cpu-migrations, minor-faults,
// major-faults, ...), the generic cache events (L1-dcache-load-misses,
// LLC-loads, dTLB-store-misses, ...) and raw events rNNNN (hex). A ":u"
// modifier is accepted (memsh counts user space only when the kernel
// requires it).
func ParsePerfEvent(name string) (PerfEvent, error) {
	base := strings.TrimSuffix(name, ":u")
	if ev, ok := perfNamed[base]; ok {
		ev.Name = name
		return ev, nil
	}
	if len(base) > 1 && base[0] == 'r' {
		if c, err := strconv.ParseUint(base[1:], 16, 64); err == nil {
			return PerfEvent{Name: name, Type: unix.PERF_TYPE_RAW, Config: c}, nil
		}
	}
	return PerfEvent{}, fmt.Errorf("unknown perf event %q (want a `perf list` name such as cache-misses, instructions, task-clock, page-faults, L1-dcache-load-misses, or rNNNN)", name)
}

// PerfParanoidFile is the kernel setting that governs perf_event_open.
const PerfParanoidFile = "/proc/sys/kernel/perf_event_paranoid"

// PerfParanoid returns the kernel's perf_event_paranoid level.
func PerfParanoid() (int, error) {
	b, err := os.ReadFile(PerfParanoidFile)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(strings.TrimSpace(string(b)))
}

// PerfUnavailableError says why counters cannot be opened, in words a user
// can act on.
type PerfUnavailableError struct {
	Event string
	Err   error // the errno of perf_event_open
	msg   string
}

func (e *PerfUnavailableError) Error() string { return e.msg }
func (e *PerfUnavailableError) Unwrap() error { return e.Err }

// perfOpenFailed turns a perf_event_open errno into a PerfUnavailableError.
func perfOpenFailed(ev PerfEvent, err error) error {
	e := &PerfUnavailableError{Event: ev.Name, Err: err}
	switch {
	case errors.Is(err, unix.EACCES) || errors.Is(err, unix.EPERM):
		level := "unreadable"
		if p, perr := PerfParanoid(); perr == nil {
			level = strconv.Itoa(p)
		}
		if os.Geteuid() == 0 {
			e.msg = fmt.Sprintf("perf counters unavailable: perf_event_open: %v although running as root (perf_event_paranoid is %s): a container's seccomp profile or a security module forbids it", err, level)
		} else {
			e.msg = fmt.Sprintf("perf counters unavailable: perf_event_paranoid is %s; run `sysctl kernel.perf_event_paranoid=1` or as root", level)
		}
	case errors.Is(err, unix.ENOSYS):
		e.msg = "perf counters unavailable: this kernel has no perf_event_open (ENOSYS)"
	case errors.Is(err, unix.ENOENT) || errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.ENODEV):
		e.msg = fmt.Sprintf("perf counters unavailable: %s: this CPU or VM does not provide it (perf_event_open: %v)", ev.Name, err)
	default:
		e.msg = fmt.Sprintf("perf counters unavailable: %s: perf_event_open: %v", ev.Name, err)
	}
	return e
}

// PerfCounters counts events over every thread of this process (as
// `perf stat --pid` does): one counter per event per thread, summed.
// Counters of threads created after Open are added by Refresh; a thread's
// counts survive its exit. Counts are scaled for multiplexing
// (value × enabled / running).
type PerfCounters struct {
	mu       sync.Mutex
	events   []PerfEvent
	userOnly bool
	threads  map[int][]int // tid -> one fd per event
}

// OpenPerf opens counters for the named events on every thread of the
// process. The error is a *PerfUnavailableError when the kernel refuses
// (its message names perf_event_paranoid), or an unknown-event error.
func OpenPerf(names []string) (*PerfCounters, error) {
	if len(names) == 0 {
		names = []string{DefaultPerfEvent}
	}
	p := &PerfCounters{threads: map[int][]int{}}
	for _, n := range names {
		ev, err := ParsePerfEvent(n)
		if err != nil {
			return nil, err
		}
		p.events = append(p.events, ev)
	}
	if err := p.Refresh(); err != nil {
		p.Close()
		return nil, err
	}
	return p, nil
}

// Events returns the counters' events.
func (p *PerfCounters) Events() []PerfEvent { return p.events }

// Refresh opens counters on threads created since the last call.
func (p *PerfCounters) Refresh() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	tids, err := threadIDs()
	if err != nil {
		return err
	}
	for _, tid := range tids {
		if _, ok := p.threads[tid]; ok {
			continue
		}
		fds := make([]int, 0, len(p.events))
		for _, ev := range p.events {
			fd, err := p.open(ev, tid)
			if err != nil {
				for _, f := range fds {
					unix.Close(f)
				}
				if errors.Is(err, unix.ESRCH) { // the thread exited meanwhile
					fds = nil
					break
				}
				return perfOpenFailed(ev, err)
			}
			fds = append(fds, fd)
		}
		if fds != nil {
			p.threads[tid] = fds
		}
	}
	return nil
}

func (p *PerfCounters) open(ev PerfEvent, tid int) (int, error) {
	attr := unix.PerfEventAttr{
		Type:        ev.Type,
		Config:      ev.Config,
		Size:        uint32(unsafe.Sizeof(unix.PerfEventAttr{})),
		Read_format: unix.PERF_FORMAT_TOTAL_TIME_ENABLED | unix.PERF_FORMAT_TOTAL_TIME_RUNNING,
	}
	if p.userOnly || strings.HasSuffix(ev.Name, ":u") {
		attr.Bits |= unix.PerfBitExcludeKernel | unix.PerfBitExcludeHv
	}
	fd, err := unix.PerfEventOpen(&attr, tid, -1, -1, unix.PERF_FLAG_FD_CLOEXEC)
	if (errors.Is(err, unix.EACCES) || errors.Is(err, unix.EPERM)) && !p.userOnly {
		// perf_event_paranoid >= 2 allows user-space counting only.
		p.userOnly = true
		attr.Bits |= unix.PerfBitExcludeKernel | unix.PerfBitExcludeHv
		fd, err = unix.PerfEventOpen(&attr, tid, -1, -1, unix.PERF_FLAG_FD_CLOEXEC)
	}
	return fd, err
}

// UserOnly reports whether the kernel allowed user-space counting only.
func (p *PerfCounters) UserOnly() bool { return p.userOnly }

// Read returns the counts of each event so far, summed over threads.
func (p *PerfCounters) Read() ([]uint64, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]uint64, len(p.events))
	var buf [24]byte
	for _, fds := range p.threads {
		for i, fd := range fds {
			n, err := unix.Read(fd, buf[:])
			if err != nil {
				return nil, fmt.Errorf("perf: read %s: %v", p.events[i].Name, err)
			}
			if n < len(buf) {
				continue
			}
			v := binary.NativeEndian.Uint64(buf[0:])
			enabled := binary.NativeEndian.Uint64(buf[8:])
			running := binary.NativeEndian.Uint64(buf[16:])
			if running > 0 && running < enabled {
				v = uint64(float64(v) * float64(enabled) / float64(running))
			}
			out[i] += v
		}
	}
	return out, nil
}

// Close closes every counter.
func (p *PerfCounters) Close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, fds := range p.threads {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}
	p.threads = map[int][]int{}
}

func threadIDs() ([]int, error) {
	ents, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return nil, fmt.Errorf("perf: list threads: %v", err)
	}
	out := make([]int, 0, len(ents))
	for _, e := range ents {
		if tid, err := strconv.Atoi(e.Name()); err == nil {
			out = append(out, tid)
		}
	}
	return out, nil
}
