// POSTs OTLP/JSON bodies to a collector's /v1/traces with libcurl (Debian's
// libcurl4-openssl-dev; docs/metrics.md, "Traces" says why not
// opentelemetry-cpp). One connection, kept alive between batches; short
// connect and total timeouts, so a dead or slow collector costs the exporter
// thread a bounded wait and the request path nothing.
#pragma once

#include <chrono>
#include <string>

namespace snapserve::server::tracing {

struct OtlpHttpOptions {
  // The collector's base URL (http://host:4318); "/v1/traces" is appended,
  // as for OTEL_EXPORTER_OTLP_ENDPOINT.
  std::string endpoint;
  std::chrono::milliseconds connect_timeout{1000};
  std::chrono::milliseconds timeout{3000};
};

// Whether this build exports traces (CMake SNAPSERVE_OTLP_EXPORT: libcurl);
// without it --otlp-endpoint is refused at start.
bool OtlpExportBuiltIn();

// "http://host:4318" -> "http://host:4318/v1/traces" (one '/' between).
std::string TracesUrl(const std::string& endpoint);

class OtlpHttpClient {
 public:
  explicit OtlpHttpClient(OtlpHttpOptions options);
  ~OtlpHttpClient();
  OtlpHttpClient(const OtlpHttpClient&) = delete;
  OtlpHttpClient& operator=(const OtlpHttpClient&) = delete;

  // True when the collector answered 2xx. `error` gets why not.
  bool Post(const std::string& json_body, std::string* error);

 private:
  const std::string url_;
  const OtlpHttpOptions options_;
  void* curl_ = nullptr;  // CURL*, kept for connection reuse
};

}  // namespace snapserve::server::tracing
