package log

import (
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/memsh/memsh/backend"
	"github.com/memsh/memsh/env"
)

func (l *Logger) print(r *Record) {
	w := l.out
	if w == nil {
		w = l.env.Out
	}
	if l.compact {
		WriteCompact(w, r)
	} else {
		WriteLines(w, r)
	}
}

// WriteLines writes the normal log lines of a record, in the spirit of
// ipyexperiments' CellLogger (with ipython_memory_usage's CPU figures):
//
//	･ RAM:       △Consumed     △Peaked  Used Total | Exec time 0:00:00.028 | CPU mean 7%, max core 100% | run.star:3
//	･ host:       12.00 MiB         0 B   45.21 MiB |
//	･ cuda:0:         0 B    1.00 GiB    1.00 GiB |
//
// Peaked is the blip above what was kept (max(0, peak − start) − max(0,
// consumed)); Used Total is the figure at the end. The position is left out
// for REPL inputs.
func WriteLines(w io.Writer, r *Record) {
	d := &r.Data
	fmt.Fprintf(w, "･ %-8s%12s%12s%12s | Exec time %s | CPU mean %.0f%%, max core %.0f%%%s%s\n",
		"RAM:", "△Consumed", "△Peaked", "Used Total", clock(d.Time),
		r.CPU.SystemPercent, r.CPU.MaxCorePercent, perfText(r), where(r.Statement))
	row := func(f env.Figures) {
		fmt.Fprintf(w, "･ %-8s%12s%12s%12s |\n", f.Device+":",
			backend.FormatBytes(f.Consumed), backend.FormatBytes(f.Peaked), backend.FormatBytes(f.Used))
	}
	row(d.Host)
	for _, g := range d.GPUs {
		row(g)
	}
}

// WriteCompact writes the one-line form, as CellLogger's compact mode:
//
//	host: 12.00 MiB/0 B/45.21 MiB | cuda:0: 0 B/1.00 GiB/1.00 GiB | Time 0:00:00.028 | CPU 7%/100% | (Consumed/Peaked/Used Total)
func WriteCompact(w io.Writer, r *Record) {
	d := &r.Data
	var b strings.Builder
	part := func(f env.Figures) {
		fmt.Fprintf(&b, "%s: %s/%s/%s | ", f.Device, backend.FormatBytes(f.Consumed),
			backend.FormatBytes(f.Peaked), backend.FormatBytes(f.Used))
	}
	part(d.Host)
	for _, g := range d.GPUs {
		part(g)
	}
	fmt.Fprintf(&b, "Time %s | CPU %.0f%%/%.0f%%%s | (Consumed/Peaked/Used Total)%s\n",
		clock(d.Time), r.CPU.SystemPercent, r.CPU.MaxCorePercent, perfText(r), where(r.Statement))
	io.WriteString(w, b.String())
}

func where(pos string) string {
	if pos == "" || strings.HasPrefix(pos, "<stdin") {
		return ""
	}
	return " | " + pos
}

// clock formats a duration as CellLogger does (Python's timedelta):
// H:MM:SS.mmm.
func clock(d time.Duration) string {
	ms := d.Milliseconds()
	return fmt.Sprintf("%d:%02d:%02d.%03d", ms/3600000, ms/60000%60, ms/1000%60, ms%1000)
}

// perfText formats the counters as ipython_memory_usage's perf variant
// reports them, per second of wall time: " | cache-misses 8,823/s".
func perfText(r *Record) string {
	var b strings.Builder
	for _, c := range r.Perf {
		fmt.Fprintf(&b, " | %s %s/s", c.Event, commas(uint64(c.PerSecond(r.Data.Time)+0.5)))
	}
	return b.String()
}

// commas formats n with thousands separators.
func commas(n uint64) string {
	s := fmt.Sprint(n)
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}
