"""SnapKV as docs/snapkv.md states it, written from the spec text in plain numpy.

Deliberately straightforward, not fast: a full softmax with an explicit causal
mask, one query head at a time, and a stable argsort for "ties keep the lower
position". It shares no code with kernels/snapkv_select*.

All arithmetic is float32 (the spec's float32 softmax); bfloat16/float16 inputs
are upcast to float32 first, exactly as the C++ code does.
"""
import numpy as np

POOLINGS = ("max", "avg")
GROUP_REDUCES = ("mean", "max")


def to_f32(x):
    """numpy float32 copy of an array or a torch tensor (any float dtype/device)."""
    if hasattr(x, "detach"):  # torch tensor; numpy has no bfloat16
        import torch
        return x.detach().to(device="cpu", dtype=torch.float32).numpy()
    return np.asarray(x, dtype=np.float32)


def check_params(n, window, capacity, kernel_size, pooling="max", group_reduce="mean"):
    """Raises ValueError for parameters docs/snapkv.md does not define."""
    if window < 1:
        raise ValueError(f"window must be at least 1, got {window}")
    if kernel_size < 1 or kernel_size % 2 == 0:
        raise ValueError(f"kernel_size must be odd and positive, got {kernel_size}")
    if window >= capacity:
        raise ValueError(f"window must be less than capacity ({window} >= {capacity})")
    if capacity >= n:
        raise ValueError(f"capacity must be less than n ({capacity} >= {n})")
    if pooling not in POOLINGS:
        raise ValueError(f"pooling must be one of {POOLINGS}, got {pooling!r}")
    if group_reduce not in GROUP_REDUCES:
        raise ValueError(f"group_reduce must be one of {GROUP_REDUCES}, got {group_reduce!r}")


def head_window_scores(q_head, k_head):
    """Steps 3-4 for one query head.

    q_head: [w, d] queries of the last w positions; k_head: [n, d] keys.
    Returns [n - w]: the attention each prefix position receives, summed over
    the w window rows.
    """
    w, d = q_head.shape
    n = k_head.shape[0]
    logits = (q_head @ k_head.T) / np.float32(np.sqrt(d))  # [w, n]
    # Window row i is prompt position n-w+i: it sees keys 0 .. n-w+i.
    row_pos = (n - w) + np.arange(w)[:, None]
    key_pos = np.arange(n)[None, :]
    logits = np.where(key_pos <= row_pos, logits, np.float32(-np.inf))
    logits = logits - logits.max(axis=1, keepdims=True)
    e = np.exp(logits)
    attn = e / e.sum(axis=1, keepdims=True)
    return attn[:, : n - w].sum(axis=0)


def group_scores(q_window, keys, group_reduce="mean"):
    """Steps 3-5: [num_kv_heads, n - w] float32 scores before pooling."""
    q = to_f32(q_window)
    k = to_f32(keys)
    num_heads, w, _ = q.shape
    num_kv_heads, n, _ = k.shape
    assert num_heads % num_kv_heads == 0, "num_heads must be a multiple of num_kv_heads"
    group = num_heads // num_kv_heads
    out = np.empty((num_kv_heads, n - w), dtype=np.float32)
    for g in range(num_kv_heads):
        # Heads g*G .. g*G+G-1 share KV head g (transformers' repeat_kv order).
        per_head = np.stack(
            [head_window_scores(q[h], k[g]) for h in range(g * group, (g + 1) * group)])
        out[g] = per_head.mean(axis=0) if group_reduce == "mean" else per_head.max(axis=0)
    return out


def pool1d(scores, kernel_size, pooling):
    """Step 6: stride 1, padding k//2; avg divides by k, padded positions count 0."""
    r = kernel_size // 2
    fill = 0.0 if pooling == "avg" else -np.inf
    padded = np.pad(scores, [(0, 0)] * (scores.ndim - 1) + [(r, r)], constant_values=fill)
    windows = np.lib.stride_tricks.sliding_window_view(padded, kernel_size, axis=-1)
    if pooling == "avg":
        return (windows.sum(axis=-1) / np.float32(kernel_size)).astype(np.float32)
    return windows.max(axis=-1).astype(np.float32)


def pooled_scores(q_window, keys, kernel_size, pooling, group_reduce="mean"):
    """Steps 3-6: [num_kv_heads, n - w] float32, the scores top-k ranks."""
    return pool1d(group_scores(q_window, keys, group_reduce), kernel_size, pooling)


def top_positions(pooled, n, window, capacity):
    """Step 7 from pooled scores [num_kv_heads, n - w]: [num_kv_heads, capacity]
    int64, the best capacity - w prefix positions then the window, increasing."""
    prefix = n - window
    rows = []
    for p in pooled:
        # Stable sort of -score: higher score first, equal scores by position.
        best = np.argsort(-p, kind="stable")[: capacity - window]
        rows.append(np.concatenate([np.sort(best), np.arange(prefix, n)]))
    return np.stack(rows).astype(np.int64)


def select_positions(q_window, keys, window, capacity, kernel_size, pooling="max",
                     group_reduce="mean"):
    """Steps 2-7: [num_kv_heads, capacity] int64 kept positions, increasing."""
    n = keys.shape[1]
    check_params(n, window, capacity, kernel_size, pooling, group_reduce)
    assert q_window.shape[1] == window, "q_window must hold exactly `window` rows"
    pooled = pooled_scores(q_window, keys, kernel_size, pooling, group_reduce)
    return top_positions(pooled, n, window, capacity)


def compress_layer(queries, keys, values, window, capacity, kernel_size, pooling="max",
                   group_reduce="mean"):
    """What one layer caches for decoding after SnapKV (steps 1-7).

    queries: [num_heads, n, d] post-RoPE queries of the whole prompt;
    keys, values: [num_kv_heads, n, d] post-RoPE keys and values.
    Returns (kept_keys, kept_values, positions) with positions
    [num_kv_heads, min(n, capacity)]; kept entries keep the input's type and
    dtype (numpy arrays or torch tensors).
    """
    num_kv_heads, n = keys.shape[0], keys.shape[1]
    if n <= capacity:  # step 1: nothing to drop
        return keys, values, np.tile(np.arange(n, dtype=np.int64), (num_kv_heads, 1))
    positions = select_positions(queries[:, n - window:, :], keys, window, capacity,
                                 kernel_size, pooling, group_reduce)
    heads = np.arange(num_kv_heads)[:, None]
    if hasattr(keys, "detach"):
        import torch
        idx = torch.from_numpy(positions).to(keys.device)
        heads_t = torch.arange(num_kv_heads, device=keys.device)[:, None]
        return keys[heads_t, idx], values[heads_t, idx], positions
    return keys[heads, positions], values[heads, positions], positions
