"""Benchmark: W2 (prefill of a 2,048-token prompt) or W3 (16 concurrent
1,024-token prompts, 128 new tokens each) of snapserve and vLLM-CPU with the
requests interleaved, so that both servers see the same machine.

Why: the team's side-by-side harness (docs/testing-and-measuring.md,
"Benchmarks": it lives outside the repository) runs one server after the
other, and a shared VM's speed can drift by a fifth within a run
(docs/performance.md, "How to read the figures"), which lands in the ratios.
Here both servers are up at once and take turns: each round sends the W2
prompt to vLLM, to snapserve without compression and to snapserve with SnapKV
C=512, in a rotating order, one request at a time. The ratio of each round
is taken, and their median is reported. After each request the script
waits until that server's processes are quiet (vLLM's stay busy for a second
or more after a request and would take cores from the next snapserve
request). Each server's CPU time while the *other* one works is recorded,
to show that neither disturbed the other.

Requests (--workload): W2, the harness's W2 prompt ($PEERS_DIR/prompts.json,
"w2": 2,048 token ids), one new token, greedy. W3, the harness's 16 W3
prompts ("w3": 1,024 token ids each) sent at once, 128 new tokens each with
EOS ignored, greedy; a round's figure is the aggregate, 2,048 tokens over the
wall time from the first request sent to the last one answered, as the
harness defines it. vLLM gets token ids on /v1/completions (not streamed);
snapserve on GenerateStream. A round's time is the client's wall time of the
whole request (or of all 16), the same definition for both (W2 of the harness
is 2,048 / TTFT; with one new token the two differ by the last token's
delivery only).

vLLM is the harness's install ($PEERS_DIR/vllm-venv, the model in
$PEERS_DIR/smollm2-hf, as that harness installs them); it runs with vLLM's own
documented CPU settings for 2 threads (VLLM_CPU_OMP_THREADS_BIND=0-1, 4 GiB KV
space, prefix caching off, as the harness configures it). snapserve runs this
build with the flags of --snap-args.

  PEERS_DIR=/work/peers flock /tmp/cpu.lock .venv/bin/python bench/peers_interleaved.py \
      [--workload w3 --rounds 7 --out runs/peers_interleaved_w3.json]
"""
import argparse
import http.client
import json
import os
import pathlib
import shlex
import statistics
import subprocess
import sys
import threading
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import common  # noqa: E402
from snapserve_testkit import free_port  # noqa: E402  (common put the repository on sys.path)

SNAP_ARGS = ("--quantized-dot=int8 --prefill-gemm=int8 --kv-cache-dtype=bfloat16 --block-size=64 "
             "--threads=2 --max-batch-size=16 --kv-cache-memory=2GiB")
W3_NEW_TOKENS = 128  # per request, as the harness's W3
VLLM_ENV = {"OMP_NUM_THREADS": "2", "MKL_NUM_THREADS": "2", "VLLM_CPU_KVCACHE_SPACE": "4",
            "VLLM_CPU_OMP_THREADS_BIND": "0-1", "VLLM_HOST_IP": "127.0.0.1"}


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--peers-dir", default=os.environ.get("PEERS_DIR", "/work/peers"))
    ap.add_argument("--workload", choices=("w2", "w3"), default="w2")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--snap-args", default=SNAP_ARGS)
    ap.add_argument("--vllm-start-timeout", type=float, default=900)
    ap.add_argument("--out", default="runs/peers_interleaved.json", help="file under bench/results/")
    return ap.parse_args(argv)


def tree_cpu_seconds(root_pid):
    """User + system CPU seconds of a process and all its descendants (vLLM
    runs its engine in a child process)."""
    tick = os.sysconf("SC_CLK_TCK")
    stats = {}
    for entry in pathlib.Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        stats[int(entry.name)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / tick)
    total, stack = 0.0, [root_pid]
    while stack:
        pid = stack.pop()
        if pid in stats:
            total += stats[pid][1]
        stack.extend(p for p, (ppid, _) in stats.items() if ppid == pid)
    return total


def settle(pid, quiet_cpu_s=0.01, period_s=0.5, limit_s=30.0):
    """Waits until a server's process tree stays (nearly) idle for one period:
    vLLM's threads keep a core busy for a second or more after a request
    (seen in a first run: the snapserve request right after a vLLM one took
    2.3-2.4 s instead of 1.5). Returns the seconds waited."""
    start = time.perf_counter()
    while time.perf_counter() - start < limit_s:
        before = tree_cpu_seconds(pid)
        time.sleep(period_s)
        if tree_cpu_seconds(pid) - before <= quiet_cpu_s:
            break
    return time.perf_counter() - start


class Vllm:
    """vLLM's OpenAI server from the harness's venv, on a free port."""

    def __init__(self, peers, timeout):
        self.port = free_port()
        log_path = peers / "logs" / f"vllm-interleaved-{self.port}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self.log = open(log_path, "w")
        cmd = [str(peers / "vllm-venv" / "bin" / "python"), "-m",
               "vllm.entrypoints.openai.api_server", "--model", str(peers / "smollm2-hf"),
               "--served-model-name", "smollm2", "--host", "127.0.0.1", "--port", str(self.port),
               "--dtype", "bfloat16", "--max-num-seqs", "16", "--max-model-len", "4096",
               "--no-enable-prefix-caching", "--max-num-batched-tokens", "4096"]
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT,
                                     env=dict(os.environ, **VLLM_ENV), start_new_session=True)
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vLLM exited with {self.proc.returncode}; see {log_path}")
            try:
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
                conn.request("GET", "/health")
                if conn.getresponse().status == 200:
                    return
            except OSError:
                pass
            time.sleep(2)
        self.stop()
        raise RuntimeError(f"vLLM did not serve within {timeout} s; see {log_path}")

    def complete(self, ids, max_tokens=1):
        body = json.dumps({"model": "smollm2", "prompt": ids, "max_tokens": max_tokens,
                           "temperature": 0.0, "ignore_eos": True})
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=900)
        t0 = time.perf_counter()
        conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        data = json.loads(resp.read())
        elapsed = time.perf_counter() - t0
        if resp.status != 200:
            raise RuntimeError(f"vLLM answered {resp.status}: {data}")
        if data["usage"]["prompt_tokens"] != len(ids):
            raise RuntimeError(f"vLLM saw {data['usage']['prompt_tokens']} prompt tokens")
        if data["usage"]["completion_tokens"] != max_tokens:
            raise RuntimeError(f"vLLM gave {data['usage']['completion_tokens']} tokens")
        return elapsed

    def stop(self):
        import signal
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(60)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.log.close()


def snap_request(server, ids, method, max_new=1):
    capacity = 512 if method == "snapkv" else None
    r = common.stream_one(server.stub,
                          common.make_request(ids, max_new, method=method, capacity=capacity))
    if r["error"] is not None:
        raise RuntimeError(f"snapserve: {r['error']}")
    if r["usage"].prompt_tokens != len(ids):
        raise RuntimeError(f"snapserve saw {r['usage'].prompt_tokens} prompt tokens")
    if r["usage"].completion_tokens != max_new:
        raise RuntimeError(f"snapserve gave {r['usage'].completion_tokens} tokens")
    return r["t1"] - r["t0"]


def all_at_once(fn, prompts):
    """Sends every prompt at once (one thread each, released together) and
    returns the wall time from the first start to the last answer; a failed
    request fails the run."""
    starts, ends, errors = [None] * len(prompts), [None] * len(prompts), []
    gate = threading.Barrier(len(prompts))

    def go(i):
        gate.wait()
        starts[i] = time.perf_counter()
        try:
            fn(prompts[i])
        except Exception as e:  # noqa: BLE001 - re-raised below, on the main thread
            errors.append(e)
        ends[i] = time.perf_counter()

    threads = [threading.Thread(target=go, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return max(ends) - min(starts)


def main():
    args = parse_args()
    peers = pathlib.Path(args.peers_dir)
    prompts = json.loads((peers / "prompts.json").read_text())
    ids, warm = prompts["w2"], prompts["warm"]
    machine = common.machine_info(server_threads=2)
    common.log("starting vLLM (a minute or more) and snapserve")
    vllm = Vllm(peers, args.vllm_start_timeout)
    try:
        with common.Server(shlex.split(args.snap_args), log_name="interleaved") as snap:
            pids = {"vllm": vllm.proc.pid, "snap": snap.proc.pid}
            if args.workload == "w2":
                clients = {"vllm": lambda: vllm.complete(ids),
                           "snap-none": lambda: snap_request(snap, ids, "none"),
                           "snap-snapkv": lambda: snap_request(snap, ids, "snapkv")}
            else:
                w3, new = prompts["w3"], W3_NEW_TOKENS
                clients = {
                    "vllm": lambda: all_at_once(lambda p: vllm.complete(p, new), w3),
                    "snap-none": lambda: all_at_once(lambda p: snap_request(snap, p, "none", new),
                                                     w3),
                    "snap-snapkv": lambda: all_at_once(
                        lambda p: snap_request(snap, p, "snapkv", new), w3)}
            vllm.complete(warm)  # first requests pay one-time costs
            snap_request(snap, warm, "none")
            for c in clients.values():
                c()
            names = list(clients)
            times = {n: [] for n in names}
            idle_cpu = {"vllm": 0.0, "snap": 0.0}  # CPU s used while the other one worked
            settle_s = {"vllm": [], "snap": []}  # waits for quiet after each request
            for r in range(args.rounds):
                order = names[r % 3:] + names[:r % 3]
                for name in order:
                    own = "vllm" if name == "vllm" else "snap"
                    other = "snap" if own == "vllm" else "vllm"
                    before = tree_cpu_seconds(pids[other])
                    times[name].append(clients[name]())
                    idle_cpu[other] += tree_cpu_seconds(pids[other]) - before
                    settle_s[own].append(settle(pids[own]))
                common.log(f"round {r + 1}: " + ", ".join(f"{n} {times[n][-1]:.3f} s" for n in names))
    finally:
        vllm.stop()
    # W2: prompt tokens per second of one request; W3: generated tokens per
    # second of the 16, as the harness reports them.
    if args.workload == "w2":
        n, rate = len(ids), "prefill_tok_s"
        workload = "W2: 2,048-token prompt, 1 new token, greedy"
        note = "servers up at once, one request at a time, rotating order"
    else:
        n, rate = len(prompts["w3"]) * W3_NEW_TOKENS, "agg_tok_s"
        workload = "W3: 16 x 1,024-token prompts at once, 128 new tokens each, EOS ignored, greedy"
        note = "servers up at once, one server's 16 requests at a time, rotating order"
    result = {}
    for name in names:
        result[name] = {"median_s": statistics.median(times[name]),
                        rate: n / statistics.median(times[name]), "runs_s": times[name]}
    for name in ("snap-none", "snap-snapkv"):
        paired = [v / s for v, s in zip(times["vllm"], times[name])]
        result[name]["speedup_vs_vllm_paired_median"] = statistics.median(paired)
        result[name]["speedup_vs_vllm_paired_min_max"] = [min(paired), max(paired)]
        common.log(f"{name}: {result[name][rate]:.0f} tok/s, vLLM "
                   f"{result['vllm'][rate]:.0f} tok/s: paired median "
                   f"{result[name]['speedup_vs_vllm_paired_median']:.3f}x")
    # Each server's busy wall time, against which the other's CPU is set.
    total = {"vllm": sum(times["vllm"]),
             "snap": sum(times["snap-none"]) + sum(times["snap-snapkv"])}
    common.write_json(args.out, dict(
        benchmark="peers_interleaved",
        config=dict(workload=workload, rounds=args.rounds, snap_args=args.snap_args,
                    vllm_env=VLLM_ENV, statistic="median of rounds", note=note),
        machine=machine, results=result,
        idle_cpu_seconds={k: dict(cpu_s=v, share_of_other_wall=v / total["snap" if k == "vllm"
                                                                          else "vllm"])
                          for k, v in idle_cpu.items()},
        settle_seconds={k: dict(median=statistics.median(v), max=max(v))
                        for k, v in settle_s.items()}))


if __name__ == "__main__":
    main()
