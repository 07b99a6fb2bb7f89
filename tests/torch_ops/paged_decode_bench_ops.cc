// paged_decode_seconds_on: batched decode of a model through the server's
// paged KV cache (engine/kv/paged_kv_cache.h) on any device, with each prompt
// either kept whole or compressed by SnapKV to C entries per lane, for
// bench/gpu_roofline.py's SnapKV headline (decode speed and KV bytes held,
// compressed against full). The model ops of model_ops.cc decode on a dense
// store; this one goes through the lanes, block tables and selector the
// engine uses. paged_decode_logits_on: teacher-forced decode logits through
// the same cache, so tests/python/test_cuda_fused_kernels.py can check the
// CUDA decode path (lane append, split attention) against a prefill. One
// model is kept loaded (the last one asked for), so a benchmark child holds a
// single copy of an 8B model.
#include <torch/library.h>

#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "engine/compress/compression_policy.h"
#include "engine/compress/snapkv_selector.h"
#include "engine/kv/paged_kv_cache.h"
#include "engine/model/llama_model.h"

namespace snapserve::model {
namespace {

at::ScalarType BenchDtype(const std::string& s) {
  if (s == "float32") return at::kFloat;
  if (s == "bfloat16") return at::kBFloat16;
  if (s == "float16") return at::kHalf;
  TORCH_CHECK(false, "unknown dtype `", s, "` (float32, bfloat16, float16)");
}

LlamaModel& BenchModel(const std::string& path, const std::string& dtype,
                       const std::string& device) {
  static std::mutex mu;
  static std::string loaded_key;
  static std::unique_ptr<LlamaModel> model;
  std::lock_guard<std::mutex> lock(mu);
  const std::string key = path + "|" + dtype + "|" + device;
  if (model == nullptr || key != loaded_key) {
    model.reset();  // free the previous model before loading the next
    // The default LinearPrecision: float32 GEMMs, exact GGUF dot.
    auto m = LoadModel(path, BenchDtype(dtype), at::Device(device), LogToStderr);
    TORCH_CHECK(m.ok(), m.status().ToString());
    model = std::move(m).value();
    loaded_key = key;
  }
  return *model;
}

// `batch` random prompts of prompt_tokens ids (below 32000, every preset's
// vocabulary floor; drawn from `seed`), each prefilled alone into a fresh
// paged cache of the model's dtype on `device`, SnapKV keeping `capacity`
// entries per lane with observation window `window` (capacity 0: the whole
// prompt), then `steps` batched greedy decode steps. Each step ends in a copy
// of the chosen ids to the host, so the clock sees finished device work.
// Returns {prefill seconds (all prompts), decode seconds (all steps), bytes
// of the blocks the sequences' lanes hold after the steps, mean entries per
// lane after the steps}.
std::vector<double> PagedDecodeSecondsOn(const std::string& path, const std::string& dtype,
                                         const std::string& device, int64_t prompt_tokens,
                                         int64_t batch, int64_t steps, int64_t capacity,
                                         int64_t window, int64_t seed) {
  TORCH_CHECK(prompt_tokens > 0 && batch > 0 && steps > 0,
              "paged_decode_seconds_on: prompt_tokens, batch and steps must be positive");
  LlamaModel& m = BenchModel(path, dtype, device);
  const ModelConfig& c = m.config();
  engine::KvCompressionConfig policy;
  policy.capacity = capacity;
  policy.window = window;
  const bool compress = capacity > 0;
  TORCH_CHECK(!compress || compress::ShouldCompress(policy, prompt_tokens),
              "paged_decode_seconds_on: a prompt of ", prompt_tokens,
              " tokens is not compressed with capacity ", capacity);
  const int64_t kept = compress ? capacity : prompt_tokens;

  kv::PagedKvCacheConfig kc;
  kc.num_layers = c.num_layers;
  kc.num_kv_heads = c.num_kv_heads;
  kc.head_dim = c.head_dim;
  kc.dtype = m.dtype();
  kc.device = at::Device(device);
  const int64_t lane_blocks = (kept + steps + kc.block_size - 1) / kc.block_size;
  const int64_t blocks = batch * c.num_layers * c.num_kv_heads * lane_blocks;
  TORCH_CHECK(blocks < (int64_t{1} << 31), "paged_decode_seconds_on: ", blocks,
              " blocks exceed int32");
  kc.num_blocks = static_cast<int32_t>(blocks);
  auto cache = kv::PagedKvCache::Create(kc);
  TORCH_CHECK(cache.ok(), cache.status().ToString());
  kv::PagedKvCache& store = **cache;

  uint64_t state = static_cast<uint64_t>(seed) * 6364136223846793005ull + 1442695040888963407ull;
  auto next_id = [&state] {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<int32_t>((state >> 33) % 32000);
  };
  std::vector<int64_t> seqs, positions;
  std::vector<int32_t> next;
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t b = 0; b < batch; ++b) {
    const kv::KvSelector selector =
        compress ? compress::MakeSnapKvSelector(policy, nullptr) : kv::KvSelector();
    const Status st = store.AddSequence(b, store.BlocksForUniform(kept + steps), selector);
    TORCH_CHECK(st.ok(), st.ToString());
    std::vector<int32_t> prompt(static_cast<size_t>(prompt_tokens));
    for (int32_t& id : prompt) id = next_id();
    next.push_back(static_cast<int32_t>(m.Prefill(b, prompt, store).argmax(-1).item<int64_t>()));
    seqs.push_back(b);
    positions.push_back(prompt_tokens);
  }
  const auto t1 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < steps; ++i) {
    const at::Tensor ids = m.Decode(seqs, next, positions, store).argmax(-1).cpu();
    for (size_t b = 0; b < seqs.size(); ++b) {
      next[b] = static_cast<int32_t>(ids[static_cast<int64_t>(b)].item<int64_t>());
      ++positions[b];
    }
  }
  const auto t2 = std::chrono::steady_clock::now();
  double bytes = 0, entries = 0;
  for (int64_t b : seqs) {
    bytes += static_cast<double>(store.bytes_held(b));
    entries += static_cast<double>(store.total_entries(b));
  }
  const double lanes = static_cast<double>(batch * c.num_layers * c.num_kv_heads);
  return {std::chrono::duration<double>(t1 - t0).count(),
          std::chrono::duration<double>(t2 - t1).count(), bytes, entries / lanes};
}

// Teacher-forced decode through the paged cache on any device: prefills
// ids[0, from - 1), then one batch-1 decode step per remaining id but the
// last, fed the true id. Returns the logits after each step [n - from, vocab]
// on the CPU: the predictions for positions from .. n-1, which a prefill of
// all the ids gives too (rows from - 1 .. n - 2 of its logits).
at::Tensor PagedDecodeLogitsOn(const std::string& path, const std::string& dtype,
                               const std::string& device, at::IntArrayRef ids, int64_t from) {
  const int64_t n = static_cast<int64_t>(ids.size());
  TORCH_CHECK(from >= 2 && from < n, "paged_decode_logits_on: from must be in [2, ", n, ")");
  LlamaModel& m = BenchModel(path, dtype, device);
  const ModelConfig& c = m.config();
  kv::PagedKvCacheConfig kc;
  kc.num_layers = c.num_layers;
  kc.num_kv_heads = c.num_kv_heads;
  kc.head_dim = c.head_dim;
  kc.dtype = m.dtype();
  kc.device = at::Device(device);
  kc.num_blocks = static_cast<int32_t>((n / kc.block_size + 2) * c.num_layers * c.num_kv_heads);
  auto cache = kv::PagedKvCache::Create(kc);
  TORCH_CHECK(cache.ok(), cache.status().ToString());
  kv::PagedKvCache& store = **cache;
  TORCH_CHECK(store.AddSequence(0, store.BlocksForUniform(n), nullptr).ok());
  const std::vector<int32_t> all(ids.begin(), ids.end());
  m.Prefill(0, std::vector<int32_t>(all.begin(), all.begin() + from - 1), store);
  std::vector<at::Tensor> rows;
  for (int64_t pos = from - 1; pos < n - 1; ++pos) {
    rows.push_back(m.Decode({0}, {all[static_cast<size_t>(pos)]}, {pos}, store).squeeze(0));
  }
  return at::stack(rows).to(at::kFloat).cpu();
}

}  // namespace
}  // namespace snapserve::model

TORCH_LIBRARY_FRAGMENT(snapserve, m) {
  m.def(
      "paged_decode_seconds_on(str path, str dtype, str device, int prompt_tokens, int batch, "
      "int steps, int capacity, int window, int seed) -> float[]",
      &snapserve::model::PagedDecodeSecondsOn);
  m.def("paged_decode_logits_on(str path, str dtype, str device, int[] ids, int from) -> Tensor",
        &snapserve::model::PagedDecodeLogitsOn);
}
