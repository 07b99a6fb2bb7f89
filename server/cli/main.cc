// snapserve-cli: a person's client for a running snapserve.
//   snapserve-cli [--target=host:port] [--ca=ca.pem] [--auth-token-file=F] health
//   snapserve-cli info
//   snapserve-cli tokenize "text"
//   snapserve-cli generate [--max-new-tokens=N] [--temperature=T]
//                          [--kv=snapkv|adakv|pyramidkv|streaming_llm|keydiff|none] "prompt"
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <cctype>
#include <charconv>
#include <condition_variable>
#include <iterator>
#include <mutex>
#include <optional>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "snapserve/v1/generation.grpc.pb.h"

namespace {

namespace v1 = snapserve::v1;

int Usage() {
  std::fprintf(
      stderr,
      "usage: snapserve-cli [--target=HOST:PORT] [--ca=PEM] [--timeout=SECONDS]\n"
      "                     [--auth-token-file=FILE] COMMAND\n"
      "commands:\n"
      "  health                      grpc.health.v1 status of the server\n"
      "  info                        the served model and limits\n"
      "  tokenize TEXT               token ids of TEXT\n"
      "  generate [opts] PROMPT      stream a completion to the terminal\n"
      "     --max-new-tokens=N --temperature=T --top-k=K --top-p=P --seed=S\n"
      "     --kv=snapkv|adakv|pyramidkv|streaming_llm|keydiff|none --capacity=C --window=W "
      "--sink=S --chat (send "
      "PROMPT as a user message)\n");
  return 2;
}

// A number from the command line, or nullopt (never an exception: a typo
// must not abort the tool).
template <typename T>
std::optional<T> ParseNumber(const std::string& text) {
  T value{};
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (ec != std::errc() || ptr != end || text.empty()) return std::nullopt;
  return value;
}

// The bearer token of a server started with --auth-token-file: the file's
// contents without the trailing line break (the server validates the token).
std::optional<std::string> ReadToken(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::string token((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  while (!token.empty() && (token.back() == '\n' || token.back() == '\r')) token.pop_back();
  return token;
}

int Fail(const grpc::Status& s) {
  std::fprintf(stderr, "error: %d %s\n", static_cast<int>(s.error_code()),
               s.error_message().c_str());
  return 1;
}

// The health service is called through the generic stub: grpc.health.v1
// messages are tiny (field 1: service name / serving status).
int Health(grpc::Channel& channel, const std::function<void(grpc::ClientContext&)>& prepare) {
  grpc::GenericStub stub(channel.shared_from_this());
  grpc::ClientContext ctx;
  prepare(ctx);
  // An empty HealthCheckRequest (the whole server). A default ByteBuffer is
  // not a message at all (gRPC aborts on it); one empty slice is.
  grpc::Slice empty_message("");
  grpc::ByteBuffer request(&empty_message, 1);
  grpc::ByteBuffer response;
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  grpc::Status status;
  stub.UnaryCall(&ctx, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request, &response,
                 [&](grpc::Status s) {
                   std::lock_guard<std::mutex> lock(mu);
                   status = std::move(s);
                   done = true;
                   cv.notify_one();
                 });
  std::unique_lock<std::mutex> lock(mu);
  cv.wait(lock, [&] { return done; });
  if (!status.ok()) return Fail(status);
  std::vector<grpc::Slice> slices;
  (void)response.Dump(&slices);
  std::string bytes;
  for (const auto& s : slices) bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  // HealthCheckResponse { ServingStatus status = 1; } : 0x08 <varint>
  const int code = bytes.size() >= 2 && bytes[0] == 0x08 ? bytes[1] : 0;
  static const char* names[] = {"UNKNOWN", "SERVING", "NOT_SERVING", "SERVICE_UNKNOWN"};
  std::printf("%s\n", code >= 0 && code <= 3 ? names[code] : "UNKNOWN");
  return code == 1 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  std::string target = "localhost:50051", ca, token_file;
  if (const char* env = std::getenv("SNAPSERVE_AUTH_TOKEN_FILE")) token_file = env;
  double timeout = 600;
  std::map<std::string, std::string> opts;
  std::vector<std::string> positional;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--", 0) == 0) {
      const size_t eq = a.find('=');
      const std::string key = a.substr(2, eq == std::string::npos ? std::string::npos : eq - 2);
      const std::string value = eq == std::string::npos ? "" : a.substr(eq + 1);
      if (key == "target") {
        target = value;
      } else if (key == "ca") {
        ca = value;
      } else if (key == "auth-token-file") {
        token_file = value;
      } else if (key == "timeout") {
        const auto t = ParseNumber<double>(value);
        if (!t || !(*t > 0)) {
          std::fprintf(stderr, "error: --timeout must be a positive number of seconds\n");
          return 2;
        }
        timeout = *t;
      } else if (key == "help") {
        return Usage();
      } else {
        opts[key] = value;
      }
    } else {
      positional.push_back(a);
    }
  }
  if (positional.empty()) return Usage();

  std::shared_ptr<grpc::ChannelCredentials> creds = grpc::InsecureChannelCredentials();
  if (!ca.empty()) {
    std::ifstream in(ca);
    std::stringstream s;
    s << in.rdbuf();
    grpc::SslCredentialsOptions o;
    o.pem_root_certs = s.str();
    creds = grpc::SslCredentials(o);
  }
  auto channel = grpc::CreateChannel(target, creds);
  auto stub = v1::Generation::NewStub(channel);
  std::string token;
  if (!token_file.empty()) {
    const auto read = ReadToken(token_file);
    if (!read) {
      std::fprintf(stderr, "error: cannot read the token file %s\n", token_file.c_str());
      return 2;
    }
    token = *read;
  }
  // Every call: its deadline, and the bearer token when there is one.
  auto deadline = [&](grpc::ClientContext& ctx) {
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::duration_cast<std::chrono::milliseconds>(
                         std::chrono::duration<double>(timeout)));
    if (!token.empty()) ctx.AddMetadata("authorization", "Bearer " + token);
  };
  const std::string& command = positional[0];

  if (command == "health") return Health(*channel, deadline);
  if (command == "info") {
    grpc::ClientContext ctx;
    deadline(ctx);
    v1::ModelInfo info;
    grpc::Status s = stub->GetModelInfo(&ctx, v1::GetModelInfoRequest(), &info);
    if (!s.ok()) return Fail(s);
    std::cout << info.DebugString();
    return 0;
  }
  if (command == "tokenize" && positional.size() == 2) {
    grpc::ClientContext ctx;
    deadline(ctx);
    v1::TokenizeRequest req;
    req.set_text(positional[1]);
    req.set_add_special_tokens(opts.count("special") > 0);
    v1::TokenizeResponse resp;
    grpc::Status s = stub->Tokenize(&ctx, req, &resp);
    if (!s.ok()) return Fail(s);
    for (int i = 0; i < resp.ids_size(); ++i) std::cout << (i ? " " : "") << resp.ids(i);
    std::cout << "\n";
    return 0;
  }
  if (command == "generate" && positional.size() == 2) {
    v1::GenerateRequest req;
    if (opts.count("chat")) {
      auto* m = req.mutable_messages()->add_messages();
      m->set_role("user");
      m->set_content(positional[1]);
    } else {
      req.set_prompt(positional[1]);
    }
    // Numeric options: a value that does not parse is a usage error.
    bool bad = false;
    auto number = [&]<typename T>(const char* key, T* out) {
      if (!opts.count(key)) return false;
      const auto v = ParseNumber<T>(opts[key]);
      if (!v) {
        std::fprintf(stderr, "error: --%s=%s is not a number\n", key, opts[key].c_str());
        bad = true;
        return false;
      }
      *out = *v;
      return true;
    };
    uint32_t u = 0;
    uint64_t seed = 0;
    float f = 0;
    if (number("max-new-tokens", &u)) req.mutable_stopping()->set_max_new_tokens(u);
    if (number("temperature", &f)) req.mutable_sampling()->set_temperature(f);
    if (number("top-k", &u)) req.mutable_sampling()->set_top_k(u);
    if (number("top-p", &f)) req.mutable_sampling()->set_top_p(f);
    if (number("seed", &seed)) req.mutable_sampling()->set_seed(seed);
    if (opts.count("kv")) {
      // The server's method names are the proto's enum names in lower case.
      std::string name = opts["kv"];
      for (char& ch : name) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
      v1::KvCompression::Method method{};
      if (name == "METHOD_UNSPECIFIED" || !v1::KvCompression::Method_Parse(name, &method)) {
        std::fprintf(stderr,
                     "error: --kv=%s: expected snapkv|adakv|pyramidkv|streaming_llm|keydiff|none\n",
                     opts["kv"].c_str());
        return 2;
      }
      req.mutable_kv_compression()->set_method(method);
    }
    if (number("sink", &u)) req.mutable_kv_compression()->set_sink_tokens(u);
    if (number("capacity", &u)) req.mutable_kv_compression()->set_max_capacity_prompt(u);
    if (number("window", &u)) req.mutable_kv_compression()->set_window_size(u);
    if (bad) return 2;
    grpc::ClientContext ctx;
    deadline(ctx);
    auto reader = stub->GenerateStream(&ctx, req);
    v1::GenerateStreamResponse part;
    v1::Usage usage;
    while (reader->Read(&part)) {
      std::cout << part.text() << std::flush;
      if (part.has_usage()) usage = part.usage();
    }
    grpc::Status s = reader->Finish();
    std::cout << "\n";
    if (!s.ok()) return Fail(s);
    std::fprintf(stderr,
                 "[%u prompt + %u generated tokens, KV %u -> %u entries (x%.2f), ttft %.1f ms, "
                 "total %.1f ms]\n",
                 usage.prompt_tokens(), usage.completion_tokens(), usage.kv_prompt_entries(),
                 usage.kv_kept_entries(), usage.compression_ratio(), usage.time_to_first_token_ms(),
                 usage.total_ms());
    return 0;
  }
  return Usage();
}
