#!/bin/sh
# bench/kernels/run.sh: memsh's transcendental (exp, log, tanh, sigmoid),
# random (rand, randn, randint) and transpose-copy kernels against NumPy
# and PyTorch CPU on this machine, same thread count, and a Markdown table
# for bench/README.md.
#
# Usage: bench/kernels/run.sh [BASE_COMMIT]
#
# With BASE_COMMIT, that commit's memsh is built too (in a temporary git
# worktree) and timed with the same script, for a before/after column.
# Every program runs ROUNDS times (default 2), interleaved; the table
# keeps each figure's best round (see table.py). memsh runs in its
# default mode (exact peaks), as a user runs it.
# NumPy and PyTorch come from Debian's python3-numpy and python3-torch;
# as root they are apt-installed when missing (a developer's benchmark
# step, never part of CI or the build).
set -eu

cd "$(dirname "$0")/../.."
PY=/usr/bin/python3
THREADS=${THREADS:-$(nproc)}
export THREADS GOMAXPROCS=$THREADS
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT

if ! "$PY" -c 'import numpy, torch' 2>/dev/null; then
	if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
		apt-get install -y python3-numpy python3-torch >&2
	else
		echo "run.sh: needs python3-numpy and python3-torch (apt-get install, as root)" >&2
		exit 1
	fi
fi

go build -o "$OUT/memsh" ./cmd/memsh
if [ $# -ge 1 ]; then
	git worktree add -q --detach "$OUT/base" "$1"
	(cd "$OUT/base" && go build -o "$OUT/memsh-base" ./cmd/memsh)
	git worktree remove --force "$OUT/base"
fi
# ROUNDS rounds, each running every program once in turn (interleaved, so
# that a noisy minute of the shared VM falls on all of them alike).
for round in $(seq "${ROUNDS:-2}"); do
	if [ -x "$OUT/memsh-base" ]; then
		"$OUT/memsh-base" --device cpu bench/kernels/kernels.star | sed 's/^memsh/before/' >>"$OUT/times"
	fi
	"$OUT/memsh" --device cpu bench/kernels/kernels.star >>"$OUT/times"
	"$PY" bench/kernels/torch_bench.py >>"$OUT/times"
done
"$PY" bench/kernels/table.py "$OUT/times"
