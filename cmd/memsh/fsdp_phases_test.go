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
		pts := phases(t, strategy, "gpt2-small", "--world", "4", "--batch", "1", "--strategy", strategy)
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

// The script's tensor-parallel runs (Llama 3.2 1B): rank 0 of TP 2 holds
// its chunks in float32 — each layer's q/k/v and gate/up rows, o and
// down columns halved, the norms whole, the embedding's and the untied
// lm_head's 64,128 rows — with the rotary buffer and the two [1, 256]
// id tensors; 2-D (TP 2 × FSDP2 4) a quarter of the chunks (every dim 0
// splits evenly) with the same buffer and ids. The embedding's and
// lm_head's chunks (501 MiB; 125.25 MiB in 2-D) each take a fresh
// segment rounded up to 2 MiB whose remainder of 1 MiB or less the
// caching allocator does not split off (should_split), so they count
// the whole segment, as memory_allocated() does; the other chunks are
// whole multiples of 2 MiB, or under 10 MiB (carved from 20 MiB
// segments without a remainder kept).
func TestTPPhasesScript(t *testing.T) {
	const (
		layers, h, q, kv, ffn, vocab, T = 16, 2048, 2048, 512, 8192, 128256, 2
		ids                             = 2 * 2048 // two [1, 256] int64, 2 KiB each
	)
	layer := (q/T)*h*2 + (kv/T)*h*2 + 3*(ffn/T)*h
	norms := int64((2*layers + 1) * h)
	block := func(n int64) int64 {
		seg := (n + 2<<20 - 1) / (2 << 20) * (2 << 20)
		if seg-n <= 1<<20 {
			return seg
		}
		return n
	}
	rest := int64(layers*layer)*4 + norms*4
	emb := int64(vocab/T*h) * 4
	for _, tc := range []struct {
		args  []string
		setup int64
	}{
		{[]string{"--world", "2", "--strategy", "tp"}, rest + 2*block(emb) + 512 + ids},
		{[]string{"--world", "8", "--strategy", "tp-fsdp", "--tp", "2"}, rest/4 + 2*block(emb/4) + 512 + ids},
	} {
		pts := phases(t, tc.args[3], append([]string{"llama-3.2-1b", "--batch", "1", "--seq", "256"}, tc.args...)...)
		if pts[0].Allocated != tc.setup {
			t.Errorf("%v: setup %d, want %d", tc.args, pts[0].Allocated, tc.setup)
		}
	}
}

type rankPoint struct {
	Point     string
	Step      int
	Allocated int64
	Strategy  string
}

// phases runs scripts/fsdp_phases.star with args on the H100's meta
// simulator and checks its nine points: setup, then forward, backward,
// step and zero_grad twice, the second zero_grad where the first ended.
func phases(t *testing.T, strategy string, args ...string) []rankPoint {
	t.Helper()
	{
		var stdout, stderr bytes.Buffer
		if rc := run(append([]string{"--device", "sim:H100,meta", "../../scripts/fsdp_phases.star"}, args...), nil, &stdout, &stderr); rc != 0 {
			t.Fatalf("%s: rc %d\n%s", strategy, rc, stderr.String())
		}
		var pts []rankPoint
		for _, l := range strings.Split(strings.TrimSpace(stdout.String()), "\n") {
			var p rankPoint
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
		return pts
	}
}
