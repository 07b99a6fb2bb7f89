#include "server/tracing/request_spans.h"

#include <algorithm>
#include <cmath>

namespace snapserve::server::tracing {
namespace {

bool Compressed(const FinishedRequest& r) {
  const engine::Usage& u = r.outcome.usage;
  return r.outcome.reached_engine && u.kv_method != engine::KvMethod::kNone &&
         !u.phases.prompt_chunks.empty();
}

// The request's attributes: the OpenTelemetry GenAI semantic conventions'
// names where they have one, snapserve.* for the rest.
void SetRootAttributes(const FinishedRequest& r, Span& s) {
  const RequestTrace& t = r.trace;
  const RequestOutcome& o = r.outcome;
  const engine::Usage& u = o.usage;
  s.Set("gen_ai.operation.name", t.operation);
  s.Set("gen_ai.request.model", t.model);
  s.Set("gen_ai.response.id", t.request_id);
  if (t.max_tokens > 0) s.Set("gen_ai.request.max_tokens", int64_t{t.max_tokens});
  s.Set("gen_ai.request.temperature", static_cast<double>(t.temperature));
  if (t.top_p > 0 && t.top_p < 1) s.Set("gen_ai.request.top_p", static_cast<double>(t.top_p));
  s.Set("snapserve.api", t.api);
  s.Set("snapserve.status", o.status);
  if (!o.reached_engine) return;
  s.Set("gen_ai.usage.input_tokens", int64_t{u.prompt_tokens});
  s.Set("gen_ai.usage.output_tokens", int64_t{u.completion_tokens});
  s.Set("gen_ai.usage.cache_read.input_tokens", int64_t{u.cached_prompt_tokens});
  if (o.status == "OK") {
    s.Set("gen_ai.response.finish_reasons",
          std::vector<std::string>{engine::finish_reason_name(o.reason)});
  }
  s.Set("snapserve.kv.method", std::string(engine::kv_method_name(u.kv_method)));
  s.Set("snapserve.kv.original_entries", int64_t{u.kv_prompt_entries});
  s.Set("snapserve.kv.kept_entries", int64_t{u.kv_kept_entries});
  s.Set("snapserve.kv.compression_ratio", static_cast<double>(u.compression_ratio));
  if (u.retained_attention >= 0) s.Set("snapserve.kv.retained_attention", u.retained_attention);
}

Span Child(const FinishedRequest& r, std::string name, int64_t start_ns, int64_t end_ns) {
  Span s;
  s.trace_id = r.trace.trace_id;
  s.span_id = NewSpanId();
  s.parent_span_id = r.trace.span_id;
  s.name = std::move(name);
  s.start_ns = start_ns;
  s.end_ns = std::max(start_ns, end_ns);
  return s;
}

}  // namespace

size_t CountRequestSpans(const FinishedRequest& r) {
  if (!r.outcome.reached_engine) return 1;
  const engine::PhaseTimes& p = r.outcome.usage.phases;
  return 2 + p.prompt_chunks.size() + (Compressed(r) ? 1 : 0) + (p.first_token_ns > 0 ? 1 : 0);
}

std::vector<Span> BuildRequestSpans(const FinishedRequest& r) {
  const RequestOutcome& o = r.outcome;
  const engine::Usage& u = o.usage;
  const engine::PhaseTimes& p = u.phases;
  std::vector<Span> spans;
  spans.reserve(CountRequestSpans(r));

  Span root;
  root.trace_id = r.trace.trace_id;
  root.span_id = r.trace.span_id;
  root.parent_span_id = r.trace.parent_span_id;
  root.name = "snapserve.generate";
  root.kind = SpanKind::kServer;
  // The engine's clock when it saw the request: its children then nest exactly.
  root.start_ns = o.reached_engine && p.arrival_ns > 0 ? p.arrival_ns : o.arrival_ns;
  root.end_ns = std::max({o.end_ns, p.end_ns, root.start_ns});
  root.error = o.server_error;
  if (o.server_error) root.error_message = o.error_message;
  SetRootAttributes(r, root);
  spans.push_back(std::move(root));
  if (!o.reached_engine) return spans;

  // Waiting for admission (and for a shared tier's prefix chunks), or until
  // the request ended when it never got admitted.
  spans.push_back(
      Child(r, "snapserve.queue", p.arrival_ns, p.admitted_ns > 0 ? p.admitted_ns : p.end_ns));

  for (size_t i = 0; i < p.prompt_chunks.size(); ++i) {
    const engine::PromptChunkTime& c = p.prompt_chunks[i];
    Span s = Child(r, "snapserve.prefill", c.start_ns, c.end_ns);
    s.Set("snapserve.prefill.chunk", static_cast<int64_t>(i));
    s.Set("snapserve.prefill.tokens", c.tokens);
    spans.push_back(std::move(s));
  }

  if (Compressed(r)) {
    // The selection runs layer by layer inside the prompt's last chunk; the
    // span carries its summed time, placed at the end of that chunk.
    // StreamingLLM's fixed selection is not timed (an empty span).
    const engine::PromptChunkTime& last = p.prompt_chunks.back();
    const auto selection_ns = static_cast<int64_t>(std::llround(std::max(0.0, u.snapkv_ms) * 1e6));
    Span s = Child(r, "snapserve.compression", std::max(last.start_ns, last.end_ns - selection_ns),
                   last.end_ns);
    s.Set("snapserve.kv.method", std::string(engine::kv_method_name(u.kv_method)));
    s.Set("snapserve.kv.original_entries", int64_t{u.kv_prompt_entries});
    s.Set("snapserve.kv.kept_entries", int64_t{u.kv_kept_entries});
    spans.push_back(std::move(s));
  }

  if (p.first_token_ns > 0) {
    Span s = Child(r, "snapserve.decode", p.first_token_ns, p.end_ns);
    s.Set("gen_ai.usage.output_tokens", int64_t{u.completion_tokens});
    spans.push_back(std::move(s));
  }
  return spans;
}

}  // namespace snapserve::server::tracing
