// The HTTP server's state shared by its accept loop (server.cc) and its connections (connection.h); internal to the
// layer. A connection is served, or refused, by the function of its stream: plain (connection.cc) or TLS
// (connection_tls.cc), each compiling the Connection template for its own stream, so that the two compile apart.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl/context.hpp>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>

#include "http/server.h"
#include "loop/signal.h"

namespace parsyn::http {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;

class ConnectionBase {
 public:
  virtual ~ConnectionBase() = default;
  virtual void CloseIfIdle() = 0;
  virtual void Close() = 0;
};

struct Server::State {
  State(asio::io_context& io, ServerOptions options, Router router)
      : io(io),
        options(std::move(options)),
        router(std::move(router)),
        acceptor(io),
        stopping(io.get_executor()),
        connections_changed(io.get_executor()) {}

  asio::io_context& io;
  ServerOptions options;
  Router router;
  std::optional<asio::ssl::context> ssl;
  tcp::acceptor acceptor;
  loop::Signal stopping;
  loop::Signal connections_changed;
  bool is_stopping = false;
  std::set<ConnectionBase*> connections;
  uint16_t port = 0;
  // Connection accounting (ServerOptions caps): counted at accept, released when the connection's slot is destroyed.
  size_t open_connections = 0;
  std::map<std::string, size_t, std::less<>> open_per_address;
  size_t refusals = 0;  // 503/429 answers being sent
  std::chrono::steady_clock::time_point last_accept_error_log{};
  uint64_t accept_errors_unlogged = 0;
  // Out of file descriptors (EMFILE, ENFILE): counted for the API, logged once per kFdExhaustedLogInterval. A
  // reserve descriptor (/dev/null) is given up to accept and refuse the queued connection with a clear 503, so that
  // the client hears why instead of waiting in the listen queue.
  AcceptFailures accept_failures;
  uint64_t fd_exhausted_unlogged = 0;
  std::chrono::steady_clock::time_point last_fd_exhausted_log{};
  int reserve_fd = -1;

  ~State() {
    if (reserve_fd >= 0) ::close(reserve_fd);
  }
};

// One admitted connection's place in the caps, given back when the connection ends.
class ConnectionSlot {
 public:
  ConnectionSlot(std::shared_ptr<Server::State> state, std::string address)
      : state_(std::move(state)), address_(std::move(address)) {
    ++state_->open_connections;
    ++state_->open_per_address[address_];
  }
  ConnectionSlot(const ConnectionSlot&) = delete;
  ConnectionSlot& operator=(const ConnectionSlot&) = delete;
  ~ConnectionSlot() {
    --state_->open_connections;
    auto it = state_->open_per_address.find(address_);
    if (it != state_->open_per_address.end() && --it->second == 0) state_->open_per_address.erase(it);
  }

 private:
  std::shared_ptr<Server::State> state_;
  std::string address_;
};

// Serves an admitted connection until it ends, reading requests and writing responses (Connection<Stream>); `slot`
// keeps its place in the caps until then. ServeTlsConnection needs state->ssl.
void ServePlainConnection(std::shared_ptr<Server::State> state, tcp::socket socket, std::string remote,
                          std::unique_ptr<ConnectionSlot> slot);
void ServeTlsConnection(std::shared_ptr<Server::State> state, tcp::socket socket, std::string remote,
                        std::unique_ptr<ConnectionSlot> slot);
// Answers a connection beyond the caps with `refusal` and closes it (Refuse<Stream>, connection.h).
void RefusePlainConnection(std::shared_ptr<Server::State> state, tcp::socket socket, Response refusal);
void RefuseTlsConnection(std::shared_ptr<Server::State> state, tcp::socket socket, Response refusal);

}  // namespace parsyn::http
