"""--kv-cache-dtype through the real server (the model-level accuracy of a
bfloat16 cache is in test_model_parity.py,
test_real_paged_decode_with_kv_cache_dtype)."""
import os

import grpc

from test_server_e2e import BLOCK_SIZE, KV_CACHE_BYTES, KV_CACHE_TOKENS, LONG_PROMPT


def test_bfloat16_kv_cache_holds_twice_the_tokens_and_serves(start_server, model_path, pb):
    """--kv-cache-dtype=bfloat16 under a float32 model: the same memory holds
    twice the blocks, ModelInfo says so, and requests are served."""
    pb2, pb2_grpc = pb
    server = start_server([f"--model={model_path}", "--kv-cache-dtype=bfloat16",
                           f"--kv-cache-memory={KV_CACHE_BYTES}", f"--block-size={BLOCK_SIZE}"])
    with grpc.insecure_channel(server.target) as ch:
        stub = pb2_grpc.GenerationStub(ch)
        info = stub.GetModelInfo(pb2.GetModelInfoRequest(), timeout=10)
        assert (info.dtype, info.kv_cache_dtype) == ("float32", "bfloat16")
        assert info.kv_cache_capacity_tokens == 2 * KV_CACHE_TOKENS
        r = stub.Generate(pb2.GenerateRequest(
            prompt=LONG_PROMPT, stopping=pb2.StoppingCriteria(max_new_tokens=8, ignore_eos=True)),
            timeout=120)
        assert r.finish_reason == pb2.LENGTH and len(r.token_ids) == 8
    assert "tokens, bfloat16" in server.logs()  # the startup line: "(N tokens, bfloat16, ...)"


def test_int8_kv_cache_holds_more_tokens_and_serves(start_server, model_path, pb):
    """--kv-cache-dtype=int8: a value is 1 byte plus a float32 scale per 16
    (1.25 bytes), so the same memory holds 3.2 times a float32 cache's blocks
    (rounded down to whole blocks); ModelInfo says so; requests are served,
    and greedy tokens start as the float32 cache's do."""
    pb2, pb2_grpc = pb
    request = pb2.GenerateRequest(
        prompt=LONG_PROMPT, stopping=pb2.StoppingCriteria(max_new_tokens=8, ignore_eos=True))
    tokens = {}
    for kv in ("float32", "int8"):
        server = start_server([f"--model={model_path}", f"--kv-cache-dtype={kv}",
                               f"--kv-cache-memory={KV_CACHE_BYTES}", f"--block-size={BLOCK_SIZE}"])
        with grpc.insecure_channel(server.target) as ch:
            stub = pb2_grpc.GenerationStub(ch)
            info = stub.GetModelInfo(pb2.GetModelInfoRequest(), timeout=10)
            assert info.kv_cache_dtype == kv
            if kv == "int8":
                blocks = KV_CACHE_TOKENS * 32 // 10 // BLOCK_SIZE
                assert info.kv_cache_capacity_tokens // BLOCK_SIZE in (blocks - 1, blocks)
            r = stub.Generate(request, timeout=120)
            assert r.finish_reason == pb2.LENGTH and len(r.token_ids) == 8
            tokens[kv] = list(r.token_ids)
        server.stop()
    assert tokens["int8"][:2] == tokens["float32"][:2], tokens



def _own_threads(pid):
    """The server's threads that carry its name: the main thread, the engine's and the
    OpenMP pool's. gRPC names its own (event_engine, grpcpp_sync_ser, ...), and its pools
    grow and shrink with load, so a count of every thread failed now and then on a busy
    machine."""
    names = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                names.append(f.read().strip())
        except FileNotFoundError:  # the thread ended meanwhile
            pass
    return names.count("snapserve")


def test_prefaulted_cache_leaves_no_openmp_team_behind(start_server, model_path, pb):
    """--kv-cache-prefault=true writes the whole cache at start with LibTorch's
    parallel fill. Done on the main thread, that left an OpenMP team there
    beside the scheduler's: libgomp then saw more pool threads than cores,
    slept at every barrier, and decode ran at 0.4x (docs/kv-cache-and-
    scheduling.md). The engine now creates the cache on a thread that ends,
    so a prefaulted server runs exactly the threads of one without, before
    and after serving a request (its own threads: gRPC's come and go)."""
    pb2, pb2_grpc = pb
    counts = {}
    for prefault in ("false", "true"):
        server = start_server([f"--model={model_path}", f"--kv-cache-prefault={prefault}",
                               "--threads=2", f"--kv-cache-memory={KV_CACHE_BYTES}",
                               f"--block-size={BLOCK_SIZE}"])
        at_start = _own_threads(server.pid)
        with grpc.insecure_channel(server.target) as ch:
            r = pb2_grpc.GenerationStub(ch).Generate(pb2.GenerateRequest(
                prompt=LONG_PROMPT,
                stopping=pb2.StoppingCriteria(max_new_tokens=4, ignore_eos=True)), timeout=120)
            assert len(r.token_ids) == 4
        counts[prefault] = (at_start, _own_threads(server.pid))
        if prefault == "true":
            assert "prefaulted" in server.logs()
    assert counts["true"] == counts["false"], counts
