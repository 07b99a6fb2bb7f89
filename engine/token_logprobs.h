// Log-probabilities of generated tokens (docs/api.md, "Logprobs"): what a
// request asks for (LogprobOptions) and what comes back with each returned
// token (TokenLogprob), mirroring the API's messages of the same names.
// Shared by the public engine.h, the sampler that computes them and the
// scheduler that forwards them. Includes no LibTorch, gRPC or protobuf header.
#pragma once

#include <cstdint>
#include <vector>

namespace snapserve::engine {

// The most alternatives a request may ask for: a bound on the work and the
// response size per token (vLLM and OpenAI's API use the same limit).
inline constexpr uint32_t kMaxTopLogprobs = 20;

// Off by default: a request without it costs no log-softmax.
struct LogprobOptions {
  bool enabled = false;       // return each generated token's logprob
  uint32_t top_logprobs = 0;  // and the k most likely tokens; needs `enabled`
};

struct TopLogprob {
  uint32_t token_id = 0;
  float logprob = 0;
};

// One returned token: its own logprob and the `top_logprobs` most likely
// tokens of the same step, by logprob descending, ties to the smaller id.
struct TokenLogprob {
  uint32_t token_id = 0;
  float logprob = 0;
  std::vector<TopLogprob> top_logprobs;
};

}  // namespace snapserve::engine
