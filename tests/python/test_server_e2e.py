"""The Generation service end to end: a real `snapserve` process serving the
real SmolLM2 GGUF, real grpcio clients (docs/api.md, docs/metrics.md,
docs/testing-and-measuring.md).

Oracles: transformers' greedy continuation of the same GGUF, the server's own
Tokenize for prompt lengths, the status-code table of docs/api.md, and the
/metrics text (free blocks back to the total after cancellations and deadlines).

Most tests share one module-scoped server (loading takes seconds on the CPU);
engine faults and SIGTERM, which need servers of their own, are in
test_server_faults.py. Prompts and generation lengths are kept small:
a decode step of the 135M model costs tens of milliseconds on two cores.
"""
import json
import math
import os
import random
import threading

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from snapserve_testkit import SnapserveProcess
from snapserve_testkit.calls import check_serves, stream_all, wait_for
from snapserve_testkit.metrics import scrape, value as metric

# Server settings the assertions below rely on.
SNAPKV_CAPACITY = 64
SNAPKV_WINDOW = 16
BLOCK_SIZE = 16
# 128 blocks of 16 tokens: 30 layers x 3 KV heads x 64 dims x (K, V) x 4 bytes
# = 46080 bytes per token, so 2048 tokens. Small enough that one request can
# be larger than the whole cache (RESOURCE_EXHAUSTED) within the context length.
KV_CACHE_TOKENS = 2048
KV_CACHE_BYTES = KV_CACHE_TOKENS * 46080
MAX_BATCH = 8
MAX_QUEUE = 24
MAX_NEW_LIMIT = 4096
DEFAULT_MAX_NEW = 8

SHORT_PROMPT = "The capital of France is"
# About 100 tokens: longer than SNAPKV_CAPACITY, cheap to prefill.
LONG_PROMPT = ("Snapserve compresses the key value cache of each prompt before decoding. "
               "It keeps the positions that the last tokens of the prompt attend to most, "
               "pooled over a small kernel, and always keeps the observation window itself. "
               "Long documents then cost far less memory while the answer stays the same. ") * 2


@pytest.fixture(scope="module")
def server(model_path):
    s = SnapserveProcess([
        f"--model={model_path}",
        f"--kv-capacity={SNAPKV_CAPACITY}", f"--kv-window={SNAPKV_WINDOW}",
        f"--kv-cache-memory={KV_CACHE_BYTES}", f"--block-size={BLOCK_SIZE}",
        f"--max-batch-size={MAX_BATCH}", f"--max-queue={MAX_QUEUE}",
        f"--max-new-tokens-limit={MAX_NEW_LIMIT}", f"--default-max-new-tokens={DEFAULT_MAX_NEW}",
        "--shutdown-grace=5",
    ])
    try:
        s.wait_serving()
        yield s
    finally:
        s.stop()


@pytest.fixture(scope="module")
def channel(server):
    with grpc.insecure_channel(server.target) as ch:
        yield ch


@pytest.fixture(scope="module")
def stub(channel, pb):
    return pb[1].GenerationStub(channel)


@pytest.fixture(scope="module")
def info(stub, pb):
    return stub.GetModelInfo(pb[0].GetModelInfoRequest(), timeout=10)


def tokenize(stub, pb, text):
    return list(stub.Tokenize(pb[0].TokenizeRequest(text=text, add_special_tokens=True),
                              timeout=10).ids)


def check_good_request(stub, pb):
    """The server still answers a small valid request correctly."""
    check_serves(stub, pb[0], SHORT_PROMPT)


# ------------------------------------------------------- unary == stream ---

def check_usage(pb2, usage, token_ids, prompt_tokens, capacity):
    assert usage.completion_tokens == len(token_ids)
    assert usage.prompt_tokens == prompt_tokens
    assert usage.kv_prompt_entries == prompt_tokens
    assert usage.kv_kept_entries == min(prompt_tokens, capacity)
    assert usage.compression_ratio == pytest.approx(
        usage.kv_prompt_entries / usage.kv_kept_entries, rel=1e-6)
    assert 0 <= usage.queue_ms <= usage.time_to_first_token_ms <= usage.total_ms


@pytest.mark.parametrize("prompt", [SHORT_PROMPT, LONG_PROMPT], ids=["short", "snapkv"])
def test_unary_and_stream_agree(stub, pb, prompt):
    pb2 = pb[0]
    prompt_ids = tokenize(stub, pb, prompt)
    request = pb2.GenerateRequest(prompt=prompt,
                                  stopping=pb2.StoppingCriteria(max_new_tokens=12, ignore_eos=True))
    unary = stub.Generate(request, timeout=60)
    assert unary.finish_reason == pb2.LENGTH
    assert len(unary.token_ids) == 12
    check_usage(pb2, unary.usage, unary.token_ids, len(prompt_ids), SNAPKV_CAPACITY)

    messages = stream_all(stub, request)
    assert len(messages) >= 2
    *deltas, last = messages
    # Only the last message carries finish_reason and usage; it has no delta.
    for m in deltas:
        assert m.finish_reason == pb2.FINISH_REASON_UNSPECIFIED
        assert not m.HasField("usage")
        assert m.token_ids or m.text
    assert last.finish_reason == pb2.LENGTH
    assert last.HasField("usage")
    assert not last.token_ids and not last.text
    streamed_ids = [t for m in messages for t in m.token_ids]
    assert streamed_ids == list(unary.token_ids)
    assert "".join(m.text for m in messages) == unary.text
    check_usage(pb2, last.usage, streamed_ids, len(prompt_ids), SNAPKV_CAPACITY)
    # Every message names the request.
    assert len({m.request_id for m in messages}) == 1 and messages[0].request_id


def test_input_ids_and_chat_inputs(stub, pb):
    pb2 = pb[0]
    ids = tokenize(stub, pb, SHORT_PROMPT)
    stopping = pb2.StoppingCriteria(max_new_tokens=4, ignore_eos=True)
    by_text = stub.Generate(pb2.GenerateRequest(prompt=SHORT_PROMPT, stopping=stopping), timeout=60)
    by_ids = stub.Generate(pb2.GenerateRequest(input_ids=pb2.TokenIds(ids=ids), stopping=stopping),
                           timeout=60)
    assert list(by_ids.token_ids) == list(by_text.token_ids)
    assert by_ids.usage.prompt_tokens == len(ids)

    chat = stub.Generate(pb2.GenerateRequest(
        messages=pb2.ChatMessages(messages=[pb2.ChatMessage(role="user", content="Hi!")]),
        stopping=stopping), timeout=60)
    assert len(chat.token_ids) == 4
    assert chat.usage.prompt_tokens > len(tokenize(stub, pb, "Hi!"))  # the template adds turns


def test_default_max_new_tokens_applies(stub, pb):
    pb2 = pb[0]
    r = stub.Generate(pb2.GenerateRequest(prompt=SHORT_PROMPT,
                                          stopping=pb2.StoppingCriteria(ignore_eos=True)),
                      timeout=60)
    assert len(r.token_ids) == DEFAULT_MAX_NEW
    assert r.finish_reason == pb2.LENGTH


def test_stop_sequence_and_stop_token(stub, pb):
    pb2 = pb[0]
    base = stub.Generate(pb2.GenerateRequest(
        prompt=SHORT_PROMPT, stopping=pb2.StoppingCriteria(max_new_tokens=8, ignore_eos=True)),
        timeout=60)
    assert len(base.token_ids) >= 3
    # Stop on the third generated token: it is not part of the output.
    third = base.token_ids[2]
    r = stub.Generate(pb2.GenerateRequest(prompt=SHORT_PROMPT, stopping=pb2.StoppingCriteria(
        max_new_tokens=8, ignore_eos=True, stop_token_ids=[third])), timeout=60)
    first = list(base.token_ids).index(third)
    assert r.finish_reason == pb2.STOP_TOKEN
    assert list(r.token_ids) == list(base.token_ids[:first])
    assert r.usage.completion_tokens == len(r.token_ids)

    # Stop on a piece of text the greedy output contains: the text ends before it.
    text = base.text
    needle = text.strip()[:3] if len(text.strip()) >= 3 else text
    assert needle
    for stream in (False, True):
        request = pb2.GenerateRequest(prompt=SHORT_PROMPT, stopping=pb2.StoppingCriteria(
            max_new_tokens=8, ignore_eos=True, stop=[needle]))
        if stream:
            messages = stream_all(stub, request)
            out = "".join(m.text for m in messages)
            reason = messages[-1].finish_reason
        else:
            r = stub.Generate(request, timeout=60)
            out, reason = r.text, r.finish_reason
        assert reason == pb2.STOP_SEQUENCE
        assert out == text[:text.index(needle)]
        assert needle not in out


# ------------------------------------------------------- greedy oracle ---

def test_greedy_matches_transformers(stub, pb, model_path):
    """Greedy continuation token-identical to transformers on the same GGUF,
    from the same input ids (so only the model is compared)."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    import torch
    from transformers import AutoModelForCausalLM
    pb2 = pb[0]
    steps = 16
    ids = tokenize(stub, pb, SHORT_PROMPT)
    r = stub.Generate(pb2.GenerateRequest(
        prompt=SHORT_PROMPT,
        stopping=pb2.StoppingCriteria(max_new_tokens=steps, ignore_eos=True),
        kv_compression=pb2.KvCompression(method=pb2.KvCompression.NONE)), timeout=120)
    assert r.usage.prompt_tokens == len(ids)

    # One intra-op thread: the machine is shared with the server under test,
    # and an oversubscribed OpenMP pool makes these tiny forwards crawl.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        hf = AutoModelForCausalLM.from_pretrained(
            str(model_path.parent), gguf_file=model_path.name, dtype=torch.float32).eval()
        expected = []
        seq = list(ids)
        with torch.no_grad():
            for _ in range(steps):
                nxt = int(hf(torch.tensor([seq])).logits[0, -1].argmax())
                expected.append(nxt)
                seq.append(nxt)
    finally:
        torch.set_num_threads(threads)
    assert list(r.token_ids) == expected


# ------------------------------------------------------------- SnapKV ---

def test_snapkv_through_the_api(stub, pb):
    pb2 = pb[0]
    ids = tokenize(stub, pb, LONG_PROMPT)
    n = len(ids)
    assert n > SNAPKV_CAPACITY
    stopping = pb2.StoppingCriteria(max_new_tokens=2, ignore_eos=True)

    def run(kv=None, input_ids=ids):
        request = pb2.GenerateRequest(input_ids=pb2.TokenIds(ids=input_ids), stopping=stopping)
        if kv is not None:
            request.kv_compression.CopyFrom(kv)
        return stub.Generate(request, timeout=120).usage

    # Server defaults (--kv-capacity / --kv-window).
    u = run()
    assert (u.kv_prompt_entries, u.kv_kept_entries) == (n, SNAPKV_CAPACITY)
    assert u.compression_ratio == pytest.approx(n / SNAPKV_CAPACITY, rel=1e-6)
    assert u.compression_ratio > 1
    # Per request: a smaller capacity, avg pooling.
    u = run(pb2.KvCompression(method=pb2.KvCompression.SNAPKV, window_size=8,
                              max_capacity_prompt=32, kernel_size=5,
                              pooling=pb2.KvCompression.AVG))
    assert (u.kv_prompt_entries, u.kv_kept_entries) == (n, 32)
    assert u.compression_ratio == pytest.approx(n / 32, rel=1e-6)
    # Method NONE keeps everything.
    u = run(pb2.KvCompression(method=pb2.KvCompression.NONE))
    assert (u.kv_prompt_entries, u.kv_kept_entries) == (n, n)
    assert u.compression_ratio == 1
    # A prompt no longer than the capacity is not compressed.
    u = run(input_ids=ids[:SNAPKV_CAPACITY])
    assert (u.kv_prompt_entries, u.kv_kept_entries) == (SNAPKV_CAPACITY, SNAPKV_CAPACITY)
    assert u.compression_ratio == 1


def test_model_info_reports_the_flags(info, pb):
    pb2 = pb[0]
    assert info.vocab_size == 49152
    assert info.max_new_tokens_limit == MAX_NEW_LIMIT
    assert info.max_batch_size == MAX_BATCH
    assert info.kv_cache_capacity_tokens == KV_CACHE_TOKENS
    kv = info.default_kv_compression
    assert kv.method == pb2.KvCompression.SNAPKV
    assert (kv.window_size, kv.max_capacity_prompt, kv.kernel_size) == \
        (SNAPKV_WINDOW, SNAPKV_CAPACITY, 7)
    assert kv.pooling == pb2.KvCompression.MAX
    assert info.dtype == "float32" and info.kv_cache_dtype == "float32"


# ------------------------------------------------------- bad requests ---

INVALID = grpc.StatusCode.INVALID_ARGUMENT
EXHAUSTED = grpc.StatusCode.RESOURCE_EXHAUSTED
VOCAB = 49152
MAX_CONTEXT = 8192


def _bad_requests(pb2):
    P = SHORT_PROMPT
    S = pb2.SamplingParams
    T = pb2.StoppingCriteria
    K = pb2.KvCompression
    R = pb2.GenerateRequest
    ids = pb2.TokenIds
    chat = pb2.ChatMessages
    msg = pb2.ChatMessage
    return [
        ("no_input", R(), INVALID, "input"),
        ("empty_prompt", R(prompt=""), INVALID, "prompt"),
        ("empty_input_ids", R(input_ids=ids()), INVALID, "input_ids"),
        ("token_id_eq_vocab", R(input_ids=ids(ids=[1, VOCAB])), INVALID, "input_ids.ids[1]"),
        ("token_id_max_uint32", R(input_ids=ids(ids=[2**32 - 1])), INVALID, "input_ids.ids[0]"),
        ("empty_messages", R(messages=chat()), INVALID, "messages"),
        ("unknown_role", R(messages=chat(messages=[msg(role="user", content="hi"),
                                                   msg(role="wizard", content="x")])),
         INVALID, "messages.messages[1].role"),
        ("empty_role", R(messages=chat(messages=[msg(role="", content="hi")])),
         INVALID, "messages.messages[0].role"),
        ("temperature_nan", R(prompt=P, sampling=S(temperature=math.nan)), INVALID,
         "sampling.temperature"),
        ("temperature_negative", R(prompt=P, sampling=S(temperature=-0.5)), INVALID,
         "sampling.temperature"),
        ("temperature_inf", R(prompt=P, sampling=S(temperature=math.inf)), INVALID,
         "sampling.temperature"),
        ("top_p_above_1", R(prompt=P, sampling=S(top_p=1.5)), INVALID, "sampling.top_p"),
        ("top_p_negative", R(prompt=P, sampling=S(top_p=-0.1)), INVALID, "sampling.top_p"),
        ("top_p_nan", R(prompt=P, sampling=S(top_p=math.nan)), INVALID, "sampling.top_p"),
        ("repetition_penalty_negative", R(prompt=P, sampling=S(repetition_penalty=-1.0)), INVALID,
         "sampling.repetition_penalty"),
        ("repetition_penalty_nan", R(prompt=P, sampling=S(repetition_penalty=math.nan)), INVALID,
         "sampling.repetition_penalty"),
        ("kernel_even", R(prompt=P, kv_compression=K(kernel_size=4)), INVALID,
         "kv_compression.kernel_size"),
        ("kernel_wider_than_context", R(prompt=P, kv_compression=K(kernel_size=MAX_CONTEXT + 1)),
         INVALID, "kv_compression.kernel_size"),
        ("window_eq_capacity", R(prompt=P, kv_compression=K(window_size=32,
                                                            max_capacity_prompt=32)),
         INVALID, "kv_compression.window_size"),
        ("window_above_capacity", R(prompt=P, kv_compression=K(window_size=SNAPKV_CAPACITY + 1)),
         INVALID, "kv_compression.window_size"),
        ("capacity_below_default_window", R(prompt=P, kv_compression=K(max_capacity_prompt=8)),
         INVALID, "kv_compression.window_size"),
        ("capacity_above_context", R(prompt=P, kv_compression=K(
            max_capacity_prompt=MAX_CONTEXT + 1)), INVALID, "kv_compression.max_capacity_prompt"),
        ("window_uint32_max", R(prompt=P, kv_compression=K(window_size=2**32 - 1)), INVALID,
         "kv_compression.window_size"),
        ("unknown_kv_method", R(prompt=P, kv_compression=K(method=7)), INVALID,
         "kv_compression.method"),
        ("unknown_pooling", R(prompt=P, kv_compression=K(pooling=9)), INVALID,
         "kv_compression.pooling"),
        ("prompt_plus_max_new_over_context",
         R(input_ids=ids(ids=[42] * (MAX_CONTEXT - 50)), stopping=T(max_new_tokens=100)),
         INVALID, "stopping.max_new_tokens"),
        ("max_new_tokens_over_limit", R(prompt=P, stopping=T(max_new_tokens=MAX_NEW_LIMIT + 1)),
         INVALID, "stopping.max_new_tokens"),
        ("too_many_stop_sequences", R(prompt=P, stopping=T(stop=[f"s{i}" for i in range(17)])),
         INVALID, "stopping.stop"),
        ("stop_sequence_too_long", R(prompt=P, stopping=T(stop=["x" * 257])), INVALID,
         "stopping.stop[0]"),
        ("empty_stop_sequence", R(prompt=P, stopping=T(stop=["ok", ""])), INVALID,
         "stopping.stop[1]"),
        ("stop_token_id_eq_vocab", R(prompt=P, stopping=T(stop_token_ids=[2, VOCAB])), INVALID,
         "stopping.stop_token_ids[1]"),
        ("too_many_stop_token_ids", R(prompt=P, stopping=T(stop_token_ids=list(range(257)))),
         INVALID, "stopping.stop_token_ids"),
        ("request_id_too_long", R(request_id="r" * 257, prompt=P), INVALID, "request_id"),
        # min(n, C) + max_new_tokens entries can never fit in a 2048-token cache.
        ("larger_than_kv_cache", R(prompt=P, stopping=T(max_new_tokens=KV_CACHE_TOKENS)),
         EXHAUSTED, "KV"),
        ("larger_than_kv_cache_uncompressed",
         R(input_ids=ids(ids=[42] * (KV_CACHE_TOKENS + 1)), stopping=T(max_new_tokens=1),
           kv_compression=K(method=K.NONE)), EXHAUSTED, "KV"),
    ]


BAD_CASE_NAMES = [
    "no_input", "empty_prompt", "empty_input_ids", "token_id_eq_vocab", "token_id_max_uint32",
    "empty_messages", "unknown_role", "empty_role", "temperature_nan", "temperature_negative",
    "temperature_inf", "top_p_above_1", "top_p_negative", "top_p_nan",
    "repetition_penalty_negative", "repetition_penalty_nan", "kernel_even",
    "kernel_wider_than_context", "window_eq_capacity", "window_above_capacity",
    "capacity_below_default_window", "capacity_above_context", "window_uint32_max",
    "unknown_kv_method", "unknown_pooling", "prompt_plus_max_new_over_context",
    "max_new_tokens_over_limit", "too_many_stop_sequences", "stop_sequence_too_long",
    "empty_stop_sequence",
    "stop_token_id_eq_vocab", "too_many_stop_token_ids", "request_id_too_long",
    "larger_than_kv_cache", "larger_than_kv_cache_uncompressed",
]


def test_bad_request_table_is_complete(pb):
    assert [c[0] for c in _bad_requests(pb[0])] == BAD_CASE_NAMES
    assert len(BAD_CASE_NAMES) >= 25


@pytest.mark.parametrize("name", BAD_CASE_NAMES)
def test_bad_request(stub, pb, server, name):
    pb2 = pb[0]
    (_, request, code, field), = [c for c in _bad_requests(pb2) if c[0] == name]
    with pytest.raises(grpc.RpcError) as unary:
        stub.Generate(request, timeout=30)
    assert unary.value.code() == code, unary.value.details()
    assert field in unary.value.details(), unary.value.details()

    with pytest.raises(grpc.RpcError) as streamed:
        stream_all(stub, request, timeout=30)
    assert streamed.value.code() == code, streamed.value.details()
    assert field in streamed.value.details(), streamed.value.details()

    assert server.proc.poll() is None
    check_good_request(stub, pb)


def test_echoed_client_strings_are_bounded(stub, pb, server):
    """A client's strings reach error messages and log lines bounded
    (engine/common/bounded_text.h): their start, an ellipsis and the length."""
    pb2 = pb[0]
    role = "wizard" * 100_000  # 600 kB: under the 1 MiB input bound of CheckInputBytes
    chat = pb2.ChatMessages(messages=[pb2.ChatMessage(role=role, content="hi")])
    with pytest.raises(grpc.RpcError) as err:
        stub.Generate(pb2.GenerateRequest(request_id="bounded-role", messages=chat), timeout=30)
    details = err.value.details()
    assert err.value.code() == INVALID and "messages.messages[0].role" in details, details[:300]
    assert f"({len(role)} bytes)" in details and len(details) < 500, details[:600]

    request_id = "bounded-id-" + "r" * (1 << 20)
    with pytest.raises(grpc.RpcError) as err:
        stub.Generate(pb2.GenerateRequest(request_id=request_id, prompt=SHORT_PROMPT), timeout=30)
    assert err.value.code() == INVALID and len(err.value.details()) < 500

    def complete_lines():
        lines = [line for line in server.logs().splitlines() if "inference_complete" in line]
        mine = [line for line in lines if '"bounded-role"' in line or '"bounded-id-' in line]
        return mine if len(mine) == 2 else None
    lines = wait_for(complete_lines, timeout=5)
    assert lines, server.logs()[-2000:]
    for line in lines:
        assert len(line) < 2000, line[:300]
    logged_id = json.loads([line for line in lines if '"bounded-id-' in line][0])["request_id"]
    assert logged_id.startswith("bounded-id-rrrr")
    assert logged_id.endswith(f"({len(request_id)} bytes)"), logged_id[-40:]
    check_good_request(stub, pb)


def test_huge_input_is_refused_before_tokenizing(stub, pb, info):
    """Text that cannot fit the context (more than max_context x 128 bytes,
    engine/request_validation.h) is INVALID_ARGUMENT naming the byte limit:
    the check on the text's bytes refuses it, not the context check after
    tokenizing (15 MiB used to be tokenized first, seconds of the gRPC
    thread's time)."""
    pb2 = pb[0]
    limit = info.max_context_length * 128
    text = ("The quick brown fox jumps over the lazy dog. " * 400_000)[:15 << 20]
    chat = pb2.ChatMessages(messages=[pb2.ChatMessage(role="user", content=text)])
    for request, field in [(pb2.GenerateRequest(prompt=text), "prompt"),
                           (pb2.GenerateRequest(messages=chat), "messages")]:
        for call in (lambda r: stub.Generate(r, timeout=60),
                     lambda r: stream_all(stub, r, timeout=60)):
            with pytest.raises(grpc.RpcError) as err:
                call(request)
            details = err.value.details()
            assert err.value.code() == INVALID, details
            assert details.startswith(field + ":") and str(limit) in details, details
            assert "bytes of text cannot fit the context" in details, details
    # Just under the bound the text is tokenized and refused by the context check.
    with pytest.raises(grpc.RpcError) as err:
        stub.Generate(pb2.GenerateRequest(prompt=text[:limit]), timeout=120)
    assert err.value.code() == INVALID and "stopping.max_new_tokens" in err.value.details()
    check_good_request(stub, pb)


def test_duplicate_request_id_in_flight(stub, pb):
    pb2 = pb[0]
    rid = "dup-id-1"
    first = stub.GenerateStream(pb2.GenerateRequest(
        request_id=rid, prompt=SHORT_PROMPT,
        stopping=pb2.StoppingCriteria(max_new_tokens=40, ignore_eos=True)), timeout=60)
    next(first)  # running now
    try:
        with pytest.raises(grpc.RpcError) as err:
            stub.Generate(pb2.GenerateRequest(request_id=rid, prompt=SHORT_PROMPT), timeout=30)
        assert err.value.code() == INVALID
        assert "request_id" in err.value.details()
    finally:
        first.cancel()
    # Once the first call ended, the id is free again.
    assert wait_for(lambda: _try_generate(stub, pb2, rid), timeout=10)


def _try_generate(stub, pb2, rid):
    try:
        r = stub.Generate(pb2.GenerateRequest(request_id=rid, prompt=SHORT_PROMPT,
                                              stopping=pb2.StoppingCriteria(max_new_tokens=1)),
                          timeout=30)
        return r.request_id == rid
    except grpc.RpcError as e:
        assert e.code() == INVALID, e.details()
        return False


# ------------------------------------------------------- request ids ---

def test_request_id_echoed_and_generated(stub, pb, server):
    pb2 = pb[0]
    stopping = pb2.StoppingCriteria(max_new_tokens=2)
    r = stub.Generate(pb2.GenerateRequest(request_id="my-id-42", prompt=SHORT_PROMPT,
                                          stopping=stopping), timeout=60)
    assert r.request_id == "my-id-42"
    messages = stream_all(stub, pb2.GenerateRequest(request_id="my-id-43", prompt=SHORT_PROMPT,
                                                    stopping=stopping))
    assert {m.request_id for m in messages} == {"my-id-43"}

    generated = set()
    for _ in range(2):
        r = stub.Generate(pb2.GenerateRequest(prompt=SHORT_PROMPT, stopping=stopping), timeout=60)
        assert r.request_id
        generated.add(r.request_id)
        messages = stream_all(stub, pb2.GenerateRequest(prompt=SHORT_PROMPT, stopping=stopping))
        ids = {m.request_id for m in messages}
        assert len(ids) == 1 and "" not in ids
        generated |= ids
    assert len(generated) == 4  # fresh ids, never reused
    # One JSON log line per finished request, with the fields of docs/metrics.md, "Logs".
    def log_line():
        for line in server.logs().splitlines():
            if '"my-id-42"' in line and "inference_complete" in line:
                return json.loads(line)
        return None
    line = wait_for(log_line, timeout=5)
    assert line, server.logs()[-2000:]
    assert line["event"] == "inference_complete" and line["status"] == "OK"
    for field in ("request_id", "finish_reason", "prompt_tokens", "completion_tokens",
                  "kv_original_size", "kv_compressed_size", "compression_ratio", "queue_ms",
                  "ttft_ms", "duration_ms"):
        assert field in line, field
    assert line["completion_tokens"] == 2 and line["finish_reason"] in ("LENGTH", "EOS")


def test_never_unavailable_while_serving(stub, pb, channel, server):
    pb2 = pb[0]
    health = health_pb2_grpc.HealthStub(channel)
    assert health.Check(health_pb2.HealthCheckRequest(), timeout=5).status == \
        health_pb2.HealthCheckResponse.SERVING
    stub.GetModelInfo(pb2.GetModelInfoRequest(), timeout=10)
    stub.Tokenize(pb2.TokenizeRequest(text="hi"), timeout=10)
    check_good_request(stub, pb)
    text = scrape(server.metrics_port)
    assert metric(text, "snapserve_requests_total", {"status": "UNAVAILABLE"}) == 0
    assert metric(text, "snapserve_requests_total", {"status": "INTERNAL"}) == 0
    assert metric(text, "snapserve_requests_total", {"status": "OK"}) > 0


# ------------------------------------------------ concurrency and cleanup ---

def test_64_streams_with_cancellations_and_deadlines(stub, pb, server, info):
    pb2 = pb[0]
    rng = random.Random(1234)
    before = scrape(server.metrics_port)
    codes_before = {c: metric(before, "snapserve_requests_total", {"status": c})
                    for c in ("OK", "CANCELLED", "DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED")}

    # The cut-short kinds ask for far more tokens than a stream makes before
    # its deadline or its cancel, so they end cut short however fast the
    # server is: a cancel comes right after the stream's first message, and
    # 1000 tokens take longer than the 2.5 s deadline even alone (and two such
    # requests fill the 2048-token cache, so the others wait in the queue).
    n_calls = 64
    long_max_new = 1000
    plans = []
    for i in range(n_calls):
        kind = ["plain", "cancel", "deadline"][i % 3]
        plans.append({
            "kind": kind,
            "max_new": rng.randint(3, 10) if kind == "plain" else long_max_new,
            "prompt": f"Request {i}: count with me, one two three",
            "timeout": rng.uniform(0.4, 2.5) if kind == "deadline" else 120,
        })
    results = [None] * n_calls
    start = threading.Barrier(n_calls)

    def run(i):
        p = plans[i]
        request = pb2.GenerateRequest(
            request_id=f"conc-{i}", prompt=p["prompt"],
            stopping=pb2.StoppingCriteria(max_new_tokens=p["max_new"], ignore_eos=True))
        start.wait()
        call = stub.GenerateStream(request, timeout=p["timeout"])
        messages = []
        try:
            for m in call:
                messages.append(m)
                if p["kind"] == "cancel":
                    call.cancel()
            results[i] = (grpc.StatusCode.OK, messages)
        except grpc.RpcError as e:
            results[i] = (e.code(), messages)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n_calls)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=240)
    assert not any(t.is_alive() for t in threads), "some streams never ended"

    allowed = {
        "plain": {grpc.StatusCode.OK, EXHAUSTED},
        "cancel": {grpc.StatusCode.OK, grpc.StatusCode.CANCELLED, EXHAUSTED},
        "deadline": {grpc.StatusCode.OK, grpc.StatusCode.DEADLINE_EXCEEDED, EXHAUSTED},
    }
    seen = {}
    for p, (code, messages) in zip(plans, results):
        assert code in allowed[p["kind"]], (p, code)
        seen[code] = seen.get(code, 0) + 1
        if code == grpc.StatusCode.OK:
            last = messages[-1]
            assert last.finish_reason == pb2.LENGTH
            ids = [t for m in messages for t in m.token_ids]
            assert len(ids) == p["max_new"] == last.usage.completion_tokens
    # The mix really happened: the queue overflowed, some were cut short.
    for code in (grpc.StatusCode.OK, grpc.StatusCode.CANCELLED,
                 grpc.StatusCode.DEADLINE_EXCEEDED, EXHAUSTED):
        assert seen.get(code, 0) > 0, (code, seen)

    # Every block is free again and nothing runs or waits (the gauges are
    # sampled every 200 ms).
    # A block holds BLOCK_SIZE entries of one layer and KV head.
    total_blocks = (info.kv_cache_capacity_tokens // BLOCK_SIZE * info.num_layers *
                    info.num_key_value_heads)

    def settled():
        t = scrape(server.metrics_port)
        return (metric(t, "snapserve_kv_cache_blocks_free") == total_blocks and
                metric(t, "snapserve_requests_running") == 0 and
                metric(t, "snapserve_requests_waiting") == 0 and t)
    after = wait_for(settled, timeout=5, interval=0.2)
    assert after, scrape(server.metrics_port)
    assert metric(after, "snapserve_kv_cache_usage_ratio") == 0

    # The server saw each call that reached it once; every OK and every
    # refusal the clients saw was counted by the server too.
    delta = {c: metric(after, "snapserve_requests_total", {"status": c}) - codes_before[c]
             for c in codes_before}
    assert sum(delta.values()) <= n_calls
    assert delta["OK"] >= seen.get(grpc.StatusCode.OK, 0)
    assert delta["RESOURCE_EXHAUSTED"] >= seen.get(EXHAUSTED, 0)
    # Only a client's own cancellation is CANCELLED on the server; a passed
    # deadline is DEADLINE_EXCEEDED there too.
    assert delta["CANCELLED"] <= seen.get(grpc.StatusCode.CANCELLED, 0)
    assert delta["DEADLINE_EXCEEDED"] >= 1
    assert metric(after, "snapserve_requests_total", {"status": "INTERNAL"}) == 0
    check_good_request(stub, pb)


def test_deadline_while_queued_and_running_frees_blocks(stub, pb, server, info):
    """A deadline that passes while the call waits in the queue, and one that
    passes mid-generation, each end with DEADLINE_EXCEEDED on both sides and
    free their blocks.

    The queued case is real: MAX_BATCH long streams fill the decode batch first
    (each has written a message, so each is admitted), so the next request
    waits; the waiting gauge shows it there while the batch is full, and it
    never writes a message. The fillers' reservations (prompt + 200 tokens,
    13 blocks each) fit the cache together, so the batch, not the KV cache,
    is what holds the request back."""
    pb2 = pb[0]
    token_blocks = info.kv_cache_capacity_tokens // BLOCK_SIZE  # blocks of every layer and head
    total_blocks = token_blocks * info.num_layers * info.num_key_value_heads
    filler_new = 200
    assert MAX_BATCH * math.ceil((len(tokenize(stub, pb, SHORT_PROMPT)) + filler_new) / BLOCK_SIZE) \
        <= token_blocks, "the fillers must be limited by the batch, not the KV cache"
    before = metric(scrape(server.metrics_port), "snapserve_requests_total",
                    {"status": "DEADLINE_EXCEEDED"})

    # Running: the stream starts, then its deadline passes mid-generation.
    # Should the deadline pass before the first token (a loaded machine), the
    # call is made again with twice the deadline: 1500 tokens take far longer
    # than any first token, so some deadline falls between the two.
    got = []
    deadline = 1.5
    running_calls = 0
    while not got:
        assert deadline < 100, "no stream wrote a message before its deadline"
        call = stub.GenerateStream(pb2.GenerateRequest(
            # 1500 tokens take seconds even on a fast host; the cache holds them.
            prompt=SHORT_PROMPT, stopping=pb2.StoppingCriteria(max_new_tokens=1500,
                                                               ignore_eos=True)),
            timeout=deadline)
        running_calls += 1
        with pytest.raises(grpc.RpcError) as err:
            for m in call:
                got.append(m)
        assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        deadline *= 2

    # Queued: fill the batch, then send one more with a short deadline.
    fillers = [stub.GenerateStream(pb2.GenerateRequest(
        prompt=SHORT_PROMPT, stopping=pb2.StoppingCriteria(max_new_tokens=filler_new,
                                                           ignore_eos=True)), timeout=120)
        for _ in range(MAX_BATCH)]
    started = [threading.Event() for _ in fillers]
    ended = [threading.Event() for _ in fillers]

    def drain(i):
        try:
            for _ in fillers[i]:
                started[i].set()
        except grpc.RpcError:
            pass
        finally:
            ended[i].set()
    threads = [threading.Thread(target=drain, args=(i,)) for i in range(MAX_BATCH)]
    for t in threads:
        t.start()
    try:
        assert all(e.wait(timeout=60) for e in started), "the fillers did not all start"
        queued = stub.GenerateStream(pb2.GenerateRequest(
            prompt=SHORT_PROMPT, stopping=pb2.StoppingCriteria(max_new_tokens=4)), timeout=3)

        def waiting_behind_full_batch():
            t = scrape(server.metrics_port)
            return (metric(t, "snapserve_requests_waiting") >= 1 and
                    metric(t, "snapserve_requests_running") == MAX_BATCH)
        assert wait_for(waiting_behind_full_batch, timeout=2.5, interval=0.1), \
            "the request never showed up in the waiting queue behind a full batch"
        got = []
        with pytest.raises(grpc.RpcError) as err:
            for m in queued:
                got.append(m)
        assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED, err.value.details()
        assert not got, "the queued request was admitted before its deadline"
        assert not any(e.is_set() for e in ended), \
            "a filler ended before the queued deadline: the batch was not full the whole time"
    finally:
        for f in fillers:
            f.cancel()
        for t in threads:
            t.join(timeout=30)

    def settled():
        t = scrape(server.metrics_port)
        return (metric(t, "snapserve_kv_cache_blocks_free") == total_blocks and
                metric(t, "snapserve_requests_running") == 0 and
                metric(t, "snapserve_requests_waiting") == 0 and t)
    after = wait_for(settled, timeout=60, interval=0.2)
    assert after, scrape(server.metrics_port)
    # The server names both causes as the deadline, not a client cancellation
    # (a running call retried with a longer deadline counts once more).
    assert metric(after, "snapserve_requests_total", {"status": "DEADLINE_EXCEEDED"}) \
        == before + running_calls + 1
    check_good_request(stub, pb)
