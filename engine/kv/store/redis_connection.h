// A blocking Redis connection with a deadline on every command, over TCP or
// TLS (OpenSSL), speaking RESP through hiredis's protocol reader and
// command formatter. Only the shared KV tier's threads use it (never the
// scheduler thread), one connection per thread. Debian 12's hiredis (0.14)
// has no TLS of its own, hence the socket and TLS here.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "engine/common/status_or.h"

namespace snapserve::kv {

struct RedisEndpoint {
  std::string host;
  int port = 6379;
  int db = 0;
  bool tls = false;
  std::string tls_ca_file;  // empty: the system's CA store
  std::string user;         // ACL user (AUTH user password); empty: AUTH password
  std::string password;     // empty: no AUTH
};

// Whether this build has the client (hiredis and OpenSSL were found).
bool HaveRedisClient();

// redis://host[:port][/db] or rediss://... (TLS). Credentials in the URL are
// refused: a URL ends up in logs and process listings, a password must not.
StatusOr<RedisEndpoint> ParseRedisUrl(std::string_view url);

struct RedisReply {
  enum class Type { kString, kNil, kInteger, kStatus, kError, kArray };
  Type type = Type::kNil;
  std::string str;  // kString, kStatus, kError
  int64_t integer = 0;
};

class RedisConnection {
 public:
  using Clock = std::chrono::steady_clock;

  // Connects, handshakes TLS, sends AUTH and SELECT. UNAVAILABLE on network
  // failures, INVALID_ARGUMENT when AUTH, SELECT or the TLS CA file is refused.
  static StatusOr<std::unique_ptr<RedisConnection>> Connect(const RedisEndpoint& endpoint,
                                                            Clock::time_point deadline);
  ~RedisConnection();
  RedisConnection(const RedisConnection&) = delete;
  RedisConnection& operator=(const RedisConnection&) = delete;

  // Sends one command and reads its reply by `deadline`. UNAVAILABLE on a
  // network error or a missed deadline, after which the connection is
  // unusable (broken() is true). An error reply is a reply (kError).
  StatusOr<RedisReply> Command(const std::vector<std::string_view>& args,
                               Clock::time_point deadline);
  bool broken() const { return broken_; }

 private:
  struct Io;
  explicit RedisConnection(std::unique_ptr<Io> io);
  std::unique_ptr<Io> io_;
  bool broken_ = false;
};

}  // namespace snapserve::kv
