"""The OpenAI-compatible HTTP API (--http-port; docs/api.md, "The
OpenAI-compatible HTTP API") against a real snapserve, driven by the official
`openai` Python client: completions and chat, unary and streamed, logprobs,
stop, the kv_compression extension, errors in OpenAI's shape, the bearer
token, TLS; greedy output through HTTP equals the gRPC output for the same
request; a client leaving mid-stream cancels the request and frees its KV
blocks; concurrent HTTP streams and gRPC calls all complete."""
import concurrent.futures
import http.client
import json
import secrets
import socket
import ssl
import time

import grpc
import openai
import pytest

from snapserve_testkit import free_port, metrics
from snapserve_testkit.calls import wait_for

TOKEN = "sk-snapserve-" + secrets.token_urlsafe(16)
AUTH = (("authorization", f"Bearer {TOKEN}"),)
MAX_BODY = 1 << 20  # --max-message-bytes: the HTTP body bound too
PROMPT = "The capital of France is"
CHAT = [{"role": "system", "content": "You answer in one sentence."},
        {"role": "user", "content": "What is the tallest mountain on Earth?"}]


@pytest.fixture(scope="module")
def server(start_module_server, model_path, tmp_path_factory):
    token_file = tmp_path_factory.mktemp("auth") / "token"
    token_file.write_text(TOKEN + "\n")
    port = free_port()
    s = start_module_server([f"--model={model_path}", f"--http-port={port}",
                             f"--auth-token-file={token_file}",
                             f"--max-message-bytes={MAX_BODY}"])
    s.http_port = port
    return s


@pytest.fixture(scope="module")
def client(server):
    with openai.OpenAI(base_url=f"http://127.0.0.1:{server.http_port}/v1", api_key=TOKEN,
                       max_retries=0, timeout=120) as c:
        yield c


@pytest.fixture(scope="module")
def model_id(stub, pb):
    pb2, _ = pb
    return stub.GetModelInfo(pb2.GetModelInfoRequest(), metadata=AUTH, timeout=10).model_id


def grpc_generate(stub, pb, max_tokens, prompt=None, messages=None, **extra):
    pb2, _ = pb
    kwargs = {"prompt": prompt} if prompt is not None else {
        "messages": pb2.ChatMessages(messages=[pb2.ChatMessage(**m) for m in messages])}
    return stub.Generate(pb2.GenerateRequest(
        **kwargs, stopping=pb2.StoppingCriteria(max_new_tokens=max_tokens),
        sampling=pb2.SamplingParams(temperature=0), **extra), metadata=AUTH, timeout=120)


def raw(server, method, path, body=b"", headers=None):
    """(status, parsed JSON body) of one plain HTTP exchange."""
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=60)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        r = conn.getresponse()
        return r.status, json.loads(r.read() or b"null")
    finally:
        conn.close()


def assert_openai_error(body, param=None):
    """OpenAI's error shape: {"error": {"message", "type", "param", "code"}}."""
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}, body
    assert error["message"] and isinstance(error["type"], str)
    assert "Traceback" not in error["message"] and "c10::" not in error["message"]
    if param is not None:
        assert error["param"] == param, body


# ------------------------------------------------------------- the basics ---

def test_health_and_models(server, client, model_id):
    status, body = raw(server, "GET", "/health")  # no token needed
    assert (status, body) == (200, {"status": "ok"})
    models = client.models.list()
    assert [m.id for m in models.data] == [model_id]
    assert client.models.retrieve(model_id).id == model_id
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("no-such-model")


def test_completion_greedy_equals_grpc(client, stub, pb, model_id):
    r = client.completions.create(model=model_id, prompt=PROMPT, max_tokens=12, temperature=0)
    g = grpc_generate(stub, pb, 12, prompt=PROMPT)
    assert r.object == "text_completion" and r.id.startswith("cmpl-")
    assert r.choices[0].text == g.text and g.text
    assert r.usage.prompt_tokens == g.usage.prompt_tokens
    assert r.usage.completion_tokens == g.usage.completion_tokens == len(g.token_ids)
    assert r.usage.total_tokens == g.usage.prompt_tokens + g.usage.completion_tokens
    assert r.usage.prompt_tokens_details.cached_tokens >= 0
    assert r.choices[0].finish_reason == ("length" if len(g.token_ids) == 12 else "stop")


def test_chat_greedy_equals_grpc_unary_and_streamed(client, stub, pb, model_id):
    g = grpc_generate(stub, pb, 24, messages=CHAT)
    r = client.chat.completions.create(model=model_id, messages=CHAT, max_tokens=24,
                                       temperature=0)
    assert r.object == "chat.completion"
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content == g.text and g.text
    assert r.usage.completion_tokens == g.usage.completion_tokens

    chunks = list(client.chat.completions.create(
        model=model_id, messages=CHAT, max_tokens=24, temperature=0, stream=True,
        stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(c.object == "chat.completion.chunk" and c.id == chunks[0].id for c in chunks)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == g.text
    finish = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finish[-1] in ("stop", "length") and not any(finish[:-1])
    # stream_options.include_usage: a last chunk with no choices and the usage.
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(g.token_ids)
    assert all(c.usage is None for c in chunks[:-1])


def test_completion_stream_equals_unary(client, model_id):
    unary = client.completions.create(model=model_id, prompt=PROMPT, max_tokens=10,
                                      temperature=0)
    chunks = list(client.completions.create(model=model_id, prompt=PROMPT, max_tokens=10,
                                            temperature=0, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == unary.choices[0].text
    assert chunks[-1].choices[0].finish_reason == unary.choices[0].finish_reason
    assert all(c.usage is None for c in chunks)  # no usage unless asked for


def test_prompt_as_token_ids(client, stub, pb, model_id):
    pb2, _ = pb
    ids = list(stub.Tokenize(pb2.TokenizeRequest(text=PROMPT, add_special_tokens=True),
                             metadata=AUTH, timeout=10).ids)
    by_ids = client.completions.create(model=model_id, prompt=ids, max_tokens=6, temperature=0)
    by_text = client.completions.create(model=model_id, prompt=PROMPT, max_tokens=6,
                                        temperature=0)
    assert by_ids.choices[0].text == by_text.choices[0].text
    assert by_ids.usage.prompt_tokens == len(ids)


def test_seeded_sampling_repeats(client, model_id):
    def sample():
        return client.completions.create(model=model_id, prompt=PROMPT, max_tokens=12,
                                         temperature=0.9, top_p=0.95, seed=1234).choices[0].text
    assert sample() == sample()


# ---------------------------------------------------------------- logprobs ---

def test_chat_logprobs_match_grpc(client, stub, pb, model_id):
    pb2, _ = pb
    g = grpc_generate(stub, pb, 8, messages=CHAT,
                      logprobs=pb2.LogprobOptions(enabled=True, top_logprobs=3))
    r = client.chat.completions.create(model=model_id, messages=CHAT, max_tokens=8,
                                       temperature=0, logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert len(content) == len(g.logprobs) == len(g.token_ids)
    for entry, want in zip(content, g.logprobs):
        assert entry.logprob == pytest.approx(want.logprob, abs=1e-5)
        assert len(entry.top_logprobs) == 3
        # Greedy: the chosen token is the most likely one.
        assert entry.top_logprobs[0].token == entry.token
        assert entry.top_logprobs[0].logprob == pytest.approx(entry.logprob, abs=1e-6)
        assert [t.logprob for t in entry.top_logprobs] == sorted(
            (t.logprob for t in entry.top_logprobs), reverse=True)
    # The tokens' bytes are the text's bytes.
    joined = b"".join(bytes(e.bytes) for e in content)
    assert joined.decode("utf-8") == r.choices[0].message.content


def test_completion_logprobs_and_stream_logprobs(client, model_id):
    r = client.completions.create(model=model_id, prompt=PROMPT, max_tokens=6, temperature=0,
                                  logprobs=2)
    lp = r.choices[0].logprobs
    assert "".join(lp.tokens) == r.choices[0].text
    assert len(lp.token_logprobs) == len(lp.tokens) == r.usage.completion_tokens
    assert all(len(top) <= 2 and max(top.values()) == pytest.approx(chosen, abs=1e-6)
               for top, chosen in zip(lp.top_logprobs, lp.token_logprobs))
    assert lp.text_offset == [sum(len(t.encode()) for t in lp.tokens[:i])
                              for i in range(len(lp.tokens))]
    chunks = list(client.completions.create(model=model_id, prompt=PROMPT, max_tokens=6,
                                            temperature=0, logprobs=2, stream=True))
    streamed = [x for c in chunks if c.choices[0].logprobs
                for x in c.choices[0].logprobs.token_logprobs]
    assert streamed == pytest.approx(lp.token_logprobs, abs=1e-6)


# -------------------------------------------------------------------- stop ---

def test_stop_sequence(client, model_id):
    full = client.completions.create(model=model_id, prompt=PROMPT, max_tokens=16,
                                     temperature=0).choices[0].text
    words = full.split()
    assert len(words) >= 3, full
    stop = " " + words[2]
    r = client.completions.create(model=model_id, prompt=PROMPT, max_tokens=16, temperature=0,
                                  stop=[stop, "\n\n\n"])
    assert r.choices[0].text == full[:full.index(stop)]
    assert r.choices[0].finish_reason == "stop"


# ---------------------------------------------------- the kv_compression block ---

def test_kv_compression_extension(client, stub, pb, model_id):
    pb2, _ = pb
    prompt = " ".join(f"Item {i} is a {['red', 'green', 'blue'][i % 3]} box." for i in range(40))
    kv = {"method": "snapkv", "capacity": 64, "window": 8, "kernel": 5, "pooling": "max"}
    r = client.completions.create(model=model_id, prompt=prompt, max_tokens=6, temperature=0,
                                  extra_body={"kv_compression": kv})
    g = grpc_generate(stub, pb, 6, prompt=prompt, kv_compression=pb2.KvCompression(
        method=pb2.KvCompression.SNAPKV, max_capacity_prompt=64, window_size=8, kernel_size=5,
        pooling=pb2.KvCompression.MAX))
    block = r.usage.model_dump()["kv_compression"]
    assert block["method"] == "snapkv"
    assert block["original_entries"] == g.usage.kv_prompt_entries == r.usage.prompt_tokens > 64
    assert block["kept_entries"] == g.usage.kv_kept_entries == 64
    assert block["kept_entries_total"] == g.usage.kv_kept_entries_total
    assert block["compression_ratio"] == pytest.approx(g.usage.compression_ratio, rel=1e-6)
    assert block["retained_attention"] == pytest.approx(g.usage.retained_attention_ratio,
                                                        abs=1e-6)
    assert r.choices[0].text == g.text
    # Without the extension nothing is dropped from a prompt this short.
    plain = client.completions.create(model=model_id, prompt=PROMPT, max_tokens=1)
    assert plain.usage.model_dump()["kv_compression"]["method"] == "none"


# ------------------------------------------------------------------ errors ---

def test_refusals_in_openai_shape(server, client, model_id):
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model=model_id, prompt=PROMPT, n=2)
    assert_openai_error(err.value.body and {"error": err.value.body}, param="n")
    with pytest.raises(openai.NotFoundError) as err:
        client.completions.create(model="gpt-4o", prompt=PROMPT)
    assert err.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=model_id, messages=CHAT, max_tokens=100000)
    assert err.value.body["param"] == "max_tokens" and "max_tokens" in err.value.message
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model=model_id, prompt=PROMPT,
                                  extra_body={"kv_compression": {"method": "magic"}})
    assert err.value.body["param"] == "kv_compression.method"
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=model_id, messages=[{"role": "wizard",
                                                                  "content": "hi"}])

    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    status, body = raw(server, "POST", "/v1/chat/completions", b"{not json", headers)
    assert status == 400
    assert_openai_error(body)
    status, body = raw(server, "POST", "/v1/completions", b"[" * 100000 + b"]" * 100000,
                       headers)
    assert status == 400
    assert_openai_error(body)
    status, body = raw(server, "GET", "/v1/completions", headers=headers)
    assert status == 405
    status, body = raw(server, "GET", "/v2/nothing", headers=headers)
    assert status == 404
    assert_openai_error(body)


def test_body_larger_than_the_limit_is_413(client, model_id):
    with pytest.raises(openai.APIStatusError) as err:
        client.completions.create(model=model_id, prompt="x" * (MAX_BODY + 1000))
    assert err.value.status_code == 413
    # The connection pool recovers: the next request is served.
    assert client.completions.create(model=model_id, prompt=PROMPT, max_tokens=1).choices


@pytest.mark.parametrize("key", ["wrong-token", TOKEN[:-1], TOKEN + "x"])
def test_bearer_token_required(server, model_id, key):
    with openai.OpenAI(base_url=f"http://127.0.0.1:{server.http_port}/v1",
                       api_key=key, max_retries=0) as c:
        for call in (lambda: c.completions.create(model=model_id, prompt=PROMPT, max_tokens=1),
                     lambda: c.chat.completions.create(model=model_id, messages=CHAT,
                                                       max_tokens=1),
                     lambda: c.models.list()):
            with pytest.raises(openai.AuthenticationError) as err:
                call()
            assert err.value.status_code == 401
            assert TOKEN not in str(err.value.body) and key not in str(err.value.body)
    status, _ = raw(server, "GET", "/health")  # open without the token
    assert status == 200


@pytest.mark.parametrize("authorization", [None, f"Basic {TOKEN}", TOKEN, "Bearer "])
def test_no_bearer_token_is_401(server, authorization):
    headers = {"Content-Type": "application/json"}
    if authorization is not None:
        headers["Authorization"] = authorization
    for method, path, body in (("POST", "/v1/completions", b'{"prompt": "Hi"}'),
                               ("POST", "/v1/chat/completions", b'{"messages": []}'),
                               ("GET", "/v1/models", b"")):
        status, answer = raw(server, method, path, body, headers)
        assert status == 401, (path, answer)
        assert_openai_error(answer)
        assert TOKEN not in json.dumps(answer)


# -------------------------------------------------------- disconnect, load ---

def blocks_free(server):
    return metrics.value(server.metrics_text(), "snapserve_kv_cache_blocks_free")


def settled_blocks_free(server):
    """The free-block gauge once two readings 0.5 s apart agree."""
    def reading():
        first = blocks_free(server)
        time.sleep(0.5)
        return first if blocks_free(server) == first else None
    return wait_for(reading, timeout=30)


def test_disconnect_mid_stream_cancels_and_frees_blocks(server, client, model_id):
    # Idle: nothing running, and the sampled gauge (every 200 ms) caught up.
    assert wait_for(lambda: metrics.value(server.metrics_text(),
                                          "snapserve_requests_running") == 0, timeout=30)
    idle = settled_blocks_free(server)
    assert idle, "the free-block gauge does not settle"
    stream = client.chat.completions.create(model=model_id, messages=CHAT, max_tokens=4000,
                                            temperature=0, stream=True,
                                            extra_body={"ignore_eos": True})
    seen = 0
    request_id = None
    for chunk in stream:
        request_id = chunk.id.removeprefix("chatcmpl-")
        seen += 1
        if seen == 5:
            break
    assert wait_for(lambda: blocks_free(server) < idle, timeout=10), "blocks never held"
    stream.close()  # the client goes away mid-stream
    assert wait_for(lambda: blocks_free(server) == idle, timeout=30), "blocks not freed"

    def cancelled_line():
        for line in server.logs().splitlines():
            if line.startswith("{") and request_id in line and "inference_complete" in line:
                return json.loads(line)
        return None
    line = wait_for(cancelled_line, timeout=10)
    assert line and line["status"] == "CANCELLED", line
    assert line["completion_tokens"] < 4000


def test_disconnect_while_waiting_for_a_whole_answer(server, model_id):
    def cancelled():
        return [line for line in server.logs().splitlines()
                if '"inference_complete"' in line and '"CANCELLED"' in line]
    before = len(cancelled())
    assert wait_for(lambda: metrics.value(server.metrics_text(),
                                          "snapserve_requests_running") == 0, timeout=30)
    idle = settled_blocks_free(server)
    body = json.dumps({"model": model_id, "prompt": PROMPT, "max_tokens": 4000,
                       "ignore_eos": True}).encode()
    sock = socket.create_connection(("127.0.0.1", server.http_port), timeout=30)
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                 b"Authorization: Bearer " + TOKEN.encode() +
                 b"\r\nContent-Type: application/json\r\nContent-Length: " +
                 str(len(body)).encode() + b"\r\n\r\n" + body)
    assert wait_for(lambda: blocks_free(server) < idle, timeout=10), "blocks never held"
    sock.close()  # gone before the answer
    assert wait_for(lambda: blocks_free(server) == idle, timeout=30), "blocks not freed"
    assert wait_for(lambda: len(cancelled()) == before + 1, timeout=10)
    line = json.loads(cancelled()[-1])
    assert line["completion_tokens"] < 4000


def test_concurrent_http_streams_and_grpc_calls(client, stub, pb, model_id):
    prompts = [f"{PROMPT}", "Water boils at", "The largest planet is", "Once upon a time"]
    expected = {p: grpc_generate(stub, pb, 8, prompt=p).text for p in prompts}

    def http_stream(p):
        chunks = list(client.completions.create(model=model_id, prompt=p, max_tokens=8,
                                                temperature=0, stream=True,
                                                stream_options={"include_usage": True}))
        assert chunks[-1].usage is not None and chunks[-2].choices[0].finish_reason
        return p, "".join(c.choices[0].text for c in chunks if c.choices)

    def grpc_call(p):
        return p, grpc_generate(stub, pb, 8, prompt=p).text

    # 64 HTTP streams and 16 gRPC calls at once: every one answered, each
    # with the text the prompt gets alone (CPU results do not depend on the
    # batch).
    with concurrent.futures.ThreadPoolExecutor(max_workers=80) as pool:
        futures = [pool.submit(http_stream, prompts[i % 4]) for i in range(64)]
        futures += [pool.submit(grpc_call, prompts[i % 4]) for i in range(16)]
        results = [f.result(timeout=300) for f in futures]
    assert len(results) == 80
    for p, text in results:
        assert text == expected[p], p


# ------------------------------------------------------------ prefix cache ---

def test_cached_tokens_are_the_engines(start_server, model_path, pb):
    """usage.prompt_tokens_details.cached_tokens is the engine's count of
    prompt tokens served from the prefix cache, as gRPC's Usage reports it."""
    pb2, pb2_grpc = pb
    port = free_port()
    s = start_server([f"--model={model_path}", f"--http-port={port}",
                      "--prefix-cache-memory=0.25"])
    prompt = " ".join(f"Line {i}: the quick brown fox jumps over the lazy dog." for i in range(60))
    with openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused",
                       max_retries=0) as c, grpc.insecure_channel(s.target) as channel:
        first = c.completions.create(model=c.models.list().data[0].id, prompt=prompt,
                                     max_tokens=4, temperature=0)
        again = c.completions.create(model=first.model, prompt=prompt, max_tokens=4,
                                     temperature=0)
        g = pb2_grpc.GenerationStub(channel).Generate(pb2.GenerateRequest(
            prompt=prompt, stopping=pb2.StoppingCriteria(max_new_tokens=4)), timeout=60)
    assert first.usage.prompt_tokens > 256  # longer than one cached chunk
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    assert again.usage.prompt_tokens_details.cached_tokens == g.usage.cached_prompt_tokens > 0
    assert again.choices[0].text == first.choices[0].text == g.text


# --------------------------------------------------------------------- TLS ---

def test_tls(start_server, model_path, tmp_path_factory):
    from test_tls import make_ca, make_leaf
    d = tmp_path_factory.mktemp("http-certs")
    make_ca(d, "ca")
    make_leaf(d, "server", "ca",
              "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
              "extendedKeyUsage=serverAuth\nsubjectAltName=IP:127.0.0.1,DNS:localhost\n")
    port = free_port()
    s = start_server([f"--model={model_path}", f"--http-port={port}",
                      f"--tls-cert={d / 'server.pem'}", f"--tls-key={d / 'server.key'}"],
                     wait=False)
    s.wait_serving(credentials=grpc.ssl_channel_credentials((d / "ca.pem").read_bytes()))
    context = ssl.create_default_context(cafile=str(d / "ca.pem"))
    with openai.OpenAI(base_url=f"https://127.0.0.1:{port}/v1", api_key="unused",
                       http_client=openai.DefaultHttpx2Client(verify=context),
                       max_retries=0) as c:
        r = c.completions.create(prompt=PROMPT, model=c.models.list().data[0].id, max_tokens=4,
                                 temperature=0)
        assert r.usage.completion_tokens > 0
    # Plain HTTP on the TLS port gets no answer.
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    with pytest.raises((http.client.HTTPException, ConnectionError, OSError)):
        conn.request("GET", "/health")
        conn.getresponse().read()
    conn.close()
