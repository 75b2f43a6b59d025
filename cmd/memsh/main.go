// Command memsh is a Starlark REPL and script runner for GPU and host memory
// experiments. See README.md.
//
//	memsh                        REPL (a script when stdin is not a terminal)
//	memsh FILE.star [ARG...]     run a script; ARGs in argv
//	memsh - [ARG...]             run the script on stdin
//	memsh -c CODE                run code
//	memsh -i FILE.star           run a script, then the REPL
//	memsh devices                list devices and memory
//	memsh devices --presets      list the simulator's GPU presets (--device sim:H100)
//	memsh test DIR|FILE...       run test_* functions, one fresh session each
//	memsh version | --version
//	memsh help | -h | --help
//
// Exit status: 0 success; 1 a script error (the traceback is on stderr) or a
// failed test; 2 a usage error; 3 a --max-peak or budget() limit exceeded;
// 130 interrupted (Ctrl-C).
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"slices"
	"strings"

	"github.com/agnivade/levenshtein"

	"go.starlark.net/starlark"
	"golang.org/x/term"

	"github.com/memsh/memsh/backend"
	"github.com/memsh/memsh/backend/host"
	"github.com/memsh/memsh/repl"
	"github.com/memsh/memsh/scope"
	"github.com/memsh/memsh/scripts"
	"github.com/memsh/memsh/starlib"
	"github.com/memsh/memsh/tensor"
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
	// the collector works harder near a host memory limit (ulimit -v, a
	// memory cgroup) rather than the runtime failing at it
	host.SetGoMemoryLimit()
	stop := func() {}
	if f := os.Getenv("MEMSH_CPUPROFILE"); f != "" {
		// a developer's aid: the process's CPU profile, written at exit
		var err error
		if stop, err = startCPUProfile(f); err != nil {
			fmt.Fprintln(os.Stderr, "memsh: MEMSH_CPUPROFILE:", err)
			os.Exit(2)
		}
	}
	stdout := newStdout(os.Stdout)
	code := run(os.Args[1:], os.Stdin, stdout, os.Stderr)
	code = stdout.exit(code, os.Stderr)
	stop()
	os.Exit(code)
}

// startCPUProfile writes the process's CPU profile to path until the
// returned stop is called (go tool pprof reads it).
func startCPUProfile(path string) (stop func(), err error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	return func() { pprof.StopCPUProfile(); f.Close() }, nil
}

func run(args []string, stdin io.Reader, stdout, stderr io.Writer) (rc int) {
	fs := flag.NewFlagSet("memsh", flag.ContinueOnError)
	fs.SetOutput(stderr)
	device := fs.String("device", "auto", "GPU backend: auto, cuda, sim[:SPEC] (e.g. sim:16GiB, sim:2x80GiB,ctx=300MiB, sim:H100; memsh devices --presets), or cpu")
	peak := fs.String("peak", "exact", "peak mode: exact (PyTorch's allocator state: garbage freed before any allocation it could change, so peaks, reserved memory, fragmentation and OOMs are PyTorch's; layout is its former name) or lazy (reclaim only every 256 MiB of data and to retry an OOM: faster, peaks may include garbage)")
	quiet := fs.Bool("quiet", false, "do not print experiment reports")
	code := fs.String("c", "", "run `CODE` and exit")
	interactive := fs.Bool("i", false, "run the script, then start the REPL")
	maxSteps := fs.Uint64("max-steps", 0, "limit the Starlark steps of each top-level statement (0: no limit)")
	showVersion := fs.Bool("version", false, "print the version, VCS commit and Go version, and exit")
	var loadPath pathList
	fs.Var(&loadPath, "load-path", "let load() resolve modules in `DIR` too, besides the main script's directory (repeatable, or a list separated by '"+string(filepath.ListSeparator)+"')")
	var setups []func(s *scope.Session) (func(), error)
	for _, f := range sessionFlags {
		setups = append(setups, f(fs))
	}
	fs.Usage = func() { usage(fs) }
	// Parse into a buffer: help goes to stdout (exit 0), errors to stderr.
	var parseOut strings.Builder
	fs.SetOutput(&parseOut)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprint(stdout, parseOut.String())
			return 0
		}
		fmt.Fprint(stderr, parseOut.String())
		return 2
	}
	fs.SetOutput(stderr)
	if *showVersion {
		fmt.Fprintln(stdout, "memsh", versionString())
		return 0
	}
	if err := distinctOutputs(fs, "out", "trace", "log-file"); err != nil {
		fmt.Fprintln(stderr, "memsh:", err)
		return 2
	}
	if err := loadPath.check(); err != nil {
		fmt.Fprintln(stderr, "memsh:", err)
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
			return devices(*device, rest[1:], stdout, stderr)
		case "test":
			mode, err := backend.ParsePeakMode(*peak)
			if err != nil {
				fmt.Fprintln(stderr, "memsh: --peak:", err)
				return 2
			}
			return runTests(rest[1:], scope.Options{Device: *device, Peak: mode, MaxSteps: *maxSteps, Argv: []string{}, LoadPath: loadPath, Library: scripts.Library}, maxPeakOf(fs), stdout, stderr)
		}
		if sub, ok := subcommands[rest[0]]; ok {
			return sub(rest[1:], stdout, stderr)
		}
		if err := unknownCommand(rest[0]); err != nil {
			fmt.Fprintln(stderr, "memsh:", err)
			return 2
		}
	}
	mode, err := backend.ParsePeakMode(*peak)
	if err != nil {
		fmt.Fprintln(stderr, "memsh: --peak:", err)
		return 2
	}
	opts := scope.Options{Device: *device, Peak: mode, Out: stdout, Err: stderr, Quiet: *quiet, MaxSteps: *maxSteps, Argv: []string{}, LoadPath: loadPath, Library: scripts.Library}
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
		if rc == 0 && outputsFailed(s, stderr) {
			rc = 1
		}
		if sig := repl.Terminated(); sig != nil {
			rc = repl.ExitCode(sig)
		}
	}()
	// SIGTERM and SIGHUP end memsh as Ctrl-C ends a statement, outputs
	// flushed (the cleanups run once, here or from the signal)
	term := repl.StartTerminator(s)
	defer term.Stop()
	defer term.RunCleanups()
	for _, setup := range setups {
		cleanup, err := setup(s)
		if err != nil {
			fmt.Fprintln(stderr, "memsh:", err)
			return 2
		}
		if cleanup != nil {
			term.OnExit(cleanup)
		}
	}

	switch {
	case *code != "":
		if err := repl.Interruptible(s, func() error { return s.Exec("<cmd>", *code) }); err != nil {
			return failed(s, stderr, err)
		}
		return budgetStatus(s)
	case len(rest) > 0 && rest[0] == "-" || len(rest) == 0 && !*interactive && !isTerminal(stdin):
		// A script on stdin (memsh -, or a pipe): run as a whole file, like
		// python -, so blank lines inside a def are fine and a failure
		// exits non-zero with the traceback.
		src, err := io.ReadAll(stdin)
		if err != nil {
			fmt.Fprintln(stderr, "memsh: reading stdin:", err)
			return 1
		}
		if err := repl.Interruptible(s, func() error { return s.Exec("<stdin>", src) }); err != nil {
			return failed(s, stderr, err)
		}
		return budgetStatus(s)
	case len(rest) > 0:
		if err := repl.Interruptible(s, func() error { return s.Exec(rest[0], nil) }); err != nil {
			if !*interactive {
				return failed(s, stderr, err)
			}
			// -i: the REPL goes on with the experiments open (the
			// failure marked them); it finishes them at its end.
			printError(stderr, err)
		}
		if !*interactive {
			return budgetStatus(s)
		}
	}
	if rc := startREPL(s, stdin, stdout, stderr); rc != 0 {
		return rc
	}
	return budgetStatus(s)
}

// unknownCommand is the usage error for a first argument that is neither
// a subcommand nor a script: memsh runs only FILE.star and - (a file of
// another name is refused unread), and a bare word that names no file is
// a mistyped subcommand.
func unknownCommand(arg string) error {
	if arg == "-" || strings.HasSuffix(arg, ".star") {
		return nil
	}
	if _, err := os.Lstat(arg); err == nil || strings.ContainsRune(arg, filepath.Separator) || strings.HasPrefix(arg, "-") {
		// never read: an error must not show a foreign file's content
		return fmt.Errorf("%s: not a script: memsh runs FILE.star, - (standard input) or -c CODE", arg)
	}
	names := []string{"devices", "help", "test", "version"}
	for n := range subcommands {
		names = append(names, n)
	}
	slices.Sort(names)
	best, bestD := "", 3
	for _, n := range names {
		if d := levenshtein.ComputeDistance(arg, n); d < bestD {
			best, bestD = n, d
		}
	}
	if best != "" {
		return fmt.Errorf("unknown command %q (did you mean %q?); commands: %s; a script is FILE.star", arg, best, strings.Join(names, " "))
	}
	return fmt.Errorf("unknown command %q; commands: %s; a script is FILE.star", arg, strings.Join(names, " "))
}

// failed reports a script (or -c code) that stopped on err: the traceback,
// then every experiment still open is finished, innermost first, with the
// failure's status ("oom" or "error") in its report, record and trace.
// It returns the exit status.
func failed(s *scope.Session, stderr io.Writer, err error) int {
	if sig := repl.Terminated(); sig != nil {
		fmt.Fprintf(stderr, "memsh: %v: the open experiments are finished and recorded\n", &repl.SignalError{Sig: sig})
		s.FinishOpen(&repl.SignalError{Sig: sig})
		return repl.ExitCode(sig)
	}
	printError(stderr, err)
	s.FinishOpen(err)
	return exitCode(err)
}

// pathList is a repeatable flag of directories; each value may also be a
// list separated by the OS path-list separator (':' on Unix).
type pathList []string

func (p *pathList) String() string { return strings.Join(*p, string(filepath.ListSeparator)) }

func (p *pathList) Set(v string) error {
	for _, d := range filepath.SplitList(v) {
		if d != "" {
			*p = append(*p, d)
		}
	}
	return nil
}

// check reports the first entry that is not a directory.
func (p pathList) check() error {
	for _, d := range p {
		fi, err := os.Stat(d)
		if err == nil && !fi.IsDir() {
			err = errors.New("not a directory")
		}
		if err != nil {
			return fmt.Errorf("--load-path %s: %v", d, unwrapPathErr(err))
		}
	}
	return nil
}

// budgetStatus is the exit status of a run that succeeded: 3 when a
// --max-peak or budget() limit was exceeded (each violation was reported
// on stderr as it happened), else 0.
func budgetStatus(s *scope.Session) int {
	if starlib.BudgetExceeded(s.Env()) {
		return exitBudget
	}
	return 0
}

// usage prints the usage text and the flags to fs's output.
func usage(fs *flag.FlagSet) {
	fmt.Fprint(fs.Output(), `usage: memsh fit SOURCE [--gpu H100] ...      the largest batch that trains SOURCE (a library model
                                             such as llama-3.1-8b, a config.json, a .star model) on a GPU
       memsh [flags] [FILE.star [ARG...]]   run a script, or the REPL
       memsh [flags] - [ARG...]             run the script on stdin (also when stdin is a pipe)
       memsh [flags] -c CODE [ARG...]       run code
       memsh [flags] -i FILE.star           run a script, then the REPL
       memsh [flags] test DIR|FILE...       run test_*.star files' test_* functions, each in a fresh session
       memsh devices [--presets] | version | help   (--presets: the simulator's GPU presets, sim:H100 ...)
       memsh plot FILE -o OUT.svg|png
       memsh merge A.jsonl B.jsonl ... -o OUT.jsonl
exit status: 0 ok, 1 script error or failed test, 2 usage error, 3 memory budget exceeded, 130 interrupted
flags:
`)
	fs.PrintDefaults()
}

// isTerminal reports whether r is a terminal.
func isTerminal(r io.Reader) bool {
	f, ok := r.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

func startREPL(s *scope.Session, stdin io.Reader, stdout, stderr io.Writer) int {
	if isTerminal(stdin) {
		repl.Version = versionNumber()
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
	if errors.Is(err, tensor.ErrInterrupted) || strings.Contains(err.Error(), "Starlark computation cancelled: interrupted") {
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

func devices(spec string, args []string, stdout, stderr io.Writer) int {
	switch {
	case len(args) == 1 && (args[0] == "--presets" || args[0] == "-presets"):
		fmt.Fprint(stdout, scope.PresetTable())
		return 0
	case len(args) > 0:
		fmt.Fprintf(stderr, "memsh devices: unexpected %q (usage: memsh devices [--presets])\n", strings.Join(args, " "))
		return 2
	}
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

// versionNumber is the VERSION that --version prints first (and the REPL
// banner shows): main.version, else the module version from the build
// info, else "(devel)".
func versionNumber() string {
	v := version
	if v == "" {
		if bi, ok := debug.ReadBuildInfo(); ok {
			v = bi.Main.Version
		}
	}
	if v == "" {
		v = "(devel)"
	}
	return v
}

// versionString is "VERSION commit REV[+modified] GOVERSION GOOS/GOARCH";
// REV is "unknown" when the binary was built without VCS stamping (go run,
// -buildvcs=false, or outside a git checkout).
func versionString() string {
	v, rev, modified := versionNumber(), "", false
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.modified":
				modified = s.Value == "true"
			}
		}
	}
	if rev == "" {
		rev = "unknown"
	} else if modified {
		rev += "+modified"
	}
	return fmt.Sprintf("%s commit %s %s %s/%s", v, rev, runtime.Version(), runtime.GOOS, runtime.GOARCH)
}

// distinctOutputs is the usage error for one file named by two output
// flags (--out X --trace X would lose every record): the same path, or
// two paths to the same existing file.
func distinctOutputs(fs *flag.FlagSet, names ...string) error {
	type named struct{ flag, path, abs string }
	var seen []named
	for _, n := range names {
		f := fs.Lookup(n)
		if f == nil || f.Value.String() == "" || f.Value.String() == os.DevNull {
			continue
		}
		p := f.Value.String()
		abs, err := filepath.Abs(p)
		if err != nil {
			abs = filepath.Clean(p)
		}
		for _, o := range seen {
			same := o.abs == abs
			if !same {
				a, errA := os.Stat(o.path)
				b, errB := os.Stat(p)
				same = errA == nil && errB == nil && os.SameFile(a, b)
			}
			if same {
				return fmt.Errorf("--%s and --%s name the same file %s: each output needs its own", o.flag, n, p)
			}
		}
		seen = append(seen, named{n, p, abs})
	}
	return nil
}
