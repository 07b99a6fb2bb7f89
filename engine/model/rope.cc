#include "engine/model/rope.h"

#include <cmath>

namespace snapserve::model {

at::Tensor RopeInvFreq(const ModelConfig& config, at::Device device) {
  const int64_t dim = config.head_dim;
  auto f32 = at::TensorOptions().dtype(at::kFloat).device(device);
  // Same op sequence as transformers, so float32 rounding matches bit for bit:
  // 1 / (theta ** (arange(0, dim, 2) / dim)).
  at::Tensor exponent = at::arange(0, dim, 2, f32.dtype(at::kLong)).to(at::kFloat) / dim;
  at::Tensor inv_freq = at::reciprocal(at::pow(config.rope_theta, exponent));
  const RopeScaling& s = config.rope_scaling;
  switch (s.kind) {
    case RopeScaling::Kind::kNone:
      break;
    case RopeScaling::Kind::kLinear:
      inv_freq = inv_freq / s.factor;
      break;
    case RopeScaling::Kind::kFreqFactors:
      inv_freq = inv_freq / at::tensor(s.freq_factors, f32);
      break;
    case RopeScaling::Kind::kLlama3: {
      // Llama 3.1: long wavelengths are divided by `factor`, short ones kept,
      // the band between interpolated smoothly.
      const double old_ctx = static_cast<double>(s.original_max_position_embeddings);
      const double low_freq_wavelen = old_ctx / s.low_freq_factor;
      const double high_freq_wavelen = old_ctx / s.high_freq_factor;
      at::Tensor wavelen = at::reciprocal(inv_freq) * (2 * M_PI);
      at::Tensor scaled = at::where(wavelen > low_freq_wavelen, inv_freq / s.factor, inv_freq);
      at::Tensor smooth = (at::reciprocal(wavelen) * old_ctx - s.low_freq_factor) /
                          (s.high_freq_factor - s.low_freq_factor);
      at::Tensor smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled;
      at::Tensor medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen);
      inv_freq = at::where(medium, smoothed, scaled);
      break;
    }
  }
  return inv_freq.contiguous();
}

std::pair<at::Tensor, at::Tensor> RopeCosSin(const at::Tensor& inv_freq,
                                             const at::Tensor& positions, at::ScalarType dtype) {
  at::Tensor freqs = positions.to(at::kFloat).unsqueeze(-1) * inv_freq;  // [n, dim/2]
  at::Tensor emb = at::cat({freqs, freqs}, -1);                          // [n, dim]
  return {emb.cos().to(dtype), emb.sin().to(dtype)};
}

at::Tensor ApplyRope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t half = x.size(-1) / 2;
  at::Tensor rotated = at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
  return x * cos + rotated * sin;
}

}  // namespace snapserve::model
