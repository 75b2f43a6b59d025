package host

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func TestParsePerfEvent(t *testing.T) {
	for _, tc := range []struct {
		name   string
		typ    uint32
		config uint64
	}{
		{"cache-misses", unix.PERF_TYPE_HARDWARE, unix.PERF_COUNT_HW_CACHE_MISSES},
		{"instructions", unix.PERF_TYPE_HARDWARE, unix.PERF_COUNT_HW_INSTRUCTIONS},
		{"cycles", unix.PERF_TYPE_HARDWARE, unix.PERF_COUNT_HW_CPU_CYCLES},
		{"branches", unix.PERF_TYPE_HARDWARE, unix.PERF_COUNT_HW_BRANCH_INSTRUCTIONS},
		{"task-clock", unix.PERF_TYPE_SOFTWARE, unix.PERF_COUNT_SW_TASK_CLOCK},
		{"page-faults", unix.PERF_TYPE_SOFTWARE, unix.PERF_COUNT_SW_PAGE_FAULTS},
		{"context-switches", unix.PERF_TYPE_SOFTWARE, unix.PERF_COUNT_SW_CONTEXT_SWITCHES},
		{"cs", unix.PERF_TYPE_SOFTWARE, unix.PERF_COUNT_SW_CONTEXT_SWITCHES},
		{"L1-dcache-load-misses", unix.PERF_TYPE_HW_CACHE, unix.PERF_COUNT_HW_CACHE_L1D | unix.PERF_COUNT_HW_CACHE_OP_READ<<8 | unix.PERF_COUNT_HW_CACHE_RESULT_MISS<<16},
		{"LLC-loads", unix.PERF_TYPE_HW_CACHE, unix.PERF_COUNT_HW_CACHE_LL},
		{"r01c2", unix.PERF_TYPE_RAW, 0x1c2},
		{"instructions:u", unix.PERF_TYPE_HARDWARE, unix.PERF_COUNT_HW_INSTRUCTIONS},
	} {
		ev, err := ParsePerfEvent(tc.name)
		if err != nil || ev.Type != tc.typ || ev.Config != tc.config || ev.Name != tc.name {
			t.Errorf("%s: got %+v, %v; want type %d config %#x", tc.name, ev, err, tc.typ, tc.config)
		}
	}
	if _, err := ParsePerfEvent("cash-misses"); err == nil || !strings.Contains(err.Error(), `unknown perf event "cash-misses"`) {
		t.Errorf("unknown event: %v", err)
	}
}

// TestPerfCounters asserts real counts where the kernel lets this process
// count its own software events (task-clock, page-faults; these need no
// PMU, so VMs have them), and otherwise the exact message that names the
// cause, decided from the environment: perf_event_paranoid and the euid.
func TestPerfCounters(t *testing.T) {
	p, err := OpenPerf([]string{"task-clock", "page-faults"})
	if err != nil {
		var pe *PerfUnavailableError
		if !errors.As(err, &pe) {
			t.Fatalf("OpenPerf: %v (want counts or a PerfUnavailableError)", err)
		}
		if !errors.Is(err, unix.EACCES) && !errors.Is(err, unix.EPERM) && !errors.Is(err, unix.ENOSYS) {
			t.Fatalf("software events refused with %v: %v", pe.Err, err)
		}
		paranoid, perr := os.ReadFile("/proc/sys/kernel/perf_event_paranoid")
		level := strings.TrimSpace(string(paranoid))
		if perr != nil {
			level = "unreadable"
		}
		var want string
		switch {
		case errors.Is(err, unix.ENOSYS):
			want = "perf counters unavailable: this kernel has no perf_event_open (ENOSYS)"
		case os.Geteuid() == 0:
			want = fmt.Sprintf("perf counters unavailable: perf_event_open: %v although running as root (perf_event_paranoid is %s): a container's seccomp profile or a security module forbids it", pe.Err, level)
		default:
			want = "perf counters unavailable: perf_event_paranoid is " + level + "; run `sysctl kernel.perf_event_paranoid=1` or as root"
		}
		if err.Error() != want {
			t.Fatalf("got %q\nwant %q", err, want)
		}
		t.Logf("counters unavailable here, message checked: %v", err)
		return
	}
	defer p.Close()
	before, err := p.Read()
	if err != nil {
		t.Fatal(err)
	}
	// Touch 64 MiB of fresh pages: page faults, and CPU time.
	b, err := unix.Mmap(-1, 0, 64<<20, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < len(b); i += 4096 {
		b[i] = 1
	}
	_ = unix.Munmap(b)
	after, err := p.Read()
	if err != nil {
		t.Fatal(err)
	}
	clock, faults := after[0]-before[0], after[1]-before[1]
	t.Logf("task-clock %d ns, page-faults %d (user only: %v)", clock, faults, p.UserOnly())
	if clock == 0 {
		t.Errorf("task-clock did not advance")
	}
	if faults < 64<<20/(2<<20) { // at least one fault per huge page
		t.Errorf("page-faults %d after touching 64 MiB", faults)
	}
}

// TestPerfHardware: cache-misses (the default event) either counts or, on
// a CPU or VM without a PMU, says so by name.
func TestPerfHardware(t *testing.T) {
	p, err := OpenPerf(nil)
	if err == nil {
		defer p.Close()
		if _, err := p.Read(); err != nil {
			t.Fatal(err)
		}
		return
	}
	var pe *PerfUnavailableError
	if !errors.As(err, &pe) {
		t.Fatalf("OpenPerf: %v", err)
	}
	if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.ENODEV) {
		want := fmt.Sprintf("perf counters unavailable: cache-misses: this CPU or VM does not provide it (perf_event_open: %v)", pe.Err)
		if err.Error() != want {
			t.Fatalf("got %q\nwant %q", err, want)
		}
	} else if !strings.HasPrefix(err.Error(), "perf counters unavailable: ") {
		t.Fatalf("message %q", err)
	}
	t.Logf("%v", err)
}
