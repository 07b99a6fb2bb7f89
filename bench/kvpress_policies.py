"""kvpress's presses at snapserve's budgets: the kvpress side of
bench/policies.py (which starts it; see there). Runs in .deps/kvpress-venv
(scripts/setup.sh kvpress), never in the project venv, because kvpress pins
its own transformers:

    .deps/kvpress-venv/bin/python bench/kvpress_policies.py IN.json OUT.json

IN.json (written by bench/policies.py): the model, the budgets and the
presses' parameters, the teacher-forced texts (prompt and continuation ids),
the greedy prompts and the passkey prompts. OUT.json: per press and budget,
the continuation's logits compared with the uncompressed cache (mean KL and
top-1 agreement), the greedy tokens, the bytes of K/V the cache holds after
the prompt, and each passkey prompt's answer tokens (bench/policies.py
decodes and scores them).

Every decode step runs one token at a time at the prompt's true positions
n, n+1, ... (position_ids), as snapserve decodes: PyramidKVPress leaves layers
of different lengths, which a multi-token step's causal mask would misalign.
"""
import json
import os
import pathlib
import sys
import time

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TQDM_DISABLE"] = "1"

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests" / "python"))
from reference.kvpress_kept_positions import load_model, ratio_keeping  # noqa: E402


def make_press(name, capacity, n, p):
    """The press keeping `capacity` of n entries per head (on average for the
    adaptive ones), with the parameters bench/policies.py uses for its own."""
    import kvpress
    exact = ratio_keeping(n, capacity)  # int(n * (1 - ratio)) == capacity
    if name == "snapkv":
        return kvpress.SnapKVPress(compression_ratio=exact, window_size=p["window"],
                                   kernel_size=p["kernel"])
    if name == "pyramidkv":  # rounds, not truncates: (n - C) / n
        return kvpress.PyramidKVPress(compression_ratio=(n - capacity) / n,
                                      window_size=p["window"], kernel_size=p["kernel"],
                                      beta=p["beta"])
    if name == "adakv":
        return kvpress.AdaKVPress(press=kvpress.SnapKVPress(
            compression_ratio=exact, window_size=p["window"], kernel_size=p["kernel"]),
            alpha_safeguard=p["alpha"])
    if name == "streaming_llm":
        return kvpress.StreamingLLMPress(compression_ratio=exact, n_sink=p["sink"])
    if name == "knorm":
        return kvpress.KnormPress(compression_ratio=exact)
    if name == "tova":
        return kvpress.TOVAPress(compression_ratio=exact)
    if name == "expected_attention":
        return kvpress.ExpectedAttentionPress(compression_ratio=exact)
    raise ValueError(name)


@torch.no_grad()
def prefill(model, ids, press):
    """The prompt through the press (None: uncompressed). Returns the cache
    and the last position's logits (the prompt's own attention is full)."""
    from transformers import DynamicCache
    cache = DynamicCache(config=model.config)
    x = torch.tensor([ids])
    if press is None:
        out = model(x, past_key_values=cache, use_cache=True)
    else:
        with press(model):
            out = model(x, past_key_values=cache, use_cache=True)
    return cache, out.logits[0, -1].float()


@torch.no_grad()
def step(model, cache, token, position):
    out = model(torch.tensor([[token]]), past_key_values=cache, use_cache=True,
                position_ids=torch.tensor([[position]]))
    return out.logits[0, -1].float()


def teacher_forced(model, cache, first_logits, prompt_len, cont):
    """Logits [len(cont), vocab]: row i predicts cont[i + 1] (row 0 comes from
    the prompt's own last position)."""
    rows = [first_logits]
    for i, token in enumerate(cont[:-1]):
        rows.append(step(model, cache, token, prompt_len + i))
    return torch.stack(rows)


def greedy(model, cache, first_logits, prompt_len, count):
    tokens = [int(first_logits.argmax())]
    for i in range(1, count):
        tokens.append(int(step(model, cache, tokens[-1], prompt_len + i - 1).argmax()))
    return tokens


def kl_and_top1(full, other):
    lp = torch.log_softmax(full.double(), -1)
    lq = torch.log_softmax(other.double(), -1)
    kl = (lp.exp() * (lp - lq)).sum(-1)
    return float(kl.mean()), float((full.argmax(-1) == other.argmax(-1)).double().mean())


def main(in_path, out_path):
    from importlib.metadata import version
    spec = json.loads(pathlib.Path(in_path).read_text())
    torch.set_num_threads(spec.get("threads", os.cpu_count()))
    model = load_model(spec["model"])
    p = spec["params"]
    start = time.time()
    full_tf = {}
    for t in spec["teacher_forced"]:
        cache, first = prefill(model, t["prompt"], None)
        full_tf[t["name"]] = teacher_forced(model, cache, first, len(t["prompt"]), t["cont"])
    full_greedy = {}
    for g in spec["greedy"]:
        cache, first = prefill(model, g["prompt"], None)
        full_greedy[g["name"]] = greedy(model, cache, first, len(g["prompt"]), spec["greedy_tokens"])
    results = {}
    for name in spec["presses"]:
        for capacity in spec["capacities"]:
            r = {"teacher_forced": {}, "greedy": {}, "passkey_answers": []}
            for t in spec["teacher_forced"]:
                n = len(t["prompt"])
                cache, first = prefill(model, t["prompt"], make_press(name, capacity, n, p))
                logits = teacher_forced(model, cache, first, n, t["cont"])
                kl, top1 = kl_and_top1(full_tf[t["name"]], logits)
                r["teacher_forced"][t["name"]] = {"kl_mean": kl, "top1_agreement": top1}
            r["kv_bytes_held"] = {}
            for g in spec["greedy"]:
                n = len(g["prompt"])
                cache, first = prefill(model, g["prompt"], make_press(name, capacity, n, p))
                # What the press really holds: AdaKVPress masks, it frees nothing.
                r["kv_bytes_held"][g["name"]] = sum(
                    (layer.keys.numel() + layer.values.numel()) * layer.keys.element_size()
                    for layer in cache.layers)
                r["greedy"][g["name"]] = greedy(model, cache, first, n, spec["greedy_tokens"])
            for pk in spec["passkey"]:
                n = len(pk["ids"])
                cache, first = prefill(model, pk["ids"], make_press(name, capacity, n, p))
                r["passkey_answers"].append(greedy(model, cache, first, n, spec["answer_tokens"]))
            results[f"{name}/C{capacity}"] = r
            print(f"[kvpress {time.time() - start:6.0f}s] {name} C={capacity} " + " ".join(
                f"{k}: top1 {v['top1_agreement']:.3f} KL {v['kl_mean']:.4f}"
                for k, v in r["teacher_forced"].items()), flush=True)
    pathlib.Path(out_path).write_text(json.dumps({
        "kvpress": version("kvpress"), "transformers": version("transformers"),
        "full_greedy": full_greedy, "results": results}))


if __name__ == "__main__":
    main(*sys.argv[1:3])
