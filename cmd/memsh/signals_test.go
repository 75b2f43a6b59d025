package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/memsh/memsh/record"
)

// signalRuns is the size of the signal-injection campaign.
const signalRuns = 54

// The signal-injection campaign: SIGTERM, SIGINT and SIGHUP at random
// points of a sweep run with --out and --trace, inside an open experiment.
// Every run must end with its signal's status (143, 130, 129) or finish;
// the records file holds whole records only; the open experiment is
// recorded with status "error" naming the signal; the trace is valid
// JSON; and a second run resumes the sweep to its end with every point
// recorded exactly once.
func TestSignalCampaign(t *testing.T) {
	if testing.Short() {
		t.Skip("runs memsh 108 times")
	}
	bin := buildMemsh(t, "")
	dir := t.TempDir()
	const points = 30
	script := write(t, filepath.Join(dir, "sweep.star"), fmt.Sprintf(`
e = experiment("outer", quiet=True)
def step(n):
    x = cuda.malloc(n * MiB)
    for i in range(20000):
        pass
    return n
sweep.grid(step, n=list(range(1, %d)))
e.finish()
`, points+1))
	sigs := []syscall.Signal{syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP}
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 1))
	type plan struct {
		sig   syscall.Signal
		after int           // records in --out before the signal
		delay time.Duration // and then
	}
	plans := make([]plan, signalRuns)
	for i := range plans {
		plans[i] = plan{sigs[i%len(sigs)], 1 + rng.IntN(points/2), time.Duration(rng.IntN(20000)) * time.Microsecond}
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	signalled := 0
	sem := make(chan struct{}, 4)
	for i, p := range plans {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			out := filepath.Join(dir, fmt.Sprintf("run%d.jsonl", i))
			tr := filepath.Join(dir, fmt.Sprintf("run%d.json", i))
			var stderr bytes.Buffer
			cmd := exec.Command(bin, "--device", "sim:1GiB", "--out", out, "--trace", tr, script)
			cmd.Stderr = &stderr
			if err := cmd.Start(); err != nil {
				t.Error(err)
				return
			}
			deadline := time.Now().Add(60 * time.Second)
			for time.Now().Before(deadline) {
				if b, _ := os.ReadFile(out); bytes.Count(b, []byte("\n")) >= p.after {
					break
				}
				time.Sleep(200 * time.Microsecond)
			}
			time.Sleep(p.delay)
			cmd.Process.Signal(p.sig)
			err := cmd.Wait()
			rc := 0
			if ee, ok := err.(*exec.ExitError); ok {
				rc = ee.ExitCode()
			}
			want := 128 + int(p.sig)
			finished := rc == 0
			if rc == want {
				mu.Lock()
				signalled++
				mu.Unlock()
			}
			if rc != want && !finished {
				t.Errorf("run %d (%v after %d records + %v): exit %d, want %d\n%s", i, p.sig, p.after, p.delay, rc, want, stderr.String())
				return
			}
			b, _ := os.ReadFile(out)
			if len(b) > 0 && b[len(b)-1] != '\n' {
				t.Errorf("run %d (%v): a torn last line", i, p.sig)
			}
			recs, err := record.ReadFile(out)
			if err != nil {
				t.Errorf("run %d (%v): %v", i, p.sig, err)
				return
			}
			var outer *record.Record
			for _, r := range recs {
				if r.Kind == "experiment" && r.Name == "outer" {
					outer = r
				}
			}
			switch {
			case outer == nil:
				t.Errorf("run %d (%v, exit %d): the open experiment was not recorded", i, p.sig, rc)
			case !finished && outer.Status != "error":
				t.Errorf("run %d (%v): the open experiment recorded %q %q", i, p.sig, outer.Status, outer.Error)
			}
			tb, err := os.ReadFile(tr)
			if err != nil || !json.Valid(tb) {
				t.Errorf("run %d (%v): the trace is not valid JSON (%v)", i, p.sig, err)
			}
			// resume to the end
			var stderr2 bytes.Buffer
			cmd = exec.Command(bin, "--device", "sim:1GiB", "--out", out, script)
			cmd.Stderr = &stderr2
			if err := cmd.Run(); err != nil {
				t.Errorf("run %d (%v): resuming: %v\n%s", i, p.sig, err, stderr2.String())
				return
			}
			recs, err = record.ReadFile(out)
			if err != nil {
				t.Errorf("run %d: after resuming: %v", i, err)
				return
			}
			seen := map[string]int{}
			for _, r := range recs {
				if r.Kind == "trial" {
					seen[r.Name]++
				}
			}
			for n := 1; n <= points; n++ {
				name := fmt.Sprintf("n=%d", n)
				if c := seen[name]; c != 1 {
					t.Errorf("run %d (%v after %d records + %v): point %s recorded %d times", i, p.sig, p.after, p.delay, name, c)
				}
			}
		}()
	}
	wg.Wait()
	t.Logf("%d of %d runs ended by their signal, the others had finished", signalled, signalRuns)
	if signalled < signalRuns*3/4 {
		t.Errorf("only %d of %d runs were signalled before they finished: the campaign tests little", signalled, signalRuns)
	}
}
