"""The fused CUDA kernels (kernels/fused/fused_cuda.h, through torch.ops.snapserve.cuda_*)
against float64 references computed here in plain torch on the CPU: RMSNorm
with the residual add, RoPE on q and k in place, the SwiGLU gate, the KV
append into the paged cache's lanes, and the split-context paged decode
attention.

Inputs are random and fresh on every run: the seed is printed (pytest shows
it with a failure) and SNAPSERVE_TEST_SEED=<n> repeats a run. Every output
is filled with NaN before the call, so an element a kernel leaves unwritten
fails, and every comparison is `error <= tolerance`, which NaN never passes.

Tolerances, per element, from what each side rounds (U: the output dtype's
unit roundoff, 2^-24 / 2^-8 / 2^-11 for float32 / bfloat16 / float16):
- RMSNorm: the kernel rounds x * r and then weight * that to the dtype (as
  LlamaRMSNorm in that dtype does): 2U relative, plus 1e-5 relative for the
  float32 sum of squares (a few thousand terms);
- RoPE: one rounding to the dtype (U relative) plus 4e-7 (|x_i| + |x_{i+d/2}|)
  for float32 sin/cos (CUDA: 2 ulp) and the two products;
- SwiGLU: U relative plus 1e-6 relative (expf, the add, divide and multiply);
- KV append: a copy, so bit for bit, and every slot not written unchanged;
- attention: U relative for the output's rounding plus 5e-5 * sum_i p_i |v_i|
  for float32 scores, softmax and accumulation over up to 40K entries (the
  partitions' merge adds up to a few hundred terms in sequence).
float16 also gets its smallest subnormal step (2^-24) absolute, where a
relative bound means nothing. Each test also shows that its comparison can
fail: a reference with one plausible mistake (delta not added, the next
position, gate and up swapped, the last block dropped) must be rejected.
"""
import math
import os
import zlib

import pytest
import torch

from conftest import cuda_available

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
UNIT_ROUNDOFF = {torch.float32: 2.0 ** -24, torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11}
ABSOLUTE = {torch.float32: 0.0, torch.bfloat16: 0.0, torch.float16: 2.0 ** -24}
BASE_SEED = (int(os.environ.get("SNAPSERVE_TEST_SEED", "0"))
             or int.from_bytes(os.urandom(4), "little"))

gpu = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not cuda_available(), reason="needs a CUDA device")


@pytest.fixture
def gen(request):
    """A generator seeded from this run's seed and the test's id (printed)."""
    seed = (BASE_SEED + zlib.crc32(request.node.nodeid.encode())) % (2 ** 63)
    print(f"seed {seed} (SNAPSERVE_TEST_SEED={BASE_SEED} repeats this run)")
    return torch.Generator().manual_seed(seed)


def nan_like(shape, dtype):
    return torch.full(shape, float("nan"), dtype=dtype, device="cuda")


def within(got, want, tol):
    """Element-wise |got - want| <= tol in float64 (False wherever got is NaN)."""
    err = (got.detach().cpu().double() - want).abs()
    return bool((err <= tol).all())


def assert_within(got, want, tol, what):
    got64 = got.detach().cpu().double()
    assert got64.shape == want.shape, f"{what}: shape {tuple(got64.shape)} != {tuple(want.shape)}"
    err = (got64 - want).abs()
    bad = ~(err <= tol)
    if bad.any():
        idx = tuple(int(i) for i in bad.nonzero()[0])
        raise AssertionError(
            f"{what}: {int(bad.sum())} of {bad.numel()} elements outside tolerance; "
            f"first at {idx}: got {got64[idx].item()!r}, want {want[idx].item()!r}, "
            f"tolerance {tol[idx].item():.3g}")


# --- RMSNorm with the residual add ------------------------------------------

def rms_reference(x, weight, eps):
    x = x.double()
    return weight.double() * (x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps))


@gpu
@needs_cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,n", [(1, 64), (3, 576), (16, 4096), (5, 100), (2, 8192 + 37)])
@pytest.mark.parametrize("with_delta", [True, False])
def test_rms_norm_add(torch_ops, gen, dtype, rows, n, with_delta):
    eps = 1e-5
    # The residual is a column slice of a wider buffer (a row stride above n);
    # the columns past n must come back untouched.
    full = torch.randn(rows, n + 8, generator=gen) * 3
    delta = (torch.randn(rows, n, generator=gen) * 2).to(dtype)
    weight = (1 + 0.25 * torch.randn(n, generator=gen)).to(dtype)
    full_dev = full.cuda()
    residual = full_dev[:, :n]
    out = nan_like((rows, n), dtype)
    torch_ops.cuda_rms_norm_add_(residual, delta.cuda() if with_delta else None, weight.cuda(),
                                 eps, out)
    x = full[:, :n] + delta.float() if with_delta else full[:, :n]  # float32, as the kernel adds
    got_full = full_dev.cpu()
    assert torch.equal(got_full[:, :n], x), "residual + delta (float32) is not what was stored"
    assert torch.equal(got_full[:, n:], full[:, n:]), "columns past n were written"
    want = rms_reference(x, weight, eps)
    tol = want.abs() * (2 * UNIT_ROUNDOFF[dtype] + 1e-5) + ABSOLUTE[dtype]
    assert_within(out, want, tol, f"rms_norm_add {dtype}")
    if with_delta:
        assert not within(out, rms_reference(full[:, :n], weight, eps), tol), \
            "the comparison cannot tell a kernel that ignores delta"


# --- RoPE on q and k in place -------------------------------------------------

def inv_freq_of(head_dim, theta=500000.0):
    """engine/model/rope.cc's RopeInvFreq without scaling (float32)."""
    exponent = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
    return torch.reciprocal(torch.pow(torch.tensor(theta, dtype=torch.float32), exponent))


def rope_reference(x, positions, inv_freq):
    """x [t, heads, d] rotated in float64; the angle is the float32 product
    float(position) * inv_freq, as transformers and the kernel form it."""
    half = x.shape[-1] // 2
    angle = (positions.float()[:, None] * inv_freq[None, :]).double()[:, None, :]
    c, s = torch.cos(angle), torch.sin(angle)
    x0, x1 = x[..., :half].double(), x[..., half:].double()
    size = torch.cat([x0.abs() + x1.abs()] * 2, -1)
    return torch.cat([x0 * c - x1 * s, x1 * c + x0 * s], -1), size


@gpu
@needs_cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tokens,heads,kv_heads,head_dim",
                         [(1, 32, 8, 128), (5, 9, 3, 64), (64, 4, 2, 256), (3, 2, 1, 80)])
def test_rope_qk_in_place(torch_ops, gen, dtype, tokens, heads, kv_heads, head_dim):
    width = heads + 2 * kv_heads
    qkv = torch.randn(tokens, width, head_dim, generator=gen).to(dtype)
    positions = torch.randint(0, 40000, (tokens,), generator=gen)
    positions[0] = 0
    inv_freq = inv_freq_of(head_dim)
    dev = qkv.cuda()
    rotated = heads + kv_heads
    torch_ops.cuda_rope_qk_(dev[:, :rotated], positions.cuda(), inv_freq.cuda())
    got = dev.cpu()
    assert torch.equal(got[:, rotated:], qkv[:, rotated:]), "the v heads were written"
    want, size = rope_reference(qkv[:, :rotated], positions, inv_freq)
    tol = want.abs() * UNIT_ROUNDOFF[dtype] + 4e-7 * size + ABSOLUTE[dtype]
    assert_within(got[:, :rotated], want, tol, f"rope {dtype}")
    wrong, _ = rope_reference(qkv[:, :rotated], positions + 1, inv_freq)
    assert not within(got[:, :rotated], wrong, tol), "the comparison cannot tell the next position"


# --- SwiGLU gate ----------------------------------------------------------------

def silu_mul_reference(gate, up):
    g, u = gate.double(), up.double()
    return g / (1 + torch.exp(-g)) * u


@gpu
@needs_cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,inter", [(1, 64), (4, 1000), (16, 14336), (3, 8192)])
def test_silu_mul(torch_ops, gen, dtype, rows, inter):
    # gate_up is a column slice of a wider buffer: a row stride above 2 * inter.
    full = (torch.randn(rows, 2 * inter + 16, generator=gen) * 3).to(dtype)
    gate_up = full[:, :2 * inter]
    out = nan_like((rows, inter), dtype)
    torch_ops.cuda_silu_mul_out(full.cuda()[:, :2 * inter], out)
    want = silu_mul_reference(gate_up[:, :inter], gate_up[:, inter:])
    tol = want.abs() * (UNIT_ROUNDOFF[dtype] + 1e-6) + ABSOLUTE[dtype]
    assert_within(out, want, tol, f"silu_mul {dtype}")
    swapped = silu_mul_reference(gate_up[:, inter:], gate_up[:, :inter])
    assert not within(out, swapped, tol), "the comparison cannot tell gate from up"


# --- KV append into the lanes ----------------------------------------------------

@gpu
@needs_cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tokens,heads,kv_heads,head_dim,block_size",
                         [(1, 32, 8, 128, 16), (7, 6, 3, 64, 16), (4, 4, 2, 72, 5),
                          (3, 2, 1, 36, 16), (2, 3, 1, 18, 4)])
def test_kv_append_lanes(torch_ops, gen, dtype, tokens, heads, kv_heads, head_dim, block_size):
    """K and V rows read where the qkv product leaves them (strided views) land
    bit for bit in their lane slots; padding slots (-1) and every other slot
    keep the cache's previous (random) contents. Head sizes cover the 16-byte
    and the element-wise copy."""
    width = heads + 2 * kv_heads
    qkv = torch.randn(tokens, width, head_dim, generator=gen).to(dtype)
    rows = tokens * kv_heads
    num_blocks = rows + 3
    key_cache = torch.randn(num_blocks, 1, block_size, head_dim, generator=gen).to(dtype)
    value_cache = torch.randn(num_blocks, 1, block_size, head_dim, generator=gen).to(dtype)
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:rows].reshape(tokens, kv_heads)
    if rows > 1:
        slots[0, 0] = -1  # a padding row
    dev = qkv.cuda()
    k_dev, v_dev = dev[:, heads:heads + kv_heads], dev[:, heads + kv_heads:]
    kc, vc = key_cache.cuda(), value_cache.cuda()
    torch_ops.cuda_kv_append_lanes(kc, vc, k_dev, v_dev, slots.cuda())
    want_k = key_cache.clone().view(-1, head_dim)
    want_v = value_cache.clone().view(-1, head_dim)
    for t in range(tokens):
        for g in range(kv_heads):
            s = int(slots[t, g])
            if s >= 0:
                want_k[s] = qkv[t, heads + g]
                want_v[s] = qkv[t, heads + kv_heads + g]
    assert torch.equal(kc.cpu().view(-1, head_dim), want_k), "key cache differs"
    assert torch.equal(vc.cpu().view(-1, head_dim), want_v), "value cache differs"


# --- split-context paged decode attention ----------------------------------------

def paged_case(gen, lens, num_heads, num_kv_heads, head_dim, block_size, dtype, spare_column=True):
    """Random caches and block tables: each sequence's blocks are a slice of
    one random permutation of the pool (so never contiguous), with spare
    blocks nobody owns and, unless spare_column is False, one table column
    more than the longest sequence needs."""
    blocks_needed = [max(1, math.ceil(n / block_size)) for n in lens]
    num_blocks = sum(blocks_needed) + 3
    max_blocks = max(blocks_needed) + (1 if spare_column else 0)
    kc = torch.randn(num_blocks, num_kv_heads, block_size, head_dim, generator=gen).to(dtype)
    vc = torch.randn(num_blocks, num_kv_heads, block_size, head_dim, generator=gen).to(dtype)
    perm = torch.randperm(num_blocks, generator=gen)
    tables = torch.zeros(len(lens), max_blocks, dtype=torch.int32)
    used = 0
    for b, nb in enumerate(blocks_needed):
        tables[b, :nb] = perm[used:used + nb].to(torch.int32)
        used += nb
    q = torch.randn(len(lens), num_heads, head_dim, generator=gen).to(dtype)
    return q, kc, vc, tables, torch.tensor(lens, dtype=torch.int32)


def attention_reference(q, kc, vc, tables, lens, scale, drop_last=0):
    """Gather each sequence's entries through its table, then softmax(q k^T *
    scale) v in float64. Returns the output and sum_i p_i |v_i| (the scale of
    the float32 error). drop_last leaves that many final entries out of every
    sequence longer than it (to show the comparison fails then)."""
    batch, num_heads, d = q.shape
    num_kv_heads, block_size = kc.shape[1], kc.shape[2]
    group = num_heads // num_kv_heads
    out = torch.zeros(batch, num_heads, d, dtype=torch.float64)
    size = torch.zeros(batch, num_heads, d, dtype=torch.float64)
    for b in range(batch):
        n = int(lens[b])
        if n > drop_last:
            n -= drop_last
        if n == 0:
            continue
        nb = math.ceil(n / block_size)
        ids = tables[b, :nb].long()

        def gather(cache):
            return cache[ids].double().permute(1, 0, 2, 3).reshape(num_kv_heads, -1, d)[:, :n]

        k, v = gather(kc), gather(vc)
        qb = q[b].double().view(num_kv_heads, group, d)
        p = torch.softmax(torch.einsum("gqd,gnd->gqn", qb, k) * scale, dim=-1)
        out[b] = torch.einsum("gqn,gnd->gqd", p, v).reshape(num_heads, d)
        size[b] = torch.einsum("gqn,gnd->gqd", p, v.abs()).reshape(num_heads, d)
    return out, size


def attention_tolerance(want, size, dtype):
    return want.abs() * UNIT_ROUNDOFF[dtype] + 5e-5 * size + ABSOLUTE[dtype]


def run_split(torch_ops, case, scale, partition=0):
    q, kc, vc, tables, lens = (t.cuda() for t in case)
    out = nan_like(tuple(q.shape), q.dtype)
    splits = torch_ops.cuda_split_decode_attention(out, q, kc, vc, tables, lens, scale, partition)
    return out, splits


def random_lengths(gen, block_size, longest=40000):
    """1, a length below a block, an exact multiple of the block size, and
    random lengths up to `longest` (one of them in its top quarter, not a
    multiple of the block size)."""
    def rand(lo, hi):
        return int(torch.randint(lo, hi + 1, (1,), generator=gen))
    lens = [1, rand(2, block_size - 1) if block_size > 2 else 2,
            block_size * rand(1, 64), rand(1, longest), rand(1, longest)]
    long = rand(longest * 3 // 4, longest)
    lens.append(long + 1 if long % block_size == 0 else long)
    return lens


@gpu
@needs_cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("group", [1, 3, 4, 8, 16])
def test_split_attention_long_random_contexts(torch_ops, gen, dtype, group):
    """Lengths 1 .. 40K, GQA groups of 1-16 query heads (16: two thread
    blocks per KV head), the plan's own partition size."""
    num_kv_heads, head_dim, block_size = 2, 128, 16
    lens = random_lengths(gen, block_size)
    print(f"lengths {lens}")
    case = paged_case(gen, lens, num_kv_heads * group, num_kv_heads, head_dim, block_size, dtype)
    scale = head_dim ** -0.5
    out, splits = run_split(torch_ops, case, scale)
    assert splits > 1, "a 30K+ context must be split"
    want, size = attention_reference(*case, scale)
    tol = attention_tolerance(want, size, dtype)
    assert_within(out, want, tol, f"split attention {dtype} group {group}")
    wrong, _ = attention_reference(*case, scale, drop_last=block_size)
    assert not within(out, wrong, tol), "the comparison cannot tell a dropped last block"


@gpu
@needs_cuda
@pytest.mark.parametrize("partition", [64, 128, 256, 512])
def test_split_attention_every_partition_size(torch_ops, gen, partition):
    """Every partition size the plan can pick, on the same random case, with
    an empty context (zeros) among the sequences."""
    block_size = 16
    lens = random_lengths(gen, block_size, longest=20000) + [0]
    case = paged_case(gen, lens, 8, 2, 128, block_size, torch.bfloat16)
    scale = 128 ** -0.5
    out, splits = run_split(torch_ops, case, scale, partition)
    assert splits == math.ceil(case[3].shape[1] * block_size / partition)
    want, size = attention_reference(*case, scale)
    assert_within(out, want, attention_tolerance(want, size, torch.bfloat16),
                  f"split attention, partition {partition}")
    assert torch.equal(out[-1].cpu(), torch.zeros_like(out[-1].cpu())), \
        "an empty context must give zeros"


@gpu
@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("head_dim", [16, 64, 80, 96, 128, 256])
@pytest.mark.parametrize("block_size", [1, 7, 16, 32])
def test_split_attention_shapes(torch_ops, gen, dtype, head_dim, block_size):
    """Head sizes that leave threads idle (80, 96), block sizes that do not
    divide a partition (7) or are one entry, through both the one-partition
    path (no merge) and the merged one, which must agree with the reference
    and so with each other."""
    # The table is as wide as the longest sequence needs, at most 448
    # entries whatever the block size, so 512-entry partitions leave one.
    lens = [1, 5, 63, 64, 65, 300, 447, 448]
    case = paged_case(gen, lens, 6, 3, head_dim, block_size, dtype, spare_column=False)
    scale = head_dim ** -0.5
    want, size = attention_reference(*case, scale)
    tol = attention_tolerance(want, size, dtype)
    max_context = case[3].shape[1] * block_size
    assert max_context <= 512
    for partition in (512, 64):
        out, splits = run_split(torch_ops, case, scale, partition)
        assert splits == (1 if partition == 512 else math.ceil(max_context / partition))
        assert_within(out, want, tol, f"head_dim {head_dim}, block {block_size}, "
                                      f"partition {partition} ({splits} splits)")


@gpu
@needs_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_split_attention_lane_layout(torch_ops, gen, dtype):
    """The paged cache's own layout (engine/kv/paged_kv_cache.h): one KV head
    per block, each (sequence, KV head) lane a row of its own length, and the
    GQA group's query heads that row's heads. Lanes of one sequence hold
    different lengths, as after AdaKV's per-head budgets."""
    group, head_dim, block_size = 4, 128, 16
    lens = [int(n) for n in torch.randint(1, 9000, (16,), generator=gen)]
    case = paged_case(gen, lens, group, 1, head_dim, block_size, dtype)
    scale = head_dim ** -0.5
    out, _ = run_split(torch_ops, case, scale)
    want, size = attention_reference(*case, scale)
    assert_within(out, want, attention_tolerance(want, size, dtype), f"lane layout {dtype}")


@gpu
@needs_cuda
def test_split_attention_agrees_with_the_first_cuda_kernel(torch_ops, gen):
    """The one-block-per-head kernel (kernels/paged_attention/paged_attention_cuda.cu) on the
    same input: both within rounding of the reference, so within two output
    ulps of each other."""
    lens = random_lengths(gen, 16, longest=8000)
    case = paged_case(gen, lens, 16, 4, 128, 16, torch.bfloat16)
    out, _ = run_split(torch_ops, case, 0.125)
    first = torch_ops.paged_decode_attention(*(t.cuda() for t in case), 0.125)
    want, size = attention_reference(*case, 0.125)
    tol = 2 * attention_tolerance(want, size, torch.bfloat16)
    assert_within(out, first.cpu().double(), tol, "split vs first CUDA kernel")


def test_fused_ops_reject_cpu_tensors(torch_ops):
    """The ops check their tensors before any launch: CPU tensors are refused
    with the argument's name (runs without a GPU too)."""
    x = torch.zeros(2, 64)
    with pytest.raises(RuntimeError, match="residual: expected a CUDA tensor|no CUDA"):
        torch_ops.cuda_rms_norm_add_(x, None, torch.ones(64), 1e-5, torch.zeros(2, 64))
    with pytest.raises(RuntimeError, match="gate_up: expected a CUDA tensor|no CUDA"):
        torch_ops.cuda_silu_mul_out(x, torch.zeros(2, 32))
    q, kc, vc, tables, lens = paged_case(torch.Generator().manual_seed(0), [3], 4, 2, 64, 16,
                                         torch.float32)
    with pytest.raises(RuntimeError, match="q: expected a CUDA tensor|no CUDA"):
        torch_ops.cuda_split_decode_attention(torch.zeros_like(q), q, kc, vc, tables, lens, 1.0, 0)


# --- the decode step through the paged cache, kernels wired in -------------------

PAGED_SPEC = "synthetic:smollm2-135m?format=f32&seed=3"


@pytest.mark.parametrize("device", [
    "cpu", pytest.param("cuda", marks=[gpu, needs_cuda])])
def test_paged_decode_matches_prefill(torch_ops, gen, device):
    """Teacher-forced float32 decode steps through the server's paged cache on
    `device` (on CUDA: RMSNorm, RoPE, SwiGLU, the lane append and the split
    attention of this file, engine/kv/paged_kv_cache.cc) predict what a CPU
    float32 prefill of the same ids predicts, position by position, within
    1e-3 of the largest logit (float32 sums in another order; the model is
    random, 30 layers). The same logits one position off must fail."""
    ids = torch.randint(0, 32000, (300,), generator=gen).tolist()
    start = 270
    got = torch_ops.paged_decode_logits_on(PAGED_SPEC, "float32", device, ids, start)
    prefill = torch_ops.model_logits_on(PAGED_SPEC, "float32", "cpu", ids).double()
    want = prefill[start - 1:len(ids) - 1]
    tol = torch.full_like(want, 1e-3 * want.abs().max().item())
    assert_within(got, want, tol, f"paged decode on {device}")
    assert not within(got, prefill[start - 2:len(ids) - 2], tol), \
        "the comparison cannot tell the next position's logits"
