"""bench/torchref/hf_families.py: Hugging Face decoder families in plain
PyTorch for torchref.py's golden cases (see README.md beside this file).

transformers is not installable here (and needs a newer PyTorch than
Debian's 1.13), so each family's forward is written from transformers
4.5x's modeling code: the tensors it makes, in its order.
"""
import json

import torch
import torch.nn as nn
import torch.nn.functional as F

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


class HFRMSNorm(nn.Module):
    """LlamaRMSNorm: weight * (x * rsqrt(mean(x^2) + eps)) in float32."""

    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.variance_epsilon = eps

    def forward(self, hidden_states):
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states.to(input_dtype)


class HFRotary(nn.Module):
    def __init__(self, dim, theta):
        super().__init__()
        inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    @torch.no_grad()
    def forward(self, x, position_ids):
        inv_freq_expanded = self.inv_freq[None, :, None].float().expand(position_ids.shape[0], -1, 1)
        position_ids_expanded = position_ids[:, None, :].float()
        freqs = (inv_freq_expanded.float() @ position_ids_expanded.float()).transpose(1, 2)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos = emb.cos() * 1.0
        sin = emb.sin() * 1.0
        return cos.to(dtype=x.dtype), sin.to(dtype=x.dtype)


def hf_rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def hf_repeat_kv(x, n_rep):
    batch, kvh, slen, hd = x.shape
    if n_rep == 1:
        return x
    x = x[:, :, None, :, :].expand(batch, kvh, n_rep, slen, hd)
    return x.reshape(batch, kvh * n_rep, slen, hd)


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
            self.q_norm = HFRMSNorm(hd, c["rms_norm_eps"])
            self.k_norm = HFRMSNorm(hd, c["rms_norm_eps"])

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
        q_embed = (q * cos) + (hf_rotate_half(q) * sin)
        k_embed = (k * cos) + (hf_rotate_half(k) * sin)
        q, k = q_embed, k_embed
        del q_embed, k_embed
        # eager_attention_forward
        key_states = hf_repeat_kv(k, self.n_rep)
        value_states = hf_repeat_kv(v, self.n_rep)
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
        self.input_layernorm = HFRMSNorm(h, c["rms_norm_eps"])
        self.post_attention_layernorm = HFRMSNorm(h, c["rms_norm_eps"])

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
        self.model.norm = HFRMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.model.rotary_emb = HFRotary(c["head_dim"], c["rope_theta"])
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
