"""Benchmark: soak and faults. Writes bench/results/runs/soak.json.

    SNAPSERVE_BUILD_DIR=build .venv/bin/python bench/soak.py [--minutes 60]

Three phases against the real server (docs/testing-and-measuring.md, "Soak"):

1. Soak: --clients threads (4) send GenerateStream calls back to back for
   --minutes: prompts of 16-3000 tokens of natural text, SnapKV (C=256 or 512,
   max or avg pooling), StreamingLLM (C=256 or 512, 4 sinks), AdaKV, PyramidKV
   (C=256 or 512, window 8) or no compression chosen at random, 8-64 new
   tokens;
   one call in six is cancelled by the client after 0.2-3 s and one in four
   carries a 1-5 s deadline. Every --sample seconds: the server's RSS (VmRSS),
   running/waiting requests and free KV blocks from /metrics. At the end, once
   the clients stop: requests_running must reach 0 and the free blocks must
   return to the count before the first request (no leaked block); the
   requests by gRPC code from /metrics and from the clients. RSS growth is
   measured idle against idle: at minute --settle (5) the clients pause until
   the server is empty for one sample, and the end sample is taken empty too
   (under load RSS moves with whatever is in flight); the slope of the
   samples under load is recorded beside it. The server runs as deployed,
   with --kv-cache-prefault=true (the whole KV cache resident from the
   start; --no-prefault measures a server without it).
2. Restart: SIGKILL, then a new process: seconds from exec to SERVING
   (grpc.health.v1), --restarts times.
3. SIGTERM under load: 4 streams running, SIGTERM; calls sent after it must get
   UNAVAILABLE, the running ones must finish OK within --shutdown-grace, and
   the process must exit 0.

The JSON records every figure and the checks' outcomes; the script exits 1
when a check fails (leaked blocks, INTERNAL errors, a running request left,
growth over 2 %, a refused SIGTERM drain), so a run is read at a glance.
"""
import argparse
import collections
import pathlib
import random
import signal
import sys
import threading
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import common as c  # noqa: E402

GROWTH_LIMIT = 0.02


def client_loop(server, pb2, seed, stop_at, go, counts, lock):
    """Back-to-back calls with random shapes, cancels and deadlines until
    `stop_at`, each started only while `go` is set; counts outcomes by gRPC
    code name."""
    import grpc
    rng = random.Random(seed)
    n = 0
    while time.time() < stop_at:
        go.wait()
        n += 1
        length = rng.randint(16, 3000)
        method = rng.choice(["none", "snapkv", "streaming_llm", "adakv", "pyramidkv"])
        request = c.make_request(c.prompt_ids(server, length, offset=seed * 100_003 + n),
                                 max_new=rng.randint(8, 64), method=method,
                                 capacity=rng.choice([256, 512]))
        if method == "snapkv":
            request.kv_compression.pooling = rng.choice([pb2.KvCompression.MAX,
                                                         pb2.KvCompression.AVG])
        elif method == "streaming_llm":
            request.kv_compression.method = pb2.KvCompression.STREAMING_LLM
            request.kv_compression.max_capacity_prompt = rng.choice([256, 512])
            request.kv_compression.sink_tokens = 4
        elif method in ("adakv", "pyramidkv"):
            request.kv_compression.method = (pb2.KvCompression.ADAKV if method == "adakv"
                                             else pb2.KvCompression.PYRAMIDKV)
            request.kv_compression.max_capacity_prompt = rng.choice([256, 512])
            request.kv_compression.window_size = 8
        roll = rng.random()
        timeout = rng.uniform(1, 5) if roll < 0.25 else 180
        cancel_after = rng.uniform(0.2, 3) if 0.25 <= roll < 0.25 + 1 / 6 else None
        call = server.stub.GenerateStream(request, timeout=timeout)
        timer = threading.Timer(cancel_after, call.cancel) if cancel_after else None
        if timer:
            timer.start()
        try:
            for _ in call:
                pass
            code = "OK"
        except grpc.RpcError as e:
            code = e.code().name
        finally:
            if timer:
                timer.cancel()
        kind = "cancelled_by_client" if cancel_after else ("deadline_1_5s" if roll < 0.25 else "plain")
        with lock:
            counts[(kind, code)] += 1


def sample(server):
    text = server.metrics_text()
    return {"t": time.time(), "rss_bytes": server.proc_status("VmRSS"),
            "running": c.metrics.total(text, "snapserve_requests_running"),
            "waiting": c.metrics.total(text, "snapserve_requests_waiting"),
            "blocks_free": c.metrics.total(text, "snapserve_kv_cache_blocks_free")}


# The scheduler returns freed heap to the system after 1 s idle
# (engine/scheduler/scheduler.cc, kIdleBeforeTrim): quiet samples wait longer.
IDLE_SETTLE_S = 2.5


def quiet_sample(server, go, timeout=300):
    """RSS with no request in the server: new calls held back (`go` cleared)
    until requests_running is 0, then IDLE_SETTLE_S more, then resumed.
    Idle against idle is what shows a leak: under load RSS moves by the
    activations and KV of whatever is in flight."""
    go.clear()
    deadline = time.time() + timeout
    s = sample(server)
    while time.time() < deadline and (s["running"] or s["waiting"]):
        time.sleep(0.5)
        s = sample(server)
    time.sleep(IDLE_SETTLE_S)
    s = sample(server)
    go.set()
    return s


def slope_mib_per_hour(samples):
    """Least-squares slope of RSS over time, MiB per hour."""
    if len(samples) < 3:
        return None
    ts = [x["t"] for x in samples]
    ys = [x["rss_bytes"] / 2**20 for x in samples]
    mt, my = sum(ts) / len(ts), sum(ys) / len(ys)
    den = sum((t - mt) ** 2 for t in ts)
    return sum((t - mt) * (y - my) for t, y in zip(ts, ys)) / den * 3600 if den else None


def soak(args, server_args):
    pb2, _ = c.pb()
    with c.Server(server_args, log_name="soak") as server:
        c.corpus_ids(server)  # tokenize the corpus once, before the clock starts
        idle = sample(server)
        started = time.time()
        stop_at = started + args.minutes * 60
        counts, lock = collections.Counter(), threading.Lock()
        go = threading.Event()
        go.set()
        clients = [threading.Thread(target=client_loop,
                                    args=(server, pb2, i + 1, stop_at, go, counts, lock),
                                    daemon=True)
                   for i in range(args.clients)]
        for t in clients:
            t.start()
        samples, settle = [], None
        while time.time() < stop_at:
            if settle is None and time.time() >= started + args.settle * 60:
                settle = quiet_sample(server, go)
                print(f"[soak] quiet at minute {(settle['t'] - started) / 60:.1f}: "
                      f"rss {settle['rss_bytes'] / 2**20:.1f} MiB", flush=True)
            samples.append(sample(server))
            minute = (time.time() - started) / 60
            print(f"[soak] {minute:5.1f} min  rss {samples[-1]['rss_bytes'] / 2**20:7.1f} MiB  "
                  f"running {samples[-1]['running']}  free blocks {samples[-1]['blocks_free']}  "
                  f"calls {sum(counts.values())}", flush=True)
            time.sleep(args.sample)
        for t in clients:
            t.join(timeout=700)
        # The server ends cancelled calls on its next step: give it a moment.
        end = None
        deadline = time.time() + 60
        while time.time() < deadline:
            end = sample(server)
            if end["running"] == 0 and end["blocks_free"] == idle["blocks_free"]:
                time.sleep(IDLE_SETTLE_S)
                end = sample(server)
                break
            time.sleep(0.5)
        text = server.metrics_text()
        by_status = {s.labels["status"]: s.value for s in c.metrics.parse(text)
                     if s.name == "snapserve_requests_total"}
        logs = server.logs()
    settle = settle or samples[0]
    rss_settle, rss_end = settle["rss_bytes"], end["rss_bytes"]
    return {
        "minutes": args.minutes, "clients": args.clients,
        "calls": sum(counts.values()),
        "client_outcomes": {f"{k}/{code}": v for (k, code), v in sorted(counts.items())},
        "server_requests_by_status": by_status,
        "internal_errors": by_status.get("INTERNAL", 0) + sum(
            v for (_, code), v in counts.items() if code == "INTERNAL"),
        "blocks_free_idle": idle["blocks_free"], "blocks_free_end": end["blocks_free"],
        "leaked_blocks": idle["blocks_free"] - end["blocks_free"],
        "requests_running_end": end["running"],
        "rss_mib_idle": idle["rss_bytes"] / 2**20,
        "rss_mib_at_settle": rss_settle / 2**20, "rss_mib_end": rss_end / 2**20,
        "rss_peak_mib": max(s["rss_bytes"] for s in samples + [end]) / 2**20,
        "rss_growth_settle_to_end": (rss_end - rss_settle) / rss_settle,
        "settle_minute": round((settle["t"] - started) / 60, 2),
        "rss_slope_under_load_mib_per_hour": slope_mib_per_hour(
            [x for x in samples if x["t"] >= settle["t"]]),
        "rss_series": [{"minute": round((s["t"] - started) / 60, 2),
                        "rss_mib": round(s["rss_bytes"] / 2**20, 1),
                        "running": s["running"], "waiting": s["waiting"],
                        "blocks_free": s["blocks_free"]} for s in samples],
        "server_log_tail": logs[-2000:] if by_status.get("INTERNAL") else "",
    }


def restart_times(args, server_args):
    """SIGKILL a serving process, then time a new one from exec to SERVING."""
    times = []
    for _ in range(args.restarts):
        victim = c.Server(server_args, log_name="soak-restart")
        victim.wait_serving()
        victim.proc.send_signal(signal.SIGKILL)
        victim.proc.wait()
        victim.stop()
        t0 = time.perf_counter()
        fresh = c.Server(server_args, log_name="soak-restart")
        try:
            fresh.wait_serving()
            times.append(time.perf_counter() - t0)
        finally:
            fresh.stop()
    return times


def sigterm_under_load(args, server_args):
    import grpc
    pb2, _ = c.pb()
    server = c.Server(server_args + [f"--shutdown-grace={args.shutdown_grace}"],
                      log_name="soak-sigterm")
    server.wait_serving()
    results, first = [None] * 4, [threading.Event() for _ in range(4)]

    def stream(i):
        request = c.make_request(c.prompt_ids(server, 200, offset=i), max_new=48)
        try:
            for _ in server.stub.GenerateStream(request, timeout=120):
                first[i].set()
            results[i] = "OK"
        except grpc.RpcError as e:
            results[i] = e.code().name
        first[i].set()

    threads = [threading.Thread(target=stream, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for e in first:
        e.wait(120)
    term_at = time.time()
    server.proc.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    try:
        server.stub.Generate(c.make_request(c.prompt_ids(server, 20), max_new=4), timeout=10)
        late = "OK"
    except grpc.RpcError as e:
        late = e.code().name
    for t in threads:
        t.join(timeout=args.shutdown_grace + 30)
    rc = server.proc.wait(timeout=args.shutdown_grace + 30)
    exit_s = time.time() - term_at
    server.stop()
    return {"in_flight": results, "call_after_sigterm": late, "exit_code": rc,
            "sigterm_to_exit_s": round(exit_s, 2), "grace_s": args.shutdown_grace}


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=30)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--sample", type=float, default=10, help="seconds between RSS samples")
    ap.add_argument("--settle", type=float, default=5, help="minute from which RSS growth counts")
    ap.add_argument("--restarts", type=int, default=3)
    ap.add_argument("--shutdown-grace", type=int, default=30)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-prefault", action="store_true",
                    help="leave --kv-cache-prefault off (the KV cache then becomes "
                         "resident as blocks are first used)")
    ap.add_argument("--out", default=str(c.RUNS / "soak.json"))
    args = ap.parse_args()
    server_args = [f"--threads={args.threads}",
                   f"--kv-cache-prefault={'false' if args.no_prefault else 'true'}"]

    machine = c.machine_info(args.threads)
    figures = soak(args, server_args)
    figures["restart_to_serving_s"] = [round(t, 2) for t in restart_times(args, server_args)]
    figures["sigterm_under_load"] = sigterm_under_load(args, server_args)
    s = figures["sigterm_under_load"]
    checks = {
        "no_leaked_blocks": figures["leaked_blocks"] == 0,
        "no_running_left": figures["requests_running_end"] == 0,
        "no_internal_errors": figures["internal_errors"] == 0,
        "rss_growth_within_2pct": figures["rss_growth_settle_to_end"] <= GROWTH_LIMIT,
        "restart_within_5s": c.median(figures["restart_to_serving_s"]) <= 5,
        "sigterm_drains": (s["exit_code"] == 0 and s["call_after_sigterm"] == "UNAVAILABLE"
                           and all(r == "OK" for r in s["in_flight"])
                           and s["sigterm_to_exit_s"] < s["grace_s"]),
    }
    figures["checks"] = checks
    c.write_json(args.out, {"config": vars(args), "machine": machine, "figures": figures})
    print({k: figures[k] for k in ("calls", "leaked_blocks", "internal_errors",
                                   "rss_growth_settle_to_end", "restart_to_serving_s")})
    print(checks)
    sys.exit(0 if all(checks.values()) else 1)


if __name__ == "__main__":
    main()
