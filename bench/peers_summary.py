"""Summarizes one side-by-side run of the team's peers harness (kept outside
the repository; docs/testing-and-measuring.md: snapserve, llama.cpp, vLLM on
the same machine, model and threads, workloads W1-W3) into
bench/results/runs/peers_<tag>.json: per configuration the medians over reps of
each figure, and snapserve / peer ratios (>1: snapserve better; for latencies
the ratio is peer / snapserve).

    .venv/bin/python bench/peers_summary.py --tag <run name> \\
        --snap step256=/work/peers/results/r2/step256.json ... \\
        --peer llama-q41=/work/peers/results/r2/llama-q41.json ...

Each input is a results/<config>.json the harness's bench.py wrote.
"""
import argparse
import json
import pathlib
import statistics

# figure -> (workload, key in the harness's record, higher is better)
FIGURES = {
    "W1_decode_tok_s": ("W1", "decode_tok_s", True),
    "W1_ttft_s": ("W1", "ttft_s", False),
    "W2_prefill_tok_s": ("W2", "prefill_tok_s", True),
    "W3_agg_tok_s": ("W3", "agg_tok_s", True),
    "W3_ttft_p50_s": ("W3", "ttft_p50_s", False),
    "W3_ttft_p95_s": ("W3", "ttft_p95_s", False),
    "W3_itl_p50_ms": ("W3", "itl_p50_ms", False),
    "W3_itl_p95_ms": ("W3", "itl_p95_ms", False),
}


def medians(results):
    out = {}
    for name, (workload, key, _) in FIGURES.items():
        values = [r[key] for r in results.get(workload, []) if r.get(key) is not None]
        if values:
            out[name] = statistics.median(values)
    return out


def load(spec):
    label, path = spec.split("=", 1)
    payload = json.loads(pathlib.Path(path).read_text())
    return label, payload


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tag", required=True)
    ap.add_argument("--snap", action="append", default=[], help="label=path (snapserve runs)")
    ap.add_argument("--peer", action="append", default=[], help="label=path (peer runs)")
    args = ap.parse_args()
    configs, snaps, peers = {}, [], []
    for spec, into in [(s, snaps) for s in args.snap] + [(p, peers) for p in args.peer]:
        label, payload = load(spec)
        for variant, results in payload["results"].items():
            name = label if variant == "default" else f"{label} kv={variant}"
            configs[name] = {"cmd": payload["cmd"], "reps": payload["reps"],
                             "medians": medians(results)}
            into.append(name)
    ratios = []
    for s in snaps:
        for p in peers:
            row = {"snapserve": s, "peer": p}
            for name, (_, _, higher) in FIGURES.items():
                a, b = configs[s]["medians"].get(name), configs[p]["medians"].get(name)
                if a and b:
                    row[name] = round(a / b if higher else b / a, 3)
            ratios.append(row)
    out = pathlib.Path(__file__).resolve().parent / "results" / "runs" / f"peers_{args.tag}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"benchmark": "peers", "tag": args.tag, "configs": configs,
                               "ratios_snapserve_over_peer": ratios}, indent=1))
    for name, c in configs.items():
        print(name, {k: round(v, 2) for k, v in c["medians"].items()})
    for r in ratios:
        print(r)


if __name__ == "__main__":
    main()
