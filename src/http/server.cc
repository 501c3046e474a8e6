#include "http/server.h"

#include <openssl/ssl.h>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>

#include "base/log.h"
#include "http/internal.h"
#include "http/server_state.h"

namespace parsyn::http {

using asio::redirect_error;
using asio::use_awaitable;
using error_code = boost::system::error_code;

namespace {

// A failed accept (EMFILE "Too many open files", ENFILE, ENOBUFS) leaves the connection queued and would fail again
// at once: wait before the next try (kAcceptBackoff, doubling up to kAcceptBackoffMax while failures go on), and log
// such failures at most once per kAcceptErrorLogInterval (out of file descriptors: kFdExhaustedLogInterval).
constexpr auto kAcceptBackoff = std::chrono::milliseconds(50);
constexpr auto kAcceptBackoffMax = std::chrono::milliseconds(1000);
constexpr auto kAcceptErrorLogInterval = std::chrono::seconds(1);
constexpr auto kFdExhaustedLogInterval = std::chrono::seconds(60);
// The answer to a connection accepted on the reserve descriptor when the process is out of them (plain HTTP only).
std::string FdExhaustedAnswer() {
  const std::string body =
      R"json({"error":{"code":"unavailable","message":"the server is out of file descriptors; retry later (its )json"
      R"json(operator should raise the open-files limit, `ulimit -n`)"}})json";
  return "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 5\r\n"
         "Connection: close\r\nContent-Length: " +
         std::to_string(body.size()) + "\r\n\r\n" + body;
}

// At most kMaxRefusals connections beyond the caps are answered at once (connection.h's Refuse), the rest closed
// without an answer.
constexpr size_t kMaxRefusals = 64;

// The refusal for a new connection from `address`, or nothing when it is within the caps.
std::optional<Response> CheckCaps(const Server::State& state, const std::string& address) {
  const ServerOptions& opts = state.options;
  std::optional<Response> res;
  if (opts.max_connections > 0 && state.open_connections >= opts.max_connections) {
    res = Response::Error(UnavailableError("the server has " + std::to_string(state.open_connections) +
                                           " connections open, its limit: retry later"));
  } else if (auto it = state.open_per_address.find(address); opts.max_connections_per_address > 0 &&
                                                             it != state.open_per_address.end() &&
                                                             it->second >= opts.max_connections_per_address) {
    res = Response::Error(ResourceExhaustedError("too many connections from " + address + ": at most " +
                                                 std::to_string(opts.max_connections_per_address) +
                                                 " at once; close idle ones (or reuse them) and retry later"));
    res->status = 429;
  }
  if (res) res->WithHeader("Retry-After", std::to_string(std::max<int64_t>(1, opts.overload_retry_after.count())));
  return res;
}

bool IsFdExhaustion(const error_code& ec) {
  return ec.category() == asio::error::get_system_category() && (ec.value() == EMFILE || ec.value() == ENFILE);
}

// Out of file descriptors with a connection queued: gives up the reserve descriptor to accept it, answers it 503
// (plain HTTP; TLS connections are closed: a handshake needs more than one descriptor's worth of state), closes it and
// takes the reserve back. True when a connection was refused so (the queue moved on).
bool RefuseOnReserveDescriptor(Server::State& state) {
  if (state.reserve_fd < 0) state.reserve_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (state.reserve_fd < 0) return false;
  ::close(state.reserve_fd);
  state.reserve_fd = -1;
  const int fd = ::accept4(state.acceptor.native_handle(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
  if (fd >= 0) {
    if (!state.ssl) {
      // Best effort: a fresh socket's send buffer takes this whole; an unread request makes the close a reset.
      const std::string answer = FdExhaustedAnswer();
      [[maybe_unused]] ssize_t sent = ::send(fd, answer.data(), answer.size(), MSG_NOSIGNAL);
      ::shutdown(fd, SHUT_WR);
    }
    ::close(fd);
  }
  state.reserve_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  return fd >= 0;
}

void CountFdExhaustion(Server::State& state, const error_code& ec) {
  state.accept_failures.fd_exhausted++;
  state.accept_failures.last_fd_exhausted_unix_ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
          .count();
  const auto now = std::chrono::steady_clock::now();
  if (state.accept_failures.fd_exhausted > 1 && now - state.last_fd_exhausted_log < kFdExhaustedLogInterval) {
    ++state.fd_exhausted_unlogged;
    return;
  }
  rlimit limit{};
  ::getrlimit(RLIMIT_NOFILE, &limit);
  PARSYN_LOG_ERROR(
      "http: out of file descriptors ({}; {} more since the last report, {} in all): connections are refused with "
      "503 until some close. The open-files limit is {} (hard {}), about 2 per connected worker: raise it (`ulimit "
      "-n` in the shell that starts the server, LimitNOFILE= under systemd, --ulimit nofile= under Docker)",
      ec.message(), state.fd_exhausted_unlogged, state.accept_failures.fd_exhausted, limit.rlim_cur, limit.rlim_max);
  state.last_fd_exhausted_log = now;
  state.fd_exhausted_unlogged = 0;
}

asio::awaitable<void> AcceptLoop(std::shared_ptr<Server::State> state) {
  asio::steady_timer backoff(state->io);
  auto wait = kAcceptBackoff;
  while (true) {
    error_code ec;
    tcp::socket socket = co_await state->acceptor.async_accept(redirect_error(use_awaitable, ec));
    if (state->is_stopping || !state->acceptor.is_open()) co_return;
    if (ec) {
      if (IsFdExhaustion(ec)) {
        CountFdExhaustion(*state, ec);
        if (RefuseOnReserveDescriptor(*state)) continue;
      } else if (auto now = std::chrono::steady_clock::now();
                 now - state->last_accept_error_log >= kAcceptErrorLogInterval) {
        // Log once a second at most (a flood of these would fill the disk).
        PARSYN_LOG_WARN("http: accept failed: {} ({} more such failures since the last report); retrying in {} ms",
                        ec.message(), state->accept_errors_unlogged, wait.count());
        state->last_accept_error_log = now;
        state->accept_errors_unlogged = 0;
      } else {
        ++state->accept_errors_unlogged;
      }
      // The connection stays queued and the next accept would fail at once: wait rather than spin.
      backoff.expires_after(wait);
      co_await backoff.async_wait(redirect_error(use_awaitable, ec));
      wait = std::min(wait * 2, kAcceptBackoffMax);
      continue;
    }
    wait = kAcceptBackoff;
    socket.set_option(tcp::no_delay(true), ec);
    std::string remote;
    std::string address;
    if (auto endpoint = socket.remote_endpoint(ec); !ec) {
      address = endpoint.address().to_string();
      remote = address + ":" + std::to_string(endpoint.port());
    }
    if (std::optional<Response> refusal = CheckCaps(*state, address)) {
      PARSYN_LOG_DEBUG("http: refusing a connection from {}: {}", remote, refusal->body);
      if (state->refusals >= kMaxRefusals) continue;  // the socket closes here: answering costs too
      if (state->ssl) {
        RefuseTlsConnection(state, std::move(socket), std::move(*refusal));
      } else {
        RefusePlainConnection(state, std::move(socket), std::move(*refusal));
      }
      continue;
    }
    auto slot = std::make_unique<ConnectionSlot>(state, address);
    if (state->ssl) {
      ServeTlsConnection(state, std::move(socket), std::move(remote), std::move(slot));
    } else {
      ServePlainConnection(state, std::move(socket), std::move(remote), std::move(slot));
    }
  }
}

StatusOr<tcp::endpoint> ParseListenAddress(std::string_view listen) {
  size_t colon = listen.rfind(':');
  if (colon == std::string_view::npos) {
    return InvalidArgumentError("listen address '" + std::string(listen) + "' must be host:port");
  }
  std::string host(listen.substr(0, colon));
  std::string port_text(listen.substr(colon + 1));
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  if (host == "localhost") host = "127.0.0.1";
  if (host.empty()) host = "0.0.0.0";
  error_code ec;
  asio::ip::address address = asio::ip::make_address(host, ec);
  if (ec) return InvalidArgumentError("listen address '" + std::string(listen) + "': bad host '" + host + "'");
  unsigned long port = 0;
  try {
    size_t used = 0;
    port = std::stoul(port_text, &used);
    if (used != port_text.size() || port > 65535) throw std::out_of_range("port");
  } catch (const std::exception&) {
    return InvalidArgumentError("listen address '" + std::string(listen) + "': bad port '" + port_text + "'");
  }
  return tcp::endpoint(address, static_cast<uint16_t>(port));
}

}  // namespace

StatusOr<bool> IsLoopbackListenAddress(std::string_view listen) {
  PARSYN_ASSIGN_OR_RETURN(tcp::endpoint endpoint, ParseListenAddress(listen));
  const asio::ip::address address = endpoint.address();
  if (address.is_v6() && address.to_v6().is_v4_mapped()) {
    return address.to_v6().to_v4().is_loopback();  // is_loopback() of a v4-mapped address checks only ::1
  }
  return address.is_loopback();
}

StatusOr<std::unique_ptr<Server>> Server::Start(asio::io_context& io, ServerOptions options, Router router) {
  PARSYN_ASSIGN_OR_RETURN(tcp::endpoint endpoint, ParseListenAddress(options.listen));
  auto state = std::make_shared<State>(io, std::move(options), std::move(router));
  const ServerOptions& opts = state->options;

  if (opts.tls_cert_file.empty() != opts.tls_key_file.empty()) {
    return InvalidArgumentError("TLS needs both a certificate file and a key file");
  }
  if (!opts.tls_cert_file.empty()) {
    state->ssl.emplace(asio::ssl::context::tls_server);
    asio::ssl::context& ctx = *state->ssl;
    ctx.set_options(asio::ssl::context::default_workarounds | asio::ssl::context::no_sslv2 |
                    asio::ssl::context::no_sslv3 | asio::ssl::context::no_tlsv1 | asio::ssl::context::no_tlsv1_1);
    error_code ec;
    ctx.use_certificate_chain_file(opts.tls_cert_file.string(), ec);
    if (ec) return InvalidArgumentError("TLS certificate '" + opts.tls_cert_file.string() + "': " + ec.message());
    ctx.use_private_key_file(opts.tls_key_file.string(), asio::ssl::context::pem, ec);
    if (ec) return InvalidArgumentError("TLS key '" + opts.tls_key_file.string() + "': " + ec.message());
    if (!opts.tls_client_ca.empty()) {
      const std::string ca = opts.tls_client_ca.string();
      ctx.load_verify_file(ca, ec);
      if (ec) return InvalidArgumentError("client CA '" + ca + "': " + ec.message());
      // Asked for, verified when sent, not required at the handshake: routes refuse requests without one
      // (Request::client_identity), so the dashboard and the admin API still work from a browser.
      ctx.set_verify_mode(asio::ssl::verify_peer, ec);
      if (ec) return InvalidArgumentError("client CA '" + ca + "': " + ec.message());
      // The CAs named in the certificate request, so a client with several certificates picks the right one.
      if (STACK_OF(X509_NAME)* names = SSL_load_client_CA_file(ca.c_str()); names != nullptr) {
        SSL_CTX_set_client_CA_list(ctx.native_handle(), names);
      }
      // Without a session id context OpenSSL refuses to resume sessions once peers are verified.
      static constexpr unsigned char kSessionContext[] = "parsyn";
      SSL_CTX_set_session_id_context(ctx.native_handle(), kSessionContext, sizeof(kSessionContext) - 1);
    }
  } else if (!opts.tls_client_ca.empty()) {
    return InvalidArgumentError("a client CA (" + opts.tls_client_ca.string() +
                                ") needs TLS: client certificates exist only over HTTPS; give a certificate and a key");
  }

  error_code ec;
  std::string where = endpoint.address().to_string() + ":" + std::to_string(endpoint.port());
  state->acceptor.open(endpoint.protocol(), ec);
  if (!ec) state->acceptor.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) state->acceptor.bind(endpoint, ec);
  if (!ec) state->acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) return UnavailableError("cannot listen on " + where + ": " + ec.message());
  state->port = state->acceptor.local_endpoint().port();
  state->reserve_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  asio::co_spawn(io, AcceptLoop(state), asio::detached);
  PARSYN_LOG_INFO("http: listening on {}://{}:{}", state->ssl ? "https" : "http", endpoint.address().to_string(),
                  state->port);
  return std::unique_ptr<Server>(new Server(std::move(state)));
}

Server::Server(std::shared_ptr<State> state) : state_(std::move(state)) {}

Server::~Server() {
  state_->is_stopping = true;
  error_code ec;
  state_->acceptor.close(ec);
  std::vector<ConnectionBase*> connections(state_->connections.begin(), state_->connections.end());
  for (ConnectionBase* c : connections) c->Close();
}

uint16_t Server::port() const { return state_->port; }
bool Server::tls() const { return state_->ssl.has_value(); }
bool Server::verifies_client_certificates() const { return !state_->options.tls_client_ca.empty(); }
bool Server::stopping() const { return state_->is_stopping; }
AcceptFailures Server::accept_failures() const { return state_->accept_failures; }
loop::Signal& Server::stopping_signal() { return state_->stopping; }

asio::awaitable<void> Server::Shutdown(std::chrono::milliseconds grace) {
  std::shared_ptr<State> state = state_;  // the coroutine may outlive a caller that drops the Server meanwhile
  if (!state->is_stopping) {
    state->is_stopping = true;
    error_code ec;
    state->acceptor.close(ec);
    state->stopping.Notify();
    std::vector<ConnectionBase*> idle(state->connections.begin(), state->connections.end());
    for (ConnectionBase* c : idle) c->CloseIfIdle();
  }
  auto deadline = std::chrono::steady_clock::now() + grace;
  while (!state->connections.empty()) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) break;
    co_await state->connections_changed.Wait(left);
  }
  if (!state->connections.empty()) {
    PARSYN_LOG_WARN("http: closing {} connection(s) still busy after the {} ms grace period", state->connections.size(),
                    grace.count());
    std::vector<ConnectionBase*> busy(state->connections.begin(), state->connections.end());
    for (ConnectionBase* c : busy) c->Close();
  }
  // Closed sockets end their coroutines promptly, except a handler still waiting on something other than
  // stopping_signal(); give those a moment, then return (they keep the shared state alive until they end).
  auto close_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  while (!state->connections.empty() && std::chrono::steady_clock::now() < close_deadline) {
    co_await state->connections_changed.Wait(std::chrono::milliseconds(100));
  }
}

}  // namespace parsyn::http