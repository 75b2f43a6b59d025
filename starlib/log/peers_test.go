package log_test

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	bhost "github.com/memsh/memsh/backend/host"
	memlog "github.com/memsh/memsh/starlib/log"
)

// TestSeedBeforeEveryInput: log.start(seed=N) reseeds through env.Env.Seed
// before every input (CellLogger's cl_set_seed), SetSeed/ClearSeed are the
// REPL's `:log seed N` / `:log seed off`, seed=False stops it.
func TestSeedBeforeEveryInput(t *testing.T) {
	var out bytes.Buffer
	s := newSession(t, &out)
	var seeds []int64
	e := s.Env()
	e.Seed = func(n int64) { seeds = append(seeds, n) }
	for _, src := range []string{"log.start(seed=42)", "a = 1", "b = 2"} {
		if err := s.Exec("t.star", src); err != nil {
			t.Fatal(err)
		}
	}
	if fmt.Sprint(seeds) != "[42 42]" {
		t.Errorf("seeds %v; want [42 42] (before each input after log.start)", seeds)
	}
	if n, ok := memlog.SeedOf(e); !ok || n != 42 {
		t.Errorf("SeedOf = %d, %v", n, ok)
	}
	memlog.SetSeed(e, -7)
	seeds = nil
	_ = s.Exec("t.star", "c = 3")
	memlog.ClearSeed(e)
	_ = s.Exec("t.star", "d = 4")
	if err := s.Exec("t.star", "log.start(seed=5)\nlog.start(seed=False)\ne = 5"); err != nil {
		t.Fatal(err)
	}
	_ = s.Exec("t.star", "f = 6")
	if fmt.Sprint(seeds) != "[-7 5]" { // 5: before the statement after log.start(seed=5)
		t.Errorf("seeds %v; want [-7 5]", seeds)
	}
	for src, want := range map[string]string{
		"log.start(seed=float('nan'))":    "log.start: for parameter seed: got nan, want a finite number",
		"log.start(seed=1 << 70)":         "log.start: for parameter seed: 2^70 is too large (max 2^63-1)",
		"log.start(seed=True)":            "log.start: for parameter seed: got True, want an int (or False to stop reseeding)",
		"log.start(perf=[1])":             "log.start: for parameter perf: got a list with int, want event names (strings)",
		"log.start(perf=['cash-misses'])": `log.start: unknown perf event "cash-misses"`,
	} {
		if err := s.Exec("t.star", src); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v; want %q", src, err, want)
		}
	}
}

// TestPerfPerInput: log.start(perf=[...]) reports counts per input, or
// fails with the message that names the cause; which one is decided from
// the environment (a software event the kernel lets this process count).
func TestPerfPerInput(t *testing.T) {
	var out bytes.Buffer
	s := newSession(t, &out)
	err := s.Exec("t.star", `log.start(compact=True, perf=["task-clock", "page-faults"])`)
	_, probeErr := bhost.OpenPerf([]string{"task-clock"})
	if probeErr != nil {
		var pe *bhost.PerfUnavailableError
		if !errors.As(probeErr, &pe) || (!errors.Is(probeErr, unix.EACCES) && !errors.Is(probeErr, unix.EPERM)) {
			t.Fatalf("task-clock refused for another reason: %v", probeErr)
		}
		paranoid, _ := os.ReadFile(bhost.PerfParanoidFile)
		want := "perf counters unavailable: perf_event_paranoid is " + strings.TrimSpace(string(paranoid))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("log.start(perf=...) = %v; want an error containing %q", err, want)
		}
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	out.Reset()
	if err := s.Exec("t.star", "x = tensor.ones([16, 1024, 1024])"); err != nil { // 64 MiB written
		t.Fatal(err)
	}
	r := memlog.Last(s.Env())
	if len(r.Perf) != 2 || r.Perf[0].Event != "task-clock" || r.Perf[0].Count == 0 || r.Perf[1].Count < 32 {
		t.Errorf("perf %+v; want task-clock > 0 and page-faults >= 32", r.Perf)
	}
	if !regexp.MustCompile(`\| CPU \d+%/\d+% \| task-clock [\d,]+/s \| page-faults [\d,]+/s \| \(Consumed/Peaked/Used Total\)`).MatchString(out.String()) {
		t.Errorf("line %q", out.String())
	}
	if err := s.Exec("t.star", "d = log.data().perf\nassert_pf = d['page-faults'] >= 0"); err != nil {
		t.Fatal(err)
	}
	if got := memlog.PerfEvents(s.Env()); fmt.Sprint(got) != "[task-clock page-faults]" {
		t.Errorf("PerfEvents %v", got)
	}
	// perf=False stops counting; compact alone keeps the counters.
	if err := s.Exec("t.star", "log.start()"); err != nil {
		t.Fatal(err)
	}
	if len(memlog.PerfEvents(s.Env())) != 2 {
		t.Errorf("log.start() dropped the counters")
	}
	if err := s.Exec("t.star", "log.start(perf=False)"); err != nil {
		t.Fatal(err)
	}
	if memlog.PerfEvents(s.Env()) != nil {
		t.Errorf("perf=False kept the counters")
	}
}

// TestIPyGPULoggerFields: log.data() has ipygpulogger's and CellLogger's
// field names; *_peaked is max(0, peak - end), *_peaked_delta memsh's.
func TestIPyGPULoggerFields(t *testing.T) {
	var out bytes.Buffer
	s := newSessionOn(t, "sim:4GiB,meta", &out)
	src := `log.start()
x = tensor.zeros([64, 1024, 1024], device="cuda")
x = None
d = log.data()
`
	if err := s.Exec("t.star", src); err != nil {
		t.Fatal(err)
	}
	if err := s.Exec("t.star", `
assert_eq = lambda a, b: None if a == b else fail("%r != %r" % (a, b))
assert_eq((d.gpu_mem_used_delta, d.gpu_mem_peaked, d.gpu_mem_used), (-256 * MiB, 256 * MiB, 0))
assert_eq((d.gpu_mem_peaked_delta, d.gpu_mem_used_total), (0, 0))
assert_eq(d.gen_mem_used, d.host.used)
assert_eq(d.cpu_mem_used_total, d.host.used)
assert_eq(d.gen_mem_used_delta, d.host.consumed)
assert_eq(d.cpu_mem_peaked_delta, d.host.peaked)
assert_eq(d.time_delta, d.time)
assert_eq(d.perf, {})
`); err != nil {
		t.Fatal(err)
	}
}
