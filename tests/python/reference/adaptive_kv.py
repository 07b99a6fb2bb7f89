"""PyramidKV (arXiv 2406.02069) and AdaKV (arXiv 2407.11550) on a prompt, as
docs/compression-policies.md states them, in plain Python and numpy. Both rank
SnapKV's pooled scores (tests/python/reference/snapkv.py); only the budgets
differ. Shares no code with engine/compress/.

Positions come back as, per layer, a list of per-KV-head int64 arrays
(increasing, the observation window last): AdaKV's heads keep different
counts, so a layer is not always a rectangle.
"""
import math

import numpy as np

from . import snapkv as ref


def pyramid_budgets(n, num_layers, capacity, window, beta):
    """Entries each KV head of layer 0 .. L-1 keeps (window included), for a
    prompt of n > capacity tokens: a straight line from the first layer to
    the last whose mean is C and whose last layer keeps C / beta, capped so
    layer 0 keeps at most n - w; halves round to even (Python's round); C in
    every layer when no such line fits above the window."""
    last = capacity / beta
    first = 2 * capacity - last
    if first >= n - window:
        first = n - window
        last = 2 * capacity - first
    if num_layers < 2 or not (n >= first >= last >= window):
        return [capacity] * num_layers
    step = (first - last) / (num_layers - 1)
    return [round(first - layer * step) for layer in range(num_layers)]


def pyramid_positions(q_window, keys, window, capacity, kernel_size, pooling):
    """One layer's SnapKV selection with `capacity` = the layer's budget;
    a budget of the window alone keeps only the window."""
    n = keys.shape[1]
    pooled = ref.pooled_scores(q_window, keys, kernel_size, pooling)
    if capacity == window:
        return [np.arange(n - window, n, dtype=np.int64) for _ in range(keys.shape[0])]
    return list(ref.top_positions(pooled, n, window, capacity))


def adakv_head_floor(capacity, window, alpha):
    """Entries every head keeps at least: floor(alpha * C), never below w."""
    return min(capacity, max(math.floor(alpha * capacity), window))


def adakv_positions(q_window, keys, window, capacity, kernel_size, pooling, alpha):
    """One layer's AdaKV selection: each head its window and its best
    floor - w prefix positions, then the best remaining (head, position)
    pairs of the whole layer until the layer holds heads * C entries. Ties:
    lower head, then lower position; NaN ranks last."""
    heads, n = keys.shape[0], keys.shape[1]
    prefix = n - window
    pooled = ref.pooled_scores(q_window, keys, kernel_size, pooling).astype(np.float64)
    pooled = np.where(np.isnan(pooled), -np.inf, pooled)
    floor_prefix = min(capacity - window, max(0, adakv_head_floor(capacity, window, alpha) - window))
    kept = [set() for _ in range(heads)]
    for g in range(heads):
        order = np.argsort(-pooled[g], kind="stable")
        kept[g].update(int(j) for j in order[:floor_prefix])
    # Everything not yet kept, best first; (head, position) order breaks ties.
    rest = [(-pooled[g][j], g, j) for g in range(heads) for j in range(prefix)
            if j not in kept[g]]
    rest.sort()
    for _, g, j in rest[:heads * (capacity - window) - heads * floor_prefix]:
        kept[g].add(j)
    return [np.asarray(sorted(k) + list(range(prefix, n)), dtype=np.int64) for k in kept]
