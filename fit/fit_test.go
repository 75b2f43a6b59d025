package fit_test

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"sort"
	"strings"
	"sync"
	"testing"

	"go.starlark.net/starlark"

	"github.com/memsh/memsh/fit"
	"github.com/memsh/memsh/scope"
	"github.com/memsh/memsh/scripts"
	"github.com/memsh/memsh/tensor/optim"
)

// options are memsh fit's defaults with the flags of set given.
func options(src string, set map[string]any) fit.Options {
	o := fit.Options{Source: src, GPU: "H100", Precision: "bf16", Optimizer: "adamw_torch", Attention: "sdpa", Set: map[string]bool{}}
	for k, v := range set {
		o.Set[k] = true
		switch k {
		case "gpu":
			o.GPU = v.(string)
		case "seq":
			o.Seq = v.(int)
		case "batch":
			o.Batch = v.(int)
		case "precision":
			o.Precision = v.(string)
		case "optimizer":
			o.Optimizer = v.(string)
		case "search-mode":
			o.SearchMode = v.(string)
		case "attention":
			o.Attention = v.(string)
		case "checkpoint":
			o.Checkpoint = v.(bool)
		case "json":
			o.JSON = v.(bool)
		case "inference":
			o.Inference = v.(bool)
		case "max-new-tokens":
			o.MaxNewTokens = v.(int)
		case "kv-cache":
			o.KVCache = v.(string)
		case "routing":
			o.Routing = v.(string)
		case "grad-accum":
			o.GradAccum = v.(int)
		case "finetune":
			o.Finetune = v.(string)
		case "lora-r":
			o.LoRAR = v.(int)
		case "lora-alpha":
			o.LoRAAlpha = v.(float64)
		case "lora-dropout":
			o.LoRADropout = v.(float64)
		case "lora-targets":
			o.LoRATargets = v.(string)
		case "gpus":
			o.GPUs = v.(int)
		case "parallel":
			o.Parallel = v.(string)
		}
	}
	return o
}

func runMain(t *testing.T, o fit.Options) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	rc := fit.Main(o, scripts.Library, &out, &errb)
	return rc, out.String(), errb.String()
}

// eightB is `memsh fit llama-3.1-8b --json` (nothing fits: the floor and
// the advice), run once for the tests that read it.
var eightB struct {
	once      sync.Once
	rc        int
	out, errs string
}

func runEightB(t *testing.T) (int, string, string) {
	eightB.once.Do(func() {
		eightB.rc, eightB.out, eightB.errs = runMain(t, options("llama-3.1-8b", map[string]any{"json": true}))
	})
	return eightB.rc, eightB.out, eightB.errs
}

// Every usage error is one line on stderr and exit status 2, found before
// any trial runs; the message names what was wrong and never a flag the
// user did not give.
func TestUsageErrors(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "config.json")
	if err := os.WriteFile(bad, []byte(`{"model_type": "mamba", "hidden_size": 8}`), 0o644); err != nil {
		t.Fatal(err)
	}
	moe := filepath.Join(dir, "moe", "config.json")
	if err := os.MkdirAll(filepath.Dir(moe), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(moe, []byte(tinyMixtral), 0o644); err != nil {
		t.Fatal(err)
	}
	nostar := filepath.Join(dir, "m.star")
	if err := os.WriteFile(nostar, []byte("def build(device, checkpoint):\n    return None\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		src  string
		set  map[string]any
		want string
	}{
		{"gpt2-smal", nil, `unknown model "gpt2-smal" (did you mean "gpt2-small"?)`},
		{"llama", nil, `did you mean "llama-3.2-1b" or "llama-3.1-8b"?`},
		{"gpt2-small", map[string]any{"seq": 5000}, "--seq 5000: gpt2-small takes at most 1024 positions"},
		{"gpt2-small", map[string]any{"seq": 0}, "--seq: want a positive integer, got 0"},
		{"gpt2-small", map[string]any{"batch": 0}, "--batch: want a positive integer, got 0"},
		{"resnet18", map[string]any{"batch": 4}, "--batch: searching the longest sequence at a batch needs a sequence model; resnet18 is an image model"},
		{"resnet18", map[string]any{"seq": 4}, "--seq: resnet18 takes no sequence"},
		{"resnet18", map[string]any{"attention": "eager"}, "--attention: resnet18 has no attention"},
		{"gpt2-small", map[string]any{"gpu": "X100"}, `--gpu: unknown GPU "X100" (presets: H100 H200`},
		{"gpt2-small", map[string]any{"precision": "fp8"}, `--precision: want fp32, bf16, fp16 or bf16-true`},
		{"gpt2-small", map[string]any{"optimizer": "lion"}, `--optimizer: want adamw_torch, adamw_torch_fused, adamw_bnb_8bit, paged_adamw_8bit, adafactor, sgd or adam (Hugging Face Trainer's optim names; adamw is adamw_torch), got "lion"`},
		{"gpt2-small", map[string]any{"attention": "xformers"}, `--attention: want eager, sdpa or flash`},
		{"gpt2-small", map[string]any{"search-mode": "power"}, `--search-mode: want interpolate or binsearch (PyTorch Lightning's batch-size finder), got "power"`},
		{"llama-3.2-1b", map[string]any{"gpu": "T4", "attention": "flash"}, "--attention flash: FlashAttention-2 needs sm80 or newer; Tesla T4 is sm75"},
		{bad, nil, `model_type "mamba" is not one memsh builds (gemma2, gemma3, gemma3_text, gpt2, llama, mistral, mixtral, phi3, qwen2, qwen2_moe, qwen3, qwen3_moe); write the model as a .star file`},
		{filepath.Join(dir, "none.json"), nil, "none.json: no such file or directory"},
		{nostar, nil, "m.star: a model file defines build(device, checkpoint) and inputs(batch, seq, device); it has no inputs"},
		{filepath.Join(dir, "none.star"), nil, "none.star: no such file or directory"},
		{"gpt2-small", map[string]any{"inference": true}, "--inference: generation with a KV cache is modelled for the Llama-family configs"},
		{"llama-3.2-1b", map[string]any{"inference": true, "optimizer": "sgd"}, "--optimizer: a training option; --inference generates under no_grad"},
		{"llama-3.2-1b", map[string]any{"inference": true, "kv-cache": "paged"}, `--kv-cache: want dynamic or static (transformers' DynamicCache, StaticCache), got "paged"`},
		{"llama-3.2-1b", map[string]any{"routing": "worst"}, "--routing: llama-3.2-1b has no Mixture-of-Experts layers"},
		{moe, map[string]any{"routing": "best"}, `--routing: want balanced or worst (a Mixture-of-Experts model's tokens per expert: even, or all on the same experts), got "best"`},
		{"llama-3.2-1b", map[string]any{"inference": true, "max-new-tokens": 0}, "--max-new-tokens: want a positive integer, got 0"},
		{"gpt2-small", map[string]any{"grad-accum": 0}, "--grad-accum: want a positive integer, got 0"},
		{"llama-3.2-1b", map[string]any{"inference": true, "grad-accum": 2}, "--grad-accum: a training option; --inference generates under no_grad"},
		{"llama-3.2-1b", map[string]any{"inference": true, "seq": 131000, "max-new-tokens": 100}, "--seq 131000 + --max-new-tokens 100: llama-3.2-1b takes at most 131072 positions"},
		{"llama-3.2-1b", map[string]any{"finetune": "prefix"}, `--finetune: want full, lora or qlora`},
		{"llama-3.2-1b", map[string]any{"lora-r": 4}, "--lora-r: a LoRA option; give --finetune lora or qlora"},
		{"llama-3.2-1b", map[string]any{"finetune": "lora", "lora-r": 0}, "--lora-r: want a positive integer (the adapters' rank), got 0"},
		{"llama-3.2-1b", map[string]any{"finetune": "lora", "lora-alpha": -1.0}, "--lora-alpha: want a positive number"},
		{"llama-3.2-1b", map[string]any{"finetune": "lora", "lora-dropout": 1.0}, "--lora-dropout: want a probability in [0, 1), got 1"},
		{"llama-3.2-1b", map[string]any{"finetune": "lora", "lora-targets": "q_proj,,v_proj"}, `--lora-targets: an empty module name in "q_proj,,v_proj"`},
		{"llama-3.2-1b", map[string]any{"finetune": "lora", "lora-targets": "all-linear,q_proj"}, "--lora-targets: all-linear stands alone"},
		{"llama-3.2-1b", map[string]any{"finetune": "lora", "lora-targets": "q_proj,qkv"}, `--lora-targets: no module "qkv" in llama-3.2-1b (its 2-D weights' modules: embed_tokens, q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj)`},
		{"gpt2-small", map[string]any{"finetune": "lora", "lora-targets": "q_proj"}, `--lora-targets: no module "q_proj" in gpt2-small (its 2-D weights' modules: wte, wpe, c_attn, c_proj, c_fc)`},
		{"llama-3.2-1b", map[string]any{"finetune": "lora", "lora-dropout": math.NaN()}, "--lora-dropout: want a probability in [0, 1), got NaN"},
		{"phi-3-mini", map[string]any{"finetune": "lora"}, "--lora-targets: PEFT has no default target modules for model_type phi3: name them (comma-separated, or all-linear)"},
		{"gpt2-small", map[string]any{"finetune": "qlora"}, "--finetune qlora: 4-bit layers are modelled for the Llama-family configs"},
		{"resnet18", map[string]any{"finetune": "lora"}, "--finetune lora: modelled for language models; resnet18 is an image model"},
		{"llama-3.2-1b", map[string]any{"finetune": "lora", "inference": true}, "--finetune: a training option; --inference generates under no_grad"},
		{"gpt2-small", map[string]any{"gpus": 0}, "--gpus: want a positive integer (the job's GPUs), got 0"},
		{"gpt2-small", map[string]any{"parallel": "ddp"}, "--parallel ddp: give the job's GPUs (--gpus N)"},
		{"gpt2-small", map[string]any{"gpus": 8, "parallel": "zero3", "grad-accum": 2}, "--parallel zero3 --grad-accum: DeepSpeed's gradient accumulation is not modelled"},
		{"gpt2-small", map[string]any{"gpus": 8, "parallel": "zero2", "optimizer": "sgd"}, "--parallel zero2 --optimizer sgd: memsh models DeepSpeed's FusedAdam"},
		{"gpt2-small", map[string]any{"gpus": 8, "parallel": "zero1", "grad-accum": 2}, "--parallel zero1 --grad-accum: DeepSpeed's gradient accumulation is not modelled"},
		{"gpt2-small", map[string]any{"gpus": 8, "parallel": "zero2", "precision": "bf16-true"}, "--parallel zero2 with bf16-true: DeepSpeed's bf16"},
		{"gpt2-small", map[string]any{"gpus": 2, "parallel": "tp=2"}, "--parallel tp=2: tensor parallelism is modelled for the Llama-family configs torchtitan's plan fits (llama, mistral, qwen2, qwen3); gpt2-small is not one"},
		{"llama-3.2-1b", map[string]any{"gpus": 8, "parallel": "tp=2"}, "--parallel tp=2 on 8 GPUs: tensor parallelism alone runs on 2 GPUs; for data parallelism over the others use tp=2,fsdp (2-D)"},
		{"llama-3.2-1b", map[string]any{"gpus": 6, "parallel": "tp=4,fsdp"}, "--parallel tp=4,fsdp on 6 GPUs: the tensor-parallel degree 4 must divide the GPUs"},
		{"llama-3.2-1b", map[string]any{"gpus": 8, "parallel": "tp=x"}, "--parallel tp=x: want tp=T or tp=T,fsdp"},
		{"llama-3.2-1b", map[string]any{"parallel": "tp=2"}, "--parallel tp=2: give the job's GPUs (--gpus N)"},
		{"qwen2.5-0.5b", map[string]any{"gpus": 4, "parallel": "tp=4"}, "--parallel tp=4: qwen2.5-0.5b's num_attention_heads (14) is not divisible by the tensor-parallel degree 4"},
		{"llama-3.2-1b", map[string]any{"gpus": 16, "parallel": "tp=16"}, "--parallel tp=16: llama-3.2-1b's num_key_value_heads (8) is not divisible by the tensor-parallel degree 16"},
		{"llama-3.2-1b", map[string]any{"gpus": 2, "parallel": "tp=2", "finetune": "lora"}, "--parallel tp=2 --finetune lora: tensor parallelism of PEFT's adapter layers is not modelled"},
		{"llama-3.2-1b", map[string]any{"gpus": 8, "parallel": "tp=2,fsdp", "precision": "fp16"}, "--parallel tp=2,fsdp with fp16: FSDP2's loss scaling"},
		{"gpt2-small", map[string]any{"gpus": 8, "parallel": "pipeline"}, `--parallel: want ddp (DistributedDataParallel), fsdp or fsdp,offload (FSDP2's fully_shard, with CPU offload), zero1, zero2 or zero3 (DeepSpeed's ZeRO), tp=T or tp=T,fsdp (tensor parallelism, 2-D with FSDP2), got "pipeline"`},
		{"gpt2-small", map[string]any{"gpus": 8, "parallel": "fsdp", "precision": "fp16"}, "--parallel fsdp with fp16: FSDP2's loss scaling (a sharded GradScaler) is not modelled"},
		{"llama-3.2-1b", map[string]any{"gpus": 8, "parallel": "fsdp", "finetune": "qlora"}, "--parallel fsdp --finetune qlora: sharding bitsandbytes' 4-bit weights is not modelled"},
		{"llama-3.2-1b", map[string]any{"gpus": 8, "inference": true}, "--gpus/--parallel: a training option; --inference generates on one GPU"},
	} {
		o := options(tc.src, tc.set)
		rc, out, errs := runMain(t, o)
		if rc != 2 || out != "" {
			t.Errorf("%s %v: exit %d, stdout %q, want 2 and nothing", tc.src, tc.set, rc, out)
		}
		if !strings.Contains(errs, tc.want) {
			t.Errorf("%s %v: stderr %q, want %q", tc.src, tc.set, errs, tc.want)
		}
		if n := strings.Count(strings.TrimSpace(errs), "\n"); n != 0 {
			t.Errorf("%s %v: %d lines on stderr, want one:\n%s", tc.src, tc.set, n+1, errs)
		}
		if tc.set["gpu"] == nil && regexp.MustCompile(`--gpu\b`).MatchString(errs) {
			t.Errorf("%s: the error mentions --gpu, which was not given: %s", tc.src, errs)
		}
	}
	// the default GPU is never blamed as a flag
	o := options("gpt2-small", nil)
	o.GPU = "nope"
	if _, _, errs := runMain(t, o); !strings.Contains(errs, `the GPU: unknown GPU "nope"`) {
		t.Errorf("an unknown default GPU: %s", errs)
	}
}

// A card without bfloat16 warns and trains in fp16 with a GradScaler.
func TestPrecisionFallback(t *testing.T) {
	o := options("gpt2-small", map[string]any{"gpu": "T4", "json": true})
	rc, out, errs := runMain(t, o)
	if rc != 0 {
		t.Fatalf("exit %d: %s", rc, errs)
	}
	if !strings.Contains(errs, "Tesla T4 (sm75) has no bfloat16") || !strings.Contains(errs, "training in fp16 with a GradScaler instead") {
		t.Errorf("no warning: %q", errs)
	}
	var r fit.Report
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatal(err)
	}
	if r.Precision != "fp16" {
		t.Errorf("precision %q, want fp16", r.Precision)
	}
}

// The library's configs build models with the published parameter counts
// (each Entry's Source cites where they were published).
func TestLibraryParameterCounts(t *testing.T) {
	for _, e := range fit.Library {
		if e.Kind != fit.KindHF {
			continue
		}
		cfg, err := scripts.Library.ReadFile(e.Config)
		if err != nil {
			t.Fatal(err)
		}
		n := buildCount(t, string(cfg))
		if n != e.Published {
			t.Errorf("%s: %d parameters, published %d (%s)", e.Name, n, e.Published, e.Source)
		}
	}
}

// buildCount builds config on a meta simulator and counts its parameters.
func buildCount(t *testing.T, config string) int64 {
	t.Helper()
	s, out := metaSession(t)
	s.Set("CONFIG", starlark.String(config))
	err := s.Exec("count.star", `load("models/hf.star", "from_config")
m = from_config(json.decode(CONFIG), device = "cuda")
N = 0
for p in m.parameters():
    N += p.numel()
`)
	if err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	n, _ := s.Get("N").(starlark.Int).Int64()
	return n
}

// fit's list of model types is the library's (hf.star's FAMILIES and
// BUILDERS).
func TestModelTypesMatchLibrary(t *testing.T) {
	var out bytes.Buffer
	s, err := scope.New(scope.Options{Device: "sim:1GiB,meta", Out: &out, Err: &out, Library: scripts.Library})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Exec("types.star", `load("models/hf.star", "FAMILIES", "BUILDERS")
T = sorted(list(FAMILIES.keys()) + list(BUILDERS.keys()))
`); err != nil {
		t.Fatal(err)
	}
	var got []string
	l := s.Get("T").(*starlark.List)
	for i := range l.Len() {
		got = append(got, string(l.Index(i).(starlark.String)))
	}
	want := append([]string(nil), fit.HFModelTypes...)
	sort.Strings(want)
	if !reflect.DeepEqual(got, want) {
		t.Errorf("hf.star builds %v, fit.HFModelTypes lists %v", got, want)
	}
}

// writeSafetensors writes a safetensors file holding only a header (the
// data is never read).
func writeSafetensors(t *testing.T, path string, tensors map[string]fit.TensorInfo) {
	t.Helper()
	h := map[string]any{"__metadata__": map[string]string{"format": "pt"}}
	off := 0
	for name, ti := range tensors {
		h[name] = map[string]any{"dtype": ti.DType, "shape": ti.Shape, "data_offsets": []int{off, off}}
	}
	b, err := json.Marshal(h)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	_ = binary.Write(&buf, binary.LittleEndian, uint64(len(b)))
	buf.Write(b)
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}

// A checkpoint beside a config.json is checked tensor by tensor against
// the model memsh built: its shape, and its dtype against torch_dtype.
func TestCheckpointBesideConfig(t *testing.T) {
	cfg := `{"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 1,
  "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 512, "max_position_embeddings": 128,
  "tie_word_embeddings": false, "torch_dtype": "bfloat16"}`
	good := map[string]fit.TensorInfo{
		"model.embed_tokens.weight":                      {DType: "BF16", Shape: []int{512, 64}},
		"model.layers.0.self_attn.q_proj.weight":         {DType: "BF16", Shape: []int{64, 64}},
		"model.layers.0.self_attn.k_proj.weight":         {DType: "BF16", Shape: []int{32, 64}},
		"model.layers.0.self_attn.v_proj.weight":         {DType: "BF16", Shape: []int{32, 64}},
		"model.layers.0.self_attn.o_proj.weight":         {DType: "BF16", Shape: []int{64, 64}},
		"model.layers.0.mlp.gate_proj.weight":            {DType: "BF16", Shape: []int{128, 64}},
		"model.layers.0.mlp.up_proj.weight":              {DType: "BF16", Shape: []int{128, 64}},
		"model.layers.0.mlp.down_proj.weight":            {DType: "BF16", Shape: []int{64, 128}},
		"model.layers.0.input_layernorm.weight":          {DType: "BF16", Shape: []int{64}},
		"model.layers.0.post_attention_layernorm.weight": {DType: "BF16", Shape: []int{64}},
		"model.norm.weight":                              {DType: "BF16", Shape: []int{64}},
		"lm_head.weight":                                 {DType: "BF16", Shape: []int{512, 64}},
	}
	check := func(name string, tensors map[string]fit.TensorInfo, sharded bool) (int, string, string) {
		dir := filepath.Join(t.TempDir(), name)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "config.json"), []byte(cfg), 0o644); err != nil {
			t.Fatal(err)
		}
		if sharded {
			a, b := map[string]fit.TensorInfo{}, map[string]fit.TensorInfo{}
			idx := map[string]any{"weight_map": map[string]string{}}
			i := 0
			for k, v := range tensors {
				f := "model-00001-of-00002.safetensors"
				m := a
				if i%2 == 1 {
					f, m = "model-00002-of-00002.safetensors", b
				}
				m[k] = v
				idx["weight_map"].(map[string]string)[k] = f
				i++
			}
			writeSafetensors(t, filepath.Join(dir, "model-00001-of-00002.safetensors"), a)
			writeSafetensors(t, filepath.Join(dir, "model-00002-of-00002.safetensors"), b)
			j, _ := json.Marshal(idx)
			if err := os.WriteFile(filepath.Join(dir, "model.safetensors.index.json"), j, 0o644); err != nil {
				t.Fatal(err)
			}
		} else {
			writeSafetensors(t, filepath.Join(dir, "model.safetensors"), tensors)
		}
		return runMain(t, options(dir, map[string]any{"gpu": "L4", "seq": 64, "json": true}))
	}
	for _, sharded := range []bool{false, true} {
		rc, out, errs := check("good", good, sharded)
		if rc != 0 {
			t.Fatalf("sharded %v: exit %d: %s", sharded, rc, errs)
		}
		var r fit.Report
		if err := json.Unmarshal([]byte(out), &r); err != nil {
			t.Fatal(err)
		}
		if r.CheckpointFile == nil || r.CheckpointFile.Tensors != len(good) {
			t.Errorf("sharded %v: checkpoint check %+v, want %d tensors", sharded, r.CheckpointFile, len(good))
		}
	}
	for _, tc := range []struct {
		change func(m map[string]fit.TensorInfo)
		want   string
	}{
		{func(m map[string]fit.TensorInfo) {
			m["model.norm.weight"] = fit.TensorInfo{DType: "BF16", Shape: []int{65}}
		},
			"checkpoint tensor model.norm.weight has shape [65], the model's parameter [64]"},
		{func(m map[string]fit.TensorInfo) {
			m["lm_head.weight"] = fit.TensorInfo{DType: "F32", Shape: []int{512, 64}}
		},
			"checkpoint tensor lm_head.weight is stored as F32, but the config's torch_dtype is bfloat16"},
		{func(m map[string]fit.TensorInfo) {
			m["model.extra.weight"] = fit.TensorInfo{DType: "BF16", Shape: []int{3}}
		},
			"checkpoint tensor model.extra.weight (BF16, [3]) is not a parameter of the model memsh built"},
	} {
		m := map[string]fit.TensorInfo{}
		for k, v := range good {
			m[k] = v
		}
		tc.change(m)
		rc, _, errs := check("bad", m, false)
		if rc != 2 || !strings.Contains(errs, tc.want) {
			t.Errorf("exit %d, %q, want 2 and %q", rc, errs, tc.want)
		}
	}
}

// The --json object: its keys (docs/fit.md's schema), and figures that
// agree with each other — the boundary among the trials, the breakdown
// summing to the peak, fragmentation and headroom from the peaks.
func TestJSONReport(t *testing.T) {
	rc, out, errs := runMain(t, options("gpt2-small", map[string]any{"gpu": "L4", "json": true}))
	if rc != 0 {
		t.Fatalf("exit %d: %s", rc, errs)
	}
	if strings.Count(out, "\n") != 1 {
		t.Errorf("want one JSON object on one line, got:\n%s", out)
	}
	var raw map[string]any
	if err := json.Unmarshal([]byte(out), &raw); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"model", "parameters", "trainable_parameters", "largest_batch", "first_oom", "seq", "attention", "sdpa_backend", "peak", "breakdown", "peak_phase", "trials", "gpu", "device", "capacity", "usable", "precision", "optimizer", "checkpoint", "steps", "search"} {
		if _, ok := raw[k]; !ok {
			t.Errorf("no %q in %s", k, out)
		}
	}
	var r fit.Report
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatal(err)
	}
	if r.LargestBatch == nil || r.FirstOOM == nil || *r.FirstOOM != *r.LargestBatch+1 {
		t.Fatalf("boundary %v %v", r.LargestBatch, r.FirstOOM)
	}
	status := map[int]string{}
	for _, tr := range r.Trials {
		status[tr.Value] = tr.Status
	}
	if status[*r.LargestBatch] != "ok" || status[*r.FirstOOM] != "oom" {
		t.Errorf("trials %v do not hold the boundary %d/%d", r.Trials, *r.LargestBatch, *r.FirstOOM)
	}
	b := r.Breakdown
	if sum := b.Parameters + b.Gradients + b.OptimizerState + b.Activations + b.Temporaries + b.Workspaces + b.Other; sum != r.Peak.Allocated {
		t.Errorf("breakdown sums to %d, peak allocated %d", sum, r.Peak.Allocated)
	}
	// PyTorch 2.x's workspaces on sm89: cuBLAS 8 MiB + 128 KiB for the
	// forward's thread and the backward's, cuBLASLt 1 MiB for the
	// forward's (addmm with its bias)
	if b.Workspaces != 2*(4096*2*1024+16*8*1024)+1024*1024 {
		t.Errorf("workspaces %d", b.Workspaces)
	}
	if r.Capacity != r.Usable+r.Context || r.Context <= 0 {
		t.Errorf("capacity %d, usable %d, context %d", r.Capacity, r.Usable, r.Context)
	}
	if r.Peak.Fragmentation != r.Peak.Reserved-r.Peak.Allocated || r.Peak.Headroom != r.Usable-r.Peak.Reserved {
		t.Errorf("peak %+v, usable %d", r.Peak, r.Usable)
	}
	// the peak trial's peak is the measured one
	for _, tr := range r.Trials {
		if tr.Value == *r.LargestBatch && tr.PeakAllocated != r.Peak.Allocated {
			t.Errorf("trial at %d peaked at %d, the measured run at %d", tr.Value, tr.PeakAllocated, r.Peak.Allocated)
		}
	}
	if r.Attention != "sdpa" || r.SDPABackend != "flash" || r.Seq != 1024 || r.Parameters != 124439808 {
		t.Errorf("attention %s/%s, seq %d, parameters %d", r.Attention, r.SDPABackend, r.Seq, r.Parameters)
	}
	if r.OOM == nil || r.OOM.Requested <= 0 || r.OOM.Allocated <= 0 || r.OOM.Breakdown == nil {
		t.Errorf("first OOM: %+v", r.OOM)
	}
}

// When nothing fits: the model-state floor against what the card can
// hold, and the changes that would fit, each found by trials.
func TestAdviceWhenNothingFits(t *testing.T) {
	rc, out, errs := runEightB(t)
	if rc != 0 {
		t.Fatalf("exit %d: %s", rc, errs)
	}
	var r fit.Report
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatal(err)
	}
	if r.LargestBatch != nil || r.FirstOOM == nil || *r.FirstOOM != 1 {
		t.Fatalf("largest %v, first OOM %v: batch 1 should not fit", r.LargestBatch, r.FirstOOM)
	}
	f := r.Floor
	// AdamW: parameters, gradients and two moments, float32
	p := int64(0)
	if f == nil || f.Parameters != f.Gradients || f.OptimizerState != 2*f.Parameters || f.Total != 4*f.Parameters || f.Total <= f.Usable {
		t.Fatalf("floor %+v", f)
	}
	p = f.Parameters
	if p < 4*r.Parameters || p > 4*r.Parameters+512*300 {
		t.Errorf("parameter bytes %d for %d float32 parameters", p, r.Parameters)
	}
	got := map[string]fit.Alternative{}
	for _, a := range r.Advice {
		got[a.Change] = a
	}
	if a := got["activation checkpointing"]; !a.Modelled || a.Fits {
		t.Errorf("checkpointing: %+v", a)
	}
	var lower fit.Alternative
	for k, a := range got {
		if strings.HasPrefix(k, "precision bf16-true") {
			lower = a
		}
	}
	if !lower.Modelled || !lower.Fits || lower.Largest < 1 || lower.FirstOOM != lower.Largest+1 {
		t.Errorf("bf16-true: %+v", lower)
	}
	// the optimizers that keep less state, each tried: 8-bit AdamW's
	// 15 GiB on the device are still too many, paged 8-bit AdamW's state is
	// off the device
	if a := got["optimizer adamw_bnb_8bit"]; !a.Modelled || a.Fits {
		t.Errorf("adamw_bnb_8bit: %+v", a)
	}
	for _, name := range []string{"paged_adamw_8bit", "adafactor", "sgd"} {
		if a := got["optimizer "+name]; !a.Modelled || !a.Fits || a.Largest < 1 {
			t.Errorf("%s: %+v", name, a)
		}
	}
	// LoRA and QLoRA are trials of their own (PEFT's defaults for Llama)
	for _, c := range []string{"LoRA r=8 on q_proj, v_proj", "QLoRA r=8 on q_proj, v_proj with checkpointing"} {
		if a := got[c]; !a.Modelled || !a.Fits || a.Largest < 1 {
			t.Errorf("%s: %+v", c, a)
		}
	}
	// the text report says the same
	o := options("llama-3.1-8b", nil)
	rc, text, _ := runMain(t, o)
	if rc != 0 || !strings.Contains(text, "largest batch: none — batch 1 runs out of memory") || !strings.Contains(text, "no batch fits without changing that") || !strings.Contains(text, "what would fit (each found by trials):") {
		t.Errorf("text report:\n%s", text)
	}
}

// A model whose weights alone are more than the card (Llama 3.1 8B's
// float32 weights, 29.92 GiB, on a T4) is an answer, not a traceback:
// its parameters counted on a card with room (the published count:
// 8,030,261,248), batch 1 an OOM while the model is built, the floor and
// the advice (QLoRA fits). Mixtral 8x7B on an H100 is the same case, but
// its advice's LoRA searches of a Mixture-of-Experts model take minutes.
func TestWeightsAloneDoNotFit(t *testing.T) {
	rc, text, stderr := runMain(t, options("llama-3.1-8b", map[string]any{"gpu": "T4"}))
	if rc != 0 || strings.Contains(text+stderr, "Traceback") {
		t.Fatalf("rc %d\n%s\n%s", rc, text, stderr)
	}
	for _, want := range []string{
		"8,030,261,248 parameters (published 8,030,261,248: equal), float32",
		"largest batch: none — batch 1 runs out of memory",
		"while building the model (its weights)",
		"model-state floor: parameters 29.92 GiB",
		"QLoRA r=8 on q_proj, v_proj with checkpointing fits",
		"the model's weights alone (29.92 GiB) are more than the card's memory",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("missing %q in\n%s", want, text)
		}
	}
}

// A .star model file: build and inputs, PARAMETERS checked, MAX_SEQ bounds
// --seq, and load() of the library works without a checkout.
func TestStarModelFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "mine.star")
	src := `load("models/hf.star", "from_config")
CFG = {"model_type": "llama", "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
       "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 4096, "max_position_embeddings": 512}
PARAMETERS = 3278080
MAX_SEQ = 512

def build(device, checkpoint):
    return from_config(CFG, checkpoint = checkpoint, device = device)

def inputs(batch, seq, device):
    x = tensor.randint(0, 4096, [batch, seq], device = device)
    return [x, x.clone()]
`
	if err := os.WriteFile(path, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	wd, _ := os.Getwd()
	if err := os.Chdir(t.TempDir()); err != nil { // no scripts/ here
		t.Fatal(err)
	}
	defer os.Chdir(wd)
	rc, out, errs := runMain(t, options(path, map[string]any{"gpu": "4GiB", "json": true}))
	if rc != 0 {
		t.Fatalf("exit %d: %s", rc, errs)
	}
	var r fit.Report
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatal(err)
	}
	if r.Parameters != 3278080 || r.PublishedParameters != 3278080 || r.Seq != 512 || r.LargestBatch == nil || r.Source != "star" {
		t.Errorf("report %+v", r)
	}
	if rc, _, errs := runMain(t, options(path, map[string]any{"seq": 1024})); rc != 2 || !strings.Contains(errs, "takes at most 512 (MAX_SEQ)") {
		t.Errorf("--seq over MAX_SEQ: %d %s", rc, errs)
	}
	if err := os.WriteFile(path, []byte(strings.Replace(src, "3278080", "3278081", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	if rc, _, errs := runMain(t, options(path, nil)); rc != 1 || !strings.Contains(errs, "PARAMETERS is 3,278,081, but the model build() returns has 3,278,080 parameters") {
		t.Errorf("a wrong PARAMETERS: %d %s", rc, errs)
	}
}

// --inference: the largest batch that generates, the KV cache in the
// breakdown at its closed form, where the peak falls.
func TestInference(t *testing.T) {
	for _, kv := range []string{"dynamic", "static"} {
		rc, out, errs := runMain(t, options("qwen2.5-0.5b", map[string]any{"inference": true, "seq": 256, "max-new-tokens": 4, "kv-cache": kv, "gpu": "4GiB", "json": true}))
		if rc != 0 {
			t.Fatalf("%s: exit %d: %s", kv, rc, errs)
		}
		var r fit.Report
		if err := json.Unmarshal([]byte(out), &r); err != nil {
			t.Fatal(err)
		}
		if !r.Inference || r.KVCache != kv || r.MaxNewTokens != 4 || r.Precision != "bf16-true" || r.ParameterDType != "bfloat16" || r.LargestBatch == nil {
			t.Fatalf("%s: %+v", kv, r)
		}
		// 24 layers, 2 kv heads of 64, bfloat16: the prompt's tokens at the
		// prefill (a DynamicCache), all 260 in a StaticCache
		b := int64(*r.LargestBatch)
		tokens := int64(256)
		if r.PeakIn == "decode" {
			tokens = 256 + 4 - 1
		}
		if kv == "static" {
			tokens = 260
		}
		if want := 2 * 24 * 2 * 64 * tokens * b * 2; r.Breakdown.KVCache != want {
			t.Errorf("%s: KV cache %d at the peak (in the %s), want %d", kv, r.Breakdown.KVCache, r.PeakIn, want)
		}
		if r.PeakIn != "prefill" && r.PeakIn != "decode" || r.PrefillPeak <= 0 || r.PrefillPeak > r.Peak.Allocated {
			t.Errorf("%s: peak in %q, prefill peak %d of %d", kv, r.PeakIn, r.PrefillPeak, r.Peak.Allocated)
		}
	}
}

// Gradient accumulation: the gradients of the first micro-batch are
// there during the next ones, so at the loss's peak (the logits of a
// later micro-batch) every parameter's gradient is allocated — at least
// the parameters' bytes (a block may keep the unsplit rest of its
// segment, as PyTorch's allocator does), where without accumulation the
// peak (the second step's loss, after zero_grad(set_to_none=True)) has
// none.
func TestGradAccum(t *testing.T) {
	report := func(accum int) fit.Report {
		rc, out, errs := runMain(t, options("gpt2-small", map[string]any{"gpu": "L4", "grad-accum": accum, "json": true}))
		if rc != 0 {
			t.Fatalf("exit %d: %s", rc, errs)
		}
		var r fit.Report
		if err := json.Unmarshal([]byte(out), &r); err != nil {
			t.Fatal(err)
		}
		return r
	}
	one, two := report(1), report(2)
	if two.GradAccum != 2 || one.GradAccum != 0 || two.LargestBatch == nil {
		t.Fatalf("%+v", two)
	}
	paramBytes := int64(124439808 * 4) // float32, each tensor a multiple of 512 bytes already
	if one.Breakdown.Gradients != 0 || two.Breakdown.Gradients < paramBytes {
		t.Errorf("gradients at the peak: %d without accumulation, %d with 2 micro-batches (parameters %d)", one.Breakdown.Gradients, two.Breakdown.Gradients, paramBytes)
	}
}

// --gpus 4: one rank of DistributedDataParallel keeps the reducer's
// buckets, as many bytes as the float32 gradients, counted as
// communication at the peak (allocator blocks: a bucket over 1 MiB may
// keep an unsplit remainder under 1 MiB, as TestOptimizers says of
// states, and gpt2-small's rebuilt buckets are at most 20); the per-rank batch is no larger than one
// GPU's; gradient accumulation runs its first micro-batches under
// no_sync. The report names the strategy.
func TestDDP(t *testing.T) {
	report := func(set map[string]any) (fit.Report, string) {
		set["gpu"] = "L4"
		rc, out, errs := runMain(t, options("gpt2-small", set))
		if rc != 0 {
			t.Fatalf("exit %d: %s", rc, errs)
		}
		set["json"] = true
		rc, js, errs := runMain(t, options("gpt2-small", set))
		if rc != 0 {
			t.Fatalf("exit %d: %s", rc, errs)
		}
		var r fit.Report
		if err := json.Unmarshal([]byte(js), &r); err != nil {
			t.Fatal(err)
		}
		return r, out
	}
	one, _ := report(map[string]any{})
	ddp, text := report(map[string]any{"gpus": 4})
	acc, _ := report(map[string]any{"gpus": 4, "grad-accum": 2})
	const trainable = 124439808 * 4 // float32 gradients; one bucket per dtype before the rebuild, the same bytes after
	if ddp.GPUs != 4 || ddp.Parallel != "ddp" || one.Parallel != "" {
		t.Errorf("gpus %d parallel %q (one GPU: %q)", ddp.GPUs, ddp.Parallel, one.Parallel)
	}
	comm := func(b *fit.Breakdown) bool {
		return b != nil && b.Communication >= trainable && b.Communication < trainable+20<<20
	}
	if !comm(ddp.Breakdown) || one.Breakdown.Communication != 0 {
		t.Errorf("communication at the peak: %+v, want %d and up to 20 MiB of blocks", ddp.Breakdown, trainable)
	}
	if *ddp.LargestBatch > *one.LargestBatch {
		t.Errorf("per-rank batch %d, one GPU %d", *ddp.LargestBatch, *one.LargestBatch)
	}
	if !comm(acc.Breakdown) || acc.Breakdown.Gradients < trainable {
		t.Errorf("with accumulation: %+v", acc.Breakdown)
	}
	if !strings.Contains(text, "data parallel on 4 GPUs: DistributedDataParallel") || !strings.Contains(text, " · communication ") {
		t.Errorf("the report:\n%s", text)
	}
}

// --gpus 8 --parallel fsdp: Llama 3.1 8B, which one H100 cannot train,
// trains on 8 with FSDP2: rank 0 holds 1/8 of the parameters (each
// dimension divides by 8) and AdamW's two float32 moments of them — the
// optimizer state at the peak is that closed form, give or take what a
// block over 1 MiB keeps unsplit (under 1 MiB each) — and the
// collectives' buffers count as communication. The model is built on
// the meta device, so the floor's sharded parameters are all the weights
// a rank holds between steps.
func TestFSDP(t *testing.T) {
	set := map[string]any{"gpus": 8, "parallel": "fsdp", "json": true}
	rc, out, errs := runMain(t, options("llama-3.1-8b", set))
	if rc != 0 {
		t.Fatalf("exit %d: %s", rc, errs)
	}
	var r fit.Report
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatal(err)
	}
	if r.LargestBatch == nil || *r.LargestBatch < 1 || r.Parallel != "fsdp" || r.GPUs != 8 {
		t.Fatalf("largest %v, parallel %q gpus %d", r.LargestBatch, r.Parallel, r.GPUs)
	}
	const params = 8030261248
	state := int64(2 * params / 8 * 4)
	tensors := int64(2 * (32*9 + 3)) // two moments of each of the 291 parameters
	if b := r.Breakdown; b.OptimizerState < state || b.OptimizerState >= state+tensors<<20 || b.Communication == 0 {
		t.Errorf("at the peak: optimizer state %d (closed form %d), communication %d", b.OptimizerState, state, b.Communication)
	}
	// one GPU does not train it; the advice names FSDP2 on the fewest GPUs
	rc, out, errs = runEightB(t)
	if rc != 0 {
		t.Fatalf("exit %d: %s", rc, errs)
	}
	var one fit.Report
	if err := json.Unmarshal([]byte(out), &one); err != nil {
		t.Fatal(err)
	}
	var got *fit.Alternative
	for i, a := range one.Advice {
		if strings.HasPrefix(a.Change, "FSDP2 on ") {
			got = &one.Advice[i]
		}
	}
	if one.LargestBatch != nil || got == nil || !got.Fits || !strings.HasPrefix(got.Change, "FSDP2 on 2 × H100") {
		t.Errorf("one GPU: largest %v, FSDP advice %+v", one.LargestBatch, got)
	}
}

// --parallel fsdp,offload: FSDP2 with CPUOffloadPolicy keeps no model
// state on the GPU. Llama 3.1 8B's dims all divide by 8, so rank 0's
// shards hold P/8 of its P parameters; in host memory they are float32,
// as their gradients and AdamW's two moments: 16·P/8 bytes. The host's
// peak adds the optimizer's per-parameter loop at lm_head (the last
// parameter): its sqrt(exp_avg_sq) and denominator, [V/8, h] float32
// each, and the final norm's denominator before it ([h/8]). On a 2 GiB
// card nothing of Llama 3.2 1B fits (dims even, embeddings tied) and the
// floor is its host state alone, 16·P/2.
func TestFSDPOffload(t *testing.T) {
	const params, h, vocab = 8030261248, 4096, 128256
	rc, out, errs := runMain(t, options("llama-3.1-8b", map[string]any{"gpus": 8, "parallel": "fsdp,offload", "json": true}))
	if rc != 0 {
		t.Fatalf("exit %d: %s", rc, errs)
	}
	var r fit.Report
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatal(err)
	}
	if r.LargestBatch == nil || *r.LargestBatch < 1 || r.Parallel != "fsdp,offload" {
		t.Fatalf("largest %v, parallel %q", r.LargestBatch, r.Parallel)
	}
	state, step := int64(16*params/8), int64(2*vocab/8*h*4+h/8*4)
	if r.Peak.Host != state+step {
		t.Errorf("host peak %d, want %d (state) + %d (the step's loop)", r.Peak.Host, state, step)
	}
	if b := r.Breakdown; b.Gradients != 0 || b.OptimizerState != 0 || b.Communication == 0 {
		t.Errorf("breakdown %+v: want no gradients and no optimizer state on the GPU", b)
	}
	rc, out, errs = runMain(t, options("llama-3.2-1b", map[string]any{"gpus": 2, "parallel": "fsdp,offload", "gpu": "2GiB", "json": true}))
	if rc != 0 {
		t.Fatalf("exit %d: %s", rc, errs)
	}
	var small fit.Report
	if err := json.Unmarshal([]byte(out), &small); err != nil {
		t.Fatal(err)
	}
	const params1b = 1235814400
	if small.LargestBatch != nil || small.Floor == nil || small.Floor.Total != 0 || small.Floor.Offloaded != 16*params1b/2 {
		t.Errorf("1B on 2 GiB: largest %v, floor %+v; want none and offloaded %d", small.LargestBatch, small.Floor, 16*params1b/2)
	}
	// the bad ones
	for _, c := range []struct {
		set  map[string]any
		want string
	}{
		{map[string]any{"gpus": 2, "parallel": "fsdp,offload", "optimizer": "adamw_bnb_8bit"}, "a CPU step is modelled for torch.optim's AdamW, Adam and SGD"},
		{map[string]any{"gpus": 2, "parallel": "fsdp,offload", "finetune": "qlora"}, "sharding bitsandbytes' 4-bit weights is not modelled"},
		{map[string]any{"parallel": "fsdp,offload"}, "give the job's GPUs"},
	} {
		rc, _, errs := runMain(t, options("llama-3.2-1b", c.set))
		if rc != 2 || !strings.Contains(errs, c.want) {
			t.Errorf("%v: exit %d, %q; want 2 and %q", c.set, rc, errs, c.want)
		}
	}
}

// --parallel zero3: DeepSpeed's stage 3 on 8 H100s trains Llama 3.1 8B;
// at the peak rank 0 holds its partitions of every parameter, ceil(n/8)
// elements each (P in all), in bfloat16 beside what the coordinator has
// gathered, the gradient partitions (2·P bytes), the fp32 master and
// Adam's two moments (12·P), and the reduce bucket (5e8 bfloat16
// elements) as communication — each large tensor in a block that may
// keep an unsplit remainder under 1 MiB. Two A100-40GBs do not fit it:
// the floor is the same closed form for N = 2 (with the 65 norms'
// persistent gathered copies).
func TestZeRO3(t *testing.T) {
	shapes := func(n int) (P, persist int64) {
		const h, inter, kv, layers, vocab = 4096, 14336, 1024, 32, 128256
		each := []int64{h * h, kv * h, kv * h, h * h, inter * h, inter * h, h * inter, h, h}
		var all []int64
		for range layers {
			all = append(all, each...)
		}
		all = append(all, vocab*h, vocab*h, h)
		for _, x := range all {
			c := (x + int64(n) - 1) / int64(n)
			P += c
			if x <= 100_000 {
				persist += c * int64(n)
			}
		}
		return P, persist
	}
	rc, out, errs := runMain(t, options("llama-3.1-8b", map[string]any{"gpus": 8, "parallel": "zero3", "json": true}))
	if rc != 0 {
		t.Fatalf("exit %d: %s", rc, errs)
	}
	var r fit.Report
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatal(err)
	}
	P, _ := shapes(8)
	b := r.Breakdown
	if r.LargestBatch == nil || b == nil {
		t.Fatalf("largest %v, breakdown %v", r.LargestBatch, b)
	}
	within := func(what string, got, want, blocks int64) {
		if got < want || got >= want+blocks<<20 {
			t.Errorf("%s at the peak: %d, closed form %d (+ at most %d MiB of block remainders)", what, got, want, blocks)
		}
	}
	within("gradient partitions", b.Gradients, 2*P, 1)
	within("master and moments", b.OptimizerState, 12*P, 6)
	within("reduce bucket", b.Communication, 2*500_000_000, 1)
	if b.Parameters < 2*P {
		t.Errorf("parameters at the peak %d, less than the partitions %d", b.Parameters, 2*P)
	}
	rc, out, errs = runMain(t, options("llama-3.1-8b", map[string]any{"gpus": 2, "parallel": "zero3", "gpu": "A100-40GB", "json": true}))
	if rc != 0 {
		t.Fatalf("N=2: exit %d: %s", rc, errs)
	}
	var two fit.Report
	if err := json.Unmarshal([]byte(out), &two); err != nil {
		t.Fatal(err)
	}
	P2, persist := shapes(2)
	if f := two.Floor; f == nil || f.Parameters != 2*(P2+persist) || f.Gradients != 2*P2 || f.OptimizerState != 12*P2 || f.Communication != 1_000_000_000 {
		t.Errorf("N=2: floor %+v; want parameters %d, gradients %d, optimizer state %d, communication 1e9", two.Floor, 2*(P2+persist), 2*P2, 12*P2)
	}
}

// --parallel tp=8: rank 0 of Llama 3.1 8B under torchtitan's TP plan
// holds, in float32 (bf16 autocast), each projection's 1/8 chunk (q/k/v
// and gate/up by rows, o and down by columns), the two norms whole, the
// embedding's and lm_head's 16,032 rows: exactly those bytes of
// parameters at the peak (and the rotary buffer), AdamW's two moments of
// them after the first step. With ,fsdp on 16 GPUs, FSDP2 shards those
// chunks' dim 0 in two. A model that does not fit has the same chunks in
// its floor.
func TestTP(t *testing.T) {
	const (
		h, inter, heads, kv, hd, layers, vocab = 4096, 14336, 32, 8, 128, 32, 128256
		T                                      = 8
	)
	layer := (heads*hd/T)*h + 2*(kv*hd/T)*h + h*(heads*hd/T) + 3*(inter/T)*h + 2*h
	params := int64(4 * (layers*layer + 2*(vocab/T)*h + h))
	// Megatron's most loaded shard has as many parameters, but for the
	// norms: memsh's SequenceParallel norms are whole on every rank,
	// Megatron's formula divides them by T too (its vocabulary padded to
	// a multiple of 128·T, 129,024 here, is left out to compare shapes)
	mc := megatronConfig{layers: layers, hidden: h, ffn: inter, heads: heads, groups: kv, kvChannels: hd, vocab: vocab,
		swiglu: true, rmsNorm: true, untied: true, tp: T, dp: 1, seq: 2048}
	const norms = int64(2*layers+1) * h
	if got := int64(megatronShardParameters(mc)) + norms*(T-1)/T; got != params/4 {
		t.Errorf("Megatron's shard: %d parameters (norms whole), memsh's chunks %d", got, params/4)
	}
	for _, tc := range []struct {
		parallel   string
		gpus       int
		params     int64 // rank 0's parameter bytes
		breakdown  bool
		largestMin int
	}{
		{"tp=8", 8, params, true, 1},
		{"tp=8,fsdp", 16, params / 2, false, 1},
	} {
		rc, out, errs := runMain(t, options("llama-3.1-8b", map[string]any{"gpus": tc.gpus, "parallel": tc.parallel, "json": true}))
		if rc != 0 {
			t.Fatalf("%s: exit %d: %s", tc.parallel, rc, errs)
		}
		var r fit.Report
		if err := json.Unmarshal([]byte(out), &r); err != nil {
			t.Fatal(err)
		}
		b := r.Breakdown
		if r.LargestBatch == nil || *r.LargestBatch < tc.largestMin || r.Parallel != tc.parallel || b == nil {
			t.Fatalf("%s: largest %v, parallel %q, breakdown %v", tc.parallel, r.LargestBatch, r.Parallel, b)
		}
		// AdamW's two moments of each chunk (a moment's block may keep
		// an unsplit remainder under 1 MiB, as the caching allocator
		// keeps it)
		tensors := int64(2 * (layers*9 + 3))
		if b.OptimizerState < 2*tc.params || b.OptimizerState >= 2*tc.params+tensors<<20 {
			t.Errorf("%s: optimizer state %d, closed form %d", tc.parallel, b.OptimizerState, 2*tc.params)
		}
		if !tc.breakdown {
			// FSDP2 over 2 ranks: every chunk's dim 0 is even, so half
			if b.Communication == 0 {
				t.Errorf("%s: no FSDP2 buffers at the peak", tc.parallel)
			}
			continue
		}
		if b.Parameters != params+512 || b.Communication != 0 {
			t.Errorf("%s: breakdown %+v, want parameters %d (and the rotary buffer)", tc.parallel, b, params)
		}
		// Megatron's 18 bytes a parameter (bf16 weights, fp32 main
		// gradients, fp32 master and two moments) against PyTorch's
		// AdamW under autocast: fp32 weights, gradients and two moments,
		// 16; and its activations (sequence parallelism, selective
		// recomputation, vocabulary-parallel loss) against memsh's
		// measure of transformers' model (the gathered inputs saved for
		// the projections' backward, the loss on all-gathered logits):
		// not comparable, stated in bench/README.md
		mc.microBatch = *r.LargestBatch
		t.Logf("%s at batch %d: model state %.2f GiB (Megatron %.2f GiB); activations and temporaries %.2f GiB (Megatron's activations %.2f GiB)",
			tc.parallel, mc.microBatch, float64(b.Parameters+b.OptimizerState+b.Gradients)/(1<<30),
			megatronShardParameters(mc)*megatronBytesPerParameter(mc)/(1<<30),
			float64(b.Activations+b.Temporaries)/(1<<30), megatronActivations(mc)/(1<<30))
	}
	// a sequence search splits every sequence evenly over the ranks
	rc, out, errs := runMain(t, options("llama-3.2-1b", map[string]any{"gpus": 2, "parallel": "tp=2", "batch": 16, "json": true}))
	if rc != 0 {
		t.Fatalf("seq search: exit %d: %s", rc, errs)
	}
	var sq fit.Report
	if err := json.Unmarshal([]byte(out), &sq); err != nil {
		t.Fatal(err)
	}
	if sq.LargestSeq == nil || *sq.LargestSeq%2 != 0 || len(sq.Trials) < 3 {
		t.Fatalf("seq search: longest %v, %d trials", sq.LargestSeq, len(sq.Trials))
	}
	for _, tr := range sq.Trials {
		if tr.Value%2 != 0 {
			t.Errorf("seq search: trial at %d tokens, not a multiple of 2", tr.Value)
		}
	}
	// on two T4s nothing fits: the floor is the chunks of tp=2, in
	// float32 (fp16 autocast): parameters, gradients, two moments; every
	// weight's split dim is even, the 65 norms whole
	rc, out, errs = runMain(t, options("llama-3.1-8b", map[string]any{"gpus": 2, "parallel": "tp=2", "gpu": "T4", "json": true}))
	if rc != 0 {
		t.Fatalf("T4: exit %d: %s", rc, errs)
	}
	var r fit.Report
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatal(err)
	}
	const all = (8030261248-norms)*4/2 + norms*4
	if f := r.Floor; r.LargestBatch != nil || f == nil || f.Parameters != all || f.Gradients != all || f.OptimizerState != 2*all {
		t.Errorf("T4: largest %v, floor %+v; want parameters and gradients %d, optimizer state %d", r.LargestBatch, r.Floor, all, 2*all)
	}
}

// --parallel zero1/zero2: DeepSpeed's engine on 4 H100s trains Llama 3.1
// 8B; at the peak rank 0 holds the flat bfloat16 parameters (2·Ψ bytes:
// Ψ is a multiple of 2N, no pad) and the fp32 master partition with
// FusedAdam's two moments (12·Ψ/N bytes), exactly.
func TestZeRO(t *testing.T) {
	for _, stage := range []string{"zero1", "zero2"} {
		rc, out, errs := runMain(t, options("llama-3.1-8b", map[string]any{"gpus": 4, "parallel": stage, "json": true}))
		if rc != 0 {
			t.Fatalf("%s: exit %d: %s", stage, rc, errs)
		}
		var r fit.Report
		if err := json.Unmarshal([]byte(out), &r); err != nil {
			t.Fatal(err)
		}
		const psi = 8030261248
		if r.LargestBatch == nil || r.Breakdown == nil || r.Breakdown.Parameters != 2*psi+512 || r.Breakdown.OptimizerState != 12*psi/4 {
			t.Errorf("%s: largest %v, breakdown %+v; want parameters %d, optimizer state %d", stage, r.LargestBatch, r.Breakdown, 2*psi+512, 12*psi/4)
		}
	}
}

// paramShapes builds gpt2-small on a meta simulator and returns its
// parameters' shapes (tied ones once, as named_parameters lists them).
func paramShapes(t *testing.T) [][]int {
	t.Helper()
	s, out := metaSession(t)
	if err := s.Exec("shapes.star", `load("models/gpt2.star", "gpt2", "GPT2_SMALL")
S = [list(p.shape) for _, p in gpt2(device = "cuda", **GPT2_SMALL).named_parameters()]
`); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	var shapes [][]int
	l := s.Get("S").(*starlark.List)
	for i := range l.Len() {
		var shape []int
		sl := l.Index(i).(*starlark.List)
		for j := range sl.Len() {
			n, _ := starlark.AsInt32(sl.Index(j))
			shape = append(shape, n)
		}
		shapes = append(shapes, shape)
	}
	return shapes
}

// roundBlock is the caching allocator's 512-byte rounding.
func roundBlock(n uint64) uint64 { return (n + 511) / 512 * 512 }

// stateClosedForm is the state each --optimizer keeps for float32
// parameters of shapes, by tensor/optim's closed forms: on the device,
// and in bitsandbytes' paged memory; large is how many of the device
// tensors are over 1 MiB (see TestOptimizers).
func stateClosedForm(name string, shapes [][]int) (device, paged int64, large int) {
	var d, pg uint64
	maps := false
	big := func(n uint64) {
		if n > 1<<20 {
			large++
		}
	}
	for _, shape := range shapes {
		numel := uint64(1)
		for _, n := range shape {
			numel *= uint64(n)
		}
		switch name {
		case "adamw_torch", "adam":
			d += 2 * roundBlock(4*numel)
			big(4 * numel)
			big(4 * numel)
		case "adamw_torch_fused":
			d += 2*roundBlock(4*numel) + 512 // and the 0-dim float32 step
			big(4 * numel)
			big(4 * numel)
		case "adamw_bnb_8bit", "paged_adamw_8bit":
			dd, pp := optim.Adam8bitStateBytes(numel, optim.Default8bitMinSize, name == "paged_adamw_8bit", roundBlock)
			d, pg = d+dd, pg+pp
			maps = maps || numel >= optim.Default8bitMinSize
			if pp == 0 && numel >= optim.Default8bitMinSize {
				big(numel) // state1, state2: uint8
				big(numel)
			}
		case "adafactor":
			d += optim.HFAdafactorStateBytes(shape, false, roundBlock) + 512 // and the 0-dim RMS
		}
	}
	if maps {
		d += 2 * 1024 // qmap1, qmap2: float32 [256]
	}
	return int64(d), int64(pg), large
}

// Each --optimizer (Hugging Face Trainer's optim names) trains with its
// optimizer: the breakdown's optimizer state, measured at the peak of
// gpt2-small's second step, is its closed form to the byte where every
// state tensor is 1 MiB or less (Adafactor's factored moments; the paged
// optimizer's device part, its paged state reported apart); above 1 MiB
// the caching allocator hands out a cached or new block without splitting
// off a remainder of 1 MiB or less (PyTorch's should_split for the large
// pool), and the breakdown counts blocks, so each such tensor may add up
// to 1 MiB over its closed form. The report names the optimizer.
func TestOptimizers(t *testing.T) {
	shapes := paramShapes(t)
	if len(shapes) != 148 {
		t.Fatalf("%d parameters in gpt2-small, want 148", len(shapes))
	}
	measured := map[string]int64{}
	defer func() {
		// fused=True adds only the 0-dim step per parameter
		if d := measured["adamw_torch_fused"] - measured["adamw_torch"]; d != 148*512 {
			t.Errorf("fused AdamW keeps %d bytes more than foreach AdamW, want 148 × 512", d)
		}
	}()
	for _, tc := range []struct {
		flag, name, precision string
	}{
		{"adamw_torch", "adamw_torch", "bf16"},
		{"adamw_torch_fused", "adamw_torch_fused", "bf16"},
		{"adamw_bnb_8bit", "adamw_bnb_8bit", "bf16"},
		{"paged_adamw_8bit", "paged_adamw_8bit", "bf16"},
		{"adafactor", "adafactor", "bf16"},
		{"sgd", "sgd", "bf16"},
		// GradScaler.step runs the step inside nn.track's optimizer hooks:
		// the state is optimizer state (unscale_ then step; the fused
		// kernel's own scaling)
		{"adamw_torch", "adamw_torch", "fp16"},
		{"adamw_torch_fused", "adamw_torch_fused", "fp16"},
	} {
		t.Run(tc.flag+"/"+tc.precision, func(t *testing.T) {
			rc, out, errs := runMain(t, options("gpt2-small", map[string]any{"gpu": "L4", "batch": 4, "optimizer": tc.flag, "precision": tc.precision, "json": true}))
			if rc != 0 {
				t.Fatalf("exit %d: %s", rc, errs)
			}
			var r fit.Report
			if err := json.Unmarshal([]byte(out), &r); err != nil {
				t.Fatal(err)
			}
			if r.Optimizer != tc.name {
				t.Errorf("optimizer %q, want %q", r.Optimizer, tc.name)
			}
			if r.LargestSeq == nil || *r.LargestSeq != 1024 {
				t.Fatalf("largest sequence %v, want 1024", r.LargestSeq)
			}
			dev, paged, large := stateClosedForm(tc.name, shapes)
			b := r.Breakdown
			if b.OptimizerStatePaged != paged || b.OptimizerState < dev || b.OptimizerState > dev+int64(large)<<20 || (large == 0 && b.OptimizerState != dev) {
				t.Errorf("optimizer state %d on the device, %d paged; closed forms %d (%d tensors over 1 MiB), %d", b.OptimizerState, b.OptimizerStatePaged, dev, large, paged)
			}
			if tc.precision == "bf16" {
				measured[tc.name] = b.OptimizerState
			}
			if sum := b.Parameters + b.Gradients + b.OptimizerState + b.Activations + b.Temporaries + b.Workspaces + b.Other; sum != r.Peak.Allocated {
				t.Errorf("breakdown sums to %d, peak allocated %d", sum, r.Peak.Allocated)
			}
		})
	}
}

// adamw, fit's name before the Trainer's, is adamw_torch.
func TestOptimizerAlias(t *testing.T) {
	o := options("gpt2-small", map[string]any{"optimizer": "adamw"})
	m, err := fit.Resolve(o.Source, scripts.Library)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := o.Validate(m); err != nil || o.Optimizer != "adamw_torch" {
		t.Errorf("--optimizer adamw: %q, %v; want adamw_torch", o.Optimizer, err)
	}
}

// When nothing fits, the floor's optimizer state is the closed form
// (paged state apart, not in the total), and the advice tries the
// optimizers that keep less on the device.
func TestOptimizerFloorAndAdvice(t *testing.T) {
	shapes := paramShapes(t)
	for _, name := range []string{"adamw_torch", "paged_adamw_8bit"} {
		rc, out, errs := runMain(t, options("gpt2-small", map[string]any{"gpu": "1GiB", "seq": 256, "optimizer": name, "json": true}))
		if rc != 0 {
			t.Fatalf("%s: exit %d: %s", name, rc, errs)
		}
		var r fit.Report
		if err := json.Unmarshal([]byte(out), &r); err != nil {
			t.Fatal(err)
		}
		f := r.Floor
		if f == nil {
			t.Fatalf("%s: no floor (largest batch %v)", name, r.LargestBatch)
		}
		dev, paged, _ := stateClosedForm(name, shapes)
		if f.OptimizerState != dev || f.OptimizerStatePaged != paged || f.Total != f.Parameters+f.Gradients+dev {
			t.Errorf("%s: floor %+v, closed forms %d on the device, %d paged", name, f, dev, paged)
		}
		tried := map[string]bool{}
		for _, a := range r.Advice {
			if opt, ok := strings.CutPrefix(a.Change, "optimizer "); ok {
				tried[strings.Fields(opt)[0]] = a.Modelled
			}
		}
		want := map[string]bool{"adafactor": true, "sgd": true}
		if name == "adamw_torch" {
			want["adamw_bnb_8bit"] = true
			if _, ok := tried["paged_adamw_8bit"]; ok {
				want["paged_adamw_8bit"] = true // tried when the 8-bit one does not fit
			}
		}
		if !reflect.DeepEqual(tried, want) {
			t.Errorf("%s: optimizers tried %v, want %v", name, tried, want)
		}
	}
}

// metaSession is a Session on the H100 preset's meta simulator with the
// model library, closed when the test ends, and its output.
func metaSession(t *testing.T) (*scope.Session, *bytes.Buffer) {
	t.Helper()
	out := &bytes.Buffer{}
	s, err := scope.New(scope.Options{Device: "sim:H100,meta", Out: out, Err: out, Library: scripts.Library})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, out
}

// The advice's searches run at once, each in a Session of its own
// (searchAll): the answers equal those of running them one after another
// — both waves (the paged 8-bit optimizer runs after the unpaged one did
// not fit). .ci/run runs it under the race detector.
func TestAdviceConcurrent(t *testing.T) {
	o := options("gpt2-small", map[string]any{"gpu": "1GiB", "seq": 128, "json": true})
	advice := func(workers int) []fit.Alternative {
		defer fit.SetAdviceWorkers(workers)()
		rc, out, errs := runMain(t, o)
		if rc != 0 {
			t.Fatalf("workers %d: exit %d: %s", workers, rc, errs)
		}
		var r fit.Report
		if err := json.Unmarshal([]byte(out), &r); err != nil {
			t.Fatal(err)
		}
		return r.Advice
	}
	one, four := advice(1), advice(4)
	if !reflect.DeepEqual(one, four) {
		t.Errorf("advice one search at a time:\n%+v\nfour at once:\n%+v", one, four)
	}
	changes := map[string]fit.Alternative{}
	for _, a := range four {
		changes[a.Change] = a
	}
	if a, ok := changes["optimizer paged_adamw_8bit"]; !ok || !a.Modelled {
		t.Errorf("the paged optimizer (wave 2) is missing: %+v", four)
	}
	if len(four) < 8 {
		t.Errorf("%d alternatives: %+v", len(four), four)
	}
}

// --search-mode interpolate ends at binsearch's boundary, with the same
// figures measured there, in fewer trials, on models whose sizes that
// train are an interval; an unknown mode is a usage error (TestUsageErrors).
func TestSearchModes(t *testing.T) {
	for _, src := range []string{"gpt2-small", "llama-3.2-1b"} {
		var reps [2]fit.Report
		for i, mode := range []string{fit.SearchBinsearch, fit.SearchInterpolate} {
			rc, out, errs := runMain(t, options(src, map[string]any{"json": true, "search-mode": mode}))
			if rc != 0 {
				t.Fatalf("%s --search-mode %s: exit %d: %s", src, mode, rc, errs)
			}
			if err := json.Unmarshal([]byte(out), &reps[i]); err != nil {
				t.Fatal(err)
			}
		}
		b, ip := reps[0], reps[1]
		if b.LargestBatch == nil || ip.LargestBatch == nil || *b.LargestBatch != *ip.LargestBatch || *b.FirstOOM != *ip.FirstOOM {
			t.Errorf("%s: binsearch %v/%v, interpolate %v/%v", src, b.LargestBatch, b.FirstOOM, ip.LargestBatch, ip.FirstOOM)
			continue
		}
		if *b.Peak != *ip.Peak || *b.Breakdown != *ip.Breakdown {
			t.Errorf("%s: the boundary's figures differ: binsearch %+v %+v, interpolate %+v %+v", src, *b.Peak, *b.Breakdown, *ip.Peak, *ip.Breakdown)
		}
		if len(ip.Trials) >= len(b.Trials) {
			t.Errorf("%s: interpolate %d trials %v, binsearch %d", src, len(ip.Trials), ip.Trials, len(b.Trials))
		}
	}
}
