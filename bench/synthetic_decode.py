"""Benchmark: prefill and decode speed of models of real shapes with random
weights (`synthetic:<preset>?format=<f>`, engine/model/synthetic_weights.h),
so bigger models than the one downloaded can be measured. The numbers are the
model's forward pass only (through the torch ops, tests/torch_ops/model_ops.cc,
DenseKvStore), no server, no tokenizer; prompts are random token ids.

Per (preset, format), each in its own child process (the ops cache loaded
models, and an 8B model should not stay resident for the next):
- load_s: building the model (generating its weights);
- prefill: tokens/s of one --prefill-tokens prompt (last logits only);
- decode at batch 1: seconds per step after a --prompt-tokens prompt;
- decode at batch 16: 16 prompts of --batch-prompt tokens prefilled one by
  one (not timed), then S batched greedy decode steps timed
  (model_batch_decode_seconds_on); per-step time = that / S;
- weight_bytes_per_step: bytes of weight matrices one CPU decode step reads
  (every layer's q/k/v, o, gate/up, down and the LM head, as stored: blocks,
  or the model dtype), and the implied GB/s (1e9) = bytes / step time, also as
  a fraction of the machine's read bandwidth (bench/common.py's probe, on the
  same thread count). KV reads are not counted (small at these lengths).
Each figure is the median of --runs.

--device=cuda runs the same forward on a GPU (the weights dequantized to the
model dtype there; bf16 or f16 formats are the ones to time). Each timed step
ends in a copy of the chosen ids to the host, so the clock sees finished GPU
work. The CPU read-bandwidth probe and its fraction are left out on a GPU.

Dtype: float32 for block formats (the CPU linear decodes blocks into float32
activations), bfloat16 for bf16, float16 for f16, float32 for f32.

    SNAPSERVE_BUILD_DIR=build .venv/bin/python bench/synthetic_decode.py [--quick | --full]

Default: llama-3.2-1b in q4_1, q8_0 and bf16, 2 threads, 3 runs. --quick: 1 run
and fewer tokens (a smoke run). --full adds llama-3.1-8b in q4_k and q8_0
(~4.6 and ~8.5 GB of weights). Writes bench/results/runs/synthetic_decode.json.
"""
import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import common  # noqa: E402

DTYPE_OF_FORMAT = {"bf16": "bfloat16", "f16": "float16", "f32": "float32"}
BATCH = 16
PROFILE_STEPS = 10  # decode steps of a profiled run (--profile): the profiler slows the host


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build-dir", default=os.environ.get("SNAPSERVE_BUILD_DIR",
                                                          str(common.ROOT / "build")))
    ap.add_argument("--presets", default="llama-3.2-1b")
    ap.add_argument("--formats", default="q4_1,q8_0,bf16")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--prefill-tokens", type=int, default=128)
    ap.add_argument("--prompt-tokens", type=int, default=64, help="before batch-1 decode")
    ap.add_argument("--decode-steps", type=int, default=16, help="batch-1 steps per run")
    ap.add_argument("--batch-prompt", type=int, default=16, help="tokens per batch-16 prompt")
    ap.add_argument("--batch-steps", type=int, default=8, help="batch-16 steps per run")
    ap.add_argument("--quantized-dot", choices=["exact", "int8"], default="exact",
                    help="how decode multiplies GGUF blocks (the server's --quantized-dot)")
    ap.add_argument("--decode-dot", choices=["float32", "bfloat16"], default="float32",
                    help="how decode multiplies bf16 weights (the server's --decode-dot)")
    ap.add_argument("--profile", default="", metavar="PRESETS",
                    help="for these presets (comma-separated), also print on stderr the kernels "
                         "of short batch-1 and batch-16 decode runs and their time per step "
                         "(torch.profiler; for --device cuda)")
    ap.add_argument("--quick", action="store_true", help="1 run, fewer tokens (smoke run)")
    ap.add_argument("--full", action="store_true", help="also llama-3.1-8b in q4_k and q8_0")
    ap.add_argument("--out", default="runs/synthetic_decode.json", help="file under bench/results/")
    ap.add_argument("--child", help=argparse.SUPPRESS)  # one spec, JSON on the last stdout line
    args = ap.parse_args(argv)
    if args.quick:
        args.runs, args.prefill_tokens, args.prompt_tokens = 1, 64, 32
        args.decode_steps, args.batch_steps = 8, 4
    return args


def child_env():
    """libgomp's default spin-wait makes 2-thread steps many times slower when
    other processes share the cores (each spinning worker holds a core another
    thread needs); a passive wait costs little on an idle machine."""
    env = dict(os.environ)
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    return env


def measure(args, spec, dtype):
    """Runs in the child: every figure of one model."""
    import torch
    torch.set_num_threads(args.threads)  # the ops run on this process's ATen pool
    torch.ops.load_library(str(pathlib.Path(args.build_dir) / "tests" /
                               "libsnapserve_torch_ops.so"))
    ops = torch.ops.snapserve
    dev = args.device
    t0 = time.perf_counter()
    ops.model_time_on(spec, dtype, dev, [1], 0)  # loads: generates the weights
    load_s = time.perf_counter() - t0
    gen = torch.Generator().manual_seed(1234)
    n = max(args.prefill_tokens, args.prompt_tokens, BATCH * args.batch_prompt)
    vocab_floor = 32000  # every preset's vocabulary is at least this large
    ids = torch.randint(0, vocab_floor, (n,), generator=gen).tolist()
    ops.model_time_on(spec, dtype, dev, ids[:16], 2)  # warm up

    prefill = [ops.model_time_on(spec, dtype, dev, ids[:args.prefill_tokens], 0)[0]
               for _ in range(args.runs)]
    decode1 = [ops.model_time_on(spec, dtype, dev, ids[:args.prompt_tokens],
                                 args.decode_steps)[1] / args.decode_steps
               for _ in range(args.runs)]
    flat = ids[:BATCH * args.batch_prompt]
    lengths = [args.batch_prompt] * BATCH
    decode16 = [ops.model_batch_decode_seconds_on(spec, dtype, dev, flat, lengths,
                                                  args.batch_steps) / args.batch_steps
                for _ in range(args.runs)]
    weight_bytes = int(ops.synthetic_decode_bytes(spec, dtype))
    with open("/proc/self/status") as f:
        peak = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))
    p, d1, d16 = (statistics.median(x) for x in (prefill, decode1, decode16))
    if spec.split(":", 1)[-1].split("?")[0] in args.profile.split(","):
        profile_decode(ops, spec, dtype, dev, ids[:args.prompt_tokens], flat, lengths, d1, d16)
    return dict(
        spec=spec, dtype=dtype, device=dev, load_s=load_s, peak_rss_bytes=peak,
        weight_bytes_per_step=weight_bytes,
        prefill=dict(tokens=args.prefill_tokens, tok_s=args.prefill_tokens / p, runs_s=prefill),
        decode_batch1=dict(prompt_tokens=args.prompt_tokens, steps=args.decode_steps,
                           step_s=d1, tok_s=1 / d1, weight_gb_per_s=weight_bytes / d1 / 1e9,
                           runs_step_s=decode1),
        decode_batch16=dict(prompt_tokens=args.batch_prompt, steps=args.batch_steps, step_s=d16,
                            tok_s=BATCH / d16 if d16 else None,
                            weight_gb_per_s=weight_bytes / d16 / 1e9 if d16 else None,
                            runs_step_s=decode16))


def profile_decode(ops, spec, dtype, dev, prompt, flat, lengths, step_s, batch_step_s):
    """Where decode's time goes on the device (torch.profiler, on stderr):
    the kernel table of a short batch-1 and batch-16 run, and the kernels'
    time per decode step against the step's measured (unprofiled) wall time.
    Each run is profiled with PROFILE_STEPS and with 2 steps; the difference
    leaves out the prompt's prefill. A small share means the host (launches,
    synchronisation, Python-free but serial C++ between kernels), not the
    GPU, sets the step's pace."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.startswith("cuda") else [])
    runs = (("batch-1", step_s, lambda n: ops.model_time_on(spec, dtype, dev, prompt, n)),
            ("batch-16", batch_step_s,
             lambda n: ops.model_batch_decode_seconds_on(spec, dtype, dev, flat, lengths, n)))
    for label, measured, run in runs:
        device_s = {}
        for steps in (2, PROFILE_STEPS):
            with profile(activities=acts) as prof:
                run(steps)
            # Kernel events only: the operator rows repeat their kernels' time.
            device_s[steps] = sum(e.self_device_time_total for e in prof.events()
                                  if e.device_type != DeviceType.CPU) / 1e6
        per_step = (device_s[PROFILE_STEPS] - device_s[2]) / (PROFILE_STEPS - 2)
        print(f"[profile] {spec} {label}: kernels {1e3 * per_step:.2f} ms per decode step, "
              f"step measured {1e3 * measured:.2f} ms: device busy "
              f"{100 * per_step / measured:.0f} %", file=sys.stderr)
        events = prof.key_averages()
        key = ("self_device_time_total" if hasattr(events[0], "self_device_time_total")
               else "self_cuda_time_total")
        print(events.table(sort_by=key, row_limit=15, max_name_column_width=60), file=sys.stderr)


def main():
    args = parse_args()
    if args.child:
        spec, dtype = args.child.split("|")
        print(json.dumps(measure(args, spec, dtype)))
        return
    presets = args.presets.split(",")
    formats = args.formats.split(",")
    cases = [(p, f) for p in presets for f in formats]
    if args.full:
        cases += [("llama-3.1-8b", "q4_k"), ("llama-3.1-8b", "q8_0")]
    machine = common.machine_info(server_threads=args.threads)
    load_start = os.getloadavg()[0]
    bandwidth = None
    if args.device == "cpu":
        bandwidth = common.memory_bandwidth_gbs(size_mb=256 if args.quick else 512,
                                                threads=args.threads)
    results, failures = [], []
    for preset, fmt in cases:
        spec = f"synthetic:{preset}?format={fmt}&seed={args.seed}"
        dtype = DTYPE_OF_FORMAT.get(fmt, "float32")
        if args.quantized_dot == "int8" and fmt not in DTYPE_OF_FORMAT:
            dtype += ":int8"
        if args.decode_dot == "bfloat16" and fmt == "bf16":
            dtype += ":bf16dot"
        common.log(f"{spec} ({dtype}, {args.threads} threads)")
        child = [a for a in sys.argv[1:] if not a.startswith("--child")]
        proc = subprocess.run([sys.executable, __file__, *child, "--child", f"{spec}|{dtype}"],
                              stdout=subprocess.PIPE, text=True, env=child_env())
        if proc.returncode != 0:
            failures.append(dict(spec=spec, returncode=proc.returncode))
            common.log(f"{spec}: FAILED (rc={proc.returncode})")
            continue
        r = json.loads(proc.stdout.strip().splitlines()[-1])
        for key in ("decode_batch1", "decode_batch16"):
            gbs = r[key]["weight_gb_per_s"]
            r[key]["fraction_of_read_bandwidth"] = (gbs / bandwidth["gb_per_s"]
                                                    if gbs and bandwidth else None)
        results.append(r)
        common.log(f"  load {r['load_s']:.1f} s, prefill {r['prefill']['tok_s']:.1f} tok/s, "
                   f"decode b1 {1e3 * r['decode_batch1']['step_s']:.0f} ms/step "
                   f"({r['decode_batch1']['weight_gb_per_s']:.1f} GB/s of weights), "
                   f"b16 {1e3 * r['decode_batch16']['step_s']:.0f} ms/step")
    machine["load_average_start_end"] = [load_start, os.getloadavg()[0]]
    common.write_json(args.out, dict(
        benchmark="synthetic_decode",
        config=dict(cases=[f"{p}?format={f}" for p, f in cases], seed=args.seed,
                    threads=args.threads, device=args.device, runs=args.runs, statistic="median",
                    prefill_tokens=args.prefill_tokens, prompt_tokens=args.prompt_tokens,
                    decode_steps=args.decode_steps, batch=BATCH, batch_prompt=args.batch_prompt,
                    batch_steps=args.batch_steps, quick=args.quick, full=args.full,
                    quantized_dot=args.quantized_dot, decode_dot=args.decode_dot,
                    omp_wait_policy=child_env()["OMP_WAIT_POLICY"],
                    note="random weights and random token ids; forward pass only (torch ops, "
                         "DenseKvStore, --device); numbers from a shared, noisy machine are "
                         "indicative"),
        machine=machine, memory_bandwidth=bandwidth, results=results, failures=failures))
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
