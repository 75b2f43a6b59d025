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
				rec = trace.Start(s.Env(), trace.Options{MaxEvents: *traceMax})
				// Fail now, not at exit, if the file cannot be written; and
				// leave a valid (empty) trace should memsh be killed outright.
				if err := rec.WriteFile(*tracePath); err != nil {
					rec.Stop()
					st.Close()
					return nil, fmt.Errorf("--trace %v", err)
				}
			}
			stopTerm := writeTraceOnTerm(rec, *tracePath, s.Env().Err)
			return func() {
				// Experiments a successful script never finished are
				// finished now, quietly, while the records and the trace
				// still listen. (A failed script's were finished by
				// run, and any a failed statement cut carry that
				// failure's status from the Session itself.)
				finishOpen(s)
				stopTerm()
				if rec != nil {
					rec.Stop()
					if err := rec.WriteFile(*tracePath); err != nil {
						fmt.Fprintf(s.Env().Err, "memsh: --trace %v\n", err)
					}
				}
				if err := st.Close(); err != nil {
					fmt.Fprintf(s.Env().Err, "memsh: --out: %v\n", err)
				}
			}, nil
		}
	})
}

// writeTraceOnTerm makes a SIGTERM (what Slurm and Kubernetes send at a
// time limit or on cancellation) write the trace before memsh exits with
// status 143; records need nothing, each is on disk when its block ends.
// Ctrl-C (SIGINT) is left to the REPL, which interrupts the statement.
func writeTraceOnTerm(rec *trace.Recorder, path string, stderr io.Writer) (stop func()) {
	if rec == nil {
		return func() {}
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM)
	done := make(chan struct{})
	go func() {
		select {
		case <-sigs:
			if err := rec.WriteFile(path); err != nil {
				fmt.Fprintf(stderr, "memsh: terminated; --trace %v\n", err)
			} else {
				fmt.Fprintf(stderr, "memsh: terminated; trace written to %s\n", path)
			}
			os.Exit(143)
		case <-done:
		}
	}()
	return func() {
		signal.Stop(sigs)
		close(done)
	}
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

// outputsFailed reports, for run's exit status, whether a record could
// not be written to --out (the message was printed when it happened).
func outputsFailed(s *scope.Session) bool {
	return record.Of(s.Env()).Err() != nil
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
