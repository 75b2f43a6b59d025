package repl

import (
	"fmt"
	"os"
	"os/signal"
	"sync"
	"syscall"

	"github.com/memsh/memsh/scope"
)

// Terminator makes SIGTERM and SIGHUP (what Slurm and Kubernetes send at a
// time limit, what a closed terminal sends) behave as SIGINT does and then
// end memsh: a running statement is interrupted; the experiments still
// open are finished and recorded with status "error" naming the signal;
// the outputs (records, trace, log) are flushed by the cleanups; memsh
// exits with 128 + the signal's number (143, 129). When no statement runs
// (the REPL waiting for input, a script between statements), the
// Terminator does that itself.
type Terminator struct {
	s        *scope.Session
	mu       sync.Mutex
	busy     bool // a statement runs (Interruptible)
	sig      os.Signal
	cleanups []func()
	once     sync.Once
	ch       chan os.Signal
	done     chan struct{}
	exit     func(int)
}

var (
	termMu  sync.Mutex
	current *Terminator
)

// StartTerminator installs the Terminator of s (one per process).
func StartTerminator(s *scope.Session) *Terminator {
	t := &Terminator{s: s, ch: make(chan os.Signal, 2), done: make(chan struct{}), exit: os.Exit}
	signal.Notify(t.ch, syscall.SIGTERM, syscall.SIGHUP)
	termMu.Lock()
	current = t
	termMu.Unlock()
	go t.loop()
	return t
}

// OnExit adds a cleanup (flushing an output) that runs once, in reverse
// order of adding, whether memsh ends normally (RunCleanups) or by a
// signal.
func (t *Terminator) OnExit(f func()) {
	t.mu.Lock()
	t.cleanups = append(t.cleanups, f)
	t.mu.Unlock()
}

// RunCleanups runs the cleanups, once.
func (t *Terminator) RunCleanups() {
	t.once.Do(func() {
		t.mu.Lock()
		cs := t.cleanups
		t.mu.Unlock()
		for i := len(cs) - 1; i >= 0; i-- {
			cs[i]()
		}
	})
}

// Stop uninstalls the handler.
func (t *Terminator) Stop() {
	signal.Stop(t.ch)
	close(t.done)
	termMu.Lock()
	if current == t {
		current = nil
	}
	termMu.Unlock()
}

// Signal returns the termination signal received, or nil.
func (t *Terminator) Signal() os.Signal {
	if t == nil {
		return nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.sig
}

// ExitCode is 128 + the signal's number.
func ExitCode(sig os.Signal) int {
	if n, ok := sig.(syscall.Signal); ok {
		return 128 + int(n)
	}
	return 1
}

// SignalError is the failure an experiment open at a termination signal
// is recorded with.
type SignalError struct{ Sig os.Signal }

func (e *SignalError) Error() string { return fmt.Sprintf("terminated by %s", signalName(e.Sig)) }

func signalName(sig os.Signal) string {
	switch sig {
	case syscall.SIGTERM:
		return "SIGTERM"
	case syscall.SIGHUP:
		return "SIGHUP"
	}
	return sig.String()
}

// Finish finishes the experiments still open with the signal's failure.
func (t *Terminator) Finish() {
	if sig := t.Signal(); sig != nil {
		t.s.FinishOpen(&SignalError{sig})
	}
}

func (t *Terminator) loop() {
	for {
		select {
		case sig := <-t.ch:
			t.mu.Lock()
			if t.sig == nil {
				t.sig = sig
			}
			busy := t.busy
			if busy {
				t.mu.Unlock()
				t.s.Interrupt() // the statement stops; its caller ends memsh
				continue
			}
			// idle: nothing else touches the Session while t.mu is held
			// (enter waits for it)
			fmt.Fprintf(os.Stderr, "memsh: %s: finishing the open experiments and writing the outputs\n", signalName(t.sig))
			t.s.FinishOpen(&SignalError{t.sig})
			t.mu.Unlock()
			t.RunCleanups()
			t.exit(ExitCode(t.sig))
		case <-t.done:
			return
		}
	}
}

// enter marks a statement running; it waits while an idle shutdown holds
// the Session, and reports false once a termination signal came.
func (t *Terminator) enter() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.sig != nil {
		return false
	}
	t.busy = true
	return true
}

func (t *Terminator) leave() {
	t.mu.Lock()
	t.busy = false
	t.mu.Unlock()
}

func terminator() *Terminator {
	termMu.Lock()
	defer termMu.Unlock()
	return current
}

// Terminated returns the termination signal the process received, or nil.
func Terminated() os.Signal { return terminator().Signal() }
