"""Benchmark: how often the int8 dot products keep the float model's top-1
token, for snapserve's --quantized-dot=int8 and for llama.cpp, on the same
weights and the same positions.

Why: issue 13 asks for top-1 agreement >= 99 % with transformers on every
kernel path, and the int8 path measures ~96 % (docs/quantized-weights.md,
"Why the int8 paths stay under 99 %"). That path rounds the activations to
int8 per 32-block, which is how the GGUF formats define their dot products.
llama.cpp computes the same way, so its own agreement between its quantized
run and a float32 run of the very same weights says what the formats' dot
product costs on this model, measured by a program we did not write.

What runs:
* llama.cpp (the peers harness's build in $PEERS_DIR/llama-build/bin):
  `llama-quantize --allow-requantize ... F32` writes the default file's
  weights dequantized to float32 (checked here against
  `gguf.quants.dequantize`, bit for bit); `llama-perplexity` on that file
  saves its logits (--kl-divergence-base), and a second run on the Q4_1 file
  compares with them (--kl-divergence) and prints "Same top p".
* snapserve and transformers on the same token ids (llama.cpp's tokenization
  of the text) and the same positions: chunks of --ctx tokens, the logits of
  the second half of each chunk, as llama-perplexity scores them.
  snapserve runs teacher-forced decode steps (model_decode_logits, as in
  tests/python/test_quant_blocks.py) with --quantized-dot=int8 and with the
  exact path; transformers runs the file in float32.

Writes bench/results/runs/int8_agreement_llama_cpp.json. Nothing here asserts a
threshold: the figures are for docs/quantized-weights.md.

  PEERS_DIR=/work/peers flock /tmp/cpu.lock .venv/bin/python bench/int8_agreement_llama_cpp.py
"""
import argparse
import ast
import os
import pathlib
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import common  # noqa: E402
from snapserve_testkit import build_dir, model_path  # noqa: E402

TEXT = pathlib.Path("/usr/share/common-licenses/GPL-3")
SAME_TOP = re.compile(r"Same top p:\s*([0-9.]+)\s*±\s*([0-9.]+)\s*%")


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--peers-dir", default=os.environ.get("PEERS_DIR", "/work/peers"))
    ap.add_argument("--model", default=str(model_path()))
    ap.add_argument("--ctx", type=int, default=512, help="chunk size; the second half is scored")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="runs/int8_agreement_llama_cpp.json", help="file under bench/results/")
    return ap.parse_args(argv)


def run(cmd, log):
    with open(log, "w") as f:
        subprocess.run([str(c) for c in cmd], stdout=f, stderr=subprocess.STDOUT, check=True)
    return pathlib.Path(log).read_text()


def check_dequantized(quantized, dequantized):
    """llama.cpp's float32 file holds what the gguf package dequantizes."""
    import gguf
    import numpy as np
    want = {t.name: t for t in gguf.GGUFReader(quantized).tensors}
    for t in gguf.GGUFReader(dequantized).tensors:
        w = want[t.name]
        expected = gguf.quants.dequantize(w.data, w.tensor_type).astype(np.float32).reshape(-1)
        if not np.array_equal(expected, np.asarray(t.data).reshape(-1)):
            raise SystemExit(f"{t.name}: llama.cpp's float32 weights differ from gguf's")
    return len(want)


def ensure_perplexity_tool(bin_dir):
    """The peers harness builds llama-server and llama-bench; llama-perplexity
    is one more target of the same build tree."""
    if not (bin_dir / "llama-perplexity").exists():
        subprocess.run(["cmake", "--build", str(bin_dir.parent), "--target", "llama-perplexity"],
                       check=True)


def llama_cpp_same_top(bin_dir, model, tmp, args):
    ensure_perplexity_tool(bin_dir)
    f32 = tmp / "dequantized-f32.gguf"
    run([bin_dir / "llama-quantize", "--allow-requantize", model, f32, "F32"], tmp / "quantize.log")
    tensors = check_dequantized(model, f32)
    common_args = ["-f", TEXT, "-c", args.ctx, "-b", args.ctx, "-t", args.threads,
                   "--kl-divergence-base", tmp / "base.kld"]
    run([bin_dir / "llama-perplexity", "-m", f32] + common_args, tmp / "base.log")
    out = run([bin_dir / "llama-perplexity", "-m", model] + common_args + ["--kl-divergence"],
              tmp / "q.log")
    match = SAME_TOP.search(out)
    if not match:
        raise SystemExit(f"no 'Same top p' in llama-perplexity's output:\n{out[-2000:]}")
    chunks = int(re.search(r"computing over (\d+) chunks", out).group(1))
    return {"same_top1": float(match.group(1)) / 100, "plus_minus": float(match.group(2)) / 100,
            "chunks": chunks, "dequantized_tensors_checked": tensors}


def llama_cpp_ids(bin_dir, model, tmp):
    out = subprocess.run([str(bin_dir / "llama-tokenize"), "-m", str(model), "-f", str(TEXT),
                          "--ids", "--log-disable"], capture_output=True, text=True, check=True)
    return ast.literal_eval(out.stdout.strip().splitlines()[-1])


def bos_replacing_first_token(model):
    """llama-perplexity puts BOS first in each chunk when the file asks for one."""
    import gguf
    fields = gguf.GGUFReader(model).fields
    add = fields.get("tokenizer.ggml.add_bos_token")
    if add is None or not bool(add.parts[-1][0]):
        return None
    return int(fields["tokenizer.ggml.bos_token_id"].parts[-1][0])


def snapserve_agreement(model, ids, chunks, ctx, threads):
    """Top-1 agreement with transformers (float32, the same file) over the
    positions llama-perplexity scores: ctx/2 .. ctx-2 of each chunk."""
    import torch
    from transformers import AutoModelForCausalLM
    torch.set_num_threads(threads)
    torch.ops.load_library(str(build_dir() / "tests" / "libsnapserve_torch_ops.so"))
    ops = torch.ops.snapserve
    model = pathlib.Path(model)
    hf = AutoModelForCausalLM.from_pretrained(model.parent, gguf_file=model.name,
                                              dtype=torch.float32).eval()
    first = ctx // 2
    bos = bos_replacing_first_token(model)
    same = {"int8": 0, "exact": 0, "int8_vs_exact": 0}
    positions = 0
    for c in range(chunks):
        chunk = ids[c * ctx:(c + 1) * ctx]
        if bos is not None:
            chunk = [bos] + chunk[1:]
        with torch.no_grad():
            want = hf(torch.tensor([chunk])).logits[0, first:ctx - 1].argmax(-1)
        # model_decode_logits(ids, n): row 0 is position n-1, then one decode step per position.
        got = {path: ops.model_decode_logits(str(model), dtype, chunk, first + 1)[:ctx - 1 - first]
               .argmax(-1) for path, dtype in (("int8", "float32:int8"), ("exact", "float32"))}
        same["int8"] += int((got["int8"] == want).sum())
        same["exact"] += int((got["exact"] == want).sum())
        same["int8_vs_exact"] += int((got["int8"] == got["exact"]).sum())
        positions += len(want)
    return {"positions": positions, **{k: v / positions for k, v in same.items()}}


def main(argv=None):
    args = parse_args(argv)
    bin_dir = pathlib.Path(args.peers_dir) / "llama-build" / "bin"
    model = pathlib.Path(args.model)
    with tempfile.TemporaryDirectory(prefix="int8-agreement-") as tmp:
        tmp = pathlib.Path(tmp)
        llama = llama_cpp_same_top(bin_dir, model, tmp, args)
        ids = llama_cpp_ids(bin_dir, model, tmp)
    ours = snapserve_agreement(model, ids, llama["chunks"], args.ctx, args.threads)
    result = {
        "model": model.name, "text": str(TEXT), "ctx": args.ctx, "threads": args.threads,
        "llama_cpp_q_vs_its_f32_same_top1": llama,
        "snapserve_vs_transformers_f32_top1": ours,
        "machine": common.machine_info(),
    }
    print(result)
    common.write_json(args.out, result)


if __name__ == "__main__":
    main()
