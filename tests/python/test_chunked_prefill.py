"""Chunked prefill (docs/kv-cache-and-scheduling.md, "Chunked prefill"): a
prompt run in chunks of tokens, each through every layer, must cache what the
same prompt run whole caches. SnapKV scores the prompt's last w queries
against all its keys, so a chunked prompt holds its K/V and its last w
queries until its last chunk; the entries kept then must be the same
positions as whole-prompt prefill keeps (which tests/python/test_snapkv_e2e.py
and test_snapkv_reference.py check against kvpress), with the same values up
to float32 rounding, and the logits that follow must agree.

Chunk sizes cover: many chunks, a last chunk shorter than the window (so the
window's queries span two chunks), chunks of one block, and one chunk.
"""
import pathlib

import pytest
import torch

GPL3 = pathlib.Path("/usr/share/common-licenses/GPL-3")
PROMPT_TOKENS = 1000
CAPACITY, WINDOW, DECODE_STEPS = 256, 32, 8


@pytest.fixture(scope="module")
def prompt(torch_ops, model_path):
    ids = torch_ops.tokenize(str(model_path), GPL3.read_text(), False)
    return list(ids[:PROMPT_TOKENS])


@pytest.fixture(scope="module")
def whole(torch_ops, model_path, prompt):
    return torch_ops.model_chunked_snapkv(str(model_path), "float32", prompt, len(prompt),
                                          CAPACITY, WINDOW, DECODE_STEPS)


# 1000 = 7 * 137 + 41 (last chunk 41 >= w); 1000 = 10 * 99 + 10 (last chunk
# 10 < w: the window's queries come from two chunks); 16: one block each.
@pytest.mark.parametrize("chunk", [137, 99, 16])
def test_chunked_prompt_keeps_what_the_whole_prompt_keeps(torch_ops, model_path, prompt, whole,
                                                          chunk):
    keys, logits = torch_ops.model_chunked_snapkv(str(model_path), "float32", prompt, chunk,
                                                  CAPACITY, WINDOW, DECODE_STEPS)
    want_keys, want_logits = whole
    # C prompt entries kept, then one per decode step.
    assert keys.shape == want_keys.shape == (30, 3, CAPACITY + DECODE_STEPS, 64)
    # A different kept position would put an unrelated key in that row: an
    # O(1) difference. Same positions differ only by float32 rounding.
    key_diff = (keys - want_keys).abs().amax(dim=(1, 2, 3))
    assert key_diff.max() < 1e-3, f"per-layer max key diff {key_diff.tolist()}"
    assert (logits - want_logits).abs().max() < 1e-3
    assert torch.equal(logits.argmax(-1), want_logits.argmax(-1))


def test_one_token_chunks_keep_what_the_whole_prompt_keeps(torch_ops, model_path, prompt):
    """The smallest budget: every chunk is one token."""
    short = prompt[:120]
    keys_1, logits_1 = torch_ops.model_chunked_snapkv(str(model_path), "float32", short, 1, 64,
                                                      WINDOW, 1)
    keys_w, logits_w = torch_ops.model_chunked_snapkv(str(model_path), "float32", short,
                                                      len(short), 64, WINDOW, 1)
    assert (keys_1 - keys_w).abs().max() < 1e-3
    assert torch.equal(logits_1.argmax(-1), logits_w.argmax(-1))
