#!/usr/bin/env python3
"""bench/torchref/torchref.py: PyTorch reference memory figures for memsh.

Runs small fixed models (and single-op micro-cases) for training steps and
records every tensor allocation and free, phase by phase, as the CUDA
caching allocator's memory_allocated() would count them. Writes one JSON file
per case. See README.md beside this file for the meaning of every figure.

  /usr/bin/python3 bench/torchref/torchref.py [--device cpu|cuda] [--out DIR] [CASE ...]

CPU mode (the default; Debian's python3-torch 1.13 is CPU-only) reads the
profiler's allocation events (torch.profiler.profile(profile_memory=True))
and rounds each to the CUDA allocator's 512-byte granularity. CUDA mode
reads torch.cuda.memory_allocated()/max_memory_allocated() around each phase
(no event list; figures are the real device's).
"""
import argparse
import gc
import json
import math
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

ROUND = 512


def rounded(n):
    """Bytes the CUDA caching allocator counts for an allocation of n bytes."""
    if n == 0:
        return 0
    return max(ROUND, -(-n // ROUND) * ROUND)


def tbytes(t):
    return t.numel() * t.element_size()


# --------------------------------------------------------------------------
# Event recording (CPU mode)

def _is_alloc(ev):
    return type(ev.extra_fields).__name__ == "_ExtraFields_Allocation"


class Recorder:
    """Keeps a running total relative to a baseline across profiler windows.

    Each phase runs under its own torch.profiler.profile window, so no
    record_function marker (whose handle tensors would be allocated inside
    the region) is needed; the windows are back to back and all code of the
    measured region runs inside one of them. Exactness is checked from the
    CPU allocator's own total_allocated figure carried by every event: inside
    a window consecutive events must differ by exactly their size, and
    across windows nothing may be allocated or freed unseen.
    """

    def __init__(self, device):
        self.device = device
        self.cpu_total = 0          # running total, all events, rounded
        self.cuda_total = 0         # running total without host-only events
        self.next_id = 1
        self.live = {}              # ptr -> (alloc id, rounded, raw, host tag, phase, op)
        self.last_alloc_total = None
        self.phases = []

    def phase(self, name, fn, step=None, host_rule=None):
        if self.device == "cuda":
            return self._phase_cuda(name, fn, step)
        from torch.profiler import profile, ProfilerActivity
        gc.collect()
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True,
                     record_shapes=True, with_stack=False) as prof:
            fn()
        evs = []
        order = 0

        def walk(e, ops, ridx):
            nonlocal order
            if _is_alloc(e):
                evs.append((e.start_time_ns, order, e, list(ops), ridx))
                order += 1
            else:
                ops = ops + [e.name]
            for c in e.children:
                walk(c, ops, ridx)

        for ridx, root in enumerate(prof.profiler.kineto_results.experimental_event_tree()):
            walk(root, [], ridx)
        evs.sort(key=lambda x: (x[0], x[1]))
        start_cpu, start_cuda = self.cpu_total, self.cuda_total
        peak_cpu, peak_cuda = start_cpu, start_cuda
        out = []
        for i, (_, _, e, ops, ridx) in enumerate(evs):
            f = e.extra_fields
            raw = f.alloc_size
            # Exactness: the allocator's total moves by exactly this event.
            if self.last_alloc_total is not None:
                assert f.total_allocated - raw == self.last_alloc_total, (
                    "unseen allocation before event", name, i,
                    f.total_allocated, raw, self.last_alloc_total)
            self.last_alloc_total = f.total_allocated
            op = ops[-1] if ops else None
            top = ops[0] if ops else None
            ev = {"ev": "alloc" if raw >= 0 else "free"}
            if raw >= 0:
                aid = self.next_id
                self.next_id += 1
                host = host_rule(raw, ops, name) if host_rule else None
                if host is None:
                    host = default_host_rule(raw, ops, name)

                r = rounded(raw)
                self.live[f.ptr] = (aid, r, raw, host, len(self.phases), op, ridx, ev)
            else:
                rec = self.live.pop(f.ptr, None)
                if rec is None:
                    aid, host, r = None, None, rounded(-raw)
                else:
                    aid, r, _, host = rec[0], rec[1], rec[2], rec[3]
                    assert rec[2] == -raw
                    if rec[4] == len(self.phases) and rec[6] == ridx and ops:
                        # Allocated and freed inside one top-level op (or one
                        # backward node): a temporary / workspace of that op.
                        rec[7]["transient"] = True
                r = -r
            self.cpu_total += r
            if not host:
                self.cuda_total += r
            peak_cpu = max(peak_cpu, self.cpu_total)
            peak_cuda = max(peak_cuda, self.cuda_total)
            ev.update({"id": aid, "bytes": r, "raw": raw, "op": op, "top": top})
            if os.environ.get("TORCHREF_CHAIN") and abs(raw) <= 8:
                ev["chain"] = ops
            if host:
                ev["host"] = host
            ev["total"] = self.cpu_total
            out.append(ev)
        live_at_end = sorted(
            [{"id": v[0], "bytes": v[1], "op": v[5], **({"host": v[3]} if v[3] else {})}
             for v in self.live.values() if v[4] == len(self.phases)],
            key=lambda d: d["id"])
        ph = {
            "phase": name,
            "step": step,
            "start": start_cuda, "end": self.cuda_total, "peak": peak_cuda,
            "cpu_all": {"start": start_cpu, "end": self.cpu_total, "peak": peak_cpu},
            "live_at_end": live_at_end,
            "events": out,
        }
        self.phases.append(ph)
        return ph

    @staticmethod
    def _phase_first_id(out):
        ids = [e["id"] for e in out if e["ev"] == "alloc"]
        return (min(ids) - 1) if ids else 1 << 62

    # ---- CUDA mode -------------------------------------------------------
    def cuda_baseline(self):
        # cuBLAS's workspaces: PyTorch 2.x allocates one through the caching
        # allocator at the first matmul of each thread (the main thread's in
        # the forward, the autograd engine's in the backward) and keeps it.
        # A warm-up creates both before the baseline, so the phases show the
        # tensors alone; the workspaces are reported beside them.
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        w = torch.ones(8, 8, device="cuda", requires_grad=True)
        (w @ w).sum().backward()
        del w
        gc.collect()
        torch.cuda.synchronize()
        self.base = torch.cuda.memory_allocated()
        self.cublas_workspaces = self.base - before

    def _phase_cuda(self, name, fn, step):
        gc.collect()
        torch.cuda.synchronize()
        start = torch.cuda.memory_allocated() - self.base
        torch.cuda.reset_peak_memory_stats()
        fn()
        torch.cuda.synchronize()
        end = torch.cuda.memory_allocated() - self.base
        peak = torch.cuda.max_memory_allocated() - self.base
        ph = {"phase": name, "step": step, "start": start, "end": end, "peak": peak}
        self.phases.append(ph)
        return ph


def default_host_rule(raw, ops, phase):
    """Tags allocations that are host (CPU) tensors on a CUDA run too.

    - "wrapped_scalar": an 8-byte allocation (or a small one outside any
      ATen op) is a Python number wrapped into a 0-dim double/int64 tensor,
      by Python's argument parser for a Tensor overload (x * 0.5) or inside
      an op's Scalar overload (div_(n), add_(1)). On CUDA these stay CPU
      tensors. (No case here has a genuine 8-byte device tensor.)
    - "profiler": the handle tensors of the record_function that
      Optimizer.step and Optimizer.zero_grad open while a profiler runs
      (a 4-byte aten::zeros just before it and a 288-byte aten::empty inside
      it); they exist only under the profiler.
    - "scalar_cast": the 4-byte float32 copy of such a scalar that CPU's
      TensorIterator makes to reach the common dtype (aten::to ->
      aten::_to_copy -> aten::empty_strided inside the op); a CUDA kernel
      reads a CPU scalar directly and makes no copy.
    - "rng_state": torch.get_rng_state()'s 5056-byte CPU ByteTensor that
      checkpoint(preserve_rng_state=True) stashes (on CUDA it also stashes
      the CUDA generator state, again as a CPU tensor).
    - "optimizer_step_counter": Adam/AdamW's per-parameter `step`,
      torch.tensor(0.) made in the first step: a host tensor even for CUDA
      parameters when capturable=False (1.13 and 2.x alike).
    - "optimizer_scalar": any other 0-dim tensor (<= 8 bytes) made in the
      optimizer step (the slow-path foreach ops on the host step counters).
    """
    if ops == ["aten::zeros", "aten::empty"] and raw == 4 and phase in ("step", "zero_grad"):
        return "profiler"
    if len(ops) == 2 and ops[0].startswith("Optimizer.") and ops[1] == "aten::empty" and raw == 288:
        return "profiler"
    if raw == 5056:
        return "rng_state"
    if raw == 4 and ops[-3:] == ["aten::to", "aten::_to_copy", "aten::empty_strided"]:
        return "scalar_cast"
    if phase == "step" and raw == 4 and len(ops) == 2 and ops[0].startswith("Optimizer.step#") \
            and ops[1] == "aten::empty":
        return "optimizer_step_counter"
    if raw == 8 or (not ops and raw <= 8):
        return "wrapped_scalar"
    if phase == "step" and raw <= 8:
        return "optimizer_scalar"
    return None


# --------------------------------------------------------------------------
# Models

class MLP(nn.Sequential):
    def __init__(self):
        super().__init__(nn.Linear(512, 1024), nn.ReLU(), nn.Linear(1024, 1024),
                         nn.ReLU(), nn.Linear(1024, 10))


class DropMLP(nn.Sequential):
    def __init__(self):
        super().__init__(nn.Linear(512, 1024), nn.ReLU(), nn.Dropout(0.1),
                         nn.Linear(1024, 10))


class CkptMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(512, 1024)
        self.block = nn.Sequential(nn.Linear(1024, 1024), nn.ReLU())
        self.fc3 = nn.Linear(1024, 10)

    def forward(self, x):
        import torch.utils.checkpoint as cp
        h = F.relu(self.fc1(x))
        h = cp.checkpoint(self.block, h, use_reentrant=False)
        return self.fc3(h)


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.c_attn = nn.Linear(cfg["n_embd"], 3 * cfg["n_embd"], bias=cfg["bias"])
        self.c_proj = nn.Linear(cfg["n_embd"], cfg["n_embd"], bias=cfg["bias"])
        self.n_head = cfg["n_head"]
        self.n_embd = cfg["n_embd"]
        bs = cfg["block_size"]
        self.register_buffer("bias", torch.tril(torch.ones(bs, bs)).view(1, 1, bs, bs))

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        hd = C // self.n_head
        k = k.view(B, T, self.n_head, hd).transpose(1, 2)
        q = q.view(B, T, self.n_head, hd).transpose(1, 2)
        v = v.view(B, T, self.n_head, hd).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        y = att @ v
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class GPTMLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.c_fc = nn.Linear(cfg["n_embd"], 4 * cfg["n_embd"], bias=cfg["bias"])
        self.c_proj = nn.Linear(4 * cfg["n_embd"], cfg["n_embd"], bias=cfg["bias"])

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg["n_embd"])
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg["n_embd"])
        self.mlp = GPTMLP(cfg)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        x = x + self.mlp(self.ln_2(x))
        return x


class GPT(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(cfg["vocab_size"], cfg["n_embd"]),
            wpe=nn.Embedding(cfg["block_size"], cfg["n_embd"]),
            h=nn.ModuleList([Block(cfg) for _ in range(cfg["n_layer"])]),
            ln_f=nn.LayerNorm(cfg["n_embd"]),
        ))
        self.lm_head = nn.Linear(cfg["n_embd"], cfg["vocab_size"], bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # tied

    def forward(self, idx):
        B, T = idx.size()
        pos = torch.arange(0, T, dtype=torch.long, device=idx.device)
        x = self.transformer.wte(idx) + self.transformer.wpe(pos)
        for blk in self.transformer.h:
            x = blk(x)
        x = self.transformer.ln_f(x)
        return self.lm_head(x)


GPT_CFG = dict(n_layer=2, n_head=4, n_embd=128, vocab_size=512, block_size=64,
               dropout=0.0, bias=True)


def cnn():
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * 8 * 8, 10))


# Hugging Face decoder families: bench/torchref/hf_families.py
from hf_families import HFCausalLM, MOE_TINY, MOE_BATCH, MOE_SEQ, hf_models, hf_tiny, moe_desc, moe_inputs  # noqa: E402


MLP_DESC = ("nn.Sequential(nn.Linear(512, 1024), nn.ReLU(), nn.Linear(1024, 1024), "
            "nn.ReLU(), nn.Linear(1024, 10)); x = torch.randn(64, 512); "
            "y = torch.randint(0, 10, (64,)); loss = F.cross_entropy(out, y)")

MODELS = {
    "mlp_adam_foreach": dict(
        build=MLP, inputs=lambda: (torch.randn(64, 512), torch.randint(0, 10, (64,))),
        opt=lambda p: torch.optim.Adam(p, lr=1e-3, foreach=True),
        desc=MLP_DESC + "; torch.optim.Adam(lr=1e-3, foreach=True)"),
    "mlp_adam_forloop": dict(
        build=MLP, inputs=lambda: (torch.randn(64, 512), torch.randint(0, 10, (64,))),
        opt=lambda p: torch.optim.Adam(p, lr=1e-3, foreach=False),
        desc=MLP_DESC + "; torch.optim.Adam(lr=1e-3, foreach=False)"),
    "mlp_sgd_momentum": dict(
        build=MLP, inputs=lambda: (torch.randn(64, 512), torch.randint(0, 10, (64,))),
        opt=lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
        desc=MLP_DESC + "; torch.optim.SGD(lr=0.1, momentum=0.9) "
             "(foreach=None, which 1.13 turns into foreach=False: the per-parameter loop)"),
    "mlp_dropout": dict(
        build=DropMLP, inputs=lambda: (torch.randn(64, 512), torch.randint(0, 10, (64,))),
        opt=lambda p: torch.optim.SGD(p, lr=0.1),
        desc="nn.Sequential(nn.Linear(512, 1024), nn.ReLU(), nn.Dropout(0.1), nn.Linear(1024, 10)); "
             "x = torch.randn(64, 512); y = torch.randint(0, 10, (64,)); F.cross_entropy; "
             "torch.optim.SGD(lr=0.1) (no momentum, per-parameter loop)"),
    "checkpoint_mlp": dict(
        build=CkptMLP, inputs=lambda: (torch.randn(64, 512), torch.randint(0, 10, (64,))),
        opt=lambda p: torch.optim.SGD(p, lr=0.1),
        desc="fc1 = Linear(512, 1024); block = Sequential(Linear(1024, 1024), ReLU()); "
             "fc3 = Linear(1024, 10); forward: h = F.relu(fc1(x)); "
             "h = torch.utils.checkpoint.checkpoint(block, h, use_reentrant=False) "
             "(preserve_rng_state=True, the default); out = fc3(h); x = torch.randn(64, 512); "
             "y = torch.randint(0, 10, (64,)); F.cross_entropy; torch.optim.SGD(lr=0.1)"),
    "gpt2_tiny": dict(
        build=lambda: GPT(GPT_CFG),
        inputs=lambda: (torch.randint(0, 512, (4, 64)), torch.randint(0, 512, (4, 64))),
        opt=lambda p: torch.optim.AdamW(p, lr=1e-3, weight_decay=0.1, foreach=True),
        loss=lambda out, y: F.cross_entropy(out.view(-1, out.size(-1)), y.view(-1)),
        desc="nanoGPT-style GPT-2, n_layer=2 n_head=4 n_embd=128 vocab_size=512 block_size=64 "
             "dropout=0 bias=True, tied wte/lm_head, learned wpe, pre-LN blocks, math attention "
             "with a registered tril mask buffer, GELU(tanh) MLP 4x; B=4 T=64; "
             "idx, targets = torch.randint(0, 512, (4, 64)) each; "
             "F.cross_entropy(logits.view(-1, 512), targets.view(-1)); "
             "torch.optim.AdamW(lr=1e-3, weight_decay=0.1, foreach=True). "
             "See README.md for the full code."),
    "cnn_bn": dict(
        build=cnn, inputs=lambda: (torch.randn(32, 3, 32, 32), torch.randint(0, 10, (32,))),
        opt=lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
        desc="nn.Sequential(Conv2d(3,16,3,padding=1), BatchNorm2d(16), ReLU(), MaxPool2d(2), "
             "Conv2d(16,32,3,padding=1), BatchNorm2d(32), ReLU(), MaxPool2d(2), Flatten(), "
             "Linear(32*8*8, 10)); x = torch.randn(32, 3, 32, 32); "
             "y = torch.randint(0, 10, (32,)); F.cross_entropy; "
             "torch.optim.SGD(lr=0.1, momentum=0.9)"),
}

for _name in MOE_TINY:
    MODELS[_name] = dict(
        build=(lambda n: lambda: HFCausalLM(hf_tiny(MOE_TINY[n]), MOE_BATCH, MOE_SEQ))(_name),
        inputs=(lambda n: lambda: moe_inputs(n))(_name),
        opt=lambda p: torch.optim.AdamW(p, lr=1e-3, weight_decay=0.1, foreach=True),
        lm=True, desc=moe_desc(_name))

# Hugging Face transformers' dense causal LMs (bench/torchref/hf_families.py):
# hf_<family>_tiny and hf_<family>_long, language models (lm) computing their
# own loss in the forward phase.
MODELS.update(hf_models())

# Frozen layers, LoRA and QLoRA (bench/torchref/peft_ref.py)
import peft_ref  # noqa: E402
from hf_families import LLAMA_TINY, LLAMA_QTINY  # noqa: E402


def _frozen_mlp(i):
    return dict(
        build=lambda: peft_ref.FrozenMLP(i), inputs=lambda: (torch.randn(64, 512), torch.randint(0, 10, (64,))),
        opt=lambda p: torch.optim.AdamW(p, lr=1e-3, foreach=True), frozen=True,
        desc=MLP_DESC + "; model[%d].requires_grad_(False); torch.optim.AdamW(model.parameters(), lr=1e-3, "
             "foreach=True) (the frozen parameters have no grad: AdamW skips them)" % i)


MODELS["frozen_mlp_first"] = _frozen_mlp(0)
MODELS["frozen_mlp_middle"] = _frozen_mlp(2)


def _llama_peft(lora, targets, quant=False, input_grads=False, checkpoint=False):
    cfg = LLAMA_QTINY if quant else LLAMA_TINY

    def build():
        m = HFCausalLM(hf_tiny(cfg), 2, 32, checkpoint=peft_ref.checkpoint_early_stop if checkpoint else None)
        if quant:
            # from_pretrained(torch_dtype=bfloat16, quantization_config=BitsAndBytesConfig(
            # load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
            # bnb_4bit_compute_dtype=bfloat16)); the rotary inv_freq buffer stays float32
            for p in m.parameters():
                p.data = p.data.to(torch.bfloat16)
            peft_ref.replace_with_bnb_linear(m, torch.bfloat16)
            peft_ref.prepare_model_for_kbit_training(m)
        if input_grads:
            peft_ref.enable_input_require_grads(m)
        return peft_ref.apply_lora(m, lora["r"], lora["alpha"], lora["dropout"], targets)
    what = "QLoRA: %s" % ("the linear layers but lm_head as bitsandbytes' Linear4bit (nf4, double quantization, "
                          "blocksize 64, from bfloat16 weights, compute_dtype bfloat16), "
                          "prepare_model_for_kbit_training(use_gradient_checkpointing=False); ") if quant else "LoRA: "
    return dict(
        build=build, inputs=lambda: moe_inputs_llama(), lm=True, frozen=True, input_grads=input_grads,
        opt=lambda p: torch.optim.AdamW(p, lr=1e-3, weight_decay=0.1, foreach=True),
        desc="transformers 4.5x's llama family in plain PyTorch (bench/torchref/hf_families.py HFCausalLM), "
             "config %s; eager attention; B=2 T=32; labels = input_ids; loss = model(input_ids, labels); %s"
             "PEFT's LoRA (bench/torchref/peft_ref.py LoraLinear, apply_lora) r=%d lora_alpha=%d lora_dropout=%s "
             "target_modules=%s%s%s; torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1, foreach=True)" % (
                 json.dumps(cfg, sort_keys=True), what, lora["r"], lora["alpha"], lora["dropout"],
                 json.dumps(targets), "; enable_input_require_grads()" if input_grads else "",
                 "; each decoder layer under PyTorch 2.x's non-reentrant checkpoint (early stop; "
                 "bench/torchref/peft_ref.py checkpoint_early_stop)" if checkpoint else ""))


def moe_inputs_llama():
    x = torch.randint(0, LLAMA_TINY["vocab_size"], (2, 32))
    return x, x.clone()


_QV = ["q_proj", "v_proj"]
_ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
MODELS["llama_lora_qv"] = _llama_peft(dict(r=8, alpha=16, dropout=0.0), _QV)
MODELS["llama_lora_all_inputgrad"] = _llama_peft(dict(r=4, alpha=8, dropout=0.0), _ALL, input_grads=True)
MODELS["llama_qlora_qv"] = _llama_peft(dict(r=8, alpha=16, dropout=0.0), _QV, quant=True)
MODELS["llama_qlora_ckpt"] = _llama_peft(dict(r=8, alpha=16, dropout=0.0), _ALL, quant=True, input_grads=True,
                                         checkpoint=True)

STEPS = 2


def tensor_info(name, t):
    d = {"name": name, "shape": list(t.shape), "dtype": str(t.dtype).replace("torch.", ""),
         "raw": tbytes(t), "bytes": rounded(tbytes(t))}
    sn = t.storage().nbytes()
    if sn != tbytes(t):
        # The storage outlives a shrinking resize_ (mse_loss's 0-dim output).
        d["storage_raw"] = sn
        d["storage_bytes"] = rounded(sn)
    return d


def run_model(case, device):
    spec = MODELS[case]
    torch.manual_seed(0)
    model = spec["build"]().to(device)
    model.train()
    x, y = (t.to(device) for t in spec["inputs"]())
    opt = spec["opt"](model.parameters())
    loss_fn = spec.get("loss", F.cross_entropy)
    params = [tensor_info(n, p) for n, p in model.named_parameters()]
    buffers = [tensor_info(n, b) for n, b in model.named_buffers()]
    param_bytes = sum(p["bytes"] for p in params)
    rec = Recorder(device)
    st = {}
    gc.collect()
    gc.disable()
    if device == "cuda":
        rec.cuda_baseline()

    st_out_raw = [None]
    host_rule = spec.get("host_rule")
    # a language model takes the labels and returns its loss (Hugging Face's
    # model(input_ids, labels=labels)): forward and loss in one phase
    lm = spec.get("lm", False)

    def fwd():
        st["out"] = model(x, y) if lm else model(x)
        st_out_raw[0] = tbytes(st["out"])

    def loss():
        st["loss"] = loss_fn(st["out"], y)

    def bwd():
        (st["out"] if lm else st["loss"]).backward()
        if "grad_bytes" not in st:
            # parameters an MoE's unused experts hold get no gradient
            st["grad_bytes"] = sum(rounded(tbytes(p.grad)) for p in model.parameters() if p.grad is not None)

    def step():
        opt.step()

    def zero():
        opt.zero_grad(set_to_none=True)

    def release():
        del st["out"]
        st.pop("loss", None)

    # a language model's call returns its loss (ForCausalLMLoss): no loss phase
    order = [("forward", fwd), ("loss", loss), ("backward", bwd),
             ("step", step), ("zero_grad", zero), ("release", release)]
    if lm:
        order = [o for o in order if o[0] != "loss"]
    for s in range(1, STEPS + 1):
        for name, fn in order:
            rec.phase(name, fn, step=s, host_rule=host_rule)
    gc.enable()
    res = {
        "case": case,
        "kind": "lm" if lm else "model",
        **({"frozen": True} if spec.get("frozen") else {}),
        **({"input_grads": True} if spec.get("input_grads") else {}),
        "torch_version": torch.__version__,
        "device": device,
        "description": spec["desc"],
        "cublas_workspaces": getattr(rec, "cublas_workspaces", 0),
        "steps": STEPS,
        "param_count": len(params),
        "param_bytes": param_bytes,
        "params": params,
        "buffers": buffers,
        "inputs": [tensor_info("x", x), tensor_info("y", y)],
        "out_raw": st_out_raw[0],
        "grad_bytes": st["grad_bytes"],
        "trainable_bytes": sum(rounded(tbytes(p)) for p in model.parameters() if p.requires_grad),
        "phases": rec.phases,
    }
    if "config" in spec:
        res["config"] = spec["config"]
    return res, rec


# --------------------------------------------------------------------------
# Single-op micro-cases: forward + backward of one op.

def _r(*shape, grad=True):
    return torch.randn(*shape).requires_grad_(grad)


def micro_cases():
    """name -> (desc, make_inputs() -> dict of tensors, op(inputs) -> output)."""
    M = {}
    M["linear"] = ("F.linear(x[64,512] requires_grad, w[1024,512] requires_grad, b[1024] requires_grad)",
                   lambda: dict(x=_r(64, 512), w=_r(1024, 512), b=_r(1024)),
                   lambda i: F.linear(i["x"], i["w"], i["b"]))
    M["linear_nograd_input"] = ("F.linear(x[64,512] no grad, w[1024,512] requires_grad, b[1024] requires_grad)",
                                lambda: dict(x=_r(64, 512, grad=False), w=_r(1024, 512), b=_r(1024)),
                                lambda i: F.linear(i["x"], i["w"], i["b"]))
    M["linear_frozen_weight"] = ("F.linear(x[64,512] requires_grad, w[1024,512] and b[1024] frozen "
                                 "(requires_grad=False))",
                                 lambda: dict(x=_r(64, 512), w=_r(1024, 512, grad=False), b=_r(1024, grad=False)),
                                 lambda i: F.linear(i["x"], i["w"], i["b"]))
    M["linear_frozen_weight_3d"] = ("F.linear(x[4,16,512] requires_grad, w[1024,512] and b[1024] frozen)",
                                    lambda: dict(x=_r(4, 16, 512), w=_r(1024, 512, grad=False),
                                                 b=_r(1024, grad=False)),
                                    lambda i: F.linear(i["x"], i["w"], i["b"]))
    M["relu"] = ("F.relu(x[64,1024])", lambda: dict(x=_r(64, 1024)), lambda i: F.relu(i["x"]))
    M["gelu"] = ("F.gelu(x[64,1024]) (approximate='none')", lambda: dict(x=_r(64, 1024)),
                 lambda i: F.gelu(i["x"]))
    M["gelu_tanh"] = ("F.gelu(x[64,1024], approximate='tanh')", lambda: dict(x=_r(64, 1024)),
                      lambda i: F.gelu(i["x"], approximate="tanh"))
    M["silu"] = ("F.silu(x[64,1024])", lambda: dict(x=_r(64, 1024)), lambda i: F.silu(i["x"]))
    M["tanh"] = ("torch.tanh(x[64,1024])", lambda: dict(x=_r(64, 1024)), lambda i: torch.tanh(i["x"]))
    M["sigmoid"] = ("torch.sigmoid(x[64,1024])", lambda: dict(x=_r(64, 1024)),
                    lambda i: torch.sigmoid(i["x"]))
    M["softmax"] = ("F.softmax(x[64,1024], dim=-1)", lambda: dict(x=_r(64, 1024)),
                    lambda i: F.softmax(i["x"], dim=-1))
    M["log_softmax"] = ("F.log_softmax(x[64,1024], dim=-1)", lambda: dict(x=_r(64, 1024)),
                        lambda i: F.log_softmax(i["x"], dim=-1))
    M["layer_norm"] = ("F.layer_norm(x[64,1024], [1024], w[1024], b[1024]) all requiring grad",
                       lambda: dict(x=_r(64, 1024), w=torch.ones(1024, requires_grad=True),
                                    b=torch.zeros(1024, requires_grad=True)),
                       lambda i: F.layer_norm(i["x"], [1024], i["w"], i["b"]))
    M["embedding"] = ("F.embedding(idx[4,64] int64 in [0,512), table[512,128] requires_grad)",
                      lambda: dict(idx=torch.randint(0, 512, (4, 64)), table=_r(512, 128)),
                      lambda i: F.embedding(i["idx"], i["table"]))
    M["cross_entropy"] = ("F.cross_entropy(x[64,10] requires_grad, y[64] int64)",
                          lambda: dict(x=_r(64, 10), y=torch.randint(0, 10, (64,))),
                          lambda i: F.cross_entropy(i["x"], i["y"]))
    M["mse_loss"] = ("F.mse_loss(x[64,1024] requires_grad, t[64,1024] no grad)",
                     lambda: dict(x=_r(64, 1024), t=_r(64, 1024, grad=False)),
                     lambda i: F.mse_loss(i["x"], i["t"]))
    M["matmul_batched"] = ("torch.matmul(a[4,8,64,32], b[4,8,32,64]) both requiring grad",
                           lambda: dict(a=_r(4, 8, 64, 32), b=_r(4, 8, 32, 64)),
                           lambda i: i["a"] @ i["b"])
    M["matmul_batched_transposed"] = (
        "torch.matmul(a[4,8,64,32], b.transpose(-2,-1)) with b[4,8,64,32] requiring grad "
        "(the right operand is a non-contiguous [4,8,32,64] view)",
        lambda: dict(a=_r(4, 8, 64, 32), b=_r(4, 8, 64, 32)),
        lambda i: i["a"] @ i["b"].transpose(-2, -1))
    M["masked_fill"] = ("x[4,4,64,64].masked_fill(mask[1,1,64,64]==0, float('-inf')), mask a "
                        "tril of ones (float32, no grad); the ==0 comparison runs inside the op region",
                        lambda: dict(x=_r(4, 4, 64, 64),
                                     mask=torch.tril(torch.ones(64, 64)).view(1, 1, 64, 64)),
                        lambda i: i["x"].masked_fill(i["mask"] == 0, float("-inf")))
    M["where"] = ("torch.where(c[64,1024] bool, x[64,1024], y[64,1024]) x and y requiring grad",
                  lambda: dict(c=torch.rand(64, 1024) > 0.5, x=_r(64, 1024), y=_r(64, 1024)),
                  lambda i: torch.where(i["c"], i["x"], i["y"]))
    M["index_select"] = ("torch.index_select(x[1024,256] requiring grad, 0, idx[64] int64)",
                         lambda: dict(x=_r(1024, 256), idx=torch.randint(0, 1024, (64,))),
                         lambda i: torch.index_select(i["x"], 0, i["idx"]))
    # The Mixture-of-Experts ops (transformers' MixtralSparseMoeBlock): topk of
    # the router's probabilities, advanced indexing with int64 index tensors
    # (IndexBackward0), index_add_ (IndexAddBackward0).
    M["topk"] = ("torch.topk(x[4096,8] requiring grad, 2, dim=-1).values (largest, sorted); "
                 "the indices are kept by TopkBackward0",
                 lambda: dict(x=_r(4096, 8)),
                 lambda i: torch.topk(i["x"], 2, dim=-1).values)
    M["index_none_tensor"] = ("x[1024,256] requiring grad indexed x[None, idx] with idx[96] int64 "
                              "(a [1,96,256] copy; IndexBackward0 saves idx)",
                              lambda: dict(x=_r(1024, 256), idx=torch.randint(0, 1024, (96,))),
                              lambda i: i["x"][None, i["idx"]])
    M["index_pair_none"] = ("w[1024,4] requiring grad indexed w[i0, i1, None] with i0[512] in [0,1024) "
                            "and i1[512] in [0,4) int64 (a [512,1] copy)",
                            lambda: dict(w=_r(1024, 4), i0=torch.randint(0, 1024, (512,)),
                                         i1=torch.randint(0, 4, (512,))),
                            lambda i: i["w"][i["i0"], i["i1"], None])
    M["index_add"] = ("torch.index_add(z[1024,256], 0, idx[96] int64, src[96,256]) z and src requiring grad "
                      "(IndexAddBackward0 saves idx and src)",
                      lambda: dict(z=_r(1024, 256), idx=torch.randint(0, 1024, (96,)), src=_r(96, 256)),
                      lambda i: torch.index_add(i["z"], 0, i["idx"], i["src"]))
    M["index_add_"] = ("torch.zeros(1024, 256).index_add_(0, idx[96] int64, src[96,256] requiring grad): "
                       "the zeros made in the op region, as MoE's final_hidden_states",
                       lambda: dict(idx=torch.randint(0, 1024, (96,)), src=_r(96, 256)),
                       lambda i: torch.zeros(1024, 256).index_add_(0, i["idx"], i["src"]))
    M["pow"] = ("torch.pow(x[64,1024], 2)", lambda: dict(x=_r(64, 1024)), lambda i: torch.pow(i["x"], 2))
    M["rsqrt"] = ("torch.rsqrt(x[64,1024]) (x = randn.abs() + 1)",
                  lambda: dict(x=(torch.randn(64, 1024).abs() + 1).requires_grad_(True)),
                  lambda i: torch.rsqrt(i["x"]))
    M["max_pool2d"] = ("F.max_pool2d(x[32,16,32,32], 2)", lambda: dict(x=_r(32, 16, 32, 32)),
                       lambda i: F.max_pool2d(i["x"], 2))
    M["batch_norm"] = ("F.batch_norm(x[32,16,32,32], running_mean[16], running_var[16], w[16], b[16], "
                       "training=True) (x, w, b requiring grad)",
                       lambda: dict(x=_r(32, 16, 32, 32), rm=torch.zeros(16), rv=torch.ones(16),
                                    w=torch.ones(16, requires_grad=True),
                                    b=torch.zeros(16, requires_grad=True)),
                       lambda i: F.batch_norm(i["x"], i["rm"], i["rv"], i["w"], i["b"], training=True))
    M["conv2d"] = ("F.conv2d(x[32,3,32,32], w[16,3,3,3], b[16], padding=1) all requiring grad",
                   lambda: dict(x=_r(32, 3, 32, 32), w=_r(16, 3, 3, 3), b=_r(16)),
                   lambda i: F.conv2d(i["x"], i["w"], i["b"], padding=1))
    return M


def run_micro(name, device):
    desc, make, op = micro_cases()[name]
    torch.manual_seed(0)
    ins = {k: (v.detach().to(device).requires_grad_(v.requires_grad) if v.is_floating_point()
               else v.to(device)) for k, v in make().items()}
    with torch.no_grad():
        probe = op(ins)
    g = None if probe.dim() == 0 else torch.ones_like(probe)
    out_info = tensor_info("out", probe)
    del probe
    rec = Recorder(device)
    st = {}
    gc.collect()
    gc.disable()
    if device == "cuda":
        rec.cuda_baseline()

    def fwd():
        st["out"] = op(ins)

    def bwd():
        st["out"].backward(g)

    f = rec.phase("forward", fwd, step=1)
    b = rec.phase("backward", bwd, step=1)
    gc.enable()
    inputs = [tensor_info(k, v) for k, v in ins.items()]
    for d, (k, v) in zip(inputs, ins.items()):
        d["requires_grad"] = bool(v.requires_grad)
    if g is not None:
        inputs.append(tensor_info("grad_output", g))
    grad_bytes = sum(d["bytes"] for d in inputs if d.get("requires_grad"))
    res = {
        "case": "op_" + name,
        "kind": "op",
        "torch_version": torch.__version__,
        "device": device,
        "description": desc + ("; backward with grad_output = ones_like(out) made before the region"
                               if g is not None else "; backward() of the 0-dim output"),
        "inputs": inputs,
        "output": out_info,
        "input_grad_bytes": grad_bytes,
        "saved_bytes": f["end"] - out_info.get("storage_bytes", out_info["bytes"]),
        "backward_peak": b["peak"],
        "phases": rec.phases,
    }
    if device == "cpu":
        res["saved_bytes_cpu_all"] = f["cpu_all"]["end"] - out_info.get("storage_bytes", out_info["bytes"])
    return res


# --------------------------------------------------------------------------
# Closed-form sanity checks (CPU; figures after rounding).

MLP_PARAM_BYTES = (rounded(512 * 1024 * 4) + rounded(1024 * 4) + rounded(1024 * 1024 * 4)
                   + rounded(1024 * 4) + rounded(10 * 1024 * 4) + rounded(10 * 4))
OUT_LOSS = rounded(64 * 10 * 4) + rounded(4)   # logits [64,10] and 0-dim loss


def ph(res, step, name):
    for p in res["phases"]:
        if p["step"] == step and p["phase"] == name:
            return p
    raise KeyError((step, name))


def check_model(res):
    """Closed forms: every model, then the three plain-MLP cases (figures as on CUDA)."""
    case = res["case"]
    P0 = res["param_bytes"]
    # out and loss alive after backward (a language model: the loss alone)
    out_loss = rounded(res["out_raw"]) + rounded(4)
    if res["kind"] == "lm":
        out_loss = rounded(4)  # the model's output is its loss
    # Step 1 starts empty; after its backward: one grad per parameter + logits + loss.
    assert ph(res, 1, "forward")["start"] == 0
    if not res.get("input_grads"):
        # (with enable_input_require_grads the embeddings' output is a leaf that
        # requires grad: it and its .grad live until the loss is released)
        assert ph(res, 1, "backward")["end"] == res["grad_bytes"] + out_loss, (case, ph(res, 1, "backward")["end"])
    if "routing plan worst" not in res["description"]:
        assert res["grad_bytes"] == res["trainable_bytes"], (case, res["grad_bytes"], res["trainable_bytes"])
    if not res.get("frozen"):
        assert res["trainable_bytes"] == P0
    # Steady state: step 2 ends where step 1 ended.
    assert ph(res, 2, "release")["end"] == ph(res, 1, "release")["end"]
    if case == "gpt2_tiny" or case.startswith("hf_"):
        s1 = ph(res, 1, "step")
        # AdamW state 2P; 1.13 foreach peak adds the sqrt list and the denom list (2P more).
        assert s1["end"] - s1["start"] == 2 * P0 and s1["peak"] - s1["start"] == 4 * P0
    if not case.startswith("mlp_") or case == "mlp_dropout":
        return
    P = MLP_PARAM_BYTES
    assert res["param_bytes"] == P == 6341120, res["param_bytes"]
    n = res["param_count"]
    adam = "adam" in case
    cpu = res["device"] == "cpu"
    for s in (1, 2):
        state = 0 if s == 1 else (2 * P if adam else P)
        assert ph(res, s, "forward")["start"] == state, (case, s, "forward start")
        # Forward keeps two ReLU outputs [64,1024] and the logits [64,10].
        assert ph(res, s, "forward")["end"] == state + 2 * 262144 + 2560
        # Loss adds log_softmax [64,10], the loss and nll's total_weight.
        assert ph(res, s, "loss")["end"] == state + 2 * 262144 + 2 * 2560 + 2 * 512
        bw = ph(res, s, "backward")
        # After backward: grads (= param bytes) + optimizer state + logits + loss.
        assert bw["end"] == state + P + OUT_LOSS, (case, s, bw["end"], state + P + OUT_LOSS)
        stp = ph(res, s, "step")
        new_state = 2 * P if adam else P
        assert stp["end"] == new_state + P + OUT_LOSS, (case, s, stp["end"])
        z = ph(res, s, "zero_grad")
        assert z["end"] == new_state + OUT_LOSS, (case, s, z["end"])
        assert ph(res, s, "release")["end"] == new_state, (case, s)
        if cpu:
            # Every parameter's Adam `step` counter: a 4-byte host tensor (512 rounded).
            host_steps = n * ROUND if adam else 0
            assert stp["cpu_all"]["end"] - stp["end"] == host_steps, (stp["cpu_all"], stp["end"])
    stp = ph(res, 2, "step")
    if case == "mlp_adam_foreach":
        # 1.13 foreach Adam: the exp_avg_sq_sqrt list and the denom list alive together.
        assert stp["peak"] - stp["start"] == 2 * P, (stp["peak"], stp["start"])
    if case == "mlp_adam_forloop":
        # Per parameter: sqrt(exp_avg_sq) and its quotient by bias_correction2_sqrt alive
        # together while the previous parameter's denom is still bound: the biggest
        # parameter (1024x1024) twice plus the one before it (the 1024 bias).
        assert stp["peak"] - stp["start"] == 2 * 4194304 + 4096, (stp["peak"] - stp["start"])
    if case == "mlp_sgd_momentum":
        # Step 1 clones each grad into its momentum buffer; step 2 works in place.
        assert stp["peak"] == stp["start"]
        s1 = ph(res, 1, "step")
        assert s1["peak"] == s1["end"] == s1["start"] + P


def check_micro(res):
    name = res["case"]
    f, b = res["phases"]
    assert f["start"] == 0
    if res["device"] == "cuda":
        return
    # After backward every input requiring grad has its .grad, output kept.
    ob = res["output"].get("storage_bytes", res["output"]["bytes"])
    assert b["end"] == ob + res["input_grad_bytes"], (name, b["end"], ob, res["input_grad_bytes"])
    if name == "op_relu":
        assert res["saved_bytes"] == 0   # relu saves its own output
    if name == "op_linear":
        assert res["saved_bytes"] == 0   # saves input and weight, both pre-existing


# --------------------------------------------------------------------------
# Output

def dump(obj, ind=0):
    """Pretty JSON with insertion key order; events one object per line."""
    sp = "  " * ind
    if isinstance(obj, dict):
        if not obj:
            return "{}"
        items = []
        for k, v in obj.items():
            if k in ("events", "live_at_end", "params", "buffers", "inputs") and isinstance(v, list):
                if not v:
                    items.append(f'{sp}  {json.dumps(k)}: []')
                else:
                    lines = ",\n".join(f"{sp}    " + json.dumps(e, separators=(", ", ": ")) for e in v)
                    items.append(f'{sp}  {json.dumps(k)}: [\n{lines}\n{sp}  ]')
            elif isinstance(v, dict) and k == "cpu_all":
                items.append(f'{sp}  {json.dumps(k)}: ' + json.dumps(v, separators=(", ", ": ")))
            else:
                items.append(f'{sp}  {json.dumps(k)}: {dump(v, ind + 1)}')
        return "{\n" + ",\n".join(items) + f"\n{sp}}}"
    if isinstance(obj, list):
        if not obj:
            return "[]"
        return "[\n" + ",\n".join(f"{sp}  " + dump(v, ind + 1) for v in obj) + f"\n{sp}]"
    return json.dumps(obj)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--out", default=None)
    ap.add_argument("cases", nargs="*")
    a = ap.parse_args()
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
    out = a.out or os.path.join(root, "testdata", "torchref", *(["cuda"] if a.device == "cuda" else []))
    os.makedirs(out, exist_ok=True)
    torch.set_num_threads(1)
    if a.device == "cuda":
        # The math paths the CPU reference takes, so the figures compare.
        torch.backends.cudnn.deterministic = True
    micros = micro_cases()
    cases = a.cases or (list(MODELS) + ["op_" + m for m in micros])
    for c in cases:
        if c in MODELS:
            res, _ = run_model(c, a.device)
            check = check_model
        elif c.startswith("op_") and c[3:] in micros:
            res = run_micro(c[3:], a.device)
            check = check_micro
        else:
            sys.exit(f"unknown case {c}")
        with open(os.path.join(out, c + ".json"), "w") as fh:
            fh.write(dump(res) + "\n")
        if a.device == "cpu":
            check(res)  # the closed forms describe the CPU reference (no cuBLAS, no cuDNN workspaces)
        summ = " ".join(f"{p['phase'][:4]}{p['step']}={p['end']}/{p['peak']}" for p in res["phases"])
        print(f"{c}: {summ}")


# --------------------------------------------------------------------------
# Cases kept in modules of their own: optimizers, clipping and gradient
# accumulation (optim_refs.py), generation with a KV cache
# (generate_ref.py). Each module has run_case(g, case, device),
# check_case(g, res) and descs(); register_cases adds its cases to MODELS
# (so that `run.sh` with no case runs them too) and routes them there.

def register_cases(mod):
    base_run, base_check, names = run_model, check_model, mod.descs()
    g = globals()

    def run(case, device):
        if case in names:
            return mod.run_case(g, case, device)
        return base_run(case, device)

    def check(res):
        if res["case"] in names:
            return mod.check_case(g, res)
        return base_check(res)

    for c, d in names.items():
        MODELS[c] = {"desc": d}
    g["run_model"], g["check_model"] = run, check


sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import optim_refs  # noqa: E402
import generate_ref  # noqa: E402
import ddp_ref  # noqa: E402

register_cases(optim_refs)
register_cases(generate_ref)
register_cases(ddp_ref)


if __name__ == "__main__":
    main()
