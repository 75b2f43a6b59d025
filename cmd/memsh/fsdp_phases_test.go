package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

// scripts/fsdp_phases.star (the twin of bench/gpu/fsdp_rank.py) prints
// one JSON line per point for FSDP2 and DDP on 4 ranks; rank 0 of FSDP2
// holds about a quarter of the parameters DDP's rank holds (its setup:
// parameters only; DDP's: parameters and the reducer's bucket), and
// each strategy's second step ends where its first did.
func TestFSDPPhasesScript(t *testing.T) {
	setup := map[string]int64{}
	for _, strategy := range []string{"fsdp", "ddp"} {
		var stdout, stderr bytes.Buffer
		if rc := run([]string{"--device", "sim:H100,meta", "../../scripts/fsdp_phases.star", "gpt2-small", "--world", "4", "--batch", "1", "--strategy", strategy}, nil, &stdout, &stderr); rc != 0 {
			t.Fatalf("%s: rc %d\n%s", strategy, rc, stderr.String())
		}
		type point struct {
			Point     string
			Step      int
			Allocated int64
			Strategy  string
		}
		var pts []point
		for _, l := range strings.Split(strings.TrimSpace(stdout.String()), "\n") {
			var p point
			if err := json.Unmarshal([]byte(l), &p); err != nil {
				t.Fatalf("%s: %v in %q", strategy, err, l)
			}
			pts = append(pts, p)
		}
		if len(pts) != 9 || pts[0].Point != "setup" || pts[8].Point != "zero_grad" || pts[8].Strategy != strategy {
			t.Fatalf("%s: points %+v", strategy, pts)
		}
		if pts[4].Allocated != pts[8].Allocated {
			t.Errorf("%s: zero_grad ends at %d after step 1, %d after step 2", strategy, pts[4].Allocated, pts[8].Allocated)
		}
		setup[strategy] = pts[0].Allocated
	}
	// gpt2-small's 124,439,808 float32 parameters: DDP holds them and a
	// bucket as big; FSDP2's rank a quarter (padded shards)
	const params = 124439808 * 4
	if d := setup["ddp"]; d < 2*params {
		t.Errorf("DDP setup %d, want at least parameters and bucket %d", d, 2*params)
	}
	if f := setup["fsdp"]; f < params/4 || f > params/4+params/64 {
		t.Errorf("FSDP2 setup %d, want about a quarter of %d", f, params)
	}
}
