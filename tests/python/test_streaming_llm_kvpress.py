"""StreamingLLM's kept positions against kvpress's StreamingLLMPress, the
reference implementation this project follows (docs/compression-policies.md).

kvpress runs in its own venv (.deps/kvpress-venv, scripts/setup.sh kvpress,
which `make test` runs) through tests/python/reference/kvpress_kept_positions.py,
on the default model's real prefill: for every prompt, layer and KV head, the
positions kvpress keeps must equal the positions the server's selector keeps
(engine/compress/streaming_llm_selector.cc, through
torch.ops.snapserve.streaming_llm_select on the same layer's keys) and the
Python reference's (tests/python/reference/streaming_llm.py).

Conventions, which make the budgets the same:
- kvpress takes compression_ratio and keeps int(n * (1 - ratio)) entries; the
  server takes C = max_capacity_prompt. The script passes
  ratio = (n - C - 1/2) / n, which keeps exactly C (the half guards against
  float rounding down to C - 1).
- kvpress's n_sink is the server's sink_tokens; both count toward C.
- kvpress compresses every prompt it is given; the server leaves prompts of at
  most C positions alone, so every prompt here is longer than C.
- kvpress returns the kept entries in no particular order (topk); positions are
  compared sorted, and the server keeps them in increasing order.
"""
import json
import os
import pathlib
import subprocess
import sys

import pytest
import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from reference import streaming_llm as ref  # noqa: E402
from reference.hf_snapkv_pipeline import SnapKVPipeline  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]
KVPRESS_PYTHON = ROOT / ".deps" / "kvpress-venv" / "bin" / "python"
SCRIPT = ROOT / "tests" / "python" / "reference" / "kvpress_kept_positions.py"
LICENSES = pathlib.Path("/usr/share/common-licenses")

# (text, prompt tokens). Natural English prompts of several lengths.
PROMPTS = [("Apache-2.0", 700), ("MPL-2.0", 1000), ("GPL-2", 520), ("GFDL-1.3", 900),
           ("LGPL-2.1", 640)]
# (C, sink_tokens): the paper's 4 sinks, none, one, many.
BUDGETS = [(256, 4), (128, 0), (300, 1), (512, 64)]


@pytest.fixture(scope="module")
def kvpress_python():
    if not KVPRESS_PYTHON.is_file():
        pytest.skip(f"kvpress venv missing: {KVPRESS_PYTHON} (run `scripts/setup.sh kvpress`, "
                    "which `make test` does)")
    return KVPRESS_PYTHON


@pytest.fixture(scope="module")
def kvpress_results(kvpress_python, model_path, prompts, tmp_path_factory):
    """kvpress's kept positions for every budget and prompt: one subprocess
    (the model loads once)."""
    tmp = tmp_path_factory.mktemp("kvpress")
    spec = {"press": "streaming_llm", "prompts": prompts,
            "configs": [{"capacity": c, "sink_tokens": s} for c, s in BUDGETS]}
    src, out = tmp / "in.json", tmp / "out.json"
    src.write_text(json.dumps(spec))
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    done = subprocess.run([str(kvpress_python), str(SCRIPT), str(model_path), str(src), str(out)],
                          capture_output=True, text=True, timeout=3600, env=env)
    assert done.returncode == 0, f"kvpress script failed:\n{done.stdout}\n{done.stderr}"
    got = json.loads(out.read_text())
    assert got["kvpress"] == "0.5.5", got["kvpress"]
    return dict(zip(BUDGETS, got["results"]))


@pytest.fixture(scope="module")
def pipe(model_path):
    return SnapKVPipeline.load(model_path)


@pytest.fixture(scope="module")
def prompts(pipe):
    """Token ids of natural text. Any tokenizer does: both sides get the same ids."""
    out = []
    for name, n in PROMPTS:
        ids = pipe.tokenizer((LICENSES / name).read_text())["input_ids"][:n]
        assert len(ids) == n, f"{name} has only {len(ids)} tokens"
        out.append(ids)
    return out


_prefills = {}


def _prefill(pipe, ids):
    """One transformers prefill per prompt, shared by the budgets."""
    key = tuple(ids)
    if key not in _prefills:
        _prefills[key] = pipe.prefill(ids, max_window=1)
    return _prefills[key]


def _server_positions(torch_ops, pre, layer, capacity, sink_tokens):
    """The server selector's kept positions [Hkv, C] of one layer: it keeps
    rows of the real keys, and a position label rides along as the 'values'."""
    keys = pre.keys[layer]
    heads, n, _ = keys.shape
    labels = torch.arange(n, dtype=torch.float32).view(1, n, 1).expand(heads, n, 1).contiguous()
    kept_keys, kept_labels = torch_ops.streaming_llm_select(keys, labels, capacity, sink_tokens)
    positions = kept_labels[..., 0].long()
    heads_idx = torch.arange(heads)[:, None]
    assert torch.equal(kept_keys, keys[heads_idx, positions])  # keys and values kept alike
    return positions.tolist()


@pytest.mark.slow
@pytest.mark.parametrize("capacity,sink_tokens", BUDGETS,
                         ids=[f"C{c}-sink{s}" for c, s in BUDGETS])
def test_kept_positions_equal_kvpress(kvpress_results, torch_ops, pipe, prompts, capacity,
                                      sink_tokens):
    results = kvpress_results[(capacity, sink_tokens)]
    assert len(results) == len(prompts)
    for ids, result in zip(prompts, results):
        n = len(ids)
        assert result["n"] == n and n > capacity
        pre = _prefill(pipe, ids)
        reference = ref.select_positions(n, capacity, sink_tokens, pipe.num_kv_heads).tolist()
        assert len(result["positions"]) == pipe.num_layers
        for layer, kvpress_layer in enumerate(result["positions"]):
            assert len(kvpress_layer) == pipe.num_kv_heads
            server = _server_positions(torch_ops, pre, layer, capacity, sink_tokens)
            where = f"n={n} layer={layer}"
            assert kvpress_layer == reference, where
            assert server == reference, where
