#!/bin/sh
# bench/tensor/run.sh: memsh's tensor kernels against NumPy on this
# machine, in one run. Times float32 elementwise add and matmul at 1024²,
# 2048² and 4096² in a memsh Session (main.go) and in NumPy
# (numpy_bench.py, run by main.go size by size between its own
# measurements), measures the memory bandwidth and the best sgemm rate, and
# prints a Markdown table for bench/README.md.
#
# Usage: bench/tensor/run.sh [SIZES]        (default 1024,2048,4096)
#
# NumPy comes from Debian's python3-numpy with OpenBLAS
# (libopenblas0-pthread, which memsh then also loads for matmul). When
# they are missing and this runs as root, they are installed with apt-get:
# a developer's benchmark step, never part of CI or the build.
set -eu

cd "$(dirname "$0")/../.."
SIZES=${1:-1024,2048,4096}
PY=/usr/bin/python3 # Debian's python, which sees python3-numpy

if ! "$PY" -c 'import numpy' 2>/dev/null || ! ls /usr/lib/*/libopenblas.so.0 >/dev/null 2>&1; then
	if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
		echo "installing python3-numpy and libopenblas0-pthread (benchmark only)" >&2
		apt-get install -y python3-numpy libopenblas0-pthread >&2 ||
			{ apt-get update >&2 && apt-get install -y python3-numpy libopenblas0-pthread >&2; }
	else
		echo "run.sh: needs python3-numpy and libopenblas0-pthread (apt-get install, as root)" >&2
		exit 1
	fi
fi

go run ./bench/tensor -python "$PY" -sizes "$SIZES"
