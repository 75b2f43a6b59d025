package fit_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/memsh/memsh/fit"
)

// smallLlama is a Llama config small enough for quick searches on a
// 1 GiB card (about 33.6 M parameters, sequences of 128).
const smallLlama = `{"model_type": "llama", "hidden_size": 512, "intermediate_size": 1536, "num_hidden_layers": 8,
 "num_attention_heads": 8, "num_key_value_heads": 4, "vocab_size": 8192, "max_position_embeddings": 256,
 "tie_word_embeddings": false, "torch_dtype": "float32"}`

// wideLlama is a Llama whose weights (110 M parameters) weigh more than
// its activations at sequence 128 on a 3 GiB card, as a 7B model's do on
// a 24 GiB one.
const wideLlama = `{"model_type": "llama", "hidden_size": 1024, "intermediate_size": 2816, "num_hidden_layers": 8,
 "num_attention_heads": 16, "num_key_value_heads": 8, "vocab_size": 8192, "max_position_embeddings": 256,
 "tie_word_embeddings": false, "torch_dtype": "float32"}`

func finetuneReport(t *testing.T, cfg string, set map[string]any) fit.Report {
	t.Helper()
	set["json"] = true
	rc, out, errs := runMain(t, options(cfg, set))
	if rc != 0 {
		t.Fatalf("%v: exit %d: %s", set, rc, errs)
	}
	var r fit.Report
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatal(err)
	}
	return r
}

func peakAt(r fit.Report, v int) int64 {
	for _, tr := range r.Trials {
		if tr.Value == v {
			return tr.PeakAllocated
		}
	}
	return -1
}

// TestFinetuneOrdering: on a Llama whose weights weigh (110 M
// parameters on a 3 GiB card at sequence 128), full fine-tuning, LoRA and
// QLoRA keep what each keeps. At batch 1 (the weights and the model state
// dominate) the peaks fall full > LoRA > QLoRA; LoRA, which keeps no
// gradients or AdamW moments for the frozen weights, fits at least the
// batch full fine-tuning does. QLoRA here is without checkpointing
// (--checkpoint=false); at larger batches it may fit less than LoRA: its
// 4-bit layers return float32 (their input's dtype, the float32 residual
// stream that prepare_model_for_kbit_training leaves), so its MLP's saved
// activations are float32 where LoRA's under bf16 autocast are bfloat16 —
// as bitsandbytes and PEFT do it (with checkpointing for both, Llama 3.2
// 1B on an H100 fits LoRA batch 20, QLoRA 19). The report's trainable count is the
// adapters', r × (in + out) for q_proj (1024 → 1024) and v_proj (1024 →
// 512) per layer.
func TestFinetuneOrdering(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cfg := filepath.Join(dir, "config.json")
	if err := os.WriteFile(cfg, []byte(wideLlama), 0o644); err != nil {
		t.Fatal(err)
	}
	run := func(ft string, ckpt bool) fit.Report {
		// checkpoint given either way: qlora's default is on (the
		// QLoRA recipe)
		set := map[string]any{"gpu": "3GiB", "seq": 128, "finetune": ft, "checkpoint": ckpt}
		r := finetuneReport(t, cfg, set)
		if r.LargestBatch == nil || r.Finetune != ft {
			t.Fatalf("checkpoint %v %s: %+v", ckpt, ft, r)
		}
		return r
	}
	full, lora, qlora := run("full", false), run("lora", false), run("qlora", false)
	p1 := [3]int64{peakAt(full, 1), peakAt(lora, 1), peakAt(qlora, 1)}
	if !(p1[0] > p1[1] && p1[1] > p1[2] && p1[2] > 0) {
		t.Errorf("peaks at batch 1 full %d, LoRA %d, QLoRA %d: want decreasing", p1[0], p1[1], p1[2])
	}
	if *lora.LargestBatch < *full.LargestBatch {
		t.Errorf("largest batch LoRA %d < full %d", *lora.LargestBatch, *full.LargestBatch)
	}
	want := int64(8 * 8 * ((1024 + 1024) + (1024 + 512)))
	if lora.TrainableParameters != want || qlora.TrainableParameters != want || full.TrainableParameters != full.Parameters {
		t.Errorf("trainable: full %d of %d, LoRA %d, QLoRA %d; want %d", full.TrainableParameters, full.Parameters, lora.TrainableParameters, qlora.TrainableParameters, want)
	}
	if lora.Parameters != full.Parameters || qlora.Parameters != full.Parameters {
		t.Errorf("parameters: full %d, LoRA %d, QLoRA %d: the base model's, equal", full.Parameters, lora.Parameters, qlora.Parameters)
	}
	if l := lora.LoRA; l == nil || l.R != 8 || l.Alpha != 8 || strings.Join(l.Targets, ",") != "q_proj,v_proj" || l.Modules != 16 || l.Parameters != want || l.Quantization != "" {
		t.Errorf("lora: %+v", lora.LoRA)
	}
	if l := qlora.LoRA; l == nil || l.Quantization != "nf4" || l.ComputeDType != "bfloat16" || l.QuantBytes <= 0 {
		t.Errorf("qlora: %+v", qlora.LoRA)
	}
	// float32 adapters (each tensor's bytes a multiple of 512 here): the
	// gradients 4 bytes a trainable parameter, AdamW's two moments 8
	for _, r := range []fit.Report{lora, qlora} {
		if l := r.LoRA; l.GradientBytes != 4*want || l.OptimizerStateBytes != 8*want {
			t.Errorf("%s: gradient bytes %d, optimizer state %d; want %d, %d", r.Finetune, l.GradientBytes, l.OptimizerStateBytes, 4*want, 8*want)
		}
	}
	// the breakdown: no gradients nor moments of the frozen weights
	if lora.Breakdown.OptimizerState >= full.Breakdown.OptimizerState/100 || qlora.Breakdown.Parameters >= lora.Breakdown.Parameters/2 {
		t.Errorf("breakdowns: full %+v, LoRA %+v, QLoRA %+v", full.Breakdown, lora.Breakdown, qlora.Breakdown)
	}
	// the text report names the adapters; QLoRA checkpoints unless told
	// not to (prepare_model_for_kbit_training's default)
	rc, out, errs := runMain(t, options(cfg, map[string]any{"gpu": "3GiB", "seq": 128, "batch": 4, "finetune": "qlora", "lora-r": 16, "lora-targets": "all-linear"}))
	if rc != 0 || !strings.Contains(out, "fine-tuning: QLoRA: LoRA r=16, alpha 8.0, dropout 0.0 on all-linear (56 modules)") || !strings.Contains(out, "4-bit NF4") ||
		!strings.Contains(out, "training: bf16 autocast (float32 adapters, gradients and optimizer state), adamw_torch: AdamW (torch.optim.AdamW, foreach), activation checkpointing") {
		t.Errorf("exit %d: %s\n%s", rc, errs, out)
	}
}

// When full fine-tuning fits no batch, LoRA and QLoRA are tried like the
// other changes (each found by trials).
func TestAdviceFinetune(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cfg := filepath.Join(dir, "config.json")
	if err := os.WriteFile(cfg, []byte(smallLlama), 0o644); err != nil {
		t.Fatal(err)
	}
	r := finetuneReport(t, cfg, map[string]any{"gpu": "512MiB", "seq": 64})
	if r.LargestBatch != nil {
		t.Fatalf("full fine-tuning fits batch %d on 512 MiB", *r.LargestBatch)
	}
	got := map[string]fit.Alternative{}
	for _, a := range r.Advice {
		got[a.Change] = a
	}
	for _, c := range []string{"LoRA r=8 on q_proj, v_proj", "QLoRA r=8 on q_proj, v_proj with checkpointing"} {
		if a := got[c]; !a.Modelled || !a.Fits || a.Largest < 1 {
			t.Errorf("%s: %+v (advice %+v)", c, a, r.Advice)
		}
	}
	if r.Floor == nil || r.Floor.Gradients != r.Floor.Parameters {
		t.Errorf("full fine-tuning's floor %+v", r.Floor)
	}
	// a LoRA run that does not fit is offered QLoRA only
	// (its weights, 33.6 M float32 parameters, take more than 128 MiB)
	lr := finetuneReport(t, cfg, map[string]any{"gpu": "128MiB", "seq": 64, "finetune": "lora"})
	if lr.LargestBatch != nil {
		t.Fatalf("LoRA fits on 128 MiB (batch %d)", *lr.LargestBatch)
	}
	qlora := false
	for _, a := range lr.Advice {
		if strings.HasPrefix(a.Change, "LoRA") {
			t.Errorf("LoRA offered to a LoRA run: %+v", a)
		}
		if strings.HasPrefix(a.Change, "QLoRA") {
			qlora = a.Modelled && a.Fits
		}
	}
	if !qlora {
		t.Errorf("QLoRA should fit on 128 MiB: %+v", lr.Advice)
	}
	if lr.Floor == nil || lr.Floor.Gradients >= lr.Floor.Parameters/100 {
		t.Errorf("LoRA's floor %+v: gradients of the adapters only", lr.Floor)
	}
}

// TestFinetuneClosedForms: LoRA's trainable parameters are, over the
// wrapped layers, r × (in + out) (A is r × in, B out × r); with float32
// adapters their gradients take 4 bytes a parameter and AdamW's state 8
// (exp_avg, exp_avg_sq) — the measured breakdown's optimizer state at a
// peak in the second step is exactly that, nothing for the frozen
// weights. On the small Llama (hidden 512, 8 layers, 4 of 8 KV heads:
// q_proj 512 → 512, k_proj and v_proj 512 → 256, o_proj 512 → 512,
// gate/up 512 → 1536, down 1536 → 512).
func TestFinetuneClosedForms(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cfg := filepath.Join(dir, "config.json")
	if err := os.WriteFile(cfg, []byte(smallLlama), 0o644); err != nil {
		t.Fatal(err)
	}
	in := map[string][2]int64{"q_proj": {512, 512}, "k_proj": {512, 256}, "v_proj": {512, 256}, "o_proj": {512, 512},
		"gate_proj": {512, 1536}, "up_proj": {512, 1536}, "down_proj": {1536, 512}}
	for _, tc := range []struct {
		ft, targets string
		r           int
	}{
		{"lora", "", 8}, // PEFT's default for llama: q_proj, v_proj
		{"lora", "q_proj,k_proj,v_proj,o_proj", 16},
		{"qlora", "all-linear", 4},
	} {
		set := map[string]any{"gpu": "2GiB", "seq": 64, "batch": 2, "finetune": tc.ft, "lora-r": tc.r}
		names := []string{"q_proj", "v_proj"}
		if tc.targets != "" {
			set["lora-targets"] = tc.targets
			names = strings.Split(tc.targets, ",")
		}
		if tc.targets == "all-linear" {
			names = []string{"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
		}
		var want int64
		for _, n := range names {
			want += 8 * int64(tc.r) * (in[n][0] + in[n][1]) // 8 layers
		}
		r := finetuneReport(t, cfg, set)
		l := r.LoRA
		if r.TrainableParameters != want || l.Parameters != want || l.Modules != 8*len(names) {
			t.Errorf("%+v: trainable %d (adapters %d in %d modules), want %d in %d", tc, r.TrainableParameters, l.Parameters, l.Modules, want, 8*len(names))
		}
		if l.GradientBytes != 4*want || l.OptimizerStateBytes != 8*want {
			t.Errorf("%+v: gradient bytes %d, optimizer state %d; want %d, %d", tc, l.GradientBytes, l.OptimizerStateBytes, 4*want, 8*want)
		}
		if r.Breakdown == nil || r.Breakdown.OptimizerState != 8*want {
			t.Errorf("%+v: the breakdown's optimizer state at the peak (%s) %+v; want %d", tc, r.PeakPhase, r.Breakdown, 8*want)
		}
	}
}

// TestFinetuneLibraryOrdering: Llama 3.2 1B on an H100 at sequence 2048,
// as a user runs it (--finetune alone, --json): at the same batch the
// peaks fall full > LoRA > QLoRA (the QLoRA recipe, with checkpointing),
// and the largest batch grows the other way. (With --checkpoint for all
// three the peaks fall the same way, but QLoRA fits batch 19 where LoRA
// fits 20: its 4-bit layers return float32, the input's dtype.)
func TestFinetuneLibraryOrdering(t *testing.T) {
	if testing.Short() {
		t.Skip("three searches of a 1B model")
	}
	t.Parallel()
	var rs []fit.Report
	for _, ft := range []string{"full", "lora", "qlora"} {
		rs = append(rs, finetuneReport(t, "llama-3.2-1b", map[string]any{"finetune": ft}))
	}
	full, lora, qlora := rs[0], rs[1], rs[2]
	if !qlora.Checkpoint || lora.Checkpoint || full.Checkpoint {
		t.Errorf("checkpointing: full %v, LoRA %v, QLoRA %v; want QLoRA's only", full.Checkpoint, lora.Checkpoint, qlora.Checkpoint)
	}
	for _, b := range []int{1, 4, 8} { // tried by every search (1, 2, 4, 8, ...)
		p := [3]int64{peakAt(full, b), peakAt(lora, b), peakAt(qlora, b)}
		if !(p[0] > p[1] && p[1] > p[2] && p[2] > 0) {
			t.Errorf("batch %d: peaks full %d, LoRA %d, QLoRA %d; want decreasing", b, p[0], p[1], p[2])
		}
	}
	if !(*full.LargestBatch < *lora.LargestBatch && *lora.LargestBatch < *qlora.LargestBatch) {
		t.Errorf("largest batch full %d, LoRA %d, QLoRA %d", *full.LargestBatch, *lora.LargestBatch, *qlora.LargestBatch)
	}
	// q_proj 2048 → 2048, v_proj 2048 → 512, 16 layers, r 8
	if want := int64(16 * 8 * ((2048 + 2048) + (2048 + 512))); lora.TrainableParameters != want || qlora.TrainableParameters != want || full.TrainableParameters != full.Parameters {
		t.Errorf("trainable: full %d, LoRA %d, QLoRA %d; want %d for the adapters", full.TrainableParameters, lora.TrainableParameters, qlora.TrainableParameters, want)
	}
}
