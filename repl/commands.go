package repl

import (
	"fmt"
	"io"
	"time"

	"github.com/memsh/memsh/backend"
	bhost "github.com/memsh/memsh/backend/host"
	"github.com/memsh/memsh/scope"
	"github.com/memsh/memsh/starlib/cuda"
	"github.com/memsh/memsh/starlib/host"
	memlog "github.com/memsh/memsh/starlib/log"
)

func init() {
	Commands[":log"] = Command{
		Help: ":log on|compact|off    log memory, time and CPU after every input",
		Run:  logCommand,
	}
	Commands[":stats"] = Command{
		Help: ":stats [summary]       memory figures now (summary: cuda.memory_summary per GPU)",
		Run:  statsCommand,
	}
}

func logCommand(s *scope.Session, args []string, out io.Writer) {
	e := s.Env()
	if len(args) == 0 {
		fmt.Fprintf(out, "log is %s\n", memlog.Mode(e))
		return
	}
	if len(args) > 1 {
		fmt.Fprintln(out, "usage: :log on|compact|off")
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
		fmt.Fprintln(out, "usage: :log on|compact|off")
		return
	}
	fmt.Fprintf(out, "log is %s\n", memlog.Mode(e))
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
