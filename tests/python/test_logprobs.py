"""Logprobs end to end (docs/api.md, "Logprobs"): a real snapserve process
serving the real SmolLM2 GGUF, compared with transformers.

Oracle: transformers' float32 model loaded from the same GGUF (its loader
dequantizes it), run teacher-forced on the prompt followed by the tokens the
server returned; the log_softmax of its logits at each position is what the
server must report for that step: the chosen token's logprob within 1e-3 and
the same top-k ids in the same order. Two ids may swap places only where
transformers' own logprobs of the two are within 1e-4 (float32 noise can
order a near-tie either way). For temperature > 0 the documented distribution
is log_softmax(logits / temperature), before top-k and top-p.

Token ids come from the server's own Tokenize, so both sides see the same ids.
KV compression is NONE throughout: the oracle is the full model.
"""
import os
import threading

os.environ["HF_HUB_OFFLINE"] = "1"  # nothing may be downloaded

import grpc
import pytest
import torch

PROMPTS = [
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
    "The quick brown fox jumps over the lazy dog. Once upon a time, in a land far away,",
    "def fibonacci(n):\n    if n < 2:\n        return n\n",
]
MAX_NEW = 8
TOP = 5
ABS_TOL = 1e-3   # float32 logprobs, server vs transformers
NEAR_TIE = 1e-4  # two ids closer than this may come in either order


@pytest.fixture(scope="module")
def hf(model_path):
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(model_path.parent, gguf_file=model_path.name,
                                                dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def server(start_module_server, model_path):
    return start_module_server([f"--model={model_path}", "--default-kv-method=none",
                                "--max-batch-size=8"])


@pytest.fixture(scope="module")
def prompt_ids(stub, pb):
    pb2, _ = pb
    return [list(stub.Tokenize(pb2.TokenizeRequest(text=t, add_special_tokens=True)).ids)
            for t in PROMPTS]


def _request(pb2, ids, *, enabled=True, top=TOP, max_new=MAX_NEW, logprobs=True, **sampling):
    req = pb2.GenerateRequest(
        input_ids=pb2.TokenIds(ids=ids),
        sampling=pb2.SamplingParams(**sampling),
        stopping=pb2.StoppingCriteria(max_new_tokens=max_new, ignore_eos=True),
        kv_compression=pb2.KvCompression(method=pb2.KvCompression.NONE))
    if logprobs:
        req.logprobs.CopyFrom(pb2.LogprobOptions(enabled=enabled, top_logprobs=top))
    return req


def _stream(stub, req):
    """(token_ids, logprobs) of a stream, checking each delta's alignment when
    the request asked for logprobs."""
    ids, logprobs = [], []
    for m in stub.GenerateStream(req, timeout=300):
        if req.logprobs.enabled:
            assert [l.token_id for l in m.logprobs] == list(m.token_ids), m
        else:
            assert len(m.logprobs) == 0, m
        ids += m.token_ids
        logprobs += m.logprobs
    return ids, logprobs


@torch.no_grad()
def _reference(hf, prompt, generated, temperature=1.0):
    """transformers' log_softmax(logits / temperature) before each generated
    token: [len(generated), vocab]."""
    logits = hf(torch.tensor([prompt + generated])).logits[0].float()
    steps = logits[len(prompt) - 1:len(prompt) - 1 + len(generated)]
    return torch.log_softmax(steps / temperature, dim=-1)


def _check_against(expected, generated, logprobs, top=TOP):
    """Each step's chosen logprob and top-k (ids, order, values) against the
    reference rows; returns the largest absolute difference seen."""
    assert len(logprobs) == len(generated)
    worst = 0.0
    for step, (row, token, got) in enumerate(zip(expected, generated, logprobs)):
        assert got.token_id == token
        diff = abs(got.logprob - float(row[token]))
        worst = max(worst, diff)
        assert diff <= ABS_TOL, f"step {step}: chosen {token} {got.logprob} vs {float(row[token])}"
        assert len(got.top_logprobs) == top
        got_ids = [t.token_id for t in got.top_logprobs]
        got_values = [t.logprob for t in got.top_logprobs]
        assert got_values == sorted(got_values, reverse=True), f"step {step}: not descending"
        want_ids = torch.topk(row, top).indices.tolist()
        for i, (g, w) in enumerate(zip(got_ids, want_ids)):
            if g != w:  # only a near-tie in the oracle may swap
                assert abs(float(row[g]) - float(row[w])) <= NEAR_TIE, \
                    f"step {step} rank {i}: server {got_ids}, transformers {want_ids}"
        for t in got.top_logprobs:
            diff = abs(t.logprob - float(row[t.token_id]))
            worst = max(worst, diff)
            assert diff <= ABS_TOL, f"step {step}: top {t.token_id} {t.logprob}"
    return worst


@pytest.mark.slow
@pytest.mark.parametrize("prompt", range(len(PROMPTS)))
def test_greedy_logprobs_match_transformers_unary_and_stream(stub, pb, hf, prompt_ids, prompt):
    pb2, _ = pb
    ids = prompt_ids[prompt]
    r = stub.Generate(_request(pb2, ids, temperature=0.0), timeout=300)
    generated = list(r.token_ids)
    assert len(generated) == MAX_NEW
    expected = _reference(hf, ids, generated)
    # Greedy: the chosen token is the most likely one, so it heads the top-k.
    for got in r.logprobs:
        assert got.top_logprobs[0].token_id == got.token_id
        assert got.top_logprobs[0].logprob == got.logprob
    worst = _check_against(expected, generated, r.logprobs)
    print(f"prompt {prompt}: max |server - transformers| = {worst:.2e}")

    # The stream carries the same logprobs, one per delta token.
    stream_ids, stream_logprobs = _stream(stub, _request(pb2, ids, temperature=0.0))
    assert stream_ids == generated
    assert stream_logprobs == list(r.logprobs)


@pytest.mark.slow
def test_sampled_logprobs_are_tempered_but_not_truncated(stub, pb, hf, prompt_ids):
    """temperature 0.7 with top_k 3 and top_p 0.8: the reported values are
    log_softmax(logits / 0.7) over the whole vocabulary, so the top 5 holds
    tokens the filters would never draw."""
    pb2, _ = pb
    ids = prompt_ids[1]
    r = stub.Generate(_request(pb2, ids, temperature=0.7, top_k=3, top_p=0.8, seed=7),
                      timeout=300)
    generated = list(r.token_ids)
    expected = _reference(hf, ids, generated, temperature=0.7)
    _check_against(expected, generated, r.logprobs)
    # The test tells the two readings apart: somewhere the chosen token's
    # logprob renormalized over the filters' candidates is clearly different.
    def truncated(row, token):
        kept = torch.topk(row, 3)
        probs = kept.values.exp() / kept.values.exp().sum()
        n = int((probs.cumsum(0) < 0.8).sum()) + 1  # the nucleus, at least one
        nucleus = kept.indices[:n].tolist()
        if token not in nucleus:
            return float("-inf")
        return float(row[token] - torch.logsumexp(kept.values[:n], 0))
    assert any(abs(truncated(row, t) - got.logprob) > 1e-2
               for row, t, got in zip(expected, generated, r.logprobs))


@pytest.mark.slow
def test_repetition_penalty_is_in_the_reported_distribution(stub, pb, hf, prompt_ids):
    """Greedy with repetition_penalty 1.3: log_softmax of transformers' logits
    after its RepetitionPenaltyLogitsProcessor over the prompt and the tokens
    so far (temperature 1, since greedy)."""
    from transformers import RepetitionPenaltyLogitsProcessor
    pb2, _ = pb
    ids = prompt_ids[2]
    r = stub.Generate(_request(pb2, ids, temperature=0.0, repetition_penalty=1.3), timeout=300)
    generated = list(r.token_ids)
    penalty = RepetitionPenaltyLogitsProcessor(1.3)
    with torch.no_grad():
        logits = hf(torch.tensor([ids + generated])).logits[0].float()
    rows = []
    for step in range(len(generated)):
        history = torch.tensor([ids + generated[:step]])
        row = penalty(history, logits[len(ids) - 1 + step].unsqueeze(0).clone())[0]
        rows.append(torch.log_softmax(row, dim=-1))
    _check_against(rows, generated, r.logprobs)


@pytest.mark.slow
def test_zero_top_gives_the_chosen_token_only(stub, pb, prompt_ids):
    pb2, _ = pb
    r = stub.Generate(_request(pb2, prompt_ids[0], top=0, max_new=4, temperature=0.0),
                      timeout=300)
    assert [l.token_id for l in r.logprobs] == list(r.token_ids)
    assert all(len(l.top_logprobs) == 0 and l.logprob <= 0 for l in r.logprobs)


@pytest.mark.slow
def test_without_the_option_the_field_is_empty(stub, pb, prompt_ids):
    pb2, _ = pb
    r = stub.Generate(_request(pb2, prompt_ids[0], logprobs=False, max_new=4), timeout=300)
    assert len(r.token_ids) == 4 and len(r.logprobs) == 0
    # enabled false with top 0 is the same as no option
    r = stub.Generate(_request(pb2, prompt_ids[0], enabled=False, top=0, max_new=4), timeout=300)
    assert len(r.logprobs) == 0
    ids, logprobs = _stream(stub, _request(pb2, prompt_ids[0], logprobs=False, max_new=4))
    assert len(ids) == 4 and logprobs == []


@pytest.mark.parametrize("enabled,top,why", [
    (True, 21, "logprobs.top_logprobs: must be at most 20, got 21"),
    (True, 1 << 31, "logprobs.top_logprobs: must be at most 20"),
    (False, 3, "logprobs.top_logprobs: needs logprobs.enabled"),
])
def test_invalid_options_name_the_field(stub, pb, prompt_ids, enabled, top, why):
    pb2, _ = pb
    req = _request(pb2, prompt_ids[0], enabled=enabled, top=top, max_new=2)
    for call in (lambda: stub.Generate(req, timeout=60),
                 lambda: list(stub.GenerateStream(req, timeout=60))):
        with pytest.raises(grpc.RpcError) as e:
            call()
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert e.value.details().startswith(why), e.value.details()


@pytest.mark.slow
def test_tokens_not_returned_have_no_logprobs(stub, pb, prompt_ids):
    """A stop token is not returned and neither are its logprobs; a token whose
    text completes a stop sequence is returned (its id), and so are its."""
    pb2, _ = pb
    ids = prompt_ids[1]
    full = stub.Generate(_request(pb2, ids, temperature=0.0), timeout=300)
    stop_id = full.token_ids[3]
    req = _request(pb2, ids, temperature=0.0)
    req.stopping.stop_token_ids.append(stop_id)
    r = stub.Generate(req, timeout=300)
    assert r.finish_reason == pb2.STOP_TOKEN
    n = list(full.token_ids).index(stop_id)
    assert list(r.token_ids) == list(full.token_ids[:n])
    assert list(r.logprobs) == list(full.logprobs[:n])

    stop_text = full.text[len(full.text) // 2:][:4]
    req = _request(pb2, ids, temperature=0.0)
    req.stopping.stop.append(stop_text)
    r = stub.Generate(req, timeout=300)
    assert r.finish_reason == pb2.STOP_SEQUENCE
    assert len(r.logprobs) == len(r.token_ids) > 0
    assert list(r.logprobs) == list(full.logprobs[:len(r.token_ids)])


@pytest.mark.slow
def test_logprobs_do_not_depend_on_the_batch(stub, pb, prompt_ids):
    """The same requests alone and all at once (one batch, up to 8 rows, some
    without logprobs): identical logprobs, to the bit, since on CPU the
    logits are (docs/kv-cache-and-scheduling.md, "Batching invariance")."""
    pb2, _ = pb
    reqs = [_request(pb2, ids, temperature=0.0, logprobs=(i % 2 == 0))
            for i, ids in enumerate(prompt_ids * 2)]
    alone = [stub.Generate(r, timeout=300) for r in reqs]
    together = [None] * len(reqs)

    def run(i):
        together[i] = stub.Generate(reqs[i], timeout=300)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(reqs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for a, b in zip(alone, together):
        assert list(a.token_ids) == list(b.token_ids)
        assert list(a.logprobs) == list(b.logprobs)
