"""Benchmark: the compression policies against each other and against
kvpress's presses at equal budgets (docs/compression-policies.md). Writes
bench/results/runs/policies.json and bench/results/runs/policies.png.

    SNAPSERVE_BUILD_DIR=build .venv/bin/python bench/policies.py

For each budget C in --capacities and each of snapserve's policies (SnapKV,
PyramidKV and AdaKV with max and avg pooling, StreamingLLM), on the default
model:

- teacher-forced top-1 agreement and mean KL(full || policy) of the next
  --tf-len tokens after a --tf-prompt token prompt of natural text, in
  process: the Python pipeline (tests/python/reference/hf_snapkv_pipeline.py
  with the references in tests/python/reference/), which
  tests/python/test_*_e2e.py show token-identical to the server for every
  policy;
- through the server: the greedy tokens' common prefix with the uncompressed
  cache's (--greedy-tokens after the same prompts), passkey accuracy at depths
  10/50/90 % of a --passkey-length prompt (bench/snapkv_quality.py's task),
  and the KV bytes the request held (Usage.kv_bytes_held);
- the same figures for kvpress 0.5.5's presses at the same C (SnapKV,
  PyramidKV, AdaKV, StreamingLLM, Knorm, TOVA, ExpectedAttention), run by
  bench/kvpress_policies.py in .deps/kvpress-venv, with the bytes of K/V each
  press's cache really holds.

The goal (issue 16): at every C, one of snapserve's policies is at least as
good as every kvpress press on every quality figure; `goal` in the JSON says
where it holds, strictly and within the gap between our SnapKV (avg) and
kvpress's SnapKVPress, which keep the same positions, so that their gap is
the two pipelines' noise. Scored policies share --window, --kernel; PyramidKV uses
--beta (4: a pyramid exists for every C >= 4 w), AdaKV --alpha.
"""
import argparse
import datetime
import json
import os
import pathlib
import platform
import random
import subprocess
import sys
import time

os.environ["HF_HUB_OFFLINE"] = "1"

import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "python"))
sys.path.insert(0, str(ROOT / "bench"))
import common as c  # noqa: E402
from reference import adaptive_kv, streaming_llm  # noqa: E402
from reference.hf_snapkv_pipeline import SnapKVPipeline, original_tokenizer  # noqa: E402
from snapkv_quality import kl_and_top1, passkey_prompt  # noqa: E402

KVPRESS_PYTHON = ROOT / ".deps" / "kvpress-venv" / "bin" / "python"
OURS = [("snapkv", "max"), ("snapkv", "avg"), ("pyramidkv", "max"), ("pyramidkv", "avg"),
        ("adakv", "max"), ("adakv", "avg"), ("streaming_llm", None)]
PRESSES = ["snapkv", "pyramidkv", "adakv", "streaming_llm", "knorm", "tova",
           "expected_attention"]
FIGURES = {"top1_agreement": max, "kl_mean": min, "greedy_common_prefix": max,
           "passkey_accuracy": max}  # which direction is better


def label(method, pooling):
    return method if pooling is None else f"{method}-{pooling}"


def positions(pipe, pre, method, pooling, capacity, args):
    """Per layer the kept positions per KV head (the references' rules)."""
    n, w = pre.n, args.window
    out = []
    budgets = adaptive_kv.pyramid_budgets(n, pipe.num_layers, capacity, w, args.beta)
    for layer in range(pipe.num_layers):
        q = pre.q_window[layer][:, -w:, :]
        k = pre.keys[layer]
        if method == "snapkv":
            from reference import snapkv
            out.append(list(snapkv.select_positions(q, k, w, capacity, args.kernel, pooling)))
        elif method == "pyramidkv":
            out.append(adaptive_kv.pyramid_positions(q, k, w, budgets[layer], args.kernel, pooling))
        elif method == "adakv":
            out.append(adaptive_kv.adakv_positions(q, k, w, capacity, args.kernel, pooling,
                                                   args.alpha))
        else:
            out.append(list(streaming_llm.select_positions(n, capacity, args.sink,
                                                           pipe.num_kv_heads)))
    return out


def teacher_forced(pipe, texts, args, log):
    res = {}
    for name, prompt, cont in texts:
        pre = pipe.prefill(prompt, max_window=args.window)
        full = pipe.teacher_forced(pre, pipe.full(pre), cont)
        for method, pooling in OURS:
            for cap in args.capacities:
                comp = pipe.keep_ragged(pre, positions(pipe, pre, method, pooling, cap, args))
                kl, top1 = kl_and_top1(full, pipe.teacher_forced(pre, comp, cont))
                res.setdefault(f"{label(method, pooling)}/C{cap}", {})[name] = {
                    "kl_mean": kl, "top1_agreement": top1}
        log(f"teacher-forced {name} done")
    return res


def request(pb2, ids, method, pooling, capacity, args, max_new):
    K = pb2.KvCompression
    kv = K(method=getattr(K, method.upper()))
    if method != "none":
        kv.max_capacity_prompt = capacity
        kv.window_size = args.window
        kv.kernel_size = args.kernel
        kv.sink_tokens = args.sink
        kv.pyramid_beta = args.beta
        kv.adakv_alpha_safeguard = args.alpha
        if pooling:
            kv.pooling = K.MAX if pooling == "max" else K.AVG
    return pb2.GenerateRequest(
        input_ids=pb2.TokenIds(ids=ids), sampling=pb2.SamplingParams(temperature=0.0),
        stopping=pb2.StoppingCriteria(max_new_tokens=max_new, ignore_eos=True), kv_compression=kv)


def common_prefix(a, b):
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def through_server(texts, passkeys, args, log):
    pb2, _ = c.pb()
    res = {}
    with c.Server([f"--threads={args.threads}", "--kv-cache-memory=4GiB"],
                  log_name="policies") as server:
        full = {name: list(server.stub.Generate(request(pb2, prompt, "none", None, 0, args,
                                                        args.greedy_tokens), timeout=900).token_ids)
                for name, prompt, _ in texts}
        for method, pooling in OURS:
            for cap in args.capacities:
                r = {"greedy_common_prefix": {}, "kv_bytes_held": {}, "passkey_correct": []}
                for name, prompt, _ in texts:
                    out = server.stub.Generate(request(pb2, prompt, method, pooling, cap, args,
                                                       args.greedy_tokens), timeout=900)
                    r["greedy_common_prefix"][name] = common_prefix(list(out.token_ids), full[name])
                    r["kv_bytes_held"][name] = out.usage.kv_bytes_held
                for pk in passkeys:
                    out = server.stub.Generate(request(pb2, pk["ids"], method, pooling, cap, args,
                                                       args.answer_tokens), timeout=900)
                    r["passkey_correct"].append(pk["key"] in out.text.replace(" ", ""))
                res[f"{label(method, pooling)}/C{cap}"] = r
                log(f"server {label(method, pooling)} C={cap}: prefix "
                    f"{r['greedy_common_prefix']} passkey {sum(r['passkey_correct'])}/{len(passkeys)}")
        none = {"greedy_common_prefix": {n: args.greedy_tokens for n in full}, "kv_bytes_held": {},
                "passkey_correct": []}
        for name, prompt, _ in texts:
            out = server.stub.Generate(request(pb2, prompt, "none", None, 0, args, 1), timeout=900)
            none["kv_bytes_held"][name] = out.usage.kv_bytes_held
        for pk in passkeys:
            out = server.stub.Generate(request(pb2, pk["ids"], "none", None, 0, args,
                                               args.answer_tokens), timeout=900)
            none["passkey_correct"].append(pk["key"] in out.text.replace(" ", ""))
        res["none"] = none
    return res


def kvpress_side(texts, passkeys, enc, args, log):
    if not KVPRESS_PYTHON.is_file():
        log(f"kvpress venv missing ({KVPRESS_PYTHON}): run `bash scripts/setup.sh kvpress`")
        return None
    tmp = ROOT / "build" / "bench-policies"
    tmp.mkdir(parents=True, exist_ok=True)
    spec = {"model": str(c.model_path()), "threads": args.threads, "presses": PRESSES,
            "capacities": args.capacities,
            "params": {"window": args.window, "kernel": args.kernel, "beta": args.beta,
                       "alpha": args.alpha, "sink": args.sink},
            "teacher_forced": [{"name": n, "prompt": p, "cont": cont} for n, p, cont in texts],
            "greedy": [{"name": n, "prompt": p} for n, p, _ in texts[:args.greedy_texts]],
            "greedy_tokens": args.greedy_tokens, "answer_tokens": args.answer_tokens,
            "passkey": [{"ids": pk["ids"]} for pk in passkeys]}
    (tmp / "in.json").write_text(json.dumps(spec))
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    done = subprocess.run([str(KVPRESS_PYTHON), str(ROOT / "bench" / "kvpress_policies.py"),
                           str(tmp / "in.json"), str(tmp / "out.json")], env=env)
    if done.returncode != 0:
        raise SystemExit(f"bench/kvpress_policies.py failed ({done.returncode})")
    got = json.loads((tmp / "out.json").read_text())
    res = {}
    for key, r in got["results"].items():
        res[f"kvpress-{key}"] = {
            "teacher_forced": r["teacher_forced"],
            "greedy_common_prefix": {n: common_prefix(r["greedy"][n], got["full_greedy"][n])
                                     for n in r["greedy"]},
            "kv_bytes_held": r["kv_bytes_held"],
            "passkey_correct": [pk["key"] in enc.decode(a).replace(" ", "")
                                for pk, a in zip(passkeys, r["passkey_answers"])]}
    return {"kvpress": got["kvpress"], "transformers": got["transformers"], "results": res}


def mean(xs):
    xs = list(xs)
    return sum(xs) / len(xs) if xs else None


def summarize(tf, server, kvp):
    """{config: {figure: value}} with configs "<policy>/C<c>" and "kvpress-<press>/C<c>"."""
    rows = {}
    for key, s in server.items():
        if key == "none":
            continue
        rows[key] = {"top1_agreement": mean(v["top1_agreement"] for v in tf[key].values()),
                     "kl_mean": mean(v["kl_mean"] for v in tf[key].values()),
                     "greedy_common_prefix": mean(s["greedy_common_prefix"].values()),
                     "passkey_accuracy": mean(s["passkey_correct"]),
                     "kv_bytes_held": mean(s["kv_bytes_held"].values())}
    for key, r in (kvp or {}).get("results", {}).items():
        rows[key] = {"top1_agreement": mean(v["top1_agreement"] for v in r["teacher_forced"].values()),
                     "kl_mean": mean(v["kl_mean"] for v in r["teacher_forced"].values()),
                     "greedy_common_prefix": mean(r["greedy_common_prefix"].values()),
                     "passkey_accuracy": mean(r["passkey_correct"]),
                     "kv_bytes_held": mean(r["kv_bytes_held"].values())}
    return rows


def goal(rows, capacities):
    """Per C and figure: our best policy, kvpress's best press, and whether
    ours is at least as good."""
    out = {}
    for cap in capacities:
        ours = {k: v for k, v in rows.items() if k.endswith(f"/C{cap}") and not k.startswith("kvpress-")}
        theirs = {k: v for k, v in rows.items() if k.endswith(f"/C{cap}") and k.startswith("kvpress-")}
        per = {}
        for fig, better in FIGURES.items():
            if not ours or not theirs:
                continue
            best_ours = better(ours, key=lambda k: ours[k][fig])
            best_theirs = better(theirs, key=lambda k: theirs[k][fig])
            a, b = ours[best_ours][fig], theirs[best_theirs][fig]
            # The same algorithm measured on both sides (our SnapKV with avg
            # pooling keeps exactly kvpress's SnapKVPress positions,
            # tests/python/test_adaptive_kvpress.py) still differs a little:
            # two transformers versions, batched vs one-token decoding. That
            # gap is the comparison's noise, reported beside the strict test.
            same = (rows.get(f"snapkv-avg/C{cap}", {}).get(fig),
                    rows.get(f"kvpress-snapkv/C{cap}", {}).get(fig))
            noise = abs(same[0] - same[1]) if None not in same else 0.0
            per[fig] = {"ours": best_ours, "ours_value": a, "kvpress": best_theirs,
                        "kvpress_value": b, "met": (a >= b) if better is max else (a <= b),
                        "pipeline_noise": noise,
                        "met_within_noise": (a >= b - noise) if better is max else (a <= b + noise)}
        out[f"C{cap}"] = per
    return out


def plot(rows, capacities, path):
    if not c.have_matplotlib():
        return False
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(2, 2, figsize=(12, 9))
    configs = sorted({k.rsplit("/C", 1)[0] for k in rows})
    for ax, (figure, _) in zip(axes.flat, FIGURES.items()):
        for cfg in configs:
            ys = [rows.get(f"{cfg}/C{cap}", {}).get(figure) for cap in capacities]
            ax.plot(capacities, ys, marker="o", linestyle="--" if cfg.startswith("kvpress-") else "-",
                    label=cfg)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("C (entries per layer and KV head)")
        ax.set_title(figure)
    axes[0][0].legend(fontsize=7)
    fig.suptitle("snapserve policies (solid) vs kvpress presses (dashed), SmolLM2-135M")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return True


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--capacities", type=lambda s: [int(x) for x in s.split(",")],
                    default=[128, 256, 512, 1024])
    ap.add_argument("--window", type=int, default=16)
    ap.add_argument("--kernel", type=int, default=7)
    ap.add_argument("--beta", type=int, default=4)
    ap.add_argument("--alpha", type=float, default=0.2)
    ap.add_argument("--sink", type=int, default=4)
    ap.add_argument("--tf-texts", type=lambda s: s.split(","), default=["GPL-3", "LGPL-2.1"])
    ap.add_argument("--tf-prompt", type=int, default=1536)
    ap.add_argument("--tf-len", type=int, default=96)
    ap.add_argument("--greedy-texts", type=int, default=1,
                    help="how many of --tf-texts also give the greedy prompts")
    ap.add_argument("--greedy-tokens", type=int, default=24)
    ap.add_argument("--passkey-length", type=int, default=1536)
    ap.add_argument("--depths", type=lambda s: [float(x) for x in s.split(",")],
                    default=[0.1, 0.5, 0.9])
    ap.add_argument("--trials", type=int, default=1)
    ap.add_argument("--answer-tokens", type=int, default=10)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--seed", type=int, default=20240415)
    ap.add_argument("--out", default=str(c.RUNS / "policies.json"))
    args = ap.parse_args()
    start = time.time()
    torch.set_num_threads(args.threads)

    def log(msg):
        print(f"[policies {time.time() - start:6.0f}s] {msg}", flush=True)

    pipe = SnapKVPipeline.load(c.model_path())
    enc = original_tokenizer(pipe.tokenizer)
    texts = []
    for name in args.tf_texts:
        ids = enc.encode((pathlib.Path("/usr/share/common-licenses") / name).read_text()).ids
        assert len(ids) >= args.tf_prompt + args.tf_len, f"{name} is too short"
        texts.append((name, ids[:args.tf_prompt], ids[args.tf_prompt:args.tf_prompt + args.tf_len]))
    rng = random.Random(args.seed)
    passkeys = []
    for _ in range(args.trials):
        for depth in args.depths:
            key = str(rng.randrange(10000, 100000))
            passkeys.append({"depth": depth, "key": key,
                             "ids": passkey_prompt(pipe.tokenizer, enc, args.passkey_length,
                                                   depth, key)})
    tf = teacher_forced(pipe, texts, args, log)
    server = through_server(texts[:args.greedy_texts], passkeys, args, log)
    kvp = kvpress_side(texts, passkeys, enc, args, log)
    rows = summarize(tf, server, kvp)
    result = {
        "benchmark": "policies",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "config": {k: v for k, v in vars(args).items() if k != "out"},
        "machine": {"platform": platform.platform(), "cpu_count": os.cpu_count(),
                    "torch": torch.__version__},
        "kvpress": kvp and {"kvpress": kvp["kvpress"], "transformers": kvp["transformers"]},
        "summary": rows,
        "goal": goal(rows, args.capacities),
        "uncompressed": {"passkey_accuracy": mean(server["none"]["passkey_correct"]),
                         "kv_bytes_held": mean(server["none"]["kv_bytes_held"].values())},
        "teacher_forced": tf, "server": server, "kvpress_raw": kvp and kvp["results"],
        "passkeys": [{"depth": pk["depth"], "key": pk["key"], "n": len(pk["ids"])}
                     for pk in passkeys],
        "seconds": round(time.time() - start, 1),
    }
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    plotted = plot(rows, args.capacities, out.with_suffix(".png"))
    log(f"wrote {out}" + (" and the PNG" if plotted else " (no matplotlib: no PNG)"))
    for cap, per in result["goal"].items():
        log(f"{cap}: " + ", ".join(f"{f} {'met' if g['met'] else ('within noise' if g['met_within_noise'] else 'MISSED')} "
                                    f"({g['ours']} {g['ours_value']:.3f} vs {g['kvpress']} "
                                    f"{g['kvpress_value']:.3f})" for f, g in per.items()))


if __name__ == "__main__":
    main()
