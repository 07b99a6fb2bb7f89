"""OpenTelemetry traces (--otlp-endpoint; docs/metrics.md, "Traces") against
a real snapserve: an OTLP/HTTP receiver run by the test takes what the server
POSTs to /v1/traces, and the `opentelemetry-proto` package (the OpenTelemetry
project's own generated classes) decodes it, so a field the encoding names
wrongly fails the parse. Checked: the span tree of a request (queue, one
prefill span per prompt chunk, compression, decode) and its timing, the
GenAI and snapserve.kv attributes against the response's own usage, a
client's W3C traceparent (gRPC metadata and HTTP header) giving the trace id
and the parent span id, and a dead collector costing requests nothing while
the dropped-span counter rises."""
import base64
import http.server
import json
import secrets
import threading

import grpc
import openai
import pytest
from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from snapserve_testkit import free_port, metrics
from snapserve_testkit.calls import wait_for

SERVICE = "snapserve-under-test"
STEP = 16  # --max-step-tokens: a prompt of a few dozen tokens runs in several chunks
LONG_PROMPT = ("The history of the printing press begins in the fifteenth century, when "
               "Johannes Gutenberg combined movable metal type, oil-based ink and a wooden "
               "screw press into a system that could print books quickly and cheaply. "
               "Within fifty years presses were working in more than two hundred cities.")


def otlp_json_to_proto(body):
    """An OTLP/JSON body as ExportTraceServiceRequest. OTLP/JSON writes ids
    as hex where proto3's JSON mapping has base64 (the OTLP specification,
    "JSON Protobuf Encoding"), so they are turned into base64 first; every
    other field is parsed by protobuf's own json_format, which refuses
    unknown names."""
    doc = json.loads(body)
    for rs in doc.get("resourceSpans", []):
        for ss in rs.get("scopeSpans", []):
            for span in ss.get("spans", []):
                for key in ("traceId", "spanId", "parentSpanId"):
                    if key in span:
                        assert span[key] == span[key].lower(), span[key]
                        span[key] = base64.b64encode(bytes.fromhex(span[key])).decode()
    return json_format.Parse(json.dumps(doc), ExportTraceServiceRequest())


class Receiver:
    """An OTLP/HTTP receiver: POST /v1/traces with application/json."""

    def __init__(self):
        self.requests = []  # ExportTraceServiceRequest, in arrival order
        self.errors = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                try:
                    assert self.path == "/v1/traces", self.path
                    assert self.headers["Content-Type"] == "application/json"
                    parsed = otlp_json_to_proto(body)
                    with receiver.lock:
                        receiver.requests.append(parsed)
                except Exception as e:  # reported by the tests, not lost in a thread
                    with receiver.lock:
                        receiver.errors.append(repr(e))
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def spans(self):
        """[(resource attributes dict, Span)] of everything received."""
        with self.lock:
            assert not self.errors, self.errors
            return [({a.key: a.value.string_value for a in rs.resource.attributes}, span)
                    for req in self.requests for rs in req.resource_spans
                    for ss in rs.scope_spans for span in ss.spans]

    def trace(self, trace_id, count=None, timeout=30):
        """The spans of `trace_id` (bytes), once its root has arrived (all of a
        request's spans travel in one export)."""
        def found():
            spans = [s for _, s in self.spans() if s.trace_id == trace_id]
            return spans if any(s.name == "snapserve.generate" for s in spans) else None
        spans = wait_for(found, timeout=timeout)
        assert spans, f"no trace {trace_id.hex()} after {timeout}s"
        return spans

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def receiver():
    r = Receiver()
    yield r
    r.close()


@pytest.fixture(scope="module")
def server(start_module_server, model_path, receiver):
    port = free_port()
    s = start_module_server([f"--model={model_path}", f"--http-port={port}",
                             f"--max-step-tokens={STEP}",
                             f"--otlp-endpoint=http://127.0.0.1:{receiver.port}",
                             f"--otlp-service-name={SERVICE}"])
    s.http_port = port
    return s


def new_traceparent(flags="01"):
    trace_id, span_id = secrets.token_bytes(16), secrets.token_bytes(8)
    return trace_id, span_id, f"00-{trace_id.hex()}-{span_id.hex()}-{flags}"


def attrs(span):
    """{key: python value} of a span's attributes."""
    out = {}
    for a in span.attributes:
        kind = a.value.WhichOneof("value")
        v = getattr(a.value, kind)
        out[a.key] = list(x.string_value for x in v.values) if kind == "array_value" else v
    return out


def generate(stub, pb, traceparent=None, **kwargs):
    pb2, _ = pb
    metadata = (("traceparent", traceparent),) if traceparent else None
    return stub.Generate(pb2.GenerateRequest(**kwargs), metadata=metadata, timeout=120)


def test_grpc_request_gives_the_span_tree(server, stub, pb, receiver):
    pb2, _ = pb
    trace_id, client_span, traceparent = new_traceparent()
    r = generate(stub, pb, traceparent, prompt=LONG_PROMPT,
                 sampling=pb2.SamplingParams(temperature=0.7, top_p=0.9, seed=3),
                 stopping=pb2.StoppingCriteria(max_new_tokens=6),
                 kv_compression=pb2.KvCompression(method=pb2.KvCompression.SNAPKV, window_size=4,
                                                  max_capacity_prompt=16, kernel_size=3))
    assert r.usage.kv_kept_entries < r.usage.kv_prompt_entries  # it was compressed
    spans = receiver.trace(trace_id)
    resources = {res["service.name"] for res, s in receiver.spans() if s.trace_id == trace_id}
    assert resources == {SERVICE}

    roots = [s for s in spans if s.name == "snapserve.generate"]
    assert len(roots) == 1
    root = roots[0]
    assert root.kind == Span.SPAN_KIND_SERVER
    assert root.parent_span_id == client_span  # the client's span is its parent
    assert len(root.span_id) == 8 and root.span_id != client_span
    assert root.status.code != root.status.STATUS_CODE_ERROR
    children = [s for s in spans if s is not root]
    assert {s.name for s in children} == {"snapserve.queue", "snapserve.prefill",
                                          "snapserve.compression", "snapserve.decode"}
    for s in children:
        assert s.parent_span_id == root.span_id and s.kind == Span.SPAN_KIND_INTERNAL
        assert root.start_time_unix_nano <= s.start_time_unix_nano <= s.end_time_unix_nano
        assert s.end_time_unix_nano <= root.end_time_unix_nano
    assert len({s.span_id for s in spans}) == len(spans)

    by_name = lambda name: sorted((s for s in children if s.name == name),
                                  key=lambda s: s.start_time_unix_nano)
    (queue,), (compression,), (decode,) = (by_name("snapserve.queue"),
                                           by_name("snapserve.compression"),
                                           by_name("snapserve.decode"))
    prefill = by_name("snapserve.prefill")
    # One span per chunk of at most STEP tokens, in order, after the queue.
    assert len(prefill) == -(-r.usage.prompt_tokens // STEP)
    assert [attrs(s)["snapserve.prefill.chunk"] for s in prefill] == list(range(len(prefill)))
    assert sum(attrs(s)["snapserve.prefill.tokens"] for s in prefill) == r.usage.prompt_tokens
    assert all(attrs(s)["snapserve.prefill.tokens"] <= STEP for s in prefill)
    assert queue.end_time_unix_nano <= prefill[0].start_time_unix_nano
    for a, b in zip(prefill, prefill[1:]):
        assert a.end_time_unix_nano <= b.start_time_unix_nano
    # The selection runs inside the last chunk; decoding follows it.
    assert prefill[-1].start_time_unix_nano <= compression.start_time_unix_nano
    assert compression.end_time_unix_nano == prefill[-1].end_time_unix_nano
    assert decode.start_time_unix_nano >= prefill[-1].end_time_unix_nano

    a = attrs(root)
    assert a["gen_ai.operation.name"] == "text_completion"
    assert a["gen_ai.request.model"]
    assert a["gen_ai.response.id"] == r.request_id
    assert a["gen_ai.request.max_tokens"] == 6
    assert a["gen_ai.request.temperature"] == pytest.approx(0.7)
    assert a["gen_ai.request.top_p"] == pytest.approx(0.9)
    assert a["gen_ai.usage.input_tokens"] == r.usage.prompt_tokens
    assert a["gen_ai.usage.output_tokens"] == r.usage.completion_tokens
    assert a["gen_ai.usage.cache_read.input_tokens"] == r.usage.cached_prompt_tokens
    assert a["gen_ai.response.finish_reasons"] in (["length"], ["eos"])
    assert a["snapserve.api"] == "grpc"
    assert a["snapserve.kv.method"] == "snapkv"
    assert a["snapserve.kv.original_entries"] == r.usage.kv_prompt_entries
    assert a["snapserve.kv.kept_entries"] == r.usage.kv_kept_entries
    assert a["snapserve.kv.compression_ratio"] == pytest.approx(r.usage.compression_ratio,
                                                                rel=1e-6)
    assert a["snapserve.kv.retained_attention"] == pytest.approx(
        r.usage.retained_attention_ratio, rel=1e-5)
    assert attrs(decode)["gen_ai.usage.output_tokens"] == r.usage.completion_tokens


def test_http_traceparent_header_continues_the_trace(server, receiver, stub, pb):
    pb2, _ = pb
    model_id = stub.GetModelInfo(pb2.GetModelInfoRequest(), timeout=10).model_id
    trace_id, client_span, traceparent = new_traceparent()
    with openai.OpenAI(base_url=f"http://127.0.0.1:{server.http_port}/v1", api_key="unused",
                       max_retries=0, timeout=120) as client:
        r = client.chat.completions.create(
            model=model_id, messages=[{"role": "user", "content": "Say hello."}], max_tokens=4,
            temperature=0, extra_headers={"traceparent": traceparent})
    spans = receiver.trace(trace_id)
    (root,) = [s for s in spans if s.name == "snapserve.generate"]
    assert root.parent_span_id == client_span
    a = attrs(root)
    assert a["gen_ai.operation.name"] == "chat"
    assert a["gen_ai.request.model"] == model_id
    assert a["snapserve.api"] == "http"
    assert a["gen_ai.usage.input_tokens"] == r.usage.prompt_tokens
    assert a["gen_ai.usage.output_tokens"] == r.usage.completion_tokens
    assert a["snapserve.kv.method"] == "none"  # a short prompt is never compressed
    assert "gen_ai.request.top_p" not in a  # not set by the request
    assert not [s for s in spans if s.name == "snapserve.compression"]


def test_missing_or_invalid_traceparent_starts_a_new_trace(server, receiver, stub, pb):
    pb2, _ = pb
    bad_trace, _, good = new_traceparent()
    invalid = good.upper()  # uppercase hex is invalid (W3C Trace Context)
    ids = []
    for traceparent in (None, invalid):
        r = generate(stub, pb, traceparent, prompt="Hello",
                     stopping=pb2.StoppingCriteria(max_new_tokens=2))
        def root_of_request():
            return [s for _, s in receiver.spans() if s.name == "snapserve.generate"
                    and attrs(s)["gen_ai.response.id"] == r.request_id]
        (root,) = wait_for(root_of_request, timeout=30)
        assert root.parent_span_id == b""  # a root span: no remote parent
        assert len(root.trace_id) == 16 and root.trace_id != bytes(16)
        ids.append(root.trace_id)
    assert ids[1] != bad_trace and ids[0] != ids[1]


def test_unsampled_parent_is_not_exported(server, receiver, stub, pb):
    pb2, _ = pb
    unsampled_trace, _, unsampled = new_traceparent(flags="00")
    sampled_trace, _, sampled = new_traceparent()
    generate(stub, pb, unsampled, prompt="Hello", stopping=pb2.StoppingCriteria(max_new_tokens=1))
    generate(stub, pb, sampled, prompt="Hello", stopping=pb2.StoppingCriteria(max_new_tokens=1))
    # The exporter keeps arrival order: once the later request's trace is in,
    # the earlier one's would have been too.
    receiver.trace(sampled_trace)
    assert not [s for _, s in receiver.spans() if s.trace_id == unsampled_trace]


def test_a_refused_request_is_one_span(server, receiver, stub, pb):
    pb2, _ = pb
    trace_id, _, traceparent = new_traceparent()
    with pytest.raises(grpc.RpcError) as e:
        generate(stub, pb, traceparent, prompt="Hello",
                 stopping=pb2.StoppingCriteria(max_new_tokens=10**9))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    (root,) = receiver.trace(trace_id)
    assert attrs(root)["snapserve.status"] == "INVALID_ARGUMENT"
    assert "gen_ai.usage.input_tokens" not in attrs(root)
    # A client's mistake is not the server's error (OpenTelemetry's gRPC conventions).
    assert root.status.code != root.status.STATUS_CODE_ERROR


def test_exported_counter_matches_what_the_receiver_got(server, receiver, stub, pb):
    pb2, _ = pb
    trace_id, _, traceparent = new_traceparent()
    generate(stub, pb, traceparent, prompt="Hello", stopping=pb2.StoppingCriteria(max_new_tokens=1))
    receiver.trace(trace_id)

    def counts():
        text = server.metrics_text()
        return (metrics.value(text, "snapserve_trace_spans_exported_total"),
                metrics.total(text, "snapserve_trace_spans_dropped_total"))

    # The counter moves once the collector's answer is read, just after it arrives.
    assert wait_for(lambda: counts()[0] == len(receiver.spans()), timeout=10), \
        (counts(), len(receiver.spans()))
    assert counts()[1] == 0


def test_a_dead_collector_costs_requests_nothing(start_server, model_path, pb):
    pb2, pb2_grpc = pb
    dead = free_port()  # nothing listens there
    s = start_server([f"--model={model_path}", f"--otlp-endpoint=http://127.0.0.1:{dead}"])
    with grpc.insecure_channel(s.target) as channel:
        stub = pb2_grpc.GenerationStub(channel)
        for _ in range(4):
            r = stub.Generate(pb2.GenerateRequest(
                prompt="Hello", stopping=pb2.StoppingCriteria(max_new_tokens=2)), timeout=60)
            assert r.usage.completion_tokens > 0

    def dropped():
        return metrics.total(s.metrics_text(), "snapserve_trace_spans_dropped_total",
                             {"reason": "export_failed"}) or 0

    assert wait_for(lambda: dropped() > 0, timeout=20), s.metrics_text()
    assert metrics.value(s.metrics_text(), "snapserve_trace_spans_exported_total") == 0
    assert "trace_export_failed" in s.logs()
