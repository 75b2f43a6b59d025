// Package repl is memsh's interactive loop over a scope.Session: a banner,
// prompts ">>> " and "... ", multi-line compound statements (recalled from
// history as one entry), Tab completion of globals, nested attributes
// (gpu.x, d.gpu.y) and colon commands, Ctrl-C to interrupt a running
// statement (the Session reclaims and stays usable), Ctrl-D to exit
// (finishing open experiments), and colon commands (:help, :exp).
//
// Input number n is run as the pseudo-file "<stdin-n>", so tracebacks name
// the input, and the Session keeps its text (scope.Session.Source) for
// tools that show source lines.
package repl

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sort"
	"strings"
	"time"
	"unicode"

	"github.com/chzyer/readline"
	"go.starlark.net/starlark"
	"go.starlark.net/syntax"

	"github.com/memsh/memsh/backend"
	"github.com/memsh/memsh/scope"
)

// LineReader reads one line of input after showing a prompt. It returns
// io.EOF at end of input (Ctrl-D) and ErrInterrupt when the user pressed
// Ctrl-C while typing.
type LineReader interface {
	Readline(prompt string) (string, error)
}

// ErrInterrupt is returned by a LineReader when the user pressed Ctrl-C.
var ErrInterrupt = errors.New("interrupt")

// Version is memsh's version, for the banner (cmd/memsh sets it).
var Version = "(devel)"

// Banner returns the lines Run prints at start: memsh and its version, the
// current device, and where help is.
func Banner(s *scope.Session, version string) string {
	return fmt.Sprintf("memsh %s: Starlark memory experiments\ndevice: %s\nhelp() or :help for help; Ctrl-D exits\n", version, deviceLine(s))
}

// deviceLine describes the current GPU ("cuda:0 = simulated GPU 16.00
// GiB", "cuda:0 = NVIDIA H100 80GB HBM3, 79.19 GiB", a simulator preset
// "cuda:0 = NVIDIA H100 80GB HBM3 (simulated), 79.65 GiB"), or the CPU.
func deviceLine(s *scope.Session) string {
	gpus := s.Devices()
	if len(gpus) == 0 {
		return "cpu (no GPU)"
	}
	i := s.Manager().Current()
	if i < 0 || i >= len(gpus) {
		i = 0
	}
	d := gpus[i]
	line := d.Name() + " = " + d.Description()
	if desc := d.Description(); d.Kind() == "sim" && !strings.HasPrefix(desc, "simulated") {
		// a GPU preset of the simulator, named as the real card: say it is simulated
		line += " (simulated"
		if m, ok := d.(interface{ Meta() bool }); ok && m.Meta() {
			line += ", meta"
		}
		line += ")"
	}
	if _, total, err := d.MemGetInfo(); err == nil {
		if t := backend.FormatBytes(int64(total)); !strings.Contains(line, t) {
			line += ", " + t
		}
	}
	if len(gpus) > 1 {
		line += fmt.Sprintf(" (%d GPUs: :devices)", len(gpus))
	}
	return line
}

// Run runs the REPL on the terminal until Ctrl-D. History is kept in
// historyFile ("" for none).
func Run(s *scope.Session, historyFile string) error {
	rl, err := readline.NewEx(&readline.Config{
		Prompt:                 ">>> ",
		HistoryFile:            historyFile,
		DisableAutoSaveHistory: true, // Loop saves whole inputs
		AutoComplete:           &completer{s},
		InterruptPrompt:        "^C",
		EOFPrompt:              "",
	})
	if err != nil {
		return err
	}
	defer rl.Close()
	s.SetOutput(rl.Stdout())
	fmt.Fprint(rl.Stdout(), Banner(s, Version))
	return Loop(s, &terminal{rl}, rl.Stdout())
}

type terminal struct{ rl *readline.Instance }

// SaveHistory implements HistorySaver.
func (t *terminal) SaveHistory(entry string) error { return t.rl.SaveHistory(entry) }

// HistorySaver is implemented by LineReaders that keep a history: Loop
// saves each input once it is complete, a multi-line input (a def block)
// as one entry.
type HistorySaver interface {
	SaveHistory(entry string) error
}

func (t *terminal) Readline(prompt string) (string, error) {
	t.rl.SetPrompt(prompt)
	line, err := t.rl.Readline()
	if err == readline.ErrInterrupt {
		return "", ErrInterrupt
	}
	return line, err
}

// Plain is a LineReader over any reader (a pipe, a file, a test): it writes
// each prompt and echoes each line to Echo (if non-nil), so the output reads
// as a transcript.
type Plain struct {
	in   *bufio.Reader
	Echo io.Writer
}

// NewPlain returns a Plain reader over r echoing to echo.
func NewPlain(r io.Reader, echo io.Writer) *Plain { return &Plain{in: bufio.NewReader(r), Echo: echo} }

// Readline implements LineReader.
func (p *Plain) Readline(prompt string) (string, error) {
	line, err := p.in.ReadString('\n')
	if err != nil && (err != io.EOF || line == "") {
		return "", err
	}
	line = strings.TrimSuffix(line, "\n")
	if p.Echo != nil {
		fmt.Fprintf(p.Echo, "%s%s\n", prompt, line)
	}
	return line, nil
}

// Loop reads inputs from r and runs them in s until end of input, printing
// errors to out. Ctrl-C (SIGINT) during a statement interrupts it.
func Loop(s *scope.Session, r LineReader, out io.Writer) error {
	hist, _ := r.(HistorySaver)
	n := 0
	for {
		src, err := readInput(r)
		if err == io.EOF {
			finishOpen(s, out, "end of input")
			return nil
		}
		if err == ErrInterrupt {
			continue
		}
		if err != nil {
			fmt.Fprintln(out, err)
			continue
		}
		trimmed := strings.TrimSpace(src)
		if trimmed == "" {
			continue
		}
		if hist != nil {
			_ = hist.SaveHistory(strings.TrimRight(src, "\n"))
		}
		if strings.HasPrefix(trimmed, ":") {
			s.Settle() // what an interrupted statement left, before the figures
			if command(s, trimmed, out) {
				finishOpen(s, out, ":quit")
				return nil
			}
			continue
		}
		n++
		if err := execInterruptible(s, fmt.Sprintf("<stdin-%d>", n), src); err != nil {
			printError(out, err)
		}
		if t := terminator(); t != nil && t.Signal() != nil {
			t.Finish()
			return nil
		}
	}
}

// finishOpen finishes the experiments still open when the REPL ends, with
// a warning, so their reports and records are not lost.
func finishOpen(s *scope.Session, out io.Writer, why string) {
	exps := s.Experiments()
	if len(exps) == 0 {
		return
	}
	names := make([]string, len(exps))
	for i, e := range exps {
		names[i] = fmt.Sprintf("%q", e.Name())
	}
	fmt.Fprintf(out, "*** %s with experiment %s still open: finishing it\n", why, strings.Join(names, ", "))
	s.FinishOpen(nil)
}

// readInput reads one input: a line, or as many lines as a compound
// statement or an open bracket needs.
func readInput(r LineReader) (string, error) {
	var lines []string
	var rerr error // the reader's own error: the parser only keeps its text
	prompt := ">>> "
	read := func() ([]byte, error) {
		line, err := r.Readline(prompt)
		if err != nil {
			if err == io.EOF && len(lines) > 0 {
				return nil, nil // end of input ends the statement
			}
			rerr = err
			return nil, err
		}
		if len(lines) == 0 && strings.HasPrefix(strings.TrimSpace(line), ":") {
			lines = append(lines, line)
			rerr = errColon
			return nil, errColon
		}
		prompt = "... "
		lines = append(lines, line)
		return []byte(line + "\n"), nil
	}
	_, err := fileOptions.ParseCompoundStmt("<stdin>", read)
	src := strings.Join(lines, "\n")
	switch {
	case rerr == errColon:
		return src, nil
	case rerr != nil:
		return "", rerr
	case err != nil && len(lines) == 0:
		return "", err
	}
	// A syntax error is reported by Exec, with its position.
	return src, nil
}

var fileOptions = &syntax.FileOptions{Set: true, While: true, TopLevelControl: true, GlobalReassign: true, LoadBindsGlobally: true, Recursion: true}

var errColon = errors.New("colon command")

func execInterruptible(s *scope.Session, name, src string) error {
	return Interruptible(s, func() error { return s.ExecInteractive(name, src) })
}

// Interruptible runs f (which executes code in s) so that Ctrl-C (SIGINT)
// interrupts the running statement instead of killing the process: the
// statement fails with an "interrupted" error, the Session reclaims and
// stays usable. Scripts run this way too. With a Terminator installed,
// SIGTERM and SIGHUP interrupt it the same way (the caller then ends
// memsh: Terminated says why).
func Interruptible(s *scope.Session, f func() error) error {
	if t := terminator(); t != nil && t.s == s {
		if !t.enter() {
			return &SignalError{t.Signal()}
		}
		defer t.leave()
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt)
	done := make(chan struct{})
	go func() {
		select {
		case <-sig:
			s.Interrupt()
		case <-done:
		}
	}()
	err := f()
	close(done)
	signal.Stop(sig)
	return err
}

func printError(out io.Writer, err error) {
	var ee *starlark.EvalError
	if errors.As(err, &ee) {
		fmt.Fprintln(out, ee.Backtrace())
		return
	}
	fmt.Fprintln(out, err)
}

const help = scope.Help + `
Commands:
  :help                  this text
  :exp                   open experiments and their figures so far
  :devices               devices and their memory (as memsh devices)
  :quit                  exit (or Ctrl-D)`

const helpFooter = `Ctrl-C interrupts a running statement; Ctrl-D exits (finishing open experiments);
Tab completes names, attributes (d.gpu.) and :commands.`

// Command is a REPL colon command added by a feature (":log", ":stats").
type Command struct {
	Help string // one line for :help, e.g. ":log on|compact|off   per-input memory log"
	Run  func(s *scope.Session, args []string, out io.Writer)
}

// Commands holds the colon commands beyond the built-in :help, :exp and
// :quit, by name with the colon (":log"). Features register theirs in init.
var Commands = map[string]Command{}

// command runs a colon command and reports whether the REPL should exit.
func command(s *scope.Session, line string, out io.Writer) bool {
	fields := strings.Fields(line)
	if c, ok := Commands[fields[0]]; ok {
		c.Run(s, fields[1:], out)
		return false
	}
	switch fields[0] {
	case ":help", ":h", ":?":
		fmt.Fprintln(out, help)
		names := make([]string, 0, len(Commands))
		for name := range Commands {
			names = append(names, name)
		}
		sort.Strings(names)
		for _, name := range names {
			fmt.Fprintf(out, "  %s\n", Commands[name].Help)
		}
		fmt.Fprintln(out, helpFooter)
	case ":quit", ":q", ":exit":
		return true
	case ":devices":
		fmt.Fprint(out, scope.DeviceTable(s.Devices()))
	case ":exp":
		exps := s.Experiments()
		if len(exps) == 0 {
			fmt.Fprintln(out, "no open experiments")
			return false
		}
		for i, e := range exps {
			d := e.Data()
			fmt.Fprintf(out, "%s%q running for %s: host consumed %s", strings.Repeat("  ", i), e.Name(), d.Time.Round(time.Millisecond), backend.FormatBytes(d.Host.Consumed))
			for _, g := range d.GPUs {
				fmt.Fprintf(out, ", %s consumed %s peaked %s", g.Device, backend.FormatBytes(g.Consumed), backend.FormatBytes(g.Peaked))
			}
			fmt.Fprintln(out)
		}
	default:
		fmt.Fprintf(out, "unknown command %s (try :help)\n", fields[0])
	}
	return false
}

// completer completes global names, nested attributes and colon commands.
type completer struct{ s *scope.Session }

// Do implements readline.AutoCompleter.
func (c *completer) Do(line []rune, pos int) ([][]rune, int) {
	return Complete(c.s, string(line[:pos]))
}

// Complete returns the completions of the end of before (the line up to the
// cursor) as suffixes, and the length in runes of the word they complete.
// A line starting with ":" completes colon commands. Attributes are
// completed by following attribute lookups from a visible name (d.gpu.);
// no user code runs.
func Complete(s *scope.Session, before string) ([][]rune, int) {
	var word string
	var candidates []string
	if t := strings.TrimLeft(before, " "); strings.HasPrefix(t, ":") && !strings.ContainsAny(t, " \t") {
		word = t
		candidates = commandNames()
	} else {
		r := []rune(before)
		start := len(r)
		for start > 0 && isIdent(r[start-1]) {
			start--
		}
		word = string(r[start:])
		if i := strings.LastIndexByte(word, '.'); i >= 0 {
			if ha, ok := attrValue(s, word[:i]).(starlark.HasAttrs); ok {
				for _, a := range ha.AttrNames() {
					candidates = append(candidates, word[:i+1]+a)
				}
			}
		} else {
			candidates = s.Names()
		}
	}
	sort.Strings(candidates)
	var out [][]rune
	for _, cand := range candidates {
		if strings.HasPrefix(cand, word) && cand != word {
			out = append(out, []rune(cand[len(word):]))
		}
	}
	return out, len([]rune(word))
}

// attrValue evaluates a dotted path (gpu, d.gpu) by looking up the first
// name and then attributes, or returns nil.
func attrValue(s *scope.Session, path string) starlark.Value {
	parts := strings.Split(path, ".")
	if parts[0] == "" || unicode.IsDigit(rune(parts[0][0])) {
		return nil
	}
	v := s.Lookup(parts[0])
	for _, p := range parts[1:] {
		ha, ok := v.(starlark.HasAttrs)
		if !ok || p == "" {
			return nil
		}
		next, err := ha.Attr(p)
		if err != nil || next == nil {
			return nil
		}
		v = next
	}
	return v
}

// commandNames lists the colon commands.
func commandNames() []string {
	names := []string{":help", ":quit", ":exp", ":devices"}
	for name := range Commands {
		names = append(names, name)
	}
	return names
}

func isIdent(r rune) bool {
	return r == '_' || r == '.' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9'
}
