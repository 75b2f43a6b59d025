"""bench/torchref/peft_ref.py: frozen layers, PEFT's LoRA and bitsandbytes'
4-bit layers in plain PyTorch, for torchref.py's golden cases (README.md).

PEFT and bitsandbytes are not installable here (bitsandbytes needs CUDA and
a newer PyTorch than Debian's 1.13), so what they do is written from their
published code, not imported:

- LoraLinear is PEFT 0.1x's peft.tuners.lora.layer.Linear for one adapter
  ("default"): base_layer, lora_dropout / lora_A / lora_B ModuleDicts, and
  its forward (result = base_layer(x); result + lora_B(lora_A(dropout(x)))
  * scaling; cast back to the base result's dtype). apply_lora is
  get_peft_model's injection (targets by name suffix, adapters in the base
  layer's dtype — a Linear4bit's compute_dtype — then float16/bfloat16 ones
  upcast to float32, every non-"lora_" parameter frozen).
- Linear4bit and MatMul4Bit are bitsandbytes 0.45-0.49's
  bitsandbytes/nn/modules.py Linear4bit.forward and
  bitsandbytes/autograd/_functions.py MatMul4Bit on CUDA, with the CUDA
  kernels (backends/cuda/ops.py) replaced by what they allocate: each is a
  torch.empty of the kernel's output, so the profiler sees bitsandbytes'
  allocations in bitsandbytes' order. The values are not computed (zeros):
  the cases measure memory.
- quantize_4bit is functional.quantize_4bit(blocksize=64,
  compress_statistics, quant_type="nf4") with its tensors: the packed
  weight uint8 [(n+1)//2, 1], the absmax (float32 [blocks], or uint8 with
  the nested state's float32 scales, a copy of the 256-value dynamic map
  and the 0-dim offset), the 16-value code. It runs before the measured
  region.
- prepare_model_for_kbit_training is peft/utils/other.py's: freeze every
  parameter, cast float16/bfloat16 ones that are not 4-bit to float32.
"""
import math
import weakref

import torch
import torch.nn as nn
import torch.nn.functional as F


# --------------------------------------------------------------------------
# PEFT's LoRA

class LoraLinear(nn.Module):
    """peft.tuners.lora.layer.Linear with the adapter "default"."""

    def __init__(self, base_layer, r, lora_alpha, lora_dropout, dtype):
        super().__init__()
        in_f, out_f = base_layer.in_features, base_layer.out_features
        self.base_layer = base_layer
        self.lora_dropout = nn.ModuleDict({"default": nn.Dropout(p=lora_dropout) if lora_dropout > 0 else nn.Identity()})
        self.lora_A = nn.ModuleDict({"default": nn.Linear(in_f, r, bias=False)})
        self.lora_B = nn.ModuleDict({"default": nn.Linear(r, out_f, bias=False)})
        self.scaling = {"default": lora_alpha / r}
        nn.init.kaiming_uniform_(self.lora_A["default"].weight, a=math.sqrt(5))
        nn.init.zeros_(self.lora_B["default"].weight)
        # _move_adapter_to_device_of_base_layer: the base layer's dtype
        for d in (self.lora_A, self.lora_B):
            d["default"] = d["default"].to(dtype=dtype)

    def forward(self, x):
        result = self.base_layer(x)
        torch_result_dtype = result.dtype
        lora_A = self.lora_A["default"]
        lora_B = self.lora_B["default"]
        dropout = self.lora_dropout["default"]
        scaling = self.scaling["default"]
        if x.dtype != lora_A.weight.dtype:  # _cast_input_dtype
            x = x.to(dtype=lora_A.weight.dtype)
        result = result + lora_B(lora_A(dropout(x))) * scaling
        result = result.to(torch_result_dtype)
        return result


def apply_lora(model, r, lora_alpha, lora_dropout, targets):
    """get_peft_model(model, LoraConfig(r, lora_alpha, lora_dropout, target_modules=targets)) in place."""
    keys = [k for k, _ in model.named_modules()]
    for key in keys:
        if key == "" or not any(key == t or key.endswith("." + t) for t in targets):
            continue
        parent_key, _, name = key.rpartition(".")
        parent = model.get_submodule(parent_key)
        base = getattr(parent, name)
        if isinstance(base, Linear4bit):
            dtype = base.compute_dtype or torch.float32
        else:
            dtype = base.weight.dtype
        setattr(parent, name, LoraLinear(base, r, lora_alpha, lora_dropout, dtype))
    for n, p in model.named_parameters():  # _mark_only_adapters_as_trainable
        if "lora_" not in n:
            p.requires_grad = False
    for m in model.modules():  # cast_adapter_dtype (autocast_adapter_dtype=True)
        if isinstance(m, LoraLinear):
            for d in (m.lora_A, m.lora_B):
                for p in d["default"].parameters():
                    if p.dtype in (torch.float16, torch.bfloat16):
                        p.data = p.data.to(torch.float32)
    return model


def enable_input_require_grads(model):
    """transformers' PreTrainedModel.enable_input_require_grads: a forward hook on the input embeddings."""
    def make_inputs_require_grads(module, input, output):
        output.requires_grad_(True)
    model.model.embed_tokens.register_forward_hook(make_inputs_require_grads)


# --------------------------------------------------------------------------
# bitsandbytes' 4-bit weights

NF4 = [-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635,
       -0.18477343022823334, -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725,
       0.24611230194568634, 0.33791524171829224, 0.44070982933044434, 0.5626170039176941,
       0.7229568362236023, 1.0]

_DYNAMIC = {}


class QuantState:
    def __init__(self, absmax, shape=None, code=None, blocksize=None, quant_type=None, dtype=None,
                 offset=None, state2=None):
        self.absmax, self.shape, self.code, self.blocksize = absmax, shape, code, blocksize
        self.quant_type, self.dtype, self.offset, self.state2 = quant_type, dtype, offset, state2
        self.nested = state2 is not None


def quantize_blockwise(A, blocksize):
    """functional.quantize_blockwise(A, blocksize) (nested=False): the kernel's absmax and uint8 out."""
    if "dynamic" not in _DYNAMIC:
        _DYNAMIC["dynamic"] = torch.zeros(256)  # create_dynamic_map().to(device), kept by bitsandbytes
    code = _DYNAMIC["dynamic"]
    blocks = -(A.numel() // -blocksize)
    _absmax = torch.zeros(blocks, dtype=torch.float32)
    _out = torch.zeros(A.shape, dtype=torch.uint8)
    return _out, QuantState(absmax=_absmax, code=code.clone(), blocksize=blocksize, dtype=A.dtype)


def quantize_4bit(A, blocksize=64, compress_statistics=True, quant_type="nf4"):
    n = A.numel()
    blocks = -(n // -blocksize)
    _absmax = torch.zeros(blocks, dtype=torch.float32)
    _out = torch.zeros(((n + 1) // 2, 1), dtype=torch.uint8)
    code = torch.tensor(NF4)
    if compress_statistics:
        offset = _absmax.mean()
        qabsmax, state2 = quantize_blockwise(_absmax - offset, blocksize=256)
        del _absmax
        state = QuantState(absmax=qabsmax, shape=A.shape, dtype=A.dtype, blocksize=blocksize, code=code,
                           quant_type=quant_type, offset=offset, state2=state2)
    else:
        state = QuantState(absmax=_absmax, shape=A.shape, dtype=A.dtype, blocksize=blocksize, code=code,
                           quant_type=quant_type)
    return _out, state


def dequantize_blockwise(A, quant_state):
    """The dequantize_blockwise kernel: out = torch.empty_like(A, dtype=float32)."""
    return torch.zeros(A.shape, dtype=torch.float32)


def dequantize_4bit(A, quant_state):
    """functional.dequantize_4bit(A, quant_state) with the CUDA kernel's torch.empty(shape, dtype)."""
    absmax = quant_state.absmax
    if quant_state.nested:
        absmax = dequantize_blockwise(quant_state.absmax, quant_state.state2)
        absmax += quant_state.offset
        if absmax.dtype != torch.float32:
            absmax = absmax.float()
    out = torch.zeros(quant_state.shape, dtype=quant_state.dtype)
    if A.shape[0] == 1:  # is transposed, transpose back
        return out.t()
    return out


class MatMul4Bit(torch.autograd.Function):
    """bitsandbytes/autograd/_functions.py MatMul4Bit (0.45-0.49)."""

    @staticmethod
    def forward(ctx, A, B, out=None, bias=None, quant_state=None):
        ctx.is_empty = False
        output = torch.nn.functional.linear(A, dequantize_4bit(B, quant_state).to(A.dtype).t(), bias)
        ctx.state = quant_state
        ctx.dtype_A, ctx.dtype_B, ctx.dtype_bias = A.dtype, B.dtype, None if bias is None else bias.dtype
        if any(ctx.needs_input_grad[:2]):
            ctx.tensors = (None, B)
        else:
            ctx.tensors = (None, None)
        return output

    @staticmethod
    def backward(ctx, grad_output):
        req_gradA, _, _, req_gradBias, _ = ctx.needs_input_grad
        _, B = ctx.tensors
        grad_A, grad_B, grad_bias = None, None, None
        if req_gradBias:
            grad_bias = grad_output.sum(0, dtype=ctx.dtype_bias)
        if req_gradA:
            grad_A = torch.matmul(grad_output, dequantize_4bit(B, ctx.state).to(grad_output.dtype).t())
        return grad_A, grad_B, None, grad_bias, None


class Linear4bit(nn.Module):
    """bitsandbytes.nn.Linear4bit after quantization (weight: the packed Params4bit)."""

    def __init__(self, linear, compute_dtype, quant_type="nf4", compress_statistics=True):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        packed, state = quantize_4bit(linear.weight.data, 64, compress_statistics, quant_type)
        self.weight = nn.Parameter(packed, requires_grad=False)
        self.weight.quant_state = state
        self.bias = linear.bias
        self.compute_dtype = compute_dtype

    def forward(self, x):
        quant_state = self.weight.quant_state
        if self.bias is not None and self.bias.dtype != x.dtype:
            self.bias.data = self.bias.data.to(x.dtype)
        inp_dtype = x.dtype
        if self.compute_dtype is not None:
            x = x.to(self.compute_dtype)
        bias = None if self.bias is None else self.bias.to(self.compute_dtype)
        weight = self.weight.t()
        # matmul_4bit on CUDA: not one row without grad, so MatMul4Bit
        return MatMul4Bit.apply(x, weight, None, bias, quant_state).to(inp_dtype)


def replace_with_bnb_linear(model, compute_dtype, skip=("lm_head",)):
    """transformers' replace_with_bnb_linear (load_in_4bit, nf4, double quant): nn.Linear -> Linear4bit."""
    for key, m in list(model.named_modules()):
        for name, child in list(m.named_children()):
            if isinstance(child, nn.Linear) and name not in skip:
                setattr(m, name, Linear4bit(child, compute_dtype))
    return model


def prepare_model_for_kbit_training(model):
    """peft/utils/other.py, use_gradient_checkpointing=False: freeze, half non-4-bit parameters to float32."""
    for _, param in model.named_parameters():
        param.requires_grad = False
    for param in model.parameters():
        if param.dtype in (torch.float16, torch.bfloat16) and param.dtype != torch.uint8:
            param.data = param.data.to(torch.float32)
    return model


# --------------------------------------------------------------------------
# Frozen layers

class FrozenMLP(nn.Sequential):
    """torchref's MLP with one Linear frozen (requires_grad_(False) on the module)."""

    def __init__(self, frozen):
        super().__init__(nn.Linear(512, 1024), nn.ReLU(), nn.Linear(1024, 1024),
                         nn.ReLU(), nn.Linear(1024, 10))
        self[frozen].requires_grad_(False)


# --------------------------------------------------------------------------
# PyTorch 2.x's non-reentrant checkpoint

class _StopRecomputation(Exception):
    pass


def checkpoint_early_stop(function, *args):
    """torch.utils.checkpoint.checkpoint(function, *args, use_reentrant=False) as PyTorch 2.x runs it,
    written for 1.13 (whose _checkpoint_without_reentrant reruns the whole function): the forward
    saves a Holder per saved tensor; the first unpack in the backward reruns function under the
    stashed RNG state, storing each recomputed tensor for its holder if the holder is still alive
    (a node that ran and released its saved tensors let go of its holder), and stops as soon as
    the last tensor the forward saved has been recomputed (2.x's early stop,
    _StopRecomputationError); each stored tensor is freed once its holder dies."""
    fwd_cpu_state = torch.get_rng_state()

    class Holder:
        pass

    storage = weakref.WeakKeyDictionary()
    weak_holder_list = []
    recomputed = [False]

    def pack(x):
        res = Holder()
        weak_holder_list.append(weakref.ref(res))
        return res

    def unpack(x):
        if not recomputed[0]:
            recomputed[0] = True
            counter = [0]

            def inner_pack(inner):
                counter[0] += 1
                holder = weak_holder_list[counter[0] - 1]()
                if holder is not None:
                    storage[holder] = inner.detach()
                if counter[0] == len(weak_holder_list):
                    raise _StopRecomputation()

            def inner_unpack(packed):
                raise RuntimeError("You are calling backwards on a tensor that is never exposed.")

            with torch.random.fork_rng(devices=[]):
                torch.set_rng_state(fwd_cpu_state)
                with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(inner_pack, inner_unpack):
                    try:
                        function(*args)
                    except _StopRecomputation:
                        pass
                    except RuntimeError as e:  # 1.13 passes a hook's exception on as a RuntimeError
                        if "_StopRecomputation" not in str(e):
                            raise
        return storage[x]

    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        return function(*args)
