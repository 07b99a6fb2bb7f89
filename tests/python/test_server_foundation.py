"""The `snapserve` process as a platform would run it: health, reflection,
metrics, flags and environment variables, clean SIGTERM. Real grpcio clients."""
import json
import os
import signal
import socket
import subprocess
import time
import warnings

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from conftest import BUILD_DIR
from snapserve_testkit.metrics import scrape

SNAPSERVE = BUILD_DIR / "server" / "snapserve"

METRIC_NAMES = [
    "snapserve_requests_total", "snapserve_request_duration_seconds",
    "snapserve_queue_duration_seconds", "snapserve_time_to_first_token_seconds",
    "snapserve_inter_token_latency_seconds", "snapserve_prompt_tokens_total",
    "snapserve_generated_tokens_total", "snapserve_kv_compression_ratio",
    "snapserve_kv_entries_before_total", "snapserve_kv_entries_after_total",
    "snapserve_snapkv_duration_seconds", "snapserve_kv_retained_attention_ratio",
    "snapserve_kv_cache_usage_ratio",
    "snapserve_kv_cache_blocks_free", "snapserve_requests_running",
    "snapserve_requests_waiting", "snapserve_batch_size",
]


def test_help_lists_every_flag_with_its_environment_variable():
    out = subprocess.run([str(SNAPSERVE), "--help"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0
    for flag in ["--model", "--port", "--metrics-port", "--metrics-host", "--kv-cache-memory",
                 "--max-queue", "--shutdown-grace", "--tls-cert", "--kv-capacity",
                 "--kv-window", "--auth-token-file"]:
        assert flag + "=" in out.stdout, flag
    assert "SNAPSERVE_KV_CACHE_MEMORY" in out.stdout


@pytest.mark.parametrize("args,needle", [
    (["--bogus=1"], "unknown flag --bogus"),
    (["--port=70000"], "--port"),
    (["--snapkv-kernel=4"], "odd"),
    (["--kv-window=64", "--kv-capacity=32"], "--kv-window"),
    (["--kv-cache-memory=lots"], "--kv-cache-memory"),
    (["--tls-cert=/x.pem"], "--tls-key"),
])
def test_bad_flags_exit_2_with_a_message(args, needle):
    out = subprocess.run([str(SNAPSERVE)] + args, capture_output=True, text=True, timeout=30)
    assert out.returncode == 2
    assert needle in out.stderr


def test_missing_model_fails_clearly(tmp_path):
    out = subprocess.run([str(SNAPSERVE), f"--model={tmp_path / 'nope.gguf'}", "--port=0",
                          "--metrics-port=0"], capture_output=True, text=True, timeout=60)
    assert out.returncode != 0
    assert "nope.gguf" in out.stdout + out.stderr


def test_bad_cpu_isa_fails_the_start_and_a_cap_is_logged(start_server, model_path):
    """SNAPSERVE_CPU_ISA (kernels/cpu/cpu_isa.h) is checked when the model loads,
    not at the first request; a valid cap shows in the startup log."""
    base = [str(SNAPSERVE), f"--model={model_path}", "--port=0", "--metrics-port=0"]
    env = dict(os.environ, SNAPSERVE_CPU_ISA="sse9")
    out = subprocess.run(base, capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode != 0
    expected = "SNAPSERVE_CPU_ISA=sse9: expected portable, avx2, avx512, avx512vnni or amx"
    assert expected in out.stdout + out.stderr
    server = start_server([f"--model={model_path}"], env={"SNAPSERVE_CPU_ISA": "portable"})
    assert "(CPU kernels: portable," in server.logs()


def test_health_reflection_metrics(start_server, model_path, pb):
    pb2, pb2_grpc = pb
    server = start_server([f"--model={model_path}"])
    with grpc.insecure_channel(server.target) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        assert health.Check(health_pb2.HealthCheckRequest()).status == \
            health_pb2.HealthCheckResponse.SERVING
        assert health.Check(health_pb2.HealthCheckRequest(
            service="snapserve.v1.Generation")).status == health_pb2.HealthCheckResponse.SERVING

        reflection = reflection_pb2_grpc.ServerReflectionStub(channel)
        responses = list(reflection.ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(list_services="")])))
        names = {s.name for s in responses[0].list_services_response.service}
        assert {"snapserve.v1.Generation", "grpc.health.v1.Health"} <= names

    text = scrape(server.metrics_port)
    for name in METRIC_NAMES:
        assert f"# TYPE {name} " in text, name


def _log_events(server, name):
    return [json.loads(line) for line in server.logs().splitlines()
            if line.startswith("{") and json.loads(line).get("event") == name]


def _non_loopback_ipv4():
    """An IPv4 address of this machine that is not loopback, or None. The UDP
    connect only picks the route's source address; nothing is sent."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("10.255.255.255", 1))
            address = s.getsockname()[0]
    except OSError:
        return None
    return None if address.startswith("127.") or address == "0.0.0.0" else address


def _can_connect(host, port):
    try:
        with socket.create_connection((host, port), timeout=3):
            return True
    except OSError:
        return False


def test_metrics_listen_on_the_grpc_host_unless_metrics_host_says(start_server, model_path):
    # The test kit starts every server with --host=127.0.0.1. /metrics used to
    # bind 0.0.0.0 whatever --host said, exposing it on every interface.
    loopback = start_server([f"--model={model_path}"])
    assert [e["address"] for e in _log_events(loopback, "metrics_listening")] == \
        [f"127.0.0.1:{loopback.metrics_port}"]
    assert "snapserve_requests_total" in scrape(loopback.metrics_port)
    everywhere = start_server([f"--model={model_path}"],
                              env={"SNAPSERVE_METRICS_HOST": "0.0.0.0"})
    assert [e["address"] for e in _log_events(everywhere, "metrics_listening")] == \
        [f"0.0.0.0:{everywhere.metrics_port}"]
    outside = _non_loopback_ipv4()
    if outside is None:
        warnings.warn("no non-loopback IPv4 address on this machine: the check that "
                      "127.0.0.1-only /metrics is unreachable from outside did not run")
        return
    assert not _can_connect(outside, loopback.metrics_port), outside
    assert _can_connect(outside, everywhere.metrics_port), outside  # the check can see a listener


def _raw_http(port, request):
    """Everything the server sends back for `request` until it closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(request.encode())
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    return data


def test_metrics_head_has_the_headers_and_no_body(start_server, model_path):
    server = start_server([f"--model={model_path}"])
    get = _raw_http(server.metrics_port, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    head = _raw_http(server.metrics_port, "HEAD /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    get_headers, get_body = get.split(b"\r\n\r\n", 1)
    head_headers, head_body = head.split(b"\r\n\r\n", 1)
    assert head_headers.startswith(b"HTTP/1.1 200 ")
    assert b"Content-Type: text/plain; version=0.0.4" in head_headers
    assert b"Content-Length: " in head_headers
    assert head_body == b"", head_body[:200]
    assert len(get_body) > 1000 and b"snapserve_requests_total" in get_body
    for path in ("/healthz", "/nowhere"):
        answer = _raw_http(server.metrics_port, f"HEAD {path} HTTP/1.1\r\nHost: x\r\n\r\n")
        assert answer.endswith(b"\r\n\r\n"), answer


def _log_lines(server):
    # The log file itself: logs() needs the process's log handle, closed by stop().
    text = server.log_path.read_text(errors="replace")
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def test_environment_variables_configure_the_server(start_server, model_path, pb):
    """SNAPSERVE_* variables set the flags: the model, the batch size (as
    GetModelInfo reports it) and the log level, whose effect is checked on the
    lines written: at `error` a serving server that answered a call writes no
    info line, at `info` the same run writes them, and `error` lines still
    appear at `error`."""
    pb2, pb2_grpc = pb

    def serve_one_call(level):
        server = start_server([], env={"SNAPSERVE_MODEL": str(model_path),
                                       "SNAPSERVE_MAX_BATCH_SIZE": "3",
                                       "SNAPSERVE_LOG_LEVEL": level})
        with grpc.insecure_channel(server.target) as ch:
            stub = pb2_grpc.GenerationStub(ch)
            assert stub.GetModelInfo(pb2.GetModelInfoRequest(), timeout=10).max_batch_size == 3
            stub.Generate(pb2.GenerateRequest(prompt="Hi", stopping=pb2.StoppingCriteria(
                max_new_tokens=1)), timeout=60)
        server.stop()
        return _log_lines(server)

    info = serve_one_call("info")
    events = {line["event"] for line in info}
    assert {"grpc_listening", "serving", "inference_complete", "stopped"} <= events, events
    assert {line["level"] for line in info} == {"info"}

    quiet = serve_one_call("error")
    assert quiet == [], f"info lines written at --log-level=error: {quiet[:3]}"

    failing = start_server([], env={"SNAPSERVE_MODEL": "/nonexistent/model.gguf",
                                    "SNAPSERVE_LOG_LEVEL": "error"}, wait=False)
    assert failing.proc.wait(timeout=60) != 0
    lines = _log_lines(failing)
    assert [(line["level"], line["event"]) for line in lines] == [("error", "startup_failed")], lines
    assert "/nonexistent/model.gguf" in lines[0]["error"]


def test_sigterm_exits_zero_and_logs_json(start_server, model_path):
    import json
    server = start_server([f"--model={model_path}", "--shutdown-grace=5"])
    server.proc.send_signal(signal.SIGTERM)
    assert server.proc.wait(timeout=30) == 0
    events = [json.loads(line)["event"] for line in server.logs().splitlines() if line.startswith("{")]
    assert events[-2:] == ["draining", "stopped"], events


def test_cli_health_and_info(start_server, model_path):
    # snapserve-cli once aborted on `health` (it sent a default ByteBuffer,
    # which gRPC rejects as no message at all).
    server = start_server([f"--model={model_path}"])
    cli = str(BUILD_DIR / "server" / "snapserve-cli")
    out = subprocess.run([cli, f"--target={server.target}", "health"], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "SERVING"
    info = subprocess.run([cli, f"--target={server.target}", "info"], capture_output=True,
                          text=True, timeout=60)
    assert info.returncode == 0, info.stderr
    assert 'architecture: "llama"' in info.stdout
