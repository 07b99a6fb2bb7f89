"""Benchmark: snapserve under open-loop load. Writes bench/results/runs/server_load.json.

    SNAPSERVE_BUILD_DIR=build .venv/bin/python bench/server_load.py [--full]

A load generator sends GenerateStream requests with Poisson arrivals (seeded:
the same arrival times and prompts for both methods) at several rates, for a
fixed duration each, with mixed prompt lengths (uniform over --lengths), greedy,
ignore_eos, --max-new tokens. Each request carries a client deadline
(--deadline s): requests that cannot finish in time count as
DEADLINE_EXCEEDED errors, which keeps an overloaded phase bounded.
Per (rate, method): completed requests/s and generated tokens/s over the phase
(first send to last completion), TTFT and inter-token latency p50/p99
(client-side arrival times of streamed deltas), error counts by gRPC code.

gRPC path overhead: there is no in-process driver to compare with, so the
overhead is measured per request as client-observed latency (send to the end
of the stream) minus the server's own Usage.total_ms (queue + prefill + decode,
timed inside the engine); the same for TTFT (client TTFT - Usage.ttft). Both
include the Python client, HTTP/2 framing and protobuf, loopback TCP and the
server's completion-queue handoff.

Quick (default): rates {0.1, 0.3} req/s, 40 s each, lengths {256, 512, 1024},
32 new tokens, SnapKV C=256, 40 s deadline (the 2-core machine prefills only a
few hundred tokens/s). --full: rates {0.5, 1, 2} req/s, 60 s each, lengths
{256, 512, 1024, 2048, 4096}, 128 new tokens, 600 s deadline.
"""
import argparse
import collections
import concurrent.futures as cf
import os
import pathlib
import random
import sys
import threading
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import common as c  # noqa: E402


def schedule(rate, duration, lengths, seed):
    rng = random.Random(seed)
    t, out = 0.0, []
    while True:
        t += rng.expovariate(rate)
        if t >= duration:
            return out
        out.append((t, rng.choice(lengths), rng.randrange(10_000)))


def run_phase(server, plan, method, capacity, max_new, deadline):
    results = []
    lock = threading.Lock()
    ex = cf.ThreadPoolExecutor(max(4, min(256, len(plan))))
    start = time.perf_counter()
    futs = []

    def go(req):
        r = c.stream_one(server.stub, req, timeout=deadline)
        with lock:
            results.append(r)

    for (t, n, off) in plan:
        req = c.make_request(c.prompt_ids(server, n, offset=off), max_new, method, capacity)
        delay = start + t - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        futs.append(ex.submit(go, req))
    cf.wait(futs)
    ex.shutdown()
    end = time.perf_counter()
    return results, start, end


def summarize(results, start, end):
    ok = [r for r in results if r["error"] is None]
    errors = collections.Counter(r["error"] for r in results if r["error"])
    gaps = [g for r in ok for g in c.inter_token_gaps(r)]
    ttft = [r["arrivals"][0] - r["t0"] for r in ok if r["arrivals"]]
    lat = [r["t1"] - r["t0"] for r in ok]
    over = [(r["t1"] - r["t0"]) * 1e3 - r["usage"].total_ms for r in ok if r["usage"]]
    over_ttft = [(r["arrivals"][0] - r["t0"]) * 1e3 - r["usage"].time_to_first_token_ms
                 for r in ok if r["usage"] and r["arrivals"]]
    queue = [r["usage"].queue_ms for r in ok if r["usage"]]
    tokens = sum(sum(r["ntok"]) for r in ok)
    last = max((r["t1"] for r in results), default=end)
    wall = last - start

    def p(xs, q, scale=1.0):
        v = c.percentile(xs, q)
        return None if v is None else v * scale

    return {"requests_sent": len(results), "requests_ok": len(ok), "errors": dict(errors),
            "wall_s": wall, "completed_requests_per_s": len(ok) / wall if wall > 0 else None,
            "generated_tokens_per_s": tokens / wall if wall > 0 else None,
            "ttft_p50_ms": p(ttft, 50, 1e3), "ttft_p99_ms": p(ttft, 99, 1e3),
            "itl_p50_ms": p(gaps, 50, 1e3), "itl_p99_ms": p(gaps, 99, 1e3),
            "latency_p50_ms": p(lat, 50, 1e3), "latency_p99_ms": p(lat, 99, 1e3),
            "server_queue_p50_ms": p(queue, 50),
            "grpc_overhead_total_p50_ms": p(over, 50), "grpc_overhead_total_p99_ms": p(over, 99),
            "grpc_overhead_ttft_p50_ms": p(over_ttft, 50), "grpc_overhead_ttft_p99_ms": p(over_ttft, 99),
            "grpc_overhead_share_of_latency_p50": c.ratio(p(over, 50), p(lat, 50, 1e3))}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--full", action="store_true")
    ap.add_argument("--rates", type=float, nargs="+")
    ap.add_argument("--duration", type=float)
    ap.add_argument("--lengths", type=int, nargs="+")
    ap.add_argument("--max-new", type=int)
    ap.add_argument("--capacity", type=int)
    ap.add_argument("--deadline", type=float)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--kv-cache-memory", default="2GiB")
    ap.add_argument("--seed", type=int, default=1234)
    args = ap.parse_args()
    if args.full:
        d = dict(rates=[0.5, 1.0, 2.0], duration=60.0, lengths=[256, 512, 1024, 2048, 4096],
                 max_new=128, capacity=512, deadline=600.0)
    else:
        d = dict(rates=[0.1, 0.3], duration=40.0, lengths=[256, 512, 1024], max_new=32,
                 capacity=256, deadline=40.0)
    for k, v in d.items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    methods = ["none", "snapkv"]
    config = {"mode": "full" if args.full else "quick", "rates_req_per_s": args.rates,
              "duration_s": args.duration, "prompt_lengths_uniform": args.lengths,
              "max_new_tokens": args.max_new, "snapkv_capacity": args.capacity,
              "client_deadline_s": args.deadline, "kv_cache_memory": args.kv_cache_memory,
              "server_threads": args.threads, "seed": args.seed, "model": str(c.model_path()),
              "arrivals": "Poisson (exponential gaps), same schedule for both methods"}
    if not args.full:
        config["note"] = ("quick run: rates {0.1, 0.3} req/s x 40 s, lengths {256,512,1024}, "
                          "32 new tokens, 40 s deadline; --full: {0.5,1,2} req/s x 60 s, lengths "
                          "up to 4096, 128 new tokens")
    machine = c.machine_info(args.threads)
    machine["load_avg_start"] = os.getloadavg()
    phases = []
    with c.Server([f"--kv-cache-memory={args.kv_cache_memory}", f"--threads={args.threads}",
                   "--max-queue=1024"], "load") as s:
        c.corpus_ids(s)
        c.stream_one(s.stub, c.make_request(c.prompt_ids(s, 64), 4))  # warm-up
        for i, rate in enumerate(args.rates):
            plan = schedule(rate, args.duration, args.lengths, args.seed + i)
            for m in methods:
                res, t0, t1 = run_phase(s, plan, m, args.capacity, args.max_new, args.deadline)
                row = {"rate_req_per_s": rate, "method": m, "planned_requests": len(plan),
                       **summarize(res, t0, t1)}
                phases.append(row)
                c.log(f"rate {rate} {m}: ok {row['requests_ok']}/{len(plan)}, "
                      f"{row['generated_tokens_per_s']:.2f} tok/s, ttft p50 {row['ttft_p50_ms']}, "
                      f"itl p50 {row['itl_p50_ms']}, errors {row['errors']}")
                time.sleep(2)  # let cancelled work leave the server
        totals = {k: s.metric("snapserve_requests_total", {"status": k})
                  for k in ("OK", "DEADLINE_EXCEEDED", "CANCELLED", "RESOURCE_EXHAUSTED")}
    ratios = []
    for rate in args.rates:
        a = next(p for p in phases if p["rate_req_per_s"] == rate and p["method"] == "none")
        b = next(p for p in phases if p["rate_req_per_s"] == rate and p["method"] == "snapkv")
        ratios.append({"rate_req_per_s": rate,
                       "tokens_per_s_snapkv_over_none": c.ratio(b["generated_tokens_per_s"],
                                                                a["generated_tokens_per_s"]),
                       "ttft_p50_snapkv_over_none": c.ratio(b["ttft_p50_ms"], a["ttft_p50_ms"]),
                       "itl_p50_snapkv_over_none": c.ratio(b["itl_p50_ms"], a["itl_p50_ms"])})
    machine["load_avg_end"] = os.getloadavg()
    c.write_json("runs/server_load.json", {
        "benchmark": "server_load", "config": config, "machine": machine,
        "grpc_overhead_method": "client latency (send -> end of stream) minus Usage.total_ms "
                                "(server-side queue + compute) per OK request; the same for TTFT",
        "phases": phases, "ratios_same_run": ratios, "server_requests_total": totals})


if __name__ == "__main__":
    main()
