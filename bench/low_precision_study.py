"""Study: what lower precision would cost the default model's predictions,
before any kernel is written for it.

Why: the issue-13 targets left open (W2 prefill at 1.5x vLLM, W3 without
compression at 1.5x) need fewer bytes or cheaper products than bfloat16:
int8 products for the prompt GEMM without per-32-block scales (so that AMX
tdpbsud could sum whole rows), or a KV cache narrower than bfloat16 (decode
attention at 16 sequences reads ~400 MB a step and runs at the bandwidth
probe's speed). Both change numbers, so this measures first what each
candidate rounding does to next-token top-1 agreement.

How: transformers' float32 model from the default GGUF file (the oracle of
tests/python/test_model_parity.py), teacher-forced over the 2048 tokens of
GPL-3 those tests use. Each variant rounds one thing in transformers' own
forward pass, with hooks, and is compared with the unrounded run:
* prompt GEMM inputs and weights (every linear but the LM head):
  - bf16: both rounded to bfloat16 (what --prefill-gemm=bfloat16 does);
  - w8a8: weights int8 per output row, activations int8 per token, each
    with one symmetric scale (one int32 sum per output: what AMX could run
    at twice the bf16 rate); w8a8_g<n>: activations per group of n along k;
  - w8a8_skip_<names>: w8a8 except those linears;
* K and V as the attention reads them (after RoPE), i.e. a KV cache:
  - bf16, e4m3 / e5m2 (float8 without scales, clamped to the type's range),
    int8 (symmetric, one scale per token and head), int8_asym (min/max per
    token and head); K_<v> / V_<v>: only K or only V rounded; K_g<n>: K
    int8 per token and group of n channels.
The whole prompt's K and V are rounded at once: harsher than decode, where
only the cached entries are (tests/python/test_model_parity.py measures the
decode form for the caches that exist).

Writes bench/results/runs/low_precision_study.json. Nothing is asserted: the
figures are for docs/quantized-weights.md ("Why the int8 paths stay under
99 %") and docs/kv-cache-and-scheduling.md ("int8 KV cache").

  flock /tmp/cpu.lock .venv/bin/python bench/low_precision_study.py
"""
import argparse
import os
import pathlib
import sys
import time

os.environ["HF_HUB_OFFLINE"] = "1"  # nothing may be downloaded

import torch  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import common  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]
MODEL = ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
TEXT = pathlib.Path("/usr/share/common-licenses/GPL-3")

GEMM_VARIANTS = ["bf16", "w8a8", "w8a8_g32", "w8a8_g192", "w8a8_skip_down_proj",
                 "w8a8_skip_q_proj,k_proj,v_proj,gate_proj,up_proj"]
KV_VARIANTS = ["bf16", "e4m3", "e5m2", "int8", "int8_asym", "K_int8", "V_int8", "K_g32",
               "K_g16", "K_g16+V_int8"]


def int8_symmetric(t, dim=-1):
    scale = t.abs().amax(dim=dim, keepdim=True).clamp_min(1e-30) / 127
    return torch.round(t / scale).clamp(-127, 127) * scale


def int8_groups(t, group):
    shape = t.shape
    return int8_symmetric(t.reshape(*shape[:-1], shape[-1] // group, group)).reshape(shape)


def int8_asymmetric(t):
    lo, hi = t.amin(-1, keepdim=True), t.amax(-1, keepdim=True)
    step = ((hi - lo) / 255).clamp_min(1e-30)
    return torch.round((t - lo) / step).clamp(0, 255) * step + lo


def round_kv(kind, t):
    if kind == "bf16":
        return t.bfloat16().float()
    if kind == "e4m3":
        return t.clamp(-448, 448).to(torch.float8_e4m3fn).float()
    if kind == "e5m2":
        return t.clamp(-57344, 57344).to(torch.float8_e5m2).float()
    if kind == "int8":
        return int8_symmetric(t)
    if kind == "int8_asym":
        return int8_asymmetric(t)
    if kind.startswith("g"):
        return int8_groups(t, int(kind[1:]))
    raise ValueError(kind)


def kv_rounders(variant):
    """(round K, round V) for a KV variant name."""
    keep = lambda t: t  # noqa: E731
    if "+" in variant:
        parts = dict(p.split("_", 1) for p in variant.split("+"))
        return (lambda t: round_kv(parts["K"], t)), (lambda t: round_kv(parts["V"], t))
    if variant.startswith("K_"):
        return (lambda t: round_kv(variant[2:], t)), keep
    if variant.startswith("V_"):
        return keep, (lambda t: round_kv(variant[2:], t))
    return (lambda t: round_kv(variant, t)), (lambda t: round_kv(variant, t))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    import transformers.models.llama.modeling_llama as llama
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tok = AutoTokenizer.from_pretrained(MODEL.parent, gguf_file=MODEL.name)
    hf = AutoModelForCausalLM.from_pretrained(MODEL.parent, gguf_file=MODEL.name,
                                              dtype=torch.float32,
                                              attn_implementation="eager").eval()
    ids = torch.tensor([tok(TEXT.read_text())["input_ids"][:args.tokens]])

    def forward():
        with torch.no_grad():
            return hf(ids).logits[0]

    reference = forward()

    def compare(got):
        return {"top1_agreement": round((got.argmax(-1) == reference.argmax(-1))
                                        .float().mean().item(), 4),
                "max_abs_logit_diff": round((got - reference).abs().max().item(), 3)}

    linears = {name: mod for name, mod in hf.named_modules()
               if isinstance(mod, torch.nn.Linear) and "lm_head" not in name}
    weights = {name: mod.weight.data.clone() for name, mod in linears.items()}
    gemm = {}
    for variant in GEMM_VARIANTS:
        skip = variant.split("_skip_")[1].split(",") if "_skip_" in variant else []
        group = int(variant.split("_g")[1]) if "_g" in variant else 0
        hooks = []
        for name, mod in linears.items():
            if any(s in name for s in skip):
                continue
            if variant == "bf16":
                mod.weight.data = weights[name].bfloat16().float()
                round_x = lambda x: x.bfloat16().float()  # noqa: E731
            else:
                mod.weight.data = int8_symmetric(weights[name], dim=1)
                round_x = ((lambda x, g=group: int8_groups(x, g)) if group else int8_symmetric)
            hooks.append(mod.register_forward_pre_hook(lambda m, a, r=round_x: (r(a[0]),)))
        gemm[variant] = compare(forward())
        for h in hooks:
            h.remove()
        for name, mod in linears.items():
            mod.weight.data = weights[name]
        print("gemm", variant, gemm[variant], flush=True)

    attention = llama.eager_attention_forward
    kv = {}
    for variant in KV_VARIANTS:
        round_k, round_v = kv_rounders(variant)
        llama.eager_attention_forward = (
            lambda module, q, k, v, *a, rk=round_k, rv=round_v, **kw:
            attention(module, q, rk(k), rv(v), *a, **kw))
        kv[variant] = compare(forward())
        llama.eager_attention_forward = attention
        print("kv", variant, kv[variant], flush=True)

    common.write_json("runs/low_precision_study.json", {
        "benchmark": "low_precision_study",
        "date": time.strftime("%Y-%m-%d"),
        "config": {"model": str(MODEL.relative_to(ROOT)), "text": str(TEXT),
                   "tokens": ids.shape[1], "threads": args.threads,
                   "oracle": "transformers float32 from the same GGUF, teacher-forced"},
        "machine": common.machine_info(),
        "prompt_gemm": gemm,
        "kv_cache": kv,
    })


if __name__ == "__main__":
    main()
