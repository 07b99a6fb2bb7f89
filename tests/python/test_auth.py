"""Bearer-token authentication (--auth-token-file; README, "Authentication";
docs/api.md, "Status codes") against a real snapserve with real grpcio clients:
every Generation RPC needs `authorization: Bearer <token>`, anything else is
UNAUTHENTICATED without the token echoed back; grpc.health.v1 stays open."""
import os
import secrets
import subprocess

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from snapserve_testkit import build_dir

TOKEN = "snapserve-" + secrets.token_urlsafe(24)


def one_byte_changed(token):
    last = token[-1]
    return token[:-1] + ("A" if last != "A" else "B")


@pytest.fixture(scope="module")
def server(start_module_server, model_path, tmp_path_factory):
    token_file = tmp_path_factory.mktemp("auth") / "token"
    token_file.write_text(TOKEN + "\n")  # the trailing newline is trimmed
    # The environment variable, as the Kubernetes Secret mount sets it.
    return start_module_server([f"--model={model_path}"],
                               env={"SNAPSERVE_AUTH_TOKEN_FILE": str(token_file)})


def calls(pb, stub):
    """Each Generation RPC as a function of the call's metadata."""
    pb2, _ = pb
    small = pb2.GenerateRequest(prompt="Hello", stopping=pb2.StoppingCriteria(max_new_tokens=2))
    return {
        "Generate": lambda md: stub.Generate(small, metadata=md, timeout=60),
        "GenerateStream": lambda md: list(stub.GenerateStream(small, metadata=md, timeout=60)),
        "Tokenize": lambda md: stub.Tokenize(pb2.TokenizeRequest(text="Hello"), metadata=md,
                                             timeout=10),
        "GetModelInfo": lambda md: stub.GetModelInfo(pb2.GetModelInfoRequest(), metadata=md,
                                                     timeout=10),
    }


REFUSED = {
    "no header": (),
    "wrong scheme": (("authorization", f"Basic {TOKEN}"),),
    "no scheme": (("authorization", TOKEN),),
    "wrong token": (("authorization", "Bearer not-the-token"),),
    "one byte changed": (("authorization", f"Bearer {one_byte_changed(TOKEN)}"),),
    "prefix of the token": (("authorization", f"Bearer {TOKEN[:-1]}"),),
    "token plus one byte": (("authorization", f"Bearer {TOKEN}x"),),
}


@pytest.mark.parametrize("rpc", ["Generate", "GenerateStream", "Tokenize", "GetModelInfo"])
def test_every_rpc_needs_the_token(server, stub, pb, rpc):
    call = calls(pb, stub)[rpc]
    for case, md in REFUSED.items():
        with pytest.raises(grpc.RpcError) as err:
            call(md)
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED, (case, err.value.details())
        details = err.value.details() or ""
        assert TOKEN[:8] not in details and "not-the-token" not in details, (case, details)
        assert len(details) < 100, details
    result = call((("authorization", f"Bearer {TOKEN}"),))
    if rpc == "Generate":
        assert len(result.token_ids) >= 1
    elif rpc == "GenerateStream":
        assert result, "the stream wrote nothing"
    elif rpc == "Tokenize":
        assert len(result.ids) >= 1
    else:
        assert result.vocab_size == 49152
    # The scheme name is case-insensitive (RFC 7235).
    call((("authorization", f"bearer {TOKEN}"),))


def test_refused_generation_calls_are_counted_unauthenticated(server, stub, pb):
    """snapserve_requests_total counts Generate/GenerateStream calls refused
    for want of the token under status="UNAUTHENTICATED" (docs/metrics.md),
    and counts nothing else for them."""
    from snapserve_testkit.metrics import total

    def counts():
        text = server.metrics_text()
        return (total(text, "snapserve_requests_total", {"status": "UNAUTHENTICATED"}) or 0,
                total(text, "snapserve_requests_total") or 0)

    before_refused, before_all = counts()
    call = calls(pb, stub)
    for rpc in ("Generate", "GenerateStream"):
        for md in REFUSED.values():
            with pytest.raises(grpc.RpcError):
                call[rpc](md)
    after_refused, after_all = counts()
    refused = 2 * len(REFUSED)
    assert after_refused - before_refused == refused
    assert after_all - before_all == refused


def test_health_is_open_and_server_stays_healthy(server, stub, pb):
    with grpc.insecure_channel(server.target) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for service in ("", "snapserve.v1.Generation"):
            r = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
            assert r.status == health_pb2.HealthCheckResponse.SERVING, service
    # A burst of refused calls leaves the server serving authenticated ones.
    pb2, _ = pb
    for _ in range(50):
        with pytest.raises(grpc.RpcError):
            stub.GetModelInfo(pb2.GetModelInfoRequest(),
                              metadata=(("authorization", "Bearer x"),), timeout=10)
    info = stub.GetModelInfo(pb2.GetModelInfoRequest(),
                             metadata=(("authorization", f"Bearer {TOKEN}"),), timeout=10)
    assert info.vocab_size == 49152
    assert server.proc.poll() is None
    assert '"auth":true' in server.logs().replace(" ", "")
    assert TOKEN not in server.logs(), "the token reached the log"
    # /metrics stays open (Prometheus scrapes without a token).
    assert "snapserve_" in server.metrics_text()


@pytest.mark.parametrize("content, message", [
    (None, "cannot read"),
    ("", "empty"),
    ("\n", "empty"),
    ("a" * 5000, "longer than 4096"),
    ("two\nlines\n", "one line"),
])
def test_bad_token_file_fails_startup(start_server, model_path, tmp_path, content, message):
    path = tmp_path / "token"
    if content is not None:
        path.write_text(content)
    s = start_server([f"--model={model_path}", f"--auth-token-file={path}"], wait=False)
    assert s.proc.wait(timeout=30) == 2
    logs = s.logs()
    assert "startup_failed" in logs and message in logs, logs
    if content:
        assert "lines" not in logs.replace("one line", ""), "the error echoes the file"


def test_cli_sends_the_token(server, tmp_path):
    """snapserve-cli reaches a server that needs a token with
    --auth-token-file (or SNAPSERVE_AUTH_TOKEN_FILE, as the server reads it);
    without one its calls end UNAUTHENTICATED (exit 1); health needs none."""
    cli = str(build_dir() / "server" / "snapserve-cli")
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\r\n")
    base = [cli, f"--target={server.target}"]
    env = {k: v for k, v in os.environ.items() if k != "SNAPSERVE_AUTH_TOKEN_FILE"}

    def cli_run(args, extra_env=None):
        return subprocess.run(base + args, capture_output=True, text=True, timeout=60,
                              env={**env, **(extra_env or {})})

    refused = cli_run(["tokenize", "Hello"])
    assert refused.returncode == 1 and "error: 16 " in refused.stderr, refused.stderr
    assert cli_run(["health"]).stdout.strip() == "SERVING"
    flag = cli_run([f"--auth-token-file={token_file}", "tokenize", "Hello"])
    assert flag.returncode == 0 and flag.stdout.split(), flag.stderr
    by_env = cli_run(["generate", "--max-new-tokens=2", "Hello"],
                     {"SNAPSERVE_AUTH_TOKEN_FILE": str(token_file)})
    assert by_env.returncode == 0 and "2 generated tokens" in by_env.stderr, by_env.stderr
    # Typos are usage errors (exit 2), never an abort.
    for bad in (["--timeout=soon", "health"], [f"--auth-token-file={tmp_path}/missing", "health"],
                [f"--auth-token-file={token_file}", "generate", "--max-new-tokens=x", "Hi"]):
        out = cli_run(bad)
        assert out.returncode == 2 and out.stderr.startswith("error: "), (bad, out.stderr)
