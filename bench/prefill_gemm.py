"""Benchmark: one layer's prompt products on AMX tiles (kernels/prefill_gemm/prefill_gemm_amx.h)
alone, on the default model's shapes (hidden 576, intermediate 1536, 9 + 2 x 3
heads of 64), so that a change to the GEMM can be measured on a noisy 2-core VM
(a whole prefill's time varies by more than the change):

- qkv: [rows, 576] x [960, 576]^T to float32;
- o_proj: [rows, 576] x [576, 576]^T added into the residual;
- mlp_one_pass: mlp_amx_add_ (gate/up with the SwiGLU in its epilogue, then down);
- mlp_three_passes: the same MLP as linear_amx (bf16 out) + silu_mul + linear_amx add;
- qkv_norm_apart / mlp_norm_apart: the decoder layer's RMSNorm (bf16 rows) and then the
  product, as two passes; qkv_norm_in_packing / mlp_norm_in_packing: the norm taken as
  the GEMM packs the rows (AmxRowNorm), the same bits;
- attention_o_proj_f32_out / attention_o_proj_tiles: the AMX attention of the rows (9
  heads over 3 KV heads of 64) and o_proj added into the residual, o_proj's input the
  attention's float32 output packed by the GEMM, or the GEMM's tiles written by the
  attention (prefill_attention_amx_packed). GFLOP/s count o_proj's product only.

GFLOP/s count 2 m n k per product. Medians of --runs, each the mean of --reps calls.
Skips (and says so) where the CPU has no AMX-BF16.

    SNAPSERVE_BUILD_DIR=build .venv/bin/python bench/prefill_gemm.py [--out NAME] [--library SO]
"""
import argparse
import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import common as c  # noqa: E402

HIDDEN, INTER, QKV = 576, 1536, 960


def rows_for(ops, m, runs, reps):
    g = torch.Generator().manual_seed(m)
    x = torch.randn(m, HIDDEN, generator=g)
    xb = x.to(torch.bfloat16)
    h = torch.randn(m, HIDDEN, generator=g)
    w = {name: ops.pack_amx_weight(torch.randn(n, k, generator=g) * 0.05)
         for name, n, k in (("qkv", QKV, HIDDEN), ("o", HIDDEN, HIDDEN),
                            ("gate_up", 2 * INTER, HIDDEN), ("down", HIDDEN, INTER))}

    norm_w = torch.rand(HIDDEN, generator=g) + 0.5
    q = torch.randn(9, m, 64, generator=g)
    k = torch.randn(3, m, 64, generator=g)
    v = torch.randn(3, m, 64, generator=g)

    def three_passes():
        gate_up = ops.linear_amx(h, xb, w["gate_up"], "bfloat16")
        ops.linear_amx(h, ops.silu_mul(gate_up, True), w["down"], "add")

    cases = [
        ("qkv", 2 * m * QKV * HIDDEN, lambda: ops.linear_amx(h, xb, w["qkv"], "float32")),
        ("o_proj", 2 * m * HIDDEN * HIDDEN, lambda: ops.linear_amx(h, x, w["o"], "add")),
        ("mlp_one_pass", 2 * m * 3 * INTER * HIDDEN,
         lambda: ops.mlp_amx_add_(h, xb, w["gate_up"], w["down"])),
        ("mlp_three_passes", 2 * m * 3 * INTER * HIDDEN, three_passes),
        ("qkv_norm_apart", 2 * m * QKV * HIDDEN,
         lambda: ops.linear_amx(h, ops.rms_norm(h, norm_w, 1e-5, True), w["qkv"], "float32")),
        ("qkv_norm_in_packing", 2 * m * QKV * HIDDEN,
         lambda: ops.linear_amx_normed(h, norm_w, 1e-5, w["qkv"])),
        ("mlp_norm_apart", 2 * m * 3 * INTER * HIDDEN,
         lambda: ops.mlp_amx_add_(h, ops.rms_norm(h, norm_w, 1e-5, True), w["gate_up"],
                                  w["down"])),
        ("mlp_norm_in_packing", 2 * m * 3 * INTER * HIDDEN,
         lambda: ops.mlp_amx_normed_add_(h, norm_w, 1e-5, w["gate_up"], w["down"])),
        ("attention_o_proj_f32_out", 2 * m * HIDDEN * HIDDEN,
         lambda: ops.attention_o_proj_amx(h, q, k, v, 0.125, w["o"], False)),
        ("attention_o_proj_tiles", 2 * m * HIDDEN * HIDDEN,
         lambda: ops.attention_o_proj_amx(h, q, k, v, 0.125, w["o"], True)),
    ]
    out = []
    for name, flops, fn in cases:
        s = c.median_call_seconds(fn, runs, reps)
        out.append({"product": name, "rows": m, "ms": 1000 * s, "gflop_s": flops / s / 1e9})
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=9)
    ap.add_argument("--out", default="runs/prefill_gemm.json", help="file under bench/results/")
    c.add_torch_ops_argument(ap)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    args.library, ops = c.load_torch_ops(args.library)
    if not ops.has_amx_gemm(32, 32):
        c.log({"skipped": "no AMX-BF16 on this CPU (or under SNAPSERVE_CPU_ISA)"})
        return
    rows = rows_for(ops, 1024, args.runs, 4) + rows_for(ops, 2048, args.runs, 2)
    for row in rows:
        c.log(row)
    c.write_json(args.out, {"benchmark": "prefill_gemm", "machine": c.machine_info(args.threads),
                            "threads": args.threads, "runs": args.runs, "library": args.library,
                            "rows": rows})


if __name__ == "__main__":
    main()
