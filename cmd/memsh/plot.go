package main

import (
	"bufio"
	"bytes"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	gplot "gonum.org/v1/plot"
	"gonum.org/v1/plot/vg"

	"github.com/memsh/memsh/fsafe"
	"github.com/memsh/memsh/plot"
	"github.com/memsh/memsh/record"
)

func init() { subcommands["plot"] = plotCommand }

// memsh plot FILE.jsonl [FILE.jsonl...] [-o OUT.svg|.png] [-x PARAM]
// charts sweep records (peak per device against the swept parameter);
// memsh plot FILE.json [-o OUT] charts a trace (memory over time).
func plotCommand(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("memsh plot", flag.ContinueOnError)
	fs.SetOutput(stderr)
	out := fs.String("o", "", "write the chart to `FILE` (.svg or .png); default: the first input with .svg")
	x := fs.String("x", "", "the swept `PARAM` to plot against (default: the numeric parameter with the most values)")
	sweepName := fs.String("sweep", "", "plot only the sweep named `NAME` (default: every sweep, one panel each)")
	width := fs.Float64("width", 8, "width in `inches`")
	height := fs.Float64("height", 5, "height in `inches`")
	force := fs.Bool("force", false, "replace the output even if it is not a chart memsh drew")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: memsh plot RECORDS.jsonl... [-o OUT.svg|OUT.png [--force]] [-x PARAM] [--sweep NAME]")
		fmt.Fprintln(stderr, "       memsh plot TRACE.json [-o OUT.svg|OUT.png]")
		fs.PrintDefaults()
	}
	files, code := parseInterspersed(fs, args)
	if code >= 0 {
		return code
	}
	if len(files) == 0 {
		fs.Usage()
		return 2
	}
	if *out == "" {
		*out = strings.TrimSuffix(files[0], filepath.Ext(files[0])) + ".svg"
	}
	var plots []*gplot.Plot
	var err error
	if isTrace(files[0]) {
		if len(files) > 1 {
			fmt.Fprintln(stderr, "memsh plot: a trace is plotted alone")
			return 2
		}
		var f *os.File
		if f, err = fsafe.OpenRegular(files[0]); err == nil {
			var p *gplot.Plot
			if p, err = plot.Timeline(bufio.NewReader(f)); err == nil {
				plots = []*gplot.Plot{p}
			}
			f.Close()
		}
	} else {
		var all []*record.Record
		for _, name := range files {
			recs, rerr := record.ReadFile(name)
			if rerr != nil {
				err = rerr
				break
			}
			all = append(all, recs...)
		}
		if err == nil {
			plots, err = plot.Sweeps(all, *x, *sweepName)
		}
	}
	if err == nil {
		err = plot.SaveAll(plots, *out, vg.Length(*width)*vg.Inch, vg.Length(*height)*vg.Inch, *force)
	}
	if err != nil {
		fmt.Fprintf(stderr, "memsh plot: %v\n", err)
		return 1
	}
	if _, err := fmt.Fprintf(stdout, "wrote %s\n", *out); err != nil {
		fmt.Fprintf(stderr, "memsh plot: %v\n", err)
		return 1
	}
	return 0
}

// isTrace reports whether name is a trace (a JSON object with
// "traceEvents") rather than JSONL records: by extension, else by content.
func isTrace(name string) bool {
	switch strings.ToLower(filepath.Ext(name)) {
	case ".jsonl":
		return false
	case ".json":
		return true
	}
	f, err := fsafe.OpenRegular(name)
	if err != nil {
		return false
	}
	defer f.Close()
	head := make([]byte, 256)
	n, _ := io.ReadFull(f, head)
	return bytes.Contains(head[:n], []byte(`"traceEvents"`))
}

// parseInterspersed parses flags that may come before, between or after
// the positional arguments; it returns the positional arguments, and an
// exit code >= 0 when parsing ended the command (help or an error).
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, int) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			if err == flag.ErrHelp {
				return nil, 0
			}
			return nil, 2
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return pos, -1
		}
		if rest[0] == "--" {
			return append(pos, rest[1:]...), -1
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
}
