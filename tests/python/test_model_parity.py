"""The C++ forward pass (engine/model) against transformers, the oracle.

Tiny random Llama/Mistral checkpoints written by transformers cover the config
space (GQA, tied/untied, rope scaling, sliding window, explicit head_dim,
sharded safetensors); the real SmolLM2 GGUF is checked against transformers'
own GGUF loader. The C++ side is reached through the torch ops in
tests/torch_ops/model_ops.cc.
"""
import os
import pathlib

os.environ["HF_HUB_OFFLINE"] = "1"  # nothing may be downloaded

import pytest
import torch

from reference.hf_greedy import hf_greedy  # noqa: E402

BASE = dict(hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=256, max_position_embeddings=1024,
            rms_norm_eps=1e-6, initializer_range=0.1, bos_token_id=1, eos_token_id=2)

# name -> (architecture, overrides, save_pretrained kwargs)
TINY = {
    "llama_gqa_untied": ("llama", dict(tie_word_embeddings=False), {}),
    "llama_mha_tied": ("llama", dict(num_key_value_heads=4, tie_word_embeddings=True), {}),
    "llama3_rope": ("llama", dict(rope_scaling=dict(
        rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
        original_max_position_embeddings=64), rope_theta=500000.0), {}),
    "linear_rope": ("llama", dict(rope_scaling=dict(rope_type="linear", factor=4.0)), {}),
    "explicit_head_dim": ("llama", dict(head_dim=24, num_key_value_heads=1), {}),
    "mistral_window": ("mistral", dict(sliding_window=48, num_key_value_heads=1), {}),
    "sharded": ("llama", dict(num_hidden_layers=3), dict(max_shard_size="150KB")),
}
PROMPT_LENGTHS = [1, 9, 100, 512]


def _make_tiny(name, root):
    import transformers
    arch, overrides, save_kwargs = TINY[name]
    cfg_cls, model_cls = ((transformers.LlamaConfig, transformers.LlamaForCausalLM)
                          if arch == "llama" else
                          (transformers.MistralConfig, transformers.MistralForCausalLM))
    torch.manual_seed(sum(map(ord, name)))
    model = model_cls(cfg_cls(**{**BASE, **overrides}))
    model.eval()
    path = root / name
    model.save_pretrained(path, safe_serialization=True, **save_kwargs)
    eager = model_cls.from_pretrained(path, dtype=torch.float32, attn_implementation="eager")
    return path, eager.eval()


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny_models")
    return {name: _make_tiny(name, root) for name in TINY}


def _prompt(length, vocab, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab, (length,), generator=g).tolist()


_hf_greedy = hf_greedy


@pytest.mark.parametrize("name", list(TINY))
def test_tiny_logits_match_transformers(torch_ops, tiny_models, name):
    path, hf = tiny_models[name]
    for i, n in enumerate(PROMPT_LENGTHS):
        ids = _prompt(n, BASE["vocab_size"], seed=1000 * i + n)
        with torch.no_grad():
            expected = hf(torch.tensor([ids])).logits[0].float()
        got = torch_ops.model_logits(str(path), "float32", ids)
        assert got.shape == expected.shape
        diff = (got - expected).abs().max().item()
        assert diff <= 1e-4, f"{name} n={n}: max abs diff {diff}"


@pytest.mark.parametrize("name", list(TINY))
def test_tiny_greedy_matches_transformers(torch_ops, tiny_models, name):
    path, hf = tiny_models[name]
    # The Mistral prompt is longer than its window, so decoding has to slide.
    ids = _prompt(80, BASE["vocab_size"], seed=7)
    expected = _hf_greedy(hf, ids, 24)
    assert list(torch_ops.model_greedy(str(path), "float32", ids, 24)) == expected


def test_tiny_batched_decode_matches_single(torch_ops, tiny_models):
    """One batched decode step over sequences of different lengths and
    positions gives what each sequence gets alone (and what transformers gets)."""
    path, hf = tiny_models["llama_gqa_untied"]
    prompts = [_prompt(n, BASE["vocab_size"], seed=n) for n in (5, 33, 17)]
    flat = [t for p in prompts for t in p]
    got = torch_ops.model_greedy_batch(str(path), "float32", flat, [len(p) for p in prompts], 12)
    for b, p in enumerate(prompts):
        assert got[b].tolist() == _hf_greedy(hf, p, 12), f"sequence {b}"


def _bf16_rounded_copy(hf):
    """transformers' float32 model with every matrix rounded to bfloat16 and
    widened back: the exact semantics of weight-only bfloat16 (norm weights
    stay float32, as in the C++ model)."""
    import copy
    model = copy.deepcopy(hf)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2:
                p.copy_(p.to(torch.bfloat16).float())
    return model


@pytest.mark.parametrize("name", ["llama_gqa_untied", "llama_mha_tied", "mistral_window"])
def test_tiny_weight_only_bfloat16_matches_rounded_transformers(torch_ops, tiny_models, name):
    """On CPU "bfloat16" stores weights in bfloat16 and computes in float32:
    its logits match transformers float32 on the bfloat16-rounded weights as
    tightly as the float32 model matches transformers (prefill and decode)."""
    path, hf = tiny_models[name]
    rounded = _bf16_rounded_copy(hf)
    for i, n in enumerate([1, 9, 100, 512]):
        ids = _prompt(n, BASE["vocab_size"], seed=77 + n)
        with torch.no_grad():
            expected = rounded(torch.tensor([ids])).logits[0].float()
        got = torch_ops.model_logits(str(path), "bfloat16", ids)
        diff = (got - expected).abs().max().item()
        assert diff <= 1e-4, f"{name} n={n}: max abs diff {diff}"
    ids = _prompt(80, BASE["vocab_size"], seed=8)
    assert list(torch_ops.model_greedy(str(path), "bfloat16", ids, 24)) == _hf_greedy(rounded, ids,
                                                                                       24)


def test_tiny_weight_only_bfloat16_batch_invariant(torch_ops, tiny_models):
    """The bfloat16 decode kernel computes each row in a fixed order, so a
    sequence's tokens do not depend on the batch it is decoded in."""
    path, _ = tiny_models["llama_gqa_untied"]
    prompts = [_prompt(n, BASE["vocab_size"], seed=n) for n in (3, 40, 129, 7, 64)]
    flat = [t for p in prompts for t in p]
    got = torch_ops.model_greedy_batch(str(path), "bfloat16", flat, [len(p) for p in prompts], 16)
    for b, p in enumerate(prompts):
        assert got[b].tolist() == list(torch_ops.model_greedy(str(path), "bfloat16", p, 16)), b


def test_tiny_bfloat16_close_to_float32(torch_ops, tiny_models):
    path, _ = tiny_models["llama_gqa_untied"]
    ids = _prompt(64, BASE["vocab_size"], seed=3)
    f32 = torch_ops.model_logits(str(path), "float32", ids)
    bf16 = torch_ops.model_logits(str(path), "bfloat16", ids)
    assert bf16.dtype == torch.float32
    assert (bf16 - f32).abs().max().item() < 0.1


def test_load_errors_are_clear(torch_ops, tmp_path):
    with pytest.raises(RuntimeError, match="nonexistent"):
        torch_ops.model_logits(str(tmp_path / "nonexistent"), "float32", [1])
    (tmp_path / "bad.gguf").write_bytes(b"GGUF" + b"\0" * 12)
    with pytest.raises(RuntimeError, match="bad.gguf"):
        torch_ops.model_logits(str(tmp_path / "bad.gguf"), "float32", [1])


# --- the real model: SmolLM2-135M-Instruct Q4_1 GGUF ------------------------

GPL3 = pathlib.Path("/usr/share/common-licenses/GPL-3")
PROMPTS = [
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
    "The quick brown fox jumps over the lazy dog. Once upon a time, in a land far away,",
    "def fibonacci(n):\n    if n < 2:\n        return n\n",
    "1, 2, 3, 5, 8, 13, 21, 34, 55, 89, 144, 233,",
]


@pytest.fixture(scope="module")
def real(model_path):
    """transformers' float32 model and tokenizer from the GGUF (loaded once)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    kwargs = dict(gguf_file=model_path.name)
    tok = AutoTokenizer.from_pretrained(model_path.parent, **kwargs)
    hf = AutoModelForCausalLM.from_pretrained(model_path.parent, dtype=torch.float32,
                                              **kwargs).eval()
    long_ids = tok(GPL3.read_text())["input_ids"][:2048]
    assert len(long_ids) >= 2000
    return hf, tok, long_ids


@pytest.fixture(scope="module")
def long_fp32(real, torch_ops, model_path):
    """Float32 logits of the 2048-token GPL-3 prompt from both sides."""
    hf, _, ids = real
    with torch.no_grad():
        expected = hf(torch.tensor([ids])).logits[0].float()
    got = torch_ops.model_logits(str(model_path), "float32", ids)
    return expected, got


@pytest.mark.slow
def test_real_logits_match_transformers(torch_ops, real, model_path, long_fp32):
    hf, tok, _ = real
    for text in PROMPTS:
        ids = tok(text)["input_ids"]
        with torch.no_grad():
            expected = hf(torch.tensor([ids])).logits[0].float()
        got = torch_ops.model_logits(str(model_path), "float32", ids)
        diff = (got - expected).abs().max().item()
        assert diff <= 1e-3, f"{text[:30]!r}: max abs diff {diff}"
    expected, got = long_fp32
    diff = (got - expected).abs().max().item()
    assert diff <= 1e-3, f"GPL-3 prompt ({len(expected)} tokens): max abs diff {diff}"


@pytest.mark.slow
@pytest.mark.parametrize("prompt", [0, 2])  # chat and code; each costs ~40 s of CPU
def test_real_greedy_matches_transformers(torch_ops, real, model_path, prompt):
    hf, tok, _ = real
    ids = tok(PROMPTS[prompt])["input_ids"]
    expected = _hf_greedy(hf, ids, 64)
    got = list(torch_ops.model_greedy(str(model_path), "float32", ids, 64))
    assert got == expected, tok.decode(got) + "\n---\n" + tok.decode(expected)


# Baselines on the same 2048 tokens of GPL-3: transformers' own bfloat16 model
# agrees with its float32 model on 97.2% of next-token top-1 predictions, and
# computing in bfloat16 got us 97.0% (logits and activations rounded to 8
# mantissa bits flip near-ties). On CPU our bfloat16 model is weight-only
# bfloat16 (engine/model/llama_model.h): activations stay float32, so only the
# weights' rounding remains. The issue asks for 99%.
BF16_MIN_AGREEMENT = 0.99


@pytest.mark.slow
def test_real_bfloat16_top1_agreement(torch_ops, real, model_path, long_fp32):
    """Teacher-forced next-token top-1 of bfloat16 vs transformers' float32
    over 2000+ tokens of natural text."""
    _, _, ids = real
    expected, _ = long_fp32
    bf16 = torch_ops.model_logits(str(model_path), "bfloat16", ids)
    agreement = (bf16.argmax(-1) == expected.argmax(-1)).float().mean().item()
    assert agreement >= BF16_MIN_AGREEMENT, f"top-1 agreement {agreement:.4f}"


# --decode-dot=bfloat16 (kernels/linear/decode_dot.h): every decode step's linears
# take bfloat16 dot products (activations rounded to bfloat16, float32
# accumulation), the bfloat16 compute at decode, whose bar is 98 %.
# Measured 0.9945 on these 2000 positions (an AMX Xeon); transformers' own
# bfloat16 model, which also rounds every output, the attention and the
# residual stream, keeps 97.2 %.
BF16_DOT_DECODE_FROM = 48  # prompt tokens prefilled; the 2000 after are decode steps
BF16_DOT_MIN_AGREEMENT = 0.98


@pytest.mark.slow
def test_real_bfloat16_dot_decode_top1_agreement(torch_ops, real, hf_model_dir, long_fp32):
    """Teacher-forced decode (one batch-1 step per position, fed the true
    token) of the bfloat16 model with bfloat16 dot products, against
    transformers' float32 logits over 2000 positions. The model is the
    safetensors copy of the default one (GGUF matrices would stay in blocks,
    which the decode dot leaves alone); that its logits are not the
    weight-only path's guards the test itself."""
    _, _, ids = real
    expected, _ = long_fp32
    start = BF16_DOT_DECODE_FROM
    got = torch_ops.model_decode_logits(str(hf_model_dir), "bfloat16:bf16dot", ids, start)
    want = expected[start - 1:len(ids) - 1]
    assert got.shape == want.shape and want.shape[0] >= 2000
    weight_only = torch_ops.model_decode_logits(str(hf_model_dir), "bfloat16", ids[:start + 16],
                                                start)
    assert (got[:16] - weight_only).abs().max().item() > 1e-3, "the bfloat16 dot did not run"
    agreement = (got.argmax(-1) == want.argmax(-1)).float().mean().item()
    print(f"bfloat16 dot decode top-1 agreement with transformers: {agreement:.4f}")
    assert agreement >= BF16_DOT_MIN_AGREEMENT, f"top-1 agreement {agreement:.4f}"


# --kv-cache-dtype: decode steps read earlier tokens' K/V from the paged cache.
# A float32 cache must reproduce transformers as closely as prefill does; a
# bfloat16 cache rounds every cached key and value to 8 mantissa bits, which
# flips some near-tie next-token choices: measured 399 of 400
# (0.9975) top-1 agree with transformers, max logit difference 0.34; the floor
# leaves room for a few more near-ties on another CPU path.
KV_BF16_MIN_AGREEMENT = 0.98
# An int8 cache (kernels/kv_append/kv_append.h: 16 values per float32 scale) rounds
# keys and values to ~2^-8 of their group's largest value, coarser than
# bfloat16's 2^-8 of each value: measured on an AMX Xeon, 393 of
# 400 (0.9825) top-1 agree with transformers, max logit difference 0.65
# (rounding the whole prompt's K and V this way inside transformers keeps
# 0.990 of 2,048: bench/low_precision_study.py). The floor leaves room for a
# few more near-ties where other CPU paths compute the rest of the model.
KV_INT8_MIN_AGREEMENT = 0.975


@pytest.mark.slow
@pytest.mark.parametrize("kv_dtype", ["float32", "bfloat16", "int8"])
def test_real_paged_decode_with_kv_cache_dtype(torch_ops, real, model_path, long_fp32, kv_dtype):
    """Teacher-forced decode over the paged cache (400 steps after a
    1600-token prefill) against transformers' float32 logits."""
    _, _, ids = real
    expected, _ = long_fp32
    start, end = 1600, 2000
    got = torch_ops.model_paged_decode_logits(str(model_path), "float32", kv_dtype, ids[:end],
                                              start)
    want = expected[start - 1:end - 1]
    assert got.shape == want.shape
    agreement = (got.argmax(-1) == want.argmax(-1)).float().mean().item()
    diff = (got - want).abs().max().item()
    if kv_dtype == "float32":
        assert diff <= 1e-3, f"max abs diff {diff}"
    elif kv_dtype == "bfloat16":
        assert agreement >= KV_BF16_MIN_AGREEMENT, f"top-1 agreement {agreement:.4f}"
    else:
        assert agreement >= KV_INT8_MIN_AGREEMENT, f"top-1 agreement {agreement:.4f}"
        assert diff > 1e-3, "the int8 cache did not round anything"
    print(f"kv {kv_dtype}: top-1 agreement {agreement:.4f}, max abs logit diff {diff:.4f}")


# --- the server's paged cache past Mistral's sliding window -------------------

WINDOW = 37  # not a multiple of the server's block size (16)


def _byte_level_tokenizer(path):
    """tokenizer.json of a byte-level BPE with the 256 byte tokens and no
    merges (vocab_size 256, as BASE): the server needs a tokenizer to start;
    the test sends token ids."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tokenizer = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.save(str(path / "tokenizer.json"))


@pytest.fixture(scope="module")
def windowed_server(tmp_path_factory, start_module_server):
    import transformers
    torch.manual_seed(37)
    config = transformers.MistralConfig(**{**BASE, "sliding_window": WINDOW,
                                           "num_key_value_heads": 2})
    model = transformers.MistralForCausalLM(config).eval()
    path = tmp_path_factory.mktemp("windowed") / "mistral"
    model.save_pretrained(path, safe_serialization=True)
    _byte_level_tokenizer(path)
    def eager(**overrides):
        return transformers.MistralForCausalLM.from_pretrained(
            path, dtype=torch.float32, attn_implementation="eager", **overrides).eval()

    server = start_module_server([f"--model={path}", "--kv-cache-memory=64MiB",
                                  "--default-kv-method=none"])
    # transformers with the window, and with sliding_window=None.
    return server, eager(), eager(sliding_window=None)


def _generate(model, ids, max_new):
    """transformers' own greedy generate; EOS does not stop it (the server
    runs with ignore_eos)."""
    out = model.generate(torch.tensor([ids]), max_new_tokens=max_new, do_sample=False,
                         eos_token_id=None, pad_token_id=0)
    return out[0, len(ids):].tolist()


@pytest.mark.parametrize("prompt_len,max_new", [(20, 40), (90, 24)])
def test_server_decode_slides_the_window_like_transformers(windowed_server, pb, prompt_len,
                                                           max_new):
    """Through the server's paged cache, a greedy continuation whose prompt
    plus output outgrows the window (from the prompt on, or only while
    decoding) is token-identical to transformers' generate with the same
    sliding_window under eager attention, which applies it."""
    import grpc
    pb2, pb2_grpc = pb
    server, windowed, unwindowed = windowed_server
    ids = _prompt(prompt_len, BASE["vocab_size"], seed=prompt_len)
    expected = _generate(windowed, ids, max_new)
    # The window changes this continuation, so attending over every entry
    # would fail the comparison.
    assert _generate(unwindowed, ids, max_new) != expected
    with grpc.insecure_channel(server.target) as channel:
        r = pb2_grpc.GenerationStub(channel).Generate(pb2.GenerateRequest(
            input_ids=pb2.TokenIds(ids=ids),
            stopping=pb2.StoppingCriteria(max_new_tokens=max_new, ignore_eos=True),
            kv_compression=pb2.KvCompression(method=pb2.KvCompression.NONE)), timeout=120)
    assert list(r.token_ids) == expected
