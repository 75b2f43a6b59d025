"""NumPy half of bench/tensor: times the same float32 operations as
memsh's tensorbench (main.go) and prints one JSON object on stdout.

Usage: python3 numpy_bench.py [--bandwidth] [SIZES]   (SIZES like 1024,2048)

main.go runs it once per size, between its own measurements of the sizes,
so that both see the same machine conditions; --bandwidth adds the
single-thread copy bandwidth.

The repetition counts, warm-up and operations mirror main.go: each
operation is a Python function holding the same statement as the Starlark
function memsh times, called once per timed repetition.
"""

import json
import os
import sys
import time

import numpy as np

MIB = 1 << 20


def reps(op, n):
    """(warm-up, timed) repetitions: the same rule as main.go's reps."""
    if op.startswith("add"):
        # Warm-up covers more than memsh's 256 MiB reclaim pacing window.
        return 320 * MIB // (4 * n * n) + 2, {1024: 300, 2048: 100}.get(n, 30)
    return 2, {1024: 20, 2048: 5}.get(n, 3)


ROUNDS = 3


def timed(fn, warm, count):
    """The lowest mean of ROUNDS rounds of count calls, and the fastest call."""
    for _ in range(warm):
        fn()
    means, fastest = [], float("inf")
    for _ in range(ROUNDS):
        ts = []
        for _ in range(count):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
        means.append(sum(ts) / len(ts))
        fastest = min(fastest, min(ts))
    return {"mean_s": min(means), "min_s": fastest, "reps": count}


def bandwidth():
    """Single-thread copy of 512 MiB (STREAM "Copy": 2 bytes moved per byte
    copied), best of 5, in GB/s."""
    n = 512 * MIB // 4
    src = np.ones(n, dtype=np.float32)
    dst = np.empty_like(src)
    np.copyto(dst, src)
    best = min(_copy_time(dst, src) for _ in range(5))
    return 2 * 4 * n / best / 1e9


def _copy_time(dst, src):
    t0 = time.perf_counter()
    np.copyto(dst, src)
    return time.perf_counter() - t0


def blas_libraries():
    """The BLAS libraries mapped into this process (after a matmul)."""
    libs = set()
    with open("/proc/self/maps") as f:
        for line in f:
            path = line.split()[-1]
            if "blas" in os.path.basename(path) or "lapack" in os.path.basename(path):
                libs.add(path)
    return sorted(libs)


def main():
    args = sys.argv[1:]
    want_bw = "--bandwidth" in args
    args = [a for a in args if a != "--bandwidth"]
    sizes = [int(s) for s in args[0].split(",")] if args and args[0] else []
    rng = np.random.default_rng(0)
    results = []
    for n in sizes:
        a = rng.random((n, n), dtype=np.float32)
        b = rng.random((n, n), dtype=np.float32)
        c = np.empty((n, n), dtype=np.float32)

        def add_out():
            np.add(a, b, out=c)

        def add():
            d = a + b  # noqa: F841 (freed on return, as memsh's local)

        def matmul_out():
            np.matmul(a, b, out=c)

        def matmul():
            d = a @ b  # noqa: F841

        for op, fn in (("add_out", add_out), ("add", add), ("matmul_out", matmul_out), ("matmul", matmul)):
            warm, count = reps(op, n)
            r = timed(fn, warm, count)
            r.update(op=op, n=n)
            results.append(r)
            print(f"numpy {op} {n}: mean {r['mean_s'] * 1e3:.3f} ms", file=sys.stderr)
        del a, b, c
    out = {
        "numpy_version": np.__version__,
        "blas": blas_libraries(),
        "bandwidth_gbs": bandwidth() if want_bw else 0,
        "results": results,
    }
    json.dump(out, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
