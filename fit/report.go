package fit

import (
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/memsh/memsh/backend"
	tdist "github.com/memsh/memsh/tensor/dist"
)

// Report is the answer of one `memsh fit`, and its --json object
// (docs/fit.md documents every field; sizes are bytes).
type Report struct {
	Model               string `json:"model"`
	Title               string `json:"title"`
	Source              string `json:"source"` // "library", "config" or "star"
	Parameters          int64  `json:"parameters"`
	TrainableParameters int64  `json:"trainable_parameters"`
	PublishedParameters int64  `json:"published_parameters,omitempty"`
	ParameterDType      string `json:"parameter_dtype"`
	GPU                 string `json:"gpu"`
	Device              string `json:"device"`
	Capacity            int64  `json:"capacity"` // the card's total memory
	Usable              int64  `json:"usable"`   // what the allocator can get: capacity less the context and cuBLAS handles
	Context             int64  `json:"context"`  // capacity − usable: the CUDA context and cuBLAS handles, outside the allocator
	Precision           string `json:"precision"`
	Optimizer           string `json:"optimizer"`
	Checkpoint          bool   `json:"checkpoint"`
	Attention           string `json:"attention"`                // eager, sdpa or flash (what ran)
	AttentionNote       string `json:"attention_note,omitempty"` // why it differs from --attention
	SDPABackend         string `json:"sdpa_backend,omitempty"`   // cudnn, flash, efficient or math
	Routing             string `json:"routing,omitempty"`        // a Mixture-of-Experts model's routing plan: balanced or worst
	Steps               int    `json:"steps"`
	// Finetune is what trains: full, lora or qlora; LoRA describes the
	// adapters (lora, qlora).
	Finetune  string    `json:"finetune"`
	LoRA      *LoRAInfo `json:"lora,omitempty"`
	GradAccum int       `json:"grad_accum,omitempty"` // micro-batches per step (the searched batch is the micro-batch)
	// GPUs and Parallel: --gpus and --parallel ("ddp"); the figures are
	// one rank's, the batch each rank's micro-batch.
	GPUs     int    `json:"gpus,omitempty"`
	Parallel string `json:"parallel,omitempty"`
	// Inference: generation of MaxNewTokens tokens with a KVCache
	// ("dynamic" or "static") instead of training; PrefillPeak is the
	// allocator's peak up to the end of the prefill and PeakIn where the
	// peak fell ("prefill" or "decode").
	Inference      bool             `json:"inference,omitempty"`
	MaxNewTokens   int              `json:"max_new_tokens,omitempty"`
	KVCache        string           `json:"kv_cache,omitempty"`
	PrefillPeak    int64            `json:"prefill_peak,omitempty"`
	PeakIn         string           `json:"peak_in,omitempty"`
	Search         string           `json:"search"` // "batch" or "seq"
	Seq            int              `json:"seq,omitempty"`
	Batch          int              `json:"batch,omitempty"`
	LargestBatch   *int             `json:"largest_batch,omitempty"`
	LargestSeq     *int             `json:"largest_seq,omitempty"`
	FirstOOM       *int             `json:"first_oom"`
	Peak           *Peak            `json:"peak"`
	Breakdown      *Breakdown       `json:"breakdown"`
	PeakPhase      string           `json:"peak_phase,omitempty"`
	OOM            *OOMInfo         `json:"oom,omitempty"`
	Floor          *Floor           `json:"floor,omitempty"`
	Advice         []Alternative    `json:"advice,omitempty"`
	CheckpointFile *CheckpointCheck `json:"checkpoint_file,omitempty"`
	Trials         []Trial          `json:"trials"`
	Notes          []string         `json:"notes,omitempty"`
}

// LoRAInfo is --finetune lora/qlora's adapters (PEFT's LoraConfig) and,
// for qlora, the 4-bit base.
type LoRAInfo struct {
	R          int      `json:"r"`
	Alpha      float64  `json:"alpha"`
	Dropout    float64  `json:"dropout"`
	Targets    []string `json:"targets"`    // target_modules (names, or "all-linear")
	Modules    int      `json:"modules"`    // the layers wrapped
	Parameters int64    `json:"parameters"` // the adapters' (all trainable)
	// GradientBytes and OptimizerStateBytes are the trainable
	// parameters' gradients and optimizer state (float32 adapters: 4 and,
	// for AdamW, 8 bytes a parameter), each tensor rounded as the
	// allocator rounds; the frozen weights have neither.
	GradientBytes       int64 `json:"gradient_bytes"`
	OptimizerStateBytes int64 `json:"optimizer_state_bytes"`
	// Quantization: qlora's base, "nf4" (bitsandbytes' Linear4bit, double
	// quantization), ComputeDType its compute dtype, QuantBytes the 4-bit
	// weights' quantization states (beside the packed weights).
	Quantization string `json:"quantization,omitempty"`
	ComputeDType string `json:"compute_dtype,omitempty"`
	QuantBytes   int64  `json:"quant_state_bytes,omitempty"`
}

// Peak is the allocator's peaks in the trial at the largest size.
type Peak struct {
	Allocated     int64 `json:"allocated"`     // max_memory_allocated
	Reserved      int64 `json:"reserved"`      // max_memory_reserved
	Fragmentation int64 `json:"fragmentation"` // reserved − allocated at the peaks
	Headroom      int64 `json:"headroom"`      // usable − reserved
	// Host is the host allocator's peak in the trial under --parallel
	// fsdp,offload: the pinned shards, gradients and optimizer state and
	// the CPU step's temporaries.
	Host int64 `json:"host,omitempty"`
}

// Breakdown is memtrack's categories in fit's names.
type Breakdown struct {
	Parameters     int64 `json:"parameters"` // parameters and buffers
	Gradients      int64 `json:"gradients"`
	OptimizerState int64 `json:"optimizer_state"` // on the device
	// OptimizerStatePaged is the optimizer's state in bitsandbytes' paged
	// (managed) memory (paged_adamw_8bit): outside the caching allocator,
	// so not in the sum of the breakdown nor in the peak.
	OptimizerStatePaged int64 `json:"optimizer_state_paged,omitempty"`
	Activations         int64 `json:"activations"` // tensors saved for backward
	Temporaries         int64 `json:"temporaries"`
	Workspaces          int64 `json:"workspaces"`              // the cuBLAS and cuBLASLt workspaces
	Communication       int64 `json:"communication,omitempty"` // --parallel: DDP's gradient buckets, FSDP's all-gather and reduce-scatter buffers, ZeRO's reduce bucket
	KVCache             int64 `json:"kv_cache,omitempty"`      // --inference: the KV cache's bytes at the peak (closed form)
	Other               int64 `json:"other"`                   // what was allocated before the step
}

// OOMInfo is the first size that ran out of memory, measured.
type OOMInfo struct {
	Value     int        `json:"value"` // the batch (or sequence) that did not fit
	Requested int64      `json:"requested"`
	Allocated int64      `json:"allocated"` // allocated when it failed
	Breakdown *Breakdown `json:"breakdown"` // of what was allocated when it failed
	Phase     string     `json:"phase"`     // what ran at the peak before the failure
	Message   string     `json:"message"`
	Building  bool       `json:"building_model,omitempty"` // the weights did not fit: it failed while the model was built
}

// Floor is the model state every step holds, whatever the batch.
type Floor struct {
	Parameters     int64 `json:"parameters"`
	Gradients      int64 `json:"gradients"`
	OptimizerState int64 `json:"optimizer_state"` // on the device
	// OptimizerStatePaged is the state a paged optimizer keeps in paged
	// memory (not in Total: it is not on the device).
	OptimizerStatePaged int64 `json:"optimizer_state_paged,omitempty"`
	// Communication is --parallel ddp's gradient buckets (as many bytes
	// as the gradients).
	Communication int64 `json:"communication,omitempty"`
	// Offloaded is the model state in host memory under --parallel
	// fsdp,offload: the shards, their gradients and the optimizer's
	// state (not in Total: it is not on the device).
	Offloaded int64 `json:"offloaded,omitempty"`
	Total     int64 `json:"total"`
	Usable    int64 `json:"usable"`
}

// Alternative is one change that could make the model fit, found by
// trials (Modelled false: memsh does not model it yet).
type Alternative struct {
	Change   string `json:"change"`
	Modelled bool   `json:"modelled"`
	Fits     bool   `json:"fits"`
	Largest  int    `json:"largest,omitempty"` // the largest batch (or sequence) with the change
	What     string `json:"what,omitempty"`    // "batch" or "seq"
	FirstOOM int    `json:"first_oom,omitempty"`
	Note     string `json:"note,omitempty"`
}

// CheckpointCheck is the comparison of the checkpoint beside a config.
type CheckpointCheck struct {
	Tensors int    `json:"tensors"` // checked
	DType   string `json:"dtype"`
}

func breakdownOf(m map[string]int64) *Breakdown {
	if m == nil {
		return nil
	}
	return &Breakdown{
		Parameters:     m["Parameter"] + m["Buffer"],
		Gradients:      m["Gradient"],
		OptimizerState: m["Optstate"],
		Activations:    m["Activation"],
		Temporaries:    m["Temp"],
		Workspaces:     m["Library"],
		Communication:  m["Comm"],
		Other:          m["Other"] - m["Library"],
	}
}

// WriteJSON writes the report as one JSON object and a newline.
func (r *Report) WriteJSON(w io.Writer) error {
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "%s\n", b)
	return err
}

var fb = func(n int64) string { return backend.FormatBytes(n) }

// WriteText writes the report a practitioner reads first.
func (r *Report) WriteText(w io.Writer) {
	p := func(format string, args ...any) { fmt.Fprintf(w, format, args...) }
	unit := "batch"
	if r.Search == "seq" {
		unit = "sequence"
	}
	p("\n%s — %s\n", r.Model, r.Title)
	p("  %s parameters", commas(r.Parameters))
	if r.PublishedParameters > 0 {
		if r.PublishedParameters == r.Parameters {
			p(" (published %s: equal)", commas(r.PublishedParameters))
		} else {
			p(" (published %s: differs by %s)", commas(r.PublishedParameters), commas(r.Parameters-r.PublishedParameters))
		}
	}
	p(", %s\n", r.ParameterDType)
	if l := r.LoRA; l != nil {
		pct := 0.0
		if r.Parameters > 0 {
			pct = 100 * float64(r.TrainableParameters) / float64(r.Parameters)
		}
		base := "the model frozen"
		if l.Quantization != "" {
			base = fmt.Sprintf("the linear layers but lm_head in 4-bit NF4 (bitsandbytes Linear4bit, double quantization, computing in %s), the rest float32, all frozen", l.ComputeDType)
		}
		what := "LoRA"
		if r.Finetune == FinetuneQLoRA {
			what = "QLoRA: LoRA"
		}
		p("  fine-tuning: %s r=%d, alpha %s, dropout %s on %s (%d modules): %s trainable parameters (%.2f %%), their gradients %s and optimizer state %s; %s\n",
			what, l.R, trimFloat(l.Alpha), trimFloat(l.Dropout), strings.Join(l.Targets, ", "), l.Modules, commas(r.TrainableParameters), pct, fb(l.GradientBytes), fb(l.OptimizerStateBytes), base)
	}
	if r.CheckpointFile != nil {
		p("  checkpoint: %d tensors match the model's parameters (shapes; stored as %s)\n", r.CheckpointFile.Tensors, r.CheckpointFile.DType)
	}
	p("  %s: %s capacity, %s outside the allocator (CUDA context, cuBLAS handles), %s usable\n", r.Device, fb(r.Capacity), fb(r.Context), fb(r.Usable))
	att := r.Attention
	if r.SDPABackend != "" {
		att += " → " + r.SDPABackend
	}
	if r.AttentionNote != "" {
		att += " (" + r.AttentionNote + ")"
	}
	if r.Routing != "" {
		att += "; routing " + routingText(r.Routing)
	}
	if r.Inference {
		p("  inference: %s, greedy generation of %d new tokens with a %s under no_grad; attention %s\n", weightsText(r.Precision), r.MaxNewTokens, cacheText(r.KVCache), att)
	} else {
		accum := ""
		if r.GradAccum > 1 {
			accum = fmt.Sprintf(", %d micro-batches per step (the batch below is the micro-batch)", r.GradAccum)
		}
		prec := precisionText(r.Precision)
		if r.Finetune == FinetuneLoRA || r.Finetune == FinetuneQLoRA {
			prec = finetunePrecisionText(r.Precision, r.Finetune == FinetuneQLoRA)
		}
		zero := r.Parallel == ParallelZeRO1 || r.Parallel == ParallelZeRO2 || r.Parallel == ParallelZeRO3
		if zero && r.Precision == PrecBF16 {
			prec = "bf16 as DeepSpeed's bf16.enabled (the model cast to bfloat16, no autocast; fp32 master weights and optimizer state)"
		}
		if (r.Parallel == ParallelFSDP || r.Parallel == ParallelFSDPOffload || strings.HasSuffix(r.Parallel, ",fsdp")) && r.Precision == PrecBF16 {
			prec = "bf16 through FSDP2's MixedPrecisionPolicy (bfloat16 compute and all-gathers, float32 sharded weights, gradient reduce-scatters and optimizer state)"
		}
		opt := optimizerText(r.Optimizer)
		if r.Parallel == ParallelFSDPOffload {
			// foreach=None on CPU parameters: the per-parameter loop
			opt = strings.Replace(opt, "foreach", "its per-parameter loop on the CPU", 1)
		}
		if zero {
			opt = "DeepSpeed's FusedAdam (adam_w_mode, on the fp32 master partition)"
		}
		p("  training: %s, %s, %s, %d steps per trial%s; attention %s\n", prec, opt, checkpointText(r.Checkpoint), r.Steps, accum, att)
		if r.Parallel != "" {
			p("  %s\n", parallelText(r.Parallel, r.GPUs))
		}
	}
	if r.Search == "seq" && r.Inference {
		p("  batch %d, longest prompt: ", r.Batch)
	} else if r.Search == "seq" {
		p("  batch %d, longest sequence: ", r.Batch)
	} else if r.Inference {
		p("  prompt %d, largest batch: ", r.Seq)
	} else if r.Seq > 0 {
		p("  sequence %d, largest batch: ", r.Seq)
	} else {
		p("  largest batch: ")
	}
	largest := r.LargestBatch
	if r.Search == "seq" {
		largest = r.LargestSeq
	}
	switch {
	case largest == nil:
		p("none — %s %d runs out of memory\n", unit, lowOf(r))
	case r.FirstOOM == nil:
		p("%d (no OOM up to the limit)\n", *largest)
	default:
		p("%d (%d runs out of memory)\n", *largest, *r.FirstOOM)
	}
	if len(r.Trials) > 0 {
		p("  %s\n", trialsText(r.Trials, unit))
	}
	if r.Peak != nil && largest != nil {
		where := "the " + phaseText(r.PeakPhase)
		if r.Inference {
			where = "the " + r.PeakIn + fmt.Sprintf(" (the prefill's peak: %s)", fb(r.PrefillPeak))
		}
		p("  at %s %d: peak allocated %s, reserved %s (fragmentation %s), headroom %s; the peak falls in %s\n",
			unit, *largest, fb(r.Peak.Allocated), fb(r.Peak.Reserved), fb(r.Peak.Fragmentation), fb(r.Peak.Headroom), where)
		if r.Breakdown != nil {
			p("    %s\n", r.Breakdown.text())
		}
		if r.Peak.Host > 0 {
			p("    host memory of the rank (CPU offload) at its peak: %s\n", fb(r.Peak.Host))
		}
	}
	if r.OOM != nil {
		p("  at %s %d (out of memory): tried to allocate %s with %s allocated", unit, r.OOM.Value, fb(r.OOM.Requested), fb(r.OOM.Allocated))
		if r.OOM.Building {
			p(", while building the model (its weights)")
		}
		if r.OOM.Phase != "" {
			p("; the peak before it in the %s", phaseText(r.OOM.Phase))
		}
		p("\n")
		if r.OOM.Breakdown != nil && r.Inference {
			b := r.OOM.Breakdown
			p("    allocated then: parameters %s · KV cache and temporaries %s · cuBLAS workspaces %s\n", fb(b.Parameters), fb(b.Temporaries), fb(b.Workspaces))
		} else if r.OOM.Breakdown != nil {
			p("    allocated then: %s\n", r.OOM.Breakdown.text())
		}
	}
	if r.Floor != nil && r.Inference {
		p("  weights floor: parameters %s", fb(r.Floor.Total))
	} else if r.Floor != nil {
		p("  model-state floor: parameters %s + gradients %s + optimizer state %s", fb(r.Floor.Parameters), fb(r.Floor.Gradients), fb(r.Floor.OptimizerState))
		if r.Floor.Communication > 0 {
			p(" + DDP's gradient buckets %s", fb(r.Floor.Communication))
		}
		p(" = %s", fb(r.Floor.Total))
		if r.Floor.OptimizerStatePaged > 0 {
			p(" (and %s of optimizer state paged, off the device)", fb(r.Floor.OptimizerStatePaged))
		}
		if r.Floor.Offloaded > 0 {
			p(" (and %s offloaded to host memory: shards, gradients, optimizer state)", fb(r.Floor.Offloaded))
		}
	}
	if r.Floor != nil {
		if r.Floor.Total > r.Floor.Usable {
			p(" > %s usable: no batch fits without changing that\n", fb(r.Floor.Usable))
		} else {
			p(" of %s usable (%s left for activations and temporaries)\n", fb(r.Floor.Usable), fb(r.Floor.Usable-r.Floor.Total))
		}
	}
	if len(r.Advice) > 0 {
		p("  what would fit (each found by trials):\n")
		for _, a := range r.Advice {
			p("    %-44s %s\n", a.Change, a.text())
		}
	}
	for _, n := range r.Notes {
		p("  note: %s\n", n)
	}
}

func lowOf(r *Report) int {
	if len(r.Trials) > 0 {
		return r.Trials[0].Value
	}
	return 1
}

func (a Alternative) text() string {
	switch {
	case !a.Modelled:
		return "not modelled yet" + noteText(a.Note)
	case !a.Fits:
		return "does not fit" + noteText(a.Note)
	case a.FirstOOM > 0:
		return fmt.Sprintf("fits: %s %d (%d runs out of memory)%s", whatText(a.What), a.Largest, a.FirstOOM, noteText(a.Note))
	}
	return fmt.Sprintf("fits: %s %d%s", whatText(a.What), a.Largest, noteText(a.Note))
}

func whatText(w string) string {
	if w == "seq" {
		return "sequence"
	}
	return "batch"
}

func noteText(n string) string {
	if n == "" {
		return ""
	}
	return "; " + n
}

func (b *Breakdown) text() string {
	s := fmt.Sprintf("parameters %s · gradients %s · optimizer state %s · activations %s · temporaries %s · cuBLAS workspaces %s",
		fb(b.Parameters), fb(b.Gradients), fb(b.OptimizerState), fb(b.Activations), fb(b.Temporaries), fb(b.Workspaces))
	if b.KVCache > 0 {
		s = fmt.Sprintf("parameters %s · KV cache %s · temporaries %s · cuBLAS workspaces %s", fb(b.Parameters), fb(b.KVCache), fb(b.Temporaries), fb(b.Workspaces))
	}
	if b.Communication != 0 {
		s += " · communication " + fb(b.Communication)
	}
	if b.Other != 0 {
		s += " · other " + fb(b.Other)
	}
	if b.OptimizerStatePaged > 0 {
		s += " (optimizer state paged, off the device: " + fb(b.OptimizerStatePaged) + ")"
	}
	return s
}

// parallelText is the report's words for --gpus and --parallel.
func parallelText(parallel string, gpus int) string {
	switch parallel {
	case ParallelDDP:
		return fmt.Sprintf("data parallel on %d GPUs: DistributedDataParallel (%d MiB gradient buckets, all-reduced in the backward); the figures are one rank's, the batch is each rank's (%d × it per step)", gpus, tdist.DefaultBucketCapBytes>>20, gpus)
	case ParallelZeRO1, ParallelZeRO2:
		grads := ""
		if parallel == ParallelZeRO2 {
			grads = " and the gradients"
		}
		return fmt.Sprintf("ZeRO stage %s on %d GPUs: DeepSpeed's engine (bfloat16 flat parameters on every rank; the fp32 master weights, Adam's moments%s in 1/%d partitions; a reduce bucket of %s elements in the backward); the figures are rank 0's, the batch is each rank's (%d × it per step)", parallel[4:], gpus, grads, gpus, commas(int64(tdist.DefaultReduceBucketSize)), gpus)
	case ParallelFSDP:
		return fsdpText(gpus)
	case ParallelFSDPOffload:
		return fmt.Sprintf("fully sharded on %s with CPU offload: FSDP2 (fully_shard on each block and on the root with CPUOffloadPolicy(pin_memory=True), as torchtitan's enable_cpu_offload; the 1/%d dim-0 shards, their gradients and the optimizer state in pinned host memory, the optimizer stepping on the CPU; each block's shards copied to the GPU and all-gathered for its forward and backward, gradients reduce-scattered and copied back); the figures are rank 0's GPU, the batch is each rank's (%d × it per step)", countText(gpus, "GPU"), gpus, gpus)
	case ParallelZeRO3:
		return fmt.Sprintf("ZeRO stage 3 on %d GPUs: DeepSpeed's engine (every parameter in 1/%d partitions, built as zero.Init builds it, each module's gathered for its forward and backward and released after them, prefetched along the trace of the first step; the gradients' and the fp32 master weights' and Adam's moments' partitions; the reduce bucket of %s elements always there); the figures are rank 0's, the batch is each rank's (%d × it per step)", gpus, gpus, commas(int64(tdist.DefaultReduceBucketSize)), gpus)
	}
	if t, fsdp, ok := parseTP(parallel); ok {
		tp := fmt.Sprintf("tensor parallel over %d GPUs as torchtitan's apply_tp plans a Llama model (q/k/v and gate/up projections ColwiseParallel, o_proj and down_proj RowwiseParallel, the norms SequenceParallel, the embedding's vocabulary and lm_head's rows in 1/%d chunks; loss parallelism off: the logits all-gathered)", t, t)
		if !fsdp {
			return tp + "; the figures are rank 0's (the largest chunks), the batch is the whole job's"
		}
		dp := gpus / t
		return fmt.Sprintf("2-D on %d GPUs: %s, and FSDP2 over %d data-parallel ranks (fully_shard on each block and on the root; the chunks' dim 0 in 1/%d shards); the figures are rank 0's, the batch is each data-parallel rank's (%d × it per step)", gpus, tp, dp, dp, dp)
	}
	return parallel
}

// countText is "1 GPU", "2 GPUs".
func countText(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmt.Sprintf("%d %ss", n, what)
}

// fsdpText is the report's words for --parallel fsdp on gpus GPUs.
func fsdpText(gpus int) string {
	return fmt.Sprintf("fully sharded on %d GPUs: FSDP2 (fully_shard on each block and on the root, as torchtitan; parameters, gradients and optimizer state in 1/%d dim-0 shards, each block all-gathered for its forward and backward, gradients reduce-scattered); the figures are rank 0's (the largest shards), the batch is each rank's (%d × it per step)", gpus, gpus, gpus)
}

// optimizerText is the report's words for a Trainer optim name.
func optimizerText(name string) string {
	if o, ok := LookupOptimizer(name); ok {
		return o.Name + ": " + o.Title
	}
	return name
}

func phaseText(p string) string {
	switch p {
	case "":
		return "step"
	case "other":
		return "loss (outside the model's modules)"
	}
	return p
}

func precisionText(p string) string {
	switch p {
	case PrecBF16:
		return "bf16 autocast (float32 weights, gradients and optimizer state)"
	case PrecFP16:
		return "fp16 autocast with a GradScaler"
	case PrecBF16True:
		return "bf16-true (bfloat16 weights, gradients and optimizer state)"
	}
	return "fp32"
}

// finetunePrecisionText is precisionText for LoRA and QLoRA, whose
// adapters, their gradients and optimizer state are float32 whatever the
// precision (PEFT's autocast_adapter_dtype).
// With qlora, prepare_model_for_kbit_training has made every weight but
// the 4-bit ones float32.
func finetunePrecisionText(p string, qlora bool) string {
	switch {
	case p == PrecBF16True && qlora:
		return "bf16-true (no autocast; float32 adapters, gradients and optimizer state)"
	}
	switch p {
	case PrecBF16:
		return "bf16 autocast (float32 adapters, gradients and optimizer state)"
	case PrecFP16:
		return "fp16 autocast with a GradScaler (float32 adapters)"
	case PrecBF16True:
		return "bf16-true (the frozen weights bfloat16; float32 adapters, gradients and optimizer state)"
	}
	return "fp32"
}

func weightsText(p string) string {
	switch p {
	case PrecBF16True:
		return "bfloat16 weights"
	case PrecBF16:
		return "float32 weights under bf16 autocast"
	case PrecFP16:
		return "float32 weights under fp16 autocast"
	}
	return "float32 weights"
}

func cacheText(c string) string {
	if c == "static" {
		return "StaticCache"
	}
	return "DynamicCache"
}

func checkpointText(c bool) string {
	if c {
		return "activation checkpointing per layer"
	}
	return "no activation checkpointing"
}

// commas writes n with thousands separators.
func commas(n int64) string {
	s := fmt.Sprint(n)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

// routingText says what a routing plan puts on the experts.
func routingText(plan string) string {
	if plan == "worst" {
		return "worst (every token on the same experts)"
	}
	return "balanced (tokens spread evenly over the experts)"
}

// trialsText says which of the search's trials ran in full and which
// were replayed from the memory events of full ones.
func trialsText(ts []Trial, unit string) string {
	var full, rep []string
	for _, t := range ts {
		v := strconv.Itoa(t.Value)
		if t.Status != "ok" {
			v += " (oom)"
		}
		if t.Replayed {
			rep = append(rep, v)
		} else {
			full = append(full, v)
		}
	}
	n := fmt.Sprintf("%d trials", len(ts))
	if len(ts) == 1 {
		n = "1 trial"
	}
	s := fmt.Sprintf("search: %s; run in full at %s %s", n, unit, strings.Join(full, ", "))
	if len(rep) == 0 {
		return s + "; none replayed"
	}
	return s + fmt.Sprintf("; replayed at %s", strings.Join(rep, ", "))
}

// trimFloat writes f as Python does (8.0, 0.05).
func trimFloat(f float64) string {
	s := fmt.Sprint(f)
	if !strings.ContainsAny(s, ".e") {
		s += ".0"
	}
	return s
}
