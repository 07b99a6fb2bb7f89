// Structured logs: every line is one JSON object on stderr, written through
// spdlog, so that CloudWatch / Loki queries can read fields directly (the
// seed's queries read the `inference_complete` event; events and fields:
// docs/metrics.md, "Logs").
#pragma once

#include <nlohmann/json.hpp>

#include <string>

namespace snapserve::server {

// Sets up the process-wide logger. `level`: trace|debug|info|warn|error.
void InitLogging(const std::string& level);

// Writes one JSON line: {"ts": ..., "level": ..., "event": event, ...fields}.
void LogEvent(const std::string& level, const std::string& event, nlohmann::json fields = {});

}  // namespace snapserve::server
