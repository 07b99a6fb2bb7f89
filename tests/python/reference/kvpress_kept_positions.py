"""The prompt positions a kvpress press keeps, per layer and KV head, as JSON.

Runs in .deps/kvpress-venv (scripts/setup.sh kvpress), never in the project
venv: kvpress pins an older transformers. tests/python/test_*_kvpress.py start
it as a subprocess:

    python kvpress_kept_positions.py MODEL.gguf IN.json OUT.json

IN.json:  {"press": "streaming_llm" | "snapkv" | "pyramidkv" | "adakv" | "keydiff",
           "prompts": [[token ids], ...],
           "configs": [{"capacity": C, "sink_tokens": S}, ...]   (streaming_llm)
                      [{"capacity": C}, ...]                     (keydiff)
                      [{"capacity": C, "window": w, "kernel_size": k,
                        "beta": b, "alpha": a}, ...]             (the others)}
OUT.json: {"kvpress": version, "transformers": version,
           "results": [config][prompt] {"n": n, "compression_ratio": r,
                       "positions": [layer][kv head][kept positions, increasing]}}

One run serves every config: loading the model is the slow part.

kvpress never says which positions it kept, only the compressed cache, so this
script finds out without looking inside the press: the prompt runs twice, once
plainly and once under the press. A press compresses each layer after that
layer's attention ran over the full prompt, so every layer's keys are the same
in both runs; each kept key row is then found among the full run's rows of its
KV head (bitwise equal, and unique). AdaKVPress prunes nothing: it records
the (head, position) pairs it masks in each attention module's
`masked_key_indices` (read after the prefill), and the kept positions are the
rest.

Budgets: kvpress takes a compression_ratio and keeps int(n * (1 - ratio))
entries (kvpress.utils.compute_n_kept); the server takes an absolute C. Each
press's entry in PRESSES turns C into the ratio that keeps exactly C.
"""
import json
import os
import pathlib
import sys

os.environ["HF_HUB_OFFLINE"] = "1"  # nothing may be downloaded
os.environ["TQDM_DISABLE"] = "1"  # no progress bars in the test's captured output

import torch


def ratio_keeping(n, capacity):
    """The compression_ratio for which kvpress keeps exactly `capacity` of n:
    int(n * (1 - ratio)) = int(capacity + 1/2) = capacity. Without the half,
    n * (1 - (n - C) / n) can round to C - epsilon and truncate to C - 1."""
    return (n - capacity - 0.5) / n


def streaming_llm(config, n):
    from kvpress import StreamingLLMPress
    ratio = ratio_keeping(n, config["capacity"])
    return StreamingLLMPress(compression_ratio=ratio, n_sink=config["sink_tokens"]), ratio


def snapkv(config, n):
    from kvpress import SnapKVPress
    ratio = ratio_keeping(n, config["capacity"])
    return SnapKVPress(compression_ratio=ratio, window_size=config["window"],
                       kernel_size=config["kernel_size"]), ratio


def pyramidkv(config, n):
    """PyramidKVPress rounds its budgets (round(), not int()): the ratio must
    give n * (1 - ratio) = C itself, without the half."""
    from kvpress import PyramidKVPress
    ratio = (n - config["capacity"]) / n
    return PyramidKVPress(compression_ratio=ratio, window_size=config["window"],
                          kernel_size=config["kernel_size"], beta=config["beta"]), ratio


def keydiff(config, n):
    from kvpress import KeyDiffPress
    ratio = ratio_keeping(n, config["capacity"])
    return KeyDiffPress(compression_ratio=ratio), ratio


def adakv(config, n):
    from kvpress import AdaKVPress
    press, ratio = snapkv(config, n)
    return AdaKVPress(press=press, alpha_safeguard=config["alpha"]), ratio


PRESSES = {"streaming_llm": streaming_llm, "snapkv": snapkv, "pyramidkv": pyramidkv,
           "adakv": adakv, "keydiff": keydiff}


def load_model(model_path):
    from transformers import AutoModelForCausalLM
    model_path = pathlib.Path(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path.parent, gguf_file=model_path.name,
                                                 dtype=torch.float32)
    return model.eval()


@torch.no_grad()
def prefill_keys(model, ids, press=None):
    """Per layer [num_kv_heads, m, head_dim]: the cache after one prefill."""
    from transformers import DynamicCache
    cache = DynamicCache(config=model.config)
    x = torch.tensor([ids])
    if press is None:
        model(x, past_key_values=cache, use_cache=True)
    else:
        with press(model):
            model(x, past_key_values=cache, use_cache=True)
    return [layer.keys[0].clone() for layer in cache.layers]


@torch.no_grad()
def masked_positions(model, ids, press):
    """Per layer and KV head the positions AdaKVPress keeps: all but the
    (head, position) pairs it recorded as masked."""
    from transformers import DynamicCache
    cache = DynamicCache(config=model.config)
    with press(model):
        model(torch.tensor([ids]), past_key_values=cache, use_cache=True)
    n, out = len(ids), []
    for layer in model.model.layers:
        _, heads, seqs = layer.self_attn.masked_key_indices
        masked = [set() for _ in range(model.config.num_key_value_heads)]
        for g, j in zip(heads.tolist(), seqs.tolist()):
            masked[g].add(j)
        out.append([[j for j in range(n) if j not in m] for m in masked])
    return out


def kept_positions(full, kept):
    """full [G, n, D], kept [G, m, D] -> per head the increasing positions of
    kept's rows in full."""
    out = []
    for g in range(full.shape[0]):
        dist = torch.cdist(kept[g].double(), full[g].double())  # [m, n]
        pos = dist.argmin(dim=1)
        assert torch.equal(full[g][pos], kept[g]), "a kept key matches no full-run key exactly"
        assert len(set(pos.tolist())) == len(pos), "two kept keys match the same position"
        out.append(sorted(pos.tolist()))
    return out


def main(model_path, in_path, out_path):
    from importlib.metadata import version
    spec = json.loads(pathlib.Path(in_path).read_text())
    make_press = PRESSES[spec["press"]]
    model = load_model(model_path)
    results = [[] for _ in spec["configs"]]
    for ids in spec["prompts"]:
        n = len(ids)
        full = prefill_keys(model, ids)
        for config, out in zip(spec["configs"], results):
            press, ratio = make_press(config, n)
            if spec["press"] == "adakv":
                positions = masked_positions(model, ids, press)
            else:
                kept = prefill_keys(model, ids, press)
                positions = [kept_positions(f, k) for f, k in zip(full, kept)]
            out.append({"n": n, "compression_ratio": ratio, "positions": positions})
    pathlib.Path(out_path).write_text(json.dumps({
        "kvpress": version("kvpress"), "transformers": version("transformers"),
        "results": results}))


if __name__ == "__main__":
    torch.manual_seed(0)
    main(*sys.argv[1:4])
