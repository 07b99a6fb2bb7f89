"""Faults on a real `snapserve` process, each test with a server of its own
(tests/python/test_server_e2e.py shares one for everything else): an engine
fault reaches the client as INTERNAL with only the request id, request bytes
that do not parse get INTERNAL naming the message type, and SIGTERM drains
the running streams while new calls are refused (docs/api.md, "Status
codes"; docs/architecture.md, "Startup and shutdown").
"""
import json
import signal
import threading
import time

import grpc
import pytest

from snapserve_testkit.calls import check_serves, stream_all, wait_for

SHORT_PROMPT = "The capital of France is"


def check_good_request(stub, pb):
    """The server still answers a small valid request correctly."""
    check_serves(stub, pb[0], SHORT_PROMPT)


# ------------------------------------------------------- engine faults ---

def _vm_size(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    raise LookupError("no VmSize")


def test_internal_error_tells_the_client_only_the_request_id(start_server, model_path, pb):
    """An engine fault is INTERNAL with a short message naming the request id;
    the exception text (c10::Error::what(), backtrace included) goes only to
    the log. The fault: an address-space limit set on the running server
    leaves prefill (8000 tokens, about 50 MB per MLP activation) unable to
    allocate; the limit is lifted again and the server keeps serving."""
    import resource
    pb2, pb2_grpc = pb
    server = start_server([f"--model={model_path}", "--kv-cache-memory=512MiB",
                           "--default-kv-method=none"])
    request = pb2.GenerateRequest(request_id="prefill-cannot-allocate",
                                  input_ids=pb2.TokenIds(ids=[42] * 8000),
                                  stopping=pb2.StoppingCriteria(max_new_tokens=1))
    with grpc.insecure_channel(server.target) as channel:
        stub = pb2_grpc.GenerationStub(channel)
        check_good_request(stub, pb)
        unlimited = resource.prlimit(server.pid, resource.RLIMIT_AS)
        resource.prlimit(server.pid, resource.RLIMIT_AS,
                         (_vm_size(server.pid) + (32 << 20), unlimited[1]))
        try:
            with pytest.raises(grpc.RpcError) as err:
                stub.Generate(request, timeout=120)
        finally:
            resource.prlimit(server.pid, resource.RLIMIT_AS, unlimited)
        assert err.value.code() == grpc.StatusCode.INTERNAL, err.value.details()
        assert err.value.details() == ("internal error in request prefill-cannot-allocate; "
                                       "the details are in the server log")
        check_good_request(stub, pb)

    def log_line():
        for line in server.logs().splitlines():
            if '"prefill-cannot-allocate"' in line and "inference_complete" in line:
                return json.loads(line)
        return None
    line = wait_for(log_line, timeout=5)
    assert line and line["status"] == "INTERNAL", server.logs()[-2000:]
    assert line["error"].startswith("prefill failed: ") and "alloc" in line["error"], line["error"]


# ------------------------------------------------------------ SIGTERM ---

def test_sigterm_drains_running_streams(start_server, model_path, pb):
    pb2, pb2_grpc = pb
    grace = 30
    server = start_server([f"--model={model_path}", f"--shutdown-grace={grace}"])
    n_streams, max_new = 3, 24
    results = [None] * n_streams
    first_message = [threading.Event() for _ in range(n_streams)]
    finished_at = [None] * n_streams
    with grpc.insecure_channel(server.target) as channel:
        stub = pb2_grpc.GenerationStub(channel)

        def run(i):
            messages = []
            try:
                for m in stub.GenerateStream(pb2.GenerateRequest(
                        prompt=f"Stream {i} tells a story:",
                        stopping=pb2.StoppingCriteria(max_new_tokens=max_new, ignore_eos=True)),
                        timeout=120):
                    messages.append(m)
                    first_message[i].set()
                results[i] = (grpc.StatusCode.OK, messages)
            except grpc.RpcError as e:
                results[i] = (e.code(), messages)
                first_message[i].set()
            finished_at[i] = time.time()

        threads = [threading.Thread(target=run, args=(i,)) for i in range(n_streams)]
        for t in threads:
            t.start()
        for e in first_message:
            assert e.wait(60)
        term_at = time.time()
        server.proc.send_signal(signal.SIGTERM)
        time.sleep(0.3)  # the signal thread flips the service to draining

        # New calls are refused while the old ones drain.
        refused_at = None
        with pytest.raises(grpc.RpcError) as err:
            stub.Generate(pb2.GenerateRequest(prompt=SHORT_PROMPT), timeout=10)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE, err.value.details()
        with pytest.raises(grpc.RpcError) as err:
            stream_all(stub, pb2.GenerateRequest(prompt=SHORT_PROMPT), timeout=10)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE, err.value.details()
        refused_at = time.time()

        for t in threads:
            t.join(timeout=grace + 30)
        rc = server.proc.wait(timeout=grace + 10)
        exited_at = time.time()

    assert rc == 0, server.logs()
    assert exited_at - term_at < grace
    for code, messages in results:
        assert code == grpc.StatusCode.OK
        assert messages[-1].finish_reason == pb2.LENGTH
        assert len([t for m in messages for t in m.token_ids]) == max_new
    # The refusals came while the streams were still running.
    assert refused_at < max(finished_at), "streams ended before the refusal was checked"
    assert '"draining"' in server.logs()



# ------------------------------------------------ unparseable requests ---

# Field 1 with wire type 7, which the protobuf wire format does not define.
GARBAGE = b"\x0f\xff\xff"
METHODS = [("Generate", "GenerateRequest", False), ("GenerateStream", "GenerateRequest", True),
           ("Tokenize", "TokenizeRequest", False), ("GetModelInfo", "GetModelInfoRequest", False)]


def _send_raw(channel, method, streaming, payload, metadata=None):
    """The bytes as the request of `method`, through grpcio with no
    serializer; the response bytes (a list for a stream)."""
    path = f"/snapserve.v1.Generation/{method}"
    if streaming:
        return list(channel.unary_stream(path)(payload, timeout=30, metadata=metadata))
    return channel.unary_unary(path)(payload, timeout=30, metadata=metadata)


def test_unparseable_request_is_internal_naming_the_message(start_server, model_path, pb):
    """gRPC's status-code table gives INTERNAL for "error parsing request
    proto"; the callback API would answer UNIMPLEMENTED with no message. The
    call is not counted as a request, and the server keeps serving."""
    from google.protobuf.message import DecodeError
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    from snapserve_testkit.metrics import total
    pb2, pb2_grpc = pb
    server = start_server([f"--model={model_path}", "--kv-cache-memory=64MiB",
                           "--default-kv-method=none"])
    with grpc.insecure_channel(server.target) as channel:
        before = total(server.metrics_text(), "snapserve_requests_total") or 0
        for method, message, streaming in METHODS:
            request_type = getattr(pb2, message).DESCRIPTOR.full_name
            with pytest.raises(DecodeError):  # the oracle: protobuf's own parser refuses the bytes
                getattr(pb2, message).FromString(GARBAGE)
            with pytest.raises(grpc.RpcError) as err:
                _send_raw(channel, method, streaming, GARBAGE)
            assert err.value.code() == grpc.StatusCode.INTERNAL, (method, err.value.code())
            assert err.value.details() == f"request bytes do not parse as {request_type}", method

        # The same raw path carries a valid request to an answer.
        raw = _send_raw(channel, "Tokenize", False, pb2.TokenizeRequest(text="Hi").SerializeToString())
        assert list(pb2.TokenizeResponse.FromString(raw).ids)
        check_good_request(pb2_grpc.GenerationStub(channel), pb)
        r = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
        assert r.status == health_pb2.HealthCheckResponse.SERVING
        # Only check_good_request's call was counted.
        assert (total(server.metrics_text(), "snapserve_requests_total") or 0) == before + 1


def test_unparseable_request_without_the_token_is_unauthenticated(start_server, model_path,
                                                                   tmp_path):
    """With --auth-token-file the token is checked first, as for any call."""
    token_file = tmp_path / "token"
    token_file.write_text("unparsed-request-token\n")
    server = start_server([f"--model={model_path}", f"--auth-token-file={token_file}",
                           "--kv-cache-memory=64MiB", "--default-kv-method=none"])
    with grpc.insecure_channel(server.target) as channel:
        with pytest.raises(grpc.RpcError) as err:
            _send_raw(channel, "Generate", False, GARBAGE)
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        with pytest.raises(grpc.RpcError) as err:
            _send_raw(channel, "Generate", False, GARBAGE,
                      metadata=(("authorization", "Bearer unparsed-request-token"),))
        assert err.value.code() == grpc.StatusCode.INTERNAL
        assert err.value.details() == "request bytes do not parse as snapserve.v1.GenerateRequest"
