#include "server/server_config.h"

#include <cctype>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <optional>
#include <sstream>
#include <utility>

#include "engine/common/bounded_text.h"
#include "server/tracing/otlp_http_client.h"

namespace snapserve::server {
namespace {

// One flag: its name on the command line (dashes), help, and how to store a
// value. `set` returns an error message, or "" on success.
struct FlagSpec {
  const char* name;
  const char* help;
  std::function<std::string(ServerConfig&, const std::string&)> set;
  // The value in --help's "default" column, from a default-constructed config.
  std::function<std::string(const ServerConfig&)> show;
};

// Flags under one heading of --help and of the README's table.
struct FlagGroup {
  const char* title;
  std::vector<FlagSpec> flags;
};

template <typename Int>
std::string SetInt(Int& field, const std::string& v, int64_t lo, int64_t hi) {
  char* end = nullptr;
  errno = 0;
  const long long x = std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0' || errno != 0 || x < lo || x > hi) {
    return "expected an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) +
           "], got '" + Bounded(v) + "'";
  }
  field = static_cast<Int>(x);
  return "";
}

// A share of --kv-cache-memory, in [0, 0.9].
std::string SetMemoryShare(double& field, const std::string& v) {
  char* end = nullptr;
  const double x = std::strtod(v.c_str(), &end);
  if (v.empty() || *end != '\0' || !std::isfinite(x) || x < 0 || x > 0.9)
    return std::string("expected a share in [0, 0.9], got '") + Bounded(v) + "'";
  field = x;
  return "";
}

std::string ShareText(double share) {
  std::ostringstream o;
  o << share;
  return o.str();
}

std::string SetChoice(std::string& field, const std::string& v,
                      std::initializer_list<const char*> choices) {
  std::string all;
  for (const char* c : choices) {
    if (v == c) {
      field = v;
      return "";
    }
    all += all.empty() ? c : std::string("|") + c;
  }
  return "expected one of " + all + ", got '" + Bounded(v) + "'";
}

// The value of `values` whose name is `text`.
template <typename T>
StatusOr<T> ParseNamed(const std::string& text, std::initializer_list<T> values,
                       const char* (*name)(T)) {
  std::string all;
  for (T v : values) {
    if (text == name(v)) return v;
    all += all.empty() ? name(v) : std::string("|") + name(v);
  }
  return Status::InvalidArgument("expected one of " + all + ", got '" + Bounded(text) + "'");
}

// Stores a parsed value in `field`; returns the parse error's message, or "".
template <typename T>
std::string SetParsed(T& field, StatusOr<T> parsed) {
  if (!parsed.ok()) return parsed.status().message();
  field = *parsed;
  return "";
}

// The same for a setting whose absence means "derive it" (e.g. the KV cache
// dtype from the model dtype).
template <typename T>
std::string SetParsed(std::optional<T>& field, StatusOr<T> parsed) {
  T value{};
  std::string error = SetParsed(value, std::move(parsed));
  if (error.empty()) field = value;
  return error;
}

// What --help shows as the default of a setting the preset chooses.
constexpr const char* kFromPreset = "from --precision";

template <typename T>
std::string ShowOverride(const std::optional<T>& value, const char* (*name)(T)) {
  return value ? std::string(name(*value)) : std::string(kFromPreset);
}

std::string EnvName(const std::string& flag) {
  std::string env = "SNAPSERVE_";
  for (char c : flag) env += c == '-' ? '_' : static_cast<char>(std::toupper(c));
  return env;
}

const std::vector<FlagGroup>& FlagGroups() {
  static const std::vector<FlagGroup> groups = {
      {"Model and hardware",
       {
           {"model", "model to serve: a .gguf file or a Hugging Face directory",
            [](ServerConfig& c, const std::string& v) { return c.engine.model_path = v, ""; },
            [](const ServerConfig& c) { return c.engine.model_path; }},
           {"model-id", "name reported by GetModelInfo (default: the model file name)",
            [](ServerConfig& c, const std::string& v) { return c.engine.model_id = v, ""; },
            [](const ServerConfig& c) { return c.engine.model_id; }},
           {"device", "cpu|cuda|cuda:N",
            [](ServerConfig& c, const std::string& v) {
              return SetParsed(c.engine.device, ParseDevice(v));
            },
            [](const ServerConfig& c) { return engine::device_name(c.engine.device); }},
           {"dtype",
            "model dtype: float32 | bfloat16 | float16 (on CPU, bfloat16 rounds the weights only)",
            [](ServerConfig& c, const std::string& v) {
              return SetParsed(c.precision_overrides.dtype, ParseDtype(v));
            },
            [](const ServerConfig& c) {
              return c.precision_overrides.dtype ? engine::dtype_name(*c.precision_overrides.dtype)
                                                 : "float32 (CUDA: bfloat16 unless exact)";
            }},
           {"precision",
            "kernel paths: auto (the fastest this hardware has) | exact (float32, transformers' "
            "numbers) | int8 | bf16",
            [](ServerConfig& c, const std::string& v) {
              return SetParsed(c.precision, ParsePrecision(v));
            },
            [](const ServerConfig& c) { return std::string(engine::precision_name(c.precision)); }},
           {"threads", "CPU threads for compute (0: all cores)",
            [](ServerConfig& c, const std::string& v) {
              return SetInt(c.engine.threads, v, 0, 4096);
            },
            [](const ServerConfig& c) { return std::to_string(c.engine.threads); }},
       }},
      {"Network and security",
       {
           {"host", "address to listen on for gRPC",
            [](ServerConfig& c, const std::string& v) {
              return v.empty() ? "must not be empty" : (c.host = v, "");
            },
            [](const ServerConfig& c) { return c.host; }},
           {"port", "gRPC port",
            [](ServerConfig& c, const std::string& v) { return SetInt(c.port, v, 0, 65535); },
            [](const ServerConfig& c) { return std::to_string(c.port); }},
           {"metrics-host", "address to listen on for /metrics (default: the --host value)",
            [](ServerConfig& c, const std::string& v) {
              return v.empty() ? "must not be empty" : (c.metrics_host = v, "");
            },
            [](const ServerConfig& c) { return c.metrics_host.empty() ? c.host : c.metrics_host; }},
           {"metrics-port", "Prometheus /metrics port (0: off)",
            [](ServerConfig& c, const std::string& v) {
              return SetInt(c.metrics_port, v, 0, 65535);
            },
            [](const ServerConfig& c) { return std::to_string(c.metrics_port); }},
           {"http-port",
            "OpenAI-compatible HTTP API port (0: off); on --host, with gRPC's TLS and token",
            [](ServerConfig& c, const std::string& v) { return SetInt(c.http_port, v, 0, 65535); },
            [](const ServerConfig& c) { return std::to_string(c.http_port); }},
           {"max-message-bytes",
            "largest gRPC message accepted or sent, and largest HTTP request body (bytes, or "
            "16MiB)",
            [](ServerConfig& c, const std::string& v) {
              const int64_t b = ParseByteSize(v);
              if (b < 1024 || b > (int64_t{1} << 31) - 1)
                return std::string("expected a size in [1KiB, 2GiB), got '") + Bounded(v) + "'";
              c.max_message_bytes = b;
              return std::string();
            },
            [](const ServerConfig& c) { return std::to_string(c.max_message_bytes); }},
           {"tls-cert", "PEM server certificate (with --tls-key enables TLS)",
            [](ServerConfig& c, const std::string& v) { return c.tls_cert = v, ""; },
            [](const ServerConfig& c) { return c.tls_cert; }},
           {"tls-key", "PEM private key of --tls-cert",
            [](ServerConfig& c, const std::string& v) { return c.tls_key = v, ""; },
            [](const ServerConfig& c) { return c.tls_key; }},
           {"tls-client-ca",
            "PEM CA bundle; when set, clients must present a certificate it signed (mTLS)",
            [](ServerConfig& c, const std::string& v) { return c.tls_client_ca = v, ""; },
            [](const ServerConfig& c) { return c.tls_client_ca; }},
           {"auth-token-file", "file holding one bearer token that every Generation call must send",
            [](ServerConfig& c, const std::string& v) {
              return v.empty() ? "must not be empty" : (c.auth_token_file = v, "");
            },
            [](const ServerConfig& c) { return c.auth_token_file; }},
           {"shutdown-grace", "seconds SIGTERM waits for in-flight requests before exiting",
            [](ServerConfig& c, const std::string& v) {
              char* end = nullptr;
              const double x = std::strtod(v.c_str(), &end);
              if (v.empty() || *end != '\0' || !std::isfinite(x) || x < 0 || x > 86400)
                return std::string("expected seconds in [0, 86400], got '") + Bounded(v) + "'";
              c.shutdown_grace_s = x;
              return std::string();
            },
            [](const ServerConfig& c) {
              std::ostringstream o;
              o << c.shutdown_grace_s;
              return o.str();
            }},
           {"log-level", "trace|debug|info|warn|error",
            [](ServerConfig& c, const std::string& v) {
              return SetChoice(c.log_level, v, {"trace", "debug", "info", "warn", "error"});
            },
            [](const ServerConfig& c) { return c.log_level; }},
           {"otlp-endpoint",
            "OTLP/HTTP collector for traces, http(s)://host:4318 (spans go to its /v1/traces; "
            "empty: off; also OTEL_EXPORTER_OTLP_ENDPOINT)",
            [](ServerConfig& c, const std::string& v) {
              if (!v.empty() && v.rfind("http://", 0) != 0 && v.rfind("https://", 0) != 0)
                return "expected an http:// or https:// URL, got '" + Bounded(v) + "'";
              if (!v.empty() && !tracing::OtlpExportBuiltIn())
                return std::string(
                    "this build has no OTLP exporter (built with SNAPSERVE_OTLP_EXPORT=OFF)");
              c.otlp_endpoint = v;
              return std::string();
            },
            [](const ServerConfig& c) { return c.otlp_endpoint; }},
           {"otlp-service-name", "service.name of the traces' resource (also OTEL_SERVICE_NAME)",
            [](ServerConfig& c, const std::string& v) {
              return v.empty() ? "must not be empty" : (c.otlp_service_name = v, "");
            },
            [](const ServerConfig& c) { return c.otlp_service_name; }},
       }},
      {"KV cache and batching",
       {
           {"kv-cache-memory", "bytes for the paged KV cache (e.g. 2GiB)",
            [](ServerConfig& c, const std::string& v) {
              const int64_t b = ParseByteSize(v);
              if (b <= 0) return "expected a positive size like 2GiB, got '" + Bounded(v) + "'";
              c.engine.kv_cache_memory_bytes = b;
              return std::string();
            },
            [](const ServerConfig& c) { return std::to_string(c.engine.kv_cache_memory_bytes); }},
           {"kv-cache-prefault",
            "true|false: write the whole KV cache at start, so resident memory stays flat",
            [](ServerConfig& c, const std::string& v) {
              if (v != "true" && v != "false")
                return "expected true or false, got '" + Bounded(v) + "'";
              c.engine.kv_cache_prefault = v == "true";
              return std::string();
            },
            [](const ServerConfig& c) {
              return std::string(c.engine.kv_cache_prefault ? "true" : "false");
            }},
           {"max-batch-size", "most sequences in one decode step",
            [](ServerConfig& c, const std::string& v) {
              return SetInt(c.engine.max_batch_size, v, 1, 4096);
            },
            [](const ServerConfig& c) { return std::to_string(c.engine.max_batch_size); }},
           {"max-queue", "most requests waiting for admission; more get RESOURCE_EXHAUSTED",
            [](ServerConfig& c, const std::string& v) {
              return SetInt(c.engine.max_queue, v, 0, 1 << 20);
            },
            [](const ServerConfig& c) { return std::to_string(c.engine.max_queue); }},
           {"max-new-tokens-limit", "largest max_new_tokens a request may ask for",
            [](ServerConfig& c, const std::string& v) {
              return SetInt(c.engine.max_new_tokens_limit, v, 1, 1 << 20);
            },
            [](const ServerConfig& c) { return std::to_string(c.engine.max_new_tokens_limit); }},
           {"default-max-new-tokens", "max_new_tokens when a request leaves it 0",
            [](ServerConfig& c, const std::string& v) {
              return SetInt(c.engine.default_max_new_tokens, v, 1, 1 << 20);
            },
            [](const ServerConfig& c) { return std::to_string(c.engine.default_max_new_tokens); }},
           {"max-step-tokens",
            "prompt tokens one step computes beside its decode tokens (the prefill's chunk)",
            [](ServerConfig& c, const std::string& v) {
              return SetInt(c.engine.max_step_tokens, v, 1, 1 << 20);
            },
            [](const ServerConfig& c) { return std::to_string(c.engine.max_step_tokens); }},
           {"prefix-cache-memory",
            "share of --kv-cache-memory that caches prompt prefixes' K/V across requests, in "
            "[0, 0.9] (0: off)",
            [](ServerConfig& c, const std::string& v) {
              return SetMemoryShare(c.engine.prefix_cache_memory_share, v);
            },
            [](const ServerConfig& c) { return ShareText(c.engine.prefix_cache_memory_share); }},
           {"document-cache-memory",
            "share of --kv-cache-memory that keeps documents (requests with a question) "
            "compressed for later questions, in [0, 0.9] (0: off)",
            [](ServerConfig& c, const std::string& v) {
              return SetMemoryShare(c.engine.document_cache_memory_share, v);
            },
            [](const ServerConfig& c) { return ShareText(c.engine.document_cache_memory_share); }},
           {"kv-store",
            "shared tier of the prefix cache: redis://host:port[/db] or rediss:// (TLS); "
            "needs --prefix-cache-memory (empty: off)",
            [](ServerConfig& c, const std::string& v) { return c.engine.kv_store.url = v, ""; },
            [](const ServerConfig& c) { return c.engine.kv_store.url; }},
           {"kv-store-ttl", "seconds a chunk stays in --kv-store after its last use (0: forever)",
            [](ServerConfig& c, const std::string& v) {
              return SetInt(c.engine.kv_store.ttl_s, v, 0, int64_t{1} << 31);
            },
            [](const ServerConfig& c) { return std::to_string(c.engine.kv_store.ttl_s); }},
           {"kv-store-tls", "true|false: TLS to --kv-store also for a redis:// URL",
            [](ServerConfig& c, const std::string& v) {
              if (v != "true" && v != "false")
                return "expected true or false, got '" + Bounded(v) + "'";
              c.engine.kv_store.tls = v == "true";
              return std::string();
            },
            [](const ServerConfig& c) {
              return std::string(c.engine.kv_store.tls ? "true" : "false");
            }},
           {"kv-store-tls-ca",
            "PEM CA bundle that signs --kv-store's certificate (default: the "
            "system's)",
            [](ServerConfig& c, const std::string& v) {
              return c.engine.kv_store.tls_ca_file = v, "";
            },
            [](const ServerConfig& c) { return c.engine.kv_store.tls_ca_file; }},
           {"kv-store-user", "ACL user for --kv-store's AUTH (empty: the password alone)",
            [](ServerConfig& c, const std::string& v) { return c.engine.kv_store.user = v, ""; },
            [](const ServerConfig& c) { return c.engine.kv_store.user; }},
           {"kv-store-password",
            "--kv-store's AUTH password; prefer the environment variable or a file (never "
            "logged)",
            [](ServerConfig& c, const std::string& v) {
              return c.engine.kv_store.password = v, "";
            },
            [](const ServerConfig&) { return std::string(); }},
           {"kv-store-password-file", "file holding --kv-store's AUTH password",
            [](ServerConfig& c, const std::string& v) {
              return c.engine.kv_store.password_file = v, "";
            },
            [](const ServerConfig& c) { return c.engine.kv_store.password_file; }},
           {"kv-store-wait", "milliseconds a request waits for its prefix chunks from --kv-store",
            [](ServerConfig& c, const std::string& v) {
              return SetInt(c.engine.kv_store.fetch_wait_ms, v, 0, 60000);
            },
            [](const ServerConfig& c) { return std::to_string(c.engine.kv_store.fetch_wait_ms); }},
       }},
      {"KV compression defaults (a request's own kv_compression fields win)",
       {
           {"default-kv-method",
            "KV compression when a request does not say: snapkv | adakv | pyramidkv | "
            "streaming_llm | keydiff | none",
            [](ServerConfig& c, const std::string& v) {
              return SetParsed(c.engine.default_kv_compression.method, ParseKvMethod(v));
            },
            [](const ServerConfig& c) {
              return std::string(engine::kv_method_name(c.engine.default_kv_compression.method));
            }},
           {"kv-window", "observation window w of the scored methods (SnapKV, AdaKV, PyramidKV)",
            [](ServerConfig& c, const std::string& v) {
              return SetInt(c.engine.default_kv_compression.window, v, 1, 1 << 20);
            },
            [](const ServerConfig& c) {
              return std::to_string(c.engine.default_kv_compression.window);
            }},
           {"kv-capacity",
            "prompt entries kept per layer and KV head, C (every method; window included)",
            [](ServerConfig& c, const std::string& v) {
              return SetInt(c.engine.default_kv_compression.capacity, v, 2, 1 << 24);
            },
            [](const ServerConfig& c) {
              return std::to_string(c.engine.default_kv_compression.capacity);
            }},
           {"snapkv-kernel", "SnapKV pooling kernel size (odd)",
            [](ServerConfig& c, const std::string& v) {
              return SetInt(c.engine.default_kv_compression.kernel_size, v, 1, 1023);
            },
            [](const ServerConfig& c) {
              return std::to_string(c.engine.default_kv_compression.kernel_size);
            }},
           {"snapkv-pooling", "SnapKV pooling: max|avg",
            [](ServerConfig& c, const std::string& v) {
              return SetParsed(c.engine.default_kv_compression.pooling, ParseKvPooling(v));
            },
            [](const ServerConfig& c) {
              return std::string(engine::kv_pooling_name(c.engine.default_kv_compression.pooling));
            }},
           {"kv-sink-tokens",
            "StreamingLLM: first prompt positions always kept (attention sinks; counted in C)",
            [](ServerConfig& c, const std::string& v) {
              return SetInt(c.engine.default_kv_compression.sink_tokens, v, 0, 1 << 20);
            },
            [](const ServerConfig& c) {
              return std::to_string(c.engine.default_kv_compression.sink_tokens);
            }},
           {"adakv-alpha",
            "AdaKV: share of C every KV head keeps at least, in [0, 1] (the safeguard)",
            [](ServerConfig& c, const std::string& v) {
              char* end = nullptr;
              const double x = std::strtod(v.c_str(), &end);
              if (v.empty() || *end != '\0' || !(x >= 0 && x <= 1))
                return std::string("expected a number in [0, 1], got '") + Bounded(v) + "'";
              c.engine.default_kv_compression.adakv_alpha = x;
              return std::string();
            },
            [](const ServerConfig& c) {
              return std::to_string(c.engine.default_kv_compression.adakv_alpha);
            }},
           {"pyramid-beta", "PyramidKV: steepness of the per-layer budgets (last layer ~ C / beta)",
            [](ServerConfig& c, const std::string& v) {
              return SetInt(c.engine.default_kv_compression.pyramid_beta, v, 1, 1 << 20);
            },
            [](const ServerConfig& c) {
              return std::to_string(c.engine.default_kv_compression.pyramid_beta);
            }},
       }},
      {"Advanced: precision overrides (each wins over --precision)",
       {
           {"quantized-dot", "GGUF blocks at decode (CPU): exact | int8 (block dot products)",
            [](ServerConfig& c, const std::string& v) {
              return SetParsed(c.precision_overrides.quantized_dot, ParseQuantDot(v));
            },
            [](const ServerConfig& c) {
              return ShowOverride(c.precision_overrides.quantized_dot, &engine::quant_dot_name);
            }},
           {"prefill-gemm", "GEMM of prompt chunks (CPU): float32 | bfloat16 | int8 (AVX-512 VNNI)",
            [](ServerConfig& c, const std::string& v) {
              return SetParsed(c.precision_overrides.prefill_gemm, ParsePrefillGemm(v));
            },
            [](const ServerConfig& c) {
              return ShowOverride(c.precision_overrides.prefill_gemm, &engine::prefill_gemm_name);
            }},
           {"decode-dot", "decode on bfloat16 weights (CPU, --dtype=bfloat16): float32 | bfloat16",
            [](ServerConfig& c, const std::string& v) {
              return SetParsed(c.precision_overrides.decode_dot, ParseDecodeDot(v));
            },
            [](const ServerConfig& c) {
              return ShowOverride(c.precision_overrides.decode_dot, &engine::decode_dot_name);
            }},
           {"kv-cache-dtype", "KV cache entries: float32 | bfloat16 | float16 | int8 (CPU)",
            [](ServerConfig& c, const std::string& v) {
              return SetParsed(c.precision_overrides.kv_cache_dtype, ParseKvCacheDtype(v));
            },
            [](const ServerConfig& c) {
              return ShowOverride(c.precision_overrides.kv_cache_dtype, &engine::dtype_name);
            }},
           {"block-size", "tokens per KV cache block",
            [](ServerConfig& c, const std::string& v) {
              int size = 0;
              std::string error = SetInt(size, v, 1, 1024);
              if (error.empty()) c.precision_overrides.block_size = size;
              return error;
            },
            [](const ServerConfig& c) {
              return c.precision_overrides.block_size
                         ? std::to_string(*c.precision_overrides.block_size)
                         : std::string(kFromPreset);
            }},
       }},
  };
  return groups;
}

// Flags renamed for what they are: the old name still works, with a
// deprecation warning (ParseResult::warnings) for each use.
constexpr std::pair<const char*, const char*> kRenamedFlags[] = {
    {"snapkv-window", "kv-window"},
    {"snapkv-capacity", "kv-capacity"},
};

// The current name of flag `name`: itself, or what it was renamed to.
std::string CurrentFlagName(const std::string& name) {
  for (const auto& [old_name, new_name] : kRenamedFlags) {
    if (name == old_name) return new_name;
  }
  return name;
}

std::string Deprecation(const std::string& old_name, const std::string& new_name) {
  return old_name + " is deprecated: use " + new_name;
}

const FlagSpec* FindFlag(const std::string& name) {
  for (const FlagGroup& g : FlagGroups()) {
    for (const FlagSpec& f : g.flags) {
      if (name == f.name) return &f;
    }
  }
  return nullptr;
}

// Cross-flag rules that no single flag can check.
std::string CheckConsistency(const ServerConfig& c) {
  if (c.tls_cert.empty() != c.tls_key.empty())
    return "--tls-cert and --tls-key must be given together";
  if (!c.tls_client_ca.empty() && c.tls_cert.empty())
    return "--tls-client-ca needs --tls-cert and --tls-key";
  if (c.engine.default_kv_compression.kernel_size % 2 == 0)
    return "--snapkv-kernel must be odd, got " +
           std::to_string(c.engine.default_kv_compression.kernel_size);
  if (c.engine.default_kv_compression.window >= c.engine.default_kv_compression.capacity) {
    return "--kv-window must be less than --kv-capacity (" +
           std::to_string(c.engine.default_kv_compression.window) +
           " >= " + std::to_string(c.engine.default_kv_compression.capacity) + ")";
  }
  // Checked whatever the default method: a request choosing StreamingLLM
  // takes these defaults too.
  if (c.engine.default_kv_compression.sink_tokens >= c.engine.default_kv_compression.capacity) {
    return "--kv-sink-tokens must be less than --kv-capacity (" +
           std::to_string(c.engine.default_kv_compression.sink_tokens) +
           " >= " + std::to_string(c.engine.default_kv_compression.capacity) + ")";
  }
  if (c.engine.default_max_new_tokens > c.engine.max_new_tokens_limit)
    return "--default-max-new-tokens exceeds --max-new-tokens-limit";
  if (c.port != 0 && c.port == c.metrics_port) return "--port and --metrics-port must differ";
  if (c.engine.prefix_cache_memory_share + c.engine.document_cache_memory_share > 0.9)
    return "--prefix-cache-memory + --document-cache-memory must be at most 0.9 (the paged "
           "cache needs the rest)";
  if (!c.engine.kv_store.url.empty() && c.engine.prefix_cache_memory_share <= 0)
    return "--kv-store needs --prefix-cache-memory above 0";
  if (c.http_port != 0 && (c.http_port == c.port || c.http_port == c.metrics_port))
    return "--http-port must differ from --port and --metrics-port";
  // Only bfloat16 weights have bfloat16 dot products to take; on CUDA a
  // bfloat16 model computes in bfloat16 already.
  if (c.engine.linear_precision.decode == engine::DecodeDot::kBFloat16 &&
      (c.engine.dtype != engine::Dtype::kBFloat16 || c.engine.device.is_cuda())) {
    return "--decode-dot=bfloat16 needs --dtype=bfloat16 on --device=cpu";
  }
  return "";
}

}  // namespace

int64_t ParseByteSize(const std::string& text) {
  char* end = nullptr;
  const double x = std::strtod(text.c_str(), &end);
  if (text.empty() || end == text.c_str() || !std::isfinite(x) || x < 0) return -1;
  const std::string unit(end);
  double mult = 1;
  if (unit.empty() || unit == "B")
    mult = 1;
  else if (unit == "KiB" || unit == "Ki")
    mult = 1024.0;
  else if (unit == "MiB" || unit == "Mi")
    mult = 1024.0 * 1024;
  else if (unit == "GiB" || unit == "Gi")
    mult = 1024.0 * 1024 * 1024;
  else if (unit == "KB" || unit == "K")
    mult = 1e3;
  else if (unit == "MB" || unit == "M")
    mult = 1e6;
  else if (unit == "GB" || unit == "G")
    mult = 1e9;
  else
    return -1;
  const double bytes = x * mult;
  if (bytes > 9.0e18) return -1;
  return static_cast<int64_t>(bytes);
}

StatusOr<engine::KvMethod> ParseKvMethod(const std::string& text) {
  return ParseNamed(
      text,
      {engine::KvMethod::kSnapKv, engine::KvMethod::kStreamingLlm, engine::KvMethod::kAdaKv,
       engine::KvMethod::kPyramidKv, engine::KvMethod::kKeyDiff, engine::KvMethod::kNone},
      &engine::kv_method_name);
}

StatusOr<engine::KvPooling> ParseKvPooling(const std::string& text) {
  return ParseNamed(text, {engine::KvPooling::kMax, engine::KvPooling::kAvg},
                    &engine::kv_pooling_name);
}

StatusOr<engine::Dtype> ParseDtype(const std::string& text) {
  return ParseNamed(text,
                    {engine::Dtype::kFloat32, engine::Dtype::kBFloat16, engine::Dtype::kFloat16},
                    &engine::dtype_name);
}

StatusOr<engine::Dtype> ParseKvCacheDtype(const std::string& text) {
  return ParseNamed(text,
                    {engine::Dtype::kFloat32, engine::Dtype::kBFloat16, engine::Dtype::kFloat16,
                     engine::Dtype::kInt8},
                    &engine::dtype_name);
}

StatusOr<engine::QuantDot> ParseQuantDot(const std::string& text) {
  return ParseNamed(text, {engine::QuantDot::kExact, engine::QuantDot::kInt8},
                    &engine::quant_dot_name);
}

StatusOr<engine::PrefillGemm> ParsePrefillGemm(const std::string& text) {
  return ParseNamed(
      text,
      {engine::PrefillGemm::kFloat32, engine::PrefillGemm::kBFloat16, engine::PrefillGemm::kInt8},
      &engine::prefill_gemm_name);
}

StatusOr<engine::DecodeDot> ParseDecodeDot(const std::string& text) {
  return ParseNamed(text, {engine::DecodeDot::kFloat32, engine::DecodeDot::kBFloat16},
                    &engine::decode_dot_name);
}

StatusOr<engine::Precision> ParsePrecision(const std::string& text) {
  return ParseNamed(text,
                    {engine::Precision::kAuto, engine::Precision::kExact, engine::Precision::kInt8,
                     engine::Precision::kBFloat16},
                    &engine::precision_name);
}

StatusOr<engine::Device> ParseDevice(const std::string& text) {
  if (text == "cpu") return engine::Device::Cpu();
  if (text == "cuda") return engine::Device::Cuda();
  const std::string prefix = "cuda:";
  if (text.rfind(prefix, 0) == 0) {
    const std::string n = text.substr(prefix.size());
    // A plain decimal index that fits c10::DeviceIndex (int8_t).
    const bool digits =
        !n.empty() && n.size() <= 3 && n.find_first_not_of("0123456789") == std::string::npos;
    if (digits && std::stoi(n) <= 127) return engine::Device::Cuda(std::stoi(n));
  }
  return Status::InvalidArgument("expected cpu, cuda or cuda:N, got '" + Bounded(text) + "'");
}

std::string ServerHelp() {
  std::ostringstream out;
  out << "snapserve: gRPC LLM inference with KV-cache compression (SnapKV, AdaKV, PyramidKV,\n"
         "StreamingLLM)\n\n"
         "usage: snapserve --model=PATH [--flag=value ...]\n\n"
         "Every flag can also be set through the environment variable shown;\n"
         "the command line wins.\n";
  const ServerConfig defaults;  // the engine's defaults (engine.h)
  for (const FlagGroup& g : FlagGroups()) {
    out << "\n" << g.title << ":\n";
    for (const FlagSpec& f : g.flags) {
      out << "  --" << f.name << "=VALUE\n      " << f.help << "\n      env " << EnvName(f.name)
          << ", default '" << f.show(defaults) << "'\n";
    }
  }
  out << "\n  --help\n      print this text (--help=markdown: as the README's table)\n";
  return out.str();
}

std::string ServerHelpMarkdown() {
  std::ostringstream out;
  const ServerConfig defaults;
  for (const FlagGroup& g : FlagGroups()) {
    out << "\n**" << g.title
        << "**\n\n| flag | environment | default | meaning |\n|---|---|---|---|\n";
    for (const FlagSpec& f : g.flags) {
      std::string help = f.help;
      // A '|' inside a cell would end it.
      for (size_t at = help.find('|'); at != std::string::npos; at = help.find('|', at + 2)) {
        help.replace(at, 1, "\\|");
      }
      const std::string value = f.show(defaults);
      out << "| `--" << f.name << "` | `" << EnvName(f.name) << "` | "
          << (value.empty() ? "" : "`" + value + "`") << " | " << help << " |\n";
    }
  }
  return out.str();
}

namespace {
// `r` ending the program: with --help's text (code 0) or an error (2).
ParseResult Exit(ParseResult r, int code, std::string message) {
  r.exit = true;
  r.exit_code = code;
  r.message = std::move(message);
  return r;
}
}  // namespace

ParseResult ParseServerConfig(const std::vector<std::string>& args,
                              char* (*getenv_fn)(const char*)) {
  ParseResult r;
  if (getenv_fn == nullptr) getenv_fn = &std::getenv;
  // OpenTelemetry's own variables, below SNAPSERVE_* and the command line.
  for (const auto& [otel, flag] : {std::pair{"OTEL_EXPORTER_OTLP_ENDPOINT", "otlp-endpoint"},
                                   std::pair{"OTEL_SERVICE_NAME", "otlp-service-name"}}) {
    const char* env = getenv_fn(otel);
    if (env == nullptr) continue;
    if (std::string err = FindFlag(flag)->set(r.config, env); !err.empty()) {
      return Exit(r, 2, std::string(otel) + ": " + err);
    }
  }
  // A renamed flag's old variable, below its new one.
  for (const auto& [old_name, new_name] : kRenamedFlags) {
    const std::string old_env = EnvName(old_name);
    const char* env = getenv_fn(old_env.c_str());
    if (env == nullptr) continue;
    r.warnings.push_back(Deprecation(old_env, EnvName(new_name)));
    if (std::string err = FindFlag(new_name)->set(r.config, env); !err.empty()) {
      return Exit(r, 2, old_env + ": " + err);
    }
  }
  for (const FlagGroup& g : FlagGroups()) {
    for (const FlagSpec& f : g.flags) {
      const char* env = getenv_fn(EnvName(f.name).c_str());
      if (env == nullptr) continue;
      if (std::string err = f.set(r.config, env); !err.empty()) {
        return Exit(r, 2, EnvName(f.name) + ": " + err);
      }
    }
  }
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--help" || a == "-h") return Exit(r, 0, ServerHelp());
    if (a == "--help=markdown") return Exit(r, 0, ServerHelpMarkdown());
    if (a.rfind("--", 0) != 0)
      return Exit(r, 2, "unexpected argument '" + Bounded(a) + "' (see --help)");
    std::string name = a.substr(2);
    std::string value;
    const size_t eq = name.find('=');
    if (eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    } else if (i + 1 < args.size()) {
      value = args[++i];
    } else {
      return Exit(r, 2, "--" + Bounded(name) + ": missing value");
    }
    for (char& ch : name) ch = ch == '_' ? '-' : ch;  // --kv_cache_memory works too
    if (const std::string current = CurrentFlagName(name); current != name) {
      r.warnings.push_back(Deprecation("--" + name, "--" + current));
      name = current;
    }
    const FlagSpec* f = FindFlag(name);
    if (f == nullptr) return Exit(r, 2, "unknown flag --" + Bounded(name) + " (see --help)");
    if (std::string err = f->set(r.config, value); !err.empty()) {
      return Exit(r, 2, "--" + name + ": " + err);
    }
  }
  r.config.precision_summary = engine::ResolvePrecision(
      r.config.precision, r.config.precision_overrides,
      engine::DetectHardware(r.config.engine.device, r.config.engine.model_path), r.config.engine);
  if (std::string err = CheckConsistency(r.config); !err.empty()) return Exit(r, 2, err);
  if (r.config.metrics_host.empty()) r.config.metrics_host = r.config.host;
  return r;
}

}  // namespace snapserve::server
