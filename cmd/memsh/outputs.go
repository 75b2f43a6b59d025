package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sync"
	"syscall"

	"github.com/memsh/memsh/fsafe"
	"github.com/memsh/memsh/record"
	"github.com/memsh/memsh/scope"
	"github.com/memsh/memsh/trace"
)

// The output flags: --out FILE.jsonl (records, resume), --shard i/n and
// --trace FILE.json (with --trace-max-events). Their values reach the
// sweep module through the Session's env (package record's State).
func init() {
	sessionFlags = append(sessionFlags, func(fs *flag.FlagSet) func(s *scope.Session) (func(), error) {
		out := fs.String("out", "", "append a JSON record of every experiment and trial to `FILE.jsonl` as it finishes; sweep points already recorded there are skipped (resume)")
		shard := fs.String("shard", "", "run only shard `i/n` of every sweep's points (0 <= i < n); combine the shards' --out files with memsh merge")
		tracePath := fs.String("trace", "", "write a Chrome Trace Event timeline of memory, statements, trials and OOMs to `FILE.json` at exit (open it in ui.perfetto.dev)")
		traceMax := fs.Int("trace-max-events", trace.DefaultMaxEvents, "bound on the events in the --trace file (counters are aggregated, keeping peaks, beyond it)")
		force := fs.Bool("force", false, "let --trace replace an existing file that is not a trace memsh wrote")
		outDir := fs.String("out-dir", "", "let builtins that write files (cuda.dump_snapshot) write under `DIR` as well as the working directory")
		return func(s *scope.Session) (func(), error) {
			if *outDir != "" {
				fi, err := os.Stat(*outDir)
				if err == nil && !fi.IsDir() {
					err = fmt.Errorf("not a directory")
				}
				if err != nil {
					return nil, fmt.Errorf("--out-dir %s: %v", *outDir, unwrapPathErr(err))
				}
				s.Env().Files = &fsafe.Policy{Roots: []string{".", *outDir}}
			}
			st := record.Of(s.Env())
			if *shard != "" {
				sh, err := record.ParseShard(*shard)
				if err != nil {
					return nil, fmt.Errorf("--shard: %v", err)
				}
				st.SetShard(sh)
			}
			if *out != "" {
				if err := st.Open(*out); err != nil {
					return nil, fmt.Errorf("--out %v", err)
				}
				if n := st.Recorded(); n > 0 {
					fmt.Fprintf(s.Env().Err, "memsh: --out %s: %d sweep points recorded already will be skipped\n", *out, n)
				}
			}
			var rec *trace.Recorder
			if *tracePath != "" {
				if *traceMax < 1 {
					st.Close()
					return nil, fmt.Errorf("--trace-max-events: got %d, want a positive number", *traceMax)
				}
				rec = trace.Start(s.Env(), trace.Options{MaxEvents: *traceMax, Overwrite: *force})
				// Fail now, not at exit, if the file cannot be written; and
				// leave a valid (empty) trace should memsh be killed outright.
				if err := rec.WriteFile(*tracePath); err != nil {
					rec.Stop()
					st.Close()
					return nil, fmt.Errorf("--trace %v", err)
				}
			}
			return func() {
				// Experiments a successful script never finished are
				// finished now, quietly, while the records and the trace
				// still listen. (A failed script's were finished by
				// run, and any a failed statement cut carry that
				// failure's status from the Session itself.)
				finishOpen(s)
				if rec != nil {
					rec.Stop()
					if err := rec.WriteFile(*tracePath); err != nil {
						outputFailed(s, fmt.Errorf("--trace %v", err))
					}
				}
				if err := st.Close(); err != nil {
					outputFailed(s, fmt.Errorf("--out: %v", err))
				}
			}, nil
		}
	})
}

// finishOpen finishes the experiments still open, without reports, with
// their own status.
func finishOpen(s *scope.Session) {
	open := s.Experiments()
	if len(open) == 0 {
		return
	}
	out := s.Output()
	s.SetOutput(io.Discard)
	_, _ = open[0].Finish() // the outermost: inner ones finish first
	s.SetOutput(out)
}

// outputErrsKey is the env.Values key of the outputs that failed.
const outputErrsKey = "memsh.cmd.output_errors"

// outputFailed notes that an output could not be written (at exit: the
// trace, the log); memsh then exits non-zero naming it.
func outputFailed(s *scope.Session, err error) {
	errs, _ := s.Env().Values[outputErrsKey].([]error)
	s.Env().Values[outputErrsKey] = append(errs, err)
}

// outputsFailed reports, for run's exit status, whether an output could
// not be written: a record to --out (its message was printed when it
// happened), or another output at exit (printed now, with the path and
// the OS error).
func outputsFailed(s *scope.Session, stderr io.Writer) bool {
	errs, _ := s.Env().Values[outputErrsKey].([]error)
	for _, err := range errs {
		fmt.Fprintln(stderr, "memsh:", err)
	}
	return record.Of(s.Env()).Err() != nil || len(errs) > 0
}

// checkedStdout is memsh's standard output: it remembers the first write
// error (a closed pipe, a full disk) so that memsh exits non-zero with a
// message instead of losing output silently.
type checkedStdout struct {
	w   io.Writer
	mu  sync.Mutex
	err error
}

// newStdout wraps w; SIGPIPE is ignored so that a closed pipe is an EPIPE
// error memsh reports rather than a silent death.
func newStdout(w io.Writer) *checkedStdout {
	signal.Ignore(syscall.SIGPIPE)
	return &checkedStdout{w: w}
}

func (c *checkedStdout) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	if err != nil {
		c.mu.Lock()
		if c.err == nil {
			c.err = err
		}
		c.mu.Unlock()
	}
	return n, err
}

// exit returns the exit status for code once memsh is done: code, or 1
// after printing the error when writing standard output failed.
func (c *checkedStdout) exit(code int, stderr io.Writer) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err == nil {
		return code
	}
	fmt.Fprintf(stderr, "memsh: writing standard output: %v\n", unwrapPathErr(c.err))
	return max(code, 1)
}

func unwrapPathErr(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}
