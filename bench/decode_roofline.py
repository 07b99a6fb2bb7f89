"""Benchmark: a batch-1 decode step through the server against the machine's
memory bandwidth, measured in turns within one run. Writes
bench/results/runs/decode_roofline.json (or --out's name under bench/results/).

    SNAPSERVE_BUILD_DIR=build .venv/bin/python bench/decode_roofline.py \
        [--rounds 12] [--server-args "--quantized-dot=int8 ..."] [--out NAME.json]

Why in turns: this VM's speed moves by up to 2x within minutes (its
neighbours), so a step time and a bandwidth probe taken minutes apart can
make any share. Each round runs the probe (bench/common.py,
memory_bandwidth_gbs: the faster of a one-thread copy and a read on the
server's threads) while the server is idle, then one stream like the peers'
W1 (a 512-token natural-text prompt, 128 new tokens, greedy). A round's share
is its bytes per step / its median inter-token gap / its probe; the JSON has
every round and the median share.

Bytes per step are those the decode kernels read (docs/quantized-weights.md):
- the layers' matrices and the LM head as the int8 panels hold them under
  --quantized-dot=int8 on an AVX512_VNNI CPU: 4-bit legacy types (Q4_0,
  Q4_1) as nibbles, 5- and 8-bit ones (Q5_0, Q5_1, Q8_0) as bytes, plus one
  float16 scale and offset per 32 weights; other types as the file stores
  them (read in place);
- the K/V cache entries of the sequence, in the cache's dtype (an int8
  cache: 1 byte plus its float32 scale per 16 values), at the step's mean
  context (prompt + half the new tokens).
Norm vectors and the embedding row are left out (under 0.1 %). The
inter-token gap is seen by the client, so it also holds sampling, the
scheduler and the gRPC stream: the share is a lower bound on the kernels'.
"""
import argparse
import pathlib
import shlex
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import common as c  # noqa: E402

# Bytes per 32 weights in the int8 panels (kernels/prefill_gemm/prefill_gemm_int8.h).
NIBBLE_PANEL_TYPES = {"Q4_0", "Q4_1"}
BYTE_PANEL_TYPES = {"Q5_0", "Q5_1", "Q8_0"}
# Bytes per cached element; int8 adds a float32 scale per 16 values
# (kernels/kv_append/kv_append.h).
KV_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "int8": 1 + 4 / 16}
DEFAULT_SERVER_ARGS = ("--quantized-dot=int8 --prefill-gemm=int8 --kv-cache-dtype=bfloat16 "
                       "--block-size=64")


def matrix_bytes(tensor, panels):
    """Bytes a decode step reads of one GGUF matrix."""
    kind = tensor.tensor_type.name
    weights = int(tensor.n_elements)
    if panels and kind in NIBBLE_PANEL_TYPES:
        return weights // 32 * (16 + 4)
    if panels and kind in BYTE_PANEL_TYPES:
        return weights // 32 * (32 + 4)
    return int(tensor.n_bytes)


def weight_bytes(path, panels):
    """(panel or stored bytes, file bytes) of the layers' matrices + the LM head."""
    import gguf
    tensors = {t.name: t for t in gguf.GGUFReader(path).tensors}
    head = tensors.get("output.weight", tensors["token_embd.weight"])
    chosen = [t for n, t in tensors.items() if n.startswith("blk.") and len(t.shape) == 2] + [head]
    return (sum(matrix_bytes(t, panels) for t in chosen), sum(int(t.n_bytes) for t in chosen))


def flag(args, name, default):
    for a in args:
        if a.startswith(f"--{name}="):
            return a.split("=", 1)[1]
    return default


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--server-args", default=DEFAULT_SERVER_ARGS)
    ap.add_argument("--out", default="runs/decode_roofline.json",
                    help="file name under bench/results/")
    args = ap.parse_args()

    server_args = shlex.split(args.server_args) + [f"--threads={args.threads}",
                                                   "--max-batch-size=16",
                                                   "--kv-cache-memory=2GiB"]
    model = c.model_path()
    panels = flag(server_args, "quantized-dot", "exact") == "int8"
    weights, file_weights = weight_bytes(str(model), panels)
    rounds = []
    with c.Server(server_args, log_name="decode_roofline") as server:
        info = server.model_info()
        kv_dtype = flag(server_args, "kv-cache-dtype", info.dtype or "float32")
        kv_entry = (info.num_layers * info.num_key_value_heads * info.head_dim * 2 *
                    KV_DTYPE_BYTES.get(kv_dtype, 4))
        context = args.prompt_tokens + args.new_tokens / 2
        step_bytes = weights + context * kv_entry
        ids = c.prompt_ids(server, args.prompt_tokens)
        request = c.make_request(ids, args.new_tokens)
        c.stream_one(server.stub, request)  # warm-up: first-touch of the pool and scratch
        for r in range(args.rounds):
            bw = c.memory_bandwidth_gbs(size_mb=256, repeats=3, threads=args.threads)
            res = c.stream_one(server.stub, request)
            if res["error"]:
                raise SystemExit(f"round {r}: stream failed: {res['error']}")
            step_s = c.median(c.inter_token_gaps(res))
            gb_s = step_bytes / step_s / 1e9
            rounds.append({"bandwidth_gb_s": bw["gb_per_s"], "bandwidth_gb_s_best": bw["gb_per_s_best"],
                           "step_ms": 1000 * step_s, "decode_tok_s": 1 / step_s, "gb_s": gb_s,
                           "share": gb_s / bw["gb_per_s"]})
            c.log(f"round {r}: step {1000 * step_s:.2f} ms, {gb_s:.1f} GB/s of "
                  f"{bw['gb_per_s']:.1f}: {gb_s / bw['gb_per_s']:.0%}")

    summary = {
        "share_median": c.median([x["share"] for x in rounds]),
        "step_ms_median": c.median([x["step_ms"] for x in rounds]),
        "bandwidth_gb_s_median": c.median([x["bandwidth_gb_s"] for x in rounds]),
        "gb_s_median": c.median([x["gb_s"] for x in rounds]),
    }
    payload = {
        "benchmark": "decode_roofline", "machine": c.machine_info(args.threads),
        "model": str(model), "server_args": server_args,
        "bytes_per_step": step_bytes, "weight_bytes": weights, "weight_bytes_in_file": file_weights,
        "kv_bytes_per_position": kv_entry, "kv_dtype": kv_dtype, "mean_context": context,
        "method": __doc__.split("\n\n", 1)[1], "rounds": rounds, "summary": summary,
    }
    c.write_json(args.out, payload)
    c.log(f"median share {summary['share_median']:.0%} (step {summary['step_ms_median']:.2f} ms, "
          f"{summary['gb_s_median']:.1f} of {summary['bandwidth_gb_s_median']:.1f} GB/s)")


if __name__ == "__main__":
    main()
