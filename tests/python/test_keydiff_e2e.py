"""KeyDiff end to end: the real server against transformers with kvpress's
KeyDiffPress selection (docs/compression-policies.md, "KeyDiff").

For each prompt and budget, kvpress (tests/python/reference/
kvpress_kept_positions.py in .deps/kvpress-venv) says which positions
KeyDiffPress keeps per layer and KV head on transformers' float32 SmolLM2;
the oracle pipeline (tests/python/reference/hf_snapkv_pipeline.py: the same
model prefilled with full attention, decoding at the true positions over the
kept entries) keeps exactly those and decodes greedily. The server, asked
for KEYDIFF, must produce the same tokens on natural English prompts of
1.3K-1.6K tokens that do not fit its cache uncompressed.

Also here: the usage fields of a KeyDiff request, a short prompt left alone,
and the validation KeyDiff does (C only: it has no window).
"""
import json
import os
import pathlib
import subprocess
import sys

os.environ["HF_HUB_OFFLINE"] = "1"  # nothing may be downloaded

import grpc
import numpy as np
import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from test_snapkv_e2e import _margin_report  # noqa: E402
# Its server (a 1280-token cache, SnapKV by default) and prompts fixtures.
from test_streaming_llm_e2e import MAX_NEW, prompts, server  # noqa: E402,F401
from test_streaming_llm_kvpress import SCRIPT, kvpress_python  # noqa: E402,F401

LANES = 30 * 3  # SmolLM2-135M: layers * KV heads
# (text, prompt tokens, C)
CASES = [("Apache-2.0", 1400, 256), ("GFDL-1.3", 1300, 128)]
IDS = [f"{c[0]}-n{c[1]}-C{c[2]}" for c in CASES]


@pytest.fixture(scope="module")
def kvpress_positions(kvpress_python, model_path, prompts, tmp_path_factory):
    """(name, n, C) -> kvpress's kept positions per layer, [Hkv, C] each."""
    tmp = tmp_path_factory.mktemp("kvpress")
    out = {}
    for name, n, capacity in CASES:
        ids = prompts[name][:n]
        assert len(ids) == n, f"{name} has only {len(ids)} tokens"
        spec = {"press": "keydiff", "prompts": [ids], "configs": [{"capacity": capacity}]}
        src, dst = tmp / f"{name}.in.json", tmp / f"{name}.out.json"
        src.write_text(json.dumps(spec))
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
        done = subprocess.run([str(kvpress_python), str(SCRIPT), str(model_path), str(src),
                               str(dst)], capture_output=True, text=True, timeout=1800, env=env)
        assert done.returncode == 0, f"kvpress script failed:\n{done.stdout}\n{done.stderr}"
        result = json.loads(dst.read_text())["results"][0][0]
        assert result["n"] == n
        out[(name, n, capacity)] = [np.asarray(layer, dtype=np.int64)
                                    for layer in result["positions"]]
    return out


def _request(pb2, ids, capacity, window=0, max_new=MAX_NEW):
    K = pb2.KvCompression
    return pb2.GenerateRequest(
        input_ids=pb2.TokenIds(ids=ids), sampling=pb2.SamplingParams(temperature=0.0),
        stopping=pb2.StoppingCriteria(max_new_tokens=max_new, ignore_eos=True),
        kv_compression=K(method=K.KEYDIFF, max_capacity_prompt=capacity, window_size=window))


@pytest.mark.slow
@pytest.mark.parametrize("name,n,capacity", CASES, ids=IDS)
def test_server_matches_transformers_with_keydiff_press(kvpress_positions, pipe, stub, pb,
                                                        prompts, name, n, capacity):
    pb2, _ = pb
    ids = prompts[name][:n]
    r = stub.Generate(_request(pb2, ids, capacity), timeout=900)
    u = r.usage
    assert u.kv_method == pb2.KvCompression.KEYDIFF
    assert u.prompt_tokens == n and u.kv_prompt_entries == n
    assert u.kv_kept_entries == capacity
    assert u.kv_kept_entries_total == LANES * capacity
    assert u.compression_ratio == pytest.approx(n / capacity, rel=1e-5)
    # The server's default window (32) measures the retained attention.
    assert 0 < u.retained_attention_ratio <= 1
    got = list(r.token_ids)

    positions = kvpress_positions[(name, n, capacity)]
    assert len(positions) == pipe.num_layers
    assert all(p.shape == (pipe.num_kv_heads, capacity) for p in positions)
    pre = pipe.prefill(ids, max_window=1)  # KeyDiff reads no queries
    comp = pipe.keep(pre, positions)
    assert comp.entries == capacity
    expected, logits = pipe.greedy(pre, comp, MAX_NEW, return_logits=True)
    assert got == expected, _margin_report(pipe.tokenizer, expected, got, logits)


def test_short_prompt_is_not_compressed(stub, pb, prompts):
    ids = prompts["Apache-2.0"][:200]
    u = stub.Generate(_request(pb[0], ids, 256, max_new=2), timeout=120).usage
    assert u.kv_method == pb[0].KvCompression.NONE  # nothing dropped
    assert (u.kv_prompt_entries, u.kv_kept_entries, u.compression_ratio) == (200, 200, 1)


def test_window_is_not_validated(stub, pb, prompts):
    """KeyDiff has no window: one wider than C, which SnapKV refuses, is
    accepted, and the request keeps C entries."""
    pb2 = pb[0]
    ids = prompts["Apache-2.0"][:1400]
    u = stub.Generate(_request(pb2, ids, 64, window=128, max_new=2), timeout=300).usage
    assert u.kv_kept_entries == 64
    snapkv = _request(pb2, ids, 64, window=128, max_new=2)
    snapkv.kv_compression.method = pb2.KvCompression.SNAPKV
    with pytest.raises(grpc.RpcError) as refused:
        stub.Generate(snapkv, timeout=120)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_capacity_beyond_context_is_invalid(stub, pb, prompts):
    with pytest.raises(grpc.RpcError) as refused:
        stub.Generate(_request(pb[0], prompts["Apache-2.0"][:300], 10**6, max_new=2),
                      timeout=120)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "max_capacity_prompt" in refused.value.details()
