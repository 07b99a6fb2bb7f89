// Exposes engine/sampling to pytest as torch.ops.snapserve.*: batched
// sampling with per-row parameters and seeds, the distribution each row is
// drawn from, and the repetition penalty alone (checked against transformers).
#include <ATen/ATen.h>
#include <torch/library.h>

#include <memory>
#include <vector>

#include "engine/sampling/sampler.h"

namespace {

using snapserve::sampling::Sampler;
using snapserve::sampling::SamplingParams;

// history [B, L] int64, padded with -1: row b's prompt + generated tokens.
std::vector<std::unique_ptr<Sampler>> make_samplers(
    int64_t batch, c10::ArrayRef<double> temperature, c10::ArrayRef<int64_t> top_k,
    c10::ArrayRef<double> top_p, c10::ArrayRef<double> repetition_penalty,
    c10::ArrayRef<int64_t> seed, const at::Tensor& history) {
  TORCH_CHECK(static_cast<int64_t>(temperature.size()) == batch &&
                  static_cast<int64_t>(top_k.size()) == batch &&
                  static_cast<int64_t>(top_p.size()) == batch &&
                  static_cast<int64_t>(repetition_penalty.size()) == batch &&
                  static_cast<int64_t>(seed.size()) == batch,
              "one parameter per row expected");
  TORCH_CHECK(history.dim() == 2 && history.size(0) == batch, "history must be [B, L]");
  const at::Tensor h = history.to(at::kCPU, at::kLong).contiguous();
  std::vector<std::unique_ptr<Sampler>> out;
  for (int64_t b = 0; b < batch; ++b) {
    SamplingParams p;
    p.temperature = static_cast<float>(temperature[b]);
    p.top_k = static_cast<int32_t>(top_k[b]);
    p.top_p = static_cast<float>(top_p[b]);
    p.repetition_penalty = static_cast<float>(repetition_penalty[b]);
    if (seed[b] >= 0) p.seed = static_cast<uint64_t>(seed[b]);
    std::vector<int32_t> tokens;
    const int64_t* row = h.const_data_ptr<int64_t>() + b * h.size(1);
    for (int64_t i = 0; i < h.size(1); ++i) {
      if (row[i] >= 0) tokens.push_back(static_cast<int32_t>(row[i]));
    }
    out.push_back(std::make_unique<Sampler>(p, tokens));
  }
  return out;
}

// Draws `num_draws` tokens per row with one sampler per row (its generator
// advancing between draws, history fixed): [B, num_draws] int64.
at::Tensor sample_op(const at::Tensor& logits, c10::ArrayRef<double> temperature,
                     c10::ArrayRef<int64_t> top_k, c10::ArrayRef<double> top_p,
                     c10::ArrayRef<double> repetition_penalty, c10::ArrayRef<int64_t> seed,
                     const at::Tensor& history, int64_t num_draws) {
  TORCH_CHECK(logits.dim() == 2, "logits must be [B, vocab]");
  const int64_t batch = logits.size(0);
  auto owned = make_samplers(batch, temperature, top_k, top_p, repetition_penalty, seed, history);
  std::vector<Sampler*> samplers;
  for (auto& s : owned) samplers.push_back(s.get());
  at::Tensor out = at::empty({batch, num_draws}, at::kLong);
  auto acc = out.accessor<int64_t, 2>();
  for (int64_t d = 0; d < num_draws; ++d) {
    const std::vector<int32_t> ids = snapserve::sampling::SampleBatch(logits, samplers);
    for (int64_t b = 0; b < batch; ++b) acc[b][d] = ids[b];
  }
  return out;
}

// The distribution each row's next token is drawn from: [B, vocab] float32.
at::Tensor sampling_probs_op(const at::Tensor& logits, c10::ArrayRef<double> temperature,
                             c10::ArrayRef<int64_t> top_k, c10::ArrayRef<double> top_p,
                             c10::ArrayRef<double> repetition_penalty, const at::Tensor& history) {
  TORCH_CHECK(logits.dim() == 2, "logits must be [B, vocab]");
  const int64_t batch = logits.size(0);
  const std::vector<int64_t> seeds(batch, 0);
  auto samplers =
      make_samplers(batch, temperature, top_k, top_p, repetition_penalty, seeds, history);
  const at::Tensor host = logits.to(at::kCPU, at::kFloat).contiguous();
  const int64_t vocab = host.size(1);
  at::Tensor out = at::empty({batch, vocab}, at::kFloat);
  for (int64_t b = 0; b < batch; ++b) {
    const std::vector<float> p = samplers[b]->Probabilities(
        std::span<const float>(host.const_data_ptr<float>() + b * vocab, vocab));
    std::copy(p.begin(), p.end(), out.data_ptr<float>() + b * vocab);
  }
  return out;
}

// Logits after the repetition penalty only: [B, vocab] float32.
at::Tensor repetition_penalty_op(const at::Tensor& logits, const at::Tensor& history,
                                 double penalty) {
  TORCH_CHECK(logits.dim() == 2 && history.dim() == 2 && history.size(0) == logits.size(0),
              "logits [B, vocab], history [B, L] expected");
  at::Tensor out = logits.to(at::kCPU, at::kFloat).contiguous().clone();
  const at::Tensor h = history.to(at::kCPU, at::kLong).contiguous();
  for (int64_t b = 0; b < out.size(0); ++b) {
    std::vector<int32_t> tokens;
    for (int64_t i = 0; i < h.size(1); ++i) {
      const int64_t t = h[b][i].item<int64_t>();
      if (t >= 0) tokens.push_back(static_cast<int32_t>(t));
    }
    snapserve::sampling::ApplyRepetitionPenalty(
        std::span<float>(out.data_ptr<float>() + b * out.size(1), out.size(1)), tokens,
        static_cast<float>(penalty));
  }
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(snapserve, m) {
  m.def(
      "sample(Tensor logits, float[] temperature, int[] top_k, float[] top_p, "
      "float[] repetition_penalty, int[] seed, Tensor history, int num_draws) -> Tensor");
  m.def(
      "sampling_probs(Tensor logits, float[] temperature, int[] top_k, float[] top_p, "
      "float[] repetition_penalty, Tensor history) -> Tensor");
  m.def("repetition_penalty(Tensor logits, Tensor history, float penalty) -> Tensor");
  m.impl("sample", c10::DispatchKey::CompositeExplicitAutograd, TORCH_FN(sample_op));
  m.impl("sampling_probs", c10::DispatchKey::CompositeExplicitAutograd,
         TORCH_FN(sampling_probs_op));
  m.impl("repetition_penalty", c10::DispatchKey::CompositeExplicitAutograd,
         TORCH_FN(repetition_penalty_op));
}
