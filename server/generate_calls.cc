#include "server/generate_calls.h"

#include <chrono>
#include <deque>
#include <mutex>
#include <utility>

#include "engine/common/bounded_text.h"
#include "engine/request_validation.h"
#include "server/generation_service.h"
#include "server/logging.h"
#include "server/metrics.h"
#include "server/request_conversion.h"
#include "server/tracing/tracer.h"

namespace snapserve::server {
namespace {

namespace v1 = snapserve::v1;
using Clock = std::chrono::steady_clock;

// The client's deadline on the engine's clock.
Clock::time_point EngineDeadline(const grpc::CallbackServerContext& ctx) {
  const auto deadline = ctx.deadline();
  if (deadline >= std::chrono::system_clock::time_point::max() - std::chrono::hours(24 * 365)) {
    return Clock::time_point::max();
  }
  return Clock::now() + (deadline - std::chrono::system_clock::now());
}

// gRPC cancels a call whose deadline passed (OnCancel -> Engine::Cancel), and
// that cancellation usually reaches the scheduler before its own deadline
// check, so the engine says CANCELLED. The client sees DEADLINE_EXCEEDED;
// report the same in metrics and logs (found by test_server_e2e.py). The
// client's own deadline fires a little before ours (ours counts from when its
// headers arrived) and its RST_STREAM then reaches us as a cancellation just
// before our deadline: a cancellation that close to the deadline is the deadline.
grpc::Status DeadlineAware(const grpc::Status& status,
                           std::chrono::system_clock::time_point deadline) {
  constexpr auto kSlack = std::chrono::milliseconds(500);
  if (status.error_code() == grpc::StatusCode::CANCELLED &&
      std::chrono::system_clock::now() + kSlack >= deadline) {
    return {grpc::StatusCode::DEADLINE_EXCEEDED, "deadline passed"};
  }
  return status;
}

// The client's W3C traceparent, from the call's metadata ("" when absent).
std::string_view ClientTraceParent(const grpc::CallbackServerContext& ctx) {
  const auto& metadata = ctx.client_metadata();
  const auto it = metadata.find("traceparent");
  if (it == metadata.end()) return {};
  return {it->second.data(), it->second.size()};
}

// Codes that mean the server failed the request, as OpenTelemetry's gRPC
// conventions mark a server span's error status; a client's mistake is not one.
bool IsServerError(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::UNKNOWN:
    case grpc::StatusCode::DEADLINE_EXCEEDED:
    case grpc::StatusCode::UNIMPLEMENTED:
    case grpc::StatusCode::INTERNAL:
    case grpc::StatusCode::UNAVAILABLE:
    case grpc::StatusCode::DATA_LOSS:
      return true;
    default:
      return false;
  }
}

int64_t EpochNanosNow() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

std::optional<tracing::RequestTrace> BeginTrace(tracing::Tracer* tracer,
                                                std::string_view traceparent, const char* api,
                                                const engine::Engine& engine,
                                                const v1::GenerateRequest& request,
                                                const engine::GenerationRequest& converted) {
  if (tracer == nullptr) return std::nullopt;
  tracing::RequestTrace t =
      tracer->Begin(traceparent, api, request.has_messages() ? "chat" : "text_completion",
                    engine.model().model_id, converted.request_id);
  t.max_tokens = converted.max_new_tokens;
  t.temperature = converted.temperature;
  t.top_p = converted.top_p;
  return t;
}

Status CheckRequest(const engine::Engine& engine, const v1::GenerateRequest& request,
                    const engine::GenerationRequest& converted) {
  SNAPSERVE_RETURN_IF_ERROR(CheckEnumValues(request));
  return engine::CheckInputBytes(converted, engine.model().max_context_length);
}

// One `kv_cache_compressed` line per request whose prompt KV the engine
// compressed: the event the seed's CloudWatch Logs Insights query filters on
// (README, "Logs Insights queries"), with the policy that chose what to keep.
static void LogCompression(const std::string& request_id, const engine::Usage& usage) {
  LogEvent("info", "kv_cache_compressed",
           {{"request_id", Bounded(request_id)},
            {"method", engine::kv_method_name(usage.kv_method)},
            {"kv_original_size", usage.kv_prompt_entries},
            {"kv_compressed_size", usage.kv_kept_entries},
            {"kv_kept_entries_total", usage.kv_kept_entries_total},
            {"kv_bytes_held", usage.kv_bytes_held},
            {"compression_ratio", usage.compression_ratio},
            // null when not measured (docs/metrics.md, "Logs")
            {"retained_attention", usage.retained_attention >= 0
                                       ? nlohmann::json(usage.retained_attention)
                                       : nlohmann::json(nullptr)},
            {"prompt_tokens", usage.prompt_tokens}});
}

void ReportCall(Metrics* metrics, const std::string& request_id, const grpc::Status& status,
                const Status& engine_status, engine::FinishReason reason,
                const engine::Usage& usage, bool reached_engine, Clock::time_point arrival,
                const tracing::RequestTrace* trace) {
  const std::string code = GrpcCodeName(status.error_code());
  const Clock::duration total = Clock::now() - arrival;
  const double total_s = std::chrono::duration<double>(total).count();
  if (metrics != nullptr) {
    RequestRecord r;
    r.status = code;
    r.total_s = total_s;
    if (reached_engine) {
      r.queue_s = usage.queue_ms / 1e3;
      if (usage.completion_tokens > 0) r.ttft_s = usage.time_to_first_token_ms / 1e3;
      r.prompt_tokens = usage.prompt_tokens;
      r.cached_prompt_tokens = usage.cached_prompt_tokens;
      r.document_cache_hit = usage.document_cache_hit;
      r.completion_tokens = usage.completion_tokens;
      r.kv_entries_before = usage.kv_prompt_entries;
      r.kv_entries_after = usage.kv_kept_entries;
      r.snapkv_s = usage.snapkv_ms >= 0 ? usage.snapkv_ms / 1e3 : -1;
      r.retained_attention = usage.retained_attention;
    }
    metrics->RecordRequest(r);
  }
  // The id is the client's: when too long (rejected) it is still logged, bounded.
  nlohmann::json fields = {{"request_id", Bounded(request_id)},
                           {"status", code},
                           {"finish_reason", v1::FinishReason_Name(ToProto(reason))},
                           {"prompt_tokens", usage.prompt_tokens},
                           {"completion_tokens", usage.completion_tokens},
                           {"kv_original_size", usage.kv_prompt_entries},
                           {"kv_compressed_size", usage.kv_kept_entries},
                           {"compression_ratio", usage.compression_ratio},
                           {"queue_ms", usage.queue_ms},
                           {"ttft_ms", usage.time_to_first_token_ms},
                           {"duration_ms", total_s * 1e3}};
  if (!status.ok()) {
    fields["error"] = status.error_code() == grpc::StatusCode::INTERNAL ? engine_status.message()
                                                                        : status.error_message();
  }
  LogEvent(status.ok() || status.error_code() == grpc::StatusCode::CANCELLED ? "info" : "warn",
           "inference_complete", fields);
  // Whatever the call's end, the prompt was compressed once it was prefilled.
  if (reached_engine && usage.kv_kept_entries < usage.kv_prompt_entries) {
    LogCompression(request_id, usage);
  }
  if (trace != nullptr && trace->tracer != nullptr) {
    tracing::RequestOutcome outcome;
    outcome.status = code;
    outcome.server_error = IsServerError(status.error_code());
    if (outcome.server_error) outcome.error_message = status.error_message();
    outcome.reason = reason;
    outcome.reached_engine = reached_engine;
    outcome.end_ns = EpochNanosNow();
    outcome.arrival_ns =
        outcome.end_ns - std::chrono::duration_cast<std::chrono::nanoseconds>(total).count();
    outcome.usage = usage;
    trace->tracer->End(*trace, std::move(outcome));
  }
}

namespace {

// ---------------------------------------------------------------- unary ---

class UnaryCall final : public grpc::ServerUnaryReactor {
 public:
  UnaryCall(const CallContext& ctx, grpc::CallbackServerContext* server_ctx,
            const v1::GenerateRequest* request, v1::GenerateResponse* response)
      : ctx_(ctx), response_(response) {
    ctx_.in_flight->Begin();
    engine::GenerationRequest req = ToEngineRequest(*request);
    if (req.request_id.empty()) req.request_id = NewRequestId();
    request_id_ = req.request_id;
    response_->set_request_id(request_id_);
    deadline_ = server_ctx->deadline();
    req.deadline = EngineDeadline(*server_ctx);
    req.arrival = arrival_;
    trace_ = BeginTrace(ctx_.tracer, ClientTraceParent(*server_ctx), "grpc", *ctx_.engine, *request,
                        req);
    Status queued = CheckRequest(*ctx_.engine, *request, req);
    if (queued.ok()) queued = ctx_.engine->Enqueue(std::move(req), std::make_shared<Sink>(this));
    if (!queued.ok()) {
      Complete(ToGrpc(queued, request_id_), queued, {}, {}, /*reached_engine=*/false);
    }
  }

  void OnCancel() override { ctx_.engine->Cancel(request_id_); }
  void OnDone() override {
    ctx_.in_flight->End();
    delete this;
  }

 private:
  class Sink final : public engine::ResultSink {
   public:
    explicit Sink(UnaryCall* call) : call_(call) {}
    void OnDelta(const std::vector<uint32_t>& ids, const std::string& text,
                 const std::vector<engine::TokenLogprob>& logprobs) override {
      for (uint32_t id : ids) call_->response_->add_token_ids(id);
      call_->response_->mutable_text()->append(text);
      AddLogprobs(logprobs, call_->response_->mutable_logprobs());
    }
    void OnFinish(const Status& status, engine::FinishReason reason,
                  const engine::Usage& usage) override {
      call_->Complete(DeadlineAware(ToGrpc(status, call_->request_id_), call_->deadline_), status,
                      reason, usage, /*reached_engine=*/true);
    }

   private:
    UnaryCall* call_;
  };

  void Complete(const grpc::Status& status, const Status& engine_status,
                engine::FinishReason reason, const engine::Usage& usage, bool reached_engine) {
    if (status.ok()) {
      response_->set_finish_reason(ToProto(reason));
      FillUsage(usage, response_->mutable_usage());
    }
    ReportCall(ctx_.metrics, request_id_, status, engine_status, reason, usage, reached_engine,
               arrival_, trace_ ? &*trace_ : nullptr);
    Finish(status);  // last use of `this`: OnDone may delete it right after
  }

  CallContext ctx_;
  v1::GenerateResponse* response_;
  std::string request_id_;
  std::chrono::system_clock::time_point deadline_;
  Clock::time_point arrival_ = Clock::now();
  std::optional<tracing::RequestTrace> trace_;
};

// ------------------------------------------------------------ streaming ---

class StreamCall final : public grpc::ServerWriteReactor<v1::GenerateStreamResponse> {
 public:
  StreamCall(const CallContext& ctx, grpc::CallbackServerContext* server_ctx,
             const v1::GenerateRequest* request)
      : ctx_(ctx) {
    ctx_.in_flight->Begin();
    engine::GenerationRequest req = ToEngineRequest(*request);
    if (req.request_id.empty()) req.request_id = NewRequestId();
    request_id_ = req.request_id;
    deadline_ = server_ctx->deadline();
    req.deadline = EngineDeadline(*server_ctx);
    req.arrival = arrival_;
    trace_ = BeginTrace(ctx_.tracer, ClientTraceParent(*server_ctx), "grpc", *ctx_.engine, *request,
                        req);
    Status queued = CheckRequest(*ctx_.engine, *request, req);
    if (queued.ok()) queued = ctx_.engine->Enqueue(std::move(req), std::make_shared<Sink>(this));
    if (!queued.ok()) {
      const grpc::Status status = ToGrpc(queued, request_id_);
      ReportCall(ctx_.metrics, request_id_, status, queued, {}, {}, false, arrival_,
                 trace_ ? &*trace_ : nullptr);
      Finish(status);
    }
  }

  void OnCancel() override { ctx_.engine->Cancel(request_id_); }

  void OnWriteDone(bool ok) override {
    Action next;
    {
      std::lock_guard<std::mutex> lock(mu_);
      writing_ = false;
      if (!ok) broken_ = true;  // the client is gone; the engine was told in OnCancel
      next = NextAction();
    }
    Perform(next);
  }

  void OnDone() override {
    ctx_.in_flight->End();
    delete this;
  }

 private:
  class Sink final : public engine::ResultSink {
   public:
    explicit Sink(StreamCall* call) : call_(call) {}
    void OnDelta(const std::vector<uint32_t>& ids, const std::string& text,
                 const std::vector<engine::TokenLogprob>& logprobs) override {
      v1::GenerateStreamResponse m;
      m.set_request_id(call_->request_id_);
      m.set_text(text);
      for (uint32_t id : ids) m.add_token_ids(id);
      AddLogprobs(logprobs, m.mutable_logprobs());
      call_->Push(std::move(m));
    }
    void OnFinish(const Status& status, engine::FinishReason reason,
                  const engine::Usage& usage) override {
      call_->End(DeadlineAware(ToGrpc(status, call_->request_id_), call_->deadline_), status,
                 reason, usage);
    }

   private:
    StreamCall* call_;
  };

  // What to do once the lock is released: gRPC calls (StartWrite, Finish)
  // are never made under mu_, since Finish may lead to OnDone deleting us.
  enum class Action { kNothing, kWrite, kFinish };

  // Called with mu_ held; at most one write in flight.
  Action NextAction() {
    if (writing_) return Action::kNothing;
    if (!broken_ && !queue_.empty()) {
      current_ = std::move(queue_.front());
      queue_.pop_front();
      writing_ = true;
      return Action::kWrite;
    }
    if (finished_ && !finish_called_) {
      finish_called_ = true;
      return Action::kFinish;
    }
    return Action::kNothing;
  }

  void Perform(Action action) {
    if (action == Action::kWrite) StartWrite(&current_);
    if (action == Action::kFinish) Finish(final_status_);
  }

  void Push(v1::GenerateStreamResponse m) {
    Action next;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (broken_) return;
      queue_.push_back(std::move(m));
      next = NextAction();
    }
    Perform(next);
  }

  void End(const grpc::Status& status, const Status& engine_status, engine::FinishReason reason,
           const engine::Usage& usage) {
    ReportCall(ctx_.metrics, request_id_, status, engine_status, reason, usage, true, arrival_,
               trace_ ? &*trace_ : nullptr);
    Action next;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (status.ok()) {
        // The last message carries the finish reason and usage.
        v1::GenerateStreamResponse last;
        last.set_request_id(request_id_);
        last.set_finish_reason(ToProto(reason));
        FillUsage(usage, last.mutable_usage());
        queue_.push_back(std::move(last));
      } else {
        queue_.clear();  // an error ends the stream now; undelivered deltas are moot
      }
      final_status_ = status;
      finished_ = true;
      next = NextAction();
    }
    Perform(next);
  }

  CallContext ctx_;
  std::string request_id_;
  std::chrono::system_clock::time_point deadline_;
  Clock::time_point arrival_ = Clock::now();
  std::optional<tracing::RequestTrace> trace_;

  std::mutex mu_;
  std::deque<v1::GenerateStreamResponse> queue_;
  v1::GenerateStreamResponse current_;
  bool writing_ = false;
  bool broken_ = false;
  bool finished_ = false;
  bool finish_called_ = false;
  grpc::Status final_status_;
};

}  // namespace

grpc::ServerUnaryReactor* StartGenerateCall(const CallContext& ctx,
                                            grpc::CallbackServerContext* server_ctx,
                                            const v1::GenerateRequest* request,
                                            v1::GenerateResponse* response) {
  return new UnaryCall(ctx, server_ctx, request, response);
}

grpc::ServerWriteReactor<v1::GenerateStreamResponse>* StartGenerateStreamCall(
    const CallContext& ctx, grpc::CallbackServerContext* server_ctx,
    const v1::GenerateRequest* request) {
  return new StreamCall(ctx, server_ctx, request);
}

}  // namespace snapserve::server
