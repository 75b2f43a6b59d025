#!/usr/bin/env python3
"""bench/gpu/torch_fit.py: what `memsh fit` predicts, measured by PyTorch on a real GPU.

Builds GPT-2 exactly as scripts/models/gpt2.star does (nanoGPT's layout,
parameters created in the same order, tied lm_head) — and, with --model,
the fit table's other models (bench/gpu/torch_models.py: Llama 3.2 1B as
scripts/models/llama.star builds it, Hugging Face's own LlamaForCausalLM,
torchvision's ResNet-18/-50) — and trains it as scripts/fit.star's trial
does: bf16 autocast forward and cross entropy, backward, AdamW(lr=1e-4)
step, zero_grad(set_to_none=True), twice.

The default device is CUDA (torch.set_default_device), so AdamW's step
counters (torch.tensor(0.0)) are on the GPU: 512 bytes per parameter that
a script moving its model to the GPU keeps on the host, as memsh does.

  python3 bench/gpu/torch_fit.py phases [--model gpt2-small] [--batch B] [--seq T]
        [--checkpoint] [--attention math|sdpa]
      one JSON line per point (model, optimizer, data, then forward,
      backward, step, zero_grad per step, release): torch.cuda's allocated
      bytes at the point and the peak since the previous one. Its memsh twin
      is scripts/fit_phases.star.
  python3 bench/gpu/torch_fit.py search [--model gpt2-small] [--seq T] [--checkpoint]
        [--over batch|seq] [--batch B] [--high N] [--fresh]
      the largest batch (or, --over seq, the longest sequence at --batch,
      doubling from --seq) that trains, each trial after empty_cache as memsh's
      sweeps do (galloping from 1, then bisection): one JSON line per trial
      and a last line with the boundary, the free memory before the first
      trial and the allocated bytes that outlive a trial (cuBLAS workspaces).
      --fresh frees those before every trial
      (torch._C._cuda_clearCublasWorkspaces()), as fit.star's trials do.
  python3 bench/gpu/torch_fit.py trace [--batch B] [--checkpoint] ...
      every allocator event of one trial, one JSON line each.
  python3 bench/gpu/torch_fit.py context
      the device memory a CUDA context and PyTorch's first allocation take.
  python3 bench/gpu/torch_fit.py oom
      PyTorch's out-of-memory message, for memsh's to be compared with.
  python3 bench/gpu/torch_fit.py dry --model M [--checkpoint]
      the training code paths on the CPU with tiny models (any PyTorch,
      no GPU): a check of this script before a GPU run.

Needs PyTorch 2.x with CUDA. bench/gpu/run.sh runs all of it.
"""
import argparse
import gc
import json
import math
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint as cp

import torch_models

DEVICE = "cuda"  # --dry: "cpu", tiny configs, no memory figures (checks the code paths without a GPU)

CONFIGS = {
    "gpt2-small": dict(n_layer=12, n_head=12, n_embd=768),
    "gpt2-medium": dict(n_layer=24, n_head=16, n_embd=1024),
    "gpt2-large": dict(n_layer=36, n_head=20, n_embd=1280),
    "gpt2-xl": dict(n_layer=48, n_head=25, n_embd=1600),
}
VOCAB = 50257
BLOCK = 1024
STEPS = 2


class Attention(nn.Module):
    # Members created in gpt2.star's order: c_attn, c_proj, the causal mask.
    def __init__(self, n_embd, n_head, attention):
        super().__init__()
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)
        self.attn_dropout = nn.Dropout(0.0)
        self.resid_dropout = nn.Dropout(0.0)
        self.n_head, self.n_embd, self.attention = n_head, n_embd, attention
        if attention == "math":
            self.register_buffer("bias", torch.ones(BLOCK, BLOCK).tril().view(1, 1, BLOCK, BLOCK))

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        hd = C // self.n_head
        q = q.view(B, T, self.n_head, hd).transpose(1, 2)
        k = k.view(B, T, self.n_head, hd).transpose(1, 2)
        v = v.view(B, T, self.n_head, hd).transpose(1, 2)
        if self.attention == "sdpa":
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=0.0, is_causal=True)
        else:
            att = q.matmul(k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
            mask = self.bias.narrow(2, 0, T).narrow(3, 0, T)
            att = att.masked_fill(mask.eq(0), float("-inf"))
            att = att.softmax(-1)
            att = self.attn_dropout(att)
            y = att.matmul(v)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, n_embd):
        super().__init__()
        self.c_fc = nn.Linear(n_embd, 4 * n_embd)
        self.gelu = nn.GELU(approximate="tanh")
        self.c_proj = nn.Linear(4 * n_embd, n_embd)
        self.dropout = nn.Dropout(0.0)

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    # gpt2.star evaluates the attention's members before ln_1 (they are
    # arguments of the call that builds the block): the same order here.
    def __init__(self, n_embd, n_head, attention):
        super().__init__()
        attn = Attention(n_embd, n_head, attention)
        self.ln_1 = nn.LayerNorm(n_embd)
        self.attn = attn
        self.ln_2 = nn.LayerNorm(n_embd)
        self.mlp = MLP(n_embd)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        x = x + self.mlp(self.ln_2(x))
        return x


class GPT(nn.Module):
    def __init__(self, n_layer, n_head, n_embd, attention="math", checkpoint=False):
        super().__init__()
        blocks = [Block(n_embd, n_head, attention) for _ in range(n_layer)]
        self.wte = nn.Embedding(VOCAB, n_embd)
        self.wpe = nn.Embedding(BLOCK, n_embd)
        self.drop = nn.Dropout(0.0)
        self.h = nn.ModuleList(blocks)
        self.ln_f = nn.LayerNorm(n_embd)
        self.lm_head = nn.Linear(n_embd, VOCAB, bias=False)
        self.lm_head.weight = self.wte.weight  # weight tying: the lm_head's own weight is freed
        self.checkpoint = checkpoint

    def forward(self, idx):
        B, T = idx.shape
        pos = torch.arange(T, device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        for block in self.h:
            x = cp.checkpoint(block, x, use_reentrant=False) if self.checkpoint else block(x)
        return self.lm_head(self.ln_f(x))


def forward_loss(model, x, y):
    out = model(x)
    return F.cross_entropy(out.view(-1, out.shape[-1]), y.view(-1))


def build(a):
    """(model, make_data(batch, seq), loss(model, x, y)) for a.model."""
    if a.model in CONFIGS:
        model = GPT(**CONFIGS[a.model], attention=a.attention, checkpoint=a.checkpoint)
        return model, lambda b, s: (torch.randint(0, VOCAB, (b, s)), torch.randint(0, VOCAB, (b, s))), forward_loss
    return torch_models.BUILDERS[a.model](a.checkpoint)


def train(a, batch, seq, point=None):
    """fit.star's trial: STEPS steps; point(name) is called at each phase's end."""
    point = point or (lambda name, step=0: None)
    model, make_data, loss_fn = build(a)
    point("model")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    point("optimizer")
    x, y = make_data(batch, seq)
    point("data")
    for step in range(1, STEPS + 1):
        with torch.autocast(DEVICE, dtype=torch.bfloat16):
            loss = loss_fn(model, x, y)
        point("forward", step)
        loss.backward()
        loss = None
        point("backward", step)
        opt.step()
        point("step", step)
        opt.zero_grad(set_to_none=True)
        point("zero_grad", step)
    del model, opt, x, y


def cmd_phases(a):
    torch.set_default_device("cuda")
    torch.manual_seed(0)
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()

    def point(name, step=0):
        torch.cuda.synchronize()
        rec = dict(model=a.model, batch=a.batch, seq=a.seq, checkpoint=a.checkpoint, attention=a.attention,
                   point=name, step=step,
                   allocated=torch.cuda.memory_allocated() - base,
                   peak=torch.cuda.max_memory_allocated() - base,
                   reserved=torch.cuda.memory_reserved())
        free, total = torch.cuda.mem_get_info()
        rec["nonpytorch"] = total - free - torch.cuda.memory_reserved()
        print(json.dumps(rec), flush=True)
        torch.cuda.reset_peak_memory_stats()

    train(a, a.batch, a.seq, point)
    gc.collect()
    point("release")


def trial(a, b, s=None):
    s = s or a.seq
    gc.collect()
    if a.fresh:
        # as a fresh process: the cuBLAS workspaces allocated again where
        # this trial's first products put them (memsh: sweep.max_fit fresh=True)
        torch._C._cuda_clearCublasWorkspaces()
    torch.cuda.empty_cache()
    torch.cuda.synchronize()
    start = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    ok, err = True, None
    try:
        train(a, b, s)
        torch.cuda.synchronize()
    except torch.OutOfMemoryError:
        ok = False
    except RuntimeError as e:  # cuDNN's own failures at huge batches, say: not an OOM, recorded
        ok, err = False, str(e)[:300]
    gc.collect()
    peak = torch.cuda.max_memory_allocated() - start
    free, total = torch.cuda.mem_get_info()
    # what the process holds on the device outside PyTorch's allocator
    # (context, loaded kernels, cuBLAS handles): what a simulator's ctx= is
    nonpytorch = total - free - torch.cuda.memory_reserved()
    print(json.dumps(dict(model=a.model, seq=s, checkpoint=a.checkpoint, attention=a.attention,
                          batch=b, fits=ok, peak=peak, kept=torch.cuda.memory_allocated() - start,
                          reserved_peak=torch.cuda.max_memory_reserved(), nonpytorch=nonpytorch,
                          **({"error": err} if err else {}))), flush=True)
    return ok


def cmd_search(a):
    """The largest batch (--over batch) or sequence (--over seq, at --batch,
    doubling from --seq up to --high) that trains: sweep.max_fit's binsearch."""
    torch.set_default_device("cuda")
    torch.manual_seed(0)
    torch.cuda.init()
    free0, total = torch.cuda.mem_get_info()
    if a.over == "seq":
        fits = lambda n: trial(a, a.batch, n)
        lo, hi, high = 0, a.seq, a.high
    else:
        fits = lambda n: trial(a, n)
        lo, hi, high = 0, 1, a.high
    while fits(hi):  # lo fits (0: none yet), hi is the next to try
        lo = hi
        if hi >= high:
            break
        hi = min(hi * 2, high)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    gc.collect()
    torch.cuda.empty_cache()
    rec = dict(model=a.model, seq=a.seq, checkpoint=a.checkpoint, attention=a.attention)
    if a.over == "seq":
        rec.update(batch=a.batch, longest_seq=lo, first_oom=hi if hi > lo else None)
    else:
        rec.update(largest_batch=lo, first_oom=hi if hi > lo else None)
    rec.update(free_before=free0, total=total, allocated_after=torch.cuda.memory_allocated(),
               device=torch.cuda.get_device_name(), torch=torch.__version__)
    print(json.dumps(rec), flush=True)


def cmd_dry(a):
    """The code paths of train() on the CPU with tiny models (no GPU, no figures)."""
    global DEVICE
    DEVICE = "cpu"
    torch_models.LLAMA_3_2_1B.update(n_layers=2, dim=64, n_heads=4, n_kv_heads=2, ffn_dim=128, vocab_size=1000)
    CONFIGS[a.model if a.model in CONFIGS else "gpt2-small"].update(n_layer=2, n_head=2, n_embd=32)
    seen = []
    train(a, a.batch, a.seq, lambda name, step=0: seen.append(name))
    print(a.model, "checkpoint" if a.checkpoint else "", " ".join(seen))


def cmd_trace(a):
    """Every allocator event of one trial (torch.cuda.memory._record_memory_history),
    one JSON line each: action, size, address, stream and the innermost Python
    frames (file:line function), for an event-by-event comparison with memsh's
    cuda.record_memory_history."""
    torch.set_default_device("cuda")
    torch.manual_seed(0)
    torch.cuda.memory._record_memory_history(max_entries=2000000, stacks="all" if a.cpp else "python")
    train(a, a.batch, a.seq)
    gc.collect()
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    for dev, trace in enumerate(snap["device_traces"]):
        for e in trace:
            frames = e.get("frames", [])
            py = [f for f in frames if f["filename"].endswith(".py")]
            fr = ["%s:%d %s" % (f["filename"].rsplit("/", 1)[-1], f["line"], f["name"]) for f in py[:6]]
            rec = dict(a=e["action"], s=e["size"], addr=e["addr"], st=e.get("stream", 0), f=fr)
            if a.cpp:
                # the autograd node and the ATen op that allocated (C++ frames)
                rec["node"] = next((f["name"] for f in frames if "Backward" in f["name"] and "apply" in f["name"]), "")
                rec["op"] = next((f["name"] for f in frames if f["name"].startswith("at::native::") or f["name"].startswith("at::_ops::")), "")
            print(json.dumps(rec))


def cmd_context(a):
    import subprocess
    def smi():
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used,memory.total", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True).stdout.strip()
        return out
    before = smi()
    free, total = torch.cuda.mem_get_info()  # creates the context
    ctx_free = free
    t = torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    free2, _ = torch.cuda.mem_get_info()
    rec = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, cuda=torch.version.cuda,
               total=total, props_total=torch.cuda.get_device_properties(0).total_memory,
               smi_before_MiB=before, smi_after_MiB=smi(),
               free_after_context=ctx_free, free_after_first_tensor=free2,
               reserved=torch.cuda.memory_reserved())
    try:
        import pynvml
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        rec["nvml_procs"] = [dict(pid=p.pid, used=p.usedGpuMemory) for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)]
        m = pynvml.nvmlDeviceGetMemoryInfo(h)
        rec["nvml_total"], rec["nvml_used"], rec["nvml_free"] = m.total, m.used, m.free
    except Exception as e:  # NVML may be missing or refuse per-process figures
        rec["nvml_error"] = repr(e)
    # the first matmul creates cuBLAS's handle and workspace
    w = torch.randn(256, 256, device="cuda")
    before_mm = torch.cuda.memory_allocated()
    free3, _ = torch.cuda.mem_get_info()
    (w @ w).sum().item()
    (w.bfloat16() @ w.bfloat16()).sum().item()
    torch.cuda.synchronize()
    free4, _ = torch.cuda.mem_get_info()
    rec["cublas_allocated"] = torch.cuda.memory_allocated() - before_mm  # workspaces through the caching allocator
    rec["cublas_driver_bytes"] = free3 - free4
    rec["memory_stats_after_matmul"] = {k: v for k, v in torch.cuda.memory_stats().items()
                                        if k.startswith(("allocated_bytes.all.current", "reserved_bytes.all.current", "allocation.all.current"))}
    print(json.dumps(rec), flush=True)


def cmd_oom(a):
    free, total = torch.cuda.mem_get_info()
    for name, fn in [
        ("huge", lambda: torch.empty(total * 2, dtype=torch.uint8, device="cuda")),
        ("after_half", None),
    ]:
        keep = None
        try:
            if fn is None:
                keep = torch.empty(free // 2, dtype=torch.uint8, device="cuda")
                torch.empty(free // 2 + (1 << 30), dtype=torch.uint8, device="cuda")
            else:
                fn()
        except torch.OutOfMemoryError as e:
            print(json.dumps(dict(case=name, message=str(e))), flush=True)
        del keep
        torch.cuda.empty_cache()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("cmd", choices=["phases", "search", "context", "oom", "trace", "dry"])
    ap.add_argument("--model", default="gpt2-small", choices=sorted(CONFIGS) + sorted(torch_models.BUILDERS))
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--checkpoint", action="store_true")
    ap.add_argument("--attention", default="math", choices=["math", "sdpa"])
    ap.add_argument("--over", default="batch", choices=["batch", "seq"], help="search: what grows")
    ap.add_argument("--high", type=int, default=1 << 20, help="search: the largest size tried")
    ap.add_argument("--fresh", action="store_true", help="search: free the cuBLAS workspaces before each trial, as scripts/fit.star's fresh=True")
    ap.add_argument("--cpp", action="store_true", help="trace: record C++ frames too (autograd node and ATen op of each event)")
    a = ap.parse_args()
    {"phases": cmd_phases, "search": cmd_search, "context": cmd_context, "oom": cmd_oom, "trace": cmd_trace, "dry": cmd_dry}[a.cmd](a)


if __name__ == "__main__":
    main()
