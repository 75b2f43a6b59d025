package sweep_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.starlark.net/starlark"
	"go.starlark.net/starlarkstruct"

	"github.com/memsh/memsh/scope"
	"github.com/memsh/memsh/scripts"
	"github.com/memsh/memsh/starlib/sweep"
)

// trialFigures is what a replayed trial must equal its full trial in.
type trialFigures struct {
	params, status, err  string
	peak, used, avail    int64
	reserved             string
	replayed             bool
	consumed, peaked, re int64
}

// runSearch runs setup then search (which binds R to a sweep.max_fit
// result) in a fresh Session on device, with replay bound to REPLAY, and
// returns the trials' figures and the Session's output.
func runSearch(t *testing.T, device, setup, search string, replay bool) ([]trialFigures, string) {
	t.Helper()
	var out bytes.Buffer
	s, err := scope.New(scope.Options{Device: device, Out: &out, Err: &out, Quiet: true, Library: scripts.Library})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	s.Set("REPLAY", starlark.Bool(replay))
	if err := s.Exec("setup.star", setup); err != nil {
		t.Fatalf("setup: %v\n%s", err, out.String())
	}
	if err := s.Exec("search.star", search); err != nil {
		t.Fatalf("search: %v\n%s", err, out.String())
	}
	r := s.Get("R").(*starlarkstruct.Struct)
	tv, _ := r.Attr("trials")
	got := trialsOf(t, tv)
	return got, out.String()
}

// compareReplay runs a search without and with replay and requires every
// trial of the two to be the same size with the same status, error and
// figures (peak allocated and reserved included, to the byte). It
// returns how many trials were replayed.
func compareReplay(t *testing.T, device, setup, search string) int {
	t.Helper()
	restore := sweep.ShowReplayFields()
	defer restore()
	full, fullOut := runSearch(t, device, setup, search, false)
	rep, repOut := runSearch(t, device, setup, search, true)
	n := 0
	for i := 0; i < max(len(full), len(rep)); i++ {
		if i >= len(full) || i >= len(rep) {
			t.Fatalf("%d trials in full, %d with replay\nfull:\n%s\nreplay:\n%s", len(full), len(rep), fullOut, repOut)
		}
		a, b := full[i], rep[i]
		if b.replayed {
			n++
		}
		if a.replayed {
			t.Errorf("trial %d (%s) replayed without replay", i, a.params)
		}
		b.replayed = false
		if a != b {
			t.Errorf("trial %d:\nfull   %+v\nreplay %+v", i, a, b)
		}
	}
	if t.Failed() {
		t.Logf("full:\n%s\nreplay:\n%s", fullOut, repOut)
	}
	for _, line := range strings.Split(repOut, "\n") {
		if strings.HasPrefix(line, "replay=True") {
			t.Log(line)
		}
	}
	return n
}

// trainSetup defines train(batch, seq, checkpoint): model (a Starlark
// expression over checkpoint, after load) trained two steps as memsh fit
// trains, bf16 autocast and AdamW, on random tokens of vocab; upcast is
// ".float()" where the model's logits are cast before the loss.
func trainSetup(load, model string, vocab int, upcast string) string {
	return fmt.Sprintf(`
%s
def loss_of(model, x, y):
    out = model(x)%s
    return nn.functional.cross_entropy(out.view(-1, out.shape[-1]), y.view(-1))
def train(batch, seq, checkpoint):
    model = %s
    opt = optim.AdamW(model.parameters(), lr = 1e-4)
    x = tensor.randint(0, %d, [batch, seq], device = "cuda")
    y = tensor.randint(0, %d, [batch, seq], device = "cuda")
    for _ in range(2):
        loss = nn.autocast(loss_of, model, x, y, dtype = "bfloat16")
        loss.backward()
        loss = None
        opt.step()
        opt.zero_grad(set_to_none = True)
    return batch
`, load, upcast, model, vocab, vocab)
}

var (
	gpt2Setup  = trainSetup(`load("models/gpt2.star", "gpt2", "GPT2_SMALL")`, `gpt2(device = "cuda", checkpoint = checkpoint, **GPT2_SMALL)`, 50257, "")
	llamaSetup = trainSetup(`load("models/llama.star", "llama", "LLAMA_3_2_1B")`, `llama(device = "cuda", checkpoint = checkpoint, **LLAMA_3_2_1B)`, 128256, ".float()")
)

// TestReplayEqualsFullTrials runs batch and sequence searches of the
// library's GPT-2 and Llama, with activation checkpointing and without,
// both ways: every trial replayed must equal the full trial to the byte.
func TestReplayEqualsFullTrials(t *testing.T) {
	type search struct {
		name, device, setup, call string
		short                     bool // also under -short
	}
	searches := []search{
		{"gpt2 batch", "sim:H100,meta", gpt2Setup, `lambda batch: train(batch, 1024, False)`, true},
		{"gpt2 batch checkpoint", "sim:H100,meta", gpt2Setup, `lambda batch: train(batch, 1024, True)`, true},
		{"gpt2 seq", "sim:T4,meta", gpt2Setup, `lambda seq: train(24, seq, False), high = 1024`, false},
		{"gpt2 seq checkpoint", "sim:T4,meta", gpt2Setup, `lambda seq: train(64, seq, True), high = 1024`, false},
		{"llama batch", "sim:H100,meta", llamaSetup, `lambda batch: train(batch, 512, False)`, false},
		{"llama batch checkpoint", "sim:H100,meta", llamaSetup, `lambda batch: train(batch, 2048, True)`, false},
		{"llama seq", "sim:H100,meta", llamaSetup, `lambda seq: train(1, seq, False), high = 131072`, false},
	}
	total := 0
	for _, sr := range searches {
		t.Run(strings.ReplaceAll(sr.name, " ", "_"), func(t *testing.T) {
			if testing.Short() && !sr.short {
				t.Skip("long search")
			}
			call := fmt.Sprintf("R = sweep.max_fit(%s, mode = \"binsearch\", search = \"layout\", fresh = True, max_trials = 60, replay = REPLAY)\n", sr.call)
			n := compareReplay(t, sr.device, sr.setup, call)
			t.Logf("%d trials replayed", n)
			total += n
		})
	}
	if total == 0 {
		t.Error("no trial was replayed: the test compares nothing")
	}
}

// randomConfig returns a small random config.json of one of
// scripts/models/hf.star's families and builders.
func randomConfig(r *rand.Rand) map[string]any {
	pick := func(xs ...int) int { return xs[r.Intn(len(xs))] }
	types := []string{"llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3_text", "phi3", "gpt2"}
	mt := types[r.Intn(len(types))]
	heads := pick(2, 4, 8)
	hd := pick(16, 32, 64)
	layers := pick(1, 2, 3)
	vocab := pick(512, 1000, 4096, 8192)
	if mt == "gpt2" {
		return map[string]any{"model_type": "gpt2", "n_embd": heads * hd, "n_head": heads, "n_layer": layers,
			"n_positions": 1024, "vocab_size": vocab}
	}
	kv := heads
	for kv > 1 && r.Intn(2) == 0 {
		kv /= 2
	}
	c := map[string]any{"model_type": mt, "hidden_size": heads * hd, "num_attention_heads": heads, "num_key_value_heads": kv,
		"head_dim": hd, "num_hidden_layers": layers, "intermediate_size": pick(2, 3, 4) * heads * hd, "vocab_size": vocab,
		"max_position_embeddings": 4096, "tie_word_embeddings": r.Intn(2) == 0, "rms_norm_eps": 1e-6}
	switch mt {
	case "mistral", "phi3", "gemma2", "gemma3_text":
		if w := pick(0, 64, 256); w > 0 || mt == "gemma2" || mt == "gemma3_text" {
			c["sliding_window"] = max(w, 128)
		}
	case "qwen2", "qwen3":
		if r.Intn(2) == 0 {
			c["use_sliding_window"], c["sliding_window"], c["max_window_layers"] = true, 128, 1
		}
	}
	if mt == "gemma3_text" {
		c["sliding_window_pattern"] = 2
	}
	return c
}

// TestReplayRandomModels is TestReplayEqualsFullTrials over random small
// models of the library's builders: a batch or a sequence search, with
// activation checkpointing or without, in bf16 autocast or float32, on a
// simulated T4 or H100: seeds 1 to 4 (-tags long: 1 to 40).
// MEMSH_REPLAY_SEEDS=N runs N random seeds more.
func TestReplayRandomModels(t *testing.T) {
	if testing.Short() {
		t.Skip("long searches")
	}
	checkRandomModels(t, 1, 4)
}

// checkRandomModels is TestReplayRandomModels over seeds from to to.
func checkRandomModels(t *testing.T, from, to int64) {
	var seeds []int64
	for s := from; s <= to; s++ {
		seeds = append(seeds, s)
	}
	if n, _ := strconv.Atoi(os.Getenv("MEMSH_REPLAY_SEEDS")); n > 0 {
		for i := 0; i < n; i++ {
			seeds = append(seeds, time.Now().UnixNano()+int64(i))
		}
	}
	total := 0
	for _, seed := range seeds {
		r := rand.New(rand.NewSource(seed))
		cfg := randomConfig(r)
		js, err := json.Marshal(cfg)
		if err != nil {
			t.Fatal(err)
		}
		device := []string{"sim:T4,meta", "sim:H100,meta"}[r.Intn(2)]
		checkpoint := []string{"False", "True"}[r.Intn(2)]
		amp := []string{"None", `"bfloat16"`}[r.Intn(2)]
		maxSeq := 1024
		if cfg["model_type"] != "gpt2" {
			maxSeq = 4096
		}
		call := fmt.Sprintf("lambda batch: train(batch, %d)", []int{64, 128, 256, 512}[r.Intn(4)])
		if r.Intn(2) == 0 {
			call = fmt.Sprintf("lambda seq: train(%d, seq), high = %d", []int{1, 4, 16}[r.Intn(3)], maxSeq)
		}
		name := fmt.Sprintf("seed_%d_%s", seed, cfg["model_type"])
		t.Run(name, func(t *testing.T) {
			t.Logf("config %s, %s, checkpoint %s, autocast %s, %s", js, device, checkpoint, amp, call)
			setup := fmt.Sprintf(`
load("models/hf.star", "from_config", hf_inputs = "inputs")
CFG = json.decode(%q)
def step(model, args):
    return model(*args)
def train(batch, seq):
    model = from_config(CFG, attention = "sdpa", checkpoint = %s, device = "cuda")
    opt = optim.AdamW(model.parameters(), lr = 1e-4)
    args = hf_inputs(CFG, batch, seq, "cuda")
    for _ in range(2):
        if %s != None:
            loss = nn.autocast(step, model, args, dtype = %s)
        else:
            loss = step(model, args)
        loss.backward()
        loss = None
        opt.step()
        opt.zero_grad(set_to_none = True)
    return batch
`, js, checkpoint, amp, amp)
			search := fmt.Sprintf("R = sweep.max_fit(%s, mode = \"binsearch\", search = \"layout\", fresh = True, max_trials = 60, replay = REPLAY)\n", call)
			n := compareReplay(t, device, setup, search)
			t.Logf("%d trials replayed", n)
			total += n
		})
	}
	if total == 0 {
		t.Error("no trial was replayed: the test compares nothing")
	}
}

// figuresOf returns a trial's figures (with the replay fields shown:
// sweep.ShowReplayFields).
func figuresOf(t *testing.T, tr *starlarkstruct.Struct) trialFigures {
	t.Helper()
	attr := func(v starlark.Value, name string) starlark.Value {
		a, err := v.(starlark.HasAttrs).Attr(name)
		if err != nil {
			t.Fatalf("trial %v has no %s", v, name)
		}
		return a
	}
	i64 := func(v starlark.Value) int64 {
		n, _ := starlark.AsInt32(v)
		if i, ok := v.(starlark.Int); ok {
			n64, _ := i.Int64()
			return n64
		}
		return int64(n)
	}
	gpu := attr(attr(tr, "data"), "gpu")
	f := trialFigures{
		params:   attr(tr, "params").String(),
		status:   string(attr(tr, "status").(starlark.String)),
		peak:     i64(attr(gpu, "peak")),
		used:     i64(attr(gpu, "used")),
		avail:    i64(attr(gpu, "available")),
		consumed: i64(attr(gpu, "consumed")),
		peaked:   i64(attr(gpu, "peaked")),
		re:       i64(attr(gpu, "reclaimed")),
		reserved: attr(tr, "reserved").String(),
		replayed: bool(attr(tr, "replayed").(starlark.Bool)),
	}
	if e, ok := attr(tr, "error").(starlark.String); ok {
		f.err = string(e)
	}
	return f
}

// A model of the step fitted on the search's trials but never verified —
// no trial left was worth a verifying trial: the next ran out of memory
// in its unverified replay, which a full trial answers as cheaply, and
// then the boundary was near — is said so in the footer, not hidden
// behind why an earlier fit failed.
func TestReplayFooterUnverifiedModel(t *testing.T) {
	const setup = `
def step(n):
    x = tensor.empty([n, 25 << 20], device = "cuda")  # n × 100 MiB
    y = x + 1
    return n
`
	_, out := runSearch(t, "sim:1GiB,meta", setup, `R = sweep.max_fit(step, mode = "binsearch", fresh = True, replay = REPLAY)`, true)
	want := "replay=True: every trial ran in full (a model of the step was fitted on the trials at 1, 2, 4, 5, but no trial left was worth verifying it for"
	if !strings.Contains(out, want) {
		t.Errorf("footer: want %q in\n%s", want, out)
	}
}
