#!/usr/bin/env bash
# Whole-program training-step benchmarks: memsh on --device cpu against
# PyTorch CPU (Debian's python3-torch) with the same thread count, and a
# GPT-2 XL step on a simulated 80 GiB meta device. Results in
# bench/README.md ("Training steps").
set -euo pipefail
cd "$(dirname "$0")/../.."
THREADS=${THREADS:-$(nproc)}
go build -o /tmp/memsh-bench ./cmd/memsh
export GOMAXPROCS=$THREADS
for i in 1 2 3; do
  /tmp/memsh-bench --device cpu bench/train/mlp_step.star 20
  THREADS=$THREADS /usr/bin/python3 bench/train/mlp_step.py 20
  /tmp/memsh-bench --device cpu --load-path scripts bench/train/gpt2_step.star 5
  THREADS=$THREADS /usr/bin/python3 bench/train/gpt2_step.py 5
done
/usr/bin/time -f "gpt2-xl step on sim:80GiB,meta: %e s wall (whole process, 2 steps)" \
  /tmp/memsh-bench --device sim:80GiB,meta scripts/gpt2_train.star xl 8 1024 > /dev/null
