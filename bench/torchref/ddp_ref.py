"""bench/torchref/ddp_ref.py: DistributedDataParallel cases.

Imported by torchref.py (its `register_cases` block), which records them
like every other case: `bash bench/torchref/run.sh ddp_mlp`. Each case
wraps a model in torch.nn.parallel.DistributedDataParallel on a one-rank
gloo process group (world_size=1: PyTorch 1.13 on the CPU has no NCCL and
no fake process group) and trains it two steps with SGD(lr=0.1) (no state,
no temporaries: the step allocates nothing):

  ddp_init   the constructor: _verify_param_shape_across_processes (the
             parameter count and the shapes' metadata), _sync_module_states
             (the parameters and buffers flattened for the broadcast, freed)
             and the reducer's one bucket of all trainable parameters
  forward    DDP's forward (step 2: the buckets rebuilt in gradient-ready
             order, 1 MiB then 25 MiB, after sync_bucket_indices' tensors)
  loss, backward (the reducer's hooks copy each gradient into its bucket;
             with gradient_as_bucket_view the gradient becomes the view),
  step, zero_grad(set_to_none=True), release

Host tensors on a CUDA run (tagged by ddp_host_rule, left out of the
figures like torchref.py's own host rule): the shape metadata built on the
host and its `control` copy (the clone of it is what goes to the device),
the host halves of sync_bucket_indices' two tensors (each is built on the
host, then copied into a device tensor of the same size), and the
record_function handles of DDP's forward ("DistributedDataParallel.forward":
a 4-byte aten::zeros and a 288-byte aten::empty, only under the profiler).
The 8-byte parameter count and its all-gather output are device tensors.
"""
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F

CASES = {}


def _mlp_case(view):
    return dict(
        model="mlp", view=view,
        desc="torchref's MLP (nn.Sequential(nn.Linear(512, 1024), nn.ReLU(), nn.Linear(1024, 1024), "
             "nn.ReLU(), nn.Linear(1024, 10))) in torch.nn.parallel.DistributedDataParallel("
             f"gradient_as_bucket_view={view}) on a one-rank gloo group; x = torch.randn(64, 512); "
             "y = torch.randint(0, 10, (64,)); F.cross_entropy; torch.optim.SGD(lr=0.1); "
             "zero_grad(set_to_none=True)")


CASES["ddp_mlp"] = _mlp_case(False)
CASES["ddp_mlp_view"] = _mlp_case(True)
CASES["ddp_gpt2_tiny"] = dict(
    model="gpt2", view=False,
    desc="torchref's gpt2_tiny (with its registered causal-mask buffer, which DDP broadcasts "
         "before every forward) in DistributedDataParallel() on a one-rank gloo group; "
         "B=4 T=64; torch.optim.SGD(lr=0.1); zero_grad(set_to_none=True)")


def _init_group():
    if not dist.is_initialized():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29531")
        dist.init_process_group("gloo", rank=0, world_size=1)


def ddp_host_rule(meta_raw):
    """A host rule with state: which of sync_bucket_indices' same-sized
    pairs is the host half (the first of each). meta_raw is the shape
    metadata's size, 16 bytes per dimension of each parameter."""
    seen = {}

    def rule(raw, ops, phase):
        inside = "DistributedDataParallel.forward" in ops
        if inside and ops[-1] == "aten::empty" and raw == 288:
            return "profiler"
        if phase == "forward" and ops[-2:] == ["aten::zeros", "aten::empty"] and raw == 4:
            return "profiler"
        if phase == "ddp_init":
            if raw == 8:
                return False  # the parameter count and its all-gather output: device
            if ops and ops[-1] == "aten::empty" and raw == meta_raw:
                return "ddp_shape_metadata"  # metadata and control; the clone is the device copy
            return None
        if phase == "forward" and inside and ops[-1] == "aten::empty" and raw < 512:
            n = seen.get(raw, 0)
            seen[raw] = n + 1
            return "ddp_bucket_indices" if n % 2 == 0 else False
        return None

    return rule


def run_case(g, case, device):
    spec = CASES[case]
    _init_group()
    torch.manual_seed(0)
    if spec["model"] == "mlp":
        model = g["MLP"]().to(device)
        x, y = torch.randn(64, 512).to(device), torch.randint(0, 10, (64,)).to(device)
        loss_fn = F.cross_entropy
    else:
        model = g["GPT"](g["GPT_CFG"]).to(device)
        x, y = torch.randint(0, 512, (4, 64)).to(device), torch.randint(0, 512, (4, 64)).to(device)

        def loss_fn(out, t):
            return F.cross_entropy(out.view(-1, out.size(-1)), t.view(-1))
    model.train()
    tensor_info = g["tensor_info"]
    params = [tensor_info(n, p) for n, p in model.named_parameters()]
    buffers = [tensor_info(n, b) for n, b in model.named_buffers()]
    param_bytes = sum(p["bytes"] for p in params)
    rec = g["Recorder"](device)
    st = {}
    # a tag: host; False: a device tensor the default rule would call a
    # scalar; None: the default rule decides
    host_rule = ddp_host_rule(16 * sum(p.dim() for p in model.parameters()))

    def init():
        st["ddp"] = torch.nn.parallel.DistributedDataParallel(model, gradient_as_bucket_view=spec["view"])
        st["opt"] = torch.optim.SGD(st["ddp"].parameters(), lr=0.1)

    def fwd():
        st["out"] = st["ddp"](x)

    def loss():
        st["loss"] = loss_fn(st["out"], y)

    def bwd():
        st["loss"].backward()
        if "grad_bytes" not in st:
            st["grad_bytes"] = sum(g["rounded"](g["tbytes"](p.grad)) for p in model.parameters())

    def step():
        st["opt"].step()

    def zero():
        st["opt"].zero_grad(set_to_none=True)

    def release():
        del st["out"]
        del st["loss"]

    import gc
    gc.collect()
    gc.disable()
    if device == "cuda":
        rec.cuda_baseline()
    rec.phase("ddp_init", init, step=1, host_rule=host_rule)
    for s in range(1, g["STEPS"] + 1):
        for name, fn in [("forward", fwd), ("loss", loss), ("backward", bwd), ("step", step),
                         ("zero_grad", zero), ("release", release)]:
            rec.phase(name, fn, step=s, host_rule=host_rule)
    gc.enable()
    res = {
        "case": case,
        "kind": "model",
        "torch_version": torch.__version__,
        "device": device,
        "description": spec["desc"],
        "cublas_workspaces": getattr(rec, "cublas_workspaces", 0),
        "steps": g["STEPS"],
        "param_count": len(params),
        "param_bytes": param_bytes,
        "params": params,
        "buffers": buffers,
        "inputs": [tensor_info("x", x), tensor_info("y", y)],
        "grad_bytes": st["grad_bytes"],
        "phases": rec.phases,
    }
    return res, rec


def check_case(g, res):
    """Closed forms: the constructor's peak is the flattened broadcast copy
    (all parameters and buffers, one bucket under 250 MiB) on top of the
    bucket-free start, and it ends holding one bucket of all parameters;
    the step-2 forward frees that bucket before the rebuilt ones take its
    place, so forward 2 starts and ends like forward 1."""
    rounded = g["rounded"]
    raw = sum(p["raw"] for p in res["params"])
    bufs = sum(b["raw"] for b in res["buffers"])
    init = g["ph"](res, 1, "ddp_init")
    assert init["end"] == rounded(raw), (init["end"], raw)
    assert init["peak"] == rounded(raw + bufs) or init["peak"] == rounded(raw), (init["peak"], raw, bufs)
    f1, f2 = g["ph"](res, 1, "forward"), g["ph"](res, 2, "forward")
    assert f1["end"] - f1["start"] == f2["end"] - f2["start"], (f1, f2)


def descs():
    """Each case's description, by name."""
    return {c: CASES[c]["desc"] for c in CASES}
