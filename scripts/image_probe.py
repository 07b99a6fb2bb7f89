"""Runs the snapserve image with podman and checks it serves, from the host:
grpc.health.v1 SERVING, one Generate, /metrics counting that request, then a
clean stop (SIGTERM, exit 0). `make image-test` (scripts/image.sh test) runs
it; the figures go to --out as JSON.

On the development machines (hybrid cgroups, no CAP to raise rlimits) podman's
default runtime crun cannot start a container at all ("cgroups in hybrid mode
not supported") and runc refuses podman's default rlimits; so the container
runs under runc when it is installed, with explicit open-file and process
limits.
"""
import argparse
import json
import pathlib
import shutil
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import grpc  # noqa: E402
from grpc_health.v1 import health_pb2, health_pb2_grpc  # noqa: E402

from snapserve_testkit import free_port, load_stubs, metrics  # noqa: E402



def run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, **kw)


# Explicit limits: runc on these machines cannot apply podman's defaults
# (1048576 open files, and the host's process limit fails too); these are
# lower than the host's and enough for the probe.
LIMITS = ["--ulimit", "nofile=8192:8192", "--ulimit", "nproc=8192:8192"]


class Podman:
    def __init__(self, image, models, grpc_port, metrics_port):
        self.container = f"snapserve-image-test-{grpc_port}"
        runtime = ["--runtime", "runc"] if shutil.which("runc") else []
        self.cmd = ["podman", "run", "-d", "--rm", "--name", self.container, *runtime, *LIMITS,
                    "-p", f"127.0.0.1:{grpc_port}:50051",
                    "-p", f"127.0.0.1:{metrics_port}:9464",
                    "-v", f"{models}:/models:ro", image, "--threads=2"]

    def start(self):
        out = run(self.cmd)
        return out.returncode == 0, out.stderr.strip()

    def running(self):
        out = run(["podman", "inspect", "--format", "{{.State.Running}}", self.container])
        return out.stdout.strip() == "true"

    def logs(self):
        out = run(["podman", "logs", self.container])
        return out.stdout + out.stderr

    def stop(self):
        # --rm removes the container on exit: read its code by waiting on it.
        waiter = subprocess.Popen(["podman", "wait", self.container], stdout=subprocess.PIPE,
                                  text=True)
        time.sleep(0.5)
        run(["podman", "stop", "-t", "30", self.container])
        code, _ = waiter.communicate(timeout=60)
        return int(code.strip() or -1)


def wait_serving(target, runner, timeout):
    deadline = time.time() + timeout
    with grpc.insecure_channel(target) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.time() < deadline:
            if not runner.running():
                raise SystemExit(f"the container exited before SERVING:\n{runner.logs()[-3000:]}")
            try:
                if stub.Check(health_pb2.HealthCheckRequest(), timeout=2).status == \
                        health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
            time.sleep(0.2)
    raise SystemExit(f"not SERVING after {timeout} s:\n{runner.logs()[-3000:]}")


def probe(target, metrics_port):
    pb2, pb2_grpc = load_stubs()
    with grpc.insecure_channel(target) as channel:
        reply = pb2_grpc.GenerationStub(channel).Generate(pb2.GenerateRequest(
            prompt="The capital of France is",
            stopping=pb2.StoppingCriteria(max_new_tokens=8)), timeout=60)
    assert reply.usage.completion_tokens > 0 and reply.text, reply
    text = metrics.scrape(metrics_port)
    served = metrics.value(text, "snapserve_requests_total", {"status": "OK"})
    assert served >= 1, "the Generate call is missing from /metrics"
    return reply.text, served


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--image", required=True)
    ap.add_argument("--models", required=True, help="host folder mounted at /models")
    ap.add_argument("--out", required=True)
    ap.add_argument("--timeout", type=float, default=120)
    a = ap.parse_args()

    grpc_port, metrics_port = free_port(), free_port()
    result = {"image": a.image}
    runner = Podman(a.image, a.models, grpc_port, metrics_port)
    started = time.time()
    ok, why = runner.start()
    if not ok:
        raise SystemExit(f"podman could not start the image: {why}")
    try:
        wait_serving(f"127.0.0.1:{grpc_port}", runner, a.timeout)
        result["start_to_serving_seconds"] = round(time.time() - started, 2)
        text, served = probe(f"127.0.0.1:{grpc_port}", metrics_port)
        result.update(generated_text=text, requests_ok_on_metrics=served)
    finally:
        result["exit_code"] = runner.stop()
    assert result["exit_code"] == 0, f"SIGTERM should end the server with 0: {result}"
    pathlib.Path(a.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
