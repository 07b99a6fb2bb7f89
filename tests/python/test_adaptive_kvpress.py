"""SnapKV, PyramidKV and AdaKV kept positions against kvpress's SnapKVPress,
PyramidKVPress and AdaKVPress (around a SnapKVPress scorer), the reference
implementations docs/compression-policies.md follows.

As test_streaming_llm_kvpress.py: kvpress runs in its own venv
(.deps/kvpress-venv) through tests/python/reference/kvpress_kept_positions.py
on the default model's real prefill of 5 natural-text prompts. For every
prompt, layer and KV head, three sides must keep the same positions:
- kvpress;
- the Python reference (tests/python/reference/adaptive_kv.py over
  reference/snapkv.py's scores);
- the server's code through torch ops: snapkv_select (SnapKV, and PyramidKV
  with the budgets of pyramid_layer_budgets, the C++ PyramidLayerBudgets)
  and adakv_select (the C++ AdaKvSelect over the C++ scores).

Conventions that make the budgets the same (docs/compression-policies.md):
- kvpress scores with average pooling only: every case here uses avg.
- SnapKVPress and AdaKVPress keep int(n * (1 - ratio)) per head: the ratio
  (n - C - 1/2) / n keeps exactly C. PyramidKVPress rounds its budgets
  instead: it gets (n - C) / n, so that its "max_capacity_prompt - window" is
  C, our C.
- kvpress pads the window's scores above every prefix score, so it always
  keeps the window as the server does; its AdaKV safeguard of
  int(alpha * C) top entries counts the window first, which is the server's
  floor(alpha * C) entries, window included.
- kvpress breaks ties arbitrarily (topk); the server and the reference keep
  the lower head, then the lower position. Real scores have no exact ties
  at the cut on these prompts; a tie would show up as a difference here.
"""
import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from reference import adaptive_kv as ref  # noqa: E402
from reference import snapkv as snap_ref  # noqa: E402
# The same prompts and kvpress venv as the StreamingLLM comparison (its fixtures).
from test_streaming_llm_kvpress import SCRIPT, kvpress_python, prompts  # noqa: E402,F401

KERNEL = 7
# (press, config). PyramidKV: a pyramid that fits (C / beta >= w), one capped at
# n - w for the shortest prompt, and one that falls back to uniform C.
CASES = [
    ("snapkv", {"capacity": 256, "window": 16}),
    ("snapkv", {"capacity": 128, "window": 32}),
    ("pyramidkv", {"capacity": 256, "window": 8, "beta": 20}),
    ("pyramidkv", {"capacity": 300, "window": 16, "beta": 10}),
    ("pyramidkv", {"capacity": 256, "window": 32, "beta": 20}),
    ("adakv", {"capacity": 256, "window": 8, "alpha": 0.2}),
    ("adakv", {"capacity": 128, "window": 16, "alpha": 0.5}),
    ("adakv", {"capacity": 300, "window": 32, "alpha": 0.0}),
]
IDS = [f"{p}-" + "-".join(f"{k}{v}" for k, v in c.items()) for p, c in CASES]


@pytest.fixture(scope="module")
def kvpress_results(kvpress_python, model_path, prompts, tmp_path_factory):
    """kvpress's kept positions, one subprocess per press (the model loads once each)."""
    tmp = tmp_path_factory.mktemp("kvpress")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    results = {}
    for press in sorted({p for p, _ in CASES}):
        configs = [dict(c, kernel_size=KERNEL, beta=c.get("beta", 20), alpha=c.get("alpha", 0.2))
                   for p, c in CASES if p == press]
        src, out = tmp / f"{press}.in.json", tmp / f"{press}.out.json"
        src.write_text(json.dumps({"press": press, "prompts": prompts, "configs": configs}))
        done = subprocess.run(
            [str(kvpress_python), str(SCRIPT), str(model_path), str(src), str(out)],
            capture_output=True, text=True, timeout=3600, env=env)
        assert done.returncode == 0, f"kvpress script failed:\n{done.stdout}\n{done.stderr}"
        got = json.loads(out.read_text())
        assert got["kvpress"] == "0.5.5", got["kvpress"]
        for (p, c), r in zip([case for case in CASES if case[0] == press], got["results"]):
            results[(p, json.dumps(c, sort_keys=True))] = r
    return results


_prefills = {}


def _prefill(pipe, ids):
    key = tuple(ids)
    if key not in _prefills:
        _prefills[key] = pipe.prefill(ids, max_window=32)
    return _prefills[key]


def _reference(press, config, q_window, keys):
    w, c = config["window"], config["capacity"]
    if press == "snapkv":
        return list(snap_ref.select_positions(q_window, keys, w, c, KERNEL, "avg"))
    if press == "adakv":
        return ref.adakv_positions(q_window, keys, w, c, KERNEL, "avg", config["alpha"])
    raise AssertionError(press)


def _server(torch_ops, press, config, q_window, keys, layer_budget):
    w = config["window"]
    if press == "adakv":
        positions, lengths = torch_ops.adakv_select(q_window, keys, config["capacity"], KERNEL,
                                                    "avg", config["alpha"])
        return [positions[g, :int(lengths[g])].numpy() for g in range(keys.shape[0])]
    if layer_budget == w:  # PyramidKV's budget of the window alone
        n = keys.shape[1]
        return [np.arange(n - w, n) for _ in range(keys.shape[0])]
    return list(torch_ops.snapkv_select(q_window, keys, w, layer_budget, KERNEL, "avg",
                                        "mean").numpy())


@pytest.mark.slow
@pytest.mark.parametrize("press,config", CASES, ids=IDS)
def test_kept_positions_equal_kvpress(kvpress_results, torch_ops, pipe, prompts, press, config):
    results = kvpress_results[(press, json.dumps(config, sort_keys=True))]
    assert len(results) == len(prompts)
    w, c = config["window"], config["capacity"]
    for ids, result in zip(prompts, results):
        n = len(ids)
        assert result["n"] == n and n > c
        pre = _prefill(pipe, ids)
        budgets = [c] * pipe.num_layers
        if press == "pyramidkv":
            budgets = ref.pyramid_budgets(n, pipe.num_layers, c, w, config["beta"])
            server_budgets = torch_ops.pyramid_layer_budgets(n, pipe.num_layers, c, w,
                                                             config["beta"])
            assert list(server_budgets) == budgets, f"n={n}"
            assert sum(budgets) == pipe.num_layers * c or budgets == [c] * pipe.num_layers
        assert len(result["positions"]) == pipe.num_layers
        for layer, kvpress_layer in enumerate(result["positions"]):
            keys = pre.keys[layer]
            q_window = pre.q_window[layer][:, -w:, :].contiguous()
            if press == "pyramidkv":
                want = ref.pyramid_positions(q_window, keys, w, budgets[layer], KERNEL, "avg")
            else:
                want = _reference(press, config, q_window, keys)
            server = _server(torch_ops, press, config, q_window, keys, budgets[layer])
            where = f"n={n} layer={layer}"
            assert [list(map(int, h)) for h in want] == kvpress_layer, where
            assert [list(map(int, h)) for h in server] == kvpress_layer, where
            if press == "adakv":
                assert sum(len(h) for h in kvpress_layer) == pipe.num_kv_heads * c, where


def test_pyramid_reference_rule():
    # min = C / beta = 5, max = 195, step 47.5; halves to even.
    assert ref.pyramid_budgets(1000, 5, 100, 4, 20) == [195, 148, 100, 52, 5]
    assert ref.pyramid_budgets(154, 3, 100, 4, 20) == [150, 100, 50]
    assert ref.pyramid_budgets(1000, 4, 100, 8, 20) == [100] * 4


def test_adakv_reference_rule():
    keys = np.zeros((2, 8, 4), dtype=np.float32)
    # Hand-made pooled scores through a stand-in: the rule alone.
    pooled = np.array([[9, 8, 7, 0, 0, 0], [1, 2, 3, 0, 0, 6]], dtype=np.float32)
    original = ref.ref.pooled_scores
    try:
        ref.ref.pooled_scores = lambda *a, **k: pooled
        got = ref.adakv_positions(None, keys, 2, 4, 1, "avg", 0.0)
        floored = ref.adakv_positions(None, keys, 2, 4, 1, "avg", 1.0)
    finally:
        ref.ref.pooled_scores = original
    assert [h.tolist() for h in got] == [[0, 1, 2, 6, 7], [5, 6, 7]]
    assert [h.tolist() for h in floored] == [[0, 1, 6, 7], [2, 5, 6, 7]]
