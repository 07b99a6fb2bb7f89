"""PyramidKV and AdaKV end to end: the real server against the Python
pipeline (docs/compression-policies.md).

The oracle is the pipeline of test_snapkv_e2e.py
(tests/python/reference/hf_snapkv_pipeline.py: transformers' float32 SmolLM2
from the same GGUF, full-attention prefill, decoding at the true positions
n, n+1, ...) with the kept positions of tests/python/reference/adaptive_kv.py,
written independently of engine/compress/. Layers (PyramidKV) and KV heads
(AdaKV) keep different counts, so the pipeline holds a padded cache whose
padding the attention hides (keep_ragged). The server must produce the same
greedy tokens on natural English prompts of 1.3K-1.6K tokens.

Also here: Usage reports what is really held (kv_kept_entries_total,
kv_bytes_held), admission reserves only the policy's blocks, policies mix in
one batch without leaking a block, and the new fields' INVALID_ARGUMENT cases.
"""
import concurrent.futures
import os
import pathlib
import sys

os.environ["HF_HUB_OFFLINE"] = "1"  # nothing may be downloaded

import grpc
import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from reference import adaptive_kv as ref  # noqa: E402
from snapserve_testkit.calls import wait_for  # noqa: E402
from snapserve_testkit.metrics import value as metric  # noqa: E402
from test_snapkv_e2e import _margin_report  # noqa: E402

# A cache of 1280 tokens of every layer and KV head: no prompt here fits
# uncompressed (test_streaming_llm_e2e.py's settings).
# Its server and prompts fixtures too: the same five texts, the same cache.
from test_streaming_llm_e2e import MAX_NEW, prompts, server  # noqa: E402,F401
LANES = 30 * 3  # SmolLM2-135M: layers * KV heads
LANE_BLOCK_BYTES = 2 * 16 * 64 * 4  # K and V of 16 float32 entries of one lane

# (method, text, prompt tokens, C, window, extra). Server defaults elsewhere:
# kernel 7, max pooling. PyramidKV needs C / beta >= w for a pyramid.
CASES = [
    ("PYRAMIDKV", "Apache-2.0", 1400, 256, 8, {"pyramid_beta": 20}),
    ("PYRAMIDKV", "MPL-2.0", 1600, 512, 16, {"pyramid_beta": 8}),
    ("PYRAMIDKV", "GPL-2", 1500, 300, 32, {"pyramid_beta": 20}),  # no pyramid fits: uniform C
    ("PYRAMIDKV", "LGPL-2.1", 1400, 128, 8, {"pyramid_beta": 4}),
    ("ADAKV", "Apache-2.0", 1400, 256, 32, {"adakv_alpha_safeguard": 0.2}),
    ("ADAKV", "MPL-2.0", 1600, 512, 16, {"adakv_alpha_safeguard": 0.5}),
    ("ADAKV", "GFDL-1.3", 1300, 300, 8, {}),  # the server default alpha, 0.2
    ("ADAKV", "LGPL-2.1", 1400, 128, 16, {"adakv_alpha_safeguard": 0.05}),
]
IDS = [f"{c[0]}-{c[1]}-n{c[2]}-C{c[3]}-w{c[4]}" for c in CASES]


def _request(pb2, ids, method, capacity, window, extra=None, max_new=MAX_NEW):
    K = pb2.KvCompression
    kv = K(method=getattr(K, method) if isinstance(method, str) else method,
           max_capacity_prompt=capacity, window_size=window, **(extra or {}))
    return pb2.GenerateRequest(
        input_ids=pb2.TokenIds(ids=ids), sampling=pb2.SamplingParams(temperature=0.0),
        stopping=pb2.StoppingCriteria(max_new_tokens=max_new, ignore_eos=True),
        kv_compression=kv)


def _expected_positions(pipe, pre, method, n, capacity, window, extra):
    positions = []
    budgets = ref.pyramid_budgets(n, pipe.num_layers, capacity, window,
                                  extra.get("pyramid_beta", 20))
    for layer in range(pipe.num_layers):
        q_window = pre.q_window[layer][:, -window:, :]
        keys = pre.keys[layer]
        if method == "PYRAMIDKV":
            positions.append(ref.pyramid_positions(q_window, keys, window, budgets[layer], 7,
                                                   "max"))
        else:
            alpha = extra.get("adakv_alpha_safeguard", 0.2)
            positions.append(ref.adakv_positions(q_window, keys, window, capacity, 7, "max",
                                                 alpha))
    return positions


@pytest.mark.slow
@pytest.mark.parametrize("method,name,n,capacity,window,extra", CASES, ids=IDS)
def test_server_matches_python_pipeline(pipe, stub, pb, prompts, method, name, n, capacity,
                                        window, extra):
    pb2, _ = pb
    ids = prompts[name][:n]
    assert len(ids) == n, f"{name} has only {len(ids)} tokens"
    r = stub.Generate(_request(pb2, ids, method, capacity, window, extra), timeout=900)
    got = list(r.token_ids)

    pre = pipe.prefill(ids, max_window=window)
    positions = _expected_positions(pipe, pre, method, n, capacity, window, extra)
    total = sum(len(h) for layer in positions for h in layer)
    blocks = sum((len(h) + 15) // 16 for layer in positions for h in layer)
    u = r.usage
    assert u.kv_method == getattr(pb2.KvCompression, method)
    assert u.kv_prompt_entries == n
    assert u.kv_kept_entries_total == total
    assert total == LANES * capacity  # both policies spend exactly L * Hkv * C
    assert u.kv_kept_entries == capacity
    assert u.kv_bytes_held == blocks * LANE_BLOCK_BYTES
    assert u.compression_ratio == pytest.approx(n / capacity, rel=1e-5)
    assert 0 < u.retained_attention_ratio <= 1

    comp = pipe.keep_ragged(pre, positions)
    expected, logits = pipe.greedy(pre, comp, MAX_NEW, return_logits=True)
    assert got == expected, _margin_report(pipe.tokenizer, expected, got, logits)


def test_pyramid_keeps_fewer_blocks_in_deep_layers(stub, pb, prompts):
    """The memory really held follows the per-layer budgets: PyramidKV's
    blocks, counted from its budgets, are what Usage reports, and they are
    the same bytes as uniform SnapKV at the same C within block rounding."""
    pb2 = pb[0]
    ids = prompts["Apache-2.0"][:1400]
    pyr = stub.Generate(_request(pb2, ids, "PYRAMIDKV", 256, 8, {"pyramid_beta": 20},
                                 max_new=2), timeout=300).usage
    snap = stub.Generate(_request(pb2, ids, "SNAPKV", 256, 8, max_new=2), timeout=300).usage
    budgets = ref.pyramid_budgets(1400, 30, 256, 8, 20)
    assert budgets[0] > 256 > budgets[-1]
    assert pyr.kv_bytes_held == sum(3 * ((b + 15) // 16) for b in budgets) * LANE_BLOCK_BYTES
    assert snap.kv_bytes_held == LANES * (256 // 16) * LANE_BLOCK_BYTES
    assert pyr.kv_kept_entries_total == snap.kv_kept_entries_total == LANES * 256


def test_policies_mixed_in_one_batch_free_every_block(stub, pb, prompts, server):
    """Four policies at once in the running batch (a cache that holds none of
    the prompts whole); afterwards every block is free again."""
    pb2 = pb[0]
    ids = prompts["MPL-2.0"][:1300]
    reqs = [_request(pb2, ids, m, 128, 16, max_new=8)
            for m in ("SNAPKV", "PYRAMIDKV", "ADAKV", "STREAMING_LLM")]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda r: stub.Generate(r, timeout=600), reqs))
    for r, m in zip(results, ("SNAPKV", "PYRAMIDKV", "ADAKV", "STREAMING_LLM")):
        assert r.usage.kv_method == getattr(pb2.KvCompression, m)
        assert r.usage.completion_tokens == 8
    def settled():  # the gauges are sampled every 200 ms
        t = server.metrics_text()
        return (metric(t, "snapserve_requests_running") == 0 and
                metric(t, "snapserve_kv_cache_usage_ratio") == 0 and t)
    assert wait_for(settled, timeout=5, interval=0.2), server.metrics_text()


def test_model_info_reports_the_defaults(stub, pb):
    d = stub.GetModelInfo(pb[0].GetModelInfoRequest()).default_kv_compression
    assert d.adakv_alpha_safeguard == pytest.approx(0.2)
    assert d.pyramid_beta == 20


# --- validation ----------------------------------------------------------------

@pytest.mark.parametrize("alpha", [-0.1, 1.5, float("nan")])
def test_alpha_out_of_range_is_invalid(stub, pb, alpha):
    with pytest.raises(grpc.RpcError) as e:
        stub.Generate(_request(pb[0], [1, 2, 3], "ADAKV", 64, 8,
                               {"adakv_alpha_safeguard": alpha}, max_new=1), timeout=30)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "kv_compression.adakv_alpha_safeguard" in e.value.details(), e.value.details()


@pytest.mark.parametrize("method", ["ADAKV", "PYRAMIDKV"])
def test_snapkv_fields_bind_the_adaptive_policies(stub, pb, method):
    req = _request(pb[0], [1, 2, 3], method, 64, 8, max_new=1)
    req.kv_compression.kernel_size = 4
    with pytest.raises(grpc.RpcError) as e:
        stub.Generate(req, timeout=30)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "kv_compression.kernel_size" in e.value.details(), e.value.details()
