"""bench/torchref/generate_ref.py: reference figures of greedy generation with
a KV cache, for memsh's scripts/models/generate.star golden cases
(hf_llama_generate_dynamic, hf_llama_generate_static, hf_qwen3_generate_dynamic).

The model is hf_families.py's Llama or Qwen3 (DecoderForCausalLM, eager
attention, fp32, the tiny config) with the cache threaded through its attention as
transformers 4.56's LlamaAttention does (past_key_values.update(k, v,
layer_idx) after the rotary embedding, attention over what it returns).
The caches are written from transformers' cache_utils (4.56):

* DynamicCache: a layer's keys and values start as torch.tensor([]) at its
  first update and become torch.cat([keys, new], dim=-2) at every update;
  the old tensors are freed when the new ones replace them.
* StaticCache: a layer's keys and values are torch.zeros([B, kv_heads,
  max_cache_len, head_dim]) made at its first update and written in place
  by index_copy_(2, cache_position, new); attention runs over the whole
  length, the unfilled keys masked out.

The loop is transformers' GenerationMixin._sample for greedy search with no
logits processors, as generate.star runs it (one phase per new token:
"prefill" for the first, "decode" for the others): the forward of the new
input ids over the cache with logits_to_keep=1, the last logits as a
float32 copy (logits[:, -1, :].to(copy=True, dtype=float32)), the model's
output released, argmax, torch.cat of the ids and of the attention mask,
the next input ids as a [B, 1] copy (input_ids[:, cache_position]).

Left out here as in memsh (generate.star's header names them): the
position ids transformers derives from the attention mask's cumsum (a few
[B, T] int64 temporaries; here, as in memsh, from the cache position), the
stopping criteria's [B] bool tensors and the cache_position tensor kept
between steps; the masks are built as models/decoder.star builds them (the
training references' convention, hf_families.causal_masks).
"""
import gc

import torch

from hf_families import CONFIGS, build, hf_host_rule

BATCH, PROMPT, NEW = 3, 24, 4


class DynamicCache:
    def __init__(self):
        self.keys, self.values = {}, {}
        self.seen = 0

    def get_seq_length(self):
        return self.seen

    def mask_sizes(self, past, T):
        return past + T, None

    def update(self, k, v, layer):
        if layer not in self.keys:
            self.keys[layer] = torch.tensor([], dtype=k.dtype, device=k.device)
            self.values[layer] = torch.tensor([], dtype=v.dtype, device=v.device)
        self.keys[layer] = torch.cat([self.keys[layer], k], dim=-2)
        self.values[layer] = torch.cat([self.values[layer], v], dim=-2)
        return self.keys[layer], self.values[layer]

    def nbytes(self):
        return sum(t.numel() * t.element_size() for d in (self.keys, self.values) for t in d.values())


class StaticCache(DynamicCache):
    def __init__(self, max_len):
        super().__init__()
        self.max = max_len

    def mask_sizes(self, past, T):
        return self.max, past + T

    def update(self, k, v, layer):
        if layer not in self.keys:
            B, H, _, D = k.shape
            self.keys[layer] = torch.zeros([B, H, self.max, D], dtype=k.dtype, device=k.device)
            self.values[layer] = torch.zeros([B, v.shape[1], self.max, v.shape[3]], dtype=v.dtype, device=v.device)
        self.keys[layer].index_copy_(2, self.cache_position, k)
        self.values[layer].index_copy_(2, self.cache_position, v)
        return self.keys[layer], self.values[layer]


def gen_host_rule(raw, ops, phase):
    """hf_host_rule, and the decode steps' one-element int64 aranges (the
    position ids and the mask's query index at the new token: 8 bytes, which
    torchref's default rule would take for wrapped Python scalars) stay
    device tensors."""
    if raw == 8 and ops and ops[0] == "aten::arange":
        return ""
    return hf_host_rule(raw, ops, phase)


CASES = {
    "hf_%s_generate_%s" % (fam, kind): dict(kind=kind, config=CONFIGS[fam], family=fam)
    for fam, kind in (("llama", "dynamic"), ("llama", "static"), ("qwen3", "dynamic"))
}


def _desc(fam, kind):
    return ("greedy generation (bench/torchref/generate_ref.py, transformers' GenerationMixin._sample "
            "as scripts/models/generate.star runs it) of %d new tokens after a prompt "
            "torch.randint(0, vocab, (%d, %d)) under torch.no_grad(), with a %s; the %s causal LM "
            "of bench/torchref/hf_families.py, config as recorded in the JSON's config field, eager "
            "attention, fp32, eval mode; one phase per new token (prefill, then decode)"
            % (NEW, BATCH, PROMPT, {"dynamic": "DynamicCache", "static": "StaticCache of prompt + new tokens"}[kind], fam))


def run_case(g, case, device):
    spec = CASES[case]
    torch.manual_seed(0)
    model = build(spec["config"]).to(device)
    model.eval()
    x = torch.randint(0, spec["config"]["vocab_size"], (BATCH, PROMPT)).to(device)
    rec = g["Recorder"](device)
    st = dict(ids=x, cur=x, mask=torch.ones(BATCH, PROMPT, dtype=torch.int64, device=device),
              cache=DynamicCache() if spec["kind"] == "dynamic" else StaticCache(PROMPT + NEW))
    # the first attention mask stays bound past its replacement in the prefill:
    # the profiler cannot see the free of a block allocated before it started
    # (the Go side keeps it too)
    mask0 = st["mask"]
    gc.collect()
    gc.disable()
    if device == "cuda":
        rec.cuda_baseline()

    def one_token():
        with torch.no_grad():
            out = model(st["cur"], cache=st["cache"], logits_to_keep=1)
            logits = out[:, -1, :].to(copy=True, dtype=torch.float32)
            del out
            nxt = torch.argmax(logits, dim=-1)
            del logits
            st["ids"] = torch.cat([st["ids"], nxt[:, None]], dim=-1)
            del nxt
            st["mask"] = torch.cat([st["mask"], st["mask"].new_ones((BATCH, 1))], dim=-1)
            pos = st["ids"].shape[1] - 1
            st["cur"] = st["ids"][:, pos:pos + 1].contiguous()

    kv_bytes = []
    for s in range(1, NEW + 1):
        rec.phase("prefill" if s == 1 else "decode", one_token, step=s, host_rule=gen_host_rule)
        kv_bytes.append(st["cache"].nbytes())
    gc.enable()
    del mask0
    res = {
        "case": case,
        "kind": "generate",
        "torch_version": torch.__version__,
        "device": device,
        "description": _desc(spec["family"], spec["kind"]),
        "cublas_workspaces": getattr(rec, "cublas_workspaces", 0),
        "config": spec["config"],
        "cache": spec["kind"],
        "batch": BATCH, "prompt": PROMPT, "max_new_tokens": NEW,
        "kv_cache_bytes": kv_bytes,
        "inputs": [g["tensor_info"]("x", x)],
        "phases": rec.phases,
    }
    return res, rec


def check_case(g, res):
    """The cache's bytes after each token: the closed form
    2 × layers × kv_heads × head_dim × tokens × batch × 4 (float32), tokens
    the prompt and the new ones so far (a static cache: all of them)."""
    c = res["config"]
    hd = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    for i, got in enumerate(res["kv_cache_bytes"]):
        tokens = PROMPT + NEW if res["cache"] == "static" else PROMPT + i
        want = 2 * c["num_hidden_layers"] * c["num_key_value_heads"] * hd * tokens * BATCH * 4
        assert got == want, (res["case"], i, got, want)


def descs():
    """Each case's description, by name (torchref.py's register_cases)."""
    return {c: _desc(CASES[c]["family"], CASES[c]["kind"]) for c in CASES}
