"""Shared helpers of the snapserve benchmarks (docs/testing-and-measuring.md, "Benchmarks").

* a real `snapserve` child process on free loopback ports (start/stop, SIGTERM),
* Python gRPC stubs generated with grpcio-tools (as the tests' `pb` fixture),
* prompts of exactly n tokens built from the server's own tokenizer,
* a streaming call that records each delta's arrival time,
* a /metrics scraper, machine info, a numpy memory-bandwidth probe, JSON output.

Nothing here is timed against a threshold: the scripts only record figures.
"""
import datetime
import json
import os
import pathlib
import platform
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request

ROOT = pathlib.Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
DEFAULT_MODEL = ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"


def build_dir():
    return pathlib.Path(os.environ.get("SNAPSERVE_BUILD_DIR", ROOT / "build"))


def model_path():
    return pathlib.Path(os.environ.get("SNAPSERVE_MODEL", DEFAULT_MODEL))


# --- stubs -------------------------------------------------------------------

_PB = None


def pb():
    """(generation_pb2, generation_pb2_grpc), generated into BUILD_DIR/python_gen."""
    global _PB
    if _PB is not None:
        return _PB
    import importlib

    from grpc_tools import protoc
    out = build_dir() / "python_gen"
    out.mkdir(parents=True, exist_ok=True)
    rc = protoc.main(["protoc", f"-I{ROOT / 'proto'}", f"--python_out={out}",
                      f"--grpc_python_out={out}",
                      str(ROOT / "proto" / "snapserve" / "v1" / "generation.proto")])
    if rc != 0:
        raise RuntimeError("protoc failed on generation.proto")
    if str(out) not in sys.path:
        sys.path.insert(0, str(out))
    pb2 = importlib.import_module("snapserve.v1.generation_pb2")
    pb2_grpc = importlib.import_module("snapserve.v1.generation_pb2_grpc")
    _PB = (pb2, pb2_grpc)
    return _PB


# --- server process ----------------------------------------------------------

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """One `snapserve` process on free loopback ports. Use as a context manager;
    it is always stopped with SIGTERM (then SIGKILL after a grace period)."""

    def __init__(self, args, log_name="bench"):
        self.port = free_port()
        self.metrics_port = free_port()
        while self.metrics_port == self.port:
            self.metrics_port = free_port()
        binary = build_dir() / "server" / "snapserve"
        if not binary.is_file():
            raise FileNotFoundError(f"{binary} not built (run `make build`)")
        self.args = [f"--model={model_path()}"] + list(args)
        self.cmd = [str(binary), "--host=127.0.0.1", f"--port={self.port}",
                    f"--metrics-port={self.metrics_port}", "--log-level=warn",
                    "--shutdown-grace=5"] + self.args
        self.log_path = build_dir() / f"snapserve-{log_name}-{self.port}.log"
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(self.cmd, stdout=self.log, stderr=subprocess.STDOUT)
        self.target = f"127.0.0.1:{self.port}"
        self.channel = None
        self.stub = None

    @property
    def pid(self):
        return self.proc.pid

    def logs(self):
        self.log.flush()
        return self.log_path.read_text(errors="replace")

    def wait_serving(self, timeout=180):
        import grpc
        from grpc_health.v1 import health_pb2, health_pb2_grpc
        deadline = time.time() + timeout
        with grpc.insecure_channel(self.target) as channel:
            hs = health_pb2_grpc.HealthStub(channel)
            while time.time() < deadline:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"snapserve exited early:\n{self.logs()[-4000:]}")
                try:
                    r = hs.Check(health_pb2.HealthCheckRequest(), timeout=2)
                    if r.status == health_pb2.HealthCheckResponse.SERVING:
                        break
                except grpc.RpcError:
                    pass
                time.sleep(0.2)
            else:
                raise RuntimeError(f"snapserve not SERVING after {timeout}s")
        _, pb2_grpc = pb()
        opts = [("grpc.max_receive_message_length", 64 << 20),
                ("grpc.max_send_message_length", 64 << 20)]
        self.channel = grpc.insecure_channel(self.target, options=opts)
        self.stub = pb2_grpc.GenerationStub(self.channel)
        return self

    def stop(self, timeout=60):
        if self.channel is not None:
            self.channel.close()
            self.channel = None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if not self.log.closed:
            self.log.close()
        return self.proc.returncode

    def __enter__(self):
        try:
            return self.wait_serving()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc):
        self.stop()

    # --- convenience -----------------------------------------------------
    def model_info(self):
        pb2, _ = pb()
        return self.stub.GetModelInfo(pb2.GetModelInfoRequest(), timeout=30)

    def proc_status(self, key):
        """A field of /proc/<pid>/status in bytes (VmHWM, VmRSS ...)."""
        with open(f"/proc/{self.pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    value, unit = line.split()[1:3]
                    assert unit == "kB"
                    return int(value) * 1024
        return None

    def metrics_text(self):
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.read().decode()

    def metric(self, name, labels=None):
        """Sum of the samples of `name` whose labels include `labels`."""
        return parse_metric(self.metrics_text(), name, labels)


def parse_metric(text, name, labels=None):
    total, found = 0.0, False
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        metric, _, lab = head.partition("{")
        if metric != name:
            continue
        if labels:
            lab = lab.rstrip("}")
            have = dict(kv.split("=", 1) for kv in lab.split(",") if "=" in kv)
            have = {k: v.strip('"') for k, v in have.items()}
            if any(have.get(k) != str(v) for k, v in labels.items()):
                continue
        total += float(value)
        found = True
    return total if found else None


# --- prompts -------------------------------------------------------------------

_CORPUS_DIRS = [pathlib.Path("/usr/share/common-licenses")]


def corpus_text():
    """Natural English text (the licenses shipped with Debian), concatenated."""
    parts = []
    for d in _CORPUS_DIRS:
        if d.is_dir():
            for p in sorted(d.iterdir()):
                if p.is_file():
                    try:
                        parts.append(p.read_text(errors="ignore"))
                    except OSError:
                        pass
    text = "\n\n".join(parts)
    if len(text) < 200_000:  # fallback: repeat what we have, or a synthetic text
        text = (text or "The quick brown fox jumps over the lazy dog. ") * (200_000 // max(1, len(text or "x")) + 1)
    return text


_TOKENS = None


def corpus_ids(server):
    global _TOKENS
    if _TOKENS is None:
        pb2, _ = pb()
        _TOKENS = list(server.stub.Tokenize(pb2.TokenizeRequest(text=corpus_text()), timeout=120).ids)
    return _TOKENS


def prompt_ids(server, n, offset=0):
    """n token ids of natural text, starting at `offset` (distinct prompts for
    distinct offsets, so that nothing could be served from a prefix cache)."""
    ids = corpus_ids(server)
    start = (offset * 997) % max(1, len(ids) - n)
    out = ids[start:start + n]
    while len(out) < n:
        out += ids[:n - len(out)]
    return out


def make_request(ids, max_new, method="none", capacity=None, request_id=""):
    pb2, _ = pb()
    kv = pb2.KvCompression(method=pb2.KvCompression.SNAPKV if method == "snapkv"
                           else pb2.KvCompression.NONE)
    if method == "snapkv" and capacity:
        kv.max_capacity_prompt = capacity
    return pb2.GenerateRequest(
        request_id=request_id,
        input_ids=pb2.TokenIds(ids=ids),
        sampling=pb2.SamplingParams(temperature=0.0),
        stopping=pb2.StoppingCriteria(max_new_tokens=max_new, ignore_eos=True),
        kv_compression=kv)


def stream_one(stub, request, timeout=900):
    """One GenerateStream call. Returns a dict with the client-side send time,
    the arrival time of every delta (perf_counter seconds), tokens per delta,
    the final Usage and the error code name (None when OK)."""
    import grpc
    t0 = time.perf_counter()
    arrivals, ntok, usage, err = [], [], None, None
    try:
        for msg in stub.GenerateStream(request, timeout=timeout):
            now = time.perf_counter()
            if len(msg.token_ids):
                arrivals.append(now)
                ntok.append(len(msg.token_ids))
            if msg.HasField("usage"):
                usage = msg.usage
    except grpc.RpcError as e:
        err = e.code().name
    t1 = time.perf_counter()
    return {"t0": t0, "t1": t1, "arrivals": arrivals, "ntok": ntok, "usage": usage, "error": err}


def usage_dict(u):
    if u is None:
        return None
    return {f: getattr(u, f) for f in ("prompt_tokens", "completion_tokens", "kv_prompt_entries",
                                       "kv_kept_entries", "compression_ratio", "queue_ms",
                                       "time_to_first_token_ms", "total_ms")}


def inter_token_gaps(result):
    """Gaps between consecutive deltas, divided by the tokens the later delta
    carried (a delta may carry more than one token)."""
    a, n = result["arrivals"], result["ntok"]
    return [(a[i] - a[i - 1]) / max(1, n[i]) for i in range(1, len(a))]


# --- statistics --------------------------------------------------------------

def percentile(xs, q):
    xs = sorted(xs)
    if not xs:
        return None
    if len(xs) == 1:
        return xs[0]
    k = (len(xs) - 1) * q / 100.0
    lo = int(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def ratio(a, b):
    if a is None or b in (None, 0):
        return None
    return a / b


# --- RSS sampler ----------------------------------------------------------------

class RssSampler:
    """Samples VmRSS of a pid every `period` s in a thread; .peak is the max."""

    def __init__(self, pid, period=0.02):
        self.pid, self.period, self.peak = pid, period, 0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            try:
                with open(f"/proc/{self.pid}/status") as f:
                    for line in f:
                        if line.startswith("VmRSS:"):
                            self.peak = max(self.peak, int(line.split()[1]) * 1024)
            except OSError:
                return
            time.sleep(self.period)

    def __enter__(self):
        self._t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()


# --- machine -------------------------------------------------------------------

def memory_bandwidth_gbs(size_mb=512, repeats=5, threads=0):
    """The machine's memory bandwidth in GB/s (1e9), two probes over a
    `size_mb` array, medians of `repeats`:
    - numpy copyto: bytes read + written per second, one thread;
    - torch sum of a float32 tensor: bytes read per second on `threads` threads
      (0: all cores), which is what a decode step does: read weights and KV.
    The roofline (`gb_per_s`, `gb_per_s_best`) is the faster of the two, so a
    fraction of it never flatters a multi-threaded server."""
    import numpy as np
    import torch
    n = size_mb * (1 << 20) // 8
    src = np.ones(n, dtype=np.float64)
    dst = np.empty_like(src)
    np.copyto(dst, src)  # touch pages
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        times.append(time.perf_counter() - t0)
    copy = {"median": 2 * src.nbytes / statistics.median(times) / 1e9,
            "best": 2 * src.nbytes / min(times) / 1e9}
    del src, dst
    saved = torch.get_num_threads()
    torch.set_num_threads(threads or os.cpu_count() or 1)
    t = torch.ones(size_mb * (1 << 20) // 4, dtype=torch.float32)
    t.sum()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        t.sum()
        times.append(time.perf_counter() - t0)
    read = {"median": t.nbytes / statistics.median(times) / 1e9, "best": t.nbytes / min(times) / 1e9,
            "threads": torch.get_num_threads()}
    torch.set_num_threads(saved)
    roof = max((copy, read), key=lambda x: x["best"])
    return {"method": f"max of (numpy copyto of a {size_mb} MiB float64 array, (read+write "
                      f"bytes)/time, 1 thread) and (torch sum of a {size_mb} MiB float32 tensor, "
                      f"read bytes/time, {read['threads']} threads); medians and bests of {repeats}",
            "copy_1thread_gb_per_s": copy["median"], "read_all_threads_gb_per_s": read["median"],
            "gb_per_s": roof["median"], "gb_per_s_best": roof["best"]}


def machine_info(server_threads=None):
    info = {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "affinity_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "server_threads_flag": server_threads,
    }
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    info["cpu_model"] = line.split(":", 1)[1].strip()
                    break
        with open("/proc/meminfo") as f:
            info["mem_total_bytes"] = int(f.readline().split()[1]) * 1024
    except OSError:
        pass
    try:
        import torch
        info["torch"] = torch.__version__
        info["torch_threads_default"] = torch.get_num_threads()
    except Exception:  # noqa: BLE001 - torch is optional for the benchmarks
        pass
    return info


def have_matplotlib():
    try:
        import matplotlib  # noqa: F401
        return True
    except Exception:  # noqa: BLE001
        return False


def write_json(name, payload):
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / name
    path.write_text(json.dumps(payload, indent=2, sort_keys=False, default=str) + "\n")
    print(f"wrote {path}")
    return path


def log(*a):
    print(f"[{time.strftime('%H:%M:%S')}]", *a, flush=True)
