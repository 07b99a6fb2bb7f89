"""The server computing in bfloat16, on CUDA (`gpu` marker: the GPU machine's
run of scripts/gpu-check.sh) and on the CPU (every `make test`, the same
assertions on the CPU's bfloat16 weights), against transformers.

This is the GPU variant of the float32 oracle tests (test_server_e2e.py's
greedy test, test_logprobs.py, test_snapkv_e2e.py), which compare token for
token or within 1e-3 and which scripts/gpu-check.sh leaves out on CUDA. On the
GPU machine the model is scripts/gpu_check_model.py's: the default model's
shapes and tokenizer with random weights (the real GGUF does not travel).

Oracle: transformers' float32 model loaded from the same GGUF, teacher-forced
on the prompt followed by the tokens the server returned, and for SnapKV the
pipeline of test_snapkv_e2e.py (reference/hf_snapkv_pipeline.py) teacher-forced
over the entries its independent reference keeps. bfloat16 bounds, with
BOUND = 0.15 nats (transformers' own bfloat16 forward of the random-weight
model differs from its float32 one by at most 0.04 in any logprob over 16
greedy steps):
- greedy tokens: at every step the server's token is within BOUND of the
  oracle's most likely one; so the tokens are the oracle's greedy ones over
  the whole prefix up to the first step whose top-2 gap is below BOUND;
- logprobs: the chosen token's and each of the top-5's within BOUND of the
  oracle's log_softmax; the top-5 ids are the oracle's except where two of
  the oracle's logprobs are within 2 * BOUND (a near-tie may swap);
- chunked prefill: the same bounds for a 600-token prompt prefilled in
  chunks of 128 tokens;
- SnapKV (C = 128 of 600): the same bounds against the pipeline's kept
  entries; bfloat16 scores may swap entries at the budget's edge, whose
  attention weight is too small to move a logprob by BOUND.
"""
import os
import pathlib

import pytest
import torch

from conftest import cuda_available

os.environ["HF_HUB_OFFLINE"] = "1"  # nothing may be downloaded

BOUND = 0.15
TOP = 5
MAX_NEW = 12
STEP_TOKENS = 128
LONG_TOKENS = 600
SNAPKV = dict(capacity=128, window=32, kernel=7)
# A cache of 2048 tokens of bfloat16 entries: 30 layers x 3 KV heads x 64
# dims x (K, V) x 2 bytes = 23040 bytes a token.
KV_TOKENS = 2048
KV_BYTES = KV_TOKENS * 23040
SHORT_PROMPT = "The capital of France is"
LICENSE = pathlib.Path("/usr/share/common-licenses/Apache-2.0")

DEVICES = [
    pytest.param("cpu", id="cpu"),
    pytest.param("cuda", id="cuda", marks=[
        pytest.mark.gpu, pytest.mark.skipif(not cuda_available(), reason="needs a CUDA device")]),
]


@pytest.fixture(scope="module", params=DEVICES)
def server(request, start_module_server, model_path):
    s = start_module_server([
        f"--model={model_path}", f"--device={request.param}", "--dtype=bfloat16",
        f"--kv-cache-memory={KV_BYTES}", f"--max-step-tokens={STEP_TOKENS}",
        "--default-kv-method=none"])
    s.device = request.param
    return s


def _tokenize(stub, pb2, text):
    return list(stub.Tokenize(pb2.TokenizeRequest(text=text, add_special_tokens=True)).ids)


def _generate(stub, pb2, ids, kv=None):
    request = pb2.GenerateRequest(
        input_ids=pb2.TokenIds(ids=ids), sampling=pb2.SamplingParams(temperature=0.0),
        stopping=pb2.StoppingCriteria(max_new_tokens=MAX_NEW, ignore_eos=True),
        logprobs=pb2.LogprobOptions(enabled=True, top_logprobs=TOP))
    if kv is not None:
        request.kv_compression.CopyFrom(kv)
    r = stub.Generate(request, timeout=600)
    assert len(r.token_ids) == MAX_NEW and len(r.logprobs) == MAX_NEW
    return list(r.token_ids), list(r.logprobs)


def _check_within_bound(oracle_logits, tokens, logprobs):
    """oracle_logits: [MAX_NEW, vocab], the oracle's logits before each
    generated token. Asserts the bounds of the module docstring; returns the
    largest logprob difference seen."""
    rows = torch.log_softmax(oracle_logits.double(), dim=-1)
    worst = 0.0
    for step, (row, token, got) in enumerate(zip(rows, tokens, logprobs)):
        best = float(row.max())
        assert float(row[token]) >= best - BOUND, (
            f"step {step}: server token {token} has oracle logprob {float(row[token]):.4f}, "
            f"the oracle's best {int(row.argmax())} {best:.4f}")
        assert got.token_id == token
        pairs = [(got.token_id, got.logprob)] + [(t.token_id, t.logprob) for t in got.top_logprobs]
        for token_id, logprob in pairs:
            diff = abs(logprob - float(row[token_id]))
            worst = max(worst, diff)
            assert diff <= BOUND, (f"step {step}: token {token_id} server {logprob:.4f}, "
                                   f"oracle {float(row[token_id]):.4f}")
        want = torch.topk(row, TOP)
        edge = float(want.values[-1])
        assert len(got.top_logprobs) == TOP
        for t in got.top_logprobs:
            if t.token_id not in want.indices.tolist():
                assert float(row[t.token_id]) >= edge - 2 * BOUND, (
                    f"step {step}: server top-{TOP} {[x.token_id for x in got.top_logprobs]}, "
                    f"oracle {want.indices.tolist()}")
    return worst


def _oracle_logits(model, ids, tokens):
    """The float32 model teacher-forced on ids + tokens: logits before each token."""
    with torch.no_grad():
        logits = model(torch.tensor([ids + tokens])).logits[0].float()
    return logits[len(ids) - 1:len(ids) - 1 + len(tokens)]


@pytest.fixture(scope="module")
def long_ids(stub, pb):
    ids = _tokenize(stub, pb[0], LICENSE.read_text())[:LONG_TOKENS]
    assert len(ids) == LONG_TOKENS
    return ids


def test_model_info_reports_bfloat16(server, stub, pb):
    info = stub.GetModelInfo(pb[0].GetModelInfoRequest(), timeout=10)
    assert info.dtype == "bfloat16" and info.kv_cache_dtype == "bfloat16"
    assert info.device.startswith(server.device)
    assert (info.num_layers, info.num_key_value_heads, info.head_dim) == (30, 3, 64)
    assert info.kv_cache_capacity_tokens == KV_TOKENS


@pytest.mark.slow
def test_greedy_and_logprobs_within_bound_of_transformers(server, stub, pb, pipe):
    ids = _tokenize(stub, pb[0], SHORT_PROMPT)
    tokens, logprobs = _generate(stub, pb[0], ids)
    worst = _check_within_bound(_oracle_logits(pipe.model, ids, tokens), tokens, logprobs)
    print(f"short prompt: largest |server - transformers| logprob {worst:.4f}")


@pytest.mark.slow
def test_chunked_prefill_within_bound_of_transformers(server, stub, pb, pipe, long_ids):
    tokens, logprobs = _generate(stub, pb[0], long_ids)
    worst = _check_within_bound(_oracle_logits(pipe.model, long_ids, tokens), tokens, logprobs)
    print(f"{LONG_TOKENS}-token prompt in chunks of {STEP_TOKENS}: largest difference {worst:.4f}")


@pytest.mark.slow
def test_snapkv_within_bound_of_the_pipeline(server, stub, pb, pipe, long_ids):
    pb2 = pb[0]
    kv = pb2.KvCompression(method=pb2.KvCompression.SNAPKV, window_size=SNAPKV["window"],
                           max_capacity_prompt=SNAPKV["capacity"], kernel_size=SNAPKV["kernel"],
                           pooling=pb2.KvCompression.MAX)
    tokens, logprobs = _generate(stub, pb2, long_ids, kv)
    pre = pipe.prefill(long_ids)
    comp = pipe.compress(pre, SNAPKV["window"], SNAPKV["capacity"], SNAPKV["kernel"], "max")
    assert comp.entries == SNAPKV["capacity"]
    # The first token follows the whole prompt (SnapKV compresses after the
    # prefill); each later one the compressed cache and the tokens before it.
    logits = torch.cat([pre.logits[None], pipe.teacher_forced(pre, comp, tokens[:-1])])
    worst = _check_within_bound(logits, tokens, logprobs)
    print(f"SnapKV C={SNAPKV['capacity']}: largest difference {worst:.4f}")
