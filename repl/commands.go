package repl

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/memsh/memsh/backend"
	bhost "github.com/memsh/memsh/backend/host"
	"github.com/memsh/memsh/env"
	"github.com/memsh/memsh/scope"
	"github.com/memsh/memsh/starlib/cuda"
	"github.com/memsh/memsh/starlib/host"
	memlog "github.com/memsh/memsh/starlib/log"
)

func init() {
	Commands[":log"] = Command{
		Help: ":log on|compact|off    log memory, time and CPU after every input\n" +
			"  :log seed N|off        reseed the random generators before every input (log.start(seed=N))\n" +
			"  :log perf [EVENT...]   hardware/software counters per input (default cache-misses; off: none)",
		Run: logCommand,
	}
	Commands[":stats"] = Command{
		Help: ":stats [summary]       memory figures now (summary: cuda.memory_summary per GPU)",
		Run:  statsCommand,
	}
}

const logUsage = "usage: :log on|compact|off, :log seed N|off, :log perf [EVENT...|off]"

func logCommand(s *scope.Session, args []string, out io.Writer) {
	e := s.Env()
	if len(args) == 0 {
		fmt.Fprintln(out, logStatus(e))
		return
	}
	switch args[0] {
	case "seed":
		logSeed(e, args[1:], out)
		return
	case "perf":
		logPerf(e, args[1:], out)
		return
	}
	if len(args) > 1 {
		fmt.Fprintln(out, logUsage)
		return
	}
	switch args[0] {
	case "on", "compact":
		if err := memlog.Start(e, args[0] == "compact"); err != nil {
			fmt.Fprintln(out, err)
			return
		}
	case "off":
		memlog.Stop(e)
	default:
		fmt.Fprintln(out, logUsage)
		return
	}
	fmt.Fprintln(out, logStatus(e))
}

// logStatus is "log is MODE", with the counters and the seed when set.
func logStatus(e *env.Env) string {
	line := "log is " + memlog.Mode(e)
	if ev := memlog.PerfEvents(e); len(ev) > 0 {
		line += ", perf " + strings.Join(ev, " ")
	}
	if seed, ok := memlog.SeedOf(e); ok {
		line += fmt.Sprintf(", seed %d", seed)
	}
	return line
}

// logSeed is `:log seed N` (CellLogger's cl_set_seed: reseed before every
// input while the logger is on) and `:log seed off`.
func logSeed(e *env.Env, args []string, out io.Writer) {
	if len(args) != 1 {
		fmt.Fprintln(out, "usage: :log seed N|off")
		return
	}
	if args[0] == "off" {
		memlog.ClearSeed(e)
	} else {
		n, err := strconv.ParseInt(args[0], 0, 64)
		if err != nil {
			fmt.Fprintf(out, ":log seed: %q is not an integer (usage: :log seed N|off)\n", args[0])
			return
		}
		memlog.SetSeed(e, n)
	}
	line := logStatus(e)
	if _, ok := memlog.SeedOf(e); ok && memlog.Mode(e) == "off" {
		line += " (the seed applies while the log is on: :log on)"
	}
	fmt.Fprintln(out, line)
}

// logPerf is `:log perf [EVENT...]`: the logger (started if off, in its
// current form otherwise) reports these counters per input, by default
// cache-misses; `:log perf off` drops the counters and keeps the logger.
// When the kernel refuses the counters the error says why and nothing
// changes.
func logPerf(e *env.Env, args []string, out io.Writer) {
	o := memlog.Options{Compact: memlog.Mode(e) == "compact", Perf: args}
	switch {
	case len(args) == 1 && args[0] == "off":
		if memlog.Mode(e) == "off" {
			fmt.Fprintln(out, logStatus(e))
			return
		}
		o.Perf = nil
	case len(args) == 0:
		o.Perf = []string{bhost.DefaultPerfEvent}
	}
	if err := memlog.StartWith(e, o); err != nil {
		fmt.Fprintf(out, ":log perf: %v\n", err)
		return
	}
	fmt.Fprintln(out, logStatus(e))
}

// statsCommand prints the memory figures now, after a reclaim: each GPU's
// allocator (allocated, reserved, their peaks since start or
// cuda.reset_peak_memory_stats) and device-wide free / total, host RSS,
// available and total, the Go heap, and the reclaim counters.
func statsCommand(s *scope.Session, args []string, out io.Writer) {
	if len(args) > 1 || (len(args) == 1 && args[0] != "summary") {
		fmt.Fprintln(out, "usage: :stats [summary]")
		return
	}
	m := s.Manager()
	m.Reclaim()
	if len(args) == 1 {
		if m.NumGPUs() == 0 {
			fmt.Fprintln(out, "no CUDA devices")
		}
		for i := 0; i < m.NumGPUs(); i++ {
			fmt.Fprint(out, cuda.Summary(m.GPU(i)))
		}
		return
	}
	b := backend.FormatBytes
	fmt.Fprintf(out, "%-8s %12s %12s %12s %12s %12s %12s\n", "Device", "Allocated", "Reserved", "Peak alloc", "Peak resv", "Free", "Total")
	for i := 0; i < m.NumGPUs(); i++ {
		a := m.GPU(i)
		st := a.Stats()
		free, total, _ := a.Device().MemGetInfo()
		fmt.Fprintf(out, "%-8s %12s %12s %12s %12s %12s %12s\n", a.Device().Name(),
			b(int64(a.Allocated())), b(int64(a.Reserved())),
			b(st["allocated_bytes.all.peak"]), b(st["reserved_bytes.all.peak"]),
			b(int64(free)), b(int64(total)))
	}
	hostAlloc := m.Host().Allocated()
	fmt.Fprintf(out, "%-8s %12s %12s %12s %12s %12s %12s\n", "cpu", b(int64(hostAlloc)), b(int64(hostAlloc)),
		b(m.Host().Stats()["allocated_bytes.all.peak"]), "", b(int64(bhost.Available())), b(int64(bhost.Total())))
	fmt.Fprintf(out, "host RSS %s (memsh's own, simulated GPU pages excluded); Go heap live %s\n",
		b(int64(host.Used(m))), b(int64(bhost.HeapLive())))
	st := m.Stats()
	fmt.Fprintf(out, "reclaims: %d (%d for exact peaks, %d before OOM retries), %s freed in %s; peak mode %s\n",
		st.Reclaims, st.PeakReclaims, st.OOMRetries, b(int64(st.ReclaimedBytes)),
		st.ReclaimTime.Round(time.Microsecond), m.PeakMode())
}
