#!/usr/bin/env python3
"""bench/gpu/fsdp_rank.py: one rank of an N-rank data-parallel job, measured
by PyTorch on one real GPU, for memsh's per-rank figures to be compared with.

A single process runs rank 0 of a world of N with PyTorch's fake process
group (torch.testing._internal.distributed.fake_pg.FakeStore, backend
"fake": collectives return at once and move no data), so every allocation
rank 0 makes — sharded parameters, all-gather and reduce-scatter buffers,
unsharded parameters, sharded gradients and optimizer state — happens on
this GPU, as it would on one GPU of an N-GPU job.

  python3 bench/gpu/fsdp_rank.py phases --model gpt2-small --world 4 [--batch B] [--seq T]
        [--strategy fsdp|fsdp-offload|ddp|tp|tp-fsdp] [--tp T] [--reshard-after-forward 0|1] [--checkpoint]
      one JSON line per point (setup, then forward, backward, step,
      zero_grad per step): torch.cuda.memory_allocated() at the point, the
      peak since the previous point, and memory_reserved().
  python3 bench/gpu/fsdp_rank.py all
      every (model, world, strategy) of the golden files: gpt2-small and
      llama-3.2-1b at N = 2, 4, 8, FSDP2 (fully_shard per block and on the
      root, as torchtitan applies it, MixedPrecisionPolicy(param_dtype=
      bfloat16, reduce_dtype=float32)) and DDP; llama-3.2-1b under tensor
      parallelism (tp: torchtitan's apply_tp plan in transformers' names,
      loss parallelism off, bf16 autocast, on N = T = 2, 4, 8; tp-fsdp:
      the plan on a (N/T, T) mesh's "tp" dim, then FSDP2 over "dp", as
      torchtitan applies them, on N = 8 with T = 2 and 4).

The models are those of bench/gpu/torch_models.py (memsh's twins); the
training step is memsh fit's: bf16 autocast for DDP (FSDP2 casts through
its MixedPrecisionPolicy instead), AdamW(lr=1e-4, foreach), two steps,
zero_grad(set_to_none=True).

Needs PyTorch >= 2.6 with CUDA (torch.distributed.fsdp.fully_shard).
The figures go to testdata/torchref/cuda/<gpu>_fsdp_phases.jsonl. memsh's
twin is scripts/fsdp_phases.star (same arguments, same JSON lines:
memsh --device sim:H200,meta scripts/fsdp_phases.star gpt2-small --world 4);
bench/gpu/compare_fit.py prints the two side by side.
"""
import argparse
import json
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(__file__))
import torch_fit  # noqa: E402  (GPT-2 as memsh builds it)
import torch_models  # noqa: E402

MODELS = {
    "gpt2-small": dict(vocab=50257, seq=1024),
    "llama-3.2-1b": dict(vocab=128256, seq=2048),
}


def build(name, checkpoint):
    if name == "gpt2-small":
        return torch_fit.GPT(**torch_fit.CONFIGS["gpt2-small"], attention="sdpa", checkpoint=checkpoint)
    return torch_models.build_llama(torch_models.LLAMA_3_2_1B, checkpoint)


def blocks(model):
    """The transformer blocks fully_shard wraps one by one."""
    if hasattr(model, "h"):
        return list(model.h)
    return list(model.model.layers)


def init_rank(world):
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", rank=0, world_size=world, store=FakeStore())
    torch.cuda.set_device(0)


def wrap(model, strategy, world, reshard):
    if strategy == "ddp":
        model = model.cuda()
        return torch.nn.parallel.DistributedDataParallel(model, device_ids=[0])
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cuda", (world,))
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    off = CPUOffloadPolicy(pin_memory=True) if strategy == "fsdp-offload" else OffloadPolicy()
    for b in blocks(model):
        fully_shard(b, mesh=mesh, mp_policy=mp, reshard_after_forward=reshard, offload_policy=off)
    # the root without reshard_after_forward: PyTorch 2.4-2.7 keep the root
    # unsharded after its forward whatever it is given, 2.8+ only when it
    # is not given (memsh models the former)
    fully_shard(model, mesh=mesh, mp_policy=mp, offload_policy=off)
    return model


def materialize(model, strategy):
    """to_empty on the GPU, or with CPU offload on the CPU with the
    buffers made on the GPU (torchtitan's enable_cpu_offload)."""
    if strategy != "fsdp-offload":
        model.to_empty(device="cuda")
        return
    model.to_empty(device="cpu")
    for m in model.modules():
        for name, b in list(m.named_buffers(recurse=False)):
            m.register_buffer(name, torch.empty_like(b, device="cuda"), persistent=name not in m._non_persistent_buffers_set)


def tensor_parallel(model, tp_mesh):
    """torchtitan's apply_tp on a Llama in transformers' names, loss
    parallelism off (memsh fit's --parallel tp=T)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel,
                                                   SequenceParallel, parallelize_module)

    parallelize_module(model, tp_mesh, {
        "model.embed_tokens": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
        "model.norm": SequenceParallel(),
        "lm_head": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate()),
    })
    for layer in model.model.layers:
        parallelize_module(layer, tp_mesh, {
            "input_layernorm": SequenceParallel(),
            "self_attn": PrepareModuleInput(input_layouts=(Shard(1), None, None), desired_input_layouts=(Replicate(), None, None)),
            "self_attn.q_proj": ColwiseParallel(),
            "self_attn.k_proj": ColwiseParallel(),
            "self_attn.v_proj": ColwiseParallel(),
            "self_attn.o_proj": RowwiseParallel(output_layouts=Shard(1)),
            "post_attention_layernorm": SequenceParallel(),
            "mlp": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
            "mlp.gate_proj": ColwiseParallel(),
            "mlp.up_proj": ColwiseParallel(),
            "mlp.down_proj": RowwiseParallel(output_layouts=Shard(1)),
        })


def wrap_tp(model, strategy, world, tp, reshard):
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cuda", (world // tp, tp), mesh_dim_names=("dp", "tp"))
    tensor_parallel(model, mesh["tp"])
    if strategy == "tp-fsdp":
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for b in blocks(model):
            fully_shard(b, mesh=mesh["dp"], mp_policy=mp, reshard_after_forward=reshard)
        fully_shard(model, mesh=mesh["dp"], mp_policy=mp)
    return model


def cmd_phases(a, out):
    spec = MODELS[a.model]
    seq = a.seq or spec["seq"]
    with torch.device("cpu" if a.strategy == "ddp" else "meta"):
        model = build(a.model, a.checkpoint)
    if a.strategy in ("tp", "tp-fsdp"):
        model = wrap_tp(model, a.strategy, a.world, a.tp, bool(a.reshard_after_forward))
    else:
        model = wrap(model, a.strategy, a.world, bool(a.reshard_after_forward))
    if a.strategy != "ddp":
        materialize(model, a.strategy)
    # CPU offload's parameters are on the CPU: foreach=None is the
    # per-parameter loop there, as memsh fit's default optimizer
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=None if a.strategy == "fsdp-offload" else True)
    x = torch.randint(0, spec["vocab"], (a.batch, seq), device="cuda")
    y = torch.randint(0, spec["vocab"], (a.batch, seq), device="cuda")
    torch.cuda.synchronize()

    def point(name, step=0):
        torch.cuda.synchronize()
        rec = dict(model=a.model, world=a.world, strategy=a.strategy, tp=a.tp, reshard_after_forward=bool(a.reshard_after_forward),
                   checkpoint=a.checkpoint, batch=a.batch, seq=seq, point=name, step=step,
                   allocated=torch.cuda.memory_allocated(), peak=torch.cuda.max_memory_allocated(),
                   reserved=torch.cuda.memory_reserved())
        out.write(json.dumps(rec) + "\n")
        out.flush()
        torch.cuda.reset_peak_memory_stats()

    point("setup")
    for step in (1, 2):
        if a.strategy in ("ddp", "tp"):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                logits = model(x)
        else:
            logits = model(x)
        loss = F.cross_entropy(logits.float().view(-1, logits.shape[-1]), y.view(-1))
        logits = None
        point("forward", step)
        loss.backward()
        loss = None
        point("backward", step)
        opt.step()
        point("step", step)
        opt.zero_grad(set_to_none=True)
        point("zero_grad", step)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    ph = sub.add_parser("phases")
    ph.add_argument("--model", default="gpt2-small", choices=sorted(MODELS))
    ph.add_argument("--world", type=int, default=4)
    ph.add_argument("--batch", type=int, default=4)
    ph.add_argument("--seq", type=int, default=0)
    ph.add_argument("--strategy", default="fsdp", choices=["fsdp", "fsdp-offload", "ddp", "tp", "tp-fsdp"])
    ph.add_argument("--tp", type=int, default=0, help="the tensor-parallel degree (tp: the world)")
    ph.add_argument("--reshard-after-forward", type=int, default=1)
    ph.add_argument("--checkpoint", action="store_true")
    sub.add_parser("all")
    a = p.parse_args()
    if a.cmd == "phases":
        if a.strategy == "tp":
            a.tp = a.world
        if a.strategy.startswith("tp") and (a.model != "llama-3.2-1b" or a.tp < 1 or a.world % a.tp):
            p.error("--strategy tp/tp-fsdp: llama-3.2-1b, with --tp dividing --world")
        init_rank(a.world)
        cmd_phases(a, sys.stdout)
        return
    # all: each configuration in a process of its own (one process group each)
    import subprocess

    for model in MODELS:
        for world in (2, 4, 8):
            for strategy in ("fsdp", "fsdp-offload", "ddp"):
                subprocess.run([sys.executable, __file__, "phases", "--model", model, "--world", str(world),
                                "--strategy", strategy], check=False)
    for world in (2, 4, 8):
        subprocess.run([sys.executable, __file__, "phases", "--model", "llama-3.2-1b", "--world", str(world),
                        "--strategy", "tp", "--batch", "1"], check=False)
    for tp in (2, 4):
        subprocess.run([sys.executable, __file__, "phases", "--model", "llama-3.2-1b", "--world", "8",
                        "--strategy", "tp-fsdp", "--tp", str(tp), "--batch", "1"], check=False)


if __name__ == "__main__":
    main()
