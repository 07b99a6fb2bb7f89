"""kernels/paged_attention and kernels/kv_append (through torch.ops.snapserve)
against a dense reference in plain torch: the paged K/V are gathered through
the block table into contiguous tensors and attended with
torch.nn.functional.scaled_dot_product_attention in float32.

Tolerances. float32: 1e-5 absolute + relative (both sides compute float32 dot
products and a float32 softmax, differing only in summation order).
bfloat16 / float16 outputs: the inputs are the same low-precision values on both
sides and the reference computes in float32, so the extra error is the kernel
rounding each output to the input dtype: at most half an ulp of that element,
hence at most half an ulp of the row's largest |value|. Each row (one query
head of one sequence) is therefore allowed ONE ulp of its own max|want|
(2^-7 for bfloat16, 2^-10 for float16, relative to that max), twice the
rounding bound. A fixed absolute tolerance would not do: attention over 4K-8K
random values averages them down to |out| ~ 0.05, where 1e-2 absolute is a
fifth of the signal and lets a dropped last 16-token block pass.
`test_long_contexts_up_to_8192` proves the comparison can fail: dropping the
last block from the reference (and, where the output is float32, the last
token) must fail it. A dropped last token moves a bfloat16 output at 8K by
about 0.1-0.2 ulp of the row, below the rounding of the output itself, so for
bfloat16 only the float32-output path (float32 query over a bfloat16 cache)
can see it, and there it must.
"""
import math
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F

from conftest import BUILD_DIR, cuda_available

FLOAT32_TOL = 1e-5
# One ulp at 1.0 (the spacing of values in [1, 2)): 2^-(mantissa bits).
ULP = {torch.bfloat16: 2.0 ** -7, torch.float16: 2.0 ** -10}


def rows_close(got, want, dtype, ulps=1.0):
    """True when `got` matches the float32 `want` within the tolerance of the
    output dtype `dtype` (module docstring): float32 1e-5 absolute + relative;
    bfloat16/float16 `ulps` ulps of each row's max|want| (rows: the last dim)."""
    got, want = got.float().cpu(), want.float().cpu()
    if got.shape != want.shape:
        return False
    err = (got - want).abs()
    if dtype == torch.float32:
        return bool((err <= FLOAT32_TOL + FLOAT32_TOL * want.abs()).all())
    row_max = want.abs().amax(dim=-1, keepdim=True)
    return bool((err <= ulps * ULP[dtype] * row_max + 1e-30).all())


def assert_rows_close(got, want, dtype, ulps=1.0):
    if rows_close(got, want, dtype, ulps):
        return
    got, want = got.float().cpu(), want.float().cpu()
    err = (got - want).abs()
    scale = want.abs().amax(dim=-1, keepdim=True) * ULP.get(dtype, 1.0)
    worst = (err / scale).amax().item() if dtype != torch.float32 else err.amax().item()
    unit = "ulps of the row's max|want|" if dtype != torch.float32 else "absolute"
    raise AssertionError(f"{dtype}: worst error {worst:.3g} {unit} "
                         f"(allowed {ulps if dtype != torch.float32 else FLOAT32_TOL})")


def make_case(batch_lens, num_heads, num_kv_heads, head_dim, block_size, dtype, seed,
              device="cpu"):
    """Random caches and shuffled, non-contiguous block tables: sequence b's
    blocks are a slice of one random permutation of the pool."""
    gen = torch.Generator().manual_seed(seed)
    blocks_needed = [math.ceil(n / block_size) for n in batch_lens]
    num_blocks = sum(blocks_needed) + 3  # a few blocks nobody owns
    max_blocks = max(blocks_needed) + 1
    key_cache = torch.randn(num_blocks, num_kv_heads, block_size, head_dim, generator=gen)
    value_cache = torch.randn(num_blocks, num_kv_heads, block_size, head_dim, generator=gen)
    perm = torch.randperm(num_blocks, generator=gen)
    tables = torch.zeros(len(batch_lens), max_blocks, dtype=torch.int32)
    used = 0
    for b, nb in enumerate(blocks_needed):
        tables[b, :nb] = perm[used:used + nb].to(torch.int32)
        used += nb
    q = torch.randn(len(batch_lens), num_heads, head_dim, generator=gen)
    lens = torch.tensor(batch_lens, dtype=torch.int32)
    to = dict(dtype=dtype, device=device)
    return (q.to(**to), key_cache.to(**to), value_cache.to(**to), tables.to(device),
            lens.to(device))


def gather(cache, table_row, n):
    """[num_blocks, G, bs, d] + block ids -> the sequence's first n entries [G, n, d]."""
    nb = math.ceil(n / cache.shape[2])
    blocks = cache[table_row[:nb].long()]  # [nb, G, bs, d]
    return blocks.permute(1, 0, 2, 3).reshape(cache.shape[1], -1, cache.shape[3])[:, :n]


def reference(q, key_cache, value_cache, tables, lens, scale):
    out = []
    group = q.shape[1] // key_cache.shape[1]
    for b in range(q.shape[0]):
        n = int(lens[b])
        k = gather(key_cache, tables[b], n).float().repeat_interleave(group, dim=0)
        v = gather(value_cache, tables[b], n).float().repeat_interleave(group, dim=0)
        qb = q[b].float().unsqueeze(1)  # [H, 1, d]
        out.append(F.scaled_dot_product_attention(qb, k, v, scale=scale).squeeze(1))
    return torch.stack(out)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("group", [1, 2, 3, 4, 8])
def test_matches_dense_reference(torch_ops, dtype, group):
    num_kv_heads = 2
    lens = [1, 2, 15, 16, 17, 33, 250, 1000]
    q, kc, vc, tables, ctx = make_case(lens, num_kv_heads * group, num_kv_heads, 64, 16, dtype,
                                       seed=group)
    scale = 1 / 8
    got = torch_ops.paged_decode_attention(q, kc, vc, tables, ctx, scale)
    assert got.dtype == dtype and got.shape == q.shape
    want = reference(q, kc, vc, tables, ctx, scale)
    assert_rows_close(got, want, dtype)


@pytest.mark.parametrize("cache_dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("group", [1, 2, 3, 4])
def test_float32_query_over_low_precision_cache(torch_ops, cache_dtype, group):
    """A bfloat16 model computes in float32 on CPU (weight-only bfloat16):
    its float32 query reads the bfloat16 cache as is and gets a float32
    result, as exact as the float32 kernel on the widened cache values."""
    lens = [1, 17, 250, 1000]
    q, kc, vc, tables, ctx = make_case(lens, 2 * group, 2, 64, 16, cache_dtype, seed=40 + group)
    q = torch.randn(q.shape, generator=torch.Generator().manual_seed(group))  # unrounded
    got = torch_ops.paged_decode_attention(q, kc, vc, tables, ctx, 1 / 8)
    assert got.dtype == torch.float32 and got.shape == q.shape
    want = reference(q, kc, vc, tables, ctx, 1 / 8)
    assert_rows_close(got, want, torch.float32)


@pytest.mark.parametrize("cache_dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("isa", ["native", "portable"])
def test_low_precision_cache_read_in_place_equals_its_float32_copy(torch_ops, isa, cache_dtype):
    """The SIMD step reads a 16-bit cache in place, widening each row as it
    loads it; every bfloat16/float16 value is a float32, so the result must
    be the float32 kernel's on a float32 copy of the cache, bit for bit (the
    portable step widens into a buffer first: the same claim). The float32
    kernel is the one the tolerance tests above check against torch."""
    if isa == "portable":
        # The ISA is read once per process: the portable step needs its own.
        lib = BUILD_DIR / "tests" / "libsnapserve_torch_ops.so"
        code = textwrap.dedent(f"""
            import sys, torch
            sys.path.insert(0, {str(pathlib.Path(__file__).parent)!r})
            import test_paged_attention as t
            torch.ops.load_library({str(lib)!r})
            t.check_in_place_equals_copy(torch.ops.snapserve, torch.{str(cache_dtype)[6:]})
        """)
        env = dict(os.environ, SNAPSERVE_CPU_ISA="portable")
        r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr[-2000:]
        return
    check_in_place_equals_copy(torch_ops, cache_dtype)


def check_in_place_equals_copy(ops, cache_dtype):
    lens = [1, 15, 16, 17, 333, 1100]
    q, kc, vc, tables, ctx = make_case(lens, 9, 3, 64, 16, cache_dtype, seed=11)
    q = torch.randn(q.shape, generator=torch.Generator().manual_seed(5))
    got = ops.paged_decode_attention(q, kc, vc, tables, ctx, 1 / 8)
    want = ops.paged_decode_attention(q, kc.float(), vc.float(), tables, ctx, 1 / 8)
    assert torch.equal(got, want), (got - want).abs().max()


@pytest.mark.parametrize("q_dtype, cache_dtype", [
    (torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16),
    (torch.float32, torch.bfloat16)], ids=["float32", "bfloat16", "float32-over-bfloat16"])
def test_long_contexts_up_to_8192(torch_ops, q_dtype, cache_dtype):
    # SmolLM2's shape: 9 query heads over 3 KV heads, head_dim 64.
    lens = [8192, 4097, 8191, 1]
    q, kc, vc, tables, ctx = make_case(lens, 9, 3, 64, 16, cache_dtype, seed=7)
    q = q.to(q_dtype)
    got = torch_ops.paged_decode_attention(q, kc, vc, tables, ctx, 0.125)
    assert got.dtype == q_dtype
    want = reference(q, kc, vc, tables, ctx, 0.125)
    assert_rows_close(got, want, q_dtype)

    # Must-fail mutations: the same comparison against a reference that lost
    # the last 16-token block of one sequence (for 4097: its last block is one
    # token, so 16 tokens span two blocks) must fail for that sequence; where
    # the output is float32, losing only the last token must fail too.
    drops = [16] + ([1] if q_dtype == torch.float32 else [])
    for b, n in enumerate(lens):
        if n <= 16:
            continue
        for drop in drops:
            short = ctx.clone()
            short[b] = n - drop
            mutated = reference(q[b:b + 1], kc, vc, tables[b:b + 1], short[b:b + 1], 0.125)
            assert not rows_close(got[b:b + 1], mutated, q_dtype), \
                f"sequence {b} (length {n}): the comparison accepts a reference without " \
                f"its last {drop} token(s)"


@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("block_size", [16, 64])
def test_a_sequence_reads_the_same_bits_alone_in_a_batch_and_on_any_thread_count(
        torch_ops, cache_dtype, block_size):
    # The CPU kernel cuts each context into spans of about 256 keys that the
    # threads share, then merges them (kernels/paged_attention/paged_attention_cpu.cc): the
    # span ends sit at fixed positions, so a sequence's output may not depend
    # on the sequences beside it or on the thread count (the engine's
    # batching invariance rests on this). Lengths around the span ends: 255,
    # 256, 257 keys, one key, and several spans.
    lens = [700, 1, 2500, 256, 257, 255]
    q, kc, vc, tables, ctx = make_case(lens, 9, 3, 64, block_size, cache_dtype, seed=23)
    q = q.float()
    saved = torch.get_num_threads()
    try:
        outputs = []
        for threads in (1, 2):
            torch.set_num_threads(threads)
            outputs.append(torch_ops.paged_decode_attention(q, kc, vc, tables, ctx, 0.125))
            for b in range(len(lens)):
                alone = torch_ops.paged_decode_attention(q[b:b + 1], kc, vc, tables[b:b + 1],
                                                         ctx[b:b + 1], 0.125)
                assert torch.equal(alone[0], outputs[-1][b]), (threads, lens[b])
    finally:
        torch.set_num_threads(saved)
    assert torch.equal(outputs[0], outputs[1])
    assert_rows_close(outputs[1], reference(q, kc, vc, tables, ctx, 0.125), torch.float32)


@pytest.mark.parametrize("block_size,head_dim", [(1, 8), (8, 128), (32, 96), (16, 256)])
def test_other_block_sizes_and_head_dims(torch_ops, block_size, head_dim):
    lens = [1, block_size, block_size + 1, 5 * block_size + 3]
    q, kc, vc, tables, ctx = make_case(lens, 4, 2, head_dim, block_size, torch.float32, seed=3)
    scale = head_dim ** -0.5
    got = torch_ops.paged_decode_attention(q, kc, vc, tables, ctx, scale)
    torch.testing.assert_close(got, reference(q, kc, vc, tables, ctx, scale), atol=1e-5, rtol=1e-5)


def test_large_scores_stay_finite(torch_ops):
    # Scores around 1e3 overflow exp() without the running max.
    q, kc, vc, tables, ctx = make_case([300, 40], 4, 2, 32, 16, torch.float32, seed=5)
    got = torch_ops.paged_decode_attention(q * 40, kc, vc, tables, ctx, 1.0)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, reference(q * 40, kc, vc, tables, ctx, 1.0), atol=1e-5,
                               rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kv_append_then_attention_round_trip(torch_ops, dtype, device="cpu"):
    """Write whole sequences with kv_append (prefill) and then one token at a
    time (decode) into scattered blocks; attention over the cache must equal
    attention over the dense K/V that were written."""
    gen = torch.Generator().manual_seed(11)
    G, H, d, bs, num_blocks = 2, 6, 32, 4, 40
    kc = torch.zeros(num_blocks, G, bs, d, dtype=dtype, device=device)
    vc = torch.zeros_like(kc)
    free = torch.randperm(num_blocks, generator=gen).tolist()
    prompts = [3, 9, 1]
    dense_k = [torch.randn(n, G, d, generator=gen).to(dtype) for n in prompts]
    dense_v = [torch.randn(n, G, d, generator=gen).to(dtype) for n in prompts]
    tables = [[] for _ in prompts]

    def slot(b, t):
        while len(tables[b]) <= t // bs:
            tables[b].append(free.pop())
        return tables[b][t // bs] * bs + t % bs

    # Prefill: all sequences' tokens in one call, plus padding (-1) that must be skipped.
    k_all = torch.cat(dense_k + [torch.full((2, G, d), 99.0).to(dtype)])
    v_all = torch.cat(dense_v + [torch.full((2, G, d), 99.0).to(dtype)])
    slots = [slot(b, t) for b, n in enumerate(prompts) for t in range(n)] + [-1, -1]
    torch_ops.kv_append(kc, vc, k_all.to(device), v_all.to(device),
                        torch.tensor(slots, dtype=torch.int64, device=device))
    assert not (kc == 99).any()
    for step in range(6):  # decode: one token each
        k_new = torch.randn(len(prompts), G, d, generator=gen).to(dtype)
        v_new = torch.randn(len(prompts), G, d, generator=gen).to(dtype)
        slots = [slot(b, dense_k[b].shape[0]) for b in range(len(prompts))]
        torch_ops.kv_append(kc, vc, k_new.to(device), v_new.to(device),
                            torch.tensor(slots, dtype=torch.int64, device=device))
        for b in range(len(prompts)):
            dense_k[b] = torch.cat([dense_k[b], k_new[b:b + 1]])
            dense_v[b] = torch.cat([dense_v[b], v_new[b:b + 1]])
        width = max(len(t) for t in tables)
        table_t = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32)
        lens = torch.tensor([k.shape[0] for k in dense_k], dtype=torch.int32)
        q = torch.randn(len(prompts), H, d, generator=gen).to(dtype)
        got = torch_ops.paged_decode_attention(q.to(device), kc, vc, table_t.to(device),
                                               lens.to(device), d ** -0.5)
        for b in range(len(prompts)):
            k = dense_k[b].transpose(0, 1).float().repeat_interleave(H // G, dim=0)
            v = dense_v[b].transpose(0, 1).float().repeat_interleave(H // G, dim=0)
            want = F.scaled_dot_product_attention(q[b].float().unsqueeze(1), k, v,
                                                  scale=d ** -0.5).squeeze(1)
            assert_rows_close(got[b], want, dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_kv_append_rounds_float32_rows_as_torch_does(torch_ops, dtype):
    """float32 K/V rows into a 16-bit cache (the decode step's own rows):
    each entry is torch's .to(dtype) of the row, bit for bit, including
    values halfway between two 16-bit numbers (ties to even) and values past
    float16's range (inf, as .to gives)."""
    gen = torch.Generator().manual_seed(5)
    G, d, bs, num_blocks = 2, 32, 4, 6
    kc = torch.zeros(num_blocks, G, bs, d, dtype=dtype)
    vc = torch.zeros_like(kc)
    k = torch.randn(5, G, d, generator=gen) * 100
    v = torch.randn(5, G, d, generator=gen)
    # Exact ties for bfloat16 (1 + 2^-8 lies halfway between 1 and 1 + 2^-7)
    # and float16 (1 + 2^-11), and 1e6 (inf in float16).
    k[0, 0, :4] = torch.tensor([1 + 2.0**-8, 1 + 3 * 2.0**-8, 1 + 2.0**-11, 1e6])
    slots = torch.tensor([5, 0, 23, -1, 12], dtype=torch.int64)
    torch_ops.kv_append(kc, vc, k, v, slots)
    for i, slot in enumerate(slots.tolist()):
        if slot < 0:
            continue
        b, off = divmod(slot, bs)
        assert torch.equal(kc[b, :, off].view(torch.int16), k[i].to(dtype).view(torch.int16)), i
        assert torch.equal(vc[b, :, off].view(torch.int16), v[i].to(dtype).view(torch.int16)), i
    assert kc.abs().sum() > 0  # not vacuous: rows were written
    # float64 rows are not admitted (only float32 is rounded on the way).
    with pytest.raises(RuntimeError, match="k/v"):
        torch_ops.kv_append(kc, vc, k.double(), v.double(), slots)


def test_rejects_bad_inputs(torch_ops):
    q, kc, vc, tables, ctx = make_case([5], 4, 2, 16, 4, torch.float32, seed=1)
    with pytest.raises(RuntimeError, match="multiple"):
        torch_ops.paged_decode_attention(q[:, :3], kc, vc, tables, ctx, 1.0)
    with pytest.raises(RuntimeError, match="context_lens"):
        torch_ops.paged_decode_attention(q, kc, vc, tables, ctx + 100, 1.0)
    with pytest.raises(RuntimeError, match="block_tables"):
        torch_ops.paged_decode_attention(q, kc, vc, tables.long(), ctx, 1.0)
    with pytest.raises(RuntimeError, match="slot_mapping"):
        torch_ops.kv_append(kc, vc, torch.zeros(1, 2, 16), torch.zeros(1, 2, 16),
                            torch.tensor([kc.shape[0] * 4]))


# --- CUDA: the same kernels on the GPU against the CPU path -----------------

gpu = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not cuda_available(), reason="needs a CUDA device")


@gpu
@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("group", [1, 2, 3, 4, 8])
def test_cuda_matches_cpu(torch_ops, dtype, group):
    lens = [1, 16, 17, 300, 8192]
    case = make_case(lens, 2 * group, 2, 64, 16, dtype, seed=group)
    cpu_out = torch_ops.paged_decode_attention(*case, 0.125)
    gpu_case = [t.cuda() for t in case]
    gpu_out = torch_ops.paged_decode_attention(*gpu_case, 0.125)
    # Each side is within half an ulp of the reference, so within one of each other.
    assert_rows_close(gpu_out, cpu_out.float(), dtype, ulps=2.0)
    assert_rows_close(gpu_out, reference(*case, 0.125), dtype)


@gpu
@needs_cuda
@pytest.mark.parametrize("head_dim", [32, 96, 128, 256])
def test_cuda_head_dims(torch_ops, head_dim):
    case = make_case([5, 100, 1000], 8, 2, head_dim, 16, torch.float32, seed=head_dim)
    gpu_out = torch_ops.paged_decode_attention(*[t.cuda() for t in case], head_dim ** -0.5)
    torch.testing.assert_close(gpu_out.cpu(), reference(*case, head_dim ** -0.5), atol=1e-5,
                               rtol=1e-5)


@gpu
@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_kv_append_round_trip(torch_ops, dtype):
    test_kv_append_then_attention_round_trip(torch_ops, dtype, device="cuda")


# --kv-cache-dtype=int8 (kernels/kv_append/kv_append.h): rows quantized per 16 values
# with a float32 scale each.
def quantize_int8_reference(x):
    """The stated rule in numpy, independently of the kernel: per group of 16,
    s = max|x| / 127 and q = round-half-even(x * (1 / s)) in float32, clamped
    to +-127; s = 0 and q = 0 for an all-zero group."""
    import numpy as np
    g = x.numpy().astype(np.float32).reshape(*x.shape[:-1], -1, 16)
    s = (np.abs(g).max(-1) / np.float32(127)).astype(np.float32)
    with np.errstate(divide="ignore"):
        inv = np.where(s > 0, np.float32(1) / np.where(s > 0, s, 1), 0).astype(np.float32)
    q = np.clip(np.rint(g * inv[..., None]), -127, 127).astype(np.int8)
    return torch.from_numpy(q.reshape(x.shape)), torch.from_numpy(s)


def int8_cache(kc, vc, ops, seed=0):
    """kc/vc float32 [blocks, G, bs, d] written through kv_append_int8 (every
    slot): returns the int8 caches, their scales, and the values they read
    back as (float(q) * s)."""
    nb, G, bs, d = kc.shape
    k = kc.permute(0, 2, 1, 3).reshape(nb * bs, G, d).contiguous()
    v = vc.permute(0, 2, 1, 3).reshape(nb * bs, G, d).contiguous()
    slots = torch.randperm(nb * bs, generator=torch.Generator().manual_seed(seed))
    kq = torch.zeros(nb, G, bs, d, dtype=torch.int8)
    vq = torch.zeros_like(kq)
    ks = torch.zeros(nb, G, bs, d // 16)
    vs = torch.zeros_like(ks)
    ops.kv_append_int8(kq, ks, vq, vs, k[slots], v[slots], slots)
    widen = lambda q, s: (q.float().view(nb, G, bs, d // 16, 16) * s[..., None]).view(nb, G, bs, d)
    return kq, ks, vq, vs, widen(kq, ks), widen(vq, vs)


@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.bfloat16, torch.int8])
def test_kv_append_takes_strided_rows_as_they_lie(torch_ops, cache_dtype):
    """On CPU, k/v rows may lie at any token and head strides (each row's d
    values contiguous): a prompt's k is a view of its fused qkv product, and
    each KV head's rows are appended from there without a copy
    (engine/kv/paged_kv_cache.cc). The cache holds the same bits as from a
    contiguous copy of the rows."""
    gen = torch.Generator().manual_seed(9)
    T, H, G, d, bs, nb = 20, 6, 2, 32, 4, 8
    qkv = torch.randn(T, H + 2 * G, d, generator=gen)
    k, v = qkv[:, H:H + G], qkv[:, H + G:]            # [T, G, d], token stride (H + 2G) d
    assert not k.is_contiguous()
    head = (qkv[:, H + 1].unsqueeze(1), qkv[:, H + G + 1].unsqueeze(1))  # one KV head, [T, 1, d]
    slots = torch.randperm(nb * bs, generator=gen)[:T]

    def written(k_rows, v_rows):
        groups = k_rows.shape[1]
        if cache_dtype == torch.int8:
            kq = torch.zeros(nb, groups, bs, d, dtype=torch.int8)
            vq = torch.zeros_like(kq)
            ks = torch.zeros(nb, groups, bs, d // 16)
            vs = torch.zeros_like(ks)
            torch_ops.kv_append_int8(kq, ks, vq, vs, k_rows, v_rows, slots)
            return kq, ks, vq, vs
        kc = torch.zeros(nb, groups, bs, d, dtype=cache_dtype)
        vc = torch.zeros_like(kc)
        torch_ops.kv_append(kc, vc, k_rows, v_rows, slots)
        return kc, vc

    for k_rows, v_rows in ((k, v), head):
        got = written(k_rows, v_rows)
        want = written(k_rows.contiguous(), v_rows.contiguous())
        for g, w in zip(got, want):
            assert torch.equal(g, w)
        assert got[0].abs().sum() > 0  # rows were written


def test_kv_append_int8_quantizes_as_stated(torch_ops):
    gen = torch.Generator().manual_seed(3)
    kc = torch.randn(5, 3, 16, 64, generator=gen) * 4
    vc = torch.randn(5, 3, 16, 64, generator=gen)
    kc[0, 0, 0] = 0.0                       # an all-zero row: scale 0, q 0
    kc[0, 0, 1, :16] = torch.tensor([0.5] * 16) * torch.tensor([1, -1] * 8)  # ties at +-127
    vc[1, 2, 3, 5] = 1e30                   # one huge value dwarfs its group
    kq, ks, vq, vs, _, _ = int8_cache(kc, vc, torch_ops)
    for got_q, got_s, x in ((kq, ks, kc), (vq, vs, vc)):
        want_q, want_s = quantize_int8_reference(x)
        assert torch.equal(got_s, want_s)
        assert torch.equal(got_q, want_q)
    # The rounding error is at most half a step of each group's scale.
    back = (kq.float().view(5, 3, 16, 4, 16) * ks[..., None]).view_as(kc)
    assert ((back - kc).abs().view(5, 3, 16, 4, 16) <= ks[..., None] / 2 * (1 + 1e-6)).all()
    assert (ks[0, 0, 0] == 0).all() and (kq[0, 0, 0] == 0).all()


@pytest.mark.parametrize("isa", ["native", "portable"])
def test_int8_cache_read_in_place_equals_its_float32_copy(torch_ops, isa):
    """The AVX-512 group step widens int8 rows (times their scales) as it
    loads them, the portable step into a buffer; either way the result must
    be the float32 kernel's on the float32 values the cache reads back as,
    bit for bit (groups of 1, 3, 4 and 8 query heads: the AVX-512 step takes
    2-4, the others the widened path)."""
    if isa == "portable":
        lib = BUILD_DIR / "tests" / "libsnapserve_torch_ops.so"
        code = textwrap.dedent(f"""
            import sys, torch
            sys.path.insert(0, {str(pathlib.Path(__file__).parent)!r})
            import test_paged_attention as t
            torch.ops.load_library({str(lib)!r})
            t.check_int8_equals_copy(torch.ops.snapserve)
        """)
        env = dict(os.environ, SNAPSERVE_CPU_ISA="portable")
        r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr[-2000:]
        return
    check_int8_equals_copy(torch_ops)


def check_int8_equals_copy(ops):
    lens = [1, 15, 16, 17, 333, 1100]
    for heads in (3, 9, 12, 24):
        q, kc, vc, tables, ctx = make_case(lens, heads, 3, 64, 16, torch.float32, seed=heads)
        kq, ks, vq, vs, kf, vf = int8_cache(kc, vc, ops, seed=heads)
        got = ops.paged_decode_attention_int8(q, kq, ks, vq, vs, tables, ctx, 1 / 8)
        want = ops.paged_decode_attention(q, kf, vf, tables, ctx, 1 / 8)
        assert torch.equal(got, want), (heads, (got - want).abs().max())
        # Not vacuous: the int8 values differ from the float32 ones they came from.
        assert not torch.equal(want, ops.paged_decode_attention(q, kc, vc, tables, ctx, 1 / 8))


def test_int8_cache_rejects_bad_inputs(torch_ops):
    q, kc, vc, tables, ctx = make_case([20], 9, 3, 64, 16, torch.float32, seed=1)
    kq, ks, vq, vs, _, _ = int8_cache(kc, vc, torch_ops)
    with pytest.raises(RuntimeError, match="needs key_scales"):
        torch_ops.paged_decode_attention(q, kq, vq, tables, ctx, 1 / 8)
    with pytest.raises(RuntimeError, match="key_scales"):
        torch_ops.paged_decode_attention_int8(q, kq, ks[..., :2], vq, vs, tables, ctx, 1 / 8)
    with pytest.raises(RuntimeError, match="float32 q"):
        torch_ops.paged_decode_attention_int8(q.bfloat16(), kq, ks, vq, vs, tables, ctx, 1 / 8)
    with pytest.raises(RuntimeError, match="k/v: expected float32"):
        torch_ops.kv_append_int8(kq, ks, vq, vs, torch.zeros(1, 3, 64).bfloat16(),
                                 torch.zeros(1, 3, 64).bfloat16(), torch.zeros(1).long())
    with pytest.raises(RuntimeError, match="past the cache"):
        torch_ops.kv_append_int8(kq, ks, vq, vs, torch.zeros(1, 3, 64), torch.zeros(1, 3, 64),
                                 torch.tensor([10**6]))
