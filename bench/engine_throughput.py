"""Benchmark: snapserve end-to-end decode throughput and inter-token latency,
KV-memory capacity with and without SnapKV, and the decode step vs the memory
roofline. Writes bench/results/runs/engine_throughput.json (+ .png when matplotlib
is importable).

    SNAPSERVE_BUILD_DIR=build .venv/bin/python bench/engine_throughput.py [--full]

1. Grid: concurrency x prompt length x {no compression, SnapKV C}. Each cell
   sends `concurrency` GenerateStream requests at once (distinct natural-text
   prompts of exactly n tokens, greedy, ignore_eos, max_new tokens each).
   Aggregate tokens/s = all generated tokens / (last response end - first send).
   Inter-token latency = gaps between consecutive streamed deltas of one request
   (client arrival times), pooled over the cell's requests; p50/p99.
   Quick (default): concurrency {1,4} x n {1024} x 32 new tokens, 3 repeats.
   --full: concurrency {1,4,16} x n {512,4096} x 128 new tokens, 3 repeats.
   Ratios SnapKV / none are computed per cell within the same run, from medians.
2. Capacity: how many n=4096, max_new=128 requests fit at once in the KV pool of
   --kv-cache-memory (default 2GiB), computed from GetModelInfo's
   kv_cache_capacity_tokens and the admission rule (ceil((min(n,C)+max_new)/block)
   blocks reserved per request), then confirmed on a second server with a small
   pool: K requests sent at once, snapserve_requests_running sampled from
   /metrics while they run; max observed vs computed, for none and SnapKV.
3. Roofline: bytes moved by one decode step = weight bytes (every weight read
   once per step, the tied embedding read as the LM head) + KV bytes read
   (every sequence's cached entries), divided by the step time (median
   inter-token gap of the cell), as a fraction of the machine's measured
   bandwidth (common.memory_bandwidth_gbs: the faster of a one-thread copy and
   an all-threads read); at batch 1 and the largest batch run.
"""
import argparse
import concurrent.futures as cf
import math
import os
import pathlib
import sys
import threading
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import common as c  # noqa: E402

KV_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def run_cell(server, conc, n, max_new, method, capacity, rep):
    reqs = [c.make_request(c.prompt_ids(server, n, offset=1 + rep * 64 + i), max_new, method,
                           capacity) for i in range(conc)]
    with cf.ThreadPoolExecutor(conc) as ex:
        results = list(ex.map(lambda r: c.stream_one(server.stub, r, timeout=3600), reqs))
    errors = [r["error"] for r in results if r["error"]]
    t0 = min(r["t0"] for r in results)
    t1 = max(r["t1"] for r in results)
    tokens = sum(sum(r["ntok"]) for r in results)
    gaps = [g for r in results for g in c.inter_token_gaps(r)]
    # Steady phase: every request of the cell has its first token and none has
    # finished, so each gap is one decode step of the whole batch with no
    # prefill slice in it (the roofline's step time).
    started = [r["arrivals"] for r in results if r["arrivals"]]
    steady = []
    if len(started) == len(results):
        t_all, t_done = max(a[0] for a in started), min(a[-1] for a in started)
        for r in results:
            a, k = r["arrivals"], r["ntok"]
            steady += [(a[i] - a[i - 1]) / max(1, k[i]) for i in range(1, len(a))
                       if a[i - 1] >= t_all and a[i] <= t_done]
    ttft = [(r["arrivals"][0] - r["t0"]) for r in results if r["arrivals"]]
    usages = [c.usage_dict(r["usage"]) for r in results]
    return {
        "wall_s": t1 - t0,
        "generated_tokens": tokens,
        "tokens_per_s": tokens / (t1 - t0) if t1 > t0 else None,
        "itl_p50_ms": 1e3 * c.percentile(gaps, 50) if gaps else None,
        "itl_p99_ms": 1e3 * c.percentile(gaps, 99) if gaps else None,
        "steady_itl_p50_ms": 1e3 * c.percentile(steady, 50) if steady else None,
        "steady_gaps": len(steady),
        "ttft_p50_ms": 1e3 * c.percentile(ttft, 50) if ttft else None,
        # The distributions, as their 1st..99th percentiles (plot_distributions).
        "itl_percentiles_ms": [1e3 * c.percentile(gaps, q) for q in range(1, 100)] if gaps else [],
        "ttft_percentiles_s": [c.percentile(ttft, q) for q in range(1, 100)] if ttft else [],
        "errors": errors,
        "kv_kept_entries": [u["kv_kept_entries"] for u in usages if u],
        "kv_prompt_entries": [u["kv_prompt_entries"] for u in usages if u],
    }


def weight_bytes(model_path, dtype_bytes):
    """Bytes of weights one decode step reads, in the compute dtype (the engine
    dequantizes GGUF weights at load). The token embedding is read only as the
    LM head when it is tied (no output.weight); otherwise only output.weight."""
    try:
        from gguf import GGUFReader
    except Exception as e:  # noqa: BLE001
        return None, f"gguf package unavailable: {e}"
    r = GGUFReader(str(model_path))
    names = {t.name: int(t.n_elements) for t in r.tensors}
    total = 0
    for name, ne in names.items():
        if name == "token_embd.weight" and "output.weight" in names:
            continue  # embedding lookups read one row per sequence only
        if name.startswith("rope_"):
            continue
        total += ne
    return total * dtype_bytes, (f"{total} weight elements x {dtype_bytes} B; token_embd counted "
                                 f"as the tied LM head" if "output.weight" not in names else
                                 f"{total} weight elements x {dtype_bytes} B")


def capacity_rule(cap_tokens, block, n, max_new, C, max_batch):
    blocks = cap_tokens // block
    out = {}
    for label, kept in (("none", n), ("snapkv", min(n, C))):
        reserve = kept + max_new
        per_req = math.ceil(reserve / block)
        fit = blocks // per_req
        out[label] = {"reserve_tokens": reserve, "blocks_per_request": per_req,
                      "fit_in_kv_memory": fit, "running_at_once": min(fit, max_batch)}
    out["ratio_fit_snapkv_over_none"] = c.ratio(out["snapkv"]["fit_in_kv_memory"],
                                                out["none"]["fit_in_kv_memory"])
    return out


def observe_capacity(args, info):
    """A server whose pool holds `target_none` requests without compression;
    send K at once for each method and record the peak of the running gauge."""
    n, max_new, C = args.obs_prompt, args.obs_max_new, args.obs_capacity
    block = args.block_size
    per_none = math.ceil((n + max_new) / block)
    blocks = per_none * 2 + per_none // 2  # room for 2.5 uncompressed requests
    bytes_per_token = info.num_layers * info.num_key_value_heads * info.head_dim * 2 * \
        KV_DTYPE_BYTES.get(info.dtype, 4)
    mem = blocks * block * bytes_per_token
    out = {"kv_cache_memory_bytes": mem, "prompt_tokens": n, "max_new_tokens": max_new,
           "snapkv_capacity": C}
    srv_args = [f"--kv-cache-memory={mem}", f"--block-size={block}",
                f"--max-batch-size={args.max_batch_size}", f"--threads={args.threads}"]
    with c.Server(srv_args, "capacity") as s:
        mi = s.model_info()
        out["kv_cache_capacity_tokens"] = mi.kv_cache_capacity_tokens
        out["computed"] = capacity_rule(mi.kv_cache_capacity_tokens, block, n, max_new, C,
                                        mi.max_batch_size)
        k = args.obs_requests or max(out["computed"]["none"]["running_at_once"],
                                     out["computed"]["snapkv"]["running_at_once"]) + 2
        out["requests_sent"] = k
        for method in ("none", "snapkv"):
            peak = {"running": 0, "waiting": 0}
            stop = threading.Event()

            def poll():
                while not stop.is_set():
                    try:
                        text = s.metrics_text()
                        peak["running"] = max(peak["running"], c.metrics.total(
                            text, "snapserve_requests_running") or 0)
                        peak["waiting"] = max(peak["waiting"], c.metrics.total(
                            text, "snapserve_requests_waiting") or 0)
                    except Exception:  # noqa: BLE001 - keep polling
                        pass
                    time.sleep(0.05)

            th = threading.Thread(target=poll, daemon=True)
            th.start()
            reqs = [c.make_request(c.prompt_ids(s, n, offset=500 + i), max_new, method, C)
                    for i in range(k)]
            t0 = time.perf_counter()
            with cf.ThreadPoolExecutor(len(reqs)) as ex:
                res = list(ex.map(lambda r: c.stream_one(s.stub, r, timeout=3600), reqs))
            stop.set()
            th.join()
            out[method] = {"max_requests_running_observed": int(peak["running"]),
                           "max_requests_waiting_observed": int(peak["waiting"]),
                           "computed_running_at_once": out["computed"][method]["running_at_once"],
                           "agrees": int(peak["running"]) ==
                           out["computed"][method]["running_at_once"],
                           "errors": [r["error"] for r in res if r["error"]],
                           "wall_s": time.perf_counter() - t0}
            c.log(f"capacity {method}: running peak {peak['running']} "
                  f"(computed {out['computed'][method]['running_at_once']})")
    return out


def plot(path, cells, methods):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    keys = sorted({(x["concurrency"], x["prompt_tokens"]) for x in cells})
    width = 0.8 / len(methods)
    for j, m in enumerate(methods):
        tps = [next((x["median"]["tokens_per_s"] for x in cells if x["method"] == m and
                     (x["concurrency"], x["prompt_tokens"]) == k), 0) or 0 for k in keys]
        itl = [next((x["median"]["itl_p50_ms"] for x in cells if x["method"] == m and
                     (x["concurrency"], x["prompt_tokens"]) == k), 0) or 0 for k in keys]
        xs = [i + j * width for i in range(len(keys))]
        axes[0].bar(xs, tps, width, label=m)
        axes[1].bar(xs, itl, width, label=m)
    labels = [f"c={k[0]}\nn={k[1]}" for k in keys]
    for ax, title in zip(axes, ("aggregate generated tokens/s", "inter-token latency p50 (ms)")):
        ax.set_xticks([i + width * (len(methods) - 1) / 2 for i in range(len(keys))])
        ax.set_xticklabels(labels)
        ax.set_title(title)
        ax.legend()
    fig.suptitle("snapserve decode throughput (medians; see engine_throughput.json)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--full", action="store_true", help="complete grid (hours on 2 CPU cores)")
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--threads", type=int, default=0, help="server --threads (0: all cores)")
    ap.add_argument("--kv-cache-memory", default="2GiB")
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--max-batch-size", type=int, default=16)
    ap.add_argument("--capacity", type=int, default=512, help="SnapKV C")
    ap.add_argument("--capacity-prompt", type=int, default=4096)
    ap.add_argument("--capacity-max-new", type=int, default=128)
    ap.add_argument("--obs-prompt", type=int, default=256)
    ap.add_argument("--obs-max-new", type=int, default=16)
    ap.add_argument("--obs-capacity", type=int, default=64)
    ap.add_argument("--obs-requests", type=int, default=0,
                    help="requests sent at once (0: the larger computed count + 2)")
    ap.add_argument("--skip-observe", action="store_true")
    ints = lambda v: [int(x) for x in v.split(",")]  # noqa: E731
    ap.add_argument("--concurrency", type=ints, default=None, help="override, e.g. 16")
    ap.add_argument("--lengths", type=ints, default=None, help="override, e.g. 512,4096")
    ap.add_argument("--max-new", type=int, default=None, help="override new tokens per request")
    ap.add_argument("--out", default="runs/engine_throughput.json", help="file under bench/results/")
    args = ap.parse_args()

    if args.full:
        concs, lengths, max_new, repeats = [1, 4, 16], [512, 4096], 128, args.repeats or 3
    else:
        concs, lengths, max_new, repeats = [1, 4], [1024], 32, args.repeats or 3
    concs = args.concurrency or concs
    lengths = args.lengths or lengths
    max_new = args.max_new or max_new
    methods = ["none", "snapkv"]
    config = {"mode": "full" if args.full else "quick", "concurrency": concs,
              "prompt_tokens": lengths, "max_new_tokens": max_new, "repeats": repeats,
              "snapkv_capacity": args.capacity, "kv_cache_memory": args.kv_cache_memory,
              "block_size": args.block_size, "max_batch_size": args.max_batch_size,
              "server_threads": args.threads, "model": str(c.model_path()),
              "sampling": "greedy, ignore_eos", "prompts": "natural text, distinct per request"}
    if not args.full:
        config["note"] = ("quick run: reduced grid (concurrency {1,4} x n {1024} x 32 new "
                          "tokens, 3 repeats; n=1024 > C so SnapKV compresses 2x); --full runs "
                          "{1,4,16} x {512,4096} x 128, 3 repeats")
    machine = c.machine_info(args.threads)
    machine["load_avg_start"] = os.getloadavg()
    bw = c.memory_bandwidth_gbs(threads=args.threads)
    c.log(f"memory bandwidth {bw['gb_per_s']:.1f} GB/s")

    srv_args = [f"--kv-cache-memory={args.kv_cache_memory}", f"--block-size={args.block_size}",
                f"--max-batch-size={args.max_batch_size}", f"--threads={args.threads}",
                f"--max-queue={max(64, 2 * max(concs))}"]
    cells = []
    with c.Server(srv_args, "throughput") as s:
        info = s.model_info()
        dtype_bytes = KV_DTYPE_BYTES.get(info.dtype, 4)
        kv_bytes_per_entry = info.num_layers * info.num_key_value_heads * info.head_dim * 2 * dtype_bytes
        c.corpus_ids(s)
        c.stream_one(s.stub, c.make_request(c.prompt_ids(s, 64), 4))  # warm-up
        for rep in range(repeats):
            for n in lengths:
                for conc in concs:
                    for m in methods:
                        r = run_cell(s, conc, n, max_new, m, args.capacity, rep)
                        c.log(f"rep {rep} n={n} c={conc} {m}: {r['tokens_per_s']:.2f} tok/s, "
                              f"itl p50 {r['itl_p50_ms']} ms, errors {r['errors']}")
                        cells.append({"rep": rep, "concurrency": conc, "prompt_tokens": n,
                                      "method": m, **r})
        capacity = capacity_rule(info.kv_cache_capacity_tokens, args.block_size,
                                 args.capacity_prompt, args.capacity_max_new, args.capacity,
                                 info.max_batch_size)
        capacity["kv_cache_capacity_tokens"] = info.kv_cache_capacity_tokens
        capacity["kv_cache_memory"] = args.kv_cache_memory
        capacity["prompt_tokens"] = args.capacity_prompt
        capacity["max_new_tokens"] = args.capacity_max_new
        capacity["snapkv_capacity"] = args.capacity
        capacity["note"] = ("fit_in_kv_memory: requests whose reservations fit in the pool; "
                            "running_at_once also caps at max_batch_size")
        metrics_sample = {k: s.metric(k) for k in ("snapserve_batch_size_sum", "snapserve_batch_size_count")}
        model_info = {"num_layers": info.num_layers, "num_key_value_heads": info.num_key_value_heads,
                      "head_dim": info.head_dim, "dtype": info.dtype, "device": info.device,
                      "kv_cache_capacity_tokens": info.kv_cache_capacity_tokens,
                      "max_batch_size": info.max_batch_size}

    # medians over repeats, ratios within this run
    summary = []
    for n in lengths:
        for conc in concs:
            row = {"concurrency": conc, "prompt_tokens": n}
            for m in methods:
                rs = [x for x in cells if (x["concurrency"], x["prompt_tokens"], x["method"]) ==
                      (conc, n, m)]
                med = {k: c.median([x[k] for x in rs]) for k in
                       ("tokens_per_s", "itl_p50_ms", "itl_p99_ms", "ttft_p50_ms", "wall_s")}
                steady = [x["steady_itl_p50_ms"] for x in rs if x.get("steady_itl_p50_ms")]
                med["steady_itl_p50_ms"] = c.median(steady) if steady else None
                med["errors"] = sum(len(x["errors"]) for x in rs)
                med["kv_kept_entries"] = rs[0]["kv_kept_entries"][:1] if rs else None
                row[m] = med
            row["ratio_tokens_per_s_snapkv_over_none"] = c.ratio(row["snapkv"]["tokens_per_s"],
                                                                 row["none"]["tokens_per_s"])
            row["ratio_itl_p50_snapkv_over_none"] = c.ratio(row["snapkv"]["itl_p50_ms"],
                                                            row["none"]["itl_p50_ms"])
            summary.append(row)

    # roofline: this VM's bandwidth varies with its neighbours (28-57 GB/s for
    # a 2-thread read within minutes), so it is probed before and after the
    # cells and the faster probe is the roofline (never flattering).
    bw_end = c.memory_bandwidth_gbs(threads=args.threads)
    c.log(f"memory bandwidth at the end {bw_end['gb_per_s']:.1f} GB/s")
    probes = {"start": bw, "end": bw_end}
    bw = dict(max((bw, bw_end), key=lambda x: x["gb_per_s_best"]), probes=probes)
    wbytes, wnote = weight_bytes(c.model_path(), dtype_bytes)
    roof = {"bandwidth": bw, "weight_bytes_per_step": wbytes, "weight_bytes_method": wnote,
            "kv_bytes_per_entry_all_layers": kv_bytes_per_entry, "points": [],
            "method": ("bytes/step = weight bytes + sum over the batch of (kept prompt entries + "
                       "max_new/2 generated) x kv_bytes_per_entry; step time = median inter-token "
                       "gap of the cell (each step emits one token per running sequence); "
                       "fraction = (bytes/step / step time) / best measured bandwidth "
                       "(the roofline: the faster of a 1-thread copy and an all-threads read, "
                       "see bandwidth; the fraction of the median is given too)")}
    for n in lengths:
        for conc in sorted({min(concs), max(concs)}):
            for m in methods:
                row = next(r for r in summary if (r["concurrency"], r["prompt_tokens"]) == (conc, n))
                # The steady-phase step when there was one (all of the batch decoding,
                # no prefill slice in between); else the median gap of the cell.
                itl = row[m]["steady_itl_p50_ms"] or row[m]["itl_p50_ms"]
                source = "steady" if row[m]["steady_itl_p50_ms"] else "all gaps"
                kept = (row[m]["kv_kept_entries"] or [min(n, args.capacity) if m == "snapkv" else n])[0]
                kv = conc * (kept + max_new / 2) * kv_bytes_per_entry
                if itl and wbytes:
                    moved = wbytes + kv
                    gbs = moved / (itl / 1e3) / 1e9
                    roof["points"].append({
                        "batch": conc, "prompt_tokens": n, "method": m, "step_ms": itl,
                        "step_time_source": source,
                        "weight_bytes": wbytes, "kv_bytes": kv, "bytes_per_step": moved,
                        "effective_gb_per_s": gbs,
                        "fraction_of_measured_bandwidth": gbs / bw["gb_per_s_best"],
                        "fraction_of_median_bandwidth": gbs / bw["gb_per_s"]})

    payload = {"benchmark": "engine_throughput", "config": config, "machine": machine,
               "model_info": model_info, "summary": summary, "capacity_2gib": capacity,
               "roofline": roof, "batch_size_metric": metrics_sample, "cells": cells}

    if not args.skip_observe:
        try:
            payload["capacity_observed"] = observe_capacity(args, info)
        except Exception as e:  # noqa: BLE001 - record and keep the rest
            payload["capacity_observed"] = {"error": repr(e)}
    machine["load_avg_end"] = os.getloadavg()

    png = (c.RESULTS / args.out).with_suffix(".png")
    if c.have_matplotlib():
        try:
            png.parent.mkdir(parents=True, exist_ok=True)
            plot(png, summary_cells(summary, methods), methods)
            payload["png"] = str(png.relative_to(c.ROOT))
            cdf = png.with_name(png.stem + "_latency.png")
            plot_distributions(cdf, cells)
            payload["latency_png"] = str(cdf.relative_to(c.ROOT))
        except Exception as e:  # noqa: BLE001
            payload["png"] = f"not written: {e!r}"
    else:
        payload["png"] = "not written: matplotlib is not importable"
    c.write_json(args.out, payload)


def plot_distributions(path, cells):
    """Time to first token and inter-token gaps as cumulative distributions,
    one line per (cell, method, rep), from the recorded percentiles."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    qs = list(range(1, 100))
    for x in cells:
        label = f"c={x['concurrency']} n={x['prompt_tokens']} {x['method']} rep {x['rep']}"
        if x.get("ttft_percentiles_s"):
            axes[0].plot(x["ttft_percentiles_s"], qs, label=label)
        if x.get("itl_percentiles_ms"):
            axes[1].plot(x["itl_percentiles_ms"], qs, label=label)
    axes[0].set_xlabel("time to first token (s)")
    axes[1].set_xlabel("inter-token gap (ms, log scale)")
    axes[1].set_xscale("log")
    for ax in axes:
        ax.set_ylabel("percentile")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle("snapserve latency distributions (see the JSON of the same name)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def summary_cells(summary, methods):
    return [{"concurrency": r["concurrency"], "prompt_tokens": r["prompt_tokens"], "method": m,
             "median": r[m]} for r in summary for m in methods]


if __name__ == "__main__":
    main()
