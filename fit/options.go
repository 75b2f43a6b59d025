package fit

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/memsh/memsh/backend/sim"
	"github.com/memsh/memsh/scope"
)

// UsageError is a bad command line: memsh prints it on one line and
// exits 2.
type UsageError struct{ msg string }

func (e *UsageError) Error() string { return e.msg }

func usageErr(format string, args ...any) error {
	return &UsageError{fmt.Sprintf(format, args...)}
}

// IsUsage reports whether err is a usage error.
func IsUsage(err error) bool {
	var u *UsageError
	return errors.As(err, &u)
}

// Options are memsh fit's flags.
type Options struct {
	Source     string // a library name, a config.json or its directory, a .star file
	GPU        string // a preset (H100) or a size (80GiB)
	Seq        int    // sequence length of the batch search (0: the model's default)
	Batch      int    // > 0: search the longest sequence at this batch instead
	Precision  string // fp32, bf16, fp16, bf16-true (Lightning's names accepted)
	Optimizer  string // a Trainer optim name (Optimizers); adamw is adamw_torch
	Checkpoint bool
	Attention  string // eager, sdpa, flash ("" : sdpa)
	// Routing is a Mixture-of-Experts model's routing plan: "balanced"
	// (the default) or "worst" (models/moe.star).
	Routing string
	// Inference: generation under no_grad with a KV cache (KVCache
	// "dynamic" or "static") of MaxNewTokens new tokens after a prompt of
	// Seq tokens, instead of training.
	Inference    bool
	MaxNewTokens int
	KVCache      string
	// GradAccum is the micro-batches of each optimizer step (gradient
	// accumulation; the searched batch is the micro-batch).
	GradAccum int
	// GPUs is the job's GPU count (--gpus; 0 or 1: one GPU) and Parallel
	// how it shares the work (--parallel: ParallelDDP, the default with
	// GPUs > 1): the Session simulates one rank, and the searched batch
	// is each rank's micro-batch.
	GPUs     int
	Parallel string
	// TP is the tensor-parallel degree of --parallel tp=T[,fsdp] (0:
	// none), TPFSDP whether FSDP2 shards over the other GPUs/T ranks
	// (2-D, torchtitan's dp_shard × tp mesh).
	TP     int
	TPFSDP bool
	// Finetune is what trains: FinetuneFull (every parameter),
	// FinetuneLoRA (PEFT's LoRA adapters on the frozen model) or
	// FinetuneQLoRA (LoRA on a model whose linear layers but lm_head are
	// bitsandbytes' NF4 Linear4bit, prepared by
	// prepare_model_for_kbit_training). "" is full.
	Finetune string
	// The LoRA adapters (PEFT's LoraConfig): rank, lora_alpha,
	// lora_dropout and target_modules — comma-separated module names
	// or "all-linear"; "" is PEFT's default for the model type.
	LoRAR       int
	LoRAAlpha   float64
	LoRADropout float64
	LoRATargets string
	// loraTargets is LoRATargets resolved by Validate: the names, or
	// ["all-linear"].
	loraTargets []string
	// SearchMode is how the searches choose their trials (sweep.max_fit's
	// mode): "binsearch" (the default: PyTorch Lightning's batch-size
	// finder, doubling then bisection, the trials a card's search made)
	// or "interpolate" (fewer trials, bounded by the trials' peaks: the
	// same boundary where the sizes that train are an interval; where the
	// caching allocator's blocks make them not one, possibly another).
	SearchMode string
	JSON       bool
	Out        string // --out FILE.jsonl: the trials' records
	// Set records which flags the user gave (so an error never mentions
	// a flag they did not type).
	Set map[string]bool
	// Started, when set, is told of each Session fit opens (the search,
	// and each alternative of the advice: several run at once), so that
	// Ctrl-C can interrupt them; fit calls the function it returns when
	// that Session closes.
	Started func(*scope.Session) (closed func())
}

// Search modes (Options.SearchMode): sweep.max_fit's modes fit searches
// with.
const (
	SearchInterpolate = "interpolate"
	SearchBinsearch   = "binsearch"
)

// Precisions memsh fit trains in.
const (
	PrecFP32     = "fp32"      // everything in float32 (Lightning's "32-true")
	PrecBF16     = "bf16"      // autocast to bfloat16, float32 weights and states ("bf16-mixed")
	PrecFP16     = "fp16"      // autocast to float16 with a GradScaler ("16-mixed")
	PrecBF16True = "bf16-true" // parameters, gradients and optimizer state in bfloat16, no autocast
)

var precisionAlias = map[string]string{
	"fp32": PrecFP32, "32": PrecFP32, "32-true": PrecFP32, "float32": PrecFP32,
	"bf16": PrecBF16, "bf16-mixed": PrecBF16,
	"fp16": PrecFP16, "16": PrecFP16, "16-mixed": PrecFP16,
	"bf16-true": PrecBF16True,
}

// Optimizer is one optimizer memsh fit trains with, by the name Hugging
// Face Trainer's optim takes (TrainingArguments.optim), and how the
// driver (driver.star's make_optimizer) builds it.
type Optimizer struct {
	Name  string // the Trainer's optim name
	Title string // the report's words
	// Saver is an optimizer the advice tries instead of a bigger one: it
	// keeps less state per parameter than AdamW's two float32 moments.
	Saver bool
}

// Optimizers are --optimizer's names: the Trainer's (adamw_torch first,
// the default), then fit's own adam. adamw is an alias of adamw_torch.
var Optimizers = []Optimizer{
	{Name: OptAdamWTorch, Title: "AdamW (torch.optim.AdamW, foreach)"},
	{Name: OptAdamWFused, Title: "AdamW fused (torch.optim.AdamW, fused=True)"},
	{Name: OptAdamW8bit, Title: "8-bit AdamW (bitsandbytes AdamW8bit)", Saver: true},
	{Name: OptPagedAdamW8bit, Title: "paged 8-bit AdamW (bitsandbytes PagedAdamW8bit)", Saver: true},
	{Name: OptAdafactor, Title: "Adafactor (transformers', scale_parameter=False, relative_step=False)", Saver: true},
	{Name: OptSGD, Title: "SGD (momentum 0: no state)", Saver: true},
	{Name: OptAdam, Title: "Adam (torch.optim.Adam, foreach)"},
}

// The optimizers' names.
const (
	OptAdamWTorch     = "adamw_torch"
	OptAdamWFused     = "adamw_torch_fused"
	OptAdamW8bit      = "adamw_bnb_8bit"
	OptPagedAdamW8bit = "paged_adamw_8bit"
	OptAdafactor      = "adafactor"
	OptSGD            = "sgd"
	OptAdam           = "adam"
)

// LookupOptimizer finds --optimizer's name (adamw is adamw_torch).
func LookupOptimizer(name string) (Optimizer, bool) {
	if name == "adamw" {
		name = OptAdamWTorch
	}
	for _, o := range Optimizers {
		if o.Name == name {
			return o, true
		}
	}
	return Optimizer{}, false
}

// optimizerList is the accepted names, for a usage error.
func optimizerList() string {
	var names []string
	for _, o := range Optimizers {
		names = append(names, o.Name)
	}
	return strings.Join(names[:len(names)-1], ", ") + " or " + names[len(names)-1]
}

// What --finetune trains.
const (
	FinetuneFull  = "full"
	FinetuneLoRA  = "lora"
	FinetuneQLoRA = "qlora"
)

// --parallel's strategies.
const (
	// ParallelDDP is torch.nn.parallel.DistributedDataParallel with its
	// defaults (bucket_cap_mb=25, gradient_as_bucket_view=False,
	// find_unused_parameters=False), gradient accumulation under no_sync.
	ParallelDDP = "ddp"
	// ParallelFSDP is FSDP2 as torchtitan applies it: fully_shard on each
	// block and on the root, reshard_after_forward=True, bf16 through
	// MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32);
	// gradient accumulation reduce-scatters every micro-batch.
	ParallelFSDP = "fsdp"
	// ParallelFSDPOffload is ParallelFSDP with CPUOffloadPolicy (pinned):
	// the shards, their gradients and AdamW's states in host memory, the
	// optimizer stepping on the CPU; the model built on the meta device
	// and materialized with to_empty(device="cpu") (torchtitan's
	// enable_cpu_offload), its buffers on the GPU.
	ParallelFSDPOffload = "fsdp,offload"
	// ParallelZeRO1 and ParallelZeRO2 are DeepSpeed's engine with ZeRO
	// stage 1 or 2 (DeepSpeed 0.19: reduce_bucket_size 5e8, FusedAdam;
	// bf16 casts the model).
	ParallelZeRO1 = "zero1"
	ParallelZeRO2 = "zero2"
	// ParallelZeRO3 is DeepSpeed's engine with ZeRO stage 3 (DeepSpeed
	// 0.19's defaults: the model built as zero.Init builds it, each
	// parameter partitioned, gathered around its module's forward and
	// backward by the coordinator; FusedAdam; bf16 casts the model).
	ParallelZeRO3 = "zero3"
	// ParallelTP ("tp=T", "tp=T,fsdp") is tensor parallelism over T
	// GPUs as torchtitan's apply_tp plans a Llama-family model with
	// loss parallelism disabled (attention and MLP projections
	// ColwiseParallel/RowwiseParallel, norms SequenceParallel, the
	// embedding's vocabulary and lm_head's rows sharded, the logits
	// all-gathered), bf16 under autocast; with ",fsdp" also FSDP2 over
	// GPUs/T ranks on each block and the root, bf16 through its
	// MixedPrecisionPolicy.
	ParallelTP = "tp="
)

// LoRA's defaults: PEFT's LoraConfig (r=8, lora_alpha=8, lora_dropout=0.0).
const (
	DefaultLoRAR     = 8
	DefaultLoRAAlpha = 8
)

// loraDefaultTargets is PEFT's TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING
// (peft/utils/constants.py) for the model types memsh builds; a type it
// does not list has no default (PEFT asks for target_modules).
var loraDefaultTargets = map[string][]string{
	"llama": {"q_proj", "v_proj"}, "mistral": {"q_proj", "v_proj"}, "mixtral": {"q_proj", "v_proj"},
	"qwen2": {"q_proj", "v_proj"}, "qwen3": {"q_proj", "v_proj"},
	"gemma2": {"q_proj", "v_proj"}, "gemma3_text": {"q_proj", "v_proj"},
	"gpt2": {"c_attn"},
}

// LoRATargetList returns the target modules Validate resolved.
func (o *Options) LoRATargetList() []string { return o.loraTargets }

// Model is a resolved SOURCE.
type Model struct {
	Name  string // the library name, or the file's path
	Title string
	Kind  Kind
	Entry *Entry    // a library model
	HF    *HFConfig // KindHF
	Star  string    // KindStar: the .star file
	// Sequence is whether the model takes a sequence (an LM); MaxSeq its
	// longest (0: unknown until the .star file is loaded).
	Sequence   bool
	MaxSeq     int
	DefaultSeq int
	starNames  []string // the optional names a .star model defines
}

// DefaultSeqCap is the sequence length a search uses when --seq is not
// given and the model allows longer: 2048, or the model's longest.
const DefaultSeqCap = 2048

// Resolve finds what SOURCE names: a .star file, a config.json (or a
// directory holding one), or a library model.
func Resolve(src string, lib fs.FS) (*Model, error) {
	if src == "" {
		return nil, usageErr("no model given")
	}
	if strings.HasSuffix(src, ".star") {
		fi, err := os.Stat(src)
		if err != nil {
			return nil, usageErr("%s: %v", src, unwrapPath(err))
		}
		if !fi.Mode().IsRegular() {
			return nil, usageErr("%s: not a regular file", src)
		}
		return &Model{Name: src, Title: filepath.Base(src), Kind: KindStar, Star: src}, nil
	}
	if fi, err := os.Stat(src); err == nil && (fi.IsDir() || strings.HasSuffix(src, ".json")) {
		c, err := ReadHFConfig(src)
		if err != nil {
			return nil, err
		}
		m := hfModel(src, filepath.Base(filepath.Dir(c.Path))+" ("+c.ModelType+" config)", c)
		return m, nil
	} else if strings.HasSuffix(src, ".json") {
		return nil, usageErr("%s: %v", src, unwrapPath(err))
	}
	e, ok := LookupLibrary(src)
	if !ok {
		return nil, unknownModel(src)
	}
	switch e.Kind {
	case KindHF:
		c, err := libraryConfig(lib, e)
		if err != nil {
			return nil, fmt.Errorf("library config %s: %v", e.Config, err)
		}
		m := hfModel(e.Name, e.Title, c)
		m.Entry = &e
		return m, nil
	case KindNanoGPT:
		return &Model{Name: e.Name, Title: e.Title, Kind: e.Kind, Entry: &e, Sequence: true, MaxSeq: 1024, DefaultSeq: 1024}, nil
	}
	return &Model{Name: e.Name, Title: e.Title, Kind: e.Kind, Entry: &e}, nil
}

func hfModel(name, title string, c *HFConfig) *Model {
	def := DefaultSeqCap
	if c.MaxPositions > 0 {
		def = min(def, c.MaxPositions)
	}
	return &Model{Name: name, Title: title, Kind: KindHF, HF: c, Sequence: true, MaxSeq: c.MaxPositions, DefaultSeq: def}
}

// Validate checks the options against the model and the card, before any
// Starlark runs. It normalises Precision and Attention, and returns
// warnings (a card without the precision asked for) to print.
func (o *Options) Validate(m *Model) (warnings []string, err error) {
	if o.Inference {
		if err := o.validateInference(m); err != nil {
			return nil, err
		}
	}
	p, ok := precisionAlias[strings.ToLower(o.Precision)]
	if !ok {
		return nil, usageErr("--precision: want fp32, bf16, fp16 or bf16-true (Lightning's 32-true, bf16-mixed, 16-mixed), got %q", o.Precision)
	}
	o.Precision = p
	opt, ok := LookupOptimizer(o.Optimizer)
	if !ok {
		return nil, usageErr("--optimizer: want %s (Hugging Face Trainer's optim names; adamw is adamw_torch), got %q", optimizerList(), o.Optimizer)
	}
	o.Optimizer = opt.Name
	if o.Attention == "" {
		o.Attention = "sdpa"
	}
	switch o.Attention {
	case "eager", "sdpa", "flash":
	case "flash_attention_2":
		o.Attention = "flash"
	default:
		return nil, usageErr("--attention: want eager, sdpa or flash (Hugging Face's attn_implementation names), got %q", o.Attention)
	}
	switch o.SearchMode {
	case "":
		o.SearchMode = SearchBinsearch
	case SearchInterpolate, SearchBinsearch:
	default:
		return nil, usageErr("--search-mode: want interpolate or binsearch (PyTorch Lightning's batch-size finder), got %q", o.SearchMode)
	}
	switch o.Routing {
	case "":
		o.Routing = "balanced"
	case "balanced", "worst":
	default:
		return nil, usageErr("--routing: want balanced or worst (a Mixture-of-Experts model's tokens per expert: even, or all on the same experts), got %q", o.Routing)
	}
	if o.Set["routing"] && (m.HF == nil || !m.HF.IsMoE()) {
		return nil, usageErr("--routing: %s has no Mixture-of-Experts layers (mixtral, qwen2_moe, qwen3_moe configs have)", m.Name)
	}
	if m.Kind == KindResNet && o.Set["attention"] {
		return nil, usageErr("--attention: %s has no attention", m.Name)
	}
	if m.Kind == KindStar && o.Set["attention"] {
		return nil, usageErr("--attention: a .star model chooses its own attention (its build())")
	}
	if o.Set["grad-accum"] {
		if o.Inference {
			return nil, usageErr("--grad-accum: a training option; --inference generates under no_grad")
		}
		if o.GradAccum < 1 {
			return nil, usageErr("--grad-accum: want a positive integer, got %d", o.GradAccum)
		}
	}
	if err := o.validateFinetune(m); err != nil {
		return nil, err
	}
	if err := o.validateParallel(); err != nil {
		return nil, err
	}
	if err := o.validateTPModel(m); err != nil {
		return nil, err
	}
	if o.Set["seq"] && o.Seq < 1 {
		return nil, usageErr("--seq: want a positive integer, got %d", o.Seq)
	}
	if o.Set["batch"] && o.Batch < 1 {
		return nil, usageErr("--batch: want a positive integer, got %d", o.Batch)
	}
	if !m.Sequence && m.Kind != KindStar {
		if o.Set["seq"] {
			return nil, usageErr("--seq: %s takes no sequence (an image model)", m.Name)
		}
		if o.Set["batch"] {
			return nil, usageErr("--batch: searching the longest sequence at a batch needs a sequence model; %s is an image model", m.Name)
		}
	}
	if m.MaxSeq > 0 && o.Seq > m.MaxSeq {
		return nil, usageErr("--seq %d: %s takes at most %d positions (max_position_embeddings)", o.Seq, m.Name, m.MaxSeq)
	}
	if o.Inference && m.MaxSeq > 0 && o.Seq+o.MaxNewTokens > m.MaxSeq {
		return nil, usageErr("--seq %d + --max-new-tokens %d: %s takes at most %d positions (max_position_embeddings)", o.Seq, o.MaxNewTokens, m.Name, m.MaxSeq)
	}
	preset, err := parseGPU(o.GPU, o.Set["gpu"])
	if err != nil {
		return nil, err
	}
	if preset != nil {
		cc := preset.ComputeCapability()
		if (o.Precision == PrecBF16 || o.Precision == PrecBF16True) && cc[0] < 8 {
			warnings = append(warnings, fmt.Sprintf("warning: %s (sm%d%d) has no bfloat16 (torch.cuda.is_bf16_supported() is False; autocast refuses it): training in fp16 with a GradScaler instead", preset.Name, cc[0], cc[1]))
			o.Precision = PrecFP16
		}
		if o.Attention == "flash" && cc[0] < 8 {
			return nil, usageErr("--attention flash: FlashAttention-2 needs sm80 or newer; %s is sm%d%d", preset.Name, cc[0], cc[1])
		}
	}
	if (o.fsdp() || o.TPFSDP) && o.Precision == PrecFP16 {
		return nil, usageErr("--parallel %s with fp16: FSDP2's loss scaling (a sharded GradScaler) is not modelled; use bf16 (on a card without bfloat16: fp32)", o.Parallel)
	}
	if o.zero() && (o.Precision == PrecFP16 || o.Precision == PrecBF16True) {
		return nil, usageErr("--parallel %s with %s: DeepSpeed's bf16 (--precision bf16) or fp32 are modelled", o.Parallel, o.Precision)
	}
	return warnings, nil
}

// modelType is the model's Hugging Face model_type ("gpt2" for the
// library's nanoGPT models; "" for others).
func modelType(m *Model) string {
	switch {
	case m.HF != nil:
		return m.HF.ModelType
	case m.Kind == KindNanoGPT:
		return "gpt2"
	}
	return ""
}

// validateFinetune checks --finetune and the --lora-* options and
// resolves the LoRA targets.
func (o *Options) validateFinetune(m *Model) error {
	switch o.Finetune {
	case "", FinetuneFull:
		o.Finetune = FinetuneFull
		for _, f := range []string{"lora-r", "lora-alpha", "lora-dropout", "lora-targets"} {
			if o.Set[f] {
				return usageErr("--%s: a LoRA option; give --finetune lora or qlora", f)
			}
		}
		return nil
	case FinetuneLoRA, FinetuneQLoRA:
	default:
		return usageErr("--finetune: want full, lora or qlora (LoRA adapters on the frozen model; on its linear layers in 4-bit NF4), got %q", o.Finetune)
	}
	if o.Inference {
		return usageErr("--finetune: a training option; --inference generates under no_grad")
	}
	mt := modelType(m)
	switch {
	case m.Kind == KindResNet:
		return usageErr("--finetune %s: modelled for language models; %s is an image model", o.Finetune, m.Name)
	case o.Finetune == FinetuneQLoRA && (m.Kind != KindHF || mt == "gpt2"):
		return usageErr("--finetune qlora: 4-bit layers are modelled for the Llama-family configs (llama, mistral, qwen2, qwen3, gemma2, gemma3, phi3, mixtral, qwen2_moe, qwen3_moe); %s is not one", m.Name)
	case m.Kind == KindHF && mt == "gpt2":
		return usageErr("--finetune lora: GPT-2's Conv1D projections (c_attn) are not nn.Linear, which memsh's LoRA wraps; the library's gpt2-* models (nanoGPT, nn.Linear) take LoRA")
	}
	if o.LoRAR == 0 && !o.Set["lora-r"] {
		o.LoRAR = DefaultLoRAR
	}
	if o.LoRAAlpha == 0 && !o.Set["lora-alpha"] {
		o.LoRAAlpha = DefaultLoRAAlpha
	}
	if o.LoRAR < 1 {
		return usageErr("--lora-r: want a positive integer (the adapters' rank), got %d", o.LoRAR)
	}
	if !(o.LoRAAlpha > 0) {
		return usageErr("--lora-alpha: want a positive number (scaling = alpha / r), got %v", o.LoRAAlpha)
	}
	if !(o.LoRADropout >= 0 && o.LoRADropout < 1) {
		return usageErr("--lora-dropout: want a probability in [0, 1), got %v", o.LoRADropout)
	}
	if o.Finetune == FinetuneQLoRA && !o.Set["checkpoint"] {
		// the QLoRA recipe: prepare_model_for_kbit_training's
		// use_gradient_checkpointing=True (--checkpoint=false says no)
		o.Checkpoint = true
	}
	o.loraTargets = nil
	if o.LoRATargets == "" {
		t, ok := loraDefaultTargets[mt]
		if !ok {
			what := m.Name
			if mt != "" {
				what = "model_type " + mt
			}
			return usageErr("--lora-targets: PEFT has no default target modules for %s: name them (comma-separated, or all-linear)", what)
		}
		o.loraTargets = t
		return nil
	}
	for _, t := range strings.Split(o.LoRATargets, ",") {
		t = strings.TrimSpace(t)
		if t == "" {
			return usageErr("--lora-targets: an empty module name in %q (comma-separated names, or all-linear)", o.LoRATargets)
		}
		o.loraTargets = append(o.loraTargets, t)
	}
	if slices.Contains(o.loraTargets, "all-linear") && len(o.loraTargets) > 1 {
		return usageErr("--lora-targets: all-linear stands alone, got %q", o.LoRATargets)
	}
	return nil
}

// validateParallel checks --gpus and --parallel: a positive count, a
// strategy memsh models, DDP by default on more than one GPU, training
// only.
func (o *Options) validateParallel() error {
	if o.Set["gpus"] && o.GPUs < 1 {
		return usageErr("--gpus: want a positive integer (the job's GPUs), got %d", o.GPUs)
	}
	if o.GPUs < 1 {
		o.GPUs = 1
	}
	switch o.Parallel {
	case "":
		if o.GPUs > 1 {
			o.Parallel = ParallelDDP
		}
	case ParallelDDP, ParallelFSDP, ParallelFSDPOffload, ParallelZeRO1, ParallelZeRO2, ParallelZeRO3:
		if !o.Set["gpus"] {
			return usageErr("--parallel %s: give the job's GPUs (--gpus N)", o.Parallel)
		}
	default:
		if strings.HasPrefix(o.Parallel, ParallelTP) {
			if err := o.validateTP(); err != nil {
				return err
			}
			break
		}
		return usageErr("--parallel: want ddp (DistributedDataParallel), fsdp or fsdp,offload (FSDP2's fully_shard, with CPU offload), zero1, zero2 or zero3 (DeepSpeed's ZeRO), tp=T or tp=T,fsdp (tensor parallelism, 2-D with FSDP2), got %q", o.Parallel)
	}
	if o.zero() {
		switch {
		case o.Optimizer != OptAdamWTorch && o.Optimizer != OptAdam && o.Set["optimizer"]:
			return usageErr("--parallel %s --optimizer %s: memsh models DeepSpeed's FusedAdam (adamw_torch or adam)", o.Parallel, o.Optimizer)
		case o.GradAccum > 1:
			return usageErr("--parallel %s --grad-accum: DeepSpeed's gradient accumulation is not modelled", o.Parallel)
		case o.Finetune == FinetuneQLoRA:
			return usageErr("--parallel %s --finetune qlora: not modelled", o.Parallel)
		}
	}
	if o.Parallel != "" && o.Inference {
		return usageErr("--gpus/--parallel: a training option; --inference generates on one GPU")
	}
	if o.fsdp() && o.Finetune == FinetuneQLoRA {
		return usageErr("--parallel %s --finetune qlora: sharding bitsandbytes' 4-bit weights is not modelled", o.Parallel)
	}
	if o.Parallel == ParallelFSDPOffload && o.Set["optimizer"] && o.Optimizer != OptAdamWTorch && o.Optimizer != OptAdam && o.Optimizer != OptSGD {
		return usageErr("--parallel %s --optimizer %s: a CPU step is modelled for torch.optim's AdamW, Adam and SGD", o.Parallel, o.Optimizer)
	}
	return nil
}

// fsdp reports whether --parallel is FSDP2 alone (with or without CPU
// offload).
func (o *Options) fsdp() bool {
	return o.Parallel == ParallelFSDP || o.Parallel == ParallelFSDPOffload
}

// zero reports whether --parallel is one of DeepSpeed's ZeRO stages.
func (o *Options) zero() bool {
	return o.Parallel == ParallelZeRO1 || o.Parallel == ParallelZeRO2 || o.Parallel == ParallelZeRO3
}

// parseTP reads a --parallel value tp=T or tp=T,fsdp.
func parseTP(parallel string) (t int, fsdp, ok bool) {
	rest, ok := strings.CutPrefix(parallel, ParallelTP)
	if !ok {
		return 0, false, false
	}
	rest, fsdp = strings.CutSuffix(rest, ",fsdp")
	t, err := strconv.Atoi(rest)
	return t, fsdp, err == nil && t >= 1
}

// validateTP reads --parallel tp=T[,fsdp]: T divides --gpus (pure
// tensor parallelism on exactly T GPUs without ",fsdp").
func (o *Options) validateTP() error {
	t, fsdp, ok := parseTP(o.Parallel)
	if !ok {
		return usageErr("--parallel %s: want tp=T or tp=T,fsdp with T the tensor-parallel degree, a positive integer", o.Parallel)
	}
	if !o.Set["gpus"] {
		return usageErr("--parallel %s: give the job's GPUs (--gpus N)", o.Parallel)
	}
	switch {
	case fsdp && o.GPUs%t != 0:
		return usageErr("--parallel %s on %d GPUs: the tensor-parallel degree %d must divide the GPUs", o.Parallel, o.GPUs, t)
	case !fsdp && o.GPUs != t:
		return usageErr("--parallel %s on %d GPUs: tensor parallelism alone runs on %d GPUs; for data parallelism over the others use tp=%d,fsdp (2-D)", o.Parallel, o.GPUs, t, t)
	case o.Finetune == FinetuneLoRA || o.Finetune == FinetuneQLoRA:
		return usageErr("--parallel %s --finetune %s: tensor parallelism of PEFT's adapter layers is not modelled", o.Parallel, o.Finetune)
	}
	o.TP, o.TPFSDP = t, fsdp
	o.Parallel = fmt.Sprintf("%s%d", ParallelTP, t)
	if fsdp {
		o.Parallel += ",fsdp"
	}
	return nil
}

// tpModelTypes are the configs whose decoder layers torchtitan's Llama
// plan fits: separate q/k/v and gate/up/down projections, a norm before
// attention and one before the MLP.
var tpModelTypes = []string{"llama", "mistral", "qwen2", "qwen3"}

// validateTPModel checks that --parallel tp= has a model its plan fits.
func (o *Options) validateTPModel(m *Model) error {
	if o.TP == 0 {
		return nil
	}
	if m.Kind != KindHF || m.HF == nil || !slices.Contains(tpModelTypes, m.HF.ModelType) {
		return usageErr("--parallel %s: tensor parallelism is modelled for the Llama-family configs torchtitan's plan fits (%s); %s is not one", o.Parallel, strings.Join(tpModelTypes, ", "), m.Name)
	}
	var c struct {
		Heads   int `json:"num_attention_heads"`
		KVHeads int `json:"num_key_value_heads"`
	}
	if err := json.Unmarshal(m.HF.Raw, &c); err != nil {
		return usageErr("%s: %v", m.Name, err)
	}
	if c.KVHeads == 0 {
		c.KVHeads = c.Heads
	}
	// ColwiseParallel splits q/k/v by rows: whole heads per rank
	for _, h := range []struct {
		name string
		n    int
	}{{"num_attention_heads", c.Heads}, {"num_key_value_heads", c.KVHeads}} {
		if h.n%o.TP != 0 {
			return usageErr("--parallel %s: %s's %s (%d) is not divisible by the tensor-parallel degree %d", o.Parallel, m.Name, h.name, h.n, o.TP)
		}
	}
	return nil
}

// validateInference checks --inference's options: a decoder the
// library generates with, no training flags, and sets its defaults
// (bfloat16 weights unless --precision says otherwise, 128 new tokens, a
// DynamicCache).
func (o *Options) validateInference(m *Model) error {
	if m.Kind != KindHF || m.HF == nil || m.HF.ModelType == "gpt2" {
		return usageErr("--inference: generation with a KV cache is modelled for the Llama-family configs (llama, mistral, qwen2, qwen3, gemma2, gemma3, phi3, and the MoE mixtral, qwen2_moe, qwen3_moe); %s is not one", m.Name)
	}
	for _, f := range []string{"optimizer", "checkpoint"} {
		if o.Set[f] {
			return usageErr("--%s: a training option; --inference generates under no_grad", f)
		}
	}
	if !o.Set["precision"] {
		o.Precision = PrecBF16True
	}
	if !o.Set["max-new-tokens"] {
		o.MaxNewTokens = 128
	}
	if o.MaxNewTokens < 1 {
		return usageErr("--max-new-tokens: want a positive integer, got %d", o.MaxNewTokens)
	}
	switch o.KVCache {
	case "":
		o.KVCache = "dynamic"
	case "dynamic", "static":
	default:
		return usageErr("--kv-cache: want dynamic or static (transformers' DynamicCache, StaticCache), got %q", o.KVCache)
	}
	if !o.Seq0() && m.MaxSeq > 0 {
		// the default prompt leaves room for the new tokens
		m.DefaultSeq = max(1, min(m.DefaultSeq, m.MaxSeq-o.MaxNewTokens))
	}
	return nil
}

// Seq0 reports whether --seq was given.
func (o *Options) Seq0() bool { return o.Set["seq"] }

// parseGPU reads --gpu: a preset key or a size. An unknown one lists the
// presets.
func parseGPU(gpu string, given bool) (*sim.Preset, error) {
	if p, ok := sim.LookupPreset(gpu); ok {
		return &p, nil
	}
	if _, err := sim.ParseSpec(gpu + ",meta"); err == nil && !strings.ContainsAny(gpu, ",x") {
		return nil, nil // a size: sim:80GiB
	}
	var keys []string
	for _, p := range sim.Presets() {
		keys = append(keys, p.Key)
	}
	what := "--gpu"
	if !given {
		what = "the GPU"
	}
	return nil, usageErr("%s: unknown GPU %q (presets: %s; or a size such as 80GiB)", what, gpu, strings.Join(keys, " "))
}
