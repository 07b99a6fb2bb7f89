"""SafetensorsFile on damaged checkpoints: a tiny Llama written by
transformers' save_pretrained (through the safetensors package), then its
header's data_offsets edited. The safetensors package is the oracle: every
file refused here is refused by it too, and the file it accepts with its
header in another order loads here with unchanged logits.

Its rule (Metadata::validate): the tensors, sorted by their offsets, tile the
data section exactly, so no two share a byte and no byte belongs to none.
"""
import json
import os
import shutil
import struct
import subprocess

os.environ["HF_HUB_OFFLINE"] = "1"  # nothing may be downloaded

import pytest
import torch
from snapserve_testkit.server import startup_error

LAYER = "model.layers.0.self_attn."
K, V = LAYER + "k_proj.weight", LAYER + "v_proj.weight"  # the same shape: [kv_dim, hidden]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    import transformers
    torch.manual_seed(5)
    config = transformers.LlamaConfig(
        hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=256, max_position_embeddings=256,
        initializer_range=0.1, tie_word_embeddings=False)
    model = transformers.LlamaForCausalLM(config).eval()
    path = tmp_path_factory.mktemp("tiny") / "llama"
    model.save_pretrained(path, safe_serialization=True)
    return path, model


def _split(path):
    raw = path.read_bytes()
    (n,) = struct.unpack_from("<Q", raw)
    return json.loads(raw[8:8 + n]), raw[8 + n:]


def _copy_with(tiny_path, dest, header, data):
    shutil.copytree(tiny_path, dest)
    encoded = json.dumps(header).encode()
    (dest / "model.safetensors").write_bytes(struct.pack("<Q", len(encoded)) + encoded + data)
    return dest


def _oracle_error(path):
    """What the safetensors package says about the file ("" when it loads it)."""
    from safetensors import safe_open
    try:
        with safe_open(str(path / "model.safetensors"), "pt") as f:
            for key in f.keys():
                f.get_tensor(key)
    except Exception as e:  # noqa: BLE001 - any refusal is the oracle's answer
        return str(e) or type(e).__name__
    return ""


def _offsets(header, name):
    return header[name]["data_offsets"]


def _v_reads_k(header, data):
    """v_proj pointed at k_proj's bytes: without the check the model loads and
    serves k's weights as v's."""
    header[V]["data_offsets"] = list(_offsets(header, K))
    return header, data, [f"tensor `{K}`", f"tensor `{V}`", "overlaps"]


def _next_runs_into_k(header, data):
    """The tensor stored after k_proj slid back by one float: its first
    bytes are k_proj's last."""
    _, end = _offsets(header, K)
    (following,) = [t for t in header if t != "__metadata__" and _offsets(header, t)[0] == end]
    header[following]["data_offsets"] = [o - 4 for o in _offsets(header, following)]
    return header, data, [f"tensor `{K}`", f"overlaps tensor `{following}`"]


def _hole_after_k(header, data):
    """64 bytes inserted after k_proj's data and every later offset moved:
    each tensor still reads its own bytes, but the section has a hole."""
    _, end = _offsets(header, K)
    for name, entry in header.items():
        if name != "__metadata__" and entry["data_offsets"][0] >= end:
            entry["data_offsets"] = [o + 64 for o in entry["data_offsets"]]
    data = data[:end] + bytes(64) + data[end:]
    return header, data, [f"bytes [{end}, {end + 64}) of the data section belong to no tensor",
                          f"tensor `{K}`"]


def _trailing_bytes(header, data):
    size = len(data)
    return header, data + bytes(32), [
        f"bytes [{size}, {size + 32}) of the data section belong to no tensor", "after the last"]


DAMAGE = {"v_reads_k": _v_reads_k, "next_runs_into_k": _next_runs_into_k,
          "hole_after_k": _hole_after_k, "trailing_bytes": _trailing_bytes}


@pytest.mark.parametrize("case", list(DAMAGE))
def test_damaged_offsets_are_refused_like_the_reference(case, tiny, torch_ops, tmp_path):
    tiny_path, _ = tiny
    header, data = _split(tiny_path / "model.safetensors")
    header, data, words = DAMAGE[case](header, data)
    path = _copy_with(tiny_path, tmp_path / case, header, data)
    oracle = _oracle_error(path)
    # Its two refusals: a tensor not starting where the one before it ends,
    # and bytes after the last tensor.
    assert "invalid offset" in oracle or "not fully covered" in oracle, (case, oracle)
    with pytest.raises(RuntimeError) as err:
        torch_ops.model_logits(str(path), "float32", [1, 2, 3])
    message = str(err.value)
    assert f"{path / 'model.safetensors'}: not a valid safetensors file: " in message, message
    for word in words:
        assert word in message, (word, message)


def test_the_server_refuses_tensors_sharing_bytes(tiny, build_dir, tmp_path):
    """The real binary on the v_reads_k file: a clean refusal at startup (the
    directory has no tokenizer, but the model loads first)."""
    tiny_path, _ = tiny
    header, data, words = _v_reads_k(*_split(tiny_path / "model.safetensors"))
    path = _copy_with(tiny_path, tmp_path / "v_reads_k", header, data)
    out = subprocess.run([str(build_dir / "server" / "snapserve"), f"--model={path}", "--port=0",
                          "--metrics-port=0", "--kv-cache-memory=16MiB"],
                         capture_output=True, text=True, errors="replace", timeout=120)
    error = startup_error(out)
    for word in words:
        assert word in error, (word, error)


def test_header_order_is_free(tiny, torch_ops, tmp_path):
    """The header listing tensors in reverse order of their bytes is a valid
    file for the reference and loads here with the same logits as
    transformers on the original weights."""
    tiny_path, model = tiny
    header, data = _split(tiny_path / "model.safetensors")
    reordered = dict(reversed(list(header.items())))
    assert list(reordered) != list(header)
    path = _copy_with(tiny_path, tmp_path / "reordered", reordered, data)
    assert _oracle_error(path) == ""
    ids = [5, 17, 99, 3, 250, 42]
    with torch.no_grad():
        expected = model(torch.tensor([ids])).logits[0]
    got = torch_ops.model_logits(str(path), "float32", ids)
    assert (got - expected).abs().max().item() <= 1e-4
