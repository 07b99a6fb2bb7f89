"""Documents and questions (docs/api.md, "Documents and questions"): a request
with a `question` has its input compressed alone, as a document, and the
question run after it uncompressed; the document cache keeps the compressed
document for the next question.

Oracle: kvpress's own KVPressTextGenerationPipeline
(tests/python/reference/kvpress_pipeline_answers.py in .deps/kvpress-venv),
which renders the document as a user message with the chat template,
compresses it once with a press, then answers each question over the
compressed cache with greedy decoding. The server, asked the same questions
about the same document with the matching method and budget, must give the
same answers: the first question compresses the document (a document cache
miss), the later ones restore it from the cache (a hit), so both paths meet
the oracle. KeyDiff and StreamingLLM read no query; SnapKV here is kvpress's
question-agnostic use of it (its window is the document's end).

Also: a hit computes bit for bit what a miss computes (tokens and logprobs),
other settings miss, eviction frees every block, and bad input is refused.
"""
import json
import os
import pathlib
import subprocess
import sys

os.environ["HF_HUB_OFFLINE"] = "1"  # nothing may be downloaded

import grpc
import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from snapserve_testkit import metrics  # noqa: E402
from snapserve_testkit.calls import wait_for  # noqa: E402
from test_streaming_llm_kvpress import kvpress_python  # noqa: E402,F401

SCRIPT = pathlib.Path(__file__).resolve().parent / "reference" / "kvpress_pipeline_answers.py"
LICENSES = pathlib.Path("/usr/share/common-licenses")
# About 1.2K tokens of the Apache License and questions about it.
DOCUMENT = (LICENSES / "Apache-2.0").read_text()[:5200]
QUESTIONS = ["What does the license say about trademarks?",
             "Can I redistribute the work, and under which conditions?",
             "Who is a Contributor?"]
MAX_NEW = 20
CAPACITY, WINDOW, KERNEL, SINKS = 256, 32, 7, 4
# kvpress name -> the server's method, and the press's config.
PRESSES = {
    "keydiff": ("KEYDIFF", {"capacity": CAPACITY}),
    "streaming_llm": ("STREAMING_LLM", {"capacity": CAPACITY, "sink_tokens": SINKS}),
    "snapkv": ("SNAPKV", {"capacity": CAPACITY, "window": WINDOW, "kernel_size": KERNEL}),
}
FLAGS = ["--kv-cache-memory=256MiB", "--document-cache-memory=0.25", "--max-batch-size=4"]


@pytest.fixture(scope="module")
def kvpress_answers(kvpress_python, model_path, tmp_path_factory):
    """press -> kvpress's result for the document and QUESTIONS: one subprocess."""
    tmp = tmp_path_factory.mktemp("kvpress")
    runs = [{"press": p, "config": cfg, "context": DOCUMENT, "questions": QUESTIONS}
            for p, (_, cfg) in PRESSES.items()]
    src, out = tmp / "in.json", tmp / "out.json"
    src.write_text(json.dumps({"max_new_tokens": MAX_NEW, "runs": runs}))
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    done = subprocess.run([str(kvpress_python), str(SCRIPT), str(model_path), str(src), str(out)],
                          capture_output=True, text=True, timeout=1800, env=env)
    assert done.returncode == 0, f"kvpress script failed:\n{done.stdout}\n{done.stderr}"
    got = json.loads(out.read_text())
    assert got["kvpress"] == "0.5.5", got["kvpress"]
    return dict(zip(PRESSES, got["results"]))


@pytest.fixture(scope="module")
def server(start_module_server, model_path):
    return start_module_server([f"--model={model_path}", *FLAGS])


@pytest.fixture(scope="module")
def stub(server, pb):
    _, pb2_grpc = pb
    with grpc.insecure_channel(server.target) as channel:
        yield pb2_grpc.GenerationStub(channel)


def kv(pb2, method, capacity=CAPACITY):
    K = pb2.KvCompression
    k = K(method=getattr(K, method), max_capacity_prompt=capacity)
    if method == "SNAPKV":
        k.window_size, k.kernel_size, k.pooling = WINDOW, KERNEL, K.AVG
    if method == "STREAMING_LLM":
        k.sink_tokens = SINKS
    return k


def ask(stub, pb2, question, method, capacity=CAPACITY, document=DOCUMENT, rid="", **extra):
    req = pb2.GenerateRequest(
        request_id=rid, messages=pb2.ChatMessages(messages=[
            pb2.ChatMessage(role="user", content=document)]),
        question=question, kv_compression=kv(pb2, method, capacity),
        stopping=pb2.StoppingCriteria(max_new_tokens=MAX_NEW), **extra)
    return stub.Generate(req, timeout=600)


@pytest.mark.slow
@pytest.mark.parametrize("press", list(PRESSES))
def test_answers_equal_kvpress_pipeline(kvpress_answers, stub, pb, press):
    pb2, _ = pb
    method = PRESSES[press][0]
    want = kvpress_answers[press]
    n = want["context_tokens"]
    assert n > CAPACITY
    lanes = 30 * 3  # SmolLM2-135M: layers x KV heads
    for i, (question, answer, q) in enumerate(zip(QUESTIONS, want["answers"],
                                                   want["question_tokens"])):
        r = ask(stub, pb2, question, method)
        # The template split and the tokens match kvpress's preprocessing.
        assert r.usage.prompt_tokens == n + q, (r.usage.prompt_tokens, n, q)
        assert r.text.strip() == answer.strip(), (press, question, r.text, answer)
        # The first question compressed the document, the others restored it.
        assert r.usage.document_cache_hit == (i > 0)
        assert r.usage.cached_prompt_tokens == (n if i > 0 else 0)
        assert r.usage.kv_method == getattr(pb2.KvCompression, method)
        # The document's C entries and the question's q in every lane, plus
        # the answer's tokens but the last (its K/V is never computed).
        answer_entries = r.usage.completion_tokens - 1 + (r.finish_reason == pb2.EOS)
        assert r.usage.kv_kept_entries_total in (lanes * (CAPACITY + q),
                                                 lanes * (CAPACITY + q + answer_entries))


@pytest.mark.slow
def test_a_cache_hit_computes_what_a_miss_computes(start_server, model_path, pb):
    """Two servers: one without a document cache (every request compresses
    the document), one with it (the second request restores it). Greedy
    tokens and every logprob must be equal, for each method."""
    pb2, pb2_grpc = pb
    cold = start_server([f"--model={model_path}", "--kv-cache-memory=256MiB"])
    warm = start_server([f"--model={model_path}", *FLAGS])
    logprobs = pb2.LogprobOptions(enabled=True, top_logprobs=3)

    def run(s, method):
        with grpc.insecure_channel(s.target) as ch:
            stub = pb2_grpc.GenerationStub(ch)
            out = []
            for question in QUESTIONS[:2]:
                r = ask(stub, pb2, question, method, logprobs=logprobs)
                out.append((list(r.token_ids),
                            [(l.token_id, l.logprob, [(t.token_id, t.logprob)
                                                      for t in l.top_logprobs])
                             for l in r.logprobs],
                            r.usage.kv_kept_entries_total, r.usage.document_cache_hit))
            return out

    for method in ["KEYDIFF", "SNAPKV", "NONE"]:
        a, b = run(cold, method), run(warm, method)
        assert [x[3] for x in a] == [False, False]
        assert [x[3] for x in b] == [False, True]
        assert [x[:3] for x in a] == [x[:3] for x in b], method


def test_other_settings_miss(stub, pb):
    pb2, _ = pb
    doc = DOCUMENT[:3000]
    first = ask(stub, pb2, QUESTIONS[0], "KEYDIFF", capacity=200, document=doc)
    other_budget = ask(stub, pb2, QUESTIONS[0], "KEYDIFF", capacity=216, document=doc)
    other_method = ask(stub, pb2, QUESTIONS[0], "STREAMING_LLM", capacity=200, document=doc)
    again = ask(stub, pb2, QUESTIONS[1], "KEYDIFF", capacity=200, document=doc)
    assert not first.usage.document_cache_hit
    assert not other_budget.usage.document_cache_hit
    assert not other_method.usage.document_cache_hit
    assert again.usage.document_cache_hit
    # Without a question nothing is a document: the cache is not consulted.
    plain = stub.Generate(pb2.GenerateRequest(
        messages=pb2.ChatMessages(messages=[pb2.ChatMessage(role="user", content=doc)]),
        kv_compression=kv(pb2, "KEYDIFF", 200),
        stopping=pb2.StoppingCriteria(max_new_tokens=4)), timeout=600)
    assert not plain.usage.document_cache_hit and plain.usage.cached_prompt_tokens == 0


def test_eviction_frees_every_block(start_server, model_path, pb):
    """A document cache that holds one compressed document: each new document
    evicts the last; requests run concurrently; afterwards every KV block is
    free and the hit counters equal what the responses said."""
    pb2, pb2_grpc = pb
    # 64 MiB x 0.03 ~ 1.9 MiB: one KeyDiff document of C=128 (30 x 3 lanes x
    # 128 entries x 64 x 4 bytes x 2 = 5.6 MiB) does not fit at 0.03, so
    # use C=32 (1.4 MiB): exactly one fits.
    server = start_server([f"--model={model_path}", "--kv-cache-memory=64MiB",
                           "--document-cache-memory=0.03", "--max-batch-size=4"])
    assert "document cache: 1 MiB" in server.logs(), server.logs()
    docs = [(LICENSES / name).read_text()[:1500] for name in ["GPL-3", "MPL-2.0", "LGPL-2.1"]]
    with grpc.insecure_channel(server.target) as channel:
        stub = pb2_grpc.GenerationStub(channel)
        results = []
        for doc in docs + docs[:1]:
            for q in QUESTIONS[:2]:
                results.append(ask(stub, pb2, q, "KEYDIFF", capacity=32, document=doc))
        hits = [r.usage.document_cache_hit for r in results]
        # Each document's second question hits; the last document came back
        # after two others evicted it, so its first question misses again.
        assert hits == [False, True] * 4, hits

    assert wait_for(lambda: metrics.idle(server.metrics_text()), timeout=10), \
        server.metrics_text()
    text = server.metrics_text()
    assert metrics.value(text, "snapserve_document_cache_hits_total") == 4
    assert metrics.value(text, "snapserve_document_cache_hit_tokens_total") == sum(
        r.usage.cached_prompt_tokens for r in results)
    assert metrics.value(text, "snapserve_prefix_cache_hits_total") == 0


def test_bad_documents_are_refused(stub, pb):
    pb2, _ = pb
    with pytest.raises(grpc.RpcError) as e:
        stub.Generate(pb2.GenerateRequest(
            messages=pb2.ChatMessages(messages=[pb2.ChatMessage(role="user", content="doc"),
                                                pb2.ChatMessage(role="assistant", content="ok")]),
            question="why?"), timeout=60)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "last message must be the user's document" in e.value.details()
    with pytest.raises(grpc.RpcError) as e:
        stub.Generate(pb2.GenerateRequest(prompt="doc", question="x" * 10_000_000), timeout=60)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert e.value.details().startswith("question:"), e.value.details()
    # The server still serves.
    ok = ask(stub, pb2, QUESTIONS[0], "KEYDIFF", document="A short document.")
    assert ok.usage.prompt_tokens > 0 and ok.finish_reason in (pb2.LENGTH, pb2.EOS)


def test_a_raw_prompt_takes_the_question_after_it(stub, pb):
    """With `prompt` the question's tokens follow the prompt's (no template)."""
    pb2, _ = pb
    doc = DOCUMENT[:2000]
    n = len(stub.Tokenize(pb2.TokenizeRequest(text=doc, add_special_tokens=True)).ids)
    q = len(stub.Tokenize(pb2.TokenizeRequest(text=" Question: who?")).ids)
    r = stub.Generate(pb2.GenerateRequest(prompt=doc, question=" Question: who?",
                                          kv_compression=kv(pb2, "KEYDIFF", 128),
                                          stopping=pb2.StoppingCriteria(max_new_tokens=3)),
                      timeout=600)
    assert r.usage.prompt_tokens == n + q
