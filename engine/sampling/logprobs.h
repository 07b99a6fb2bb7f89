// Logprobs of sampled tokens (docs/api.md, "Logprobs"): the log-softmax of
// the scores Sampler::LogprobScores gives (after the repetition penalty and
// the temperature, before top-k and top-p), the drawn token's value and the
// k most likely tokens. Computed only for requests that ask, row by row on
// the host in double, so a row's values never depend on the other rows of
// its batch.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "engine/sampling/sampler.h"
#include "engine/token_logprobs.h"

namespace snapserve::sampling {

// log_softmax(scores)[chosen], and the `top` largest entries of
// log_softmax(scores) ordered by logprob descending, ties to the smaller id
// (fewer when the row is shorter). `scores` must not be empty.
engine::TokenLogprob LogprobsOfScores(std::span<const double> scores, int32_t chosen, uint32_t top);

// For each row b of `logits` [B, vocab] (any float dtype, any device): the
// logprobs of sampled[b] when samplers[b] asks for them, nothing otherwise.
// When no row asks, returns an empty vector having copied and computed
// nothing. Call before Accept of the sampled tokens.
std::vector<std::optional<engine::TokenLogprob>> BatchLogprobs(const at::Tensor& logits,
                                                               std::span<Sampler* const> samplers,
                                                               std::span<const int32_t> sampled);

}  // namespace snapserve::sampling
