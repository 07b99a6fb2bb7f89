// KeyDiff (arXiv 2504.15364) applied to a prompt, as kvpress's KeyDiffPress
// applies it: each KV head scores every prompt position by how unlike the
// head's average key direction its key points (the negative cosine similarity
// of the key to the mean of the head's unit-length keys) and keeps the C
// most distinctive positions. The score reads no query, so the kept set does
// not depend on the question at the end of the prompt; there is no
// observation window and no position is kept unconditionally
// (docs/compression-policies.md, "KeyDiff"). Portable ATen, no custom kernel:
// the score is one normalisation, one mean and one dot product per key.
#pragma once

#include <cstdint>
#include <memory>

#include <ATen/core/Tensor.h>

#include "engine/compress/compression_policy.h"
#include "engine/compress/snapkv_selector.h"
#include "engine/kv/paged_kv_cache.h"

namespace snapserve::compress {

// k [G, n, d] -> [G, n] float32: -cos(k[g, j], mean_j(k[g, j] / |k[g, j]|)).
// Higher is more distinctive, i.e. kept first.
at::Tensor KeyDiffScores(const at::Tensor& k);

// The positions kept per KV head out of n = k.size(1): [G, capacity] int64,
// the `capacity` highest scores of each head, in increasing position order.
// Needs 1 <= capacity <= n.
at::Tensor KeyDiffKept(const at::Tensor& k, int64_t capacity);

// The observation window the retained attention of a KeyDiff request is
// measured with (the selection itself reads no query): config.window when
// 1 <= window < n, else 0 (not measured). KeyDiff does not validate the window.
int64_t KeyDiffScoreWindow(const KvCompressionConfig& config, int64_t n);

// A selector keeping KeyDiff's positions for `config` (which must be KeyDiff
// and apply to the prompt: ShouldCompress). When `retained` is set, the
// queries the selector gets must hold at least KeyDiffScoreWindow(config, n)
// rows (or none: then nothing is measured).
kv::KvSelector MakeKeyDiffSelector(const KvCompressionConfig& config,
                                   std::shared_ptr<RetainedAttention> retained = nullptr);

}  // namespace snapserve::compress
