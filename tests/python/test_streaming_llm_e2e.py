"""StreamingLLM end to end: the real server against a Python pipeline
(docs/compression-policies.md).

The oracle is the pipeline test_snapkv_e2e.py uses
(tests/python/reference/hf_snapkv_pipeline.py: transformers' float32 SmolLM2
from the same GGUF, prefilled with full attention, decoding at the true
positions n, n+1, ... over the kept entries), with the kept positions taken
from tests/python/reference/streaming_llm.py, the rule written independently
of the C++ selector. The server must produce the same greedy tokens on natural
English prompts of 1.3K-1.6K tokens, for several C and sink counts.

Also here: the usage fields and metrics of a StreamingLLM request, that only
the kept entries take KV cache room (a prompt that fits only compressed), and
the INVALID_ARGUMENT cases of the new fields.
"""
import os
import pathlib
import sys

os.environ["HF_HUB_OFFLINE"] = "1"  # nothing may be downloaded

import grpc
import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from reference import streaming_llm as ref  # noqa: E402
from snapserve_testkit.metrics import value as metric  # noqa: E402
from test_snapkv_e2e import _margin_report  # noqa: E402

LICENSES = pathlib.Path("/usr/share/common-licenses")
MAX_NEW = 16
# 80 blocks of 16 tokens at 46080 bytes per token (test_server_e2e.py): every
# case below fits compressed (C + MAX_NEW <= 1280), no prompt fits uncompressed.
KV_CACHE_TOKENS = 1280
KV_CACHE_BYTES = KV_CACHE_TOKENS * 46080

# (text, prompt tokens, C, sink_tokens; 0 = the server default, 4).
# Prompts of 1.3K-1.6K tokens: longer than the cache (1280), short enough to
# keep the transformers side of each case to seconds (make test's time).
CASES = [
    ("Apache-2.0", 1400, 256, 0),
    ("MPL-2.0", 1600, 512, 4),
    ("GPL-2", 1500, 1024, 16),
    ("GFDL-1.3", 1300, 300, 1),
    ("LGPL-2.1", 1400, 128, 64),
]


@pytest.fixture(scope="module")
def server(start_module_server, model_path):
    # The default method stays SnapKV: every request here chooses StreamingLLM.
    return start_module_server([f"--model={model_path}", f"--kv-cache-memory={KV_CACHE_BYTES}",
                                "--default-kv-method=snapkv"])


@pytest.fixture(scope="module")
def prompts(stub, pb):
    """name -> all token ids of that text, from the server's tokenizer."""
    pb2, _ = pb
    return {name: list(stub.Tokenize(pb2.TokenizeRequest(text=(LICENSES / name).read_text())).ids)
            for name in sorted({c[0] for c in CASES})}


def _request(pb2, ids, capacity, sink_tokens, method=None, max_new=MAX_NEW):
    K = pb2.KvCompression
    return pb2.GenerateRequest(
        input_ids=pb2.TokenIds(ids=ids),
        sampling=pb2.SamplingParams(temperature=0.0),
        stopping=pb2.StoppingCriteria(max_new_tokens=max_new, ignore_eos=True),
        kv_compression=K(method=K.STREAMING_LLM if method is None else method,
                         max_capacity_prompt=capacity, sink_tokens=sink_tokens))


# --- the reference rule itself ----------------------------------------------

def test_reference_rule():
    assert ref.select_positions(10, 6, 2).tolist() == [[0, 1, 6, 7, 8, 9]]
    assert ref.select_positions(10, 6, 0, num_kv_heads=2).tolist() == [[4, 5, 6, 7, 8, 9]] * 2
    assert ref.select_positions(6, 6, 2).tolist() == [list(range(6))]  # n <= C: all kept
    with pytest.raises(ValueError):
        ref.select_positions(10, 6, 6)


# --- the server against the pipeline ----------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("name,n,capacity,sink", CASES,
                         ids=[f"{c[0]}-n{c[1]}-C{c[2]}-sink{c[3]}" for c in CASES])
def test_server_streaming_llm_matches_python_pipeline(pipe, stub, pb, prompts, name, n, capacity,
                                                      sink):
    pb2, _ = pb
    ids = prompts[name][:n]
    assert len(ids) == n, f"{name} has only {len(ids)} tokens"

    r = stub.Generate(_request(pb2, ids, capacity, sink), timeout=900)
    assert r.usage.prompt_tokens == n
    assert r.usage.kv_prompt_entries == n
    assert r.usage.kv_kept_entries == capacity
    assert r.usage.compression_ratio == pytest.approx(n / capacity, rel=1e-5)
    assert r.usage.completion_tokens == MAX_NEW
    got = list(r.token_ids)

    pre = pipe.prefill(ids, max_window=1)  # StreamingLLM reads no queries
    sink_tokens = sink or 4  # 0: the server default (ModelInfo says 4, checked below)
    positions = [ref.select_positions(n, capacity, sink_tokens, pipe.num_kv_heads)
                 for _ in range(pipe.num_layers)]
    comp = pipe.keep(pre, positions)
    assert comp.entries == capacity
    expected, logits = pipe.greedy(pre, comp, MAX_NEW, return_logits=True)
    assert got == expected, _margin_report(pipe.tokenizer, expected, got, logits)


# --- usage, memory, metrics ---------------------------------------------------

def test_model_info_reports_the_sink_default(stub, pb):
    info = stub.GetModelInfo(pb[0].GetModelInfoRequest())
    assert info.default_kv_compression.sink_tokens == 4
    assert info.kv_cache_capacity_tokens == KV_CACHE_TOKENS


def test_short_prompt_is_not_compressed(stub, pb, prompts):
    ids = prompts["Apache-2.0"][:200]
    u = stub.Generate(_request(pb[0], ids, 256, 4, max_new=2), timeout=120).usage
    assert (u.kv_prompt_entries, u.kv_kept_entries, u.compression_ratio) == (200, 200, 1)


def test_only_kept_entries_take_cache_room(stub, pb, prompts, server):
    """A 1400-token prompt cannot fit the 1280-token cache whole, but its 256
    kept entries do: admission reserves by the kept count. The compression
    metrics count the request; SnapKV's selection-time histogram does not."""
    pb2 = pb[0]
    ids = prompts["Apache-2.0"][:1400]
    with pytest.raises(grpc.RpcError) as whole:
        stub.Generate(_request(pb2, ids, 256, 4, method=pb2.KvCompression.NONE, max_new=2),
                      timeout=120)
    assert whole.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, whole.value.details()

    before = server.metrics_text()
    u = stub.Generate(_request(pb2, ids, 256, 4, max_new=2), timeout=300).usage
    after = server.metrics_text()
    assert (u.kv_prompt_entries, u.kv_kept_entries) == (1400, 256)

    def delta(name):
        return metric(after, name) - metric(before, name)
    assert delta("snapserve_kv_entries_before_total") == 1400
    assert delta("snapserve_kv_entries_after_total") == 256
    assert delta("snapserve_kv_compression_ratio_count") == 1
    assert delta("snapserve_kv_compression_ratio_sum") == pytest.approx(1400 / 256)
    assert delta("snapserve_snapkv_duration_seconds_count") == 0


# --- validation ----------------------------------------------------------------

@pytest.mark.parametrize("capacity,sink", [(64, 64), (64, 65), (1024, 5000)])
def test_sink_not_below_capacity_is_invalid(stub, pb, capacity, sink):
    with pytest.raises(grpc.RpcError) as e:
        stub.Generate(_request(pb[0], [1, 2, 3], capacity, sink, max_new=1), timeout=30)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "kv_compression.sink_tokens" in e.value.details(), e.value.details()
    assert "max_capacity_prompt" in e.value.details(), e.value.details()


def test_default_sink_against_a_tiny_capacity_is_invalid(stub, pb):
    with pytest.raises(grpc.RpcError) as e:  # sink 0 means the default 4
        stub.Generate(_request(pb[0], [1, 2, 3], 4, 0, max_new=1), timeout=30)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "kv_compression.sink_tokens" in e.value.details(), e.value.details()


def test_snapkv_fields_do_not_bind_streaming_llm(stub, pb):
    """C = 8 is below SnapKV's default window and the kernel is even: both are
    SnapKV's business only."""
    pb2 = pb[0]
    req = _request(pb2, list(range(100, 140)), 8, 2, max_new=1)
    req.kv_compression.kernel_size = 4
    u = stub.Generate(req, timeout=60).usage
    assert (u.kv_prompt_entries, u.kv_kept_entries) == (40, 8)


@pytest.mark.parametrize("method", [99, 2**20])  # far past any planned method
def test_unknown_method_is_invalid(stub, pb, method):
    with pytest.raises(grpc.RpcError) as e:
        stub.Generate(_request(pb[0], [1, 2, 3], 64, 4, method=method, max_new=1), timeout=30)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "kv_compression.method" in e.value.details(), e.value.details()
