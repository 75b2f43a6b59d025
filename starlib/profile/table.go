package profile

import (
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
)

// sources reads source files for tables, once per report. Pseudo-files
// ("<stdin-3>" REPL inputs, "<cmd>" code) come from the Session, which
// keeps their text (scope.Session.Source).
type sources struct {
	files   map[string][]string
	session any // the env's Session: asked for the lines of pseudo-files
}

func newSources(session any) sources {
	return sources{files: map[string][]string{}, session: session}
}

// lines returns the lines of file, or nil if they cannot be read.
func (s sources) lines(file string) []string {
	if l, ok := s.files[file]; ok {
		return l
	}
	var l []string
	if strings.HasPrefix(file, "<") {
		if src, ok := s.session.(interface{ Source(string) ([]string, bool) }); ok {
			if lines, ok := src.Source(file); ok {
				l = lines
			}
		}
	} else if b, err := os.ReadFile(file); err == nil {
		l = strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
	}
	s.files[file] = l
	return l
}

// extent returns the line numbers (1-based, inclusive) of the function
// whose def or lambda is on line first of src: the def line and every
// following line that is blank or indented deeper, trailing blank lines
// excluded. A lambda is its own line.
func extent(src []string, fn funcID) (int, int) {
	first := int(fn.line)
	if first < 1 || first > len(src) {
		return 0, -1
	}
	if fn.name == "lambda" {
		return first, first
	}
	indent := indentOf(src[first-1])
	last := first
	for i := first + 1; i <= len(src); i++ {
		l := src[i-1]
		if strings.TrimSpace(l) == "" {
			continue
		}
		if indentOf(l) <= indent {
			break
		}
		last = i
	}
	return first, last
}

func indentOf(l string) int { return len(l) - len(strings.TrimLeft(l, " \t")) }

// write prints every table of t, pytorch_memlab LineProfiler style: per
// function and device, the selected columns for each source line, then the
// line number and the code. Source lines of pseudo-files come from session
// (the env's Session).
func (t *table) write(w io.Writer, session any, cols []column, lazy bool) {
	src := newSources(session)
	printed := false
	for _, fn := range t.funcs {
		for _, dev := range t.devs[fn] {
			t.writeOne(w, src, fn, dev, cols)
			printed = true
		}
	}
	if !printed {
		fmt.Fprintf(w, "## %s  %s:%d\n\nno memory events in %s\n\n", t.top.name, t.top.file, t.top.line, calls(t.calls))
		return
	}
	if lazy {
		fmt.Fprintf(w, "(--peak lazy: peaks may include garbage not yet reclaimed)\n\n")
	}
}

func calls(n int) string {
	if n == 1 {
		return "1 call"
	}
	return fmt.Sprintf("%d calls", n)
}

func (t *table) writeOne(w io.Writer, src sources, fn funcID, dev string, cols []column) {
	title := fmt.Sprintf("## %s  %s:%d  %s", fn.name, fn.file, fn.line, dev)
	if t.calls > 1 {
		title += fmt.Sprintf("  (%s; maxima across calls)", calls(t.calls))
	}
	fmt.Fprintf(w, "%s\n\n", title)

	// Which lines: the function's source, or without it the lines that had
	// events.
	text := src.lines(fn.file)
	var nums []int
	first, last := extent(text, fn)
	for i := first; i <= last; i++ {
		nums = append(nums, i)
	}
	for k := range t.lines {
		if k.fn == fn && k.dev == dev && !slices.Contains(nums, int(k.line)) {
			nums = append(nums, int(k.line))
		}
	}
	slices.Sort(nums)

	// Cells, then widths.
	rows := make([][]string, len(nums))
	widths := make([]int, len(cols))
	heads := make([][3]string, len(cols))
	for j, c := range cols {
		heads[j] = c.headers()
		for _, h := range heads[j] {
			widths[j] = max(widths[j], len(h))
		}
	}
	lineW := len("line")
	for i, n := range nums {
		a := t.lines[lineKey{fn: fn, dev: dev, line: int32(n)}]
		rows[i] = make([]string, len(cols))
		for j, c := range cols {
			if a == nil || (c.field == fPeak && c.scalar == scNone && !a.allocs) {
				continue
			}
			rows[i][j] = c.format(c.value(a))
			widths[j] = max(widths[j], len(rows[i][j]))
		}
		lineW = max(lineW, len(fmt.Sprint(n)))
	}

	for r := range 3 {
		var b strings.Builder
		for j := range cols {
			fmt.Fprintf(&b, "%*s  ", widths[j], heads[j][r])
		}
		if r == 0 {
			fmt.Fprintf(&b, "%*s  code", lineW, "line")
		}
		fmt.Fprintln(w, strings.TrimRight(b.String(), " "))
	}
	for i, n := range nums {
		var b strings.Builder
		for j := range cols {
			fmt.Fprintf(&b, "%*s  ", widths[j], rows[i][j])
		}
		code := ""
		if n >= 1 && n <= len(text) {
			code = text[n-1]
		}
		fmt.Fprintf(&b, "%*d  %s", lineW, n, code)
		fmt.Fprintln(w, strings.TrimRight(b.String(), " "))
	}
	fmt.Fprintln(w)
}
