"""bench/torchref/hf_families.py: plain-PyTorch references of Hugging Face
transformers' causal LMs, for memsh's models/hf.star golden cases.

Each family's forward is written from transformers' modeling code (4.5x,
the version models/decoder.star and models/hf.star follow; GPT-2 as 4.48 to
4.52), eager attention, training mode, no KV cache (`use_cache: false` in
the config), and returns ForCausalLMLoss's loss: `loss = model(input_ids,
labels)`. What it allocates, keeps and frees is transformers':

* LlamaRMSNorm / Gemma2RMSNorm are composites (x.to(float32), pow(2),
  mean, + eps, rsqrt, ·; weight · h.to(dtype), or h · (1 + weight.float())).
* One rotary embedding per distinct RoPE (Gemma 3: the global one and the
  local one), cos/sin computed once per forward under no_grad with autocast
  off: inv_freq[None, :, None].float().expand(B, -1, 1) @
  position_ids[:, None, :].float(), transpose, cat, cos()/sin() ·
  attention_scaling, .to(x.dtype).
* The causal masks, one per layer type, as masking_utils makes them for
  eager attention, built the way models/decoder.star builds them (a bool
  [1, 1, T, T] from aranges, torch.where for the sliding window, expanded to
  [B, 1, T, T], then eager_mask's torch.where(mask, torch.tensor(0.0),
  finfo.min) in the embeddings' dtype). Their temporaries are a few hundred
  bytes at the forward's start; only the float masks stay.
* eager_attention_forward: repeat_kv (expand + reshape, a copy),
  q @ kᵀ · scaling, Gemma 2's softcapping (/ cap, tanh, · cap), + mask,
  softmax(dtype=float32).to(q.dtype), dropout(p=0: the input itself),
  @ v, transpose(1, 2).contiguous(); then reshape(B, T, -1).contiguous()
  and o_proj.
* ForCausalLMLoss: logits.float(), labels = F.pad(labels, (0, 1),
  value=-100) (kept until the loss function returns), labels[..., 1:]
  .contiguous(), cross_entropy(ignore_index=-100, reduction="mean").
* Python's lifetimes: a value bound to a local lives until its function
  returns (Gemma's inputs_embeds, GPT-2's inputs_embeds and
  position_embeds, the padded labels).

GPT-2 (GPT2LMHeadModel, 4.48 to 4.52): Conv1D projections (torch.addmm),
the bool `bias` buffer with torch.where(bias, w, full([], finfo.min)),
w / full([], sqrt(head_dim)), no attention mask (eager, attention_mask
None), NewGELUActivation's composite, pdrops 0.

The Mixture-of-Experts families (mixtral, qwen2_moe, qwen3_moe; the
HF*-named classes, SparseMoe, MOE_TINY at the end of this file) are a
second, separate model of transformers 4.5x's decoder with the sparse MoE
blocks and memsh's routing plan forced on topk's indices; their cases are
mixtral_tiny, qwen2_moe_tiny and qwen3_moe_tiny.
"""
import json
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

_BASE = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, head_dim=16, vocab_size=512, max_position_embeddings=64,
             rms_norm_eps=1e-6, rope_theta=10000.0, attention_dropout=0.0, use_cache=False)

# The tiny configs (config.json dicts); the Go golden test passes the same
# dict (recorded in the JSON's "config") to models/hf.star's from_config.
CONFIGS = {
    "llama": dict(_BASE, model_type="llama", hidden_act="silu", attention_bias=False,
                  tie_word_embeddings=False),
    "qwen2": dict(_BASE, model_type="qwen2", hidden_act="silu", tie_word_embeddings=False,
                  use_sliding_window=False),
    "qwen3": dict(_BASE, model_type="qwen3", hidden_act="silu", attention_bias=False,
                  tie_word_embeddings=False, use_sliding_window=False),
    "gemma2": dict(_BASE, model_type="gemma2", hidden_activation="gelu_pytorch_tanh",
                   tie_word_embeddings=True, query_pre_attn_scalar=16, sliding_window=16,
                   attn_logit_softcapping=50.0, final_logit_softcapping=30.0,
                   attention_bias=False),
    "phi3": dict(_BASE, model_type="phi3", hidden_act="silu", tie_word_embeddings=False,
                 resid_pdrop=0.0, embd_pdrop=0.0, partial_rotary_factor=1.0),
    "mistral": dict(_BASE, model_type="mistral", hidden_act="silu", tie_word_embeddings=False,
                    sliding_window=16),
    "gemma3_text": dict(_BASE, model_type="gemma3_text", hidden_activation="gelu_pytorch_tanh",
                        tie_word_embeddings=True, query_pre_attn_scalar=16, sliding_window=16,
                        layer_types=["sliding_attention", "full_attention"],
                        rope_local_base_freq=10000.0, rope_theta=1000000.0,
                        attn_logit_softcapping=None, final_logit_softcapping=None,
                        attention_bias=False),
    "gpt2": dict(model_type="gpt2", n_embd=64, n_head=4, n_layer=2, n_positions=64, vocab_size=512,
                 activation_function="gelu_new", attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0,
                 layer_norm_epsilon=1e-5, use_cache=False),
}

BATCH, SEQ = 2, 32


# --------------------------------------------------------------------------
# Norms

class LlamaRMSNorm(nn.Module):
    def __init__(self, hidden_size, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, hidden_states):
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states.to(input_dtype)


class GemmaRMSNorm(nn.Module):
    """Gemma2RMSNorm / Gemma3RMSNorm: zeros-initialised weight, (1 + w) in float32."""

    def __init__(self, dim, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(dim))

    def _norm(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)

    def forward(self, x):
        output = self._norm(x.float())
        output = output * (1.0 + self.weight.float())
        return output.type_as(x)


# --------------------------------------------------------------------------
# Rotary embeddings

class RotaryEmbedding(nn.Module):
    """LlamaRotaryEmbedding (default rope_type, attention_scaling 1.0)."""

    def __init__(self, dim, base):
        super().__init__()
        inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).to(dtype=torch.float) / dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.attention_scaling = 1.0

    @torch.no_grad()
    def forward(self, x, position_ids):
        inv_freq_expanded = self.inv_freq[None, :, None].float().expand(position_ids.shape[0], -1, 1).to(x.device)
        position_ids_expanded = position_ids[:, None, :].float()
        with torch.autocast(device_type=x.device.type, enabled=False):
            freqs = (inv_freq_expanded.float() @ position_ids_expanded.float()).transpose(1, 2)
            emb = torch.cat((freqs, freqs), dim=-1)
            cos = emb.cos() * self.attention_scaling
            sin = emb.sin() * self.attention_scaling
        return cos.to(dtype=x.dtype), sin.to(dtype=x.dtype)


def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
    cos = cos.unsqueeze(unsqueeze_dim)
    sin = sin.unsqueeze(unsqueeze_dim)
    q_embed = (q * cos) + (rotate_half(q) * sin)
    k_embed = (k * cos) + (rotate_half(k) * sin)
    return q_embed, k_embed


def apply_rotary_pos_emb_partial(q, k, cos, sin, unsqueeze_dim=1):
    """Phi-3's apply_rotary_pos_emb: rotate the first rotary_dim, cat the rest."""
    cos = cos.unsqueeze(unsqueeze_dim)
    sin = sin.unsqueeze(unsqueeze_dim)
    rotary_dim = cos.shape[-1]
    q_rot, q_pass = q[..., :rotary_dim], q[..., rotary_dim:]
    k_rot, k_pass = k[..., :rotary_dim], k[..., rotary_dim:]
    q_embed = torch.cat([(q_rot * cos) + (rotate_half(q_rot) * sin), q_pass], dim=-1)
    k_embed = torch.cat([(k_rot * cos) + (rotate_half(k_rot) * sin), k_pass], dim=-1)
    return q_embed, k_embed


# --------------------------------------------------------------------------
# Attention

def repeat_kv(hidden_states, n_rep):
    batch, num_key_value_heads, slen, head_dim = hidden_states.shape
    if n_rep == 1:
        return hidden_states
    hidden_states = hidden_states[:, :, None, :, :].expand(batch, num_key_value_heads, n_rep, slen, head_dim)
    return hidden_states.reshape(batch, num_key_value_heads * n_rep, slen, head_dim)


def eager_attention_forward(module, query, key, value, attention_mask, scaling, dropout=0.0, softcap=None):
    key_states = repeat_kv(key, module.num_key_value_groups)
    value_states = repeat_kv(value, module.num_key_value_groups)
    attn_weights = torch.matmul(query, key_states.transpose(2, 3)) * scaling
    if softcap is not None:
        attn_weights = attn_weights / softcap
        attn_weights = torch.tanh(attn_weights)
        attn_weights = attn_weights * softcap
    if attention_mask is not None:
        causal_mask = attention_mask[:, :, :, : key_states.shape[-2]]
        attn_weights = attn_weights + causal_mask
    attn_weights = F.softmax(attn_weights, dim=-1, dtype=torch.float32).to(query.dtype)
    attn_weights = F.dropout(attn_weights, p=dropout, training=module.training)
    attn_output = torch.matmul(attn_weights, value_states)
    attn_output = attn_output.transpose(1, 2).contiguous()
    return attn_output, attn_weights


class Attention(nn.Module):
    """LlamaAttention, with Qwen2's q/k/v bias, Qwen3's and Gemma 3's q/k norms, Gemma 2's
    softcapping and query_pre_attn_scalar, Phi-3's fused qkv_proj and partial rotary."""

    def __init__(self, s):
        super().__init__()
        h, hd, nh, nkv = s["hidden"], s["head_dim"], s["n_heads"], s["n_kv_heads"]
        self.head_dim = hd
        self.num_heads = nh
        self.num_key_value_heads = nkv
        self.num_key_value_groups = nh // nkv
        self.scaling = s["scaling"]
        self.attention_dropout = s["attention_dropout"]
        self.softcap = s.get("attn_softcap")
        self.fused = s.get("fused_qkv", False)
        self.partial = s.get("partial_rotary", False)
        if self.fused:
            self.qkv_proj = nn.Linear(h, (nh + 2 * nkv) * hd, bias=False)
        else:
            self.q_proj = nn.Linear(h, nh * hd, bias=s["qkv_bias"])
            self.k_proj = nn.Linear(h, nkv * hd, bias=s["qkv_bias"])
            self.v_proj = nn.Linear(h, nkv * hd, bias=s["qkv_bias"])
        self.o_proj = nn.Linear(nh * hd, h, bias=s["o_bias"])
        self.qk_norm = s.get("qk_norm", False)
        if self.qk_norm:
            self.q_norm = s["norm_cls"](hd, s["eps"])
            self.k_norm = s["norm_cls"](hd, s["eps"])

    def forward(self, hidden_states, position_embeddings, attention_mask, cache=None, layer_idx=None):
        input_shape = hidden_states.shape[:-1]
        hidden_shape = (*input_shape, -1, self.head_dim)
        if self.fused:
            # Phi3Attention
            qkv = self.qkv_proj(hidden_states)
            query_pos = self.num_heads * self.head_dim
            query_states = qkv[..., :query_pos]
            key_states = qkv[..., query_pos: query_pos + self.num_key_value_heads * self.head_dim]
            value_states = qkv[..., query_pos + self.num_key_value_heads * self.head_dim:]
            query_states = query_states.view(hidden_shape).transpose(1, 2)
            key_states = key_states.view(hidden_shape).transpose(1, 2)
            value_states = value_states.view(hidden_shape).transpose(1, 2)
        elif self.qk_norm:
            # Qwen3Attention / Gemma3Attention
            query_states = self.q_norm(self.q_proj(hidden_states).view(hidden_shape)).transpose(1, 2)
            key_states = self.k_norm(self.k_proj(hidden_states).view(hidden_shape)).transpose(1, 2)
            value_states = self.v_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        else:
            query_states = self.q_proj(hidden_states).view(hidden_shape).transpose(1, 2)
            key_states = self.k_proj(hidden_states).view(hidden_shape).transpose(1, 2)
            value_states = self.v_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        cos, sin = position_embeddings
        rope = apply_rotary_pos_emb_partial if self.partial else apply_rotary_pos_emb
        query_states, key_states = rope(query_states, key_states, cos, sin)
        if cache is not None:
            # past_key_values.update(key_states, value_states, self.layer_idx, cache_kwargs)
            key_states, value_states = cache.update(key_states, value_states, layer_idx)
        attn_output, attn_weights = eager_attention_forward(
            self, query_states, key_states, value_states, attention_mask,
            dropout=0.0 if not self.training else self.attention_dropout,
            scaling=self.scaling, softcap=self.softcap)
        attn_output = attn_output.reshape(*input_shape, -1).contiguous()
        attn_output = self.o_proj(attn_output)
        return attn_output, attn_weights


# --------------------------------------------------------------------------
# MLP and layers

def _act(name):
    if name == "silu":
        return nn.SiLU()
    if name == "gelu_pytorch_tanh":
        return lambda x: F.gelu(x, approximate="tanh")   # PytorchGELUTanh
    raise ValueError(name)


class MLP(nn.Module):
    """LlamaMLP (Gemma's too): down_proj(act(gate_proj(x)) * up_proj(x))."""

    def __init__(self, s):
        super().__init__()
        h, i = s["hidden"], s["intermediate"]
        self.gate_proj = nn.Linear(h, i, bias=False)
        self.up_proj = nn.Linear(h, i, bias=False)
        self.down_proj = nn.Linear(i, h, bias=False)
        self.act_fn = _act(s["act"])

    def forward(self, x):
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class Phi3MLP(nn.Module):
    def __init__(self, s):
        super().__init__()
        h, i = s["hidden"], s["intermediate"]
        self.gate_up_proj = nn.Linear(h, 2 * i, bias=False)
        self.down_proj = nn.Linear(i, h, bias=False)
        self.activation_fn = _act(s["act"])

    def forward(self, hidden_states):
        up_states = self.gate_up_proj(hidden_states)
        gate, up_states = up_states.chunk(2, dim=-1)
        up_states = up_states * self.activation_fn(gate)
        return self.down_proj(up_states)


class DecoderLayer(nn.Module):
    """LlamaDecoderLayer; Phi3DecoderLayer (residual + dropout(h)); Gemma2/3DecoderLayer
    (sandwich norms: post_attention, pre_feedforward, post_feedforward)."""

    def __init__(self, s, layer_type):
        super().__init__()
        self.attention_type = layer_type
        self.self_attn = Attention(s)
        self.mlp = Phi3MLP(s) if s.get("fused_gate_up") else MLP(s)
        norm = s["norm_cls"]
        self.input_layernorm = norm(s["hidden"], s["eps"])
        self.post_attention_layernorm = norm(s["hidden"], s["eps"])
        self.sandwich = s.get("sandwich_norm", False)
        if self.sandwich:
            self.pre_feedforward_layernorm = norm(s["hidden"], s["eps"])
            self.post_feedforward_layernorm = norm(s["hidden"], s["eps"])
        self.phi3 = s.get("fused_gate_up", False)
        if self.phi3:
            self.resid_attn_dropout = nn.Dropout(s["resid_dropout"])
            self.resid_mlp_dropout = nn.Dropout(s["resid_dropout"])

    def forward(self, hidden_states, attention_mask, position_embeddings, cache=None, layer_idx=None):
        residual = hidden_states
        hidden_states = self.input_layernorm(hidden_states)
        hidden_states, _ = self.self_attn(hidden_states, position_embeddings, attention_mask, cache, layer_idx)
        if self.sandwich:
            hidden_states = self.post_attention_layernorm(hidden_states)
            hidden_states = residual + hidden_states
            residual = hidden_states
            hidden_states = self.pre_feedforward_layernorm(hidden_states)
            hidden_states = self.mlp(hidden_states)
            hidden_states = self.post_feedforward_layernorm(hidden_states)
            hidden_states = residual + hidden_states
        elif self.phi3:
            hidden_states = residual + self.resid_attn_dropout(hidden_states)
            residual = hidden_states
            hidden_states = self.post_attention_layernorm(hidden_states)
            hidden_states = self.mlp(hidden_states)
            hidden_states = residual + self.resid_mlp_dropout(hidden_states)
        else:
            hidden_states = residual + hidden_states
            residual = hidden_states
            hidden_states = self.post_attention_layernorm(hidden_states)
            hidden_states = self.mlp(hidden_states)
            hidden_states = residual + hidden_states
        return hidden_states


def causal_masks(layer_types, sliding_window, batch, T, dtype, device, past=0, kv=None, valid=None):
    """One float mask per layer type (eager_mask of masking_utils' causal / sliding-window mask),
    built as models/decoder.star builds it: [B, 1, T, kv] for queries at past..past+T-1 over kv
    keys (kv: past + T; a StaticCache's whole length, with valid the keys filled)."""
    kv = kv or past + T
    masks = {}
    for lt in layer_types:
        if lt in masks:
            continue
        window = sliding_window if lt == "sliding_attention" else None
        q_idx = torch.arange(past, past + T, device=device).view(1, 1, T, 1)
        kv_idx = torch.arange(kv, device=device).view(1, 1, 1, kv)
        m = kv_idx.le(q_idx)
        if window is not None:
            m = torch.where(kv_idx.gt(q_idx - window), m, False)
        if valid is not None and valid < kv:
            m = torch.where(kv_idx.lt(valid), m, False)
        m = m.expand(batch, 1, T, kv)
        m = torch.where(m, torch.tensor(0.0, device=device, dtype=dtype), torch.finfo(dtype).min)
        masks[lt] = m
    return masks


class DecoderModel(nn.Module):
    """LlamaModel and relatives (Gemma: inputs_embeds · normalizer, a host 0-dim tensor in
    Gemma 2, Gemma3TextScaledWordEmbedding's device buffer in Gemma 3)."""

    def __init__(self, s):
        super().__init__()
        self.s = s
        self.embed_tokens = nn.Embedding(s["vocab"], s["hidden"])
        self.layers = nn.ModuleList([DecoderLayer(s, s["layer_types"][i]) for i in range(s["n_layers"])])
        self.norm = s["norm_cls"](s["hidden"], s["eps"])
        self.rotary_emb = RotaryEmbedding(s["rotary_dim"], s["rope_theta"])
        if s.get("rope_local_theta") is not None:
            self.rotary_emb_local = RotaryEmbedding(s["rotary_dim"], s["rope_local_theta"])
        if s.get("embed_buffer"):
            self.register_buffer("embed_scale", torch.tensor(s["embed_scale"]), persistent=False)

    def forward(self, input_ids, cache=None):
        s = self.s
        if s.get("embed_buffer"):
            # Gemma3TextScaledWordEmbedding: embedding(ids) * embed_scale.to(weight.dtype)
            inputs_embeds = self.embed_tokens(input_ids) * self.embed_scale.to(self.embed_tokens.weight.dtype)
        else:
            inputs_embeds = self.embed_tokens(input_ids)
        T = inputs_embeds.shape[1]
        past = cache.get_seq_length() if cache is not None else 0
        cache_position = torch.arange(past, past + T, device=inputs_embeds.device)
        position_ids = cache_position.unsqueeze(0)
        kv, valid = (None, None)
        if cache is not None:
            # cache_kwargs' cache_position (a StaticCache's index_copy_ positions)
            cache.cache_position = cache_position
            kv, valid = cache.mask_sizes(past, T)
        masks = causal_masks(s["layer_types"], s.get("sliding_window"), inputs_embeds.shape[0],
                             T, inputs_embeds.dtype, inputs_embeds.device, past, kv, valid)
        hidden_states = inputs_embeds
        position_embeddings = self.rotary_emb(hidden_states, position_ids)
        pe = {"full_attention": position_embeddings, "sliding_attention": position_embeddings}
        if s.get("rope_local_theta") is not None:
            pe["sliding_attention"] = self.rotary_emb_local(hidden_states, position_ids)
        if s.get("embed_scale") is not None and not s.get("embed_buffer"):
            # Gemma2Model: a 0-dim tensor on the host (no device given)
            with torch.profiler.record_function("host_tensor"):
                normalizer = torch.tensor(s["embed_scale"], dtype=hidden_states.dtype)
            hidden_states = hidden_states * normalizer
        for i, layer in enumerate(self.layers):
            hidden_states = layer(hidden_states, masks[layer.attention_type], pe[layer.attention_type], cache, i)
        if cache is not None:
            cache.seen += T
            cache.cache_position = None  # generate's own copy is left out (generate_ref.py)
        hidden_states = self.norm(hidden_states)
        return hidden_states


def for_causal_lm_loss(logits, labels, vocab_size, ignore_index=-100):
    """ForCausalLMLoss (num_items_in_batch None: reduction mean)."""
    logits = logits.float()
    labels = F.pad(labels, (0, 1), value=ignore_index)
    shift_labels = labels[..., 1:].contiguous()
    logits = logits.view(-1, vocab_size)
    shift_labels = shift_labels.view(-1)
    shift_labels = shift_labels.to(logits.device)
    loss = F.cross_entropy(logits, shift_labels, ignore_index=ignore_index, reduction="mean")
    return loss


class DecoderForCausalLM(nn.Module):
    def __init__(self, s):
        super().__init__()
        self.s = s
        self.model = DecoderModel(s)
        self.lm_head = nn.Linear(s["hidden"], s["vocab"], bias=False)
        if s["tie"]:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, input_ids, labels=None, cache=None, logits_to_keep=0):
        hidden_states = self.model(input_ids, cache)
        logits = self.lm_head(hidden_states[:, slice(-logits_to_keep, None), :])
        cap = self.s.get("final_softcap")
        if cap is not None:
            logits = logits / cap
            logits = torch.tanh(logits)
            logits = logits * cap
        if labels is None:
            return logits
        loss = for_causal_lm_loss(logits, labels, self.s["vocab"])
        return loss


def decoder_spec(c):
    """The normalised description of a Llama-family config (defaults as its config class)."""
    mt = c["model_type"]
    hd = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    n = c["num_hidden_layers"]
    s = dict(
        n_layers=n, hidden=c["hidden_size"], n_heads=c["num_attention_heads"],
        n_kv_heads=c["num_key_value_heads"], head_dim=hd, intermediate=c["intermediate_size"],
        vocab=c["vocab_size"], tie=c["tie_word_embeddings"], eps=c["rms_norm_eps"],
        norm_cls=LlamaRMSNorm, act=c.get("hidden_act", "silu"),
        qkv_bias=c.get("attention_bias", False), o_bias=c.get("attention_bias", False),
        scaling=hd ** -0.5, attention_dropout=c["attention_dropout"],
        layer_types=["full_attention"] * n, sliding_window=None,
        rotary_dim=hd, rope_theta=c["rope_theta"],
    )
    if mt == "mistral" and c.get("sliding_window") is not None:
        s["layer_types"] = ["sliding_attention"] * n
        s["sliding_window"] = c["sliding_window"]
    if mt == "qwen2":
        s["qkv_bias"], s["o_bias"] = True, False
    if mt == "qwen3":
        s["qk_norm"] = True
    if mt in ("gemma2", "gemma3_text"):
        s["norm_cls"] = GemmaRMSNorm
        s["act"] = c["hidden_activation"]
        s["sandwich_norm"] = True
        s["embed_scale"] = c["hidden_size"] ** 0.5
        s["scaling"] = c["query_pre_attn_scalar"] ** -0.5
        s["attn_softcap"] = c.get("attn_logit_softcapping")
        s["final_softcap"] = c.get("final_logit_softcapping")
        s["sliding_window"] = c["sliding_window"]
    if mt == "gemma2":
        s["layer_types"] = ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(n)]
    if mt == "gemma3_text":
        s["qk_norm"] = True
        s["embed_buffer"] = True
        s["layer_types"] = c["layer_types"]
        s["rope_local_theta"] = c["rope_local_base_freq"]
    if mt == "phi3":
        s["fused_qkv"] = s["fused_gate_up"] = s["partial_rotary"] = True
        s["rotary_dim"] = int(hd * c.get("partial_rotary_factor", 1.0))
        s["resid_dropout"] = c["resid_pdrop"]
        if c.get("sliding_window") is not None:
            s["layer_types"] = ["sliding_attention"] * n
            s["sliding_window"] = c["sliding_window"]
    return s


# --------------------------------------------------------------------------
# GPT-2 (GPT2LMHeadModel, transformers 4.48 to 4.52)

class Conv1D(nn.Module):
    def __init__(self, nf, nx):
        super().__init__()
        self.nf = nf
        self.weight = nn.Parameter(torch.empty(nx, nf))
        self.bias = nn.Parameter(torch.zeros(nf))
        nn.init.normal_(self.weight, std=0.02)

    def forward(self, x):
        size_out = x.size()[:-1] + (self.nf,)
        x = torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight)
        x = x.view(size_out)
        return x


class NewGELUActivation(nn.Module):
    def forward(self, input):
        return 0.5 * input * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (input + 0.044715 * torch.pow(input, 3.0))))


def gpt2_eager_attention_forward(module, query, key, value, attention_mask, head_mask=None):
    attn_weights = torch.matmul(query, key.transpose(-1, -2))
    attn_weights = attn_weights / torch.full(
        [], value.size(-1) ** 0.5, dtype=attn_weights.dtype, device=attn_weights.device)
    query_length, key_length = query.size(-2), key.size(-2)
    causal_mask = module.bias[:, :, key_length - query_length: key_length, :key_length]
    mask_value = torch.finfo(attn_weights.dtype).min
    mask_value = torch.full([], mask_value, dtype=attn_weights.dtype, device=attn_weights.device)
    attn_weights = torch.where(causal_mask, attn_weights.to(attn_weights.dtype), mask_value)
    if attention_mask is not None:
        attn_weights = attn_weights + attention_mask
    attn_weights = F.softmax(attn_weights, dim=-1)
    attn_weights = attn_weights.type(value.dtype)
    attn_weights = module.attn_dropout(attn_weights)
    attn_output = torch.matmul(attn_weights, value)
    attn_output = attn_output.transpose(1, 2)
    return attn_output, attn_weights


class GPT2Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        P = c["n_positions"]
        self.register_buffer("bias", torch.tril(torch.ones((P, P), dtype=torch.bool)).view(1, 1, P, P),
                             persistent=False)
        self.embed_dim = c["n_embd"]
        self.num_heads = c["n_head"]
        self.head_dim = self.embed_dim // self.num_heads
        self.split_size = self.embed_dim
        self.c_attn = Conv1D(3 * self.embed_dim, self.embed_dim)
        self.c_proj = Conv1D(self.embed_dim, self.embed_dim)
        self.attn_dropout = nn.Dropout(c["attn_pdrop"])
        self.resid_dropout = nn.Dropout(c["resid_pdrop"])

    def forward(self, hidden_states, attention_mask=None):
        query_states, key_states, value_states = self.c_attn(hidden_states).split(self.split_size, dim=2)
        shape_q = (*query_states.shape[:-1], -1, self.head_dim)
        shape_kv = (*key_states.shape[:-1], -1, self.head_dim)
        query_states = query_states.view(shape_q).transpose(1, 2)
        key_states = key_states.view(shape_kv).transpose(1, 2)
        value_states = value_states.view(shape_kv).transpose(1, 2)
        attn_output, attn_weights = gpt2_eager_attention_forward(
            self, query_states, key_states, value_states, attention_mask)
        attn_output = attn_output.reshape(*attn_output.shape[:-2], -1).contiguous()
        attn_output = self.c_proj(attn_output)
        attn_output = self.resid_dropout(attn_output)
        return attn_output, attn_weights


class GPT2MLP(nn.Module):
    def __init__(self, intermediate_size, c):
        super().__init__()
        self.c_fc = Conv1D(intermediate_size, c["n_embd"])
        self.c_proj = Conv1D(c["n_embd"], intermediate_size)
        self.act = NewGELUActivation()
        self.dropout = nn.Dropout(c["resid_pdrop"])

    def forward(self, hidden_states):
        hidden_states = self.c_fc(hidden_states)
        hidden_states = self.act(hidden_states)
        hidden_states = self.c_proj(hidden_states)
        hidden_states = self.dropout(hidden_states)
        return hidden_states


class GPT2Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        E = c["n_embd"]
        self.ln_1 = nn.LayerNorm(E, eps=c["layer_norm_epsilon"])
        self.attn = GPT2Attention(c)
        self.ln_2 = nn.LayerNorm(E, eps=c["layer_norm_epsilon"])
        self.mlp = GPT2MLP(c.get("n_inner") or 4 * E, c)

    def forward(self, hidden_states):
        residual = hidden_states
        hidden_states = self.ln_1(hidden_states)
        attn_output, _ = self.attn(hidden_states)
        hidden_states = attn_output + residual
        residual = hidden_states
        hidden_states = self.ln_2(hidden_states)
        feed_forward_hidden_states = self.mlp(hidden_states)
        hidden_states = residual + feed_forward_hidden_states
        return (hidden_states,)


class GPT2Model(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.wte = nn.Embedding(c["vocab_size"], c["n_embd"])
        self.wpe = nn.Embedding(c["n_positions"], c["n_embd"])
        self.drop = nn.Dropout(c["embd_pdrop"])
        self.h = nn.ModuleList([GPT2Block(c) for _ in range(c["n_layer"])])
        self.ln_f = nn.LayerNorm(c["n_embd"], eps=c["layer_norm_epsilon"])

    def forward(self, input_ids):
        input_shape = input_ids.size()
        input_ids = input_ids.view(-1, input_shape[-1])
        device = input_ids.device
        position_ids = torch.arange(0, input_shape[-1], dtype=torch.long, device=device)
        position_ids = position_ids.unsqueeze(0)
        inputs_embeds = self.wte(input_ids)
        position_embeds = self.wpe(position_ids)
        hidden_states = inputs_embeds + position_embeds.to(inputs_embeds.device)
        hidden_states = self.drop(hidden_states)
        output_shape = (-1,) + tuple(input_shape[1:]) + (hidden_states.size(-1),)
        for block in self.h:
            outputs = block(hidden_states)
            hidden_states = outputs[0]
        hidden_states = self.ln_f(hidden_states)
        hidden_states = hidden_states.view(output_shape)
        return (hidden_states,)


class GPT2LMHeadModel(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.transformer = GPT2Model(c)
        self.lm_head = nn.Linear(c["n_embd"], c["vocab_size"], bias=False)
        self.lm_head.weight = self.transformer.wte.weight   # tie_word_embeddings (default True)

    def forward(self, input_ids, labels):
        transformer_outputs = self.transformer(input_ids)
        hidden_states = transformer_outputs[0]
        lm_logits = self.lm_head(hidden_states)
        loss = for_causal_lm_loss(lm_logits, labels, self.c["vocab_size"])
        return loss


# --------------------------------------------------------------------------
# Cases

def build(c):
    if c["model_type"] == "gpt2":
        return GPT2LMHeadModel(c)
    return DecoderForCausalLM(decoder_spec(c))


def long_config(c):
    """The _long variant of a tiny config: vocab 32 and room for 256 positions (run at 256
    tokens), so that the attention scores ([2, 4, 256, 256]), not the logits, make the peaks:
    the forward's inside the last layer, the backward's in a SoftmaxBackward0."""
    c = dict(c, vocab_size=32)
    c["n_positions" if c["model_type"] == "gpt2" else "max_position_embeddings"] = 256
    return c


def hf_host_rule(raw, ops, phase):
    """Host tensors of these models: the 0-dim Gemma 2 normalizer (torch.tensor without a
    device, made under a record_function "host_tensor"), and that record_function's own
    handle tensors (a 4-byte aten::zeros before it, a 288-byte aten::empty inside it)."""
    if "host_tensor" in ops:
        return "host_tensor"
    if ops == ["aten::zeros", "aten::empty"] and raw == 4:
        return "profiler"
    return None


def _inputs(c, seq):
    x = torch.randint(0, c["vocab_size"], (BATCH, seq))
    return x, x.clone()


# variant -> (config transform, sequence length)
VARIANTS = {"tiny": (lambda c: c, SEQ), "long": (long_config, 256)}


def hf_models():
    """torchref.py's MODELS entries: hf_<family>_tiny and hf_<family>_long."""
    out = {}
    for var, (cfg_of, seq) in VARIANTS.items():
        for fam in CONFIGS:
            c = cfg_of(CONFIGS[fam])
            out["hf_%s_%s" % (fam, var)] = dict(
                build=(lambda c=c: build(c)),
                inputs=(lambda c=c, seq=seq: _inputs(c, seq)),
                opt=lambda p: torch.optim.AdamW(p, lr=1e-3, foreach=True),
                lm=True,
                host_rule=hf_host_rule,
                config=c,
                desc=("transformers' %s causal LM (bench/torchref/hf_families.py, written from the "
                      "modeling code), config as recorded in the JSON's config field, eager attention, "
                      "training mode, fp32; input_ids = torch.randint(0, vocab, (%d, %d)), "
                      "labels = input_ids.clone(); loss = model(input_ids, labels) (ForCausalLMLoss) "
                      "in the forward phase; torch.optim.AdamW(lr=1e-3, foreach=True)") % (fam, BATCH, seq),
            )
    return out


# ---- Mixture-of-Experts families ----

# Hugging Face decoder families (transformers 4.5x's modeling code, written
# from it in plain PyTorch) with the
# Mixture-of-Experts blocks of mixtral, qwen2_moe and qwen3_moe. Eager
# attention (1.13 has no F.scaled_dot_product_attention). The causal mask
# is made as memsh's models/decoder.star makes it (arange, le, expand, then
# eager_mask's where(mask, 0, min)): transformers' sdpa_mask builds it with
# vmap, which 1.13 lacks; the result is the same [B, 1, T, T] float tensor.
# The router's choice is forced to memsh's routing plan
# (nn.functional.route_topk): topk runs, then its indices are overwritten
# through .data (no allocation, no version bump; TopkBackward0 keeps them).

HF_MIN_F32 = torch.finfo(torch.float32).min


# The norms, the rotary embedding, rotate_half and repeat_kv are the dense
# families' (LlamaRMSNorm, RotaryEmbedding above): transformers shares them.


class HFAttention(nn.Module):
    """LlamaAttention with eager_attention_forward (GQA, Qwen2's q/k/v bias, Qwen3's q/k norms)."""

    def __init__(self, c):
        super().__init__()
        h, nh, nkv, hd = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
        self.head_dim, self.n_rep, self.scaling = hd, nh // nkv, hd ** -0.5
        self.q_proj = nn.Linear(h, nh * hd, bias=c["qkv_bias"])
        self.k_proj = nn.Linear(h, nkv * hd, bias=c["qkv_bias"])
        self.v_proj = nn.Linear(h, nkv * hd, bias=c["qkv_bias"])
        self.o_proj = nn.Linear(nh * hd, h, bias=False)
        self.qk_norm = c["qk_norm"]
        if self.qk_norm:
            self.q_norm = LlamaRMSNorm(hd, c["rms_norm_eps"])
            self.k_norm = LlamaRMSNorm(hd, c["rms_norm_eps"])

    def forward(self, hidden_states, position_embeddings, attention_mask):
        input_shape = hidden_states.shape[:-1]
        hidden_shape = (*input_shape, -1, self.head_dim)
        q = self.q_proj(hidden_states).view(hidden_shape)
        if self.qk_norm:
            q = self.q_norm(q)
        k = self.k_proj(hidden_states).view(hidden_shape)
        if self.qk_norm:
            k = self.k_norm(k)
        v = self.v_proj(hidden_states).view(hidden_shape)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        cos, sin = position_embeddings
        cos = cos.unsqueeze(1)
        sin = sin.unsqueeze(1)
        q_embed = (q * cos) + (rotate_half(q) * sin)
        k_embed = (k * cos) + (rotate_half(k) * sin)
        q, k = q_embed, k_embed
        del q_embed, k_embed
        # eager_attention_forward
        key_states = repeat_kv(k, self.n_rep)
        value_states = repeat_kv(v, self.n_rep)
        attn_weights = torch.matmul(q, key_states.transpose(2, 3)) * self.scaling
        attn_weights = attn_weights + attention_mask
        attn_weights = F.softmax(attn_weights, dim=-1, dtype=torch.float32).to(q.dtype)
        attn_weights = F.dropout(attn_weights, p=0.0, training=self.training)
        attn_output = torch.matmul(attn_weights, value_states)
        attn_output = attn_output.transpose(1, 2).contiguous()
        attn_output = attn_output.reshape(*input_shape, -1).contiguous()
        attn_output = self.o_proj(attn_output)
        return attn_output, attn_weights


class HFMLP(nn.Module):
    """LlamaMLP / Qwen2MoeMLP: down(silu(gate(x)) * up(x))."""

    def __init__(self, h, i):
        super().__init__()
        self.gate_proj = nn.Linear(h, i, bias=False)
        self.up_proj = nn.Linear(h, i, bias=False)
        self.down_proj = nn.Linear(i, h, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class MixtralExpert(nn.Module):
    """MixtralBlockSparseTop2MLP: w2(silu(w1(x)) * w3(x))."""

    def __init__(self, h, i):
        super().__init__()
        self.w1 = nn.Linear(h, i, bias=False)
        self.w2 = nn.Linear(i, h, bias=False)
        self.w3 = nn.Linear(h, i, bias=False)

    def forward(self, hidden_states):
        current_hidden_states = F.silu(self.w1(hidden_states)) * self.w3(hidden_states)
        current_hidden_states = self.w2(current_hidden_states)
        return current_hidden_states


def routing_plan(tokens, k, experts, routing):
    """memsh's routing plan (tensor.RoutePlan): token t's j-th expert."""
    if routing == "worst":
        return torch.tensor([[j for j in range(k)] for _ in range(tokens)], dtype=torch.int64)
    return torch.tensor([[(t * k + j) % experts for j in range(k)] for t in range(tokens)], dtype=torch.int64)


class SparseMoe(nn.Module):
    """MixtralSparseMoeBlock / Qwen2MoeSparseMoeBlock / Qwen3MoeSparseMoeBlock (4.5x)."""

    def __init__(self, c, tokens):
        super().__init__()
        h, m = c["hidden_size"], c["moe"]
        self.num_experts, self.top_k, self.norm_topk_prob = m["experts"], m["top_k"], m["norm_topk_prob"]
        self.gate = nn.Linear(h, self.num_experts, bias=False)
        make = (lambda: MixtralExpert(h, m["intermediate"])) if m["names"] == "mixtral" else (lambda: HFMLP(h, m["intermediate"]))
        self.experts = nn.ModuleList([make() for _ in range(self.num_experts)])
        self.has_shared = m.get("shared_intermediate", 0) > 0
        if self.has_shared:
            self.shared_expert = HFMLP(h, m["shared_intermediate"])
            self.shared_expert_gate = nn.Linear(h, 1, bias=False)
        self.plan = routing_plan(tokens, self.top_k, self.num_experts, c["routing"])  # made with the model

    def forward(self, hidden_states):
        batch_size, sequence_length, hidden_dim = hidden_states.shape
        hidden_states = hidden_states.view(-1, hidden_dim)
        router_logits = self.gate(hidden_states)
        routing_weights = F.softmax(router_logits, dim=1, dtype=torch.float)
        routing_weights, selected_experts = torch.topk(routing_weights, self.top_k, dim=-1)
        selected_experts.data.copy_(self.plan)  # memsh's routing plan
        if self.norm_topk_prob:
            routing_weights /= routing_weights.sum(dim=-1, keepdim=True)
        routing_weights = routing_weights.to(hidden_states.dtype)
        final_hidden_states = torch.zeros(
            (batch_size * sequence_length, hidden_dim), dtype=hidden_states.dtype, device=hidden_states.device)
        expert_mask = F.one_hot(selected_experts, num_classes=self.num_experts).permute(2, 1, 0)
        expert_hit = torch.greater(expert_mask.sum(dim=(-1, -2)), 0).nonzero()
        for expert_idx in expert_hit:
            expert_layer = self.experts[expert_idx]
            idx, top_x = torch.where(expert_mask[expert_idx].squeeze(0))
            current_state = hidden_states[None, top_x].reshape(-1, hidden_dim)
            current_hidden_states = expert_layer(current_state) * routing_weights[top_x, idx, None]
            final_hidden_states.index_add_(0, top_x, current_hidden_states.to(hidden_states.dtype))
        if self.has_shared:
            shared_expert_output = self.shared_expert(hidden_states)
            shared_expert_output = F.sigmoid(self.shared_expert_gate(hidden_states)) * shared_expert_output
            final_hidden_states = final_hidden_states + shared_expert_output
        final_hidden_states = final_hidden_states.reshape(batch_size, sequence_length, hidden_dim)
        return final_hidden_states, router_logits


class HFDecoderLayer(nn.Module):
    def __init__(self, c, i, tokens):
        super().__init__()
        h = c["hidden_size"]
        self.self_attn = HFAttention(c)
        m = c.get("moe")
        dense = m is None or i in m.get("mlp_only_layers", []) or (i + 1) % m.get("sparse_step", 1) != 0
        mlp = HFMLP(h, c["intermediate_size"]) if dense else SparseMoe(c, tokens)
        self.mlp_name = c.get("mlp_name", "mlp")
        setattr(self, self.mlp_name, mlp)
        self.input_layernorm = LlamaRMSNorm(h, c["rms_norm_eps"])
        self.post_attention_layernorm = LlamaRMSNorm(h, c["rms_norm_eps"])

    def forward(self, hidden_states, attention_mask, position_embeddings):
        residual = hidden_states
        hidden_states = self.input_layernorm(hidden_states)
        hidden_states, _ = self.self_attn(hidden_states, position_embeddings, attention_mask)
        hidden_states = residual + hidden_states
        residual = hidden_states
        hidden_states = self.post_attention_layernorm(hidden_states)
        hidden_states = getattr(self, self.mlp_name)(hidden_states)
        if isinstance(hidden_states, tuple):
            hidden_states, router_logits = hidden_states
        hidden_states = residual + hidden_states
        return hidden_states


class HFCausalLM(nn.Module):
    """LlamaForCausalLM's shape of model (model.embed_tokens, model.layers, model.norm, lm_head) with ForCausalLMLoss.

    checkpoint: a function checkpoint(fn, *args) each decoder layer runs under
    (peft_ref.checkpoint_early_stop: PyTorch 2.x's non-reentrant checkpoint,
    gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})),
    or None."""

    def __init__(self, c, batch, seq, checkpoint=None):
        super().__init__()
        self.c = c
        self.checkpoint = checkpoint
        self.model = nn.Module()
        self.model.embed_tokens = nn.Embedding(c["vocab_size"], c["hidden_size"])
        self.model.layers = nn.ModuleList([HFDecoderLayer(c, i, batch * seq) for i in range(c["num_hidden_layers"])])
        self.model.norm = LlamaRMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.model.rotary_emb = RotaryEmbedding(c["head_dim"], c["rope_theta"])
        self.lm_head = nn.Linear(c["hidden_size"], c["vocab_size"], bias=False)

    def forward(self, input_ids, labels):
        hidden_states = self.decoder(input_ids)  # the model's locals (mask, positions) are gone here
        logits = self.lm_head(hidden_states)
        return hf_causal_lm_loss(logits, labels, self.c["vocab_size"])

    def decoder(self, input_ids):
        """LlamaModel.forward (MixtralModel, Qwen2MoeModel, Qwen3MoeModel): the last hidden states."""
        B, T = input_ids.shape
        inputs_embeds = self.model.embed_tokens(input_ids)
        cache_position = torch.arange(0, T)
        position_ids = cache_position.unsqueeze(0)
        # the eager causal mask (see above)
        q_idx = torch.arange(0, T).view(1, 1, T, 1)
        kv_idx = torch.arange(T).view(1, 1, 1, T)
        m = kv_idx.le(q_idx).expand(B, 1, T, T)
        causal_mask = torch.where(m, torch.zeros([], dtype=inputs_embeds.dtype), HF_MIN_F32)
        del q_idx, kv_idx, m
        hidden_states = inputs_embeds
        position_embeddings = self.model.rotary_emb(hidden_states, position_ids)
        for layer in self.model.layers:
            if self.checkpoint:
                hidden_states = self.checkpoint(layer, hidden_states, causal_mask, position_embeddings)
            else:
                hidden_states = layer(hidden_states, causal_mask, position_embeddings)
        return self.model.norm(hidden_states)


def hf_causal_lm_loss(logits, labels, vocab_size, ignore_index=-100):
    """ForCausalLMLoss (no num_items_in_batch: the mean)."""
    logits = logits.float()
    labels = F.pad(labels, (0, 1), value=ignore_index)
    shift_labels = labels[..., 1:].contiguous()
    logits = logits.view(-1, vocab_size)
    shift_labels = shift_labels.view(-1)
    return F.cross_entropy(logits, shift_labels, ignore_index=ignore_index, reduction="mean")


def hf_tiny(c):
    """A tiny config's normalised form (hf.star's spec keys the reference reads)."""
    c = dict(c)
    c.setdefault("head_dim", c["hidden_size"] // c["num_attention_heads"])
    c.setdefault("num_key_value_heads", c["num_attention_heads"])
    c.setdefault("rms_norm_eps", 1e-6)
    c.setdefault("rope_theta", 10000.0)
    c.setdefault("routing", "balanced")
    mt = c["model_type"]
    c["qkv_bias"] = mt == "qwen2_moe"
    c["qk_norm"] = mt == "qwen3_moe"
    if mt == "llama":
        c["moe"] = None
    elif mt == "mixtral":
        c["mlp_name"] = "block_sparse_moe"
        c["moe"] = dict(experts=c["num_local_experts"], top_k=c["num_experts_per_tok"],
                        intermediate=c["intermediate_size"], norm_topk_prob=True, names="mixtral")
    else:
        c["moe"] = dict(experts=c["num_experts"], top_k=c["num_experts_per_tok"],
                        intermediate=c["moe_intermediate_size"], norm_topk_prob=c.get("norm_topk_prob", False),
                        names="qwen", shared_intermediate=c.get("shared_expert_intermediate_size", 0),
                        sparse_step=c.get("decoder_sparse_step", 1), mlp_only_layers=c.get("mlp_only_layers", []))
    return c


# The tiny configs of the MoE golden cases (config.json keys; memsh builds
# them with models/hf.star's from_config, attention "eager"). B=2, T=32.
MOE_TINY = {
    "mixtral_tiny": {
        "model_type": "mixtral", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "num_local_experts": 4, "num_experts_per_tok": 2,
        "vocab_size": 256, "max_position_embeddings": 128, "rope_theta": 1000000.0, "rms_norm_eps": 1e-5,
        "tie_word_embeddings": False},
    "qwen2_moe_tiny": {
        "model_type": "qwen2_moe", "hidden_size": 64, "intermediate_size": 96, "moe_intermediate_size": 32,
        "shared_expert_intermediate_size": 96, "num_experts": 6, "num_experts_per_tok": 2, "num_hidden_layers": 3,
        "mlp_only_layers": [1], "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 256,
        "max_position_embeddings": 128, "rope_theta": 1000000.0, "norm_topk_prob": False,
        "tie_word_embeddings": False},
    "qwen3_moe_tiny": {
        "model_type": "qwen3_moe", "hidden_size": 64, "head_dim": 16, "intermediate_size": 96,
        "moe_intermediate_size": 32, "num_experts": 8, "num_experts_per_tok": 3, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256, "max_position_embeddings": 128,
        "rope_theta": 1000000.0, "norm_topk_prob": True, "tie_word_embeddings": False, "routing": "worst"},
}
MOE_BATCH, MOE_SEQ = 2, 32


def moe_desc(name):
    c = MOE_TINY[name]
    return ("transformers 4.5x's %s family in plain PyTorch (bench/torchref/torchref.py HFCausalLM, SparseMoe), "
            "config %s; routing plan %s forced on topk's indices; eager attention; B=%d T=%d, "
            "labels = input_ids (torch.randint(0, vocab, (B, T))); loss = model(input_ids, labels) "
            "(ForCausalLMLoss); torch.optim.AdamW(lr=1e-3, weight_decay=0.1, foreach=True)" % (
                c["model_type"], json.dumps({k: v for k, v in c.items() if k != "routing"}, sort_keys=True),
                c.get("routing", "balanced"), MOE_BATCH, MOE_SEQ))


def moe_inputs(name):
    x = torch.randint(0, MOE_TINY[name]["vocab_size"], (MOE_BATCH, MOE_SEQ))
    return x, x.clone()


# The dense Llama of the LoRA and QLoRA golden cases (bench/torchref/peft_ref.py).
LLAMA_TINY = {
    "model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256, "max_position_embeddings": 128,
    "rope_theta": 10000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": False}

# The QLoRA cases' Llama: a wide MLP, so that the peaks fall where a 4-bit
# layer's dequantized weight is alive.
LLAMA_QTINY = dict(LLAMA_TINY, hidden_size=128, intermediate_size=1024)
