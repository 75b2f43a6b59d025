"""bench/kernels/gelu_torch.py: PyTorch CPU's GELU (erf form) forward on one
thread, in nanoseconds per value, the anchor of tensor's
BenchmarkGeluErfF32 (bench/README.md, "GELU (erf) forward").

For n in 1M and 4M float32 values x = rand·20 − 10, shaped (n/1024, 1024):
the best of 10 rounds of 20 calls of torch._C._nn.gelu(x, out=y) (the
kernel alone: no allocation), and of F.gelu(x) (a new result each call).

  /usr/bin/python3 bench/kernels/gelu_torch.py
"""
import time

import torch
import torch.nn.functional as F

torch.set_num_threads(1)
for n in (1 << 20, 1 << 22):
    x = torch.rand(n // 1024, 1024) * 20 - 10
    y = torch.empty_like(x)
    for name, call in (("out=", lambda: torch._C._nn.gelu(x, out=y)), ("F.gelu", lambda: F.gelu(x))):
        best = float("inf")
        for _ in range(10):
            t0 = time.perf_counter()
            for _ in range(20):
                call()
            best = min(best, (time.perf_counter() - t0) / 20)
        print("%-7s n=%-8d %.3f ns/value" % (name, n, best / n * 1e9))
