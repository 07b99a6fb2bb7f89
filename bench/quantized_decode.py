"""Benchmark: the model's decode step and prefill with GGUF weights kept in
their blocks (docs/quantized-weights.md), against the same model with every
matrix decoded to float32 at load, in one process and run.

Models, all written from the default model's values
(tests/python/reference/gguf_requant.py): `f32` (every matrix decoded to
float32: what snapserve did with the Q4_1 file before), the default `Q4_1`
file itself, `Q8_0`, and a llama.cpp-style `Q4_K_M` mix (ffn_down Q4_K, the
rest Q5_0). Each quantized model runs with --quantized-dot exact and int8.
Figures, medians of --runs: batch-1 decode step (after a 512-token prompt),
batch-16 decode step (16 prompts of 64-200 tokens; model_batch_decode_seconds),
prefill of 512 tokens; the bytes a batch-1 decode step reads (the layers'
matrices, the LM head, and the float32 KV cache of the 512-token prompt and
the steps so far, at their mean length) and what share of the machine's
measured read bandwidth that is (the roofline share).

    SNAPSERVE_BUILD_DIR=build .venv/bin/python bench/quantized_decode.py [--threads 2]
"""
import argparse
import pathlib
import statistics
import sys
import tempfile

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests" / "python"))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import common as c  # noqa: E402
from reference import gguf_requant  # noqa: E402

MIXES = {
    "f32": lambda name, shape: "F32",
    "Q4_1": None,
    "Q8_0": lambda name, shape: "Q8_0",
    "Q4_K_M": lambda name, shape: "Q4_K" if "ffn_down" in name else "Q5_0",
}


def weight_bytes(path):
    import gguf
    return sum(int(t.n_bytes) for t in gguf.GGUFReader(path).tensors
               if len(t.shape) == 2 and t.name.startswith("blk."))


def lm_head_bytes(path):
    """The LM head's bytes: output.weight, or the tied token embedding."""
    import gguf
    tensors = {t.name: t for t in gguf.GGUFReader(path).tensors}
    return int(tensors.get("output.weight", tensors["token_embd.weight"]).n_bytes)


def kv_bytes_per_position(path):
    """Float32 K and V of one position over all layers and KV heads."""
    import gguf
    r = gguf.GGUFReader(path)

    def field(key):
        f = r.fields[key]
        return int(f.parts[f.data[0]][0])

    arch = "llama"
    heads = field(f"{arch}.attention.head_count")
    head_dim = field(f"{arch}.embedding_length") // heads
    return field(f"{arch}.block_count") * field(f"{arch}.attention.head_count_kv") * head_dim * 2 * 4


def batch16_step_s(ops, path, dtype, prompts, steps):
    """Decode steps timed alone, inside the op (taking them as the difference
    of two whole runs, prefill included, came out negative on a noisy VM)."""
    flat = [t for p in prompts for t in p]
    lengths = [len(p) for p in prompts]
    return ops.model_batch_decode_seconds(path, dtype, flat, lengths, steps) / steps


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--out", default="runs/quantized_decode.json", help="file under bench/results/")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from snapserve_testkit.paths import build_dir
    torch.ops.load_library(str(build_dir() / "tests" / "libsnapserve_torch_ops.so"))
    ops = torch.ops.snapserve
    model = str(c.model_path())
    bandwidth = c.memory_bandwidth_gbs(threads=args.threads)
    ids = list(range(1000, 1512))
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(100, 40000, (int(n),), generator=g).tolist()
               for n in torch.linspace(64, 200, 16)]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, mix in MIXES.items():
            path = model
            if mix is not None:
                path = str(pathlib.Path(tmp) / f"{name}.gguf")
                gguf_requant.requantize_file(model, path, mix)
            paths = ["exact"] if name == "f32" else ["exact", "int8"]
            wbytes = weight_bytes(path)
            # Mean KV length over the timed steps: the prompt plus half the steps.
            kv = kv_bytes_per_position(path) * (len(ids) + args.steps // 2)
            step_bytes = wbytes + lm_head_bytes(path) + kv
            for dot in paths:
                dtype = "float32" if dot == "exact" else "float32:int8"
                ops.model_time(path, dtype, ids[:16], 2)  # load and warm
                b1, pre, b16 = [], [], []
                for _ in range(args.runs):
                    p, d = ops.model_time(path, dtype, ids, args.steps)
                    pre.append(len(ids) / p)
                    b1.append(d / args.steps)
                    b16.append(batch16_step_s(ops, path, dtype, prompts, args.steps // 2))
                row = {"model": name, "quantized_dot": dot, "weight_bytes_per_step": wbytes,
                       "batch1_step_ms": 1000 * statistics.median(b1),
                       "batch1_tok_s": 1 / statistics.median(b1),
                       "batch16_step_ms": 1000 * statistics.median(b16),
                       "batch16_tok_s": 16 / statistics.median(b16),
                       "prefill512_tok_s": statistics.median(pre)}
                row["batch1_weight_gb_s"] = wbytes / statistics.median(b1) / 1e9
                row["bytes_per_step"] = step_bytes
                row["batch1_gb_s"] = step_bytes / statistics.median(b1) / 1e9
                row["batch1_share_of_bandwidth"] = row["batch1_gb_s"] / bandwidth["gb_per_s"]
                c.log(row)
                rows.append(row)
    c.write_json(args.out, {"benchmark": "quantized_decode", "machine": c.machine_info(args.threads),
                            "threads": args.threads, "runs": args.runs, "bandwidth": bandwidth,
                            "rows": rows})


if __name__ == "__main__":
    main()
