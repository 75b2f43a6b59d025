// Package fit is `memsh fit SOURCE`: which batch (or, with a batch, which
// sequence length) trains a model on a GPU, answered by trials on a
// simulated card, with the breakdown a practitioner reads first and, when
// nothing fits, what would.
//
// SOURCE is a name of memsh's model library (Library: GPT-2 small … XL,
// Llama, Mistral, Qwen, Gemma, Phi-3 from their published config.json,
// ResNets), a Hugging Face config.json (or a directory holding one; see
// HFConfig for the families), or a .star model file (build, inputs,
// optional PARAMETERS and MAX_SEQ). Options are validated in Go before any
// Starlark runs (Options.Validate): every usage error is one line.
//
// The search runs in a scope.Session on the preset's meta simulator
// (sim:H100,meta: allocations only, PyTorch's allocator and layout) with
// the embedded driver (driver.star), which builds the model from the
// library (scripts.Library), trains it for two steps per trial under
// sweep.max_fit's binary search in exact peak mode (a fresh process per
// search, fresh="search"; trials replayed where a replay is the full
// trial's), and measures the boundary sizes under nn.track_peak (memtrack's categories:
// parameters, gradients, optimizer state, activations, temporaries,
// other). --finetune lora or qlora trains PEFT's LoRA adapters on the
// frozen model, or on its linear layers in bitsandbytes' 4-bit NF4
// (nn.lora, nn.Linear4bit, nn.prepare_model_for_kbit_training), with
// PEFT's LoraConfig defaults and target modules unless the --lora-*
// options say otherwise. When batch 1 does not fit, Advise runs the
// changes that could (activation checkpointing, a shorter sequence,
// another optimizer, lower precision, a bigger card, LoRA, QLoRA) as
// trials of their own.
//
// Output is a text report (Report.WriteText) or, with --json, one JSON
// object per run (Report, its fields documented in docs/fit.md).
package fit
