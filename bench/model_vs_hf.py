"""Benchmark: snapserve's C++ forward (through the torch ops) vs transformers
eager on the same model, dtype and thread count, in the same process and run.

Figures: prefill tokens/s (n=512, 2048; last-position logits only on both
sides) and batch-1 greedy decode tokens/s (after a 128-token prompt). Each is
the median of --runs runs; ratios are snapserve / transformers. Writes
bench/results/runs/model_vs_hf.json.

    SNAPSERVE_BUILD_DIR=build .venv/bin/python bench/model_vs_hf.py [--threads N]
"""
import argparse
import datetime
import json
import os
import pathlib
import platform
import statistics
import time

os.environ["HF_HUB_OFFLINE"] = "1"

import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]


def load_ops(build_dir):
    torch.ops.load_library(str(pathlib.Path(build_dir) / "tests" / "libsnapserve_torch_ops.so"))
    return torch.ops.snapserve


@torch.no_grad()
def hf_prefill_s(model, ids):
    t0 = time.perf_counter()
    model(torch.tensor([ids]), use_cache=True, logits_to_keep=1)
    return time.perf_counter() - t0


@torch.no_grad()
def hf_decode_s(model, ids, steps):
    out = model(torch.tensor([ids]), use_cache=True, logits_to_keep=1)
    past = out.past_key_values
    nxt = int(out.logits[0, -1].argmax())
    t0 = time.perf_counter()
    for _ in range(steps):
        out = model(torch.tensor([[nxt]]), past_key_values=past, use_cache=True)
        past = out.past_key_values
        nxt = int(out.logits[0, -1].argmax())
    return time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=str(ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--build-dir", default=os.environ.get("SNAPSERVE_BUILD_DIR", ROOT / "build"))
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--decode-steps", type=int, default=64)
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "runs" / "model_vs_hf.json"))
    args = ap.parse_args()

    torch.set_num_threads(args.threads)  # one ATen pool: both sides get the same threads
    ops = load_ops(args.build_dir)
    from transformers import AutoModelForCausalLM, AutoTokenizer
    model_path = pathlib.Path(args.model)
    tok = AutoTokenizer.from_pretrained(model_path.parent, gguf_file=model_path.name)
    text_ids = tok(pathlib.Path("/usr/share/common-licenses/GPL-3").read_text())["input_ids"]
    hf32 = AutoModelForCausalLM.from_pretrained(model_path.parent, gguf_file=model_path.name,
                                                dtype=torch.float32,
                                                attn_implementation="eager").eval()

    results = []
    for dtype in args.dtypes.split(","):
        hf = hf32 if dtype == "float32" else hf32.to(getattr(torch, dtype))
        ops.model_time(str(model_path), dtype, text_ids[:16], 2)  # load + warm up
        hf_prefill_s(hf, text_ids[:16])
        for n in (512, 2048):
            ids = text_ids[:n]
            ours = [ops.model_time(str(model_path), dtype, ids, 0)[0] for _ in range(args.runs)]
            theirs = [hf_prefill_s(hf, ids) for _ in range(args.runs)]
            results.append(dict(dtype=dtype, phase="prefill", tokens=n,
                                snapserve_tok_s=n / statistics.median(ours),
                                transformers_tok_s=n / statistics.median(theirs)))
        ids, steps = text_ids[:128], args.decode_steps
        ours = [ops.model_time(str(model_path), dtype, ids, steps)[1] for _ in range(args.runs)]
        theirs = [hf_decode_s(hf, ids, steps) for _ in range(args.runs)]
        results.append(dict(dtype=dtype, phase="decode", batch=1, prompt_tokens=128, steps=steps,
                            snapserve_tok_s=steps / statistics.median(ours),
                            transformers_tok_s=steps / statistics.median(theirs)))
        for r in results:
            r.setdefault("ratio", r["snapserve_tok_s"] / r["transformers_tok_s"])
            if r["dtype"] == dtype:
                print(json.dumps(r))
        if dtype != "float32":
            hf32 = hf.to(torch.float32)

    import transformers
    report = dict(
        benchmark="model_vs_hf",
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        model=model_path.name, threads=args.threads, runs=args.runs, statistic="median",
        machine=dict(platform=platform.platform(), processor=platform.processor(),
                     cpu_count=os.cpu_count()),
        versions=dict(torch=torch.__version__, transformers=transformers.__version__),
        notes="transformers eager attention, logits_to_keep=1 for prefill; same process, "
              "same ATen thread pool; snapserve decode uses DenseKvStore",
        results=results)
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
