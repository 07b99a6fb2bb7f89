"""The int8 panels GEMM on GGUF blocks (kernels/prefill_gemm/prefill_gemm_int8.h:
--prefill-gemm=int8 for prompts, --quantized-dot=int8 for decode) against a
float64 product of the weights as the `gguf` package decodes them, on random
valid blocks of each legacy type; its VNNI kernel against its portable one,
and the 4-bit types' nibble layout against the byte layout, bit for bit; and
every row's bits independent of the batch (batching invariance); and the
in-place residual form (linear_int8_panels_add_) against torch's own add of
the product."""
import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf")

from test_quant_blocks import INT8_TYPES, _random_blocks  # noqa: E402

T = gguf.GGMLQuantizationType
# The bias that makes a signed type's small integers unsigned in the panels.
BIAS = {T.Q4_0: 8, T.Q5_0: 16, T.Q8_0: 128, T.Q4_1: 0, T.Q5_1: 0}


def _scale_offset(data, qtype, rows, blocks):
    """Per block: d (float16 at byte 0) and the offset the panels use
    (m at byte 2 for Q4_1/Q5_1, else -bias * d), float64 [rows, blocks]."""
    nbytes = gguf.GGML_QUANT_SIZES[qtype][1]
    raw = data.reshape(rows * blocks, nbytes)
    d = raw[:, 0:2].copy().view(np.float16).astype(np.float64).reshape(rows, blocks)
    if BIAS[qtype] == 0:
        off = raw[:, 2:4].copy().view(np.float16).astype(np.float64).reshape(rows, blocks)
    else:
        off = -BIAS[qtype] * d
    return torch.from_numpy(d), torch.from_numpy(off)


@pytest.mark.parametrize("qtype", INT8_TYPES, ids=lambda t: t.name)
def test_int8_prompt_gemm_vs_float64_reference(torch_ops, qtype):
    """Error bound per output (row i, weight row r):
    - the activations' quantization, as for the decode dot (quant_dot.h):
      |x - d_x q_x| <= d_x / 2 = max|x_b| / 254 per element, times sum |w|;
    - float32 rounding: each block adds two FMAs (one rounding each) and one
      rounded product scale * d_x, and the integer sum is exact, so the
      accumulator is off by at most (2 K/32 + 4) * 2^-24 * M, where M sums the
      magnitudes of every term: |d| * u * |x'| + |offset| * |x'|, with u the
      unsigned byte and |x'| = |x| + d_x / 2 >= |d_x q_x|.
    gguf's own decode (d * q, then + m) rounds once or twice per weight; that
    is inside the same 2^-24 * M."""
    rows, bpr = 41, 18  # two panels, the second partial; k = 576
    data, k = _random_blocks(qtype, rows=rows, blocks_per_row=bpr, seed=300 + int(qtype))
    w = torch.from_numpy(gguf.quants.dequantize(data, qtype).reshape(rows, k)).double()
    d, off = _scale_offset(data, qtype, rows, bpr)
    # u = (w - offset) / d, rounded: the unsigned bytes the panels hold.
    u = ((w.view(rows, bpr, 32) - off[..., None]) / d[..., None]).round().nan_to_num(0.0)
    assert u.min() >= 0 and u.max() <= 255
    blocks = torch.from_numpy(data.copy())
    nibbles = qtype in (T.Q4_0, T.Q4_1)
    for m in (1, 2, 3, 16, 65, 70, 131):  # tiles of 4 rows, then of 2 and 1
        x = torch.randn(m, k, generator=torch.Generator().manual_seed(20 + m)) * 3
        got = torch_ops.linear_int8_panels(x, blocks, int(qtype), k, "widest", False)
        portable = torch_ops.linear_int8_panels(x, blocks, int(qtype), k, "portable", False)
        assert torch.equal(got, portable), f"m={m}: the VNNI kernel differs from the portable one"
        if nibbles:
            for isa in ("widest", "portable"):
                packed = torch_ops.linear_int8_panels(x, blocks, int(qtype), k, isa, True)
                assert torch.equal(packed, got), f"m={m} {isa}: nibbles differ from bytes"
        # A row's result does not depend on the rows computed with it.
        for i in (0, m - 1):
            alone = torch_ops.linear_int8_panels(x[i:i + 1], blocks, int(qtype), k, "widest",
                                                 False)
            assert torch.equal(alone[0], got[i]), f"m={m} row {i}"
        ref = x.double() @ w.T
        xd = x.double().view(m, bpr, 32).abs().amax(-1) / 127  # d_x [m, blocks]
        quant = (xd / 2) @ w.abs().view(rows, bpr, 32).sum(-1).T
        xa = x.double().abs().view(m, bpr, 32) + (xd / 2)[..., None]  # |x'|
        mag = torch.einsum("mbj,rbj->mr", xa, (d.abs()[..., None] * u)) + \
            torch.einsum("mb,rb->mr", xa.sum(-1), off.abs())
        rounding = (2 * k / 32 + 4) * 2.0**-24 * mag
        excess = ((got.double() - ref).abs() - quant - rounding).max().item()
        assert excess <= 0, f"m={m}: error above the bound by {excess}"
        # Not vacuous: the activations' quantization error is really there.
        assert (got.double() - ref).abs().max().item() > 1e-5


@pytest.mark.parametrize("qtype", INT8_TYPES, ids=lambda t: t.name)
def test_int8_panels_into_a_buffer_equal_a_new_tensor(torch_ops, qtype):
    """linear_int8_panels_out (a decode step's reused qkv buffer) writes every
    output with the bits of the allocating call, whatever the buffer held
    (NaN, or an earlier layer's product: nothing is added to it), and refuses
    a buffer of the wrong shape or layout."""
    rows, bpr = 41, 18
    data, k = _random_blocks(qtype, rows=rows, blocks_per_row=bpr, seed=900 + int(qtype))
    blocks = torch.from_numpy(data.copy())
    gen = torch.Generator().manual_seed(90)
    norm_weight = torch.rand(k, generator=gen) + 0.5
    for m in (1, 3, 70):
        buffer = torch.full((m, rows), float("nan"))
        for layer in range(2):
            x = torch.randn(m, k, generator=gen) * 3
            for isa in ("widest", "portable"):
                want = torch_ops.linear_int8_panels_normed(x, norm_weight, 1e-5, blocks,
                                                           int(qtype), k, isa, False)
                got = torch_ops.linear_int8_panels_normed_out(buffer, x, norm_weight, 1e-5,
                                                              blocks, int(qtype), k, isa, False)
                assert got.data_ptr() == buffer.data_ptr()
                assert torch.equal(got, want), f"m={m} layer={layer} {isa}"
    with pytest.raises(RuntimeError, match="out"):
        torch_ops.linear_int8_panels_normed_out(torch.zeros(3, rows + 1), torch.zeros(3, k),
                                                norm_weight, 1e-5, blocks, int(qtype), k,
                                                "widest", False)
    with pytest.raises(RuntimeError, match="contiguous"):
        torch_ops.linear_int8_panels_normed_out(torch.zeros(rows, 3).t(), torch.zeros(3, k),
                                                norm_weight, 1e-5, blocks, int(qtype), k,
                                                "widest", False)


@pytest.mark.parametrize("qtype", INT8_TYPES, ids=lambda t: t.name)
def test_int8_panels_add_in_place_equals_torch_add(torch_ops, qtype):
    """out += x · wᵀ in the kernel's store gives the bits of torch's
    out + linear_int8_panels(x): one float add of the finished sum, on both
    paths and layouts, at decode and prompt sizes (tiles of 4, 2 and 1 rows)."""
    rows, bpr = 41, 18
    data, k = _random_blocks(qtype, rows=rows, blocks_per_row=bpr, seed=700 + int(qtype))
    blocks = torch.from_numpy(data.copy())
    layouts = (False, True) if qtype in (T.Q4_0, T.Q4_1) else (False,)
    for m in (1, 3, 70):
        gen = torch.Generator().manual_seed(40 + m)
        x = torch.randn(m, k, generator=gen) * 3
        residual = torch.randn(m, rows, generator=gen) * 10
        for isa in ("widest", "portable"):
            for nibbles in layouts:
                product = torch_ops.linear_int8_panels(x, blocks, int(qtype), k, isa, nibbles)
                got = torch_ops.linear_int8_panels_add_(residual.clone(), x, blocks, int(qtype), k,
                                                        isa, nibbles)
                assert torch.equal(got, residual + product), f"m={m} {isa} nibbles={nibbles}"
                # Not vacuous: the residual really was added.
                assert not torch.equal(got, product)
    with pytest.raises(RuntimeError, match="out"):
        torch_ops.linear_int8_panels_add_(torch.zeros(3, rows + 1), torch.zeros(3, k), blocks,
                                          int(qtype), k, "widest", False)
    with pytest.raises(RuntimeError, match="contiguous"):
        torch_ops.linear_int8_panels_add_(torch.zeros(rows, 3).t(), torch.zeros(3, k), blocks,
                                          int(qtype), k, "widest", False)


@pytest.mark.parametrize("qtype", [T.Q4_1, T.Q8_0], ids=lambda t: t.name)
def test_row_steps_in_the_quantization_are_the_separate_passes_bits(torch_ops, qtype):
    """The decoder layer's row-wise steps taken inside the GEMM's activation
    quantization (Int8Input, kernels/prefill_gemm/prefill_gemm_int8.h) give the bits of
    the separate pass followed by the GEMM: RMSNorm before qkv and gate_up
    (rms_norm's float32 rows), the SwiGLU gate before down (silu_mul's), on
    both paths and layouts, for row counts around the 8-row groups the
    quantization makes (the rows of a parallel task end anywhere)."""
    rows, bpr = 41, 18
    data, k = _random_blocks(qtype, rows=rows, blocks_per_row=bpr, seed=900 + int(qtype))
    blocks = torch.from_numpy(data.copy())
    layouts = (False, True) if qtype == T.Q4_1 else (False,)
    eps = 1e-5
    for m in (1, 7, 9, 70, 131):
        gen = torch.Generator().manual_seed(60 + m)
        h = torch.randn(m, k, generator=gen) * 3
        norm_weight = torch.rand(k, generator=gen) + 0.5
        gate_up = torch.randn(m, 2 * k, generator=gen) * 2
        residual = torch.randn(m, rows, generator=gen) * 10
        normed = torch_ops.rms_norm(h, norm_weight, eps, False)
        gated = torch_ops.silu_mul(gate_up, False)
        for isa in ("widest", "portable"):
            for nibbles in layouts:
                got = torch_ops.linear_int8_panels_normed(h, norm_weight, eps, blocks, int(qtype),
                                                          k, isa, nibbles)
                want = torch_ops.linear_int8_panels(normed, blocks, int(qtype), k, isa, nibbles)
                assert torch.equal(got, want), f"norm m={m} {isa} nibbles={nibbles}"
                got = torch_ops.linear_int8_panels_silu_add_(residual.clone(), gate_up, blocks,
                                                             int(qtype), k, isa, nibbles)
                want = torch_ops.linear_int8_panels_add_(residual.clone(), gated, blocks,
                                                         int(qtype), k, isa, nibbles)
                assert torch.equal(got, want), f"gate m={m} {isa} nibbles={nibbles}"
        # Not vacuous: the steps change the product.
        plain = torch_ops.linear_int8_panels(h, blocks, int(qtype), k, "widest", False)
        assert not torch.equal(plain, torch_ops.linear_int8_panels_normed(
            h, norm_weight, eps, blocks, int(qtype), k, "widest", False))
    with pytest.raises(RuntimeError, match="norm_weight"):
        torch_ops.linear_int8_panels_normed(torch.zeros(3, k), torch.ones(k - 32), eps, blocks,
                                            int(qtype), k, "widest", False)
    with pytest.raises(RuntimeError, match="gate_up"):  # the gate and up: 2k columns
        torch_ops.linear_int8_panels_silu_add_(torch.zeros(3, rows), torch.zeros(3, k), blocks,
                                               int(qtype), k, "widest", False)


def test_int8_prompt_gemm_rejects_k_quants_and_bad_shapes(torch_ops):
    data, k = _random_blocks(T.Q4_K, rows=2, blocks_per_row=1, seed=1)
    with pytest.raises(RuntimeError, match="no panels for Q4_K"):
        torch_ops.linear_int8_panels(torch.zeros(70, k), torch.from_numpy(data.copy()),
                                     int(T.Q4_K), k, "widest", False)
    data, k = _random_blocks(T.Q8_0, rows=2, blocks_per_row=2, seed=1)
    with pytest.raises(RuntimeError, match="more than 4 bits"):
        torch_ops.linear_int8_panels(torch.zeros(70, k), torch.from_numpy(data.copy()),
                                     int(T.Q8_0), k, "widest", True)
    data, k = _random_blocks(T.Q4_1, rows=2, blocks_per_row=2, seed=1)
    with pytest.raises(RuntimeError, match="x"):
        torch_ops.linear_int8_panels(torch.zeros(70, k + 32), torch.from_numpy(data.copy()),
                                     int(T.Q4_1), k, "widest", False)
