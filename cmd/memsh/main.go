// Command memsh is a Starlark REPL and script runner for GPU and host memory
// experiments. See README.md.
//
//	memsh                        REPL
//	memsh FILE.star [ARG...]     run a script; ARGs in argv
//	memsh -c CODE                run code
//	memsh -i FILE.star           run a script, then the REPL
//	memsh devices                list devices and memory
//	memsh version
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"

	"go.starlark.net/starlark"
	"golang.org/x/term"

	"github.com/memsh/memsh/backend"
	"github.com/memsh/memsh/repl"
	"github.com/memsh/memsh/scope"
)

// A feature adds its own flags and subcommands from a file of its own, in
// an init function, so main stays wiring.
var (
	// sessionFlags are defined on the flag set before parsing; each returns
	// a setup run on the new Session (before any code runs) and a cleanup
	// run when memsh exits.
	sessionFlags []func(fs *flag.FlagSet) func(s *scope.Session) (cleanup func(), err error)
	// subcommands run instead of the interpreter: memsh NAME ARGS...
	subcommands = map[string]func(args []string, stdout, stderr io.Writer) int{}
)

// version is set with -ldflags "-X main.version=..."; otherwise the module
// version from the build info is used.
var version = ""

func main() {
	stdout := newStdout(os.Stdout)
	code := run(os.Args[1:], os.Stdin, stdout, os.Stderr)
	os.Exit(stdout.exit(code, os.Stderr))
}

func run(args []string, stdin io.Reader, stdout, stderr io.Writer) (rc int) {
	fs := flag.NewFlagSet("memsh", flag.ContinueOnError)
	fs.SetOutput(stderr)
	device := fs.String("device", "auto", "GPU backend: auto, cuda, sim[:SPEC] (e.g. sim:16GiB, sim:2x80GiB,ctx=300MiB), or cpu")
	peak := fs.String("peak", "exact", "peak mode: exact (reclaim before an allocation that would raise a peak) or lazy")
	quiet := fs.Bool("quiet", false, "do not print experiment reports")
	code := fs.String("c", "", "run `CODE` and exit")
	interactive := fs.Bool("i", false, "run the script, then start the REPL")
	maxSteps := fs.Uint64("max-steps", 0, "limit the Starlark steps of each top-level statement (0: no limit)")
	var setups []func(s *scope.Session) (func(), error)
	for _, f := range sessionFlags {
		setups = append(setups, f(fs))
	}
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: memsh [flags] [FILE.star [ARG...]]   run a script, or the REPL\n"+
			"       memsh [flags] -c CODE [ARG...]    run code\n"+
			"       memsh [flags] -i FILE.star        run a script, then the REPL\n"+
			"       memsh devices | version | help\n"+
			"       memsh plot FILE -o OUT.svg|png | memsh merge A.jsonl B.jsonl ... -o OUT.jsonl\n"+
			"flags:\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	rest := fs.Args()
	if len(rest) > 0 && *code == "" {
		switch rest[0] {
		case "version":
			fmt.Fprintln(stdout, "memsh", versionString())
			return 0
		case "help":
			fs.SetOutput(stdout)
			fs.Usage()
			return 0
		case "devices":
			return devices(*device, stdout, stderr)
		}
		if sub, ok := subcommands[rest[0]]; ok {
			return sub(rest[1:], stdout, stderr)
		}
	}
	mode, err := backend.ParsePeakMode(*peak)
	if err != nil {
		fmt.Fprintln(stderr, "memsh: --peak:", err)
		return 2
	}
	opts := scope.Options{Device: *device, Peak: mode, Out: stdout, Err: stderr, Quiet: *quiet, MaxSteps: *maxSteps, Argv: []string{}}
	switch {
	case *code != "":
		opts.Argv = rest
	case len(rest) > 1:
		opts.Argv = rest[1:]
	}
	s, err := scope.New(opts)
	if err != nil {
		fmt.Fprintln(stderr, "memsh:", err)
		return 1
	}
	defer s.Close()
	defer func() { // after the cleanups: a record lost on the way out fails too
		if rc == 0 && outputsFailed(s) {
			rc = 1
		}
	}()
	for _, setup := range setups {
		cleanup, err := setup(s)
		if err != nil {
			fmt.Fprintln(stderr, "memsh:", err)
			return 2
		}
		if cleanup != nil {
			defer cleanup()
		}
	}

	switch {
	case *code != "":
		if err := repl.Interruptible(s, func() error { return s.Exec("<cmd>", *code) }); err != nil {
			printError(stderr, err)
			return exitCode(err)
		}
		return 0
	case len(rest) > 0:
		if err := repl.Interruptible(s, func() error { return s.Exec(rest[0], nil) }); err != nil {
			printError(stderr, err)
			if !*interactive {
				return exitCode(err)
			}
		}
		if !*interactive {
			return 0
		}
	}
	return startREPL(s, stdin, stdout, stderr)
}

func startREPL(s *scope.Session, stdin io.Reader, stdout, stderr io.Writer) int {
	if f, ok := stdin.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		if err := repl.Run(s, historyFile()); err != nil {
			fmt.Fprintln(stderr, "memsh:", err)
			return 1
		}
		return 0
	}
	if err := repl.Loop(s, repl.NewPlain(stdin, nil), stdout); err != nil {
		fmt.Fprintln(stderr, "memsh:", err)
		return 1
	}
	return 0
}

func historyFile() string {
	if d := os.Getenv("XDG_STATE_HOME"); d != "" {
		return filepath.Join(d, "memsh_history")
	}
	if h, err := os.UserHomeDir(); err == nil {
		return filepath.Join(h, ".memsh_history")
	}
	return ""
}

// exitCode is 130 (as a shell reports SIGINT) for an interrupted run, else 1.
func exitCode(err error) int {
	if strings.Contains(err.Error(), "Starlark computation cancelled: interrupted") {
		return 130
	}
	return 1
}

func printError(w io.Writer, err error) {
	var ee *starlark.EvalError
	if errors.As(err, &ee) {
		fmt.Fprintln(w, ee.Backtrace())
		return
	}
	fmt.Fprintln(w, "memsh:", err)
}

func devices(spec string, stdout, stderr io.Writer) int {
	gpus, notice, err := scope.OpenDevices(spec)
	if err != nil {
		fmt.Fprintln(stderr, "memsh:", err)
		return 1
	}
	if notice != "" {
		fmt.Fprintln(stderr, notice)
	}
	fmt.Fprint(stdout, scope.DeviceTable(gpus))
	return 0
}

func versionString() string {
	if version != "" {
		return version
	}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "(devel)"
	}
	v := bi.Main.Version
	if v == "" {
		v = "(devel)"
	}
	for _, s := range bi.Settings {
		if s.Key == "vcs.revision" && s.Value != "" {
			v += " " + s.Value
		}
		if s.Key == "vcs.modified" && s.Value == "true" {
			v += " (modified)"
		}
	}
	return v
}
