"""Shared helpers of the snapserve benchmarks (docs/testing-and-measuring.md, "Benchmarks").

* a real `snapserve` child process on free loopback ports (start/stop, SIGTERM),
  Python gRPC stubs and the /metrics parser, from snapserve_testkit/ (shared
  with tests/python),
* prompts of exactly n tokens built from the server's own tokenizer,
* a streaming call that records each delta's arrival time,
* machine info, a numpy memory-bandwidth probe, JSON output.

Nothing here is timed against a threshold: the scripts only record figures.
"""
import datetime
import json
import os
import pathlib
import platform
import statistics
import sys
import threading
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
# Every run writes here (ignored by git); a baseline is a file copied from
# here into RESULTS on purpose, so a run never overwrites a tracked baseline.
RUNS = RESULTS / "runs"

# The helpers shared with tests/python live in snapserve_testkit/ at the
# repository root, imported from there without installing anything.
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
from snapserve_testkit import SnapserveProcess, metrics, model_path  # noqa: E402
from snapserve_testkit import load_stubs as pb  # noqa: E402


# --- server process ----------------------------------------------------------

class Server(SnapserveProcess):
    """One `snapserve` process on free loopback ports (snapserve_testkit's), with
    the model of model_path(), --log-level=warn and --shutdown-grace=5. Use as a
    context manager: once SERVING it carries a Generation stub (.stub); it is
    always stopped with SIGTERM (then SIGKILL after a grace period)."""

    def __init__(self, args, log_name="bench"):
        self.args = [f"--model={model_path()}"] + list(args)
        super().__init__(["--log-level=warn", "--shutdown-grace=5"] + self.args,
                         log_name=log_name)
        self.channel = None
        self.stub = None

    def wait_serving(self, timeout=180):
        import grpc
        super().wait_serving(timeout)
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
        return super().stop(timeout)

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

    def metric(self, name, labels=None):
        """Sum of the samples of `name` whose labels include `labels`."""
        return metrics.total(self.metrics_text(), name, labels)


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


def median_call_seconds(fn, runs, reps):
    """Median over `runs` of the mean time of `reps` calls of fn, after one warm-up call:
    for the kernel benchmarks that call torch ops in a loop."""
    fn()
    samples = []
    for _ in range(runs):
        t = time.perf_counter()
        for _ in range(reps):
            fn()
        samples.append((time.perf_counter() - t) / reps)
    return statistics.median(samples)


def add_torch_ops_argument(parser):
    """--library for the kernel benchmarks: which build's torch ops to time."""
    parser.add_argument("--library", default=os.environ.get("SNAPSERVE_TORCH_OPS"),
                        help="the torch ops library (default: the build's), e.g. to compare "
                             "two builds")


def load_torch_ops(library):
    """Loads the project's torch ops (`library`, or the build's when None); returns the path
    loaded and torch.ops.snapserve."""
    import torch
    if library is None:
        from snapserve_testkit.paths import build_dir
        library = str(build_dir() / "tests" / "libsnapserve_torch_ops.so")
    torch.ops.load_library(library)
    return library, torch.ops.snapserve


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
    """Writes payload to RESULTS / name; name may hold a folder (runs/...)."""
    path = RESULTS / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2, sort_keys=False, default=str) + "\n")
    print(f"wrote {path}")
    return path


def log(*a):
    print(f"[{time.strftime('%H:%M:%S')}]", *a, flush=True)
