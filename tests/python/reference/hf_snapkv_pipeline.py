"""SnapKV end to end in Python: transformers' float32 model + the SnapKV reference.

This is the oracle the server's SnapKV path is compared with
(docs/testing-and-measuring.md, "Oracles, not self-agreement"). It shares no
code with the C++ engine:

1. prefill: the prompt (n tokens) runs once through transformers' own forward
   (full attention, sdpa). A registered attention function records, for every
   layer, the post-RoPE queries of the last `max_window` positions and the
   post-RoPE keys/values of all n positions (exactly what the model attends
   with), then delegates to transformers' sdpa attention. The last position's
   logits give the first generated token (docs/snapkv.md, step 8: the prompt
   itself used the full K/V).
2. compress: each layer's K/V goes through tests/python/reference/snapkv.py
   (per KV head, mean over the GQA group, pooling, top C-w + window, kept in
   increasing position order).
3. decode: a DynamicCache holding only the kept entries continues at the TRUE
   positions n, n+1, ... (position_ids drive RoPE) while the attention mask
   covers the C+t cached entries.

    pipe = SnapKVPipeline.load(model_path)
    pre = pipe.prefill(ids)
    tokens = pipe.greedy(pre, pipe.compress(pre, window=32, capacity=512,
                                            kernel_size=7, pooling="max"), 24)
"""
import os
import pathlib
from dataclasses import dataclass, field

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing may be downloaded

import torch

from . import snapkv as ref

ATTN_NAME = "snapkv_capture_sdpa"


def _capture_attention(module, query, key, value, attention_mask, **kwargs):
    """sdpa attention that records q/k/v of a prefill when a recorder is armed,
    and hides padding entries of a ragged cache (Pipeline.keep_ragged).

    query [1, H, q_len, D] and key/value [1, Hkv, kv_len, D] arrive post-RoPE,
    after the cache update (so during a prefill they hold the whole prompt)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    rec = getattr(module, "_snapkv_recorder", None)
    if rec is not None:
        rec.record(module.layer_idx, query, key, value)
    valid = getattr(module, "_head_valid", None)  # [Hkv, M] bool: the cached prompt entries
    if valid is not None:
        heads, kv_len = query.shape[1], key.shape[2]
        new = torch.ones(valid.shape[0], kv_len - valid.shape[1], dtype=torch.bool)
        per_head = torch.cat([valid, new], 1).repeat_interleave(heads // valid.shape[0], 0)
        mask = per_head[None, :, None, :]  # [1, H, 1, kv_len]
        if attention_mask is not None:
            mask = mask & attention_mask.bool()
        attention_mask = mask
    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


class _Recorder:
    def __init__(self, num_layers, max_window):
        self.max_window = max_window
        self.q = [None] * num_layers
        self.k = [None] * num_layers
        self.v = [None] * num_layers

    def record(self, layer, query, key, value):
        w = min(self.max_window, query.shape[2])
        self.q[layer] = query[0, :, -w:, :].detach().clone()  # [H, w, D]
        self.k[layer] = key[0].detach().clone()                # [Hkv, n, D]
        self.v[layer] = value[0].detach().clone()


@dataclass
class Prefill:
    ids: list
    logits: torch.Tensor          # [vocab] float32, logits after the last prompt token
    q_window: list                # per layer [H, max_window, D] post-RoPE queries
    keys: list                    # per layer [Hkv, n, D] post-RoPE keys
    values: list                  # per layer [Hkv, n, D]

    @property
    def n(self):
        return len(self.ids)


@dataclass
class Compressed:
    keys: list                    # per layer [Hkv, m, D]
    values: list
    positions: list = field(default_factory=list)  # per layer [Hkv, m] int64 (numpy)
    # Ragged caches (keep_ragged) only: per layer [Hkv, m] bool, False on padding.
    valid: list = None

    @property
    def entries(self):
        return self.keys[0].shape[1]


class SnapKVPipeline:
    def __init__(self, model, tokenizer=None):
        self.model = model.eval()
        self.tokenizer = tokenizer
        cfg = model.config
        self.num_layers = cfg.num_hidden_layers
        self.num_heads = cfg.num_attention_heads
        self.num_kv_heads = cfg.num_key_value_heads

    @classmethod
    def load(cls, model_path, dtype=torch.float32, with_tokenizer=True):
        from transformers import AttentionInterface, AutoModelForCausalLM, AutoTokenizer
        from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
        AttentionInterface.register(ATTN_NAME, _capture_attention)
        # The mask must be built as for sdpa: without this, transformers builds
        # none and sdpa's top-left is_causal would misalign a multi-token chunk
        # that follows cached entries.
        AttentionMaskInterface.register(ATTN_NAME, sdpa_mask)
        model_path = pathlib.Path(model_path)
        model = AutoModelForCausalLM.from_pretrained(
            model_path.parent, gguf_file=model_path.name, dtype=dtype,
            attn_implementation=ATTN_NAME)
        tok = (AutoTokenizer.from_pretrained(model_path.parent, gguf_file=model_path.name)
               if with_tokenizer else None)
        return cls(model, tok)

    def _attn_modules(self):
        return [layer.self_attn for layer in self.model.model.layers]

    # --- 1. prefill -------------------------------------------------------

    @torch.no_grad()
    def prefill(self, ids, max_window=64):
        """Runs the prompt once with full attention and records, per layer, the
        queries of the last `max_window` positions and all keys/values."""
        ids = list(ids)
        rec = _Recorder(self.num_layers, max_window)
        mods = self._attn_modules()
        for m in mods:
            m._snapkv_recorder = rec
        try:
            out = self.model(torch.tensor([ids]), use_cache=False)
        finally:
            for m in mods:
                m._snapkv_recorder = None
        logits = out.logits[0, -1].float().clone()
        return Prefill(ids, logits, rec.q, rec.k, rec.v)

    # --- 2. compress ------------------------------------------------------

    def compress(self, pre, window, capacity, kernel_size=7, pooling="max",
                 group_reduce="mean"):
        """docs/snapkv.md per layer through the reference; everything when n <= capacity."""
        n = pre.n
        keys, values, positions = [], [], []
        for layer in range(self.num_layers):
            k, v = pre.keys[layer], pre.values[layer]
            if n <= capacity:
                keys.append(k)
                values.append(v)
                positions.append(None)
                continue
            q_window = pre.q_window[layer][:, -window:, :]
            assert q_window.shape[1] == window, "prefill recorded fewer queries than the window"
            pos = ref.select_positions(q_window, k, window, capacity, kernel_size, pooling,
                                       group_reduce)
            idx = torch.from_numpy(pos)
            heads = torch.arange(k.shape[0])[:, None]
            keys.append(k[heads, idx].contiguous())
            values.append(v[heads, idx].contiguous())
            positions.append(pos)
        return Compressed(keys, values, positions)

    def keep(self, pre, positions):
        """Any policy's selection: per layer, the positions [Hkv, m] (numpy
        int64, increasing) each KV head keeps of the prompt cache."""
        keys, values = [], []
        heads = torch.arange(self.num_kv_heads)[:, None]
        for layer in range(self.num_layers):
            idx = torch.from_numpy(positions[layer])
            keys.append(pre.keys[layer][heads, idx].contiguous())
            values.append(pre.values[layer][heads, idx].contiguous())
        return Compressed(keys, values, list(positions))

    def keep_ragged(self, pre, positions):
        """A selection whose layers and KV heads keep different counts
        (PyramidKV, AdaKV): per layer, a list of per-head increasing position
        arrays. Every layer and head is padded to the longest with copies of
        position 0, and the attention hides the padding, so the cache stays a
        rectangle that transformers can hold."""
        longest = max(len(h) for layer in positions for h in layer)
        keys, values, valid = [], [], []
        for layer in range(self.num_layers):
            idx = torch.zeros(self.num_kv_heads, longest, dtype=torch.long)
            ok = torch.zeros(self.num_kv_heads, longest, dtype=torch.bool)
            for g, head in enumerate(positions[layer]):
                idx[g, :len(head)] = torch.as_tensor(head, dtype=torch.long)
                ok[g, :len(head)] = True
            heads = torch.arange(self.num_kv_heads)[:, None]
            keys.append(pre.keys[layer][heads, idx].contiguous())
            values.append(pre.values[layer][heads, idx].contiguous())
            valid.append(ok)
        return Compressed(keys, values, list(positions), valid)

    def full(self, pre):
        """The uncompressed prompt cache (baseline)."""
        return Compressed(list(pre.keys), list(pre.values), [None] * self.num_layers)

    # --- 3. decode at the true positions ------------------------------------

    def _cache(self, comp):
        from transformers import DynamicCache
        cache = DynamicCache(config=self.model.config)
        for layer in range(self.num_layers):
            cache.update(comp.keys[layer][None].clone(), comp.values[layer][None].clone(), layer)
        return cache

    @torch.no_grad()
    def forward_cached(self, cache, tokens, first_position):
        """Runs `tokens` after the cached entries; RoPE at first_position, +1, ...
        Returns logits [len(tokens), vocab] float32."""
        t = len(tokens)
        cached = cache.get_seq_length()
        pos = torch.arange(first_position, first_position + t)[None]
        mask = torch.ones(1, cached + t, dtype=torch.long)  # every cached entry, plus causal
        out = self.model(torch.tensor([list(tokens)]), position_ids=pos, attention_mask=mask,
                         past_key_values=cache, use_cache=True)
        return out.logits[0].float()

    def _set_valid(self, comp):
        for layer, m in enumerate(self._attn_modules()):
            m._head_valid = comp.valid[layer] if comp is not None and comp.valid else None

    @torch.no_grad()
    def greedy(self, pre, comp, max_new, return_logits=False):
        """Greedy tokens; the first comes from the full-prompt logits."""
        cache = self._cache(comp)
        logits = [pre.logits]
        tokens = [int(pre.logits.argmax())]
        self._set_valid(comp)
        try:
            for i in range(1, max_new):
                step = self.forward_cached(cache, [tokens[-1]], pre.n + i - 1)[-1]
                logits.append(step)
                tokens.append(int(step.argmax()))
        finally:
            self._set_valid(None)
        return (tokens, torch.stack(logits)) if return_logits else tokens

    @torch.no_grad()
    def teacher_forced(self, pre, comp, continuation):
        """Logits [len(continuation), vocab] predicted after each continuation
        token, which are fed at positions n, n+1, ... over the cached prompt."""
        self._set_valid(comp)
        try:
            return self.forward_cached(self._cache(comp), continuation, pre.n)
        finally:
            self._set_valid(None)

    def run(self, ids, max_new, window=32, capacity=1024, kernel_size=7, pooling="max"):
        pre = self.prefill(ids, max_window=max(window, 1))
        return self.greedy(pre, self.compress(pre, window, capacity, kernel_size, pooling), max_new)


def original_tokenizer(hf_tokenizer):
    """A `tokenizers.Tokenizer` with SmolLM2's original pre-tokenizer
    (digits split one by one, then byte-level), which the GGUF names
    (`tokenizer.ggml.pre = smollm`) and snapserve follows; transformers'
    GGUF conversion drops the digit rule (see test_tokenizer_parity.py)."""
    from tokenizers import Tokenizer, pre_tokenizers
    tok = Tokenizer.from_str(hf_tokenizer.backend_tokenizer.to_str())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    return tok
