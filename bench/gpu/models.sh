#!/usr/bin/env bash
# The fit table's other models against PyTorch on a real NVIDIA GPU, in one
# run that fits a time budget: memsh's CUDA backend end to end
# (scripts/gpu_check.star), then what PyTorch trains on this card for
# Llama 3.2 1B (scripts/models/llama.star rebuilt in PyTorch, and Hugging
# Face's own LlamaForCausalLM) and torchvision's ResNet-50 and -18: the
# largest batch and the longest sequence (bench/gpu/torch_fit.py search
# --fresh, each trial as in a fresh process, as fit.star's),
# memory per training phase (phases) and every allocator event with its
# ATen op (trace --cpp). memsh's side comes from scripts/fit.star and
# scripts/fit_phases.star on sim:H100,meta (no GPU needed).
#
#   bash bench/gpu/models.sh MEMSH OUTDIR [BUDGET_S]
#
# BUDGET_S (default 480): steps are cut to the time left and skipped when
# under 10 s is left, most valuable first. OUTDIR gets eight files at most:
# info.txt gpu_check.txt search.jsonl phases.jsonl trace_llama.jsonl
# trace_resnet.jsonl compare.txt all.log.
set -uo pipefail
cd "$(dirname "$0")/../.."
MEMSH=$1 OUTDIR=$2 BUDGET=${3:-480}
mkdir -p "$OUTDIR"
PY=${PYTHON:-python3}
LOG=$OUTDIR/all.log
export PYTHONUNBUFFERED=1
. bench/gpu/lib.sh
{
  nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv
  "$PY" -c 'import torch, torchvision; print("torch", torch.__version__, "cuda", torch.version.cuda, "torchvision", torchvision.__version__)'
  "$PY" -c 'import transformers; print("transformers", transformers.__version__)'
  echo "MEMSH_LIBCUBLAS=${MEMSH_LIBCUBLAS:-} MEMSH_LIBCUDA=${MEMSH_LIBCUDA:-} MEMSH_LIBNVML=${MEMSH_LIBNVML:-}"
  "$MEMSH" --version
} >"$OUTDIR/info.txt" 2>>"$LOG"
F="$PY bench/gpu/torch_fit.py"
S=$OUTDIR/search.jsonl P=$OUTDIR/phases.jsonl
step gpu_check 60 "$OUTDIR/gpu_check.txt" "$MEMSH" --device cuda scripts/gpu_check.star 64
step "search llama" 90 "$S" $F search --model llama-3.2-1b --seq 2048 --fresh
step "search llama ckpt" 120 "$S" $F search --model llama-3.2-1b --seq 2048 --checkpoint --fresh
step "search resnet50" 120 "$S" $F search --model resnet50 --fresh
step "search resnet50 ckpt" 150 "$S" $F search --model resnet50 --checkpoint --fresh
step "phases llama b1" 40 "$P" $F phases --model llama-3.2-1b --batch 1 --seq 2048
step "phases llama b1 ckpt" 40 "$P" $F phases --model llama-3.2-1b --batch 1 --seq 2048 --checkpoint
step "phases resnet50 b64" 40 "$P" $F phases --model resnet50 --batch 64
step "phases resnet50 b64 ckpt" 40 "$P" $F phases --model resnet50 --batch 64 --checkpoint
step "trace llama b1 --cpp" 90 "$OUTDIR/trace_llama.jsonl" $F trace --model llama-3.2-1b --batch 1 --seq 2048 --cpp
step "trace resnet50 b16 --cpp" 60 "$OUTDIR/trace_resnet.jsonl" $F trace --model resnet50 --batch 16 --cpp
step "phases hf-llama b1" 60 "$P" $F phases --model hf-llama-3.2-1b --batch 1 --seq 2048
step "gpu_compare" 90 "$OUTDIR/compare.txt" env MEMSH="$MEMSH" bash bench/torchref/gpu_compare.sh gpt2_tiny mlp_sgd_momentum
step "search resnet18" 90 "$S" $F search --model resnet18 --fresh
step "search resnet18 ckpt" 120 "$S" $F search --model resnet18 --checkpoint --fresh
step "search hf-llama" 90 "$S" $F search --model hf-llama-3.2-1b --seq 2048 --fresh
step "search llama seq b1" 120 "$S" $F search --model llama-3.2-1b --over seq --batch 1 --seq 2048 --high 131072 --fresh
step "search llama seq b1 ckpt" 120 "$S" $F search --model llama-3.2-1b --over seq --batch 1 --seq 2048 --high 131072 --checkpoint --fresh
echo "results in $OUTDIR ($SECONDS s)"
