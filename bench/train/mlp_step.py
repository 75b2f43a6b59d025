# The same MLP training step in PyTorch (CPU), timed the same way.
#   /usr/bin/python3 bench/train/mlp_step.py [STEPS]
import sys, time, torch
import torch.nn as nn, torch.nn.functional as F
torch.set_num_threads(int(__import__("os").environ.get("THREADS", torch.get_num_threads())))
STEPS = int(sys.argv[1]) if len(sys.argv) > 1 else 20
model = nn.Sequential(nn.Linear(512, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10))
opt = torch.optim.Adam(model.parameters(), lr=1e-3, foreach=True)
x = torch.randn(64, 512)
y = torch.randint(0, 10, (64,))
def step():
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
step()
t = time.perf_counter()
for _ in range(STEPS):
    step()
print("pytorch mlp step: %d us (threads %d)" % ((time.perf_counter() - t) * 1e6 / STEPS, torch.get_num_threads()))
