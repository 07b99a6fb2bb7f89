#include "engine/kv/store/redis_connection.h"

#include <charconv>

namespace snapserve::kv {

namespace {

bool ParseInt(std::string_view text, int lo, int hi, int* out) {
  int value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size() || value < lo ||
      value > hi) {
    return false;
  }
  *out = value;
  return true;
}

}  // namespace

StatusOr<RedisEndpoint> ParseRedisUrl(std::string_view url) {
  RedisEndpoint e;
  std::string_view rest;
  if (url.starts_with("redis://")) {
    rest = url.substr(8);
  } else if (url.starts_with("rediss://")) {
    rest = url.substr(9);
    e.tls = true;
  } else {
    return Status::InvalidArgument("kv_store: expected redis://host:port[/db] or rediss://...");
  }
  if (rest.find('@') != std::string_view::npos) {
    return Status::InvalidArgument(
        "kv_store: no credentials in the URL; use --kv-store-password-file or "
        "SNAPSERVE_KV_STORE_PASSWORD");
  }
  const size_t slash = rest.find('/');
  std::string_view authority = rest.substr(0, slash);
  if (slash != std::string_view::npos) {
    const std::string_view db = rest.substr(slash + 1);
    if (!db.empty() && !ParseInt(db, 0, 1 << 20, &e.db)) {
      return Status::InvalidArgument("kv_store: the database must be a number, got '" +
                                     std::string(db.substr(0, 40)) + "'");
    }
  }
  std::string_view port;
  if (authority.starts_with("[")) {  // [IPv6]:port
    const size_t close = authority.find(']');
    if (close == std::string_view::npos) return Status::InvalidArgument("kv_store: bad host");
    e.host = std::string(authority.substr(1, close - 1));
    if (close + 1 < authority.size()) {
      if (authority[close + 1] != ':') return Status::InvalidArgument("kv_store: bad host");
      port = authority.substr(close + 2);
    }
  } else {
    const size_t colon = authority.rfind(':');
    e.host = std::string(authority.substr(0, colon));
    if (colon != std::string_view::npos) port = authority.substr(colon + 1);
  }
  if (e.host.empty()) return Status::InvalidArgument("kv_store: the URL names no host");
  if (!port.empty() && !ParseInt(port, 1, 65535, &e.port)) {
    return Status::InvalidArgument("kv_store: bad port '" + std::string(port.substr(0, 20)) + "'");
  }
  return e;
}

}  // namespace snapserve::kv

#if SNAPSERVE_HAVE_REDIS_CLIENT

#include <arpa/inet.h>
#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace snapserve::kv {

namespace {

Status Unavailable(const std::string& what) { return Status::Unavailable("redis: " + what); }

std::string OpenSslError() {
  const unsigned long e = ERR_get_error();
  if (e == 0) return "TLS error";
  char buf[256];
  ERR_error_string_n(e, buf, sizeof(buf));
  ERR_clear_error();
  return buf;
}

bool IsIpLiteral(const std::string& host) {
  unsigned char buf[sizeof(in6_addr)];
  return inet_pton(AF_INET, host.c_str(), buf) == 1 || inet_pton(AF_INET6, host.c_str(), buf) == 1;
}

}  // namespace

bool HaveRedisClient() { return true; }

struct RedisConnection::Io {
  int fd = -1;
  SSL_CTX* ctx = nullptr;
  SSL* ssl = nullptr;
  redisReader* reader = redisReaderCreate();

  ~Io() {
    if (ssl != nullptr) SSL_free(ssl);
    if (ctx != nullptr) SSL_CTX_free(ctx);
    if (fd >= 0) close(fd);
    if (reader != nullptr) redisReaderFree(reader);
  }

  static Status Wait(int fd, short events, Clock::time_point deadline) {
    while (true) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
      if (left <= 0) return Unavailable("timed out");
      pollfd p{fd, events, 0};
      const int r = poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 60000)));
      if (r > 0) return Status::Ok();
      if (r < 0 && errno != EINTR) return Unavailable(std::string("poll: ") + strerror(errno));
    }
  }

  // What a TLS call that did not complete waits for; an error otherwise.
  Status WaitTls(int ret, Clock::time_point deadline) {
    switch (SSL_get_error(ssl, ret)) {
      case SSL_ERROR_WANT_READ:
        return Wait(fd, POLLIN, deadline);
      case SSL_ERROR_WANT_WRITE:
        return Wait(fd, POLLOUT, deadline);
      case SSL_ERROR_ZERO_RETURN:
        return Unavailable("connection closed");
      case SSL_ERROR_SYSCALL:
        return Unavailable(errno != 0 ? strerror(errno) : "connection closed");
      default:
        return Unavailable(OpenSslError());
    }
  }

  Status Handshake(const RedisEndpoint& e, Clock::time_point deadline) {
    ctx = SSL_CTX_new(TLS_client_method());
    if (ctx == nullptr) return Unavailable(OpenSslError());
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, nullptr);
    const int loaded = e.tls_ca_file.empty()
                           ? SSL_CTX_set_default_verify_paths(ctx)
                           : SSL_CTX_load_verify_locations(ctx, e.tls_ca_file.c_str(), nullptr);
    if (loaded != 1) return Status::InvalidArgument("kv_store: TLS CA: " + OpenSslError());
    ssl = SSL_new(ctx);
    if (ssl == nullptr || SSL_set_fd(ssl, fd) != 1) return Unavailable(OpenSslError());
    if (IsIpLiteral(e.host)) {
      X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), e.host.c_str());
    } else {
      SSL_set_tlsext_host_name(ssl, e.host.c_str());
      SSL_set1_host(ssl, e.host.c_str());
    }
    while (true) {
      const int r = SSL_connect(ssl);
      if (r == 1) return Status::Ok();
      if (Status s = WaitTls(r, deadline); !s.ok()) return s;
    }
  }

  Status WriteAll(const char* data, size_t size, Clock::time_point deadline) {
    while (size > 0) {
      ssize_t n;
      if (ssl != nullptr) {
        ERR_clear_error();
        const int r = SSL_write(ssl, data, static_cast<int>(std::min<size_t>(size, 1 << 20)));
        if (r <= 0) {
          if (Status s = WaitTls(r, deadline); !s.ok()) return s;
          continue;
        }
        n = r;
      } else {
        n = send(fd, data, size, MSG_NOSIGNAL);
        if (n < 0) {
          if (errno == EAGAIN || errno == EINTR) {
            if (Status s = Wait(fd, POLLOUT, deadline); !s.ok()) return s;
            continue;
          }
          return Unavailable(std::string("send: ") + strerror(errno));
        }
      }
      data += n;
      size -= static_cast<size_t>(n);
    }
    return Status::Ok();
  }

  StatusOr<size_t> ReadSome(char* buf, size_t size, Clock::time_point deadline) {
    while (true) {
      if (ssl != nullptr) {
        ERR_clear_error();
        const int r = SSL_read(ssl, buf, static_cast<int>(size));
        if (r > 0) return static_cast<size_t>(r);
        if (Status s = WaitTls(r, deadline); !s.ok()) return s;
        continue;
      }
      const ssize_t n = recv(fd, buf, size, 0);
      if (n > 0) return static_cast<size_t>(n);
      if (n == 0) return Unavailable("connection closed");
      if (errno != EAGAIN && errno != EINTR) {
        return Unavailable(std::string("recv: ") + strerror(errno));
      }
      if (Status s = Wait(fd, POLLIN, deadline); !s.ok()) return s;
    }
  }
};

RedisConnection::RedisConnection(std::unique_ptr<Io> io) : io_(std::move(io)) {}
RedisConnection::~RedisConnection() = default;

StatusOr<std::unique_ptr<RedisConnection>> RedisConnection::Connect(const RedisEndpoint& e,
                                                                    Clock::time_point deadline) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const std::string port = std::to_string(e.port);
  if (const int r = getaddrinfo(e.host.c_str(), port.c_str(), &hints, &found); r != 0) {
    return Unavailable("cannot resolve " + e.host + ": " + gai_strerror(r));
  }
  auto io = std::make_unique<Io>();
  std::string error = "no address";
  for (addrinfo* a = found; a != nullptr && io->fd < 0; a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    int ok = connect(fd, a->ai_addr, a->ai_addrlen) == 0 ? 0 : errno;
    if (ok == EINPROGRESS) {
      const Status waited = Io::Wait(fd, POLLOUT, deadline);
      socklen_t len = sizeof(ok);
      ok = waited.ok() ? (getsockopt(fd, SOL_SOCKET, SO_ERROR, &ok, &len) == 0 ? ok : errno)
                       : ETIMEDOUT;
    }
    if (ok != 0) {
      error = strerror(ok);
      close(fd);
      continue;
    }
    const int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    io->fd = fd;
  }
  freeaddrinfo(found);
  if (io->fd < 0) return Unavailable("cannot connect to " + e.host + ":" + port + ": " + error);
  if (io->reader == nullptr) return Status::ResourceExhausted("redis: no memory for a reader");
  if (e.tls) {
    if (Status s = io->Handshake(e, deadline); !s.ok()) return s;
  }
  std::unique_ptr<RedisConnection> c(new RedisConnection(std::move(io)));
  if (!e.password.empty()) {
    std::vector<std::string_view> auth = {"AUTH"};
    if (!e.user.empty()) auth.push_back(e.user);
    auth.push_back(e.password);
    SNAPSERVE_ASSIGN_OR_RETURN(RedisReply r, c->Command(auth, deadline));
    // The reply names the failure (WRONGPASS ...), never the password.
    if (r.type == RedisReply::Type::kError) {
      return Status::InvalidArgument("kv_store: AUTH refused: " + r.str.substr(0, 200));
    }
  }
  if (e.db != 0) {
    const std::string db = std::to_string(e.db);
    SNAPSERVE_ASSIGN_OR_RETURN(RedisReply r, c->Command({"SELECT", db}, deadline));
    if (r.type == RedisReply::Type::kError) {
      return Status::InvalidArgument("kv_store: SELECT " + db + ": " + r.str.substr(0, 200));
    }
  }
  return c;
}

StatusOr<RedisReply> RedisConnection::Command(const std::vector<std::string_view>& args,
                                              Clock::time_point deadline) {
  if (broken_) return Unavailable("connection broken");
  std::vector<const char*> argv;
  std::vector<size_t> lens;
  for (std::string_view a : args) {
    argv.push_back(a.data());
    lens.push_back(a.size());
  }
  char* cmd = nullptr;
  const int len =
      redisFormatCommandArgv(&cmd, static_cast<int>(args.size()), argv.data(), lens.data());
  if (len < 0) return Status::ResourceExhausted("redis: cannot format a command");
  const Status sent = io_->WriteAll(cmd, static_cast<size_t>(len), deadline);
  redisFreeCommand(cmd);
  broken_ = !sent.ok();
  if (!sent.ok()) return sent;
  std::string buf(256 << 10, '\0');
  while (true) {
    void* raw = nullptr;
    if (redisReaderGetReply(io_->reader, &raw) != REDIS_OK) {
      broken_ = true;
      return Unavailable(std::string("protocol error: ") + io_->reader->errstr);
    }
    if (raw != nullptr) {
      auto* r = static_cast<redisReply*>(raw);
      RedisReply out;
      switch (r->type) {
        case REDIS_REPLY_STRING:
          out.type = RedisReply::Type::kString;
          out.str.assign(r->str, r->len);
          break;
        case REDIS_REPLY_STATUS:
          out.type = RedisReply::Type::kStatus;
          out.str.assign(r->str, r->len);
          break;
        case REDIS_REPLY_ERROR:
          out.type = RedisReply::Type::kError;
          out.str.assign(r->str, r->len);
          break;
        case REDIS_REPLY_INTEGER:
          out.type = RedisReply::Type::kInteger;
          out.integer = r->integer;
          break;
        case REDIS_REPLY_ARRAY:
          out.type = RedisReply::Type::kArray;
          break;
        default:
          out.type = RedisReply::Type::kNil;
      }
      freeReplyObject(r);
      return out;
    }
    StatusOr<size_t> n = io_->ReadSome(buf.data(), buf.size(), deadline);
    if (!n.ok()) {
      broken_ = true;
      return n.status();
    }
    if (redisReaderFeed(io_->reader, buf.data(), *n) != REDIS_OK) {
      broken_ = true;
      return Unavailable("protocol error");
    }
  }
}

}  // namespace snapserve::kv

#else  // built without hiredis or OpenSSL

namespace snapserve::kv {

bool HaveRedisClient() { return false; }

struct RedisConnection::Io {};
RedisConnection::RedisConnection(std::unique_ptr<Io> io) : io_(std::move(io)) {}
RedisConnection::~RedisConnection() = default;

StatusOr<std::unique_ptr<RedisConnection>> RedisConnection::Connect(const RedisEndpoint&,
                                                                    Clock::time_point) {
  return Status::InvalidArgument(
      "kv_store: this build has no Redis client (it needs libhiredis-dev and libssl-dev)");
}

StatusOr<RedisReply> RedisConnection::Command(const std::vector<std::string_view>&,
                                              Clock::time_point) {
  return Status::Unavailable("redis: no client in this build");
}

}  // namespace snapserve::kv

#endif
