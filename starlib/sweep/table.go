package sweep

import (
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"

	"github.com/memsh/memsh/backend"
)

// writeTable prints a sweep's summary: a header line, one row per point
// (its parameters, status, peak allocated bytes per GPU above its figure
// before the sweep — host peak RSS when there is no GPU — and time), and
// footer lines. base holds the GPUs' allocated bytes before the sweep.
func writeTable(w io.Writer, header string, ps *points, gpus []string, base []uint64, footer []string) {
	points := make([]*point, ps.len())
	for i := range points {
		points[i] = ps.at(i)
	}
	var b strings.Builder
	b.WriteString(header)
	b.WriteByte('\n')
	var held []string
	for i, d := range gpus {
		if i < len(base) && base[i] > 0 {
			held = append(held, backend.FormatBytes(int64(base[i]))+" on "+d)
		}
	}
	if len(held) > 0 && len(points) > 0 {
		fmt.Fprintf(&b, "(peaks are above the %s allocated before the sweep)\n", strings.Join(held, ", "))
	}
	if len(points) == 0 {
		b.WriteString("no points ran\n")
	}
	var keys []string
	if len(points) > 0 {
		keys = points[0].keys
	}
	widths := make([]int, len(keys))
	for i, k := range keys {
		widths[i] = len(k)
		for _, p := range points {
			widths[i] = max(widths[i], len(valueText(p.params[k])))
		}
	}
	peakCols := gpus
	if len(peakCols) == 0 {
		peakCols = []string{"host"}
	}
	if len(points) > 0 {
		for i, k := range keys {
			fmt.Fprintf(&b, "%-*s  ", widths[i], k)
		}
		fmt.Fprintf(&b, "%-6s", "status")
		for _, d := range peakCols {
			fmt.Fprintf(&b, "  %14s", d+" peak")
		}
		fmt.Fprintf(&b, "  %10s\n", "time")
	}
	for _, p := range points {
		for i, k := range keys {
			fmt.Fprintf(&b, "%-*s  ", widths[i], valueText(p.params[k]))
		}
		fmt.Fprintf(&b, "%-6s", p.status)
		for i, d := range peakCols {
			var b0 uint64
			if len(gpus) > 0 && i < len(base) {
				b0 = base[i]
			}
			fmt.Fprintf(&b, "  %14s", peakText(p, d, b0))
		}
		fmt.Fprintf(&b, "  %8.3f s", p.data.Time.Seconds())
		if p.resumed {
			b.WriteString("  (resumed)")
		}
		if p.unrecorded {
			b.WriteString("  (record not written to --out)")
		}
		b.WriteByte('\n')
	}
	for _, f := range footer {
		b.WriteString(f)
		b.WriteByte('\n')
	}
	io.WriteString(w, b.String())
}

func peakText(p *point, device string, base uint64) string {
	if device == "host" {
		return backend.FormatBytes(p.data.Host.Peak)
	}
	for _, g := range p.data.GPUs {
		if g.Device == device {
			return backend.FormatBytes(g.Peak - int64(base))
		}
	}
	return "-"
}

// isTerminal reports whether progress bars go to w. Tests replace it.
var isTerminal = func(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// progress is a sweep's progress bar on stderr: points done out of total
// (or, with total -1, the number of trials so far), the current point and
// the elapsed time. A nil *progress, used when stderr is not a terminal,
// shows nothing.
type progress struct{ bar *progressbar.ProgressBar }

func newProgress(w io.Writer, total int) *progress {
	if !isTerminal(w) {
		return nil
	}
	return &progress{bar: progressbar.NewOptions(total,
		progressbar.OptionSetWriter(w),
		progressbar.OptionSetWidth(24),
		progressbar.OptionShowCount(),
		progressbar.OptionSetElapsedTime(true),
		progressbar.OptionSetPredictTime(total > 0),
		progressbar.OptionClearOnFinish(),
		progressbar.OptionSetSpinnerChangeInterval(250*time.Millisecond),
	)}
}

func (p *progress) describe(s string) {
	if p != nil {
		p.bar.Describe(s)
	}
}

func (p *progress) add() {
	if p != nil {
		_ = p.bar.Add(1)
	}
}

// close removes the bar from the terminal.
func (p *progress) close() {
	if p != nil {
		_ = p.bar.Finish()
	}
}
