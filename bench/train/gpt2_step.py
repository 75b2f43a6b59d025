# The same small GPT-2 step in PyTorch (CPU), with bench/torchref's nanoGPT
# model (the one the golden files come from).
#   THREADS=2 /usr/bin/python3 bench/train/gpt2_step.py [STEPS]
import os, sys, time
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "torchref"))
import torch
import torch.nn.functional as F
from torchref import GPT
torch.set_num_threads(int(os.environ.get("THREADS", torch.get_num_threads())))
STEPS = int(sys.argv[1]) if len(sys.argv) > 1 else 10
V = 1024
model = GPT(dict(n_layer=4, n_head=4, n_embd=256, vocab_size=V, block_size=128, dropout=0.0, bias=True))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1, foreach=True)
x = torch.randint(0, V, (8, 128))
y = torch.randint(0, V, (8, 128))
def step():
    loss = F.cross_entropy(model(x).view(-1, V), y.view(-1))
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
step()
t = time.perf_counter()
for _ in range(STEPS):
    step()
print("pytorch gpt2 step: %d us (threads %d)" % ((time.perf_counter() - t) * 1e6 / STEPS, torch.get_num_threads()))
