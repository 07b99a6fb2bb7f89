"""The batcher's core invariant (docs/kv-cache-and-scheduling.md, "Batching
invariance"): a request's greedy output is identical whether it ran alone or in
a batch with any others. 32 requests, prompts of 16-3000 tokens, random arrival
times, a mix of SnapKV budgets, AdaKV, PyramidKV, StreamingLLM and no
compression, through a real snapserve process."""
import random
import threading
import time

import grpc
import pytest

from snapserve_testkit import metrics

GPL = "/usr/share/common-licenses/GPL-3"




def make_requests(pb2, ids_source):
    rng = random.Random(1234)
    requests = []
    # Mostly short prompts plus a few long ones (up to 3000 tokens): the long
    # ones exercise SnapKV and long paged contexts, the short ones keep the
    # test affordable on 2 CPU cores.
    lengths = [rng.choice([16, 24, 40, 64, 100, 200, 300, 500, 800]) for _ in range(29)]
    lengths += [1500, 2200, 3000]
    rng.shuffle(lengths)
    for i, n in enumerate(lengths):
        start = rng.randrange(0, len(ids_source) - n)
        method = rng.choice(["none", "snapkv64", "snapkv256", "default", "adakv128",
                             "pyramidkv256", "streaming128"])
        kv = pb2.KvCompression()
        if method == "none":
            kv.method = pb2.KvCompression.NONE
        elif method == "snapkv64":
            kv.method = pb2.KvCompression.SNAPKV
            kv.max_capacity_prompt, kv.window_size = 64, 16
        elif method == "snapkv256":
            kv.method = pb2.KvCompression.SNAPKV
            kv.max_capacity_prompt, kv.window_size, kv.pooling = 256, 32, pb2.KvCompression.AVG
        elif method == "adakv128":  # per-head lengths in the same batch
            kv.method = pb2.KvCompression.ADAKV
            kv.max_capacity_prompt, kv.window_size = 128, 16
        elif method == "pyramidkv256":  # per-layer lengths in the same batch
            kv.method = pb2.KvCompression.PYRAMIDKV
            kv.max_capacity_prompt, kv.window_size, kv.pyramid_beta = 256, 8, 4
        elif method == "streaming128":
            kv.method = pb2.KvCompression.STREAMING_LLM
            kv.max_capacity_prompt = 128
        requests.append(pb2.GenerateRequest(
            request_id=f"inv-{i}",
            input_ids=pb2.TokenIds(ids=ids_source[start:start + n]),
            kv_compression=kv,
            stopping=pb2.StoppingCriteria(max_new_tokens=rng.choice([4, 6, 8]), ignore_eos=True)))
    return requests


# The default path, and the fast ones (int8 block dots at decode, bfloat16
# GEMMs and attention for prompts: kernels/prefill_attention/prefill_attention.h, or int8
# GEMMs: kernels/prefill_gemm/prefill_gemm_int8.h; bfloat16 dots at decode:
# kernels/linear/decode_dot.h), where a
# prompt's chunks may be cut differently alone and in a busy batch.
PATHS = {"exact": [], "int8-bf16prefill": ["--quantized-dot=int8", "--prefill-gemm=bfloat16"],
         "int8-int8prefill": ["--quantized-dot=int8", "--prefill-gemm=int8"],
         # bfloat16 compute throughout: bfloat16 weights, GEMMs and decode dots.
         "bf16-compute": ["--dtype=bfloat16", "--prefill-gemm=bfloat16", "--decode-dot=bfloat16"],
         # The default preset (`--precision=auto`, no flag given): this CPU's
         # fastest paths with the int8 KV cache in 64-entry blocks.
         "default-preset": None}


@pytest.mark.slow
@pytest.mark.parametrize("path", list(PATHS))
def test_greedy_output_is_the_same_alone_and_batched(start_server, model_path, pb, path,
                                                     request):
    pb2, pb2_grpc = pb
    # The decode dot applies to dense bfloat16 weights: the safetensors copy
    # of the model (GGUF matrices stay in their blocks).
    model = request.getfixturevalue("hf_model_dir") if path == "bf16-compute" else model_path
    server = start_server([f"--model={model}", "--max-batch-size=32", "--max-queue=64",
                           "--kv-capacity=512", "--kv-window=32", *(PATHS[path] or [])],
                          precision=None if PATHS[path] is None else "exact")
    with grpc.insecure_channel(server.target) as channel:
        stub = pb2_grpc.GenerationStub(channel)
        with open(GPL) as f:
            text = f.read()
        ids = list(stub.Tokenize(pb2.TokenizeRequest(text=text * 2)).ids)
        assert len(ids) > 6000
        requests = make_requests(pb2, ids)

        alone = {}
        for r in requests:
            resp = stub.Generate(r, timeout=300)
            alone[r.request_id] = list(resp.token_ids)
            assert len(resp.token_ids) == r.stopping.max_new_tokens

        batched = {}
        errors = []
        rng = random.Random(99)
        delays = sorted(rng.uniform(0, 3.0) for _ in requests)

        def run(r, delay):
            time.sleep(delay)
            try:
                batched[r.request_id] = list(stub.Generate(r, timeout=600).token_ids)
            except grpc.RpcError as e:  # reported below, not swallowed
                errors.append((r.request_id, e.code(), e.details()))

        order = list(requests)
        rng.shuffle(order)
        threads = [threading.Thread(target=run, args=(r, d)) for r, d in zip(order, delays)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors

    if path == "bf16-compute":  # the decode dot ran on every matrix: 30 layers x 4 + LM head
        assert "bfloat16 dot products at decode on 121 dense" in server.logs(), server.logs()
    text = server.metrics_text()
    batch_sum = metrics.value(text, "snapserve_batch_size_sum")
    count = metrics.value(text, "snapserve_batch_size_count")
    # The concurrent phase really batched: some decode steps ran more than one sequence.
    assert batch_sum > count, "no decode step ever ran more than one sequence"

    mismatched = [rid for rid in alone if alone[rid] != batched[rid]]
    assert not mismatched, {rid: (alone[rid], batched[rid]) for rid in mismatched}
