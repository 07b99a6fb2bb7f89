"""Shared pytest fixtures and the skip policy of `make test`.

A skipped test counts as a failure unless it carries the `gpu` marker (GPU-only
tests skip visibly on a machine without CUDA). The C++ code under test is
reached through the torch-ops library built in tests/torch_ops/ or through the
real `snapserve` binary; both come from SNAPSERVE_BUILD_DIR (default: build/).
"""
import os
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
BUILD_DIR = pathlib.Path(os.environ.get("SNAPSERVE_BUILD_DIR", ROOT / "build"))
MODEL_PATH = pathlib.Path(
    os.environ.get("SNAPSERVE_MODEL", ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"))


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA device; skips visibly without one")
    config.addinivalue_line("markers", "slow: long-running (real model, long prompts)")


_illegal_skips = []


def pytest_runtest_logreport(report):
    if report.skipped and "gpu" not in report.keywords:
        _illegal_skips.append(report.nodeid)


def pytest_sessionfinish(session, exitstatus):
    if _illegal_skips:
        print("\nRequired tests were skipped (only @pytest.mark.gpu tests may skip):")
        for nodeid in _illegal_skips:
            print(f"  {nodeid}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def cuda_available():
    import torch
    return torch.cuda.is_available()


@pytest.fixture(scope="session")
def build_dir():
    return BUILD_DIR


@pytest.fixture(scope="session")
def model_path():
    assert MODEL_PATH.is_file(), f"default model missing: {MODEL_PATH} (run `make model`)"
    return MODEL_PATH


@pytest.fixture(scope="session")
def torch_ops():
    """Loads libsnapserve_torch_ops.so and returns torch.ops.snapserve."""
    import torch
    lib = BUILD_DIR / "tests" / "libsnapserve_torch_ops.so"
    assert lib.is_file(), f"{lib} not built (run `make build`)"
    torch.ops.load_library(str(lib))
    return torch.ops.snapserve


# --- gRPC stubs and a real snapserve process ------------------------------

@pytest.fixture(scope="session")
def pb():
    """Python stubs for snapserve/v1/generation.proto, generated with grpcio-tools.

    protoc runs in a child process: grpc_tools' compiler module carries its own
    C++ protobuf, whose GNU-unique symbols (process-wide, whatever the dlopen
    flags) would be shared with the protobuf copy inside libsentencepiece once
    the torch ops load a SentencePiece tokenizer in this process, and the two
    versions' layouts differ (a heap corruption seen in the SentencePiece tests).
    """
    import importlib
    import subprocess
    import sys

    out = BUILD_DIR / "python_gen"
    out.mkdir(parents=True, exist_ok=True)
    rc = subprocess.run([sys.executable, "-m", "grpc_tools.protoc", f"-I{ROOT / 'proto'}",
                         f"--python_out={out}", f"--grpc_python_out={out}",
                         str(ROOT / "proto" / "snapserve" / "v1" / "generation.proto")]).returncode
    assert rc == 0, "protoc failed on generation.proto"
    if str(out) not in sys.path:
        sys.path.insert(0, str(out))
    pb2 = importlib.import_module("snapserve.v1.generation_pb2")
    pb2_grpc = importlib.import_module("snapserve.v1.generation_pb2_grpc")
    return pb2, pb2_grpc


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """A real `snapserve` child process on free loopback ports."""

    def __init__(self, args, env=None):
        import subprocess
        self.port = free_port()
        self.metrics_port = free_port()
        binary = BUILD_DIR / "server" / "snapserve"
        assert binary.is_file(), f"{binary} not built"
        cmd = [str(binary), "--host=127.0.0.1", f"--port={self.port}",
               f"--metrics-port={self.metrics_port}"] + list(args)
        full_env = dict(os.environ)
        full_env.update(env or {})
        self.log_path = BUILD_DIR / f"snapserve-test-{self.port}.log"
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=full_env)
        self.target = f"127.0.0.1:{self.port}"

    def logs(self):
        self.log.flush()
        return self.log_path.read_text()

    def wait_serving(self, timeout=120):
        import time

        import grpc
        from grpc_health.v1 import health_pb2, health_pb2_grpc
        deadline = time.time() + timeout
        with grpc.insecure_channel(self.target) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            while time.time() < deadline:
                assert self.proc.poll() is None, f"snapserve exited early:\n{self.logs()}"
                try:
                    r = stub.Check(health_pb2.HealthCheckRequest(), timeout=2)
                    if r.status == health_pb2.HealthCheckResponse.SERVING:
                        return
                except grpc.RpcError:
                    pass
                time.sleep(0.2)
        raise AssertionError(f"snapserve not SERVING after {timeout}s:\n{self.logs()}")

    def stop(self, timeout=60):
        import signal
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except Exception:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        return self.proc.returncode


def _server_factory():
    """Yields start(args, env=None, wait=True) -> ServerProcess (SERVING when
    wait); every process started is stopped when the fixture ends."""
    started = []

    def start(args, env=None, wait=True):
        s = ServerProcess(args, env)
        started.append(s)
        if wait:
            s.wait_serving()
        return s

    yield start
    for s in started:
        s.stop()


@pytest.fixture
def start_server():
    """Factory: start_server(args) -> ServerProcess (SERVING); stopped at teardown."""
    yield from _server_factory()


@pytest.fixture(scope="module")
def start_module_server():
    """As start_server, but the processes live for the whole test module (one
    server shared by many slow cases); stopped at module teardown."""
    yield from _server_factory()
