#!/usr/bin/env bash
# On a machine with an NVIDIA GPU, PyTorch 2.x with CUDA and memsh built:
# for each case, PyTorch's torch.cuda.memory_allocated() per training
# phase (bench/torchref/torchref.py --device cuda) beside memsh's on the
# same GPU (scripts/phases.star --device cuda), and their difference.
#
#   bash bench/torchref/gpu_compare.sh [CASE ...]
#
# MEMSH=path uses that memsh binary instead of building one.
# CASE: mlp_adam_foreach mlp_sgd_momentum gpt2_tiny cnn_bn (default: all).
set -euo pipefail
cd "$(dirname "$0")/../.."
CASES=("$@")
[ ${#CASES[@]} -gt 0 ] || CASES=(mlp_adam_foreach mlp_sgd_momentum gpt2_tiny cnn_bn)
PY=${PYTHON:-python3}
out=$(mktemp -d)
if [ -n "${MEMSH:-}" ]; then cp "$MEMSH" "$out/memsh"; else go build -o "$out/memsh" ./cmd/memsh; fi
"$PY" bench/torchref/torchref.py --device cuda --out "$out/torch" "${CASES[@]}"
for c in "${CASES[@]}"; do
  "$out/memsh" --device cuda scripts/phases.star "$c" --json > "$out/$c.memsh.jsonl"
  "$PY" bench/torchref/compare.py "$out/torch/$c.json" "$out/$c.memsh.jsonl"
done
