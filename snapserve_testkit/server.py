"""A real `snapserve` child process on free loopback ports."""
import json
import os
import signal
import socket
import subprocess
import time

from snapserve_testkit.metrics import scrape
from snapserve_testkit.paths import build_dir, extra_server_args


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def startup_error(out):
    """The one `startup_failed` error of a refused start, from the
    CompletedProcess of a `snapserve` run; asserts the process exited with a
    positive code (not a signal) and logged exactly one such line."""
    log = out.stdout + out.stderr
    assert out.returncode > 0, f"exit {out.returncode} (negative: a signal):\n{log[-3000:]}"
    failed = [json.loads(line) for line in log.splitlines()
              if line.startswith("{") and '"startup_failed"' in line]
    assert len(failed) == 1, log[-3000:]
    return failed[0]["error"]


class ServerError(RuntimeError):
    """The process exited before SERVING, or was not SERVING in time."""


def describe_exit(returncode):
    """"exit 3", or "killed by SIGSEGV" for a negative returncode."""
    if returncode is not None and returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit {returncode}"


class SnapserveProcess:
    """<build>/server/snapserve on free loopback ports (gRPC and /metrics), with
    `args` after --host/--port/--metrics-port and `env` over os.environ;
    stdout and stderr go to <build>/snapserve-<log_name>-<port>.log. stop()
    sends SIGTERM (SIGKILL after `timeout`); as a context manager it waits for
    SERVING on entry and stops on exit. crash() says whether the process died
    of a signal it was not sent to stop it (SIGSEGV, SIGABRT...)."""

    # Tests compare the server's tokens and logprobs with transformers', which
    # the `exact` precision preset reproduces; a test of the default preset
    # passes precision=None (no flag: what a user's server runs).
    def __init__(self, args, env=None, log_name="test", precision="exact"):
        self.port = free_port()
        self.metrics_port = free_port()
        while self.metrics_port == self.port:
            self.metrics_port = free_port()
        binary = build_dir() / "server" / "snapserve"
        if not binary.is_file():
            raise FileNotFoundError(f"{binary} not built (run `make build`)")
        self.cmd = [str(binary), "--host=127.0.0.1", f"--port={self.port}",
                    f"--metrics-port={self.metrics_port}"]
        if precision is not None and not any(a.startswith("--precision") for a in args):
            self.cmd.append(f"--precision={precision}")
        self.cmd += list(args) + extra_server_args()
        full_env = dict(os.environ)
        full_env.update(env or {})
        self.log_path = build_dir() / f"snapserve-{log_name}-{self.port}.log"
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(self.cmd, stdout=self.log, stderr=subprocess.STDOUT,
                                     env=full_env)
        # Set by stop(): whether it found the process running and sent
        # SIGTERM, and whether it then had to SIGKILL it.
        self.stopped_by_sigterm = False
        self.killed_after_timeout = False
        self.target = f"127.0.0.1:{self.port}"

    @property
    def pid(self):
        return self.proc.pid

    def logs(self):
        if not self.log.closed:
            self.log.flush()
        return self.log_path.read_text(errors="replace")

    def wait_serving(self, timeout=120, credentials=None):
        """Polls grpc.health.v1 until SERVING, in plaintext or, given channel
        `credentials`, over TLS; ServerError if the process exits first or
        `timeout` seconds pass."""
        import grpc
        from grpc_health.v1 import health_pb2, health_pb2_grpc
        deadline = time.time() + timeout
        channel = (grpc.insecure_channel(self.target) if credentials is None
                   else grpc.secure_channel(self.target, credentials))
        with channel:
            stub = health_pb2_grpc.HealthStub(channel)
            while time.time() < deadline:
                if self.proc.poll() is not None:
                    raise ServerError(f"snapserve exited early "
                                      f"({describe_exit(self.proc.returncode)}):\n{self.logs()}")
                try:
                    r = stub.Check(health_pb2.HealthCheckRequest(), timeout=2)
                    if r.status == health_pb2.HealthCheckResponse.SERVING:
                        return self
                except grpc.RpcError:
                    pass
                time.sleep(0.2)
        raise ServerError(f"snapserve not SERVING after {timeout}s:\n{self.logs()}")

    def stop(self, timeout=60):
        # Polled first: a process already gone died by itself, and its
        # returncode is its own, not the answer to this SIGTERM.
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.stopped_by_sigterm = True
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.killed_after_timeout = True
                self.proc.wait()
        if not self.log.closed:
            self.log.close()
        return self.proc.returncode

    def crash(self):
        """None, or how the process ended abnormally: killed by a signal
        before stop() sent one (a crash, an abort, the OOM killer), or after
        stop()'s SIGTERM anything but exit 0 or death by that SIGTERM. A
        process still running, or one that exited with a code of its own
        (a refused start), is no crash."""
        rc = self.proc.poll()
        if rc is None:
            return None
        if self.killed_after_timeout:
            return "did not exit after SIGTERM; killed with SIGKILL"
        if self.stopped_by_sigterm:
            if rc in (0, -signal.SIGTERM):
                return None
            return f"{describe_exit(rc)} after the SIGTERM that stopped it"
        if rc < 0:
            return f"died by itself: {describe_exit(rc)}"
        return None

    def metrics_text(self):
        return scrape(self.metrics_port)

    def __enter__(self):
        try:
            return self.wait_serving()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc):
        self.stop()
