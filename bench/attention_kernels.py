"""Benchmark: the two attention kernels alone, on the default model's shapes
(9 query heads, 3 KV heads, head size 64), without the model around them,
so that a change to one of them can be measured on a noisy 2-core VM
(a whole prefill's time varies by more than the change).

- prompt attention (kernels/prefill_attention/prefill_attention.h): the bfloat16 kernels (where
  the CPU has AVX512_BF16: vdpbf16ps; and where it has AMX: tdpbf16ps), the
  float32 kernel (AVX-512F), and LibTorch's
  scaled_dot_product_attention as the model called it before (K and V
  repeated per query head, is_causal) for comparison; causal prompts of 1024
  and 2048 tokens, one layer; GFLOP/s count the causal half of q·kᵀ and p·v
  (2 · 2 · H · D · n(n+1)/2 flops).
- paged decode attention (kernels/paged_attention/paged_attention.h): one decode step of
  16 sequences over 1100 cached entries (W3's shape) and of 1 sequence over
  640 (W1's), all 30 layers, float32 and bfloat16 caches, laid out as the
  server's pool (scattered one-lane blocks, 2 MiB pages); GB/s count the
  cache bytes read (K and V of every entry), against the machine's read
  bandwidth.

Medians of --runs, each the mean of --reps calls.

    SNAPSERVE_BUILD_DIR=build .venv/bin/python bench/attention_kernels.py [--out NAME]
"""
import argparse
import ctypes
import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import common as c  # noqa: E402

HEADS, KV_HEADS, DIM = 9, 3, 64


def torch_sdpa(q, k, v, scale):
    group = q.shape[0] // k.shape[0]
    return torch.nn.functional.scaled_dot_product_attention(
        q, k.repeat_interleave(group, 0), v.repeat_interleave(group, 0), is_causal=True,
        scale=scale)


def prompt_row(kernel, fn, n, runs, reps):
    g = torch.Generator().manual_seed(n)
    q = torch.randn(HEADS, n, DIM, generator=g) * 2
    k = torch.randn(KV_HEADS, n, DIM, generator=g)
    v = torch.randn(KV_HEADS, n, DIM, generator=g)
    s = c.median_call_seconds(lambda: fn(q, k, v, DIM ** -0.5), runs, reps)
    flops = 2 * 2 * HEADS * DIM * n * (n + 1) / 2
    return {"kernel": kernel, "tokens": n, "ms": 1000 * s, "gflop_s": flops / s / 1e9}


def prompt_kernels(ops):
    """(name, fn) of the prompt attention kernels this CPU runs."""
    kernels = []
    for name in ("bf16", "amx", "f32"):
        fn = getattr(ops, f"prefill_attention_{name}")
        try:
            fn(torch.zeros(1, 1, DIM), torch.zeros(1, 1, DIM), torch.zeros(1, 1, DIM), 1.0)
        except RuntimeError as e:
            c.log(f"prompt_attention_{name} skipped: {e}".splitlines()[0])
            continue
        kernels.append((f"prompt_attention_{name}", fn))
    return kernels + [("torch_sdpa_float32", torch_sdpa)]


def huge_page_tensor(shape, dtype):
    """An empty tensor whose whole 2 MiB pages are advised MADV_HUGEPAGE
    before the first write, as the server's KV pool (kernels/cpu/huge_pages.h)."""
    t = torch.empty(shape, dtype=dtype)
    begin = t.data_ptr()
    end = begin + t.numel() * t.element_size()
    huge = 2 << 20
    first, last = (begin + huge - 1) & ~(huge - 1), end & ~(huge - 1)
    if last > first:
        libc = ctypes.CDLL(None)
        libc.madvise(ctypes.c_void_p(first), ctypes.c_size_t(last - first), 14)  # MADV_HUGEPAGE
    return t


def decode_row(ops, batch, ctx, dtype, runs, reps, layers, block):
    """One decode step's attention over `layers` layers, laid out as the
    server's pool (engine/kv/paged_kv_cache.h): one block per (layer, KV head)
    lane, the lanes' blocks scattered over one pool, each lane row with the
    3 query heads of its KV head."""
    g = torch.Generator().manual_seed(batch * ctx)
    per_lane = (ctx + block - 1) // block
    lanes = batch * KV_HEADS
    blocks = layers * lanes * per_lane
    kc = huge_page_tensor((blocks, 1, block, DIM), dtype)
    vc = huge_page_tensor((blocks, 1, block, DIM), dtype)
    kc.copy_(torch.randn(kc.shape, generator=g))
    vc.copy_(torch.randn(vc.shape, generator=g))
    tables = torch.randperm(blocks, generator=g).to(torch.int32).view(layers, lanes, per_lane)
    lens = torch.full((lanes,), ctx, dtype=torch.int32)
    q = torch.randn(lanes, HEADS // KV_HEADS, DIM, generator=g)

    def step():
        for layer in range(layers):
            ops.paged_decode_attention(q, kc, vc, tables[layer], lens, DIM ** -0.5)

    s = c.median_call_seconds(step, runs, reps)
    cache_bytes = 2 * layers * lanes * ctx * DIM * kc.element_size()
    return {"kernel": "paged_decode_attention", "batch": batch, "context": ctx, "layers": layers,
            "block_size": block,
            "cache_dtype": str(dtype).replace("torch.", ""), "ms": 1000 * s,
            "cache_gb_s": cache_bytes / s / 1e9}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--out", default="runs/attention_kernels.json", help="file under bench/results/")
    ap.add_argument("--block-size", type=int, default=16, help="the server's --block-size")
    c.add_torch_ops_argument(ap)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    args.library, ops = c.load_torch_ops(args.library)
    bandwidth = c.memory_bandwidth_gbs(threads=args.threads)
    rows = []
    for kernel, fn in prompt_kernels(ops):
        rows += [prompt_row(kernel, fn, 1024, args.runs, 4), prompt_row(kernel, fn, 2048, args.runs, 2)]
    for dtype in (torch.float32, torch.bfloat16):
        rows.append(decode_row(ops, 16, 1100, dtype, args.runs, 3, 30, args.block_size))
        rows.append(decode_row(ops, 1, 640, dtype, args.runs, 20, 30, args.block_size))
    for row in rows:
        if "cache_gb_s" in row:
            row["share_of_bandwidth"] = row["cache_gb_s"] / bandwidth["gb_per_s"]
        c.log(row)
    c.write_json(args.out, {"benchmark": "attention_kernels", "machine": c.machine_info(args.threads),
                            "threads": args.threads, "runs": args.runs, "bandwidth": bandwidth,
                            "library": args.library, "rows": rows})


if __name__ == "__main__":
    main()
