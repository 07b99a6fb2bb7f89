#include "server/request_conversion.h"

#include <cmath>
#include <random>

#include "engine/common/bounded_text.h"

namespace snapserve::server {

namespace v1 = snapserve::v1;

engine::GenerationRequest ToEngineRequest(const v1::GenerateRequest& r) {
  engine::GenerationRequest e;
  e.request_id = r.request_id();
  switch (r.input_case()) {
    case v1::GenerateRequest::kPrompt:
      e.prompt = r.prompt();
      break;
    case v1::GenerateRequest::kInputIds:
      e.input_ids = std::vector<uint32_t>(r.input_ids().ids().begin(), r.input_ids().ids().end());
      break;
    case v1::GenerateRequest::kMessages: {
      std::vector<engine::ChatMessage> messages;
      for (const auto& m : r.messages().messages()) messages.push_back({m.role(), m.content()});
      e.messages = std::move(messages);
      break;
    }
    case v1::GenerateRequest::INPUT_NOT_SET:
      break;
  }
  e.split_special_tokens = r.split_special_tokens();
  e.question = r.question();
  const auto& s = r.sampling();
  e.temperature = s.temperature();
  e.top_k = s.top_k();
  e.top_p = s.top_p();
  e.repetition_penalty = s.repetition_penalty();
  if (s.has_seed()) e.seed = s.seed();
  const auto& st = r.stopping();
  e.max_new_tokens = st.max_new_tokens();
  e.stop.assign(st.stop().begin(), st.stop().end());
  e.stop_token_ids.assign(st.stop_token_ids().begin(), st.stop_token_ids().end());
  e.ignore_eos = st.ignore_eos();
  const auto& kv = r.kv_compression();
  switch (kv.method()) {
    case v1::KvCompression::NONE:
      e.kv_compression.method = engine::KvMethod::kNone;
      break;
    case v1::KvCompression::SNAPKV:
      e.kv_compression.method = engine::KvMethod::kSnapKv;
      break;
    case v1::KvCompression::STREAMING_LLM:
      e.kv_compression.method = engine::KvMethod::kStreamingLlm;
      break;
    case v1::KvCompression::ADAKV:
      e.kv_compression.method = engine::KvMethod::kAdaKv;
      break;
    case v1::KvCompression::PYRAMIDKV:
      e.kv_compression.method = engine::KvMethod::kPyramidKv;
      break;
    case v1::KvCompression::KEYDIFF:
      e.kv_compression.method = engine::KvMethod::kKeyDiff;
      break;
    default:  // METHOD_UNSPECIFIED: the server default
      break;
  }
  e.kv_compression.window = kv.window_size();
  e.kv_compression.capacity = kv.max_capacity_prompt();
  e.kv_compression.kernel_size = kv.kernel_size();
  e.kv_compression.sink_tokens = kv.sink_tokens();
  // A float on the wire: 0.7f is 0.69999999 and floor(0.7f * 100) would be
  // 69. Six decimals are what a client can mean; they make it 0.7 again.
  e.kv_compression.adakv_alpha =
      std::round(static_cast<double>(kv.adakv_alpha_safeguard()) * 1e6) / 1e6;
  e.kv_compression.pyramid_beta = kv.pyramid_beta();
  switch (kv.pooling()) {
    case v1::KvCompression::MAX:
      e.kv_compression.pooling = engine::KvPooling::kMax;
      break;
    case v1::KvCompression::AVG:
      e.kv_compression.pooling = engine::KvPooling::kAvg;
      break;
    default:  // POOLING_UNSPECIFIED: the server default
      break;
  }
  e.logprobs.enabled = r.logprobs().enabled();
  e.logprobs.top_logprobs = r.logprobs().top_logprobs();
  return e;
}

Status CheckEnumValues(const v1::GenerateRequest& r) {
  // Without this an unknown method or pooling silently fell back to the
  // server default (e.g. a client asking for a future method got SnapKV).
  const auto& kv = r.kv_compression();
  if (!v1::KvCompression::Method_IsValid(kv.method())) {
    return Status::InvalidArgument("kv_compression.method: unknown value " +
                                   std::to_string(kv.method()));
  }
  if (!v1::KvCompression::Pooling_IsValid(kv.pooling())) {
    return Status::InvalidArgument("kv_compression.pooling: unknown value " +
                                   std::to_string(kv.pooling()));
  }
  return Status::Ok();
}

v1::FinishReason ToProto(engine::FinishReason reason) {
  switch (reason) {
    case engine::FinishReason::kLength:
      return v1::LENGTH;
    case engine::FinishReason::kEos:
      return v1::EOS;
    case engine::FinishReason::kStopSequence:
      return v1::STOP_SEQUENCE;
    case engine::FinishReason::kStopToken:
      return v1::STOP_TOKEN;
    case engine::FinishReason::kUnspecified:
      break;
  }
  return v1::FINISH_REASON_UNSPECIFIED;
}

v1::KvCompression::Method ToProto(engine::KvMethod method) {
  switch (method) {
    case engine::KvMethod::kNone:
      return v1::KvCompression::NONE;
    case engine::KvMethod::kSnapKv:
      return v1::KvCompression::SNAPKV;
    case engine::KvMethod::kStreamingLlm:
      return v1::KvCompression::STREAMING_LLM;
    case engine::KvMethod::kAdaKv:
      return v1::KvCompression::ADAKV;
    case engine::KvMethod::kPyramidKv:
      return v1::KvCompression::PYRAMIDKV;
    case engine::KvMethod::kKeyDiff:
      return v1::KvCompression::KEYDIFF;
  }
  return v1::KvCompression::METHOD_UNSPECIFIED;
}

void FillUsage(const engine::Usage& u, v1::Usage* out) {
  out->set_prompt_tokens(u.prompt_tokens);
  out->set_cached_prompt_tokens(u.cached_prompt_tokens);
  out->set_document_cache_hit(u.document_cache_hit);
  out->set_completion_tokens(u.completion_tokens);
  out->set_kv_prompt_entries(u.kv_prompt_entries);
  out->set_kv_kept_entries(u.kv_kept_entries);
  out->set_kv_kept_entries_total(u.kv_kept_entries_total);
  out->set_kv_bytes_held(u.kv_bytes_held);
  out->set_compression_ratio(u.compression_ratio);
  out->set_queue_ms(u.queue_ms);
  out->set_time_to_first_token_ms(u.time_to_first_token_ms);
  out->set_total_ms(u.total_ms);
  // Unset (optional field) when nothing was compressed or nothing measured.
  if (u.retained_attention >= 0) {
    out->set_retained_attention_ratio(static_cast<float>(u.retained_attention));
  }
  out->set_kv_method(ToProto(u.kv_method));
}

void AddLogprobs(const std::vector<engine::TokenLogprob>& logprobs,
                 google::protobuf::RepeatedPtrField<v1::TokenLogprob>* out) {
  for (const engine::TokenLogprob& l : logprobs) {
    v1::TokenLogprob* t = out->Add();
    t->set_token_id(l.token_id);
    t->set_logprob(l.logprob);
    for (const engine::TopLogprob& top : l.top_logprobs) {
      v1::TopLogprob* alt = t->add_top_logprobs();
      alt->set_token_id(top.token_id);
      alt->set_logprob(top.logprob);
    }
  }
}

void FillModelInfo(const engine::ModelSummary& s, v1::ModelInfo* out) {
  out->set_model_id(s.model_id);
  out->set_architecture(s.architecture);
  out->set_num_layers(s.num_layers);
  out->set_num_attention_heads(s.num_attention_heads);
  out->set_num_key_value_heads(s.num_key_value_heads);
  out->set_head_dim(s.head_dim);
  out->set_vocab_size(s.vocab_size);
  out->set_max_context_length(s.max_context_length);
  out->set_dtype(engine::dtype_name(s.dtype));
  out->set_device(engine::device_name(s.device));
  const engine::KvCompressionConfig& d = s.default_kv_compression;
  auto* kv = out->mutable_default_kv_compression();
  kv->set_method(ToProto(d.method));
  kv->set_window_size(static_cast<uint32_t>(d.window));
  kv->set_max_capacity_prompt(static_cast<uint32_t>(d.capacity));
  kv->set_kernel_size(static_cast<uint32_t>(d.kernel_size));
  kv->set_pooling(d.pooling == engine::KvPooling::kAvg ? v1::KvCompression::AVG
                                                       : v1::KvCompression::MAX);
  kv->set_sink_tokens(static_cast<uint32_t>(d.sink_tokens));
  kv->set_adakv_alpha_safeguard(static_cast<float>(d.adakv_alpha));
  kv->set_pyramid_beta(static_cast<uint32_t>(d.pyramid_beta));
  out->set_max_new_tokens_limit(s.max_new_tokens_limit);
  out->set_max_batch_size(s.max_batch_size);
  out->set_kv_cache_capacity_tokens(s.kv_cache_capacity_tokens);
  out->set_kv_cache_dtype(engine::dtype_name(s.kv_cache_dtype));
}

namespace {

// The engine's codes and the gRPC codes they map to: the one table behind
// ToGrpc and GrpcCodeName (names come from status_code_name).
struct CodePair {
  StatusCode engine;
  grpc::StatusCode grpc;
};
constexpr CodePair kCodes[] = {
    {StatusCode::kOk, grpc::StatusCode::OK},
    {StatusCode::kInvalidArgument, grpc::StatusCode::INVALID_ARGUMENT},
    {StatusCode::kResourceExhausted, grpc::StatusCode::RESOURCE_EXHAUSTED},
    {StatusCode::kDeadlineExceeded, grpc::StatusCode::DEADLINE_EXCEEDED},
    {StatusCode::kCancelled, grpc::StatusCode::CANCELLED},
    {StatusCode::kUnavailable, grpc::StatusCode::UNAVAILABLE},
    {StatusCode::kNotFound, grpc::StatusCode::NOT_FOUND},
    {StatusCode::kUnimplemented, grpc::StatusCode::UNIMPLEMENTED},
    {StatusCode::kInternal, grpc::StatusCode::INTERNAL},
};

}  // namespace

grpc::Status ToGrpc(const Status& s, std::string_view request_id) {
  if (s.ok()) return grpc::Status::OK;
  if (s.code() == StatusCode::kInternal) {
    std::string message = "internal error";
    if (!request_id.empty()) message += " in request " + Bounded(request_id);
    return {grpc::StatusCode::INTERNAL, message + "; the details are in the server log"};
  }
  for (const CodePair& c : kCodes) {
    if (c.engine == s.code()) return {c.grpc, s.message()};
  }
  return {grpc::StatusCode::UNKNOWN, s.message()};
}

std::string GrpcCodeName(grpc::StatusCode code) {
  for (const CodePair& c : kCodes) {
    if (c.grpc == code) return status_code_name(c.engine);
  }
  return "UNKNOWN";
}

std::string NewRequestId() {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  static const char* hex = "0123456789abcdef";
  std::string id(32, '0');
  for (int i = 0; i < 32; i += 16) {
    uint64_t x = rng();
    for (int j = 0; j < 16; ++j, x >>= 4) id[i + j] = hex[x & 15];
  }
  return id;
}

}  // namespace snapserve::server
