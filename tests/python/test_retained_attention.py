"""Usage.retained_attention_ratio of real requests against a Python
computation from transformers' own post-RoPE q/k of the same prompt
(docs/snapkv.md and docs/compression-policies.md, "Retained attention").

Oracle: tests/python/reference/hf_snapkv_pipeline.py records, per layer, the
post-RoPE queries of the last 32 prompt positions and the keys of all n, in
transformers' float32 forward of the same GGUF. From those this file computes,
in plain float64 PyTorch (test_snapkv_scores.oracle_scores), each KV head's
window attention on the prefix (`raw`), the kept positions (SnapKV: stable
top-k of the pooled scores; StreamingLLM: sinks + recent span), and the ratio
sum(raw[kept prefix]) / sum(raw[prefix]), averaged over layers and KV heads.
Nothing is shared with the C++ side except the prompt's token ids.

Tolerance. The server runs its own forward (Q4_1 kernels, float32) and
transformers runs the dequantized weights: q/k agree closely but not bit for
bit (test_snapkv_e2e.py shows the same greedy tokens, not the same bits).
Each head's ratio is a smooth function of the attention except where a
position crosses the top-k boundary, which moves that head's numerator by that
position's share of the mass (at the boundary, a small one). Over 30 layers x
3 KV heads the figure is an average of 90 ratios, so such swaps and rounding
differences move it by well under ABS_TOL = 0.005 (measured: see the asserts'
messages); a different selection moves it by far more, which
test_tolerance_separates_selections checks so the comparison cannot pass by
accident.
"""
import os
import pathlib
import sys

os.environ["HF_HUB_OFFLINE"] = "1"  # nothing may be downloaded

import pytest
import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from reference.hf_snapkv_pipeline import SnapKVPipeline  # noqa: E402
from snapserve_testkit.metrics import value as metric  # noqa: E402
from test_snapkv_scores import oracle_scores  # noqa: E402

N = 1500
WINDOW = 32
KERNEL = 7
SNAPKV_C = 512
STREAMING_C, SINK = 256, 4
ABS_TOL = 0.005


@pytest.fixture(scope="module")
def server(start_module_server, model_path):
    return start_module_server([f"--model={model_path}", f"--kv-window={WINDOW}",
                                f"--snapkv-kernel={KERNEL}", "--snapkv-pooling=max",
                                "--default-kv-method=snapkv"])


@pytest.fixture(scope="module")
def ids(stub, pb):
    text = pathlib.Path("/usr/share/common-licenses/GPL-3").read_text()
    out = list(stub.Tokenize(pb[0].TokenizeRequest(text=text)).ids)[:N]
    assert len(out) == N
    return out


@pytest.fixture(scope="module")
def layers(model_path, ids):
    """Per layer (raw, pooled) float64 [Hkv, N - WINDOW] from transformers' q/k."""
    pipe = SnapKVPipeline.load(model_path, with_tokenizer=False)
    pre = pipe.prefill(ids, max_window=WINDOW)
    return [oracle_scores(pre.q_window[layer], pre.keys[layer], KERNEL, "max", "mean")
            for layer in range(pipe.num_layers)]


def retained(layers, kept_prefix):
    """Mean over layers and KV heads of raw[kept] / raw.sum; kept_prefix(layer,
    pooled) -> per head a LongTensor of kept prefix positions."""
    ratios = []
    for layer, (raw, pooled) in enumerate(layers):
        for g, positions in enumerate(kept_prefix(layer, pooled)):
            ratios.append(float(raw[g, positions].sum() / raw[g].sum()))
    return sum(ratios) / len(ratios)


def snapkv_kept(layer, pooled):
    # Stable: ties keep the lower position (docs/snapkv.md, step 7).
    return [torch.sort(-p.float(), stable=True).indices[: SNAPKV_C - WINDOW] for p in pooled]


def streaming_kept(layer, pooled):
    prefix = pooled.shape[1]
    recent_begin = N - (STREAMING_C - SINK)
    span = torch.cat([torch.arange(0, SINK), torch.arange(recent_begin, prefix)])
    return [span] * pooled.shape[0]


def _generate(stub, pb2, ids, method, capacity, sink=0):
    K = pb2.KvCompression
    return stub.Generate(pb2.GenerateRequest(
        input_ids=pb2.TokenIds(ids=ids),
        sampling=pb2.SamplingParams(temperature=0.0),
        stopping=pb2.StoppingCriteria(max_new_tokens=1, ignore_eos=True),
        kv_compression=K(method=method, max_capacity_prompt=capacity, sink_tokens=sink)),
        timeout=600)


def test_retained_attention_matches_python(stub, pb, ids, layers, server):
    pb2 = pb[0]
    K = pb2.KvCompression
    before = server.metrics_text()
    snap = _generate(stub, pb2, ids, K.SNAPKV, SNAPKV_C).usage
    stream = _generate(stub, pb2, ids, K.STREAMING_LLM, STREAMING_C, SINK).usage
    short = _generate(stub, pb2, ids[:300], K.SNAPKV, SNAPKV_C).usage
    after = server.metrics_text()

    assert snap.kv_method == K.SNAPKV and stream.kv_method == K.STREAMING_LLM
    assert short.kv_method == K.NONE and not short.HasField("retained_attention_ratio")
    want_snap = retained(layers, snapkv_kept)
    want_stream = retained(layers, streaming_kept)
    got_snap, got_stream = snap.retained_attention_ratio, stream.retained_attention_ratio
    assert got_snap == pytest.approx(want_snap, abs=ABS_TOL), (got_snap, want_snap)
    assert got_stream == pytest.approx(want_stream, abs=ABS_TOL), (got_stream, want_stream)
    print(f"\nretained attention: SnapKV C={SNAPKV_C} server {got_snap:.5f} python "
          f"{want_snap:.5f}; StreamingLLM C={STREAMING_C} server {got_stream:.5f} python "
          f"{want_stream:.5f}")

    # One histogram observation per compressed request, none for the short one.
    def delta(name):
        return metric(after, name) - metric(before, name)
    assert delta("snapserve_kv_retained_attention_ratio_count") == 2
    assert delta("snapserve_kv_retained_attention_ratio_sum") == pytest.approx(
        got_snap + got_stream, rel=1e-6)


def test_tolerance_separates_selections(layers):
    """The figure discriminates: SnapKV keeps far more of the window's
    attention than a selection of the same size drawn at random (by many times
    ABS_TOL), and more than StreamingLLM's smaller fixed span."""
    gen = torch.Generator().manual_seed(0)
    prefix = N - WINDOW

    def random_kept(layer, pooled):
        return [torch.randperm(prefix, generator=gen)[: SNAPKV_C - WINDOW]
                for _ in range(pooled.shape[0])]
    snap = retained(layers, snapkv_kept)
    assert snap - retained(layers, random_kept) > 20 * ABS_TOL
    assert snap > retained(layers, streaming_kept)
    assert 0 < snap <= 1
