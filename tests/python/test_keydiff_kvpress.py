"""KeyDiff's kept positions against kvpress's KeyDiffPress, the reference
implementation docs/compression-policies.md follows.

As test_streaming_llm_kvpress.py: kvpress runs in its own venv
(.deps/kvpress-venv) through tests/python/reference/kvpress_kept_positions.py
on the default model's real prefill of 5 natural-text prompts. For every
prompt, layer and KV head, the positions kvpress keeps must equal the ones the
server's selector keeps (engine/compress/keydiff_selector.cc, through
torch.ops.snapserve.keydiff_select on the same layer's keys from the
transformers prefill).

Conventions that make the budgets the same:
- KeyDiffPress keeps int(n * (1 - ratio)) per head: the ratio
  (n - C - 1/2) / n keeps exactly C. It has no window and no sinks: every
  kept position is ranked by its score.
- kvpress compresses every prompt; the server leaves prompts of at most C
  positions alone, so every prompt here is longer than C.
- kvpress returns the kept entries in topk order; positions are compared
  sorted, and the server keeps them in increasing order.
- Real keys have no exact score ties at the cut on these prompts; a tie, or
  a score computed differently, would show up as a difference here.
"""
import json
import os
import pathlib
import subprocess
import sys

import pytest
import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
# The same prompts, kvpress venv and transformers prefill as the StreamingLLM
# comparison (its fixtures).
from test_streaming_llm_kvpress import (SCRIPT, _prefill, kvpress_python, pipe,  # noqa: E402,F401
                                        prompts)

# A budget that is a multiple of the block size and one that is not.
CAPACITIES = [128, 300]


@pytest.fixture(scope="module")
def kvpress_results(kvpress_python, model_path, prompts, tmp_path_factory):
    """kvpress's kept positions for every budget and prompt: one subprocess."""
    tmp = tmp_path_factory.mktemp("kvpress")
    spec = {"press": "keydiff", "prompts": prompts,
            "configs": [{"capacity": c} for c in CAPACITIES]}
    src, out = tmp / "in.json", tmp / "out.json"
    src.write_text(json.dumps(spec))
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    done = subprocess.run([str(kvpress_python), str(SCRIPT), str(model_path), str(src), str(out)],
                          capture_output=True, text=True, timeout=3600, env=env)
    assert done.returncode == 0, f"kvpress script failed:\n{done.stdout}\n{done.stderr}"
    got = json.loads(out.read_text())
    assert got["kvpress"] == "0.5.5", got["kvpress"]
    return dict(zip(CAPACITIES, got["results"]))


def _server_positions(torch_ops, keys, capacity):
    """The server selector's kept positions [Hkv, C] of one layer: it keeps
    rows of the real keys, and a position label rides along as the 'values'."""
    heads, n, _ = keys.shape
    labels = torch.arange(n, dtype=torch.float32).view(1, n, 1).expand(heads, n, 1).contiguous()
    kept_keys, kept_labels = torch_ops.keydiff_select(keys, labels, capacity)
    positions = kept_labels[..., 0].long()
    heads_idx = torch.arange(heads)[:, None]
    assert torch.equal(kept_keys, keys[heads_idx, positions])  # keys and values kept alike
    return positions.tolist()


@pytest.mark.slow
@pytest.mark.parametrize("capacity", CAPACITIES, ids=[f"C{c}" for c in CAPACITIES])
def test_kept_positions_equal_kvpress(kvpress_results, torch_ops, pipe, prompts, capacity):
    results = kvpress_results[capacity]
    assert len(results) == len(prompts)
    for ids, result in zip(prompts, results):
        n = len(ids)
        assert result["n"] == n and n > capacity
        pre = _prefill(pipe, ids)
        assert len(result["positions"]) == pipe.num_layers
        for layer, kvpress_layer in enumerate(result["positions"]):
            assert len(kvpress_layer) == pipe.num_kv_heads
            assert all(len(head) == capacity for head in kvpress_layer)
            server = _server_positions(torch_ops, pre.keys[layer], capacity)
            assert server == kvpress_layer, f"n={n} layer={layer}"


def test_selector_keeps_the_least_typical_keys(torch_ops):
    """A hand-made head: four keys along e0, one along -e0 (position 4) and
    one along e1 (position 2). The mean unit key is (1/2, 1/6): the opposite
    key has the lowest cosine to it, the orthogonal one the next lowest, so
    those two are kept at C = 2."""
    e0, e1 = torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0])
    keys = torch.stack([e0, 2 * e0, e1, 3 * e0, -e0, e0 * 0.5]).unsqueeze(0)
    labels = torch.arange(6, dtype=torch.float32).view(1, 6, 1)
    _, kept = torch_ops.keydiff_select(keys, labels, 2)
    assert kept[0, :, 0].tolist() == [2.0, 4.0]  # increasing positions
