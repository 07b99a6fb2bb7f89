// Torch custom ops that let pytest drive the C++ model against transformers
// (tests/python/test_model_parity.py, bench/model_vs_hf.py). Loaded models are
// cached by (path, dtype) so a test module loads each once.
#include <torch/library.h>

#include <chrono>
#include <map>
#include <mutex>
#include <utility>

#include "engine/compress/snapkv_selector.h"
#include "engine/kv/paged_kv_cache.h"
#include "engine/model/dense_kv_store.h"
#include "engine/model/llama_model.h"
#include "engine/model/synthetic_weights.h"

namespace snapserve::model {
namespace {

// "float32", "bfloat16", "float16"; suffixes ":int8" (the int8 block dot
// product for GGUF blocks, else exact decoding) and ":bf16gemm" (the
// bfloat16 prefill GEMM) or ":int8gemm" (the int8 one), in that order
// (kernels/prefill_gemm/prefill_gemm.h); ":bf16dot" (bfloat16 dot products at decode on
// bfloat16 weights, kernels/linear/decode_dot.h) anywhere after the dtype.
at::ScalarType ParseDtype(std::string s) {
  if (const auto colon = s.find(':'); colon != std::string::npos) s.resize(colon);
  if (s == "float32") return at::kFloat;
  if (s == "bfloat16") return at::kBFloat16;
  if (s == "float16") return at::kHalf;
  if (s == "int8") return at::kChar;  // KV caches only
  TORCH_CHECK(false, "unknown dtype `", s, "` (float32, bfloat16, float16, int8)");
}

LlamaModel& GetModel(const std::string& path, const std::string& dtype, const std::string& device) {
  static std::mutex mu;
  static std::map<std::tuple<std::string, std::string, std::string>, std::unique_ptr<LlamaModel>>
      cache;
  std::lock_guard<std::mutex> lock(mu);
  auto key = std::make_tuple(path, dtype, device);
  auto it = cache.find(key);
  if (it == cache.end()) {
    const bool int8 = dtype.find(":int8") != std::string::npos;
    const bool bf16_gemm = dtype.find(":bf16gemm") != std::string::npos;
    const bool int8_gemm = dtype.find(":int8gemm") != std::string::npos;
    const bool bf16_dot = dtype.find(":bf16dot") != std::string::npos;
    const LinearPrecision precision{
        int8 ? kernels::QuantDot::kInt8 : kernels::QuantDot::kExact,
        bf16_gemm   ? kernels::PrefillGemm::kBFloat16
        : int8_gemm ? kernels::PrefillGemm::kInt8
                    : kernels::PrefillGemm::kFloat32,
        bf16_dot ? kernels::DecodeDot::kBFloat16 : kernels::DecodeDot::kFloat32};
    auto m = LoadModel(path, ParseDtype(dtype), at::Device(device), LogToStderr, precision);
    TORCH_CHECK(m.ok(), m.status().ToString());
    it = cache.emplace(key, std::move(m).value()).first;
  }
  return *it->second;
}

std::vector<int32_t> ToInt32(at::IntArrayRef ids) { return {ids.begin(), ids.end()}; }

// Float32 logits of every prompt position [n, vocab].
at::Tensor ModelLogits(const std::string& path, const std::string& dtype, at::IntArrayRef ids) {
  LlamaModel& m = GetModel(path, dtype, "cpu");
  DenseKvStore store(m.config().num_layers, m.config().sliding_window);
  return m.Prefill(0, ToInt32(ids), store, /*all_logits=*/true);
}

// As ModelLogits on any device ("cpu", "cuda"); logits come back on the CPU.
at::Tensor ModelLogitsOn(const std::string& path, const std::string& dtype,
                         const std::string& device, at::IntArrayRef ids) {
  LlamaModel& m = GetModel(path, dtype, device);
  DenseKvStore store(m.config().num_layers, m.config().sliding_window);
  return m.Prefill(0, ToInt32(ids), store, /*all_logits=*/true).cpu();
}

// Greedy continuation of `ids`: prefill, then one batched decode step per
// token (batch 1). Returns the max_new generated ids.
std::vector<int64_t> ModelGreedyOn(const std::string& path, const std::string& dtype,
                                   const std::string& device, at::IntArrayRef ids,
                                   int64_t max_new) {
  LlamaModel& m = GetModel(path, dtype, device);
  DenseKvStore store(m.config().num_layers, m.config().sliding_window);
  std::vector<int64_t> out;
  if (max_new <= 0) return out;
  at::Tensor logits = m.Prefill(0, ToInt32(ids), store);
  int64_t pos = static_cast<int64_t>(ids.size());
  for (int64_t i = 0; i < max_new; ++i) {
    const int64_t next = logits.argmax(-1).item<int64_t>();
    out.push_back(next);
    if (i + 1 == max_new) break;
    logits = m.Decode({0}, {static_cast<int32_t>(next)}, {pos++}, store)[0];
  }
  return out;
}

std::vector<int64_t> ModelGreedy(const std::string& path, const std::string& dtype,
                                 at::IntArrayRef ids, int64_t max_new) {
  return ModelGreedyOn(path, dtype, "cpu", ids, max_new);
}

// Greedy continuation of several prompts decoded together in one batch (each
// sequence prefilled alone, then max_new - 1 batched decode steps). The
// prompts are concatenated in `flat`, `lengths` says where each ends.
// Returns [B, max_new] ids.
at::Tensor ModelGreedyBatch(const std::string& path, const std::string& dtype, at::IntArrayRef flat,
                            at::IntArrayRef lengths, int64_t max_new) {
  LlamaModel& m = GetModel(path, dtype, "cpu");
  std::vector<std::vector<int64_t>> prompts;
  size_t offset = 0;
  for (int64_t len : lengths) {
    TORCH_CHECK(len > 0 && offset + len <= flat.size(), "model_greedy_batch: bad lengths");
    prompts.emplace_back(flat.begin() + offset, flat.begin() + offset + len);
    offset += len;
  }
  DenseKvStore store(m.config().num_layers, m.config().sliding_window);
  const int64_t B = static_cast<int64_t>(prompts.size());
  at::Tensor out = at::zeros({B, max_new}, at::kLong);
  if (B == 0 || max_new <= 0) return out;
  std::vector<int64_t> seqs, positions;
  std::vector<int32_t> next;
  for (int64_t b = 0; b < B; ++b) {
    at::Tensor logits = m.Prefill(b, {prompts[b].begin(), prompts[b].end()}, store);
    seqs.push_back(b);
    positions.push_back(static_cast<int64_t>(prompts[b].size()));
    next.push_back(static_cast<int32_t>(logits.argmax(-1).item<int64_t>()));
  }
  for (int64_t i = 0;; ++i) {
    for (int64_t b = 0; b < B; ++b) out[b][i] = next[b];
    if (i + 1 == max_new) break;
    at::Tensor ids = m.Decode(seqs, next, positions, store).argmax(-1);
    for (int64_t b = 0; b < B; ++b) {
      next[b] = static_cast<int32_t>(ids[b].item<int64_t>());
      ++positions[b];
    }
  }
  return out;
}

// Seconds of `steps` batched greedy decode steps after prefilling each of
// the prompts (`flat` cut by `lengths`); the prefill is not timed
// (bench/quantized_decode.py's batch-16 figure).
// On any device ("cpu", "cuda"): each step ends in a device-to-host copy of
// the chosen ids, so the clock sees finished work.
double ModelBatchDecodeSecondsOn(const std::string& path, const std::string& dtype,
                                 const std::string& device, at::IntArrayRef flat,
                                 at::IntArrayRef lengths, int64_t steps) {
  LlamaModel& m = GetModel(path, dtype, device);
  DenseKvStore store(m.config().num_layers, m.config().sliding_window);
  std::vector<int64_t> seqs, positions;
  std::vector<int32_t> next;
  size_t offset = 0;
  for (int64_t len : lengths) {
    TORCH_CHECK(len > 0 && offset + len <= flat.size(), "model_batch_decode_seconds: bad lengths");
    const std::vector<int32_t> prompt(flat.begin() + offset, flat.begin() + offset + len);
    offset += len;
    const auto b = static_cast<int64_t>(seqs.size());
    next.push_back(static_cast<int32_t>(m.Prefill(b, prompt, store).argmax(-1).item<int64_t>()));
    seqs.push_back(b);
    positions.push_back(len);
  }
  TORCH_CHECK(!seqs.empty() && steps > 0, "model_batch_decode_seconds: nothing to decode");
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < steps; ++i) {
    at::Tensor ids = m.Decode(seqs, next, positions, store).argmax(-1);
    for (size_t b = 0; b < seqs.size(); ++b) {
      next[b] = static_cast<int32_t>(ids[static_cast<int64_t>(b)].item<int64_t>());
      ++positions[b];
    }
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double ModelBatchDecodeSeconds(const std::string& path, const std::string& dtype,
                               at::IntArrayRef flat, at::IntArrayRef lengths, int64_t steps) {
  return ModelBatchDecodeSecondsOn(path, dtype, "cpu", flat, lengths, steps);
}

// Timing helper for the benchmarks on any device: prefill of `ids` (last
// logits only), then `decode_steps` batch-1 greedy decode steps. Returns
// {prefill_s, decode_s}; every step ends in `.item()`, which waits for the
// device.
std::vector<double> ModelTimeOn(const std::string& path, const std::string& dtype,
                                const std::string& device, at::IntArrayRef ids,
                                int64_t decode_steps) {
  LlamaModel& m = GetModel(path, dtype, device);
  DenseKvStore store(m.config().num_layers, m.config().sliding_window);
  const auto t0 = std::chrono::steady_clock::now();
  at::Tensor logits = m.Prefill(0, ToInt32(ids), store);
  int32_t next = static_cast<int32_t>(logits.argmax(-1).item<int64_t>());
  const auto t1 = std::chrono::steady_clock::now();
  int64_t pos = static_cast<int64_t>(ids.size());
  for (int64_t i = 0; i < decode_steps; ++i) {
    logits = m.Decode({0}, {next}, {pos++}, store);
    next = static_cast<int32_t>(logits.argmax(-1).item<int64_t>());
  }
  const auto t2 = std::chrono::steady_clock::now();
  return {std::chrono::duration<double>(t1 - t0).count(),
          std::chrono::duration<double>(t2 - t1).count()};
}

std::vector<double> ModelTime(const std::string& path, const std::string& dtype,
                              at::IntArrayRef ids, int64_t decode_steps) {
  return ModelTimeOn(path, dtype, "cpu", ids, decode_steps);
}

// Teacher-forced decode: prefills ids[0, from), then runs one batch-1 decode
// step per remaining id, fed the true id. Returns the logits after each step's
// input, i.e. the predictions for positions from .. n-1: [n - from, vocab].
at::Tensor ModelDecodeLogits(const std::string& path, const std::string& dtype, at::IntArrayRef ids,
                             int64_t from) {
  const int64_t n = static_cast<int64_t>(ids.size());
  TORCH_CHECK(from >= 2 && from < n, "from must be in [2, ", n, ")");
  LlamaModel& m = GetModel(path, dtype, "cpu");
  DenseKvStore store(m.config().num_layers, m.config().sliding_window);
  const std::vector<int32_t> all = ToInt32(ids);
  std::vector<at::Tensor> rows;
  // Prefill ids[0, from - 1); the prediction for position `from` then comes
  // from the decode step that inputs ids[from - 1], like every later one.
  m.Prefill(0, std::vector<int32_t>(all.begin(), all.begin() + from - 1), store);
  for (int64_t pos = from - 1; pos < n - 1; ++pos) {
    rows.push_back(m.Decode({0}, {all[pos]}, {pos}, store).squeeze(0));
  }
  return at::stack(rows);
}

// ModelDecodeLogits through the server's paged KV cache with entries of
// `kv_dtype` (--kv-cache-dtype): every decode step reads the cached prompt
// and earlier steps from the paged cache, rounded to that dtype.
at::Tensor ModelPagedDecodeLogits(const std::string& path, const std::string& dtype,
                                  const std::string& kv_dtype, at::IntArrayRef ids, int64_t from) {
  const int64_t n = static_cast<int64_t>(ids.size());
  TORCH_CHECK(from >= 2 && from < n, "from must be in [2, ", n, ")");
  LlamaModel& m = GetModel(path, dtype, "cpu");
  const ModelConfig& c = m.config();
  kv::PagedKvCacheConfig kc;
  kc.num_layers = c.num_layers;
  kc.num_kv_heads = c.num_kv_heads;
  kc.head_dim = c.head_dim;
  kc.sliding_window = c.sliding_window;
  kc.num_blocks = static_cast<int32_t>((n / kc.block_size + 2) * c.num_layers * c.num_kv_heads);
  kc.dtype = ParseDtype(kv_dtype);
  auto cache = kv::PagedKvCache::Create(kc);
  TORCH_CHECK(cache.ok(), cache.status().ToString());
  TORCH_CHECK((*cache)->AddSequence(0, (*cache)->BlocksForUniform(n), nullptr).ok());
  const std::vector<int32_t> all = ToInt32(ids);
  m.Prefill(0, std::vector<int32_t>(all.begin(), all.begin() + from - 1), **cache);
  std::vector<at::Tensor> rows;
  for (int64_t pos = from - 1; pos < n - 1; ++pos) {
    rows.push_back(m.Decode({0}, {all[pos]}, {pos}, **cache).squeeze(0));
  }
  return at::stack(rows);
}

// Chunked prefill with SnapKV (docs/kv-cache-and-scheduling.md, "Chunked
// prefill"): runs the prompt through a paged cache in chunks of `chunk`
// tokens (>= n: one chunk) with the selector the engine installs (max
// pooling, capacity C, window w), then a few greedy decode steps. Returns
// the cached keys of every layer [L, Hkv, C + steps, D] and the logits of
// the prompt's last position and of each decode step [1 + steps, vocab].
std::vector<at::Tensor> ModelChunkedSnapKv(const std::string& path, const std::string& dtype,
                                           at::IntArrayRef ids, int64_t chunk, int64_t capacity,
                                           int64_t window, int64_t steps) {
  LlamaModel& m = GetModel(path, dtype, "cpu");
  const ModelConfig& c = m.config();
  engine::KvCompressionConfig policy;
  policy.capacity = capacity;
  policy.window = window;
  const std::vector<int32_t> prompt = ToInt32(ids);
  const int64_t n = static_cast<int64_t>(prompt.size());
  TORCH_CHECK(compress::ShouldCompress(policy, n), "the prompt is too short to compress");
  kv::PagedKvCacheConfig kc;
  kc.num_layers = c.num_layers;
  kc.num_kv_heads = c.num_kv_heads;
  kc.head_dim = c.head_dim;
  kc.sliding_window = c.sliding_window;
  kc.num_blocks =
      static_cast<int32_t>(((capacity + steps) / 16 + 2) * c.num_layers * c.num_kv_heads);
  kc.dtype = m.dtype();
  auto cache = kv::PagedKvCache::Create(kc);
  TORCH_CHECK(cache.ok(), cache.status().ToString());
  TORCH_CHECK((*cache)
                  ->AddSequence(0, (*cache)->BlocksForUniform(capacity + steps),
                                compress::MakeSnapKvSelector(policy, nullptr))
                  .ok());
  PromptState st = m.BeginPrompt(0, prompt, window);
  at::Tensor h;
  while (!st.finished()) h = m.ContinuePrompt(st, **cache, chunk);
  std::vector<at::Tensor> logits = {m.Logits(h.narrow(0, h.size(0) - 1, 1)).squeeze(0)};
  for (int64_t i = 0; i < steps; ++i) {
    const auto next = static_cast<int32_t>(logits.back().argmax().item<int64_t>());
    logits.push_back(m.Decode({0}, {next}, {n + i}, **cache).squeeze(0));
  }
  std::vector<at::Tensor> keys;
  for (int64_t l = 0; l < c.num_layers; ++l) keys.push_back((*cache)->Gather(0, l).first);
  return {at::stack(keys), at::stack(logits)};
}

// Bytes of weight matrices one CPU decode step of a synthetic model reads
// (bench/synthetic_decode.py's bandwidth figure).
int64_t SyntheticWeightBytes(const std::string& spec, const std::string& dtype) {
  auto s = ParseSyntheticSpec(spec);
  TORCH_CHECK(s.ok(), s.status().ToString());
  return SyntheticDecodeBytes(*s, ParseDtype(dtype));
}

}  // namespace
}  // namespace snapserve::model

TORCH_LIBRARY_FRAGMENT(snapserve, m) {
  m.def("model_logits(str path, str dtype, int[] ids) -> Tensor", &snapserve::model::ModelLogits);
  m.def("model_greedy(str path, str dtype, int[] ids, int max_new) -> int[]",
        &snapserve::model::ModelGreedy);
  m.def("model_logits_on(str path, str dtype, str device, int[] ids) -> Tensor",
        &snapserve::model::ModelLogitsOn);
  m.def("model_greedy_on(str path, str dtype, str device, int[] ids, int max_new) -> int[]",
        &snapserve::model::ModelGreedyOn);
  m.def("model_decode_logits(str path, str dtype, int[] ids, int from) -> Tensor",
        &snapserve::model::ModelDecodeLogits);
  m.def(
      "model_paged_decode_logits(str path, str dtype, str kv_dtype, int[] ids, int from) -> Tensor",
      &snapserve::model::ModelPagedDecodeLogits);
  m.def("model_greedy_batch(str path, str dtype, int[] flat, int[] lengths, int max_new) -> Tensor",
        &snapserve::model::ModelGreedyBatch);
  m.def(
      "model_batch_decode_seconds(str path, str dtype, int[] flat, int[] lengths, int steps) -> "
      "float",
      &snapserve::model::ModelBatchDecodeSeconds);
  m.def("model_time(str path, str dtype, int[] ids, int decode_steps) -> float[]",
        &snapserve::model::ModelTime);
  m.def("model_time_on(str path, str dtype, str device, int[] ids, int decode_steps) -> float[]",
        &snapserve::model::ModelTimeOn);
  m.def(
      "model_batch_decode_seconds_on(str path, str dtype, str device, int[] flat, int[] lengths, "
      "int steps) -> float",
      &snapserve::model::ModelBatchDecodeSecondsOn);
  m.def(
      "model_chunked_snapkv(str path, str dtype, int[] ids, int chunk, int capacity, int window, "
      "int steps) -> Tensor[]",
      &snapserve::model::ModelChunkedSnapKv);
  m.def("synthetic_decode_bytes(str spec, str dtype) -> int",
        &snapserve::model::SyntheticWeightBytes);
}
