"""bench/kernels: NumPy and PyTorch CPU timings of the ops kernels.star
times in memsh, with the same thread count (THREADS, default 2) and the
same statements (each allocates its result). Prints one line per op and
library: LIB OP N MIN_S MEAN_S (the lowest and the mean over REPS rounds
of K calls, per call, after WARM warm-up rounds: kernels.star's rule).

Usage: THREADS=2 python3 torch_bench.py
"""

import os
import time

THREADS = int(os.environ.get("THREADS", "2"))
os.environ.setdefault("OMP_NUM_THREADS", str(THREADS))
os.environ.setdefault("OPENBLAS_NUM_THREADS", str(THREADS))

import numpy as np  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(THREADS)
SIZES = [1 << 20, 4 << 20]
WARM, REPS, K = 3, 10, 10


def report(lib, op, n, fn):
    def many():
        for _ in range(K):
            fn()

    for _ in range(WARM):
        many()
    ts = []
    for _ in range(REPS):
        t0 = time.perf_counter()
        many()
        ts.append((time.perf_counter() - t0) / K)
    print(lib, op, n, min(ts), sum(ts) / len(ts), flush=True)


def main():
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    for n in SIZES:
        x = torch.rand(n) * 20 - 10
        xl = torch.rand(n) * 200 + 0.001
        report("torch", "exp", n, lambda: x.exp())
        report("torch", "log", n, lambda: xl.log())
        report("torch", "tanh", n, lambda: x.tanh())
        report("torch", "sigmoid", n, lambda: x.sigmoid())
        report("torch", "rand", n, lambda: torch.rand(n))
        report("torch", "randn", n, lambda: torch.randn(n))
        report("torch", "randint", n, lambda: torch.randint(0, 100, (n,)))
        F = torch.nn.functional
        xr = x.view(n // 1024, 1024)
        xb = xr.bfloat16()
        report("torch", "gelu", n, lambda: F.gelu(xr))
        report("torch", "gelu_tanh", n, lambda: F.gelu(xr, approximate="tanh"))
        report("torch", "silu", n, lambda: F.silu(xr))
        report("torch", "softmax", n, lambda: F.softmax(xr, -1))
        report("torch", "log_softmax", n, lambda: F.log_softmax(xr, -1))
        report("torch", "exp_bf16", n, lambda: xb.exp())
        report("torch", "sigmoid_bf16", n, lambda: xb.sigmoid())
        report("torch", "gelu_bf16", n, lambda: F.gelu(xb))
        report("torch", "silu_bf16", n, lambda: F.silu(xb))
        report("torch", "softmax_bf16", n, lambda: F.softmax(xb, -1))
        a, al = x.numpy(), xl.numpy()
        report("numpy", "exp", n, lambda: np.exp(a))
        report("numpy", "log", n, lambda: np.log(al))
        report("numpy", "tanh", n, lambda: np.tanh(a))
        report("numpy", "sigmoid", n, lambda: 1 / (1 + np.exp(-a)))
        report("numpy", "rand", n, lambda: rng.random(n, dtype=np.float32))
        report("numpy", "randn", n, lambda: rng.standard_normal(n, dtype=np.float32))
        report("numpy", "randint", n, lambda: rng.integers(0, 100, n))
    m = torch.rand(4096, 4096)
    report("torch", "t_contiguous", 4096, lambda: m.t().contiguous())
    mn = m.numpy()
    report("numpy", "t_contiguous", 4096, lambda: np.ascontiguousarray(mn.T))


if __name__ == "__main__":
    main()
