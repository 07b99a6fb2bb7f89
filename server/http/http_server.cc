#include "server/http/http_server.h"

#include <boost/asio/dispatch.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <deque>
#include <optional>
#include <thread>
#include <type_traits>
#include <vector>

#include "server/http/request_parser.h"
#include "server/logging.h"

namespace snapserve::server::http {
namespace {

namespace net = boost::asio;
namespace ssl = net::ssl;
namespace beast = boost::beast;
namespace bhttp = beast::http;
using tcp = net::ip::tcp;
using PlainStream = beast::tcp_stream;
using TlsStream = beast::ssl_stream<beast::tcp_stream>;

// Bytes of a next request read ahead while one is answered; beyond it the
// connection stops reading (and then notices a disconnect only by a failed
// write) until the answer is out.
constexpr size_t kMaxReadAhead = 64 << 10;
// After a response that closes the connection, what the client still sends
// is read and dropped for this long (or this much) before closing: closing a
// socket with unread bytes resets it, and a reset can destroy the answer
// before the client reads it (a 413 sent before the body arrived).
constexpr std::chrono::seconds kDrainTime{5};
constexpr size_t kMaxDrainBytes = size_t{64} << 20;

// What every connection shares with the server.
struct Shared {
  HttpServerOptions options;
  HttpServer::Handler handler;
  std::atomic<int> connections{0};
};

std::string StatusLine(int status) {
  const auto reason = bhttp::obsolete_reason(static_cast<bhttp::status>(status));
  return "HTTP/1.1 " + std::to_string(status) + " " + std::string(reason.data(), reason.size()) +
         "\r\n";
}

// One chunk of a chunked body (RFC 9112, 7.1).
std::string Chunk(const std::string& data) {
  char size[20];
  std::snprintf(size, sizeof(size), "%zx\r\n", data.size());
  return size + data + "\r\n";
}

template <class Stream>
class Session final : public HttpResponder, public std::enable_shared_from_this<Session<Stream>> {
  static constexpr bool kTls = std::is_same_v<Stream, TlsStream>;

 public:
  template <class... StreamArgs>
  explicit Session(std::shared_ptr<Shared> shared, StreamArgs&&... args)
      : shared_(std::move(shared)),
        stream_(std::forward<StreamArgs>(args)...),
        timer_(stream_.get_executor()) {
    ++shared_->connections;
  }
  ~Session() override { --shared_->connections; }

  void Start() {
    net::dispatch(stream_.get_executor(), [self = this->shared_from_this()] {
      if constexpr (kTls) {
        self->Lowest().expires_after(self->shared_->options.request_timeout);
        self->stream_.async_handshake(ssl::stream_base::server, [self](beast::error_code ec) {
          if (ec) return self->Close();
          self->ReadRequest();
        });
      } else {
        self->ReadRequest();
      }
    });
  }

  // ------------------------------------------------ HttpResponder, posted ---

  void Post(std::function<void()> task) override {
    net::post(stream_.get_executor(), std::move(task));
  }

  void Reply(int status, std::string content_type, std::string body,
             std::string extra_headers) override {
    Post([self = this->shared_from_this(), status, type = std::move(content_type),
          body = std::move(body), extra = std::move(extra_headers)] {
      if (!self->responding_ || self->ended_ || self->events_) return;
      self->Queue(StatusLine(status) + "Content-Type: " + type +
                  "\r\nContent-Length: " + std::to_string(body.size()) + "\r\n" + extra +
                  self->ConnectionHeader() + "\r\n" + body);
      self->ended_ = true;
    });
  }

  void StartEvents() override {
    Post([self = this->shared_from_this()] {
      if (!self->responding_ || self->ended_ || self->events_) return;
      self->events_ = true;
      self->Queue(StatusLine(200) +
                  "Content-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
                  "Transfer-Encoding: chunked\r\n" +
                  self->ConnectionHeader() + "\r\n");
    });
  }

  void Event(std::string data) override {
    Post([self = this->shared_from_this(), data = std::move(data)] {
      if (!self->events_ || self->ended_) return;
      self->Queue(Chunk("data: " + data + "\n\n"));
    });
  }

  void EndEvents() override {
    Post([self = this->shared_from_this()] {
      if (!self->events_ || self->ended_) return;
      self->Queue("0\r\n\r\n");
      self->ended_ = true;
    });
  }

  void OnClientGone(std::function<void()> on_gone) override {
    Post([self = this->shared_from_this(), on_gone = std::move(on_gone)]() mutable {
      if (!self->responding_ || self->ended_) return;
      if (self->closed_) return on_gone();  // already gone
      self->on_gone_ = std::move(on_gone);
    });
  }

 private:
  beast::tcp_stream& Lowest() { return beast::get_lowest_layer(stream_); }

  std::string ConnectionHeader() const { return keep_alive_ ? "" : "Connection: close\r\n"; }

  // ------------------------------------------------------------ requests ---

  void ReadRequest() {
    if (closed_) return;
    parser_.emplace();
    LimitRequestParser(*parser_, shared_->options.max_head_bytes, shared_->options.max_body_bytes);
    Lowest().expires_after(shared_->options.request_timeout);
    bhttp::async_read_header(
        stream_, buffer_, *parser_,
        [self = this->shared_from_this()](beast::error_code ec, size_t) { self->OnHeader(ec); });
  }

  void OnHeader(beast::error_code ec) {
    if (ec) return OnRequestError(ec);
    // curl and others wait for this before sending a large body.
    const auto expect = parser_->get()[bhttp::field::expect];
    if (beast::iequals(expect, "100-continue") && !parser_->is_done()) {
      continue_ = "HTTP/1.1 100 Continue\r\n\r\n";
      net::async_write(stream_, net::buffer(continue_),
                       [self = this->shared_from_this()](beast::error_code ec, size_t) {
                         if (ec) return self->Close();
                         self->ReadBody();
                       });
      return;
    }
    ReadBody();
  }

  void ReadBody() {
    bhttp::async_read(stream_, buffer_, *parser_,
                      [self = this->shared_from_this()](beast::error_code ec, size_t) {
                        if (ec) return self->OnRequestError(ec);
                        self->Dispatch();
                      });
  }

  void OnRequestError(beast::error_code ec) {
    if (ec == bhttp::error::body_limit) {
      return Refuse(413, "the request body is larger than " +
                             std::to_string(shared_->options.max_body_bytes) + " bytes");
    }
    if (ec == bhttp::error::header_limit) {
      return Refuse(431, "the request head is larger than " +
                             std::to_string(shared_->options.max_head_bytes) + " bytes");
    }
    // A malformed request (rather than a closed or timed-out connection) is
    // told so; the parser's state is unusable after it, so the connection ends.
    if (ec.category() == bhttp::make_error_code(bhttp::error::bad_method).category() &&
        ec != bhttp::error::end_of_stream && ec != bhttp::error::partial_message) {
      return Refuse(400, "malformed HTTP request: " + ec.message());
    }
    Close();
  }

  // Answers a request that could not be read, in OpenAI's error shape, and
  // closes the connection.
  void Refuse(int status, const std::string& message) {
    Lowest().expires_never();
    responding_ = true;
    ended_ = false;
    keep_alive_ = false;
    const std::string body = nlohmann::json{
        {"error",
         {{"message", message},
          {"type", "invalid_request_error"},
          {"param", nullptr},
          {"code", nullptr}}}}.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    Queue(StatusLine(status) + "Content-Type: application/json\r\nContent-Length: " +
          std::to_string(body.size()) + "\r\n" + ConnectionHeader() + "\r\n" + body);
    ended_ = true;
  }

  void Dispatch() {
    Lowest().expires_never();  // answering may take as long as generation takes
    auto& message = parser_->get();
    HttpRequest request;
    const auto method = message.method_string();
    request.method = std::string(method.data(), method.size());
    const std::string_view target(message.target().data(), message.target().size());
    request.path = std::string(target.substr(0, target.find('?')));
    const auto authorization = message[bhttp::field::authorization];
    request.authorization = std::string(authorization.data(), authorization.size());
    const auto traceparent = message["traceparent"];
    request.traceparent = std::string(traceparent.data(), traceparent.size());
    request.body = std::move(message.body());
    keep_alive_ = message.keep_alive();
    parser_.reset();
    responding_ = true;
    ended_ = false;
    events_ = false;
    on_gone_ = nullptr;
    try {
      shared_->handler(request, this->shared_from_this());
    } catch (const std::exception& e) {
      // Never a backtrace to the client, never an I/O thread lost.
      LogEvent("error", "http_handler_failed", {{"error", e.what()}});
      Reply(500, "application/json",
            R"({"error":{"message":"internal error; the details are in the server log",)"
            R"("type":"server_error","param":null,"code":"internal_error"}})",
            {});
    }
    // The answer comes later (posted); meanwhile a read notices the client
    // leaving and collects the next request's first bytes.
    ReadMore();
  }

  // ------------------------------------------------- reads between answers ---

  void ReadMore() {
    if (reading_ || closed_ || (!draining_ && buffer_.size() >= kMaxReadAhead)) return;
    reading_ = true;
    stream_.async_read_some(buffer_.prepare(4096),
                            [self = this->shared_from_this()](beast::error_code ec, size_t n) {
                              self->OnReadMore(ec, n);
                            });
  }

  void OnReadMore(beast::error_code ec, size_t n) {
    reading_ = false;
    if (ec) return Close();  // the client left (or the timer closed the socket)
    buffer_.commit(n);
    if (draining_) {
      drained_ += buffer_.size();
      buffer_.consume(buffer_.size());
      if (drained_ > kMaxDrainBytes) return Close();
      return ReadMore();
    }
    if (responding_) return ReadMore();
    timer_.cancel();  // the next request began
    ReadRequest();
  }

  // ------------------------------------------------------------- writes ---

  void Queue(std::string bytes) {
    if (closed_) return;
    out_.push_back(std::move(bytes));
    if (!writing_) WriteNext();
  }

  void WriteNext() {
    writing_ = true;
    net::async_write(
        stream_, net::buffer(out_.front()),
        [self = this->shared_from_this()](beast::error_code ec, size_t) { self->OnWrite(ec); });
  }

  void OnWrite(beast::error_code ec) {
    writing_ = false;
    if (ec) return Close();
    out_.pop_front();
    if (!out_.empty()) return WriteNext();
    if (responding_ && ended_) ResponseDone();
  }

  void ResponseDone() {
    responding_ = false;
    events_ = false;
    on_gone_ = nullptr;
    if (!keep_alive_) return Drain();
    if (reading_) {
      // The read started while answering goes on as the wait for the next
      // request; an idle connection is closed after request_timeout.
      ArmTimer(shared_->options.request_timeout);
    } else {
      ReadRequest();
    }
  }

  void Drain() {
    draining_ = true;
    if constexpr (!kTls) {
      beast::error_code ignored;
      Lowest().socket().shutdown(tcp::socket::shutdown_send, ignored);
    }
    ArmTimer(kDrainTime);
    drained_ = buffer_.size();
    buffer_.consume(buffer_.size());
    ReadMore();
  }

  void ArmTimer(std::chrono::steady_clock::duration after) {
    timer_.expires_after(after);
    timer_.async_wait([self = this->shared_from_this()](beast::error_code ec) {
      if (ec != net::error::operation_aborted) self->Close();
    });
  }

  void Close() {
    if (closed_) return;
    closed_ = true;
    timer_.cancel();
    // Cleared whatever happens: it holds the call, which holds this session.
    auto gone = std::move(on_gone_);
    on_gone_ = nullptr;
    if (responding_ && !ended_ && gone) gone();
    beast::error_code ignored;
    Lowest().socket().shutdown(tcp::socket::shutdown_both, ignored);
    Lowest().close();
  }

  std::shared_ptr<Shared> shared_;
  Stream stream_;
  net::steady_timer timer_;
  beast::flat_buffer buffer_;
  std::optional<RequestParser> parser_;
  std::string continue_;
  std::deque<std::string> out_;
  std::function<void()> on_gone_;
  size_t drained_ = 0;
  bool writing_ = false;
  bool reading_ = false;
  bool responding_ = false;  // a request is being answered
  bool ended_ = false;       // its last bytes are queued
  bool events_ = false;      // its answer is an event stream
  bool keep_alive_ = true;
  bool draining_ = false;
  bool closed_ = false;
};

}  // namespace

struct HttpServer::Impl {
  std::shared_ptr<Shared> shared = std::make_shared<Shared>();
  net::io_context ioc;
  std::optional<ssl::context> tls;
  tcp::acceptor acceptor{ioc};
  net::steady_timer accept_pause{ioc};
  std::vector<std::thread> threads;
  std::string address;
  int port = 0;

  void Accept() {
    acceptor.async_accept(net::make_strand(ioc), [this](beast::error_code ec, tcp::socket socket) {
      if (!acceptor.is_open()) return;
      if (ec) {
        // Out of descriptors, say: wait a little rather than spin.
        accept_pause.expires_after(std::chrono::milliseconds(100));
        accept_pause.async_wait([this](beast::error_code) { Accept(); });
        return;
      }
      Launch(std::move(socket));
      Accept();
    });
  }

  void Launch(tcp::socket socket) {
    if (shared->connections.load() >= shared->options.max_connections) return;  // closed here
    if (tls) {
      std::make_shared<Session<TlsStream>>(shared, std::move(socket), *tls)->Start();
    } else {
      std::make_shared<Session<PlainStream>>(shared, std::move(socket))->Start();
    }
  }

  std::string MakeTls() {
    const HttpServerOptions& o = shared->options;
    try {
      tls.emplace(ssl::context::tls_server);
      tls->set_options(ssl::context::default_workarounds | ssl::context::no_sslv2 |
                       ssl::context::no_sslv3 | ssl::context::no_tlsv1 | ssl::context::no_tlsv1_1 |
                       ssl::context::single_dh_use);
      tls->use_certificate_chain_file(o.tls_cert);
      tls->use_private_key_file(o.tls_key, ssl::context::pem);
      if (!o.tls_client_ca.empty()) {
        tls->load_verify_file(o.tls_client_ca);
        tls->set_verify_mode(ssl::verify_peer | ssl::verify_fail_if_no_peer_cert);
      }
    } catch (const boost::system::system_error& e) {
      return std::string("TLS setup: ") + e.what();
    }
    return "";
  }
};

HttpServer::HttpServer(HttpServerOptions options, Handler handler) : impl_(new Impl) {
  impl_->shared->options = std::move(options);
  impl_->shared->handler = std::move(handler);
}

HttpServer::~HttpServer() { Stop(); }

std::string HttpServer::Start() {
  const HttpServerOptions& o = impl_->shared->options;
  if (!o.tls_cert.empty()) {
    if (std::string err = impl_->MakeTls(); !err.empty()) return err;
  }
  // "[::1]" as gRPC spells an IPv6 host; the resolver wants it bare.
  std::string host = o.host;
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  beast::error_code ec;
  tcp::resolver resolver(impl_->ioc);
  const auto found = resolver.resolve(host, std::to_string(o.port),
                                      tcp::resolver::passive | tcp::resolver::numeric_service, ec);
  if (ec || found.empty()) return "cannot resolve " + o.host + ": " + ec.message();
  const tcp::endpoint endpoint = found.begin()->endpoint();
  tcp::acceptor& a = impl_->acceptor;
  a.open(endpoint.protocol(), ec);
  if (!ec) a.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) a.bind(endpoint, ec);
  if (!ec) a.listen(net::socket_base::max_listen_connections, ec);
  if (ec) return "cannot listen on " + o.host + ":" + std::to_string(o.port) + ": " + ec.message();
  const tcp::endpoint bound = a.local_endpoint();
  impl_->port = bound.port();
  const std::string ip = bound.address().to_string();
  impl_->address =
      (bound.address().is_v6() ? "[" + ip + "]" : ip) + ":" + std::to_string(impl_->port);
  impl_->Accept();
  for (int i = 0; i < std::max(1, o.io_threads); ++i) {
    impl_->threads.emplace_back([this] {
      // A handler that throws (out of memory, say) is logged and the loop
      // goes on: one bad request must not stop the HTTP API.
      for (;;) {
        try {
          impl_->ioc.run();
          return;
        } catch (const std::exception& e) {
          LogEvent("error", "http_handler_failed", {{"error", e.what()}});
        }
      }
    });
  }
  return "";
}

const std::string& HttpServer::address() const { return impl_->address; }
int HttpServer::port() const { return impl_->port; }

void HttpServer::Stop() {
  if (impl_->threads.empty()) return;
  impl_->ioc.stop();
  for (std::thread& t : impl_->threads) t.join();
  impl_->threads.clear();
  // No thread runs handlers any more: the acceptor is ours alone. Connections
  // close as their sessions are destroyed.
  beast::error_code ignored;
  impl_->acceptor.close(ignored);
}

}  // namespace snapserve::server::http
