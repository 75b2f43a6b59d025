"""bench/kernels/activations_backward.py: activations_backward.star's
forward and backward in PyTorch CPU, 2 threads (THREADS)."""
import os
import torch, time
torch.set_num_threads(int(os.environ.get("THREADS", "2")))
F = torch.nn.functional
n = 1 << 20
x = (torch.rand(n // 1024, 1024) * 20 - 10).requires_grad_()
g = torch.randn(n // 1024, 1024)
for name, f in [("silu", F.silu), ("gelu", F.gelu), ("gelu_tanh", lambda t: F.gelu(t, approximate="tanh")), ("softmax", lambda t: F.softmax(t, -1)), ("log_softmax", lambda t: F.log_softmax(t, -1))]:
    def run():
        f(x).backward(g); x.grad = None
    for _ in range(3): run()
    ts = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(10): run()
        ts.append((time.perf_counter() - t0) / 10)
    print("torch fwd+bwd", name, min(ts) * 1000, "ms")
