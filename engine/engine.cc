#include "engine/engine.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <exception>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>
#include <unordered_set>

#include "engine/common/bounded_text.h"
#include "engine/common/reusing_cpu_allocator.h"
#include "engine/compress/compression_policy.h"
#include "engine/kv/document_cache.h"
#include "engine/kv/paged_kv_cache.h"
#include "engine/kv/prefix_cache.h"
#include "engine/kv/store/model_files_digest.h"
#include "engine/kv/store/redis_connection.h"
#include "engine/kv/store/shared_kv_tier.h"
#include "engine/model/gguf_file.h"
#include "engine/model/llama_model.h"
#include "engine/request_validation.h"
#include "engine/scheduler/model_executor.h"
#include "engine/scheduler/scheduler.h"
#include "engine/tokenizer/tokenizer.h"
#include "kernels/cpu/cpu_isa.h"

namespace snapserve::engine {
namespace {

at::ScalarType ToScalarType(Dtype dtype) {
  switch (dtype) {
    case Dtype::kBFloat16:
      return at::kBFloat16;
    case Dtype::kFloat16:
      return at::kHalf;
    case Dtype::kInt8:
      return at::kChar;
    case Dtype::kFloat32:
      break;
  }
  return at::kFloat;
}

at::Device ToAtDevice(const Device& device) {
  if (!device.is_cuda()) return at::Device(at::kCPU);
  return at::Device(at::kCUDA, static_cast<at::DeviceIndex>(device.index));
}

StatusOr<std::unique_ptr<tokenizer::Tokenizer>> LoadTokenizer(const std::string& path) {
  if (std::filesystem::is_directory(path)) return tokenizer::Tokenizer::FromHfDirectory(path);
  SNAPSERVE_ASSIGN_OR_RETURN(std::unique_ptr<model::GgufFile> gguf, model::GgufFile::Open(path));
  return tokenizer::Tokenizer::FromGguf(*gguf);
}

// Releases a request id from the in-flight set when the request ends, then
// passes the result on to the caller's sink.
class IdReleasingSink final : public ResultSink {
 public:
  IdReleasingSink(std::shared_ptr<ResultSink> inner, std::function<void()> release)
      : inner_(std::move(inner)), release_(std::move(release)) {}
  void OnDelta(const std::vector<uint32_t>& ids, const std::string& text,
               const std::vector<TokenLogprob>& logprobs) override {
    inner_->OnDelta(ids, text, logprobs);
  }
  void OnFinish(const Status& status, FinishReason reason, const Usage& usage) override {
    release_();
    inner_->OnFinish(status, reason, usage);
  }

 private:
  std::shared_ptr<ResultSink> inner_;
  std::function<void()> release_;
};

// What prompt K/V depend on besides the tokens: the model's files by content
// (kv/store/model_files_digest.h: the same on every replica that serves
// them, wherever they are mounted), the dtypes and precision paths of the
// prompt's arithmetic, the CPU path the kernels take, and the cache's
// chunking. Chunks computed under another fingerprint are never served, by
// this process or through a shared store.
StatusOr<uint64_t> ModelFingerprint(const EngineOptions& o, const model::LlamaModel& m,
                                    Dtype kv_dtype) {
  SNAPSERVE_ASSIGN_OR_RETURN(const uint64_t files, kv::ModelFilesDigest(o.model_path));
  const std::string id =
      "snapserve-prefix-v2|files=" + std::to_string(files) + "|dtype=" + dtype_name(o.dtype) +
      "|compute=" + std::string(c10::toString(m.compute_dtype())) + "|kv=" + dtype_name(kv_dtype) +
      "|quantized_dot=" + quant_dot_name(o.linear_precision.dot) +
      "|prefill_gemm=" + prefill_gemm_name(o.linear_precision.prefill) +
      "|decode_dot=" + decode_dot_name(o.linear_precision.decode) +
      "|device=" + device_name(o.device) + "|isa=" + kernels::cpu_isa_name(kernels::cpu_isa()) +
      "|chunk=" + std::to_string(o.prefix_cache_chunk_tokens);
  return kv::StableHash(id);
}

std::optional<kv::ChunkDtype> ToChunkDtype(at::ScalarType t) {
  switch (t) {
    case at::kFloat:
      return kv::ChunkDtype::kFloat32;
    case at::kBFloat16:
      return kv::ChunkDtype::kBFloat16;
    case at::kHalf:
      return kv::ChunkDtype::kFloat16;
    default:
      return std::nullopt;
  }
}

// The shared tier of `prefix` from options.kv_store (docs/kv-cache-and-
// scheduling.md, "Shared tier in Redis").
StatusOr<std::unique_ptr<kv::SharedKvTier>> MakeKvTier(
    const EngineOptions::KvStore& o, const kv::PrefixCache& prefix,
    const std::function<void(const std::string&)>& log) {
  if (!kv::HaveRedisClient()) {
    return Status::InvalidArgument(
        "kv_store: this build has no Redis client (it needs libhiredis-dev and libssl-dev)");
  }
  SNAPSERVE_ASSIGN_OR_RETURN(kv::RedisEndpoint endpoint, kv::ParseRedisUrl(o.url));
  endpoint.tls = endpoint.tls || o.tls;
  endpoint.tls_ca_file = o.tls_ca_file;
  endpoint.user = o.user;
  endpoint.password = o.password;
  if (endpoint.password.empty() && !o.password_file.empty()) {
    std::ifstream in(o.password_file, std::ios::binary);
    if (!in.is_open()) return Status::InvalidArgument("kv_store: cannot read " + o.password_file);
    std::ostringstream text;
    text << in.rdbuf();
    endpoint.password = text.str();
    while (!endpoint.password.empty() &&
           (endpoint.password.back() == '\n' || endpoint.password.back() == '\r')) {
      endpoint.password.pop_back();
    }
  }
  const kv::PrefixCacheConfig& pc = prefix.config();
  const std::optional<kv::ChunkDtype> dtype = ToChunkDtype(pc.dtype);
  if (!dtype) return Status::InvalidArgument("kv_store: unsupported K/V dtype");
  kv::SharedKvTierConfig c;
  c.endpoint = endpoint;
  c.layout = {pc.fingerprint,
              *dtype,
              static_cast<uint32_t>(pc.num_layers),
              static_cast<uint32_t>(pc.num_kv_heads),
              static_cast<uint32_t>(pc.head_dim),
              static_cast<uint32_t>(pc.chunk_tokens)};
  c.dtype = pc.dtype;
  c.ttl_s = o.ttl_s;
  c.fetch_wait = std::chrono::milliseconds(o.fetch_wait_ms);
  c.write_queue_chunks = o.write_queue_chunks;
  SNAPSERVE_ASSIGN_OR_RETURN(std::unique_ptr<kv::SharedKvTier> tier, kv::SharedKvTier::Create(c));
  // The endpoint without credentials (the URL never has any).
  log("kv store: " + std::string(endpoint.tls ? "rediss://" : "redis://") + endpoint.host + ":" +
      std::to_string(endpoint.port) + "/" + std::to_string(endpoint.db) +
      (endpoint.password.empty() ? "" : ", AUTH") + ", TTL " + std::to_string(o.ttl_s) + " s, " +
      std::to_string(c.layout.EntryBytes()) + " bytes per chunk entry");
  return tier;
}

}  // namespace

class Engine::Impl {
 public:
  EngineOptions options;
  ModelSummary summary;
  std::unique_ptr<model::LlamaModel> model;
  std::unique_ptr<tokenizer::Tokenizer> tokenizer;
  std::unique_ptr<kv::PagedKvCache> cache;
  std::unique_ptr<kv::PrefixCache> prefix_cache;      // null when off
  std::unique_ptr<kv::DocumentCache> document_cache;  // null when off
  // Declared before the scheduler: the scheduler's executor uses it.
  std::unique_ptr<kv::SharedKvTier> kv_tier;  // null when off
  std::unique_ptr<scheduler::Scheduler> scheduler;
  std::atomic<int64_t> next_seq_id{1};
  std::mutex ids_mu;
  std::unordered_set<std::string> ids_in_flight;

  StatusOr<std::vector<int32_t>> PromptIds(const GenerationRequest& r) const;
  // PromptIds, split into a document and its question when `r` has one.
  StatusOr<tokenizer::Tokenizer::DocumentAndQuestion> DocumentIds(const GenerationRequest& r) const;
};

StatusOr<tokenizer::Tokenizer::DocumentAndQuestion> Engine::Impl::DocumentIds(
    const GenerationRequest& r) const {
  if (r.question.empty()) {
    SNAPSERVE_ASSIGN_OR_RETURN(std::vector<int32_t> ids, PromptIds(r));
    return tokenizer::Tokenizer::DocumentAndQuestion{std::move(ids), {}};
  }
  tokenizer::Tokenizer::DocumentAndQuestion split;
  if (r.messages) {
    std::vector<tokenizer::ChatMessage> messages;
    for (const auto& m : *r.messages) messages.push_back({m.role, m.content});
    StatusOr<tokenizer::Tokenizer::DocumentAndQuestion> ids =
        tokenizer->EncodeChatDocument(messages, r.question);
    if (!ids.ok()) return Status::InvalidArgument("messages: " + ids.status().message());
    split = std::move(*ids);
  } else {
    SNAPSERVE_ASSIGN_OR_RETURN(split.document, PromptIds(r));
    split.question = tokenizer->Encode(r.question, /*add_special_tokens=*/false);
  }
  if (split.question.empty()) return Status::InvalidArgument("question: tokenizes to no tokens");
  return split;
}

StatusOr<std::vector<int32_t>> Engine::Impl::PromptIds(const GenerationRequest& r) const {
  if (r.input_ids) return std::vector<int32_t>(r.input_ids->begin(), r.input_ids->end());
  if (r.prompt) {
    return tokenizer->Encode(*r.prompt, /*add_special_tokens=*/true, r.split_special_tokens);
  }
  std::vector<tokenizer::ChatMessage> messages;
  for (const auto& m : *r.messages) messages.push_back({m.role, m.content});
  // Content is plain text here whatever split_special_tokens says: a message
  // must not be able to close its turn and open another (docs/api.md).
  StatusOr<std::vector<int32_t>> ids = tokenizer->EncodeChat(messages, true);
  if (!ids.ok()) return Status::InvalidArgument("messages: " + ids.status().message());
  return ids;
}

Engine::Engine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Engine::~Engine() { Shutdown(); }

namespace {
// Runs fn on a thread that ends with it, so that the OpenMP team its
// parallel regions open ends too (Engine::Create says why).
template <typename Fn>
void OnThreadOfItsOwn(Fn&& fn) {
  std::thread worker(std::forward<Fn>(fn));
  worker.join();
}
}  // namespace

StatusOr<std::unique_ptr<Engine>> Engine::Create(
    const EngineOptions& options, const std::function<void(const std::string&)>& progress) {
  auto log = [&](const std::string& line) {
    if (progress) progress(line);
  };
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  if (options.threads > 0) at::set_num_threads(options.threads);
  if (options.dtype == Dtype::kInt8) {
    return Status::InvalidArgument(
        "dtype: int8 is a KV cache dtype (--kv-cache-dtype), not a "
        "model dtype");
  }

  const at::ScalarType dtype = ToScalarType(options.dtype);
  const at::Device device = ToAtDevice(options.device);
  if (device.is_cuda() && !at::hasCUDA()) {
    return Status::InvalidArgument("device: " + device_name(options.device) +
                                   " requested but CUDA is not available");
  }

  // Loaders report a bad file as a Status; this catch is the backstop that
  // keeps an exception they missed (std::bad_alloc on a corrupt size, a
  // library's own error type) from ending the process without a word.
  //
  // The load runs on a thread of its own that ends with it. Loading uses
  // at::parallel_for, and OpenMP gives every thread that opens a parallel
  // region a team of workers that lives as long as that thread. A team left
  // on this (the main) thread beside the scheduler's would make libgomp see
  // more workers than cores and stop spinning at its barriers: every one of
  // the ~300 parallel regions of a decode step then put a thread to sleep
  // and woke it (20K context switches a second, decode at half speed,
  // docs/quantized-weights.md "OpenMP teams").
  Status loaded;
  OnThreadOfItsOwn([&] {
    loaded = [&]() -> Status {
      try {
        // The matrices' kernels are chosen, and their repacked data (int8
        // panels, bfloat16 copies) made, inside the load: on this thread too,
        // for the same reason.
        const model::LinearPrecision& precision = options.linear_precision;
        SNAPSERVE_ASSIGN_OR_RETURN(
            impl->model, model::LoadModel(options.model_path, dtype, device, log, precision));
        if (precision.decode == DecodeDot::kBFloat16) {
          log("--decode-dot=bfloat16: bfloat16 dot products at decode on " +
              std::to_string(impl->model->bf16_dot_matrices()) + " dense bfloat16 matrices (" +
              (kernels::has_avx512_bf16() ? "vdpbf16ps" : "emulated: this CPU lacks AVX512_BF16") +
              "); GGUF blocks keep --quantized-dot");
        }
        if (const int64_t copy = impl->model->repacked_bytes(); copy > 0) {
          log(std::string("layers' matrices repacked for --prefill-gemm=") +
              prefill_gemm_name(precision.prefill) + " --quantized-dot=" +
              quant_dot_name(precision.dot) + ": " + std::to_string(copy >> 20) + " MiB");
        }
        SNAPSERVE_ASSIGN_OR_RETURN(impl->tokenizer, LoadTokenizer(options.model_path));
      } catch (const std::exception& e) {
        return Status::Internal(options.model_path +
                                ": loading failed: " + Bounded(e.what(), 1000));
      }
      return Status::Ok();
    }();
  });
  if (!loaded.ok()) return loaded;
  // From here on, steps' large buffers are reused between steps instead of
  // being faulted in anew (engine/common/reusing_cpu_allocator.h).
  InstallReusingCpuAllocator();
  const model::ModelConfig& mc = impl->model->config();

  // Server defaults must be valid on their own (an empty request takes them all).
  StatusOr<KvCompressionConfig> defaults = compress::ResolveCompression(
      options.default_kv_compression, KvCompressionOverrides{}, mc.max_context);
  if (!defaults.ok()) {
    return Status::InvalidArgument("server defaults: " + defaults.status().message());
  }

  kv::PagedKvCacheConfig kc;
  kc.num_layers = mc.num_layers;
  kc.num_kv_heads = mc.num_kv_heads;
  kc.head_dim = mc.head_dim;
  kc.sliding_window = mc.sliding_window;
  kc.block_size = options.block_size;
  const Dtype kv_dtype = options.kv_cache_dtype.value_or(default_kv_cache_dtype(options.dtype));
  kc.dtype = ToScalarType(kv_dtype);
  kc.device = device;
  kc.prefault = options.kv_cache_prefault;
  const double share = options.prefix_cache_memory_share;
  if (!(share >= 0 && share < 1)) {
    return Status::InvalidArgument("prefix_cache_memory: the share must be in [0, 1), got " +
                                   std::to_string(share));
  }
  const auto prefix_bytes =
      static_cast<int64_t>(share * static_cast<double>(options.kv_cache_memory_bytes));
  const double document_share = options.document_cache_memory_share;
  if (!(document_share >= 0 && share + document_share < 1)) {
    return Status::InvalidArgument(
        "document_cache_memory: the share must be >= 0 and leave the paged cache some memory "
        "beside the prefix cache's, got " +
        std::to_string(document_share));
  }
  const auto document_bytes =
      static_cast<int64_t>(document_share * static_cast<double>(options.kv_cache_memory_bytes));
  kc.num_blocks = kv::PagedKvCache::NumBlocksForBudget(
      kc, options.kv_cache_memory_bytes - prefix_bytes - document_bytes);
  if (kc.num_blocks <= 0) {
    return Status::InvalidArgument(
        "kv_cache_memory: " + std::to_string(options.kv_cache_memory_bytes) +
        " bytes hold not even one block");
  }
  // Also on a thread of its own: the prefault writes the cache with
  // LibTorch's parallel fill, which on this thread would leave the team
  // described above and put every decode barrier to sleep under
  // --kv-cache-prefault=true, the deployment's setting (docs/kv-cache-and-scheduling.md).
  StatusOr<std::unique_ptr<kv::PagedKvCache>> cache = Status::Internal("KV cache not created");
  OnThreadOfItsOwn([&] { cache = kv::PagedKvCache::Create(kc); });
  SNAPSERVE_ASSIGN_OR_RETURN(impl->cache, std::move(cache));
  if (prefix_bytes > 0) {
    const int64_t chunk = options.prefix_cache_chunk_tokens;
    if (chunk <= 0 || options.max_step_tokens % chunk != 0) {
      return Status::InvalidArgument(
          "max_step_tokens: with the prefix cache on it must be a multiple of its " +
          std::to_string(chunk) + "-token chunks, got " + std::to_string(options.max_step_tokens));
    }
    kv::PrefixCacheConfig pc;
    pc.num_layers = mc.num_layers;
    pc.num_kv_heads = mc.num_kv_heads;
    pc.head_dim = mc.head_dim;
    pc.chunk_tokens = chunk;
    pc.dtype = impl->model->compute_dtype();
    pc.device = device;
    SNAPSERVE_ASSIGN_OR_RETURN(pc.fingerprint, ModelFingerprint(options, *impl->model, kv_dtype));
    pc.capacity_chunks = prefix_bytes / kv::PrefixCache::BytesPerChunk(pc);
    SNAPSERVE_ASSIGN_OR_RETURN(impl->prefix_cache, kv::PrefixCache::Create(pc));
    log("prefix cache: " + std::to_string(pc.capacity_chunks) + " chunks of " +
        std::to_string(chunk) + " tokens (" + std::to_string(pc.capacity_chunks * chunk) +
        " tokens, " + std::string(c10::toString(pc.dtype)) + ", " +
        std::to_string(prefix_bytes >> 20) + " MiB)");
  }
  if (document_bytes > 0) {
    impl->document_cache = std::make_unique<kv::DocumentCache>(document_bytes);
    log("document cache: " + std::to_string(document_bytes >> 20) + " MiB");
  }
  if (!options.kv_store.url.empty()) {
    if (impl->prefix_cache == nullptr) {
      return Status::InvalidArgument(
          "kv_store: the shared tier needs the prefix cache (prefix_cache_memory > 0)");
    }
    SNAPSERVE_ASSIGN_OR_RETURN(impl->kv_tier,
                               MakeKvTier(options.kv_store, *impl->prefix_cache, log));
  }
  log("KV cache: " + std::to_string(kc.num_blocks) + " blocks of " + std::to_string(kc.block_size) +
      " entries of one layer and KV head (" +
      std::to_string(static_cast<int64_t>(kc.num_blocks) * kc.block_size /
                     (kc.num_layers * kc.num_kv_heads)) +
      " tokens, " + dtype_name(kv_dtype) + (kc.prefault ? ", prefaulted" : "") +
      (impl->cache->huge_pages() ? ", 2 MiB pages" : "") + ")");

  ModelSummary& s = impl->summary;
  s.model_id = options.model_id.empty()
                   ? std::filesystem::path(options.model_path).filename().string()
                   : options.model_id;
  s.architecture = mc.architecture;
  s.num_layers = static_cast<uint32_t>(mc.num_layers);
  s.num_attention_heads = static_cast<uint32_t>(mc.num_heads);
  s.num_key_value_heads = static_cast<uint32_t>(mc.num_kv_heads);
  s.head_dim = static_cast<uint32_t>(mc.head_dim);
  s.vocab_size = static_cast<uint32_t>(mc.vocab);
  s.max_context_length = static_cast<uint32_t>(mc.max_context);
  s.dtype = options.dtype;
  s.kv_cache_dtype = kv_dtype;
  s.device = options.device;
  s.default_kv_compression = options.default_kv_compression;
  s.max_new_tokens_limit = static_cast<uint32_t>(options.max_new_tokens_limit);
  s.max_batch_size = static_cast<uint32_t>(options.max_batch_size);
  // Blocks hold one (layer, KV head) lane each: a token of an uncompressed
  // sequence takes one entry in every lane.
  s.kv_cache_capacity_tokens = static_cast<uint64_t>(kc.num_blocks) * kc.block_size /
                               static_cast<uint64_t>(kc.num_layers * kc.num_kv_heads);

  impl->scheduler = std::make_unique<scheduler::Scheduler>(
      std::make_unique<scheduler::ModelExecutor>(*impl->model, *impl->cache,
                                                 impl->prefix_cache.get(), impl->kv_tier.get(),
                                                 impl->document_cache.get()),
      scheduler::SchedulerOptions{
          scheduler::StepLimits{options.max_batch_size, options.max_step_tokens,
                                options.max_prefill_tokens_per_step},
          options.max_queue});
  return std::unique_ptr<Engine>(new Engine(std::move(impl)));
}

const ModelSummary& Engine::model() const { return impl_->summary; }

Status Engine::Enqueue(GenerationRequest request, std::shared_ptr<ResultSink> sink) {
  Impl& m = *impl_;
  const model::ModelConfig& mc = m.model->config();
  SNAPSERVE_RETURN_IF_ERROR(ValidateRequest(request, {mc.vocab, m.options.max_new_tokens_limit}));

  SNAPSERVE_ASSIGN_OR_RETURN(const KvCompressionConfig compression,
                             compress::ResolveCompression(m.options.default_kv_compression,
                                                          request.kv_compression, mc.max_context));

  SNAPSERVE_ASSIGN_OR_RETURN(auto ids, m.DocumentIds(request));
  std::vector<int32_t> prompt = std::move(ids.document);
  const int64_t n = static_cast<int64_t>(prompt.size());
  if (n == 0) return Status::InvalidArgument("prompt: tokenizes to no tokens");
  const auto question_tokens = static_cast<int64_t>(ids.question.size());
  const int64_t max_new =
      request.max_new_tokens == 0 ? m.options.default_max_new_tokens : request.max_new_tokens;
  if (n + question_tokens + max_new > mc.max_context) {
    return Status::InvalidArgument(
        "stopping.max_new_tokens: prompt (" + std::to_string(n + question_tokens) +
        " tokens) + max_new_tokens (" + std::to_string(max_new) + ") exceeds the context length " +
        std::to_string(mc.max_context));
  }
  // Reserve every block the request can ever hold (docs/kv-cache-and-scheduling.md,
  // "Admission and reservation"): per layer its policy's budget of the
  // prompt (a document's alone), the question, and max_new.
  kv::LaneReservation lanes{compress::LayerBudgets(compression, n, mc.num_layers),
                            compress::HeadsShareBudget(compression, n)};
  for (int64_t& entries : lanes.entries_per_layer) entries += question_tokens + max_new;
  const int64_t reserve = m.cache->BlocksFor(lanes);
  if (!m.cache->CanEverFit(reserve)) {
    return Status::ResourceExhausted(
        "request needs " +
        std::to_string(compress::KeptEntries(compression, n) + question_tokens + max_new) +
        " KV entries per layer and KV head (" + std::to_string(reserve) +
        " blocks); the whole cache holds " + std::to_string(m.summary.kv_cache_capacity_tokens) +
        " (" + std::to_string(m.cache->num_total_blocks()) + " blocks)");
  }

  {
    std::lock_guard<std::mutex> lock(m.ids_mu);
    if (!m.ids_in_flight.insert(request.request_id).second) {
      return Status::InvalidArgument("request_id: '" + request.request_id +
                                     "' is already in flight");
    }
  }
  auto release = [impl = impl_.get(), id = request.request_id] {
    std::lock_guard<std::mutex> lock(impl->ids_mu);
    impl->ids_in_flight.erase(id);
  };

  auto seq = std::make_unique<scheduler::Sequence>();
  seq->id = m.next_seq_id++;
  seq->request_id = request.request_id;
  seq->prompt = std::move(prompt);
  seq->question = std::move(ids.question);
  seq->compression = compression;
  seq->max_new_tokens = max_new;
  seq->reserve_blocks = reserve;
  seq->arrival = request.arrival;
  seq->deadline = request.deadline;
  sampling::SamplingParams sp;
  sp.temperature = request.temperature;
  sp.top_k = static_cast<int32_t>(request.top_k);
  sp.top_p = request.top_p == 0 ? 1.f : request.top_p;
  sp.repetition_penalty = request.repetition_penalty == 0 ? 1.f : request.repetition_penalty;
  sp.seed = request.seed;
  sp.logprobs = request.logprobs;
  std::vector<int32_t> context = seq->prompt;  // what a repetition penalty counts
  context.insert(context.end(), seq->question.begin(), seq->question.end());
  seq->sampler = std::make_unique<sampling::Sampler>(sp, context);
  sampling::StopCriteria stop;
  stop.max_new_tokens = max_new;
  stop.stop = request.stop;
  stop.stop_token_ids.assign(request.stop_token_ids.begin(), request.stop_token_ids.end());
  for (int64_t e : mc.eos_token_ids) stop.eos_token_ids.push_back(static_cast<int32_t>(e));
  if (stop.eos_token_ids.empty() && m.tokenizer->eos_id() >= 0) {
    stop.eos_token_ids.push_back(m.tokenizer->eos_id());
  }
  stop.ignore_eos = request.ignore_eos;
  seq->stop = std::make_unique<sampling::StopMatcher>(stop);
  seq->decoder = std::make_unique<tokenizer::IncrementalDecoder>(*m.tokenizer);
  seq->sink = std::make_shared<IdReleasingSink>(std::move(sink), release);

  Status submitted = m.scheduler->Submit(std::move(seq));
  if (!submitted.ok()) release();
  return submitted;
}

void Engine::Cancel(const std::string& request_id) { impl_->scheduler->Cancel(request_id); }

StatusOr<std::vector<uint32_t>> Engine::Tokenize(std::string_view text, bool add_special_tokens,
                                                 bool split_special_tokens) const {
  const std::vector<int32_t> ids =
      impl_->tokenizer->Encode(text, add_special_tokens, split_special_tokens);
  return std::vector<uint32_t>(ids.begin(), ids.end());
}

std::string Engine::TokenBytes(uint32_t id) const {
  if (id >= static_cast<uint32_t>(impl_->tokenizer->vocab_size())) return {};
  return impl_->tokenizer->TokenBytes(static_cast<int32_t>(id));
}

EngineStats Engine::stats() const { return impl_->scheduler->Stats(); }

void Engine::SetObserver(EngineObserver observer) {
  impl_->scheduler->SetObserver(std::move(observer));
}

std::vector<std::string> KvStoreErrorKinds() {
  std::vector<std::string> kinds;
  for (size_t i = 0; i < static_cast<size_t>(kv::KvStoreError::kCount); ++i) {
    kinds.emplace_back(kv::kv_store_error_name(static_cast<kv::KvStoreError>(i)));
  }
  return kinds;
}

KvStoreStats Engine::kv_store_stats() const {
  KvStoreStats s;
  kv::KvStoreCounters c;
  if (impl_->kv_tier) c = impl_->kv_tier->counters();
  s.read_hits = c.read_hits;
  s.read_misses = c.read_misses;
  s.writes = c.writes;
  s.bytes_read = c.bytes_read;
  s.bytes_written = c.bytes_written;
  for (size_t i = 0; i < c.errors.size(); ++i) {
    s.errors.emplace_back(kv::kv_store_error_name(static_cast<kv::KvStoreError>(i)), c.errors[i]);
  }
  return s;
}

void Engine::SetKvStoreLogger(std::function<void(const std::string&)> log) {
  if (impl_->kv_tier) impl_->kv_tier->SetLogger(std::move(log));
}

void Engine::Shutdown() {
  if (impl_ && impl_->scheduler) impl_->scheduler->Shutdown();
}

}  // namespace snapserve::engine
