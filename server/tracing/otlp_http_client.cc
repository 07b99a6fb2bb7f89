#include "server/tracing/otlp_http_client.h"

#if SNAPSERVE_OTLP_EXPORT
#include <curl/curl.h>
#endif

#include <mutex>

namespace snapserve::server::tracing {

std::string TracesUrl(const std::string& endpoint) {
  std::string url = endpoint;
  while (!url.empty() && url.back() == '/') url.pop_back();
  return url + "/v1/traces";
}

#if !SNAPSERVE_OTLP_EXPORT

bool OtlpExportBuiltIn() { return false; }

OtlpHttpClient::OtlpHttpClient(OtlpHttpOptions options)
    : url_(TracesUrl(options.endpoint)), options_(std::move(options)) {}

OtlpHttpClient::~OtlpHttpClient() = default;

bool OtlpHttpClient::Post(const std::string&, std::string* error) {
  *error = "this build has no OTLP exporter (SNAPSERVE_OTLP_EXPORT=OFF)";
  return false;
}

#else

bool OtlpExportBuiltIn() { return true; }

namespace {

// The collector's reply is only read for its status; its body (an
// ExportTraceServiceResponse) is discarded.
size_t Discard(char*, size_t size, size_t count, void*) { return size * count; }

void GlobalInitOnce() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

}  // namespace

OtlpHttpClient::OtlpHttpClient(OtlpHttpOptions options)
    : url_(TracesUrl(options.endpoint)), options_(std::move(options)) {
  GlobalInitOnce();
  curl_ = curl_easy_init();
}

OtlpHttpClient::~OtlpHttpClient() {
  if (curl_ != nullptr) curl_easy_cleanup(static_cast<CURL*>(curl_));
}

bool OtlpHttpClient::Post(const std::string& json_body, std::string* error) {
  auto* curl = static_cast<CURL*>(curl_);
  if (curl == nullptr) {
    *error = "libcurl could not start";
    return false;
  }
  curl_slist* headers = curl_slist_append(nullptr, "Content-Type: application/json");
  curl_easy_setopt(curl, CURLOPT_URL, url_.c_str());
  curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
  curl_easy_setopt(curl, CURLOPT_POST, 1L);
  curl_easy_setopt(curl, CURLOPT_POSTFIELDS, json_body.data());
  curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(json_body.size()));
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, &Discard);
  curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS,
                   static_cast<long>(options_.connect_timeout.count()));
  curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, static_cast<long>(options_.timeout.count()));
  // Timeouts without SIGALRM: the process has other threads.
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(curl, CURLOPT_PROTOCOLS_STR, "http,https");
  const CURLcode rc = curl_easy_perform(curl);
  curl_slist_free_all(headers);
  if (rc != CURLE_OK) {
    *error = curl_easy_strerror(rc);
    return false;
  }
  long code = 0;
  curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &code);
  if (code < 200 || code >= 300) {
    *error = "collector answered HTTP " + std::to_string(code);
    return false;
  }
  return true;
}

#endif  // SNAPSERVE_OTLP_EXPORT

}  // namespace snapserve::server::tracing
