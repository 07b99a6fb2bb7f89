"""Benchmark: what SnapKV costs in quality on the real model
(docs/testing-and-measuring.md, "Benchmarks").

Runs through the Python pipeline (tests/python/reference/hf_snapkv_pipeline.py:
transformers float32 SmolLM2-135M-Instruct from the GGUF + the docs/snapkv.md
numpy reference), which tests/python/test_snapkv_e2e.py checks token-identical
to the server's SnapKV path. One prefill per prompt serves every budget: the
prompt's own attention is the same with and without SnapKV (docs/snapkv.md, step
8), only the cache kept for decoding differs. Budgets: full KV and C in
--capacities, w=32, k=7, max pooling (the server defaults except C).

1. Passkey retrieval: a 5-digit key hidden at a depth of a filler haystack,
   asked for through SmolLM2's chat template (system prompt of the template,
   user turn = haystack + question; the assistant turn is started with
   "The pass key is" so that the answer is short); greedy --answer-tokens
   tokens; correct when the key's 5 digits appear in the answer.
2. Teacher-forced next-token agreement on long natural text: a --tf-prompt
   token prompt is compressed, the next --tf-len tokens are teacher-forced over
   the kept cache; top-1 agreement with the full cache and mean KL(full||snapkv)
   over those positions.

Writes bench/results/runs/snapkv_quality.json and bench/results/runs/snapkv_quality.png
(matplotlib: `pip install matplotlib` into the venv; without it, only the JSON).

    .venv/bin/python bench/snapkv_quality.py [--trials 2] [--time-budget 840]
"""
import argparse
import datetime
import json
import os
import pathlib
import platform
import random
import sys
import time

os.environ["HF_HUB_OFFLINE"] = "1"

import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "python"))
from reference.hf_snapkv_pipeline import SnapKVPipeline, original_tokenizer  # noqa: E402

FILLER = ("The grass is green. The sky is blue. The sun is yellow. Here we go. "
          "There and back again. ")
TASK = ("There is an important piece of information hidden inside a lot of irrelevant "
        "text. Find it and memorize it. I will quiz you about the important information "
        "there.\n\n")
NEEDLE = "The pass key is {key}. Remember it. {key} is the pass key. "
QUESTION = "\n\nWhat is the pass key?"
ANSWER_PREFIX = "The pass key is"


def render_chat(hf_tok, user):
    text = hf_tok.apply_chat_template([{"role": "user", "content": user}], tokenize=False,
                                      add_generation_prompt=True)
    return text + ANSWER_PREFIX


def passkey_prompt(hf_tok, enc, n_target, depth, key):
    """Token ids of a passkey prompt of about n_target tokens, the needle after
    round(depth * units) filler units."""
    unit = len(enc.encode(FILLER).ids)
    base = len(enc.encode(render_chat(hf_tok, TASK + NEEDLE.format(key=key) + QUESTION)).ids)
    units = max(1, (n_target - base) // unit)

    def build(units):
        at = round(depth * units)
        user = TASK + FILLER * at + NEEDLE.format(key=key) + FILLER * (units - at) + QUESTION
        return enc.encode(render_chat(hf_tok, user)).ids

    ids = build(units)
    # A unit tokenizes a little differently inside the text: one correction.
    units = max(1, units + (n_target - len(ids)) // unit)
    return build(units)


def kl_and_top1(full_logits, snap_logits):
    lp = torch.log_softmax(full_logits.double(), -1)
    lq = torch.log_softmax(snap_logits.double(), -1)
    kl = (lp.exp() * (lp - lq)).sum(-1)  # per position
    top1 = (full_logits.argmax(-1) == snap_logits.argmax(-1)).double()
    return float(kl.mean()), float(top1.mean())


def budgets(capacities):
    return ["full"] + [f"C{c}" for c in capacities]


def compress(pipe, pre, label, args):
    if label == "full":
        return pipe.full(pre)
    return pipe.compress(pre, args.window, int(label[1:]), args.kernel, args.pooling)


def run_passkey(pipe, enc, args, deadline, log):
    rng = random.Random(args.seed)
    labels = budgets(args.capacities)
    rows = []
    for trial in range(args.trials):
        for n_target in args.lengths:
            for depth in args.depths:
                if time.time() > deadline:
                    log(f"passkey: time budget reached before trial {trial} n={n_target} "
                        f"depth={depth}; stopping")
                    return rows, False
                key = str(rng.randrange(10000, 100000))
                ids = passkey_prompt(pipe.tokenizer, enc, n_target, depth, key)
                t0 = time.time()
                pre = pipe.prefill(ids, max_window=args.window)
                row = dict(trial=trial, n_target=n_target, n=len(ids), depth=depth, key=key,
                           answers={}, correct={})
                for label in labels:
                    toks = pipe.greedy(pre, compress(pipe, pre, label, args), args.answer_tokens)
                    answer = enc.decode(toks)
                    row["answers"][label] = answer
                    row["correct"][label] = key in answer.replace(" ", "")
                row["seconds"] = round(time.time() - t0, 1)
                rows.append(row)
                log(f"passkey trial {trial} n={len(ids)} depth={depth} key={key} "
                    f"{row['seconds']}s " + " ".join(
                        f"{k}:{'Y' if v else 'n'}" for k, v in row["correct"].items())
                    + f" | full answer {row['answers']['full']!r}")
    return rows, True


def summarize_passkey(rows, args):
    labels = budgets(args.capacities)
    out = {}
    for label in labels:
        per_n = {}
        for n_target in args.lengths:
            sel = [r for r in rows if r["n_target"] == n_target]
            if sel:
                per_n[str(n_target)] = {
                    "accuracy": sum(r["correct"][label] for r in sel) / len(sel),
                    "trials": len(sel),
                    "by_depth": {str(d): sum(r["correct"][label] for r in sel
                                             if r["depth"] == d) /
                                 max(1, sum(1 for r in sel if r["depth"] == d))
                                 for d in args.depths}}
        total = [r["correct"][label] for r in rows]
        out[label] = {"accuracy": sum(total) / len(total) if total else None,
                      "trials": len(total), "by_length": per_n}
    return out


def run_teacher_forced(pipe, enc, args, log):
    labels = budgets(args.capacities)
    results = {}
    for name in args.tf_texts:
        ids = enc.encode((pathlib.Path("/usr/share/common-licenses") / name).read_text()).ids
        ids = ids[:args.tf_prompt + args.tf_len]
        assert len(ids) == args.tf_prompt + args.tf_len, f"{name} is too short"
        prompt, cont = ids[:args.tf_prompt], ids[args.tf_prompt:]
        t0 = time.time()
        pre = pipe.prefill(prompt, max_window=args.window)
        full = pipe.teacher_forced(pre, pipe.full(pre), cont)
        res = {}
        for label in labels[1:]:
            snap = pipe.teacher_forced(pre, compress(pipe, pre, label, args), cont)
            kl, top1 = kl_and_top1(full, snap)
            res[label] = {"kl_mean": kl, "top1_agreement": top1}
        # How well the full model itself predicts the text (context for the KL).
        nll_full = float(torch.nn.functional.cross_entropy(full[:-1].double(),
                                                           torch.tensor(cont[1:])))
        res["full"] = {"kl_mean": 0.0, "top1_agreement": 1.0, "nll_full": nll_full}
        results[name] = res
        log(f"teacher-forced {name}: prompt {len(prompt)} + {len(cont)} tokens, "
            f"{time.time() - t0:.0f}s: " + " ".join(
                f"{k}: top1 {v['top1_agreement']:.3f} KL {v['kl_mean']:.4f}"
                for k, v in res.items() if k != "full"))
    return results


def plot(summary, tf, args, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    labels = budgets(args.capacities)
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    ax = axes[0]
    for label in labels:
        by_n = summary[label]["by_length"]
        xs = [int(n) for n in by_n]
        ax.plot(xs, [by_n[str(x)]["accuracy"] for x in xs], marker="o", label=label)
    ax.set_xscale("log", base=2)
    ax.set_xticks(args.lengths, [str(x) for x in args.lengths])
    ax.set_ylim(-0.05, 1.05)
    ax.set_xlabel("prompt tokens (target)")
    ax.set_ylabel("passkey accuracy")
    ax.set_title("Passkey retrieval (depths 10/50/90%)")
    ax.legend()
    caps = args.capacities
    for ax, metric, title in ((axes[1], "top1_agreement", "Teacher-forced top-1 agreement"),
                              (axes[2], "kl_mean", "Mean KL(full || SnapKV)")):
        for name, res in tf.items():
            ax.plot(caps, [res[f"C{c}"][metric] for c in caps], marker="o", label=name)
        ax.set_xscale("log", base=2)
        ax.set_xticks(caps, [str(c) for c in caps])
        ax.set_xlabel("capacity C (prompt entries kept per layer/head)")
        ax.set_title(f"{title}\n(prompt {args.tf_prompt}, next {args.tf_len} tokens)")
        ax.legend()
    axes[2].set_yscale("log")
    fig.suptitle("SnapKV quality, SmolLM2-135M-Instruct (GGUF Q4_1, float32), w=32 k=7 max")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return True


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=str(ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--lengths", type=lambda s: [int(x) for x in s.split(",")],
                    default=[1024, 2048, 4096, 7168])
    ap.add_argument("--depths", type=lambda s: [float(x) for x in s.split(",")],
                    default=[0.1, 0.5, 0.9])
    ap.add_argument("--capacities", type=lambda s: [int(x) for x in s.split(",")],
                    default=[128, 256, 512, 1024])
    ap.add_argument("--trials", type=int, default=2)
    ap.add_argument("--answer-tokens", type=int, default=10)
    ap.add_argument("--window", type=int, default=32)
    ap.add_argument("--kernel", type=int, default=7)
    ap.add_argument("--pooling", default="max")
    ap.add_argument("--tf-texts", type=lambda s: s.split(","), default=["GPL-3", "LGPL-2.1"])
    ap.add_argument("--tf-prompt", type=int, default=2048)
    ap.add_argument("--tf-len", type=int, default=256)
    ap.add_argument("--seed", type=int, default=20240415)
    ap.add_argument("--time-budget", type=float, default=840,
                    help="seconds; no new passkey prompt starts after it (reported)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "runs" / "snapkv_quality.json"))
    args = ap.parse_args()

    start = time.time()
    torch.set_num_threads(args.threads)

    def log(msg):
        print(f"[{time.time() - start:6.0f}s] {msg}", flush=True)

    pipe = SnapKVPipeline.load(args.model)
    enc = original_tokenizer(pipe.tokenizer)
    log("model loaded")
    tf = run_teacher_forced(pipe, enc, args, log)
    rows, complete = run_passkey(pipe, enc, args, start + args.time_budget, log)
    summary = summarize_passkey(rows, args)

    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    result = {
        "benchmark": "snapkv_quality",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "path": ("python pipeline: transformers float32 model from the GGUF + "
                 "tests/python/reference/snapkv.py (token-identical to the server's SnapKV, "
                 "tests/python/test_snapkv_e2e.py)"),
        "config": {
            "model": pathlib.Path(args.model).name, "dtype": "float32",
            "window": args.window, "kernel_size": args.kernel, "pooling": args.pooling,
            "group_reduce": "mean", "capacities": args.capacities,
            "passkey": {"lengths_target": args.lengths, "depths": args.depths,
                        "trials_requested": args.trials, "answer_tokens": args.answer_tokens,
                        "chat_template": True, "answer_prefix": ANSWER_PREFIX,
                        "filler": FILLER, "needle": NEEDLE, "seed": args.seed,
                        "complete": complete},
            "teacher_forced": {"texts": args.tf_texts, "prompt_tokens": args.tf_prompt,
                               "teacher_forced_tokens": args.tf_len},
            "tokenizer": "GGUF vocabulary with SmolLM2's original pre-tokenizer (digits split)",
        },
        "machine": {"platform": platform.platform(), "processor": platform.processor(),
                    "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
                    "torch": torch.__version__},
        "figures": {"passkey": summary, "teacher_forced": tf},
        "passkey_trials": rows,
        "seconds": round(time.time() - start, 1),
    }
    out.write_text(json.dumps(result, indent=2) + "\n")
    png = out.with_suffix(".png")
    plotted = plot(summary, tf, args, png)
    log(f"wrote {out}" + (f" and {png}" if plotted else " (no matplotlib: no PNG)"))
    for label, s in summary.items():
        log(f"passkey {label}: {s['accuracy']} over {s['trials']} prompts; " + ", ".join(
            f"{n}: {v['accuracy']:.2f}" for n, v in s["by_length"].items()))


if __name__ == "__main__":
    main()
