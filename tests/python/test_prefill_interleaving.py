"""Chunked prefill mixed with decode (engine/scheduler/step_planner.h,
--max-step-tokens): while a stream is decoding, a long prompt that arrives is
prefilled in chunks of tokens, one chunk per step beside the running stream's
decode token, instead of stopping that stream for its whole prefill.

What is observed is the order of events, not their speed: how many tokens a
running stream A receives between the moment a long-prompt request B is sent
and the moment B's answer arrives. With --max-step-tokens=128 and a
1500-token prompt, each step runs A's decode token and a 128-token chunk of
B's prompt, so B takes ceil(1500 / 128) = 12 steps and A gets a token in each;
with a budget larger than the prompt, B runs in one step and A gets at most a
token or two in that window. B's own greedy token and what SnapKV keeps are
the same either way, and a deadline that passes in the middle of B's prefill
frees its blocks.
"""
import contextlib
import pathlib
import threading
import time

import grpc
import pytest

from snapserve_testkit import metrics

GPL = pathlib.Path("/usr/share/common-licenses/GPL-3")
LONG_PROMPT_TOKENS = 1500
STEP_TOKENS = 128
WHOLE = 4096  # larger than the prompt: B runs in one step
CHUNKS = -(-LONG_PROMPT_TOKENS // STEP_TOKENS)  # 12 steps beside A
# Waits longer than this count as a hang (far above any real step time).
HANG_S = 120


def _metric(port, name):
    return metrics.value(metrics.scrape(port, timeout=5), name)


class RunningStream:
    """Stream A: a short prompt generating until cancelled; records when each
    message arrives."""

    def __init__(self, stub, pb2):
        self.times = []
        self.call = stub.GenerateStream(pb2.GenerateRequest(
            request_id="running-a", prompt="Count slowly:",
            kv_compression=pb2.KvCompression(method=pb2.KvCompression.NONE),
            stopping=pb2.StoppingCriteria(max_new_tokens=3000, ignore_eos=True)), timeout=600)
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self):
        try:
            for _ in self.call:
                self.times.append(time.monotonic())
        except grpc.RpcError:
            pass  # cancelled at the end of the test

    def wait_started(self, tokens=3, timeout=HANG_S):
        end = time.monotonic() + timeout
        while len(self.times) < tokens:
            assert time.monotonic() < end, "stream A never started"
            time.sleep(0.05)

    def tokens_between(self, t0, t1):
        return sum(1 for t in self.times if t0 <= t <= t1)

    def stop(self):
        self.call.cancel()
        self.thread.join(timeout=30)


def _long_request(pb2, stub, rid, **kw):
    ids = stub.Tokenize(pb2.TokenizeRequest(text=GPL.read_text()), timeout=30).ids
    return pb2.GenerateRequest(
        request_id=rid, input_ids=pb2.TokenIds(ids=ids[:LONG_PROMPT_TOKENS]),
        kv_compression=pb2.KvCompression(method=pb2.KvCompression.SNAPKV,
                                         max_capacity_prompt=256, window_size=32),
        stopping=pb2.StoppingCriteria(max_new_tokens=1, ignore_eos=True), **kw)


@contextlib.contextmanager
def _long_request_beside_running_stream(server, pb, rid):
    """Yields (stub, B's long-prompt request, A already streaming); A is
    cancelled on exit."""
    pb2, pb2_grpc = pb
    with grpc.insecure_channel(server.target) as ch:
        stub = pb2_grpc.GenerationStub(ch)
        request = _long_request(pb2, stub, rid)
        a = RunningStream(stub, pb2)
        try:
            a.wait_started()
            yield stub, request, a
        finally:
            a.stop()


def _overlap(server, pb):
    """Returns (tokens A got while B ran, B's response)."""
    with _long_request_beside_running_stream(server, pb, "long-b") as (stub, request, a):
        t0 = time.monotonic()
        b = stub.Generate(request, timeout=600)
        t1 = time.monotonic()
    return a.tokens_between(t0, t1), b


@pytest.fixture(scope="module")
def servers(start_module_server, model_path):
    common = [f"--model={model_path}", "--shutdown-grace=5"]
    return {budget: start_module_server(common + [f"--max-step-tokens={budget}"])
            for budget in (STEP_TOKENS, WHOLE)}


@pytest.mark.slow
def test_running_stream_keeps_decoding_during_a_long_prefill(servers, pb):
    chunked, b_chunked = _overlap(servers[STEP_TOKENS], pb)
    whole, b_whole = _overlap(servers[WHOLE], pb)
    # One decode token of A per step of B; a little slack for the boundaries.
    assert chunked >= CHUNKS - 2, f"A got {chunked} tokens during B's {CHUNKS}-chunk prefill"
    assert whole <= 3, f"A got {whole} tokens while B's prefill ran whole"
    # Chunking changes when tokens run, not what is kept or generated.
    assert list(b_chunked.token_ids) == list(b_whole.token_ids)
    assert b_chunked.usage.kv_kept_entries == b_whole.usage.kv_kept_entries == 256


@pytest.mark.slow
def test_deadline_in_the_middle_of_a_chunked_prefill_frees_blocks(servers, pb):
    server = servers[STEP_TOKENS]
    total = _metric(server.metrics_port, "snapserve_kv_cache_blocks_free")
    with _long_request_beside_running_stream(server, pb, "late-b-whole") as (stub, whole, a):
        # B's whole chunked prefill is timed on this machine first, so that a
        # quarter of it lands in the middle of B's chunks on a fast machine as
        # on a slow one. Should B still finish within it (the machine sped
        # up), the deadline is cut to a quarter again; the checks below hold
        # wherever it falls.
        t0 = time.monotonic()
        stub.Generate(whole, timeout=600)
        deadline = (time.monotonic() - t0) / 4
        late = type(whole)()
        late.CopyFrom(whole)
        for attempt in range(6):
            late.request_id = f"late-b-{attempt}"
            try:
                stub.Generate(late, timeout=deadline)
            except grpc.RpcError as err:
                assert err.code() == grpc.StatusCode.DEADLINE_EXCEEDED, err.details()
                break
            deadline /= 4
        else:
            pytest.fail("B finished within every deadline tried")
        # A keeps going after B's deadline.
        seen = len(a.times)
        end = time.monotonic() + HANG_S
        while len(a.times) < seen + 2:
            assert time.monotonic() < end, "stream A stopped after B's deadline"
            time.sleep(0.05)
    end = time.monotonic() + HANG_S
    while _metric(server.metrics_port, "snapserve_kv_cache_blocks_free") != total:
        assert time.monotonic() < end, "blocks not freed after the deadline and the cancel"
        time.sleep(0.2)
    assert _metric(server.metrics_port, "snapserve_requests_running") == 0
