package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/debug"
	"strings"
	"sync"

	"github.com/memsh/memsh/fit"
	"github.com/memsh/memsh/scope"
	"github.com/memsh/memsh/scripts"
)

func init() { subcommands["fit"] = fitCommand }

// fitUsage is memsh fit's usage line.
const fitUsage = "usage: memsh fit SOURCE [--gpu H100] [--seq N | --batch N] [--precision fp32|bf16|fp16|bf16-true] [--optimizer adamw_torch|adamw_torch_fused|adamw_bnb_8bit|paged_adamw_8bit|adafactor|sgd|adam] [--checkpoint] [--grad-accum N] [--gpus N [--parallel ddp|fsdp|fsdp,offload|zero1|zero2|zero3|tp=T[,fsdp]]] [--finetune full|lora|qlora [--lora-r R] [--lora-alpha A] [--lora-dropout P] [--lora-targets q_proj,v_proj,...]] [--attention eager|sdpa|flash] [--inference [--max-new-tokens N] [--kv-cache dynamic|static]] [--search-mode interpolate|binsearch] [--json] [--out FILE.jsonl]"

// fitCommand is `memsh fit SOURCE ...` (package fit): the largest batch
// that trains SOURCE — a library model, a Hugging Face config.json (or
// its directory) or a .star model file — on a simulated card, or with
// --batch the longest sequence; the breakdown at the boundary and, when
// nothing fits, what would.
func fitCommand(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("memsh fit", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o fit.Options
	fs.StringVar(&o.GPU, "gpu", "H100", "the simulated GPU `PRESET` (memsh devices --presets), or a size (80GiB)")
	fs.IntVar(&o.Seq, "seq", 0, "sequence length `N` of the batch search (default: the model's, at most 2048)")
	fs.IntVar(&o.Batch, "batch", 0, "find the longest sequence at batch `N` instead (language models)")
	fs.StringVar(&o.Precision, "precision", "bf16", "fp32, bf16 (autocast, float32 weights), fp16 (autocast and a GradScaler) or bf16-true (bfloat16 weights and optimizer state)")
	fs.StringVar(&o.Optimizer, "optimizer", fit.OptAdamWTorch, "Hugging Face Trainer's optim name: adamw_torch (AdamW, foreach), adamw_torch_fused, adamw_bnb_8bit, paged_adamw_8bit (bitsandbytes), adafactor (transformers'), sgd (momentum 0); or adam. adamw is adamw_torch")
	fs.BoolVar(&o.Checkpoint, "checkpoint", false, "activation checkpointing per layer (nn.checkpoint, non-reentrant)")
	fs.StringVar(&o.Attention, "attention", "sdpa", "eager, sdpa or flash (Hugging Face's attn_implementation names; sdpa's backend is PyTorch's choice for the card)")
	fs.StringVar(&o.Routing, "routing", "balanced", "a Mixture-of-Experts model's tokens per expert: balanced (even) or worst (every token on the same experts)")
	fs.IntVar(&o.GradAccum, "grad-accum", 1, "gradient accumulation: `N` micro-batches (each forward and backward, the loss divided by N) per optimizer step; the batch searched is the micro-batch")
	fs.IntVar(&o.GPUs, "gpus", 1, "the job's `N` GPUs: memsh simulates one rank (each GPU trains the searched micro-batch)")
	fs.StringVar(&o.Parallel, "parallel", "", "with --gpus: how the ranks share the work: ddp (DistributedDataParallel, the default), fsdp (FSDP2), zero1, zero2, zero3 (DeepSpeed's ZeRO), tp=T or tp=T,fsdp (tensor parallelism, 2-D with FSDP2)")
	fs.StringVar(&o.Finetune, "finetune", "full", "what trains: full (every parameter), lora (PEFT's LoRA adapters on the frozen model) or qlora (LoRA on the model's linear layers in 4-bit NF4, bitsandbytes)")
	fs.IntVar(&o.LoRAR, "lora-r", fit.DefaultLoRAR, "with --finetune lora/qlora: the adapters' rank `R` (PEFT's LoraConfig r)")
	fs.Float64Var(&o.LoRAAlpha, "lora-alpha", fit.DefaultLoRAAlpha, "with --finetune lora/qlora: lora_alpha `A` (scaling = A / R)")
	fs.Float64Var(&o.LoRADropout, "lora-dropout", 0, "with --finetune lora/qlora: lora_dropout `P`")
	fs.StringVar(&o.LoRATargets, "lora-targets", "", "with --finetune lora/qlora: the target modules, comma-separated `names` or all-linear (default: PEFT's for the model type, q_proj,v_proj for the Llama family)")
	fs.BoolVar(&o.Inference, "inference", false, "generation instead of training: greedy decoding of --max-new-tokens after a prompt of --seq tokens, with a KV cache, under no_grad (bfloat16 weights unless --precision says otherwise)")
	fs.IntVar(&o.MaxNewTokens, "max-new-tokens", 128, "with --inference: the tokens to generate")
	fs.StringVar(&o.KVCache, "kv-cache", "dynamic", "with --inference: dynamic (transformers' DynamicCache) or static (StaticCache)")
	fs.StringVar(&o.SearchMode, "search-mode", fit.SearchBinsearch, "how the searches choose their trials: binsearch (PyTorch Lightning's batch-size finder: doubling, then bisection) or interpolate (bounded by the peaks of the trials that ran: fewer trials, the same boundary unless the sizes that train are not an interval)")
	fs.BoolVar(&o.JSON, "json", false, "print one JSON object (docs/fit.md) instead of the report")
	fs.StringVar(&o.Out, "out", "", "append the trials' records to `FILE.jsonl` (memsh plot FILE.jsonl)")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), fitUsage)
		fmt.Fprintln(fs.Output(), "SOURCE: a library model ("+strings.Join(fit.LibraryNames(), " ")+"), a Hugging Face config.json or its directory, or a .star model file (docs/fit.md)")
		fs.PrintDefaults()
	}
	rest, code := parseInterspersed(fs, args)
	if code >= 0 {
		return code
	}
	switch {
	case len(rest) == 0:
		fmt.Fprintln(stderr, "memsh fit: no model given\n"+fitUsage)
		return 2
	case len(rest) > 1:
		fmt.Fprintf(stderr, "memsh fit: one model at a time, got %q\n%s\n", strings.Join(rest, " "), fitUsage)
		return 2
	}
	o.Source = rest[0]
	o.Set = map[string]bool{}
	fs.Visit(func(f *flag.Flag) { o.Set[f.Name] = true })
	if o.Set["seq"] && o.Set["batch"] {
		fmt.Fprintln(stderr, "memsh fit: --seq and --batch search different things: give one (--batch N finds the longest sequence at batch N)")
		return 2
	}
	// Ctrl-C interrupts the sessions fit is running (each search has its
	// own; the advice's run at once)
	var mu sync.Mutex
	running := map[*scope.Session]bool{}
	o.Started = func(s *scope.Session) func() {
		mu.Lock()
		running[s] = true
		mu.Unlock()
		return func() {
			mu.Lock()
			delete(running, s)
			mu.Unlock()
		}
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt)
	defer signal.Stop(sig)
	go func() {
		for range sig {
			mu.Lock()
			for s := range running {
				s.Interrupt()
			}
			mu.Unlock()
		}
	}()
	// A fit's Go heap stays a few MiB while it allocates and drops
	// autograd nodes, walk marks and events at a high rate, so Go's
	// default pacing (a collection at every doubling, from 4 MiB)
	// collected about a hundred times in llama-3.1-8b's fit; at GOGC=400
	// it takes about 15 % less time for about 25 MiB more RSS
	// (bench/README.md). Only
	// here: a script's host-memory figures include the Go heap, and
	// stay as they were. GOGC in the environment wins.
	if os.Getenv("GOGC") == "" {
		defer debug.SetGCPercent(debug.SetGCPercent(fitGCPercent))
	}
	return fit.Main(o, scripts.Library, stdout, stderr)
}

// fitGCPercent is memsh fit's GOGC.
const fitGCPercent = 400
