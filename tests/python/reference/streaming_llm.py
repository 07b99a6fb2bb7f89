"""StreamingLLM (arXiv 2309.17453) on a prompt, as docs/compression-policies.md
states it, written from the spec text: keep the first `sink_tokens` positions
and the most recent C - sink_tokens, the same for every layer and KV head; a
prompt of at most C positions keeps everything. Shares no code with
engine/compress/streaming_llm_selector.cc.
"""
import numpy as np


def select_positions(n, capacity, sink_tokens, num_kv_heads=1):
    """[num_kv_heads, kept] int64 increasing prompt positions out of n."""
    if not 0 <= sink_tokens < capacity:
        raise ValueError(f"need 0 <= sink_tokens < capacity, got {sink_tokens}, {capacity}")
    if n <= capacity:
        kept = list(range(n))
    else:
        recent = capacity - sink_tokens
        kept = list(range(sink_tokens)) + list(range(n - recent, n))
    return np.tile(np.asarray(kept, dtype=np.int64), (num_kv_heads, 1))
