// Token sampling for the engine (docs/api.md, "GenerateRequest", `sampling`).
// Each request owns a Sampler holding its parameters, its own random generator
// and the token history the repetition penalty reads, so a request's tokens
// depend on its seed and its own history only, never on which other requests
// share the batch. Knows nothing of tokenizers, stop conditions or the
// scheduler.
//
// Pipeline per row, in this order (as transformers' generate applies it):
//   repetition penalty -> greedy argmax if temperature == 0, else
//   temperature -> top-k -> top-p -> draw from the renormalized distribution.
//
// Thread-compatible: one Sampler per request; SampleBatch may work on distinct
// rows in parallel because no two rows share a Sampler.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <random>
#include <span>
#include <vector>

#include "engine/token_logprobs.h"

namespace snapserve::sampling {

struct SamplingParams {
  float temperature = 0.f;         // 0: greedy
  int32_t top_k = 0;               // 0 (or >= vocab): off
  float top_p = 1.f;               // 0 or 1: off
  float repetition_penalty = 1.f;  // 0 or 1: off
  std::optional<uint64_t> seed;    // unset: seeded from std::random_device
  // Not a sampling parameter: what to report of each draw (logprobs.h).
  engine::LogprobOptions logprobs;

  bool greedy() const { return temperature == 0.f; }
  bool penalized() const { return repetition_penalty != 0.f && repetition_penalty != 1.f; }
};

// transformers' RepetitionPenaltyLogitsProcessor on one row: every distinct
// token of `tokens` has its logit divided by `penalty` when positive and
// multiplied by it otherwise. Ids outside the row are ignored.
void ApplyRepetitionPenalty(std::span<float> logits, std::span<const int32_t> tokens,
                            float penalty);

// Index of the largest value; ties go to the lowest index.
int32_t Argmax(std::span<const float> logits);

class Sampler {
 public:
  // `prompt` seeds the repetition-penalty history.
  explicit Sampler(SamplingParams params, std::span<const int32_t> prompt = {});

  // Records a token the request generated (repetition-penalty history).
  void Accept(int32_t token);

  // Picks the next token from one row of float32 logits. Greedy rows consume
  // no randomness; sampled rows consume exactly one draw.
  int32_t Sample(std::span<const float> logits);

  // The distribution Sample draws from (after penalty, temperature, top-k and
  // top-p; one-hot for greedy), for tests. Leaves the generator untouched.
  std::vector<float> Probabilities(std::span<const float> logits) const;

  // The scores the reported logprobs are the log-softmax of (docs/api.md,
  // "Logprobs"): the penalized logits divided by the temperature (by 1 when
  // greedy), before top-k and top-p. Call before Accept of the token drawn
  // from these logits, so the penalty sees the same history the draw did.
  std::vector<double> LogprobScores(std::span<const float> logits) const;

  const SamplingParams& params() const { return params_; }

 private:
  // Candidates with their probabilities, ordered by (probability desc, id asc)
  // when a filter needed the order, by id otherwise. Greedy not handled here.
  struct Candidates {
    std::vector<int32_t> ids;
    std::vector<double> probs;  // sum to 1
  };
  Candidates Filter(std::span<const float> logits) const;
  std::vector<float> Penalized(std::span<const float> logits) const;

  SamplingParams params_;
  std::mt19937_64 rng_;
  // Distinct tokens seen; kept sorted-free as a presence bitmap grown on
  // demand, so the penalty costs O(distinct tokens) per step.
  std::vector<int32_t> seen_;
  std::vector<uint8_t> seen_mask_;
};

// Samples one token per row of `logits` [B, vocab] (any float dtype, any
// device) with samplers[b] for row b; returns the B token ids. When every row
// is greedy without penalty the argmax runs where the logits are and only B
// ids cross to the host. Does not call Accept.
std::vector<int32_t> SampleBatch(const at::Tensor& logits, std::span<Sampler* const> samplers);

}  // namespace snapserve::sampling
