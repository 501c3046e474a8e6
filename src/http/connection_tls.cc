// The connection over TLS: the Connection and Refuse templates compiled for beast::ssl_stream, apart from the plain
// ones (connection.cc) and from the rest of the layer (src/http/CMakeLists.txt: the slowest file of the layer, it
// compiles beside the layer's batch rather than inside it).
#include "http/connection.h"

namespace parsyn::http {

using TlsStream = beast::ssl_stream<beast::tcp_stream>;

void ServeTlsConnection(std::shared_ptr<Server::State> state, tcp::socket socket, std::string remote,
                        std::unique_ptr<ConnectionSlot> slot) {
  asio::io_context& io = state->io;
  TlsStream stream(beast::tcp_stream(std::move(socket)), *state->ssl);
  auto conn = std::make_shared<Connection<TlsStream>>(std::move(state), std::move(stream), std::move(remote));
  asio::co_spawn(io, RunAdmitted(std::move(conn), std::move(slot)), asio::detached);
}

void RefuseTlsConnection(std::shared_ptr<Server::State> state, tcp::socket socket, Response refusal) {
  asio::io_context& io = state->io;
  TlsStream stream(beast::tcp_stream(std::move(socket)), *state->ssl);
  asio::co_spawn(io, Refuse(std::move(state), std::move(stream), std::move(refusal)), asio::detached);
}

}  // namespace parsyn::http
