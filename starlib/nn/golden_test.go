package nn_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/memsh/memsh/backend"
	"github.com/memsh/memsh/scope"
)

// The golden comparisons: each case runs the same model or op as
// bench/torchref/torchref.py ran in PyTorch, phase by phase, on a simulated
// GPU, and compares memsh's figures — allocated at each phase's start and
// end, and the peak within it, relative to the baseline taken after setup
// — with testdata/torchref/<case>.json. The golden figures are PyTorch
// 1.13 on the CPU with CUDA's 512-byte rounding and with the host-only
// events (wrapped scalars, optimizer step counters) already left out;
// where the CPU or 1.13 still differs from CUDA under PyTorch 2.x, a case's
// correct function changes the golden figure by the difference, computed
// from its cause and stated in a comment (bench/torchref/README.md lists
// them).

// goldenCase is one comparison.
type goldenCase struct {
	name   string // testdata/torchref/<name>.json
	setup  string // Starlark run before the baseline
	phases []goldenPhase
	// correct adjusts the golden figures of one phase (nil: none).
	correct func(phase string, step int, f *figures)
	// scripts: setup may load() from scripts/models ("gpt2.star") and
	// scripts ("models/hf.star").
	scripts bool
	// ref names the golden file when it is not name (a memsh op compared
	// with the figures of the PyTorch op it models).
	ref string
}

type goldenPhase struct {
	phase string
	step  int
	code  string
}

type figures struct{ Start, End, Peak int64 }

var (
	goldenMu    sync.Mutex
	goldenCases []goldenCase
)

// addGolden registers cases (each test file's init adds its own).
func addGolden(cs ...goldenCase) {
	goldenMu.Lock()
	defer goldenMu.Unlock()
	goldenCases = append(goldenCases, cs...)
}

type goldenFile struct {
	Case   string `json:"case"`
	Phases []struct {
		Phase string `json:"phase"`
		Step  int    `json:"step"`
		Start int64  `json:"start"`
		End   int64  `json:"end"`
		Peak  int64  `json:"peak"`
	} `json:"phases"`
}

func TestGolden(t *testing.T) {
	for _, c := range goldenCases {
		t.Run(c.name, func(t *testing.T) { runGolden(t, c) })
	}
}

func runGolden(t *testing.T, c goldenCase) {
	ref := c.name
	if c.ref != "" {
		ref = c.ref
	}
	data, err := os.ReadFile(filepath.Join("..", "..", "testdata", "torchref", ref+".json"))
	if err != nil {
		t.Fatal(err)
	}
	var g goldenFile
	if err := json.Unmarshal(data, &g); err != nil {
		t.Fatal(err)
	}
	want := map[string]figures{}
	for _, p := range g.Phases {
		want[fmt.Sprintf("%s/%d", p.Phase, p.Step)] = figures{p.Start, p.End, p.Peak}
	}
	var out bytes.Buffer
	opts := scope.Options{Device: "sim:8GiB", Out: &out, Err: &out, Quiet: true}
	if c.scripts {
		dir, err := filepath.Abs(filepath.Join("..", "..", "scripts", "models"))
		if err != nil {
			t.Fatal(err)
		}
		// scripts/models, and scripts: load("models/hf.star") and the
		// library's own load("models/decoder.star") resolve in the
		// working tree
		opts.LoadPath = []string{dir, filepath.Dir(dir)}
	}
	s, err := scope.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Exec("setup.star", c.setup); err != nil {
		t.Fatalf("setup: %v\n%s", err, out.String())
	}
	mgr := s.Manager()
	gpu := mgr.GPU(0)
	measure := func() int64 {
		mgr.Reclaim()
		return int64(gpu.Allocated())
	}
	base := measure()
	for _, p := range c.phases {
		key := fmt.Sprintf("%s/%d", p.phase, p.step)
		w, ok := want[key]
		if !ok {
			t.Fatalf("%s: no golden phase %s", c.name, key)
		}
		if c.correct != nil {
			c.correct(p.phase, p.step, &w)
		}
		start := measure()
		mgr.ResetPeakStats(gpu)
		if err := s.Exec(p.phase+".star", p.code); err != nil {
			t.Fatalf("%s: %v\n%s", key, err, out.String())
		}
		peak := int64(peakOf(gpu))
		end := measure()
		got := figures{start - base, end - base, peak - base}
		if got != w {
			t.Errorf("%s %s: got start %d end %d peak %d, want (PyTorch) start %d end %d peak %d",
				c.name, key, got.Start, got.End, got.Peak, w.Start, w.End, w.Peak)
		}
	}
}

// peakOf reads the allocator's max_memory_allocated.
func peakOf(a backend.Allocator) uint64 {
	if st, ok := a.(interface{ Stats() map[string]int64 }); ok {
		return uint64(st.Stats()["allocated_bytes.all.peak"])
	}
	return 0
}
