"""The C++ forward pass on CUDA (float32, bfloat16, float16) against the same
forward on the CPU in float32, which tests/python/test_model_parity.py checks
against transformers. Runs on the GPU machine (scripts/gpu-check.sh), which
has PyTorch and pytest but no transformers or safetensors package, so the
tiny random Llama checkpoint is written here by hand in the safetensors
format (8-byte header length, JSON header, raw little-endian tensors).
On a machine without CUDA these tests skip visibly (marker `gpu`).
"""
import json
import struct

import pytest
import torch

from conftest import cuda_available

gpu = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not cuda_available(), reason="needs a CUDA device")

CONFIG = dict(architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=128,
              intermediate_size=256, num_hidden_layers=3, num_attention_heads=8,
              num_key_value_heads=2, vocab_size=512, max_position_embeddings=2048,
              rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=False,
              bos_token_id=1, eos_token_id=2, torch_dtype="float32")
# Max abs logit difference vs CPU float32 (logits are O(1) for this init).
TOL = {"float32": 1e-3, "bfloat16": 0.15, "float16": 0.03}


def write_safetensors(path, tensors):
    header, offset, blobs = {}, 0, []
    for name, t in tensors.items():
        data = t.contiguous().numpy().tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw + b"".join(blobs))


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny_llama_cuda")
    c = CONFIG
    g = torch.Generator().manual_seed(3)
    hd = c["hidden_size"] // c["num_attention_heads"]

    def w(*shape, scale=0.08):
        return torch.randn(*shape, generator=g) * scale

    t = {"model.embed_tokens.weight": w(c["vocab_size"], c["hidden_size"], scale=0.5),
         "model.norm.weight": 1 + w(c["hidden_size"]), "lm_head.weight": w(c["vocab_size"],
                                                                           c["hidden_size"])}
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = 1 + w(c["hidden_size"])
        t[p + "post_attention_layernorm.weight"] = 1 + w(c["hidden_size"])
        t[p + "self_attn.q_proj.weight"] = w(c["num_attention_heads"] * hd, c["hidden_size"])
        t[p + "self_attn.k_proj.weight"] = w(c["num_key_value_heads"] * hd, c["hidden_size"])
        t[p + "self_attn.v_proj.weight"] = w(c["num_key_value_heads"] * hd, c["hidden_size"])
        t[p + "self_attn.o_proj.weight"] = w(c["hidden_size"], c["num_attention_heads"] * hd)
        t[p + "mlp.gate_proj.weight"] = w(c["intermediate_size"], c["hidden_size"])
        t[p + "mlp.up_proj.weight"] = w(c["intermediate_size"], c["hidden_size"])
        t[p + "mlp.down_proj.weight"] = w(c["hidden_size"], c["intermediate_size"])
    write_safetensors(d / "model.safetensors", t)
    (d / "config.json").write_text(json.dumps(c))
    return d


def _ids(n, seed):
    return torch.randint(3, CONFIG["vocab_size"], (n,),
                         generator=torch.Generator().manual_seed(seed)).tolist()


def test_handwritten_checkpoint_loads_on_cpu(torch_ops, tiny_dir):
    """The hand-written checkpoint is valid (runs everywhere, so the GPU tests
    below cannot fail for a reason the CPU would have shown)."""
    logits = torch_ops.model_logits_on(str(tiny_dir), "float32", "cpu", _ids(16, 1))
    assert logits.shape == (16, CONFIG["vocab_size"]) and torch.isfinite(logits).all()


@gpu
@needs_cuda
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("n", [1, 37, 700])
def test_cuda_logits_match_cpu_float32(torch_ops, tiny_dir, dtype, n):
    ids = _ids(n, n)
    want = torch_ops.model_logits_on(str(tiny_dir), "float32", "cpu", ids)
    got = torch_ops.model_logits_on(str(tiny_dir), dtype, "cuda", ids)
    assert got.dtype == torch.float32 and got.shape == want.shape
    diff = (got - want).abs().max().item()
    assert diff <= TOL[dtype], f"{dtype} n={n}: max abs diff {diff}"
    if dtype != "float32":  # low precision still picks the same token almost everywhere
        assert (got.argmax(-1) == want.argmax(-1)).float().mean().item() >= 0.9


@gpu
@needs_cuda
def test_cuda_float32_greedy_matches_cpu(torch_ops, tiny_dir):
    ids = _ids(50, 9)
    assert (torch_ops.model_greedy_on(str(tiny_dir), "float32", "cuda", ids, 24) ==
            torch_ops.model_greedy_on(str(tiny_dir), "float32", "cpu", ids, 24))
