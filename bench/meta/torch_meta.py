"""bench/meta/torch_meta.py N: meta_ops.star's op mix on PyTorch's meta
device, N rounds of 8 ops; prints seconds per op."""
import sys, time
import torch
n = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
x = torch.zeros(64, 1024, device="meta")
w = torch.zeros(1024, 1024, device="meta")
b = torch.zeros(1024, device="meta")
def rounds(n):
    for i in range(n):
        h = torch.matmul(x, w)
        h = h + b
        h = torch.nn.functional.gelu(h)
        h = h + x
        m = h.mean(-1, keepdim=True)
        h = (h - m) * 2.0
        s = torch.nn.functional.softmax(h, -1)
        t = s.t().contiguous()
rounds(100)  # warm up
t0 = time.perf_counter()
rounds(n)
print(f"pytorch meta: {(time.perf_counter() - t0) / (8 * n) * 1e6:.2f} us/op")
