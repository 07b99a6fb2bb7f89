"""Benchmark: the GPU forward against the machine's own limits (docs/gpu.md).

One run on one GPU, in this order:
1. the machine's limits, measured in the same run: device-to-device copy
   bandwidth (torch copy_ of a --copy-mib buffer, (read + write bytes) / time)
   and the bfloat16 matmul peak (torch.matmul of two --matmul-size square
   matrices, 2 n^3 flops / time); CUDA-event medians of --reps;
2. the floors and targets, computed from those two rates and the models'
   shapes, written into the JSON BEFORE any model or kernel runs:
   - decode step (batch b, context n): (weight bytes + b * n * KV bytes per
     token) / copy rate; targets: batch 1 at --context reaches >= 70 % of its
     floor, batch 16 at --context takes <= 1.5x batch 1;
   - prefill of --prefill-tokens tokens: matmul flops (2 * tokens * weight
     elements, the LM head for one row) + causal attention flops
     (2 * 2 * layers * heads * head_dim * n(n+1)/2), over the matmul peak;
     target >= 60 %;
   - paged decode attention at 4K-32K contexts: KV bytes read / time, target
     >= 80 % of the copy rate;
3. the attention kernels alone (the engine's lane layout, Llama 3.1 8B's
   heads: 8 KV heads of 128, 4 query heads each, bfloat16, 16-entry blocks):
   the split-context kernel (kernels/paged_attention/split_decode_attention_cuda.h) with its
   plan's partition size and with each fixed size, and the first CUDA kernel
   (one block per query head), each over enough layers' caches to exceed the
   L2 cache, replayed from a CUDA graph so launch cost is not timed;
4. per preset (a child process each): the forward of a synthetic model with
   random bf16 weights through the torch ops (bench/synthetic_decode.py's
   path, tests/torch_ops/model_ops.cc): prefill, decode at batch 1, 16 and
   64, and the GPU's busy share of batch-1 and batch-16 decode steps
   (torch.profiler: kernel time per step / measured step time);
5. the SnapKV headline (a child process per --headline-presets preset): a
   --headline-prompt-token prompt, --headline-steps new tokens, batch 1 and
   16, through the server's paged KV cache with the whole prompt kept and
   with SnapKV at C = 1024 and 4096 (tests/torch_ops/paged_decode_bench_ops.cc):
   decode tokens/s and KV bytes held, each against the full cache.
The JSON is rewritten after every section, so a run cut short keeps what
finished; a section that fails is recorded under `failures`.

--quick shortens a GPU run (the 8B preset, fewer repetitions and steps).
--dry-run runs the same plumbing on the CPU with tiny shapes (the smollm2-135m
preset, short prompts, the CPU attention kernel in place of the CUDA ones):
its numbers mean nothing, it only shows the script works end to end.

    SNAPSERVE_BUILD_DIR=build-gpu python bench/gpu_roofline.py            # on the GPU machine
    SNAPSERVE_BUILD_DIR=build .venv/bin/python bench/gpu_roofline.py --dry-run
"""
import argparse
import json
import math
import os
import pathlib
import statistics
import subprocess
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import common  # noqa: E402

# Public shapes of the presets (engine/model/synthetic_weights.cc):
# layers, hidden, intermediate, heads, KV heads, head_dim, vocab.
SHAPES = {
    "smollm2-135m": (30, 576, 1536, 9, 3, 64, 49152),
    "llama-3.2-1b": (16, 2048, 8192, 32, 8, 64, 128256),
    "llama-3.1-8b": (32, 4096, 14336, 32, 8, 128, 128256),
}
DTYPE_BYTES = 2  # bfloat16 weights and KV
TARGETS = {
    "decode_batch1_fraction_of_floor": 0.70,
    "batch16_step_over_batch1_step": 1.5,
    "prefill_fraction_of_flop_floor": 0.60,
    "attention_fraction_of_copy_bandwidth": 0.80,
}
# The attention kernels' shape: Llama 3.1 8B's heads.
ATTN_KV_HEADS, ATTN_GROUP, ATTN_HEAD_DIM, ATTN_BLOCK = 8, 4, 128, 16
PROFILE_STEPS = 10


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build-dir", default=os.environ.get("SNAPSERVE_BUILD_DIR",
                                                          str(common.ROOT / "build")))
    ap.add_argument("--presets", default="llama-3.2-1b,llama-3.1-8b")
    ap.add_argument("--headline-presets", default="llama-3.2-1b",
                    help="presets of the SnapKV headline (empty: skip it)")
    ap.add_argument("--reps", type=int, default=10, help="timed repetitions per figure")
    ap.add_argument("--copy-mib", type=int, default=2048)
    ap.add_argument("--matmul-size", type=int, default=8192)
    ap.add_argument("--context", type=int, default=1024, help="decode context (prompt tokens)")
    ap.add_argument("--decode-steps", type=int, default=32)
    ap.add_argument("--batch64-prompt", type=int, default=512)
    ap.add_argument("--prefill-tokens", type=int, default=2048)
    ap.add_argument("--attention-contexts", default="4096,8192,16384,32768")
    ap.add_argument("--attention-batches", default="1,16")
    ap.add_argument("--headline-prompt", type=int, default=16384)
    ap.add_argument("--headline-steps", type=int, default=512)
    ap.add_argument("--headline-capacities", default="1024,4096")
    ap.add_argument("--headline-batches", default="1,16")
    ap.add_argument("--window", type=int, default=32, help="SnapKV observation window")
    ap.add_argument("--quick", action="store_true",
                    help="a shorter GPU run: the 8B preset only, 5 repetitions, 16 decode steps, "
                         "attention at batch 1, a 128-step headline")
    ap.add_argument("--dry-run", action="store_true",
                    help="CPU, tiny shapes: checks the plumbing, measures nothing")
    ap.add_argument("--out", default="runs/gpu_roofline.json", help="file under bench/results/")
    ap.add_argument("--child", help=argparse.SUPPRESS)  # kind|preset, JSON on the last line
    args = ap.parse_args(argv)
    args.device = "cuda"
    if args.quick:
        args.presets, args.reps, args.decode_steps = "llama-3.1-8b", 5, 16
        args.attention_batches, args.headline_steps = "1", 128
    if args.dry_run:
        args.device = "cpu"
        args.presets = args.headline_presets = "smollm2-135m"
        args.reps, args.copy_mib, args.matmul_size = 2, 64, 256
        args.context, args.decode_steps, args.batch64_prompt = 32, 2, 16
        args.prefill_tokens = 64
        args.attention_contexts, args.attention_batches = "256,512", "1,2"
        args.headline_prompt, args.headline_steps = 256, 2
        args.headline_capacities, args.headline_batches = "64,128", "1,2"
    return args


def ints(text):
    return [int(x) for x in text.split(",") if x]


def names(text):
    return [x for x in text.split(",") if x]


def spec_of(preset):
    return f"synthetic:{preset}?format=bf16&seed=0"


def child_log(*a):
    """Progress of a child process, on stderr (its stdout carries the JSON)."""
    print(f"[{time.strftime('%H:%M:%S')}]", *a, file=sys.stderr, flush=True)


def load_ops(args):
    import torch
    torch.ops.load_library(str(pathlib.Path(args.build_dir) / "tests" /
                               "libsnapserve_torch_ops.so"))
    return torch.ops.snapserve


def sync(device):
    import torch
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def median_seconds(fn, reps, device):
    """Median wall time of fn() after one warm-up call: CUDA events around
    each call on a GPU, perf_counter on the CPU."""
    import torch
    fn()
    sync(device)
    samples = []
    for _ in range(reps):
        if device.startswith("cuda"):
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def graph_or_eager(fn, device):
    """fn captured in a CUDA graph (returns its replay and "cuda graph"), or
    fn itself where capture is impossible (CPU) or fails (and why)."""
    import torch
    if not device.startswith("cuda"):
        return fn, "eager (CPU)"
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fn()  # warm-up outside the capture (allocator pools, lazy init)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        return graph.replay, "cuda graph"
    except Exception as e:  # noqa: BLE001 - record why and time it eagerly
        torch.cuda.synchronize()
        return fn, f"eager (capture failed: {type(e).__name__}: {e})"


# --- 1. the machine's limits ---------------------------------------------------

def measure_limits(args):
    import torch
    dev = args.device
    n = args.copy_mib << 20
    src = torch.ones(n, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    copy_s = median_seconds(lambda: dst.copy_(src), args.reps, dev)
    del src, dst
    size = args.matmul_size
    gen = torch.Generator(device=dev).manual_seed(0)
    a = torch.randn(size, size, generator=gen, device=dev).to(torch.bfloat16)
    b = torch.randn(size, size, generator=gen, device=dev).to(torch.bfloat16)
    matmul_s = median_seconds(lambda: torch.matmul(a, b), args.reps, dev)
    del a, b
    if dev.startswith("cuda"):
        torch.cuda.empty_cache()
    return {
        "copy_gb_per_s": 2 * n / copy_s / 1e9,
        "copy_method": f"torch copy_ of a {args.copy_mib} MiB uint8 tensor on {dev}, "
                       f"(read + write bytes) / time, median of {args.reps}",
        "matmul_bf16_tflop_per_s": 2 * size ** 3 / matmul_s / 1e12,
        "matmul_method": f"torch.matmul of two {size}x{size} bfloat16 matrices on {dev}, "
                         f"2 n^3 / time, median of {args.reps}",
    }


# --- 2. floors -------------------------------------------------------------------

def weight_elements(preset):
    """Matrix elements a token's forward multiplies, per layer and the LM head."""
    layers, hidden, inter, heads, kv_heads, head_dim, vocab = SHAPES[preset]
    per_layer = (hidden * (heads + 2 * kv_heads) * head_dim + heads * head_dim * hidden +
                 3 * inter * hidden)
    return layers * per_layer, vocab * hidden


def kv_bytes_per_token(preset):
    layers, _, _, _, kv_heads, head_dim, _ = SHAPES[preset]
    return 2 * layers * kv_heads * head_dim * DTYPE_BYTES


def floors(args, ops, limits):
    rate = limits["copy_gb_per_s"] * 1e9
    peak = limits["matmul_bf16_tflop_per_s"] * 1e12
    out = {}
    for preset in names(args.presets):
        layers, _, _, heads, _, head_dim, _ = SHAPES[preset]
        weight_bytes = int(ops.synthetic_decode_bytes(spec_of(preset), "bfloat16"))
        per_token = kv_bytes_per_token(preset)
        # Decode contexts grow by one per step: the floor takes the mean.
        ctx = args.context + args.decode_steps / 2
        ctx64 = args.batch64_prompt + args.decode_steps / 2

        def decode_floor(batch, n):
            return (weight_bytes + batch * n * per_token) / rate

        body, head = weight_elements(preset)
        n = args.prefill_tokens
        flops = 2 * n * body + 2 * head + 2 * 2 * layers * heads * head_dim * n * (n + 1) / 2
        out[preset] = {
            "weight_bytes_per_step": weight_bytes,
            "kv_bytes_per_token": per_token,
            "decode_mean_context": ctx,
            "decode_floor_s": {"batch1": decode_floor(1, ctx), "batch16": decode_floor(16, ctx),
                               "batch64": decode_floor(64, ctx64)},
            "prefill_tokens": n,
            "prefill_flops": flops,
            "prefill_floor_s": flops / peak,
        }
    return out


# --- 3. attention kernels ---------------------------------------------------------

def attention_rows(args, ops, limits):
    import torch
    dev = args.device
    rate = limits["copy_gb_per_s"] * 1e9
    gen = torch.Generator(device=dev).manual_seed(1)
    rows = []
    for batch in ints(args.attention_batches):
        for ctx in ints(args.attention_contexts):
            lanes = batch * ATTN_KV_HEADS
            blocks_per_lane = math.ceil(ctx / ATTN_BLOCK)
            kv_bytes = 2 * lanes * ctx * ATTN_HEAD_DIM * DTYPE_BYTES
            # Enough layers that one round reads past the L2 cache (50 MiB on
            # an H100/H200): at least 256 MiB, as a decode step's layers do.
            layers = max(1, min(32, math.ceil((256 << 20) / kv_bytes)))
            per_layer = lanes * blocks_per_lane
            shape = (layers * per_layer, 1, ATTN_BLOCK, ATTN_HEAD_DIM)
            kc = torch.randn(shape, generator=gen, device=dev).to(torch.bfloat16)
            vc = torch.randn(shape, generator=gen, device=dev).to(torch.bfloat16)
            perm = torch.randperm(layers * per_layer, generator=gen, device=dev).to(torch.int32)
            tables = [perm[i * per_layer:(i + 1) * per_layer].reshape(lanes, blocks_per_lane)
                      .contiguous() for i in range(layers)]
            lens = torch.full((lanes,), ctx, dtype=torch.int32, device=dev)
            q = torch.randn(lanes, ATTN_GROUP, ATTN_HEAD_DIM, generator=gen,
                            device=dev).to(torch.bfloat16)
            out = torch.empty_like(q)
            scale = ATTN_HEAD_DIM ** -0.5
            kernels = {}
            if dev.startswith("cuda"):
                splits = {}
                for partition in (0, 64, 128, 256, 512):
                    def run(p=partition):
                        for t in tables:
                            splits[p] = ops.cuda_split_decode_attention(out, q, kc, vc, t, lens,
                                                                        scale, p)
                    kernels[f"split, partition {partition or 'planned'}"] = (run, partition)
                kernels["first CUDA kernel (a block per query head)"] = (
                    lambda: [ops.paged_decode_attention(q, kc, vc, t, lens, scale)
                             for t in tables], None)
            else:
                splits = {}
                kernels["CPU kernel (dry run)"] = (
                    lambda: [ops.paged_decode_attention(q, kc, vc, t, lens, scale)
                             for t in tables], None)
            for name, (fn, partition) in kernels.items():
                replay, how = graph_or_eager(fn, dev)
                seconds = median_seconds(replay, args.reps, dev) / layers
                rows.append({
                    "kernel": name, "batch": batch, "context": ctx, "layers_per_round": layers,
                    "splits": splits.get(partition), "timed": how, "seconds": seconds,
                    "kv_bytes": kv_bytes, "gb_per_s": kv_bytes / seconds / 1e9,
                    "fraction_of_copy_bandwidth": kv_bytes / seconds / rate})
                common.log(f"attention {name}, batch {batch}, context {ctx}: "
                           f"{1e6 * seconds:.1f} us, {kv_bytes / seconds / 1e9:.0f} GB/s "
                           f"({100 * kv_bytes / seconds / rate:.0f} % of copy; {how[:40]})")
            del kc, vc, tables, perm
            if dev.startswith("cuda"):
                torch.cuda.empty_cache()
    return rows


# --- 4. the forward, per preset (child) --------------------------------------------

def busy_share(ops, spec, dev, run, measured_step):
    """Kernel time per decode step (profiled runs of PROFILE_STEPS and 2
    steps, differenced to leave the prefill out) over the measured step."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile
    device_s = {}
    for steps in (2, PROFILE_STEPS):
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            run(steps)
        device_s[steps] = sum(e.self_device_time_total for e in prof.events()
                              if e.device_type != DeviceType.CPU) / 1e6
    per_step = (device_s[PROFILE_STEPS] - device_s[2]) / (PROFILE_STEPS - 2)
    return {"kernel_s_per_step": per_step, "measured_step_s": measured_step,
            "busy_share": per_step / measured_step}


def model_child(args, preset):
    import torch
    ops = load_ops(args)
    dev, spec, dtype = args.device, spec_of(preset), "bfloat16"
    t0 = time.perf_counter()
    ops.model_time_on(spec, dtype, dev, [1], 0)  # loads: generates the weights
    load_s = time.perf_counter() - t0
    gen = torch.Generator().manual_seed(1234)
    n = max(args.prefill_tokens, args.context, 64 * args.batch64_prompt, 16 * args.context)
    ids = torch.randint(0, 32000, (n,), generator=gen).tolist()
    ops.model_time_on(spec, dtype, dev, ids[:16], 2)  # warm-up
    runs = max(1, min(args.reps, 3))
    prefill = statistics.median(ops.model_time_on(spec, dtype, dev, ids[:args.prefill_tokens],
                                                  0)[0] for _ in range(runs))
    steps = args.decode_steps
    b1 = statistics.median(ops.model_time_on(spec, dtype, dev, ids[:args.context], steps)[1]
                           / steps for _ in range(runs))

    def batch_step(batch, prompt):
        flat = ids[:batch * prompt]
        return statistics.median(ops.model_batch_decode_seconds_on(
            spec, dtype, dev, flat, [prompt] * batch, steps) / steps for _ in range(runs))

    b16 = batch_step(16, args.context)
    b64 = batch_step(64, args.batch64_prompt)
    child_log(f"{preset}: prefill {prefill:.3f} s, decode steps {1e3 * b1:.2f} / "
              f"{1e3 * b16:.2f} / {1e3 * b64:.2f} ms at batch 1 / 16 / 64")
    result = {"preset": preset, "spec": spec, "load_s": load_s,
              "prefill": {"tokens": args.prefill_tokens, "seconds": prefill},
              "decode_step_s": {"batch1": b1, "batch16": b16, "batch64": b64},
              "batch64_tok_per_s": 64 / b64, "context": args.context,
              "batch64_prompt": args.batch64_prompt, "steps": steps, "runs": runs}
    if dev.startswith("cuda"):
        prompt16 = ids[:16 * args.context]
        result["busy"] = {
            "batch1": busy_share(ops, spec, dev, lambda s: ops.model_time_on(
                spec, dtype, dev, ids[:args.context], s), b1),
            "batch16": busy_share(ops, spec, dev, lambda s: ops.model_batch_decode_seconds_on(
                spec, dtype, dev, prompt16, [args.context] * 16, s), b16)}
    else:
        result["busy"] = None  # no device kernels to count on the CPU
    return result


# --- 5. the SnapKV headline (child) ------------------------------------------------

def headline_child(args, preset):
    ops = load_ops(args)
    rows = []
    for batch in ints(args.headline_batches):
        for capacity in [0] + ints(args.headline_capacities):
            prefill_s, decode_s, kv_bytes, entries = ops.paged_decode_seconds_on(
                spec_of(preset), "bfloat16", args.device, args.headline_prompt, batch,
                args.headline_steps, capacity, args.window, 7)
            rows.append({"batch": batch, "capacity": capacity or None,
                         "prompt_tokens": args.headline_prompt, "steps": args.headline_steps,
                         "prefill_s": prefill_s, "decode_s": decode_s,
                         "decode_tok_per_s": batch * args.headline_steps / decode_s,
                         "kv_bytes_held": kv_bytes, "entries_per_lane": entries})
            child_log(f"headline {preset} batch {batch} C={capacity or 'full'}: "
                       f"{rows[-1]['decode_tok_per_s']:.1f} tok/s, {kv_bytes / 2**20:.0f} MiB KV")
    for row in rows:
        full = next(r for r in rows if r["batch"] == row["batch"] and r["capacity"] is None)
        row["decode_speed_vs_full"] = row["decode_tok_per_s"] / full["decode_tok_per_s"]
        row["kv_bytes_vs_full"] = row["kv_bytes_held"] / full["kv_bytes_held"]
    return {"preset": preset, "rows": rows}


# --- the run ---------------------------------------------------------------------------

def run_child(kind, preset):
    child = [a for a in sys.argv[1:] if not a.startswith("--child")]
    env = dict(os.environ)
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # bench/synthetic_decode.py says why
    proc = subprocess.run([sys.executable, __file__, *child, "--child", f"{kind}|{preset}"],
                          stdout=subprocess.PIPE, text=True, env=env)
    if proc.returncode != 0:
        return None, f"{kind} {preset}: child exited with {proc.returncode}"
    return json.loads(proc.stdout.strip().splitlines()[-1]), None


def verdicts(report):
    """Each target against the figures measured (None where not measured)."""
    out = {}
    for preset, m in report["models"].items():
        f = report["floors"][preset]
        step = m["decode_step_s"]
        b1_fraction = f["decode_floor_s"]["batch1"] / step["batch1"]
        prefill_fraction = f["prefill_floor_s"] / m["prefill"]["seconds"]
        out[preset] = {
            "decode_batch1_fraction_of_floor": b1_fraction,
            "decode_batch1_met": b1_fraction >= TARGETS["decode_batch1_fraction_of_floor"],
            "decode_batch16_fraction_of_floor": f["decode_floor_s"]["batch16"] / step["batch16"],
            "batch16_step_over_batch1_step": step["batch16"] / step["batch1"],
            "batch16_met": step["batch16"] / step["batch1"]
            <= TARGETS["batch16_step_over_batch1_step"],
            "decode_batch64_fraction_of_floor": f["decode_floor_s"]["batch64"] / step["batch64"],
            "prefill_fraction_of_flop_floor": prefill_fraction,
            "prefill_met": prefill_fraction >= TARGETS["prefill_fraction_of_flop_floor"],
        }
    best = {}
    for row in report["attention"]:
        key = f"batch {row['batch']}, context {row['context']}"
        if row["kernel"].startswith("split") or row["kernel"].startswith("CPU"):
            best[key] = max(best.get(key, 0.0), row["fraction_of_copy_bandwidth"])
    out["attention_best_split_fraction"] = best
    out["attention_met"] = bool(best) and all(
        v >= TARGETS["attention_fraction_of_copy_bandwidth"] for v in best.values())
    return out


def main():
    args = parse_args()
    if args.child:
        kind, preset = args.child.split("|")
        result = model_child(args, preset) if kind == "model" else headline_child(args, preset)
        print(json.dumps(result))
        return
    import torch
    if not args.dry_run and not torch.cuda.is_available():
        sys.exit("gpu_roofline: no CUDA device (use --dry-run to check the script on a CPU)")
    ops = load_ops(args)
    machine = common.machine_info()
    if args.device.startswith("cuda"):
        props = torch.cuda.get_device_properties(0)
        machine.update(gpu=props.name, gpu_memory_bytes=props.total_memory,
                       gpu_multiprocessors=props.multi_processor_count, cuda=torch.version.cuda)
    # SNAPSERVE_CUDA_FUSED=0 times the forward without the fused kernels (docs/gpu.md).
    report = {"benchmark": "gpu_roofline", "dry_run": args.dry_run,
              "cuda_fused": os.environ.get("SNAPSERVE_CUDA_FUSED", "1") != "0",
              "config": {k: v for k, v in vars(args).items() if k != "child"},
              "machine": machine, "targets": TARGETS, "limits": None, "floors": None,
              "attention": [], "models": {}, "headline": {}, "verdicts": None, "failures": []}
    common.log("measuring the machine's copy bandwidth and matmul peak")
    report["limits"] = measure_limits(args)
    common.log(f"copy {report['limits']['copy_gb_per_s']:.0f} GB/s, bf16 matmul "
               f"{report['limits']['matmul_bf16_tflop_per_s']:.1f} TFLOP/s")
    report["floors"] = floors(args, ops, report["limits"])
    common.write_json(args.out, report)  # the floors, before any run
    try:
        report["attention"] = attention_rows(args, ops, report["limits"])
    except Exception as e:  # noqa: BLE001 - keep the other sections
        report["failures"].append(f"attention: {type(e).__name__}: {e}")
    common.write_json(args.out, report)
    for preset in names(args.presets):
        common.log(f"forward of {preset}")
        result, failure = run_child("model", preset)
        if failure:
            report["failures"].append(failure)
        else:
            report["models"][preset] = result
        common.write_json(args.out, report)
    for preset in names(args.headline_presets):
        common.log(f"SnapKV headline on {preset}")
        result, failure = run_child("headline", preset)
        if failure:
            report["failures"].append(failure)
        else:
            report["headline"][preset] = result
        common.write_json(args.out, report)
    try:
        report["verdicts"] = verdicts(report)
    except Exception as e:  # noqa: BLE001 - a missing figure leaves the verdicts out
        report["failures"].append(f"verdicts: {type(e).__name__}: {e}")
    common.write_json(args.out, report)
    for failure in report["failures"]:
        common.log(f"FAILED: {failure}")
    sys.exit(1 if report["failures"] else 0)


if __name__ == "__main__":
    main()
