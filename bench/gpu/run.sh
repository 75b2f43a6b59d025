#!/usr/bin/env bash
# Everything memsh checks on a real NVIDIA GPU, in one run, for a machine
# with the driver, PyTorch 2.x (CUDA) and a memsh binary:
#
#   bash bench/gpu/run.sh [MEMSH] [OUTDIR]
#
# MEMSH: a memsh binary (default: go build one); OUTDIR (default a temporary
# directory) gets at most eight files:
#   info.txt        nvidia-smi, PyTorch, the CUDA context's and cuBLAS's memory (torch_fit.py context)
#   gpu_check.txt   scripts/gpu_check.star on the GPU (memsh's CUDA backend end to end)
#   compare.txt     bench/torchref/gpu_compare.sh: memory_allocated() per phase, memsh and PyTorch on this GPU
#   phases.jsonl    torch_fit.py phases: the fit trial of GPT-2 small at a few shapes
#                   (compare with scripts/fit_phases.star on sim:NAME,meta: bench/gpu/compare_fit.py),
#                   then memsh's own run of one on this GPU (--device cuda)
#   fsdp.jsonl      fsdp_rank.py phases: rank 0 of GPT-2 small on 4 ranks (fake process group), FSDP2
#                   and DDP; Llama 3.2 1B under tensor parallelism on 2 ranks and 2-D (TP 2 × FSDP2 4);
#                   then memsh's twin (scripts/fsdp_phases.star on sim:NAME,meta) in
#                   fsdp_memsh.jsonl (bench/gpu/compare_fit.py fsdp.jsonl fsdp_memsh.jsonl)
#   trace.jsonl     torch_fit.py trace --cpp: every allocator event of a checkpointed trial, with
#                   the autograd node and ATen op of each (bench/gpu/compare_trace.py)
#   search.jsonl    with SEARCH=1: torch_fit.py search, the largest batch PyTorch trains on this GPU
#   oom.txt         PyTorch's and memsh's out-of-memory messages on this GPU
#   bench.txt       backend/cuda's latency benchmarks on the real driver (when .gpu/cuda.test is
#                   there: go test -c -o .gpu/cuda.test ./backend/cuda)
#   all.log         everything's stderr
# Each step has its own time limit; a failing step does not stop the others.
set -uo pipefail
cd "$(dirname "$0")/../.."
MEMSH=${1:-}
OUTDIR=${2:-$(mktemp -d)}
mkdir -p "$OUTDIR"
PY=${PYTHON:-python3}
LOG=$OUTDIR/all.log
if [ -z "$MEMSH" ]; then MEMSH=$OUTDIR/memsh; go build -o "$MEMSH" ./cmd/memsh; fi
. bench/gpu/lib.sh
# the simulator's preset of this card, for memsh's twins of the PyTorch runs
PRESET=H100
nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | grep -q H200 && PRESET=H200
{
  nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv
  "$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'
  echo "MEMSH_LIBCUBLAS=${MEMSH_LIBCUBLAS:-} MEMSH_LIBCUDA=${MEMSH_LIBCUDA:-} MEMSH_LIBNVML=${MEMSH_LIBNVML:-}"
  "$MEMSH" --version
} >"$OUTDIR/info.txt" 2>>"$LOG"
step context 60 "$OUTDIR/info.txt" "$PY" bench/gpu/torch_fit.py context
step devices 30 "$OUTDIR/info.txt" "$MEMSH" devices
step gpu_check 90 "$OUTDIR/gpu_check.txt" "$MEMSH" --device cuda scripts/gpu_check.star 64
step gpu_compare 150 "$OUTDIR/compare.txt" env MEMSH="$MEMSH" bash bench/torchref/gpu_compare.sh
step "trace --batch 1 --checkpoint --cpp" 90 "$OUTDIR/trace.jsonl" "$PY" bench/gpu/torch_fit.py trace --batch 1 --checkpoint --cpp
for args in "--batch 4" "--batch 41" "--batch 122 --checkpoint" "--batch 4 --attention sdpa"; do
  step "phases $args" 60 "$OUTDIR/phases.jsonl" "$PY" bench/gpu/torch_fit.py phases $args
done
for strategy in fsdp fsdp-offload ddp; do
  step "fsdp_rank $strategy" 120 "$OUTDIR/fsdp.jsonl" "$PY" bench/gpu/fsdp_rank.py phases --model gpt2-small --world 4 --strategy $strategy
  step "memsh fsdp_phases $strategy" 60 "$OUTDIR/fsdp_memsh.jsonl" "$MEMSH" --device "sim:$PRESET,meta" scripts/fsdp_phases.star gpt2-small --world 4 --strategy $strategy
done
for args in "--world 2 --strategy tp" "--world 8 --strategy tp-fsdp --tp 2"; do
  step "fsdp_rank llama-3.2-1b $args" 120 "$OUTDIR/fsdp.jsonl" "$PY" bench/gpu/fsdp_rank.py phases --model llama-3.2-1b --batch 1 $args
  step "memsh fsdp_phases llama-3.2-1b $args" 90 "$OUTDIR/fsdp_memsh.jsonl" "$MEMSH" --device "sim:$PRESET,meta" scripts/fsdp_phases.star llama-3.2-1b --batch 1 $args
done
step "memsh on the GPU: phases --batch 1" 120 "$OUTDIR/phases.jsonl" "$MEMSH" --device cuda scripts/fit_phases.star --batch 1
step "memsh oom" 30 "$OUTDIR/oom.txt" "$MEMSH" --device cuda -c 'tensor.empty([2 * cuda.mem_get_info()[1]], dtype = "uint8", device = "cuda")'
step "memsh oom after half" 30 "$OUTDIR/oom.txt" "$MEMSH" --device cuda -c 'f = cuda.mem_get_info()[0]
a = tensor.empty([f // 2], dtype = "uint8", device = "cuda")
b = tensor.empty([f // 2 + GiB], dtype = "uint8", device = "cuda")'
step "torch oom" 60 "$OUTDIR/oom.txt" "$PY" bench/gpu/torch_fit.py oom
if [ -x .gpu/cuda.test ]; then
  step "backend/cuda benchmarks" 90 "$OUTDIR/bench.txt" .gpu/cuda.test -test.run XXX -test.bench . -test.benchtime 200ms -gpu
fi
if [ -n "${SEARCH:-}" ]; then
  step "search gpt2-small" 150 "$OUTDIR/search.jsonl" "$PY" bench/gpu/torch_fit.py search
  step "search gpt2-small checkpointed" 150 "$OUTDIR/search.jsonl" "$PY" bench/gpu/torch_fit.py search --checkpoint
fi
echo "results in $OUTDIR"
