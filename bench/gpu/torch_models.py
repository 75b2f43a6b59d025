"""bench/gpu/torch_models.py: the fit table's Llama and ResNet models in PyTorch,
for bench/gpu/torch_fit.py.

- "llama-3.2-1b": scripts/models/llama.star rebuilt layer for layer (its
  parameters created in the same order, nn.RMSNorm, HF's rotary tables under
  no_grad with autocast off, grouped-query attention by repeat_kv, SDPA,
  SwiGLU, tied lm_head), the model memsh's fit table trains.
- "hf-llama-3.2-1b": Hugging Face's own LlamaForCausalLM built from the
  published config (what a user trains), for comparison with both.
- "resnet18", "resnet50": torchvision's models (scripts/models/resnet.star's
  twin; torchvision's ReLUs are in place, resnet.star's are not), each
  residual block under non-reentrant checkpoint with --checkpoint.

Each builder returns (model, make_data(batch, seq), loss(model, x, y)).
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint as cp

LLAMA_3_2_1B = dict(n_layers=16, dim=2048, n_heads=32, n_kv_heads=8, ffn_dim=8192, vocab_size=128256,
                    tie_embeddings=True, rope_theta=500000.0)
LLAMA3_ROPE_SCALING = dict(factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=8192)


def inv_freq(head_dim, theta, scaling):
    """HF's default inv_freq, then _compute_llama3_parameters (as llama.star's _inv_freq)."""
    inv = [1.0 / math.pow(theta, float(i) / head_dim) for i in range(0, head_dim, 2)]
    factor, lo, hi = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    old = scaling["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old / lo, old / hi
    out = []
    for f in inv:
        wavelen = 2 * math.pi / f
        if wavelen > low_wavelen:
            f = f / factor
        elif wavelen >= high_wavelen:
            smooth = (old / wavelen - lo) / (hi - lo)
            f = (1 - smooth) * f / factor + smooth * f
        out.append(f)
    return out


def rms_norm(dim, eps):
    if hasattr(nn, "RMSNorm"):
        return nn.RMSNorm(dim, eps=eps)
    return _RMSNorm(dim, eps)  # PyTorch < 2.4 (the CPU dry run): the decomposition


class _RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        up = x.float()
        return (up * torch.rsqrt(up.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight).type_as(x)


def sdpa(q, k, v, causal):
    if hasattr(F, "scaled_dot_product_attention"):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    T = q.shape[-2]  # PyTorch < 2.0 (the CPU dry run): the math path
    att = q.matmul(k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    if causal:
        att = att.masked_fill(torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return att.softmax(-1).matmul(v)


def rotate_half(x):
    # as HF's and llama.star's: x1's slice first (the backward runs the
    # slices' nodes in the reverse order of their creation)
    half = x.shape[-1] // 2
    x1 = x.narrow(-1, 0, half)
    x2 = x.narrow(-1, half, x.shape[-1] - half)
    return torch.cat([x2.neg(), x1], dim=-1)


class LlamaAttention(nn.Module):
    def __init__(self, dim, n_heads, n_kv_heads):
        super().__init__()
        hd = dim // n_heads
        self.q_proj = nn.Linear(dim, n_heads * hd, bias=False)
        self.k_proj = nn.Linear(dim, n_kv_heads * hd, bias=False)
        self.v_proj = nn.Linear(dim, n_kv_heads * hd, bias=False)
        self.o_proj = nn.Linear(n_heads * hd, dim, bias=False)
        self.head_dim, self.n_rep = hd, n_heads // n_kv_heads

    def repeat_kv(self, x):
        if self.n_rep == 1:
            return x
        B, kvh, T, hd = x.shape
        return x.unsqueeze(2).expand(B, kvh, self.n_rep, T, hd).reshape(B, kvh * self.n_rep, T, hd)

    def forward(self, x, cos, sin):
        B, T, C = x.shape
        hd = self.head_dim
        q = self.q_proj(x).view(B, T, -1, hd).transpose(1, 2)
        k = self.k_proj(x).view(B, T, -1, hd).transpose(1, 2)
        v = self.v_proj(x).view(B, T, -1, hd).transpose(1, 2)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        k, v = self.repeat_kv(k), self.repeat_kv(v)
        y = sdpa(q, k, v, T > 1)
        y = y.transpose(1, 2).contiguous()
        return self.o_proj(y.reshape(B, T, -1).contiguous())


class LlamaMLP(nn.Module):
    def __init__(self, dim, ffn_dim):
        super().__init__()
        self.gate_proj = nn.Linear(dim, ffn_dim, bias=False)
        self.up_proj = nn.Linear(dim, ffn_dim, bias=False)
        self.down_proj = nn.Linear(ffn_dim, dim, bias=False)
        self.act_fn = nn.SiLU()

    def forward(self, x):
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class LlamaDecoderLayer(nn.Module):
    # llama.star evaluates self_attn, mlp, then the two norms: the same order.
    def __init__(self, dim, n_heads, n_kv_heads, ffn_dim, eps):
        super().__init__()
        self.self_attn = LlamaAttention(dim, n_heads, n_kv_heads)
        self.mlp = LlamaMLP(dim, ffn_dim)
        self.input_layernorm = rms_norm(dim, eps)
        self.post_attention_layernorm = rms_norm(dim, eps)

    def forward(self, x, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaRotary(nn.Module):
    def __init__(self, inv):
        super().__init__()
        self.register_buffer("inv_freq", torch.tensor(inv, dtype=torch.float32), persistent=False)
        self.attention_scaling = 1.0

    @torch.no_grad()
    def forward(self, x, position_ids):
        T = position_ids.shape[1]
        with torch.autocast(x.device.type, enabled=False):
            inv = self.inv_freq.view(1, -1, 1).float().expand(position_ids.shape[0], -1, 1)
            pos = position_ids.view(position_ids.shape[0], 1, T).float()
            freqs = inv.matmul(pos).transpose(1, 2)
            emb = torch.cat([freqs, freqs], dim=-1)
            cos, sin = emb.cos() * self.attention_scaling, emb.sin() * self.attention_scaling
        return cos.to(dtype=x.dtype), sin.to(dtype=x.dtype)


class LlamaModel(nn.Module):
    def __init__(self, layers, embed, norm, rotary, checkpoint):
        super().__init__()
        self.embed_tokens, self.layers, self.norm, self.rotary_emb = embed, nn.ModuleList(layers), norm, rotary
        self.checkpoint = checkpoint

    def forward(self, idx):
        B, T = idx.shape
        x = self.embed_tokens(idx)
        position_ids = torch.arange(T, device=idx.device).unsqueeze(0)
        cos, sin = self.rotary_emb(x, position_ids)
        for layer in self.layers:
            x = cp.checkpoint(layer, x, cos, sin, use_reentrant=False) if self.checkpoint else layer(x, cos, sin)
        return self.norm(x)


class LlamaForCausalLM(nn.Module):
    def __init__(self, n_layers, dim, n_heads, n_kv_heads, ffn_dim, vocab_size, tie_embeddings, rope_theta,
                 eps=1e-5, checkpoint=False):
        super().__init__()
        # llama.star's order: the layers, inv_freq, the embedding, the final
        # norm, lm_head (then tied: its own weight freed)
        layers = [LlamaDecoderLayer(dim, n_heads, n_kv_heads, ffn_dim, eps) for _ in range(n_layers)]
        rotary = LlamaRotary(inv_freq(dim // n_heads, rope_theta, LLAMA3_ROPE_SCALING))
        embed = nn.Embedding(vocab_size, dim)
        norm = rms_norm(dim, eps)
        self.model = LlamaModel(layers, embed, norm, rotary, checkpoint)
        self.lm_head = nn.Linear(dim, vocab_size, bias=False)
        if tie_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, idx):
        return self.lm_head(self.model(idx))


def lm_data(vocab):
    def make(batch, seq):
        return torch.randint(0, vocab, (batch, seq)), torch.randint(0, vocab, (batch, seq))
    return make


def lm_loss(model, x, y):
    out = model(x)
    if out.dtype != torch.float32:  # fit.star upcasts Llama's logits as HF's ForCausalLMLoss does
        out = out.float()
    return F.cross_entropy(out.view(-1, out.shape[-1]), y.view(-1))


def build_llama(cfg, checkpoint):
    return LlamaForCausalLM(**cfg, checkpoint=checkpoint), lm_data(cfg["vocab_size"]), lm_loss


def build_hf_llama(cfg, checkpoint):
    from transformers import LlamaConfig
    from transformers import LlamaForCausalLM as HF
    kw = dict(vocab_size=cfg["vocab_size"], hidden_size=cfg["dim"], intermediate_size=cfg["ffn_dim"],
              num_hidden_layers=cfg["n_layers"], num_attention_heads=cfg["n_heads"],
              num_key_value_heads=cfg["n_kv_heads"], head_dim=cfg["dim"] // cfg["n_heads"],
              max_position_embeddings=131072, rms_norm_eps=1e-5, tie_word_embeddings=cfg["tie_embeddings"],
              use_cache=False, attention_bias=False, mlp_bias=False)
    rope = dict(rope_type="llama3", **LLAMA3_ROPE_SCALING)
    try:  # transformers 5: rope_parameters holds rope_theta too
        conf = LlamaConfig(rope_parameters=dict(rope_theta=cfg["rope_theta"], **rope), **kw)
    except TypeError:
        conf = LlamaConfig(rope_theta=cfg["rope_theta"], rope_scaling=rope, **kw)
    conf._attn_implementation = "sdpa"
    model = HF(conf)
    model.train()
    if checkpoint:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})

    def loss(model, x, y):
        out = model(input_ids=x, use_cache=False).logits
        if out.dtype != torch.float32:
            out = out.float()
        return F.cross_entropy(out.view(-1, out.shape[-1]), y.view(-1))
    return model, lm_data(cfg["vocab_size"]), loss


class _Checkpointed(nn.Module):
    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, x):
        return cp.checkpoint(self.m, x, use_reentrant=False)


def build_resnet(name, checkpoint):
    import torchvision
    model = getattr(torchvision.models, name)()
    if checkpoint:
        for layer in (model.layer1, model.layer2, model.layer3, model.layer4):
            for i in range(len(layer)):
                layer[i] = _Checkpointed(layer[i])

    def make(batch, seq):
        return torch.randn(batch, 3, 224, 224), torch.randint(0, 1000, (batch,))

    def loss(model, x, y):
        return F.cross_entropy(model(x), y)
    return model, make, loss


BUILDERS = {
    "llama-3.2-1b": lambda ck: build_llama(LLAMA_3_2_1B, ck),
    "hf-llama-3.2-1b": lambda ck: build_hf_llama(LLAMA_3_2_1B, ck),
    "resnet18": lambda ck: build_resnet("resnet18", ck),
    "resnet50": lambda ck: build_resnet("resnet50", ck),
}
