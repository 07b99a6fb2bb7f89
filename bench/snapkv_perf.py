"""Benchmark: what SnapKV costs and saves inside snapserve. Writes
bench/results/runs/snapkv_perf.json.

    SNAPSERVE_BUILD_DIR=build .venv/bin/python bench/snapkv_perf.py [--full]

1. Compression time as a share of prefill time, at several prompt lengths n.
   Two methods, both from the real server, in the same run:
   a) metric: the increase of snapserve_snapkv_duration_seconds_sum over one
      SnapKV request (the server times its selection per request) divided by
      that request's prefill time, Usage.time_to_first_token_ms - queue_ms
      (prefill + first sampling; nothing else runs);
   b) A/B: the same prompt once with kv_compression NONE and once with SNAPKV
      (alternating, max_new_tokens=1); (ttft_snapkv - ttft_none) / ttft_none.
   Medians of --repeats runs; ratios computed per run, then the median.
   Quick (default): n {1024, 2048}, 3 repeats. --full: n {2048, 4096, 8191}, 3 repeats
   (8191: SmolLM2's context is 8192 and a request needs prompt + 1 new token).
2. Prefill peak memory with and without layer-wise compression: one fresh
   server per configuration; a 64-token warm-up, then VmHWM from
   /proc/<pid>/status before and after one n-token prompt (also the peak of
   VmRSS sampled every 20 ms). "With" = SnapKV (each layer's K/V is compressed
   right after that layer's prefill, so only one layer's full K/V exists at a
   time); "without" = no compression (the full K/V of every layer is written
   to the cache; the engine has no whole-prompt-then-compress mode). Shown next
   to the computed one-layer full K/V size n * kv_heads * head_dim * 2 * 4 B.
   The paged pool is allocated with at::empty, so its pages count in RSS only
   once written. Quick: n=2048; --full: n=8191.
3. KV bytes per request before/after: Usage.kv_prompt_entries and
   kv_kept_entries x layers x kv_heads x head_dim x 2 (K,V) x dtype bytes.
"""
import argparse
import os
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import common as c  # noqa: E402

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def one(server, ids, method, C):
    before = server.metric("snapserve_snapkv_duration_seconds_sum") or 0.0
    before_n = server.metric("snapserve_snapkv_duration_seconds_count") or 0.0
    r = c.stream_one(server.stub, c.make_request(ids, 1, method, C), timeout=3600)
    after = server.metric("snapserve_snapkv_duration_seconds_sum") or 0.0
    after_n = server.metric("snapserve_snapkv_duration_seconds_count") or 0.0
    u = c.usage_dict(r["usage"])
    return {"method": method, "error": r["error"], "usage": u,
            "snapkv_s": after - before, "snapkv_count": after_n - before_n,
            "prefill_ms": (u["time_to_first_token_ms"] - u["queue_ms"]) if u else None,
            "client_s": r["t1"] - r["t0"]}


def kv_bytes(entries, info):
    return entries * info.num_layers * info.num_key_value_heads * info.head_dim * 2 * \
        DTYPE_BYTES.get(info.dtype, 4)


def timing(args, lengths, repeats):
    runs, kvrows = [], []
    with c.Server([f"--kv-cache-memory={args.kv_cache_memory}", f"--threads={args.threads}",
                   f"--kv-capacity={args.capacity}"], "snapkv-perf") as s:
        info = s.model_info()
        c.corpus_ids(s)
        c.stream_one(s.stub, c.make_request(c.prompt_ids(s, 64), 2))  # warm-up
        for rep in range(repeats):
            for n in lengths:
                ids = c.prompt_ids(s, n, offset=10 + rep)
                order = ("none", "snapkv") if rep % 2 == 0 else ("snapkv", "none")
                pair = {m: one(s, ids, m, args.capacity) for m in order}
                sn, no = pair["snapkv"], pair["none"]
                row = {"rep": rep, "n": n,
                       "snapkv_ms_metric": 1e3 * sn["snapkv_s"],
                       "snapkv_requests_counted": sn["snapkv_count"],
                       "prefill_ms_snapkv": sn["prefill_ms"], "prefill_ms_none": no["prefill_ms"],
                       "share_metric": c.ratio(1e3 * sn["snapkv_s"], sn["prefill_ms"]),
                       "overhead_ab": (c.ratio(sn["prefill_ms"], no["prefill_ms"]) - 1)
                       if sn["prefill_ms"] and no["prefill_ms"] else None,
                       "errors": [x["error"] for x in pair.values() if x["error"]],
                       "usage_snapkv": sn["usage"], "usage_none": no["usage"]}
                runs.append(row)
                if row["errors"]:
                    raise RuntimeError(f"rep {rep} n={n}: {row['errors']}")
                c.log(f"rep {rep} n={n}: snapkv {row['snapkv_ms_metric']:.1f} ms of prefill "
                      f"{row['prefill_ms_snapkv']:.0f} ms (share {row['share_metric']}); "
                      f"none prefill {row['prefill_ms_none']:.0f} ms")
        for n in lengths:
            u = next(r["usage_snapkv"] for r in runs if r["n"] == n and r["usage_snapkv"])
            kvrows.append({"n": n, "kv_prompt_entries": u["kv_prompt_entries"],
                           "kv_kept_entries": u["kv_kept_entries"],
                           "kv_bytes_before": kv_bytes(u["kv_prompt_entries"], info),
                           "kv_bytes_after": kv_bytes(u["kv_kept_entries"], info),
                           "ratio_before_over_after": c.ratio(u["kv_prompt_entries"],
                                                              u["kv_kept_entries"])})
    summary = []
    for n in lengths:
        rs = [r for r in runs if r["n"] == n]
        summary.append({"n": n, "runs": len(rs),
                        "median_snapkv_ms": c.median([r["snapkv_ms_metric"] for r in rs]),
                        "median_prefill_ms_snapkv": c.median([r["prefill_ms_snapkv"] for r in rs]),
                        "median_prefill_ms_none": c.median([r["prefill_ms_none"] for r in rs]),
                        "median_share_metric": c.median([r["share_metric"] for r in rs]),
                        "median_overhead_ab": c.median([r["overhead_ab"] for r in rs])})
    return info, runs, summary, kvrows


def memory(args, n):
    out = []
    for method in ("none", "snapkv"):
        with c.Server([f"--kv-cache-memory={args.kv_cache_memory}", f"--threads={args.threads}",
                       f"--kv-capacity={args.capacity}"], f"snapkv-mem-{method}") as s:
            info = s.model_info()
            ids = c.prompt_ids(s, n, offset=3)
            c.stream_one(s.stub, c.make_request(c.prompt_ids(s, 64, offset=7), 2, method))
            time.sleep(0.5)
            hwm0, rss0 = s.proc_status("VmHWM"), s.proc_status("VmRSS")
            with c.RssSampler(s.pid) as sampler:
                r = c.stream_one(s.stub, c.make_request(ids, 1, method, args.capacity), timeout=3600)
            hwm1 = s.proc_status("VmHWM")
            u = c.usage_dict(r["usage"])
            row = {"method": method, "n": n, "error": r["error"],
                   "vmhwm_before": hwm0, "vmhwm_after": hwm1, "vmhwm_increase": hwm1 - hwm0,
                   "vmrss_before": rss0, "vmrss_peak_sampled": sampler.peak,
                   "vmrss_peak_increase": sampler.peak - rss0,
                   "kv_kept_entries": u["kv_kept_entries"] if u else None}
            row["kv_bytes_written_to_pool"] = kv_bytes(row["kv_kept_entries"] or 0, info)
            # what the new peak holds beyond the kept KV: prefill activations and,
            # with SnapKV, the one layer's full K/V being compressed
            row["vmhwm_increase_minus_pool_writes"] = row["vmhwm_increase"] - row["kv_bytes_written_to_pool"]
            out.append(row)
            c.log(f"memory {method} n={n}: VmHWM +{row['vmhwm_increase'] / 2**20:.1f} MiB")
    one_layer = n * info.num_key_value_heads * info.head_dim * 2 * DTYPE_BYTES.get(info.dtype, 4)
    return {"rows": out,
            "one_layer_full_kv_bytes": one_layer,
            "all_layers_full_kv_bytes": kv_bytes(n, info),
            "ratio_vmhwm_increase_none_over_snapkv": c.ratio(out[0]["vmhwm_increase"],
                                                             out[1]["vmhwm_increase"]),
            "method": "one fresh server per configuration; VmHWM before/after one prompt "
                      "(after a 64-token warm-up); VmRSS sampled every 20 ms"}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--full", action="store_true")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--capacity", type=int, default=512, help="SnapKV C")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--kv-cache-memory", default="2GiB")
    ap.add_argument("--memory-n", type=int, default=None)
    args = ap.parse_args()
    lengths = [2048, 4096, 8191] if args.full else [1024, 2048]
    mem_n = args.memory_n or (8191 if args.full else 2048)
    config = {"mode": "full" if args.full else "quick", "prompt_tokens": lengths,
              "repeats": args.repeats, "snapkv_capacity": args.capacity, "window": "server default",
              "kv_cache_memory": args.kv_cache_memory, "memory_prompt_tokens": mem_n,
              "server_threads": args.threads, "model": str(c.model_path())}
    if not args.full:
        config["note"] = ("quick run: n {1024, 2048} and memory at n=2048; --full runs n "
                          "{2048, 4096, 8191} and memory at n=8191")
    machine = c.machine_info(args.threads)
    machine["load_avg_start"] = os.getloadavg()
    info, runs, summary, kvrows = timing(args, lengths, args.repeats)
    try:
        mem = memory(args, mem_n)
    except Exception as e:  # noqa: BLE001
        mem = {"error": repr(e)}
    machine["load_avg_end"] = os.getloadavg()
    c.write_json("runs/snapkv_perf.json", {
        "benchmark": "snapkv_perf", "config": config, "machine": machine,
        "model_info": {"num_layers": info.num_layers, "num_key_value_heads": info.num_key_value_heads,
                       "head_dim": info.head_dim, "dtype": info.dtype, "device": info.device},
        "compression_share_of_prefill": {
            "method": "metric: delta of snapserve_snapkv_duration_seconds_sum / (ttft - queue) "
                      "of the same SnapKV request; A/B: (ttft_snapkv - ttft_none) / ttft_none, "
                      "same prompt, alternating order; medians over repeats",
            "summary": summary},
        "prefill_peak_memory": mem,
        "kv_bytes_per_request": kvrows,
        "runs": runs})


if __name__ == "__main__":
    main()
