"""bench/torchref/optim_refs.py: optimizer, clipping and accumulation cases.

Imported by torchref.py (its `register_cases` block), which records them
like every other case: `bash bench/torchref/run.sh optim_clip_grad`. Each
case trains the MLP of the mlp_* cases (nn.Sequential(Linear(512, 1024),
ReLU, Linear(1024, 1024), ReLU, Linear(1024, 10)), x [64, 512], y [64]) for
two optimizer steps.

The installed PyTorch is 1.13 (CPU), which has neither torch.optim.Adafactor
(2.5+) nor clip_grad_norm_'s foreach path (2.0+), and transformers is not
installed. The references below are therefore written in plain PyTorch, op
for op as the named source does them (same ops, same order, same Python
variables, so the same lifetimes):

* HFAdafactor: transformers.optimization.Adafactor.step (transformers 4.x,
  src/transformers/optimization.py), the factored second moment for >= 2-D
  parameters, exp_avg only when beta1 is set, state["RMS"] a 0-dim tensor;
* TorchAdafactor: torch.optim.Adafactor (torch/optim/_adafactor.py,
  _single_tensor_adafactor and _multi_tensor_adafactor), with the in-place
  foreach ops 1.13 lacks (_foreach_lerp_ with a list of weights,
  _foreach_clamp_min_, _foreach_rsqrt_) done tensor by tensor: in place
  they allocate nothing either way;
* clip_grad_norm_2x: torch.nn.utils.clip_grad_norm_ of PyTorch 2.x
  (_get_total_norm then _clip_grads_with_norm_) on one device and dtype;
  torch._foreach_norm exists in 1.13, its CPU slow path makes the 0-dim
  norms one per gradient (CUDA's fast path also makes its
  output_per_tensor scratch first, see README.md).

Gradient accumulation (optim_grad_accum) is plain PyTorch: N micro-batches,
each forward, loss / N and backward, then one step.
"""
import math

import torch
import torch.nn.functional as F


# --------------------------------------------------------------------------
# References

class HFAdafactor(torch.optim.Optimizer):
    """transformers.optimization.Adafactor, the same ops in the same order."""

    def __init__(self, params, lr=None, eps=(1e-30, 1e-3), clip_threshold=1.0, decay_rate=-0.8,
                 beta1=None, weight_decay=0.0, scale_parameter=True, relative_step=True,
                 warmup_init=False):
        if lr is not None and relative_step:
            raise ValueError("Cannot combine manual `lr` and `relative_step=True` options")
        if warmup_init and not relative_step:
            raise ValueError("`warmup_init=True` requires `relative_step=True`")
        defaults = dict(lr=lr, eps=eps, clip_threshold=clip_threshold, decay_rate=decay_rate,
                        beta1=beta1, weight_decay=weight_decay, scale_parameter=scale_parameter,
                        relative_step=relative_step, warmup_init=warmup_init)
        super().__init__(params, defaults)

    @staticmethod
    def _get_lr(param_group, param_state):
        rel_step_sz = param_group["lr"]
        if param_group["relative_step"]:
            min_step = 1e-6 * param_state["step"] if param_group["warmup_init"] else 1e-2
            rel_step_sz = min(min_step, 1.0 / math.sqrt(param_state["step"]))
        param_scale = 1.0
        if param_group["scale_parameter"]:
            param_scale = max(param_group["eps"][1], param_state["RMS"])
        return param_scale * rel_step_sz

    @staticmethod
    def _rms(tensor):
        return tensor.norm(2) / (tensor.numel() ** 0.5)

    @staticmethod
    def _approx_sq_grad(exp_avg_sq_row, exp_avg_sq_col):
        r_factor = (exp_avg_sq_row / exp_avg_sq_row.mean(dim=-1, keepdim=True)).rsqrt_().unsqueeze(-1)
        c_factor = exp_avg_sq_col.unsqueeze(-2).rsqrt()
        return torch.mul(r_factor, c_factor)

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = p.grad
                state = self.state[p]
                grad_shape = grad.shape
                factored = len(grad_shape) >= 2
                use_first_moment = group["beta1"] is not None
                if len(state) == 0:
                    state["step"] = 0
                    if use_first_moment:
                        state["exp_avg"] = torch.zeros_like(grad)
                    if factored:
                        state["exp_avg_sq_row"] = torch.zeros(grad_shape[:-1]).to(grad)
                        state["exp_avg_sq_col"] = torch.zeros(grad_shape[:-2] + grad_shape[-1:]).to(grad)
                    else:
                        state["exp_avg_sq"] = torch.zeros_like(grad)
                    state["RMS"] = 0
                else:
                    if use_first_moment:
                        state["exp_avg"] = state["exp_avg"].to(grad)
                    if factored:
                        state["exp_avg_sq_row"] = state["exp_avg_sq_row"].to(grad)
                        state["exp_avg_sq_col"] = state["exp_avg_sq_col"].to(grad)
                    else:
                        state["exp_avg_sq"] = state["exp_avg_sq"].to(grad)
                p_data_fp32 = p
                state["step"] += 1
                state["RMS"] = self._rms(p_data_fp32)
                lr = self._get_lr(group, state)
                beta2t = 1.0 - math.pow(state["step"], group["decay_rate"])
                update = (grad ** 2) + group["eps"][0]
                if factored:
                    exp_avg_sq_row = state["exp_avg_sq_row"]
                    exp_avg_sq_col = state["exp_avg_sq_col"]
                    exp_avg_sq_row.mul_(beta2t).add_(update.mean(dim=-1), alpha=(1.0 - beta2t))
                    exp_avg_sq_col.mul_(beta2t).add_(update.mean(dim=-2), alpha=(1.0 - beta2t))
                    update = self._approx_sq_grad(exp_avg_sq_row, exp_avg_sq_col)
                    update.mul_(grad)
                else:
                    exp_avg_sq = state["exp_avg_sq"]
                    exp_avg_sq.mul_(beta2t).add_(update, alpha=(1.0 - beta2t))
                    update = exp_avg_sq.rsqrt().mul_(grad)
                update.div_((self._rms(update) / group["clip_threshold"]).clamp_(min=1.0))
                update.mul_(lr)
                if use_first_moment:
                    exp_avg = state["exp_avg"]
                    exp_avg.mul_(group["beta1"]).add_(update, alpha=(1 - group["beta1"]))
                    update = exp_avg
                if group["weight_decay"] != 0:
                    p_data_fp32.add_(p_data_fp32, alpha=(-group["weight_decay"] * lr))
                p_data_fp32.add_(-update)
        return None


def _foreach_inplace(fn, tensors, *args):
    """An in-place foreach op 1.13 lacks, tensor by tensor (no allocation)."""
    for i, t in enumerate(tensors):
        fn(t, *(a[i] if isinstance(a, (list, tuple)) else a for a in args))


class TorchAdafactor(torch.optim.Optimizer):
    """torch.optim.Adafactor (2.5+): _init_group and the two implementations."""

    def __init__(self, params, lr=1e-2, beta2_decay=-0.8, eps=(None, 1e-3), d=1.0,
                 weight_decay=0.0, foreach=None, maximize=False):
        defaults = dict(lr=lr, beta2_decay=beta2_decay, eps=eps, d=d, weight_decay=weight_decay,
                        foreach=foreach, maximize=maximize)
        super().__init__(params, defaults)

    def _init_group(self, group, params_with_grad, grads, row_vars, col_vars, variances, state_steps):
        for p in group["params"]:
            if p.grad is None:
                continue
            params_with_grad.append(p)
            grads.append(p.grad)
            state = self.state[p]
            if len(state) == 0:
                state["step"] = torch.tensor(0.0)
                if p.grad.dim() > 1:
                    row_shape = list(p.grad.shape)
                    row_shape[-1] = 1
                    state["row_var"] = p.grad.new_zeros(row_shape)
                    col_shape = list(p.grad.shape)
                    col_shape[-2] = 1
                    state["col_var"] = p.grad.new_zeros(col_shape)
                else:
                    state["variance"] = torch.zeros_like(p.grad, memory_format=torch.preserve_format)
            row_vars.append(state.get("row_var", None))
            col_vars.append(state.get("col_var", None))
            variances.append(state.get("variance", None))
            state_steps.append(state["step"])

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            params_with_grad, grads, row_vars, col_vars, variances, state_steps = [], [], [], [], [], []
            eps1, eps2 = group["eps"]
            self._init_group(group, params_with_grad, grads, row_vars, col_vars, variances, state_steps)
            fn = _multi_tensor_adafactor if group["foreach"] else _single_tensor_adafactor
            fn(params_with_grad, grads, row_vars, col_vars, variances, state_steps, d=group["d"],
               lr=group["lr"], beta2_decay=group["beta2_decay"], weight_decay=group["weight_decay"],
               eps1=eps1, eps2=eps2)
        return None


def _single_tensor_adafactor(params, grads, row_vars, col_vars, variances, state_steps, *, d, lr,
                             beta2_decay, weight_decay, eps1, eps2):
    for i, param in enumerate(params):
        grad = grads[i]
        step_t = state_steps[i]
        row_var = row_vars[i]
        col_var = col_vars[i]
        variance = variances[i]
        if eps1 is None:
            eps1 = torch.finfo(param.dtype).eps
        step_t += 1
        step_float = step_t.item()
        one_minus_beta2_t = step_float ** beta2_decay
        rho_t = min(lr, 1 / (step_float ** 0.5))
        alpha = max(eps2, param.norm(2).item() / (param.numel() ** 0.5)) * rho_t
        if weight_decay != 0:
            param.mul_(1 - lr * weight_decay)
        if grad.dim() > 1:
            row_mean = torch.linalg.vector_norm(grad, dim=-1, keepdim=True).square_().div_(grad.size(-1))
            row_var.lerp_(row_mean, one_minus_beta2_t)
            col_mean = torch.linalg.vector_norm(grad, dim=-2, keepdim=True).square_().div_(grad.size(-2))
            col_var.lerp_(col_mean, one_minus_beta2_t)
            var_estimate = row_var @ col_var
            var_estimate.div_(row_var.mean(dim=-2, keepdim=True).clamp_(min=eps1))
        else:
            grad_squared = grad * grad
            variance.lerp_(grad_squared, one_minus_beta2_t)
            var_estimate = variance.clone()
        update = var_estimate.clamp_(min=eps1 * eps1).rsqrt_()
        update.mul_(grad)
        denom = max(1.0, update.norm(2).item() / ((update.numel() ** 0.5) * d))
        param.add_(update, alpha=-alpha / denom)


def _multi_tensor_adafactor(params, grads, row_vars, col_vars, variances, state_steps, *, d, lr,
                            beta2_decay, weight_decay, eps1, eps2):
    if len(params) == 0:
        return
    # _group_tensors_by_device_dtype_and_is_multidim: one device and dtype
    # here; matrices first when the first gradient is one (first-seen order).
    groups = {}
    for j, g in enumerate(grads):
        groups.setdefault(g.dim() > 1, []).append(j)
    for is_multidim, idx in groups.items():
        device_params = [params[j] for j in idx]
        device_grads = [grads[j] for j in idx]
        device_state_steps = [state_steps[j] for j in idx]
        if eps1 is None:
            eps1 = torch.finfo(device_params[0].dtype).eps
        # torch._foreach_add_(device_state_steps, torch.tensor(1.0, device="cpu"), alpha=1.0)
        # (1.13 has no Tensor overload): host step counters, in place.
        _foreach_inplace(lambda t, o: t.add_(o, alpha=1.0), device_state_steps,
                         torch.tensor(1.0, device="cpu"))
        one_minus_beta2_ts = []
        beta2_ts = []
        rho_ts = []
        for s in device_state_steps:
            one_minus_beta2_ts.append(s.item() ** beta2_decay)
            beta2_ts.append(1 - s.item() ** beta2_decay)
            rho_ts.append(min(lr, 1 / (s.item() ** 0.5)))
        alphas = [max(eps2, p.norm(2).item() / (p.numel() ** 0.5)) * r
                  for p, r in zip(device_params, rho_ts)]
        if weight_decay != 0:
            torch._foreach_mul_(device_params, 1 - lr * weight_decay)
        if is_multidim:
            device_row_vars = [row_vars[j] for j in idx]
            device_col_vars = [col_vars[j] for j in idx]
            row_means = [torch.linalg.vector_norm(grad, dim=-1, keepdim=True) for grad in device_grads]
            torch._foreach_mul_(row_means, row_means)
            torch._foreach_div_(row_means, [float(grad.size(-1)) for grad in device_grads])
            _foreach_inplace(torch.Tensor.lerp_, device_row_vars, row_means, one_minus_beta2_ts)
            del row_means
            col_means = [torch.linalg.vector_norm(grad, dim=-2, keepdim=True) for grad in device_grads]
            torch._foreach_mul_(col_means, col_means)
            torch._foreach_div_(col_means, [float(grad.size(-2)) for grad in device_grads])
            _foreach_inplace(torch.Tensor.lerp_, device_col_vars, col_means, one_minus_beta2_ts)
            del col_means
            var_estimates = [row_var @ col_var for row_var, col_var in zip(device_row_vars, device_col_vars)]
            row_var_means = [row_var.mean(dim=-2, keepdim=True) for row_var in device_row_vars]
            _foreach_inplace(torch.Tensor.clamp_min_, row_var_means, eps1)
            torch._foreach_div_(var_estimates, row_var_means)
            del row_var_means
        else:
            device_variances = [variances[j] for j in idx]
            grads_squared = torch._foreach_mul(device_grads, device_grads)
            _foreach_inplace(torch.Tensor.lerp_, device_variances, grads_squared, one_minus_beta2_ts)
            del grads_squared
            var_estimates = [v.clone() for v in device_variances]
        _foreach_inplace(torch.Tensor.clamp_min_, var_estimates, eps1 * eps1)
        _foreach_inplace(torch.Tensor.rsqrt_, var_estimates)
        torch._foreach_mul_(var_estimates, device_grads)
        updates = var_estimates
        alphas = [-a / (max(1.0, update.norm(2).item() / ((update.numel() ** 0.5) * d)))
                  for a, update in zip(alphas, updates)]
        torch._foreach_mul_(updates, alphas)
        torch._foreach_add_(device_params, updates)


@torch.no_grad()
def _get_total_norm(tensors, norm_type=2.0, foreach=None):
    tensors = list(tensors)
    norm_type = float(norm_type)
    if len(tensors) == 0:
        return torch.tensor(0.0)
    first_device = tensors[0].device
    norms = []
    if foreach:
        norms.extend(torch._foreach_norm(tensors, norm_type))
    else:
        norms.extend([torch.linalg.vector_norm(g, norm_type) for g in tensors])
    total_norm = torch.linalg.vector_norm(torch.stack([norm.to(first_device) for norm in norms]), norm_type)
    return total_norm


@torch.no_grad()
def _clip_grads_with_norm_(parameters, max_norm, total_norm, foreach=None):
    grads = [p.grad for p in parameters if p.grad is not None]
    max_norm = float(max_norm)
    if len(grads) == 0:
        return
    clip_coef = max_norm / (total_norm + 1e-6)
    clip_coef_clamped = torch.clamp(clip_coef, max=1.0)
    if foreach:
        torch._foreach_mul_(grads, clip_coef_clamped.to(grads[0].device))
    else:
        clip_coef_clamped_device = clip_coef_clamped.to(grads[0].device)
        for g in grads:
            g.mul_(clip_coef_clamped_device)


@torch.no_grad()
def clip_grad_norm_2x(parameters, max_norm, norm_type=2.0, foreach=None):
    """torch.nn.utils.clip_grad_norm_ of PyTorch 2.x (one device and dtype)."""
    parameters = list(parameters)
    grads = [p.grad for p in parameters if p.grad is not None]
    total_norm = _get_total_norm(grads, norm_type, foreach)
    _clip_grads_with_norm_(parameters, max_norm, total_norm, foreach)
    return total_norm


# --------------------------------------------------------------------------
# Cases

# The ops whose small results are device tensors on CUDA. torchref.py's
# default rule counts any allocation of 8 bytes or less in a "step" phase as
# a host scalar (Adam's step counters and the foreach ops on them); the
# Adafactors make genuine 0-dim (4-byte) and 1-element device tensors there:
# norms, the RMS, a bool comparison, the learning-rate tensor, a row mean.
DEVICE_OPS = {"aten::norm", "aten::linalg_vector_norm", "aten::div", "aten::mul", "aten::mean",
              "aten::gt", "aten::clamp", "aten::rsqrt", "aten::neg", "aten::add", "aten::sub",
              "aten::pow", "aten::reciprocal", "aten::mm", "aten::clone", "aten::empty_like"}


def step_host_rule(raw, ops, phase):
    """Keeps the default tags but for small results of DEVICE_OPS (returns ""
    for those: counted), for the optimizer step of the Adafactor cases."""
    if phase == "step" and raw not in (0, 8) and raw <= 8 and ops and ops[-1] in DEVICE_OPS:
        return ""
    return None


ACCUM = 3   # micro-batches per optimizer step in optim_grad_accum

MLP_DESC = ("MLP nn.Sequential(nn.Linear(512, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), "
            "nn.Linear(1024, 10)); x = torch.randn(64, 512); y = torch.randint(0, 10, (64,)); "
            "loss = F.cross_entropy(out, y)")


def _plain_steps(g, st, model, batches, opt):
    """The standard phases: forward, loss, backward, step, zero_grad, release."""
    x, y = batches[0]

    def fwd():
        st["out"] = model(x)

    def loss():
        st["loss"] = F.cross_entropy(st["out"], y)

    def bwd():
        st["loss"].backward()

    def step():
        opt.step()

    def zero():
        opt.zero_grad(set_to_none=True)

    def release():
        del st["out"], st["loss"]

    return [("forward", fwd), ("loss", loss), ("backward", bwd), ("step", step),
            ("zero_grad", zero), ("release", release)]


def _clip_steps(g, st, model, batches, opt):
    ph = _plain_steps(g, st, model, batches, opt)

    def clip():
        st["norm"] = clip_grad_norm_2x(model.parameters(), max_norm=1.0, foreach=True)

    def release():
        del st["out"], st["loss"], st["norm"]

    return ph[:3] + [("clip", clip)] + ph[3:5] + [("release", release)]


def _accum_steps(g, st, model, batches, opt):
    out = []
    for k, (x, y) in enumerate(batches, 1):
        def fwd(x=x):
            st["out"] = model(x)

        def loss(y=y):
            st["loss"] = F.cross_entropy(st["out"], y) / ACCUM

        def bwd():
            st["loss"].backward()

        def release():
            del st["out"], st["loss"]

        out += [(f"forward.{k}", fwd), (f"loss.{k}", loss), (f"backward.{k}", bwd),
                (f"release.{k}", release)]

    def step():
        opt.step()

    def zero():
        opt.zero_grad(set_to_none=True)

    return out + [("step", step), ("zero_grad", zero)]


def _mlp_batch():
    return torch.randn(64, 512), torch.randint(0, 10, (64,))


CASES = {
    "optim_adafactor_hf": dict(
        batches=1, phases=_plain_steps, host_rule=step_host_rule,
        opt=lambda p: HFAdafactor(p, lr=1e-3, scale_parameter=False, relative_step=False,
                                  warmup_init=False),
        desc=MLP_DESC + "; transformers' Adafactor(lr=1e-3, scale_parameter=False, "
             "relative_step=False, warmup_init=False) (what Trainer's optim='adafactor' passes; "
             "beta1=None, weight_decay=0), written in plain PyTorch (HFAdafactor)"),
    "optim_adafactor_hf_beta1": dict(
        batches=1, phases=_plain_steps, host_rule=step_host_rule,
        opt=lambda p: HFAdafactor(p, beta1=0.9, weight_decay=0.01),
        desc=MLP_DESC + "; transformers' Adafactor(beta1=0.9, weight_decay=0.01) with its "
             "defaults lr=None, relative_step=True, scale_parameter=True (the learning rate "
             "is then a 0-dim tensor: RMS * step size), written in plain PyTorch (HFAdafactor)"),
    "optim_adafactor_torch": dict(
        batches=1, phases=_plain_steps, host_rule=step_host_rule,
        opt=lambda p: TorchAdafactor(p, lr=1e-2),
        desc=MLP_DESC + "; torch.optim.Adafactor(lr=1e-2) (2.5+; foreach=None: the "
             "per-parameter loop), written in plain PyTorch (TorchAdafactor)"),
    "optim_adafactor_torch_foreach": dict(
        batches=1, phases=_plain_steps, host_rule=step_host_rule,
        opt=lambda p: TorchAdafactor(p, lr=1e-2, foreach=True),
        desc=MLP_DESC + "; torch.optim.Adafactor(lr=1e-2, foreach=True) (2.5+), written in "
             "plain PyTorch (TorchAdafactor)"),
    "optim_clip_grad": dict(
        batches=1, phases=_clip_steps,
        opt=lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.0),
        desc=MLP_DESC + "; after backward: norm = torch.nn.utils.clip_grad_norm_("
             "model.parameters(), max_norm=1.0, foreach=True) as PyTorch 2.x does it "
             "(clip_grad_norm_2x), kept until release; torch.optim.SGD(lr=0.1, momentum=0.0)"),
    "optim_grad_accum": dict(
        batches=ACCUM, phases=_accum_steps,
        opt=lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.0),
        desc=MLP_DESC + f"; {ACCUM} micro-batches (x_k, y_k made in that order) per "
             f"optimizer step, each: out = model(x_k); loss = F.cross_entropy(out, y_k) / "
             f"{ACCUM}; loss.backward(); del out, loss; then opt.step(); "
             "opt.zero_grad(set_to_none=True); torch.optim.SGD(lr=0.1, momentum=0.0)"),
}


def run_case(g, case, device):
    spec = CASES[case]
    torch.manual_seed(0)
    model = g["MLP"]().to(device)
    model.train()
    batches = [tuple(t.to(device) for t in _mlp_batch()) for _ in range(spec["batches"])]
    opt = spec["opt"](model.parameters())
    tensor_info = g["tensor_info"]
    params = [tensor_info(n, p) for n, p in model.named_parameters()]
    param_bytes = sum(p["bytes"] for p in params)
    rec = g["Recorder"](device)
    st = {}
    import gc
    gc.collect()
    gc.disable()
    if device == "cuda":
        rec.cuda_baseline()
    for s in range(1, g["STEPS"] + 1):
        for name, fn in spec["phases"](g, st, model, batches, opt):
            rec.phase(name, fn, step=s, host_rule=spec.get("host_rule"))
    gc.enable()
    inputs = []
    for k, (x, y) in enumerate(batches, 1):
        sfx = "" if len(batches) == 1 else str(k)
        inputs += [tensor_info("x" + sfx, x), tensor_info("y" + sfx, y)]
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
        "buffers": [],
        "inputs": inputs,
        "out_raw": 64 * 10 * 4,
        "phases": rec.phases,
    }
    return res, rec


# --------------------------------------------------------------------------
# Closed forms (CPU figures, host-only events excluded)

def _ph(res, step, name):
    for p in res["phases"]:
        if p["step"] == step and p["phase"] == name:
            return p
    raise KeyError((step, name))


def check_case(g, res):
    rounded = g["rounded"]
    case = res["case"]
    P = res["param_bytes"]
    assert P == g["MLP_PARAM_BYTES"], P
    shapes = [p["shape"] for p in res["params"]]
    out_loss = rounded(res["out_raw"]) + rounded(4)
    if case.startswith("optim_adafactor"):
        if case.startswith("optim_adafactor_hf"):
            # exp_avg_sq_row [rows] + exp_avg_sq_col [cols] per matrix, exp_avg_sq per vector,
            # RMS (a 0-dim tensor) per parameter, exp_avg (param-sized) with beta1.
            state = sum(rounded(4 * s[0]) + rounded(4 * s[1]) if len(s) == 2 else rounded(4 * s[0])
                        for s in shapes) + len(shapes) * 512
            if case.endswith("beta1"):
                state += P
        else:
            # row_var [rows, 1] + col_var [1, cols] per matrix, variance per vector.
            state = sum(rounded(4 * s[0]) + rounded(4 * s[1]) if len(s) == 2 else rounded(4 * s[0])
                        for s in shapes)
        for s in (1, 2):
            stp = _ph(res, s, "step")
            assert stp["start"] == (0 if s == 1 else state) + P + out_loss, (case, s, stp["start"])
            assert stp["end"] == state + P + out_loss, (case, s, stp["end"], state)
            assert _ph(res, s, "release")["end"] == state, (case, s)
    if case == "optim_clip_grad":
        n = len(shapes)
        for s in (1, 2):
            c = _ph(res, s, "clip")
            # The 0-dim norms (one per gradient), their stack ([n] floats) and its norm;
            # the total norm is kept.
            assert c["peak"] - c["start"] == (n + 2) * 512, (c["peak"], c["start"])
            assert c["end"] - c["start"] == 512
            stp = _ph(res, s, "step")
            assert stp["peak"] == stp["start"] == stp["end"]   # SGD, momentum=0: no state
            assert _ph(res, s, "release")["end"] == 0
    if case == "optim_grad_accum":
        for s in (1, 2):
            for k in range(1, ACCUM + 1):
                bw = _ph(res, s, f"backward.{k}")
                # Grads (accumulated in place from the second micro-batch on), the
                # logits and the loss (the quotient: cross_entropy's output was freed
                # when the division returned, DivBackward0 saves no tensor).
                assert bw["end"] == P + out_loss, (s, k, bw["end"])
                assert _ph(res, s, f"release.{k}")["end"] == P
            stp = _ph(res, s, "step")
            assert stp["peak"] == stp["start"] == stp["end"] == P
            assert _ph(res, s, "zero_grad")["end"] == 0


# --------------------------------------------------------------------------
# Wiring into torchref.py (its register_cases)

def descs():
    """Each case's description, by name."""
    return {c: CASES[c]["desc"] for c in CASES}
