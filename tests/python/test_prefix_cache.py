"""The prefix cache (docs/kv-cache-and-scheduling.md, "Prefix cache") through
real snapserve processes serving the real SmolLM2 GGUF.

Oracle for exactness: the cold run of the same prompt on the same server
build, as issue 49 asks. Two servers with identical flags see the same
prompts in opposite orders, so every prompt runs cold on one server and
starts from a cached prefix on the other; greedy tokens, their logprobs (the
bits of the logits after every decode step, which read every kept K/V entry)
and the kept-entry totals must be equal, for every compression policy, with
prompts longer than a step's chunk (chunked prefill), each hit in a batch
beside a prompt that misses. Transformers parity of the model itself is
test_model_parity.py's; the cache does not change the default (it is off).

Eviction: a cache of two chunks under concurrent traffic evicts, and when
the traffic ends every KV block is free (/metrics, read with
prometheus_client) and the counters equal what the responses reported.
"""
import pathlib
import threading

import grpc
import pytest

from snapserve_testkit import metrics
from snapserve_testkit.calls import wait_for

GPL3 = pathlib.Path("/usr/share/common-licenses/GPL-3")
CHUNK = 256  # EngineOptions::prefix_cache_chunk_tokens
PREFIX, SUFFIX, MAX_NEW, WINDOW = 1100, 80, 6, 16
# Prompts of PREFIX + SUFFIX = 1180 tokens run in 512-token steps.
FLAGS = ["--kv-cache-memory=512MiB", "--prefix-cache-memory=0.5", "--max-step-tokens=512",
         "--max-batch-size=8"]


def kv_config(pb2, policy):
    kv = pb2.KvCompression()
    if policy == "none":
        kv.method = pb2.KvCompression.NONE
        return kv
    kv.method = {"snapkv": pb2.KvCompression.SNAPKV, "adakv": pb2.KvCompression.ADAKV,
                 "pyramidkv": pb2.KvCompression.PYRAMIDKV,
                 "streaming_llm": pb2.KvCompression.STREAMING_LLM}[policy]
    kv.max_capacity_prompt = 256
    if policy != "streaming_llm":
        kv.window_size = WINDOW
    return kv


def generate(stub, pb2, ids, policy, rid):
    req = pb2.GenerateRequest(
        request_id=rid, input_ids=pb2.TokenIds(ids=ids), kv_compression=kv_config(pb2, policy),
        stopping=pb2.StoppingCriteria(max_new_tokens=MAX_NEW, ignore_eos=True),
        logprobs=pb2.LogprobOptions(enabled=True, top_logprobs=3))
    r = stub.Generate(req, timeout=600)
    return {"tokens": list(r.token_ids),
            "logprobs": [(l.token_id, l.logprob, [(t.token_id, t.logprob) for t in l.top_logprobs])
                         for l in r.logprobs],
            "kept": r.usage.kv_kept_entries_total, "method": r.usage.kv_method,
            "cached": r.usage.cached_prompt_tokens, "prompt": r.usage.prompt_tokens}


def concurrently(calls):
    out, errors = [None] * len(calls), []

    def run(i, fn):
        try:
            out[i] = fn()
        except grpc.RpcError as e:  # reported below
            errors.append((i, e.code(), e.details()))

    threads = [threading.Thread(target=run, args=(i, fn)) for i, fn in enumerate(calls)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    return out


@pytest.fixture(scope="module")
def corpus(start_module_server, model_path, pb):
    pb2, pb2_grpc = pb
    servers = [start_module_server([f"--model={model_path}", *FLAGS]) for _ in range(2)]
    with grpc.insecure_channel(servers[0].target) as channel:
        stub = pb2_grpc.GenerationStub(channel)
        ids = list(stub.Tokenize(pb2.TokenizeRequest(text=GPL3.read_text() * 2)).ids)
    assert len(ids) > 12000
    return servers, ids


POLICIES = ["none", "snapkv", "adakv", "pyramidkv", "streaming_llm"]


@pytest.mark.parametrize("policy", POLICIES)
def test_a_cached_prefix_computes_what_a_cold_prefill_computes(corpus, pb, policy):
    pb2, pb2_grpc = pb
    (server_a, server_b), ids = corpus
    # Each policy its own text, so the first request of each server is cold.
    base = POLICIES.index(policy) * 2 * (PREFIX + SUFFIX)
    prefix = ids[base:base + PREFIX]
    a = prefix + ids[base + PREFIX:base + PREFIX + SUFFIX]
    b = prefix + ids[base + PREFIX + SUFFIX:base + PREFIX + 2 * SUFFIX]
    # Shares no chunk with anything sent before: a miss beside each hit.
    miss = ids[base + PREFIX + 2 * SUFFIX:base + 2 * PREFIX + 2 * SUFFIX]
    runs = {}
    with grpc.insecure_channel(server_a.target) as ca, grpc.insecure_channel(
            server_b.target) as cb:
        stub_a, stub_b = pb2_grpc.GenerationStub(ca), pb2_grpc.GenerationStub(cb)
        runs["a_cold"] = generate(stub_a, pb2, a, policy, f"{policy}-a-cold")
        runs["b_cold"] = generate(stub_b, pb2, b, policy, f"{policy}-b-cold")
        runs["b_hit"], runs["miss_a"] = concurrently([
            lambda: generate(stub_a, pb2, b, policy, f"{policy}-b-hit"),
            lambda: generate(stub_a, pb2, miss, policy, f"{policy}-miss-a")])
        runs["a_hit"], runs["miss_b"] = concurrently([
            lambda: generate(stub_b, pb2, a, policy, f"{policy}-a-hit"),
            lambda: generate(stub_b, pb2, miss, policy, f"{policy}-miss-b")])

    window = WINDOW if policy != "none" else 1
    # The longest run of whole chunks that leaves the last max(1, w) tokens
    # to compute, within the shared prefix.
    expected = min(PREFIX // CHUNK, (PREFIX + SUFFIX - window) // CHUNK) * CHUNK
    assert expected == 1024
    for name in ("a_cold", "b_cold", "miss_a", "miss_b"):
        assert runs[name]["cached"] == 0, (name, runs[name]["cached"])
    for name in ("a_hit", "b_hit"):
        assert runs[name]["cached"] == expected, (name, runs[name]["cached"])
    for cold, hit in (("a_cold", "a_hit"), ("b_cold", "b_hit"), ("miss_a", "miss_b")):
        assert runs[cold]["tokens"] == runs[hit]["tokens"], (cold, hit)
        assert runs[cold]["logprobs"] == runs[hit]["logprobs"], (cold, hit)
        assert runs[cold]["kept"] == runs[hit]["kept"], (cold, hit)
        assert runs[cold]["method"] == runs[hit]["method"]
    if policy != "none":  # the selection really ran: fewer entries than the prompt's
        assert runs["a_hit"]["method"] != pb2.KvCompression.NONE
        assert runs["a_hit"]["kept"] < 30 * 3 * runs["a_hit"]["prompt"]


def test_eviction_under_load_frees_every_block(start_server, model_path, pb):
    pb2, pb2_grpc = pb
    # 16 MiB of 32 hold one 11.25 MiB chunk of 256 tokens (float32, 30 layers x
    # 3 KV heads x 64): every insertion beyond the first evicts.
    server = start_server([f"--model={model_path}", "--kv-cache-memory=64MiB",
                           "--prefix-cache-memory=0.25", "--max-batch-size=4",
                           "--default-kv-method=none"])
    assert "prefix cache: 1 chunks of 256 tokens" in server.logs(), server.logs()
    with grpc.insecure_channel(server.target) as channel:
        stub = pb2_grpc.GenerationStub(channel)
        ids = list(stub.Tokenize(pb2.TokenizeRequest(text=GPL3.read_text())).ids)
        prompts = [ids[i * 300:i * 300 + 300] for i in range(8)]
        # Warm one prompt, then send it again among seven others at once.
        first = generate(stub, pb2, prompts[0], "none", "warm")
        results = concurrently([lambda p=p, i=i: generate(stub, pb2, p, "none", f"load-{i}")
                                for i, p in enumerate(prompts)])
        assert first["cached"] == 0
        assert all(r["cached"] in (0, CHUNK) for r in results)
        # Another prompt takes the one slot: the warm prompt's chunk is gone,
        # so it misses, is inserted again, and then hits.
        other = generate(stub, pb2, prompts[1], "none", "other")
        again = generate(stub, pb2, prompts[0], "none", "again")
        hit = generate(stub, pb2, prompts[0], "none", "hit")
        assert again["cached"] == 0
        assert hit["cached"] == CHUNK
        assert hit["tokens"] == again["tokens"] == first["tokens"]
        done = [first, *results, other, again, hit]
        reported = sum(r["cached"] for r in done)
        hits = sum(1 for r in done if r["cached"] > 0)

    assert wait_for(lambda: metrics.idle(server.metrics_text()), timeout=10), \
        server.metrics_text()
    text = server.metrics_text()
    assert metrics.value(text, "snapserve_prefix_cache_hit_tokens_total") == reported
    assert metrics.value(text, "snapserve_prefix_cache_hits_total") == hits
    # Full (one slot, one chunk) and never beyond.
    assert metrics.value(text, "snapserve_prefix_cache_usage_ratio") == 1.0


def test_a_step_grid_off_the_chunk_grid_is_refused(start_server, model_path):
    server = start_server([f"--model={model_path}", "--prefix-cache-memory=0.2",
                           "--max-step-tokens=300"], wait=False)
    assert server.proc.wait(timeout=120) != 0
    assert "must be a multiple of its 256-token chunks" in server.logs(), server.logs()
