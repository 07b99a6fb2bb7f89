"""SnapKV end to end: the real server against a Python pipeline (docs/snapkv.md,
docs/testing-and-measuring.md).

The oracle is tests/python/reference/hf_snapkv_pipeline.py: transformers'
float32 SmolLM2 (the same GGUF, dequantized by transformers' loader) prefills
the prompt with full attention, each layer's K/V is compressed by the
independent numpy reference of docs/snapkv.md
(tests/python/reference/snapkv.py), and greedy decoding continues at the true
positions n, n+1, ... over the kept entries. The server must produce the same
tokens for natural-text prompts of 2K-6K tokens, C in {256, 512, 1024}, max and
avg pooling.

Token ids come from the server's own Tokenize (both sides then see the same
ids). The pipeline is itself checked first: with C >= n it is plain greedy
generation, and decoding over a compressed cache at the true positions equals
the full model with the dropped entries masked out.
"""
import os
import pathlib
import sys

os.environ["HF_HUB_OFFLINE"] = "1"  # nothing may be downloaded

import pytest
import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from reference.hf_snapkv_pipeline import Compressed  # noqa: E402

LICENSES = pathlib.Path("/usr/share/common-licenses")
MAX_NEW = 24
MAX_WINDOW = 32

# (text, prompt tokens, C, window, kernel, pooling). Prompts are natural English
# text cut to n tokens; every length, capacity and pooling kind appears.
CASES = [
    ("Apache-2.0", 2048, 256, 32, 7, "max"),
    ("Apache-2.0", 2048, 1024, 32, 7, "avg"),
    ("MPL-2.0", 2600, 512, 32, 7, "avg"),
    ("GPL-2", 3400, 1024, 32, 7, "max"),
    ("GFDL-1.3", 4200, 256, 16, 5, "avg"),
    ("LGPL-2.1", 5120, 512, 32, 7, "max"),
]


@pytest.fixture(scope="module")
def server(start_module_server, model_path):
    return start_module_server([f"--model={model_path}", "--kv-capacity=1024",
                                "--default-kv-method=snapkv"])


@pytest.fixture(scope="module")
def prompts(stub, pb):
    """name -> all token ids of that text, from the server's tokenizer."""
    pb2, _ = pb
    out = {}
    for name in sorted({c[0] for c in CASES}):
        text = (LICENSES / name).read_text()
        out[name] = list(stub.Tokenize(pb2.TokenizeRequest(text=text)).ids)
    return out


_prefills = {}


def _prefill(pipe, ids):
    """One Python prefill per distinct prompt (cases share them)."""
    key = tuple(ids)
    if key not in _prefills:
        _prefills.clear()  # the cases are ordered by prompt: keep one at a time
        _prefills[key] = pipe.prefill(ids, max_window=MAX_WINDOW)
    return _prefills[key]


def _generate(stub, pb2, ids, capacity, window, kernel, pooling):
    pooling_enum = {"max": pb2.KvCompression.MAX, "avg": pb2.KvCompression.AVG}[pooling]
    req = pb2.GenerateRequest(
        input_ids=pb2.TokenIds(ids=ids),
        sampling=pb2.SamplingParams(temperature=0.0),
        stopping=pb2.StoppingCriteria(max_new_tokens=MAX_NEW, ignore_eos=True),
        kv_compression=pb2.KvCompression(method=pb2.KvCompression.SNAPKV, window_size=window,
                                         max_capacity_prompt=capacity, kernel_size=kernel,
                                         pooling=pooling_enum))
    return stub.Generate(req, timeout=900)


def _margin_report(tok, expected, got, logits):
    """Where the two token lists first differ, the pipeline's top-3 logits."""
    i = next(i for i, (a, b) in enumerate(zip(expected, got)) if a != b)
    top = torch.topk(logits[i], 3)
    lines = [f"first difference at generated token {i}: pipeline {expected[i]} "
             f"{tok.decode([expected[i]])!r}, server {got[i]} {tok.decode([got[i]])!r}",
             "pipeline top-3 logits at that step: " + ", ".join(
                 f"{int(t)} {tok.decode([int(t)])!r}={float(v):.4f}"
                 for v, t in zip(top.values, top.indices)),
             f"pipeline logit of the server's token: {float(logits[i][got[i]]):.4f} "
             f"(margin {float(logits[i][expected[i]] - logits[i][got[i]]):.4f})",
             f"pipeline: {tok.decode(expected)!r}", f"server:   {tok.decode(got)!r}"]
    return "\n".join(lines)


# --- the pipeline itself --------------------------------------------------

@pytest.mark.slow
def test_pipeline_without_compression_is_plain_greedy(pipe, prompts):
    ids = prompts["Apache-2.0"][:300]
    pre = pipe.prefill(ids)
    comp = pipe.compress(pre, window=32, capacity=1024, kernel_size=7, pooling="max")
    assert comp.entries == len(ids)  # n <= C: everything kept (docs/snapkv.md, step 1)
    got = pipe.greedy(pre, comp, 16)
    with torch.no_grad():
        expected = pipe.model.generate(torch.tensor([ids]), max_new_tokens=16, min_new_tokens=16,
                                       do_sample=False)[0, len(ids):].tolist()
    assert got == expected
    # Teacher forcing over the cached prompt equals one forward over everything.
    with torch.no_grad():
        full = pipe.model(torch.tensor([ids + got])).logits[0, len(ids):].float()
    tf = pipe.teacher_forced(pre, comp, got)
    assert (tf - full).abs().max().item() < 1e-3


@pytest.mark.slow
def test_pipeline_decodes_at_true_positions(pipe, prompts):
    """A compressed cache (here: the same kept positions for every KV head),
    decoded at positions n, n+1, ..., equals the full model decoding over the
    full cache with the dropped prompt entries masked out."""
    ids = prompts["Apache-2.0"][:600]
    n, capacity, steps = len(ids), 128, 4
    pre = pipe.prefill(ids)
    comp = pipe.compress(pre, window=32, capacity=capacity, kernel_size=7, pooling="max")
    keep = torch.from_numpy(comp.positions[3][0])  # layer 3, KV head 0 positions for all
    shared = Compressed([k[:, keep] for k in pre.keys], [v[:, keep] for v in pre.values])
    tokens, logits = pipe.greedy(pre, shared, steps, return_logits=True)

    from transformers import DynamicCache
    cache = DynamicCache(config=pipe.model.config)
    for layer in range(pipe.num_layers):
        cache.update(pre.keys[layer][None].clone(), pre.values[layer][None].clone(), layer)
    prompt_mask = torch.zeros(n, dtype=torch.long)
    prompt_mask[keep] = 1
    for i in range(1, steps):
        mask = torch.cat([prompt_mask, torch.ones(i, dtype=torch.long)])[None]
        with torch.no_grad():
            out = pipe.model(torch.tensor([[tokens[i - 1]]]), attention_mask=mask,
                             position_ids=torch.tensor([[n + i - 1]]), past_key_values=cache,
                             use_cache=True).logits[0, -1].float()
        diff = (out - logits[i]).abs().max().item()
        assert diff < 1e-3, f"step {i}: max abs logit diff {diff}"
        assert int(out.argmax()) == tokens[i]


# --- the server against the pipeline --------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("name,n,capacity,window,kernel,pooling", CASES,
                         ids=[f"{c[0]}-n{c[1]}-C{c[2]}-w{c[3]}-k{c[4]}-{c[5]}" for c in CASES])
def test_server_snapkv_matches_python_pipeline(pipe, stub, pb, prompts, name, n, capacity,
                                               window, kernel, pooling):
    pb2, _ = pb
    ids = prompts[name][:n]
    assert len(ids) == n, f"{name} has only {len(ids)} tokens"

    r = _generate(stub, pb2, ids, capacity, window, kernel, pooling)
    assert r.usage.prompt_tokens == n
    assert r.usage.kv_prompt_entries == n
    assert r.usage.kv_kept_entries == capacity
    assert r.usage.compression_ratio == pytest.approx(n / capacity, rel=1e-5)
    assert r.usage.completion_tokens == MAX_NEW
    got = list(r.token_ids)

    pre = _prefill(pipe, ids)
    comp = pipe.compress(pre, window, capacity, kernel, pooling)
    assert comp.entries == capacity
    expected, logits = pipe.greedy(pre, comp, MAX_NEW, return_logits=True)
    assert got == expected, _margin_report(pipe.tokenizer, expected, got, logits)
