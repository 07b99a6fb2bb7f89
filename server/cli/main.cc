// snapserve-cli: a person's client for a running snapserve.
//   snapserve-cli [--target=host:port] [--ca=ca.pem] health
//   snapserve-cli info
//   snapserve-cli tokenize "text"
//   snapserve-cli generate [--max-new-tokens=N] [--temperature=T]
//                          [--kv=snapkv|streaming_llm|none] "prompt"
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <condition_variable>
#include <mutex>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "snapserve/v1/generation.grpc.pb.h"

namespace {

namespace v1 = snapserve::v1;

int Usage() {
  std::fprintf(stderr,
               "usage: snapserve-cli [--target=HOST:PORT] [--ca=PEM] [--timeout=SECONDS] COMMAND\n"
               "commands:\n"
               "  health                      grpc.health.v1 status of the server\n"
               "  info                        the served model and limits\n"
               "  tokenize TEXT               token ids of TEXT\n"
               "  generate [opts] PROMPT      stream a completion to the terminal\n"
               "     --max-new-tokens=N --temperature=T --top-k=K --top-p=P --seed=S\n"
               "     --kv=snapkv|streaming_llm|none --capacity=C --window=W --sink=S --chat (send "
               "PROMPT as a user message)\n");
  return 2;
}

int Fail(const grpc::Status& s) {
  std::fprintf(stderr, "error: %d %s\n", static_cast<int>(s.error_code()),
               s.error_message().c_str());
  return 1;
}

// The health service is called through the generic stub: grpc.health.v1
// messages are tiny (field 1: service name / serving status).
int Health(grpc::Channel& channel, double timeout) {
  grpc::GenericStub stub(channel.shared_from_this());
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() +
                   std::chrono::duration_cast<std::chrono::milliseconds>(
                       std::chrono::duration<double>(timeout)));
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
  std::string target = "localhost:50051", ca;
  double timeout = 600;
  std::map<std::string, std::string> opts;
  std::vector<std::string> positional;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--", 0) == 0) {
      const size_t eq = a.find('=');
      const std::string key = a.substr(2, eq == std::string::npos ? std::string::npos : eq - 2);
      const std::string value = eq == std::string::npos ? "" : a.substr(eq + 1);
      if (key == "target")
        target = value;
      else if (key == "ca")
        ca = value;
      else if (key == "timeout")
        timeout = std::stod(value);
      else if (key == "help")
        return Usage();
      else
        opts[key] = value;
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
  auto deadline = [&](grpc::ClientContext& ctx) {
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::duration_cast<std::chrono::milliseconds>(
                         std::chrono::duration<double>(timeout)));
  };
  const std::string& command = positional[0];

  if (command == "health") return Health(*channel, timeout);
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
    if (opts.count("max-new-tokens"))
      req.mutable_stopping()->set_max_new_tokens(std::stoul(opts["max-new-tokens"]));
    if (opts.count("temperature"))
      req.mutable_sampling()->set_temperature(std::stof(opts["temperature"]));
    if (opts.count("top-k")) req.mutable_sampling()->set_top_k(std::stoul(opts["top-k"]));
    if (opts.count("top-p")) req.mutable_sampling()->set_top_p(std::stof(opts["top-p"]));
    if (opts.count("seed")) req.mutable_sampling()->set_seed(std::stoull(opts["seed"]));
    if (opts.count("kv")) {
      const std::string& kv = opts["kv"];
      req.mutable_kv_compression()->set_method(kv == "none" ? v1::KvCompression::NONE
                                               : kv == "streaming_llm"
                                                   ? v1::KvCompression::STREAMING_LLM
                                                   : v1::KvCompression::SNAPKV);
    }
    if (opts.count("sink")) req.mutable_kv_compression()->set_sink_tokens(std::stoul(opts["sink"]));
    if (opts.count("capacity"))
      req.mutable_kv_compression()->set_max_capacity_prompt(std::stoul(opts["capacity"]));
    if (opts.count("window"))
      req.mutable_kv_compression()->set_window_size(std::stoul(opts["window"]));
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
