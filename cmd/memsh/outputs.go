package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

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
		return func(s *scope.Session) (func(), error) {
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
					return nil, fmt.Errorf("--out: %v", err)
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
					return nil, fmt.Errorf("--trace: %v", err)
				}
			}
			stopTerm := writeTraceOnTerm(rec, *tracePath, s.Env().Err)
			return func() {
				stopTerm()
				if rec != nil {
					rec.Stop()
					if err := rec.WriteFile(*tracePath); err != nil {
						fmt.Fprintf(s.Env().Err, "memsh: --trace: %v\n", err)
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
				fmt.Fprintf(stderr, "memsh: terminated; --trace: %v\n", err)
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
