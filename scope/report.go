package scope

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/memsh/memsh/backend"
	"github.com/memsh/memsh/env"
)

// printReport prints an experiment's finish report in the spirit of
// ipyexperiments': elapsed time, the names deleted / restored / kept, a
// table of host and GPU figures, and leaks with their reference paths.
func (s *Session) printReport(e *Experiment) {
	WriteReport(s.out, e.result, e.outcome, s.mgr.PeakMode())
}

// WriteReport writes the human finish report of an experiment.
func WriteReport(w io.Writer, d *env.Data, o *Outcome, mode backend.PeakMode) {
	fmt.Fprintf(w, "*** Experiment %q finished in %s (elapsed wallclock time)\n", d.Name, clock(d.Time))
	if o != nil && len(o.Deleted)+len(o.Restored)+len(o.Kept) > 0 {
		fmt.Fprintf(w, "\n*** Newly defined variables:\n")
		list := func(label string, names []string) {
			if len(names) > 0 {
				fmt.Fprintf(w, "%-9s %s\n", label, strings.Join(names, ", "))
			}
		}
		list("Deleted:", o.Deleted)
		list("Restored:", o.Restored)
		list("Kept:", o.Kept)
	}
	fmt.Fprintf(w, "\n*** Experiment memory:\n")
	// Fixed-width columns, so that reports line up across experiments.
	fmt.Fprintf(w, "%-8s %12s %12s %12s %12s\n", "Device", "Consumed", "Peaked", "Reclaimed", "Available")
	row := func(f env.Figures) {
		fmt.Fprintf(w, "%-8s %12s %12s %12s %12s\n", f.Device, backend.FormatBytes(f.Consumed), backend.FormatBytes(f.Peaked),
			backend.FormatBytes(f.Reclaimed), backend.FormatBytes(f.Available))
	}
	row(d.Host)
	for _, g := range d.GPUs {
		row(g)
	}
	if o != nil && len(d.GPUs) > 0 {
		if o.EmptiedCache {
			fmt.Fprintf(w, "(Available: after releasing the allocator's cache, as cuda.empty_cache())\n")
		} else {
			fmt.Fprintf(w, "(Available: the allocator's cache kept, experiment(empty_cache=False))\n")
		}
	}
	if o != nil && o.Status != "" && o.Status != "ok" {
		fmt.Fprintf(w, "(status %s: %s)\n", o.Status, o.Error)
	}
	if mode == backend.PeakLazy {
		fmt.Fprintf(w, "(--peak lazy: GPU peaks may include garbage not yet reclaimed)\n")
	}
	if o != nil && len(o.Leaks) > 0 {
		fmt.Fprintf(w, "\n*** Leaks: memory allocated in the block and still reachable:\n")
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		for _, l := range o.Leaks {
			fmt.Fprintf(tw, "%s\t%s\t%s\n", l.Device, backend.FormatBytes(int64(l.Bytes)), l.Path)
		}
		tw.Flush()
	}
	fmt.Fprintln(w)
}

// clock formats a duration as hh:mm:ss.mmm.
func clock(d time.Duration) string {
	ms := d.Milliseconds()
	return fmt.Sprintf("%02d:%02d:%02d.%03d", ms/3600000, ms/60000%60, ms/1000%60, ms%1000)
}
