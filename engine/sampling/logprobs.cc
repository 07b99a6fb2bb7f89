#include "engine/sampling/logprobs.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <numeric>

namespace snapserve::sampling {

engine::TokenLogprob LogprobsOfScores(std::span<const double> scores, int32_t chosen,
                                      uint32_t top) {
  TORCH_CHECK(!scores.empty(), "LogprobsOfScores: empty scores");
  TORCH_CHECK(chosen >= 0 && static_cast<size_t>(chosen) < scores.size(),
              "LogprobsOfScores: chosen token ", chosen, " outside the row");
  // log-sum-exp with the maximum taken out, in double: float32 logits of a
  // 50k vocabulary lose nothing that a float result could show.
  const double max = *std::max_element(scores.begin(), scores.end());
  double sum = 0.0;
  for (double s : scores) sum += std::exp(s - max);
  const double log_z = max + std::log(sum);
  auto logprob = [&](size_t id) { return static_cast<float>(scores[id] - log_z); };

  engine::TokenLogprob out;
  out.token_id = static_cast<uint32_t>(chosen);
  out.logprob = logprob(static_cast<size_t>(chosen));
  const size_t k = std::min<size_t>(top, scores.size());
  if (k == 0) return out;

  // Ordered on the float values returned, so equal values in the response
  // are always in increasing id order.
  std::vector<float> values(scores.size());
  for (size_t i = 0; i < values.size(); ++i) values[i] = logprob(i);
  std::vector<uint32_t> ids(values.size());
  std::iota(ids.begin(), ids.end(), 0u);
  std::partial_sort(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(k), ids.end(),
                    [&](uint32_t a, uint32_t b) {
                      return values[a] > values[b] || (values[a] == values[b] && a < b);
                    });
  out.top_logprobs.reserve(k);
  for (size_t i = 0; i < k; ++i) out.top_logprobs.push_back({ids[i], values[ids[i]]});
  return out;
}

std::vector<std::optional<engine::TokenLogprob>> BatchLogprobs(const at::Tensor& logits,
                                                               std::span<Sampler* const> samplers,
                                                               std::span<const int32_t> sampled) {
  TORCH_CHECK(logits.dim() == 2 && logits.size(0) == static_cast<int64_t>(samplers.size()) &&
                  samplers.size() == sampled.size(),
              "BatchLogprobs: logits ", logits.sizes(), " for ", samplers.size(), " samplers and ",
              sampled.size(), " tokens");
  std::vector<int64_t> rows;  // the rows that ask, in order
  for (size_t b = 0; b < samplers.size(); ++b) {
    if (samplers[b]->params().logprobs.enabled) rows.push_back(static_cast<int64_t>(b));
  }
  if (rows.empty()) return {};

  // Only the rows that ask cross to the host.
  const at::Tensor index = at::tensor(rows, at::kLong).to(logits.device());
  const at::Tensor host = logits.index_select(0, index).to(at::kCPU, at::kFloat).contiguous();
  const int64_t vocab = host.size(1);
  const float* data = host.const_data_ptr<float>();
  std::vector<std::optional<engine::TokenLogprob>> out(samplers.size());
  at::parallel_for(0, static_cast<int64_t>(rows.size()), 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const size_t b = static_cast<size_t>(rows[r]);
      const Sampler& s = *samplers[b];
      const std::vector<double> scores =
          s.LogprobScores(std::span<const float>(data + r * vocab, vocab));
      out[b] = LogprobsOfScores(scores, sampled[b], s.params().logprobs.top_logprobs);
    }
  });
  return out;
}

}  // namespace snapserve::sampling
