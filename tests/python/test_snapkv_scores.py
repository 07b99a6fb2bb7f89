"""kernels::snapkv_scores (raw and pooled) and snapkv_topk against a plain
PyTorch computation of docs/snapkv.md steps 3-7, written here in float64
(docs/testing-and-measuring.md, "Oracles, not self-agreement").

The oracle is the textbook attention: one matmul of the window queries with
all keys, a causal mask, torch.softmax, a sum over the window rows, the GQA
group mean or max, then torch's own max_pool1d / avg_pool1d. It shares no code
with the C++ kernels nor with tests/python/reference/snapkv.py (numpy).

Tolerance. The kernel computes in float32, the oracle in float64. A logit
q·k/sqrt(d) with d = 64 standard-normal entries has magnitude ~1 and a float32
rounding error below ~64 * 2^-24 * |q||k| / sqrt(d) ~ 3e-5 absolute, which exp()
turns into the same relative error on a probability; summing w <= 32 rows adds
~32 ulp. RTOL = 1e-4 covers that with margin; ATOL = 1e-7 absorbs scores that
are nearly 0 (probabilities that underflow or nearly so). Real-model inputs
(larger logits) are checked with the bound scaled by their largest logit.
"""
import math

import pytest
import torch
import torch.nn.functional as F

RTOL = 1e-4
ATOL = 1e-7


def oracle_scores(q, k, kernel_size, pooling, group_reduce):
    """(raw, pooled) float64 [num_kv_heads, n - w] from q [H, w, d] and k [Hkv, n, d]."""
    q = q.to(torch.float64)
    k = k.to(torch.float64)
    num_heads, w, d = q.shape
    num_kv_heads, n, _ = k.shape
    group = num_heads // num_kv_heads
    k_per_head = k.repeat_interleave(group, dim=0)  # transformers' repeat_kv order
    logits = q @ k_per_head.transpose(1, 2) / math.sqrt(d)  # [H, w, n]
    row_pos = torch.arange(n - w, n)[:, None]
    causal = torch.arange(n)[None, :] <= row_pos
    probs = torch.softmax(logits.masked_fill(~causal, float("-inf")), dim=-1)
    per_head = probs[:, :, : n - w].sum(dim=1).view(num_kv_heads, group, n - w)
    raw = per_head.mean(dim=1) if group_reduce == "mean" else per_head.amax(dim=1)
    r = kernel_size // 2
    if pooling == "max":
        pooled = F.max_pool1d(raw[:, None], kernel_size, stride=1, padding=r)[:, 0]
    else:
        pooled = F.avg_pool1d(raw[:, None], kernel_size, stride=1, padding=r,
                              count_include_pad=True)[:, 0]
    return raw, pooled


def stable_top(pooled, w, capacity):
    """Positions kept from float32 pooled scores: stable sort (ties -> lower position)."""
    n = pooled.shape[1] + w
    rows = []
    for p in pooled:
        best = torch.sort(-p, stable=True).indices[: capacity - w]
        rows.append(torch.cat([torch.sort(best).values, torch.arange(n - w, n)]))
    return torch.stack(rows)


CASES = [  # (num_kv_heads, group, n, w, kernel, pooling, reduce, dtype)
    (1, 1, 40, 1, 1, "max", "mean", torch.float32),
    (2, 3, 257, 8, 7, "max", "mean", torch.float32),
    (3, 3, 700, 32, 7, "avg", "mean", torch.float32),
    (2, 4, 1500, 32, 5, "max", "max", torch.bfloat16),
    (1, 8, 3000, 16, 3, "avg", "max", torch.float16),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"Hkv{c[0]}-G{c[1]}-n{c[2]}-w{c[3]}-"
                                                     f"k{c[4]}-{c[5]}-{c[6]}-{str(c[7])[6:]}")
def test_scores_match_plain_torch(torch_ops, case):
    num_kv_heads, group, n, w, ksize, pooling, reduce, dtype = case
    gen = torch.Generator().manual_seed(n + w)
    q = torch.randn(num_kv_heads * group, w, 64, generator=gen).to(dtype)
    k = torch.randn(num_kv_heads, n, 64, generator=gen).to(dtype)
    raw, pooled = torch_ops.snapkv_scores(q, k, w, ksize, pooling, reduce)
    want_raw, want_pooled = oracle_scores(q, k, ksize, pooling, reduce)
    for got in (raw, pooled):
        assert got.dtype == torch.float32 and got.shape == (num_kv_heads, n - w)
        assert got.is_contiguous()
    torch.testing.assert_close(raw.double(), want_raw, rtol=RTOL, atol=ATOL)
    torch.testing.assert_close(pooled.double(), want_pooled, rtol=RTOL, atol=ATOL)
    if reduce == "mean":  # the window's mass on the prefix: at most one per row
        assert float(raw.sum(dim=1).max()) <= w * (1 + 1e-5)
    # The selection ranks exactly these pooled scores (same values, one pass).
    capacity = (n + w) // 2
    got = torch_ops.snapkv_select(q, k, w, capacity, ksize, pooling, reduce)
    assert torch.equal(got, stable_top(pooled, w, capacity))


def test_kernel_one_pools_to_raw(torch_ops):
    gen = torch.Generator().manual_seed(1)
    q, k = torch.randn(4, 8, 32, generator=gen), torch.randn(2, 300, 32, generator=gen)
    raw, pooled = torch_ops.snapkv_scores(q, k, 8, 1, "avg", "mean")
    assert torch.equal(raw, pooled)


def test_scores_reject_bad_parameters(torch_ops):
    q, k = torch.randn(4, 8, 16), torch.randn(2, 100, 16)
    with pytest.raises(RuntimeError, match="snapkv_scores: kernel_size must be odd"):
        torch_ops.snapkv_scores(q, k, 8, 4, "max", "mean")
    with pytest.raises(RuntimeError, match="snapkv_scores: window must be at least 1"):
        torch_ops.snapkv_scores(q[:, :0], k, 0, 7, "max", "mean")
    with pytest.raises(RuntimeError, match=r"window must be less than the prompt length n "
                                           r"\(8 >= 8\)"):
        torch_ops.snapkv_scores(q, k[:, :8], 8, 7, "max", "mean")
    with pytest.raises(RuntimeError, match="q_window: expected 4 rows"):
        torch_ops.snapkv_scores(q, k, 4, 7, "max", "mean")
    with pytest.raises(RuntimeError, match="multiple of num_kv_heads"):
        torch_ops.snapkv_scores(q[:3], k, 8, 7, "max", "mean")


def test_real_model_scores_match_plain_torch(torch_ops, real_prefill):
    """Post-RoPE q/k of SmolLM2 (transformers, float32) for a ~600-token prompt:
    every layer, w = 32, max pooling k = 7 (the server's defaults)."""
    pre = real_prefill
    for layer in range(len(pre.keys)):
        q = pre.q_window[layer][:, -32:].contiguous()
        k = pre.keys[layer].contiguous()
        raw, pooled = torch_ops.snapkv_scores(q, k, 32, 7, "max", "mean")
        want_raw, want_pooled = oracle_scores(q, k, 7, "max", "mean")
        # Real logits reach tens: the float32 logit error grows with them, and
        # exp turns it into relative error (see the module docstring).
        scale = float((q.double().norm(dim=-1).max() * k.double().norm(dim=-1).max()) / 8)
        rtol = RTOL * max(1.0, scale / 8)
        torch.testing.assert_close(raw.double(), want_raw, rtol=rtol, atol=ATOL)
        torch.testing.assert_close(pooled.double(), want_pooled, rtol=rtol, atol=ATOL)


@pytest.fixture(scope="module")
def real_prefill(model_path):
    import pathlib
    import sys
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
    from reference.hf_snapkv_pipeline import SnapKVPipeline
    text = pathlib.Path("/usr/share/common-licenses/Apache-2.0").read_text()
    pipe = SnapKVPipeline.load(model_path)
    ids = pipe.tokenizer(text)["input_ids"][:600]
    return pipe.prefill(ids, max_window=32)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("case", CASES[1:], ids=lambda c: f"n{c[2]}-{c[5]}-{c[6]}")
def test_cuda_scores_match_plain_torch(torch_ops, case):
    num_kv_heads, group, n, w, ksize, pooling, reduce, dtype = case
    gen = torch.Generator().manual_seed(n + w)
    q = torch.randn(num_kv_heads * group, w, 64, generator=gen).to(dtype)
    k = torch.randn(num_kv_heads, n, 64, generator=gen).to(dtype)
    raw, pooled = torch_ops.snapkv_scores(q.cuda(), k.cuda(), w, ksize, pooling, reduce)
    assert raw.is_cuda and pooled.is_cuda
    want_raw, want_pooled = oracle_scores(q, k, ksize, pooling, reduce)
    torch.testing.assert_close(raw.cpu().double(), want_raw, rtol=RTOL, atol=ATOL)
    torch.testing.assert_close(pooled.cpu().double(), want_pooled, rtol=RTOL, atol=ATOL)
    capacity = (n + w) // 2
    got = torch_ops.snapkv_select(q.cuda(), k.cuda(), w, capacity, ksize, pooling, reduce)
    assert torch.equal(got.cpu(), stable_top(pooled.cpu(), w, capacity))
