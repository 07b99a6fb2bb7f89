#include "engine/sampling/sampler.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <numeric>

namespace snapserve::sampling {

namespace {

// A uniform double in [0, 1) from the top 53 bits: unlike
// std::uniform_real_distribution its value is the same on every standard
// library, so a seed means the same tokens everywhere.
double uniform01(std::mt19937_64& rng) { return static_cast<double>(rng() >> 11) * 0x1.0p-53; }

// Sort order for the filters: higher value first, lower id on ties.
struct ByValueThenId {
  const std::vector<double>& x;
  bool operator()(int32_t a, int32_t b) const { return x[a] > x[b] || (x[a] == x[b] && a < b); }
};

void Softmax(const std::vector<int32_t>& ids, const std::vector<double>& x,
             std::vector<double>& probs) {
  double max = -INFINITY;
  for (int32_t id : ids) max = std::max(max, x[id]);
  probs.resize(ids.size());
  double sum = 0.0;
  for (size_t i = 0; i < ids.size(); ++i) {
    probs[i] = std::exp(x[ids[i]] - max);
    sum += probs[i];
  }
  for (double& p : probs) p /= sum;
}

}  // namespace

void ApplyRepetitionPenalty(std::span<float> logits, std::span<const int32_t> tokens,
                            float penalty) {
  std::vector<uint8_t> done(logits.size(), 0);
  for (int32_t t : tokens) {
    if (t < 0 || static_cast<size_t>(t) >= logits.size() || done[t]) continue;
    done[t] = 1;
    float& l = logits[t];
    l = l < 0.f ? l * penalty : l / penalty;
  }
}

int32_t Argmax(std::span<const float> logits) {
  // The first index of the largest value, as a loop keeping the first strict
  // improvement would find it (NaNs never improve on anything, and a NaN at
  // index 0 is never improved on), in two passes, the first one vectorized.
  // SampleBatch's greedy rows use it on CPU: LibTorch's argmax costs a
  // dispatch and a tensor per row, which at batch 1 is most of sampling.
  const size_t n = logits.size();
  if (n == 0 || std::isnan(logits[0])) return 0;
  // Pass 1, the largest value: independent lanes so the loop vectorizes
  // without reordering (max is exact in any order; NaNs fail the compare).
  constexpr size_t kLanes = 16;
  float lane[kLanes];
  std::fill(std::begin(lane), std::end(lane), logits[0]);
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (size_t j = 0; j < kLanes; ++j) lane[j] = logits[i + j] > lane[j] ? logits[i + j] : lane[j];
  }
  float best = logits[0];
  for (; i < n; ++i) best = logits[i] > best ? logits[i] : best;
  for (float v : lane) best = v > best ? v : best;
  // Pass 2: its first index.
  for (size_t k = 0; k < n; ++k) {
    if (logits[k] == best) return static_cast<int32_t>(k);
  }
  return 0;  // unreachable: `best` is one of the values
}

Sampler::Sampler(SamplingParams params, std::span<const int32_t> prompt)
    : params_(params), rng_(params.seed ? *params.seed : std::random_device{}()) {
  for (int32_t t : prompt) Accept(t);
}

void Sampler::Accept(int32_t token) {
  if (token < 0) return;
  if (static_cast<size_t>(token) >= seen_mask_.size()) seen_mask_.resize(token + 1, 0);
  if (seen_mask_[token]) return;
  seen_mask_[token] = 1;
  seen_.push_back(token);
}

std::vector<float> Sampler::Penalized(std::span<const float> logits) const {
  std::vector<float> out(logits.begin(), logits.end());
  if (params_.penalized()) ApplyRepetitionPenalty(out, seen_, params_.repetition_penalty);
  return out;
}

Sampler::Candidates Sampler::Filter(std::span<const float> logits) const {
  const std::vector<float> penalized = Penalized(logits);
  const int32_t vocab = static_cast<int32_t>(penalized.size());
  std::vector<double> x(penalized.size());
  for (size_t i = 0; i < x.size(); ++i) {
    x[i] = static_cast<double>(penalized[i]) / params_.temperature;
  }

  const bool use_top_k = params_.top_k > 0 && params_.top_k < vocab;
  const bool use_top_p = params_.top_p > 0.f && params_.top_p < 1.f;
  Candidates c;
  c.ids.resize(penalized.size());
  std::iota(c.ids.begin(), c.ids.end(), 0);
  if (!use_top_k && !use_top_p) {
    Softmax(c.ids, x, c.probs);
    return c;
  }

  const ByValueThenId order{x};
  if (use_top_k) {
    std::partial_sort(c.ids.begin(), c.ids.begin() + params_.top_k, c.ids.end(), order);
    c.ids.resize(static_cast<size_t>(params_.top_k));
  }
  if (!use_top_p) {
    Softmax(c.ids, x, c.probs);
    return c;
  }

  // The nucleus is a prefix of the sorted order, and so is the set of tokens
  // at or above any probability threshold; if such a set already holds mass
  // p, the nucleus lies inside it and only that set needs sorting. This keeps
  // a 50k-token vocabulary from being fully sorted on every step.
  Softmax(c.ids, x, c.probs);
  const double p = params_.top_p;
  for (double threshold : {1e-4, 1e-7, 0.0}) {
    std::vector<int32_t> ids;
    double mass = 0.0;
    for (size_t i = 0; i < c.ids.size(); ++i) {
      if (c.probs[i] >= threshold) {
        ids.push_back(c.ids[i]);
        mass += c.probs[i];
      }
    }
    if (mass < p && threshold > 0.0) continue;
    std::sort(ids.begin(), ids.end(), order);
    std::vector<double> probs;
    Softmax(ids, x, probs);  // same values as c.probs, in sorted order
    // Rescale to the full candidate set's normalization so the cut is taken
    // on the true cumulative probability.
    const double scale = mass > 0.0 ? mass : 1.0;
    double cum = 0.0;
    size_t keep = 0;
    while (keep < ids.size()) {
      cum += probs[keep] * scale;
      ++keep;
      if (cum >= p) break;
    }
    ids.resize(keep);
    Softmax(ids, x, c.probs);
    c.ids = std::move(ids);
    return c;
  }
  return c;  // unreachable: the 0.0 threshold always returns
}

int32_t Sampler::Sample(std::span<const float> logits) {
  TORCH_CHECK(!logits.empty(), "Sampler: empty logits row");
  if (params_.greedy()) return Argmax(Penalized(logits));
  const Candidates c = Filter(logits);
  const double u = uniform01(rng_);
  double cum = 0.0;
  for (size_t i = 0; i < c.ids.size(); ++i) {
    cum += c.probs[i];
    if (u < cum) return c.ids[i];
  }
  return c.ids.back();  // u within rounding of 1
}

std::vector<float> Sampler::Probabilities(std::span<const float> logits) const {
  std::vector<float> out(logits.size(), 0.f);
  if (logits.empty()) return out;
  if (params_.greedy()) {
    out[Argmax(Penalized(logits))] = 1.f;
    return out;
  }
  const Candidates c = Filter(logits);
  for (size_t i = 0; i < c.ids.size(); ++i) out[c.ids[i]] = static_cast<float>(c.probs[i]);
  return out;
}

std::vector<double> Sampler::LogprobScores(std::span<const float> logits) const {
  const std::vector<float> penalized = Penalized(logits);
  // Filter divides the same way, so for a sampled row these are exactly the
  // scores the candidates' softmax starts from.
  const double temperature = params_.greedy() ? 1.0 : params_.temperature;
  std::vector<double> x(penalized.size());
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<double>(penalized[i]) / temperature;
  return x;
}

std::vector<int32_t> SampleBatch(const at::Tensor& logits, std::span<Sampler* const> samplers) {
  TORCH_CHECK(logits.dim() == 2, "SampleBatch: logits must be [B, vocab], got ", logits.sizes());
  const int64_t batch = logits.size(0);
  TORCH_CHECK(batch == static_cast<int64_t>(samplers.size()), "SampleBatch: ", batch, " rows but ",
              samplers.size(), " samplers");
  std::vector<int32_t> out(static_cast<size_t>(batch));
  if (batch == 0) return out;

  const bool all_plain_greedy = std::all_of(samplers.begin(), samplers.end(), [](Sampler* s) {
    return s->params().greedy() && !s->params().penalized();
  });
  if (all_plain_greedy && logits.is_cpu() && logits.scalar_type() == at::kFloat) {
    const at::Tensor rows = logits.contiguous();
    const int64_t vocab = rows.size(1);
    const float* data = rows.const_data_ptr<float>();
    for (int64_t b = 0; b < batch; ++b) {
      out[b] = Argmax(std::span<const float>(data + b * vocab, static_cast<size_t>(vocab)));
    }
    return out;
  }
  if (all_plain_greedy) {
    // On a GPU: argmax returns the first maximal index, the same tie rule as
    // Argmax, and only the ids cross to the host.
    const at::Tensor ids = logits.argmax(-1).to(at::kCPU, at::kLong);
    const int64_t* p = ids.const_data_ptr<int64_t>();
    for (int64_t b = 0; b < batch; ++b) out[b] = static_cast<int32_t>(p[b]);
    return out;
  }

  const at::Tensor host = logits.to(at::kCPU, at::kFloat).contiguous();
  const int64_t vocab = host.size(1);
  const float* data = host.const_data_ptr<float>();
  // Rows are independent and each has its own generator: parallel and
  // deterministic at once.
  at::parallel_for(0, batch, 1, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      out[b] = samplers[b]->Sample(std::span<const float>(data + b * vocab, vocab));
    }
  });
  return out;
}

}  // namespace snapserve::sampling
