// The connection's helpers, and its plain-TCP instantiation (connection_tls.cc has the TLS one).
#include "http/connection.h"

#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

namespace parsyn::http {

std::optional<Method> ToMethod(bhttp::verb verb) {
  switch (verb) {
    case bhttp::verb::get: return Method::kGet;
    case bhttp::verb::head: return Method::kHead;
    case bhttp::verb::post: return Method::kPost;
    case bhttp::verb::put: return Method::kPut;
    case bhttp::verb::delete_: return Method::kDelete;
    case bhttp::verb::patch: return Method::kPatch;
    case bhttp::verb::options: return Method::kOptions;
    default: return std::nullopt;
  }
}

bool IsHttpParseError(const beast::error_code& ec) {
  return ec.category() == bhttp::make_error_code(bhttp::error::bad_method).category() &&
         ec != bhttp::error::end_of_stream && ec != bhttp::error::partial_message;
}

std::string FormatEvent(std::string_view event, std::string_view data, std::string_view id) {
  std::string frame;
  if (!id.empty()) frame.append("id: ").append(id).append("\n");
  if (!event.empty()) frame.append("event: ").append(event).append("\n");
  while (true) {
    size_t nl = data.find('\n');
    frame.append("data: ").append(data.substr(0, nl)).append("\n");
    if (nl == std::string_view::npos) break;
    data.remove_prefix(nl + 1);
  }
  frame += "\n";
  return frame;
}

std::optional<std::string> VerifiedPeerIdentity(SSL* ssl) {
#if OPENSSL_VERSION_NUMBER >= 0x30000000L
  X509* peer = SSL_get1_peer_certificate(ssl);
#else
  X509* peer = SSL_get_peer_certificate(ssl);
#endif
  if (peer == nullptr) return std::nullopt;
  std::unique_ptr<X509, decltype(&X509_free)> cert(peer, X509_free);
  if (SSL_get_verify_result(ssl) != X509_V_OK) return std::nullopt;
  auto text_of = [](const ASN1_STRING* value) -> std::optional<std::string> {
    unsigned char* utf8 = nullptr;
    const int n = ASN1_STRING_to_UTF8(&utf8, value);
    if (n < 0) return std::nullopt;
    std::string text(reinterpret_cast<char*>(utf8), static_cast<size_t>(n));
    OPENSSL_free(utf8);
    // An embedded NUL could make "worker-1\0..." pass for "worker-1" in C string comparisons elsewhere.
    if (text.empty() || text.find('\0') != std::string::npos) return std::nullopt;
    return text;
  };
  X509_NAME* subject = X509_get_subject_name(cert.get());
  if (int index = X509_NAME_get_index_by_NID(subject, NID_commonName, -1); index >= 0) {
    return text_of(X509_NAME_ENTRY_get_data(X509_NAME_get_entry(subject, index)));
  }
  auto* names = static_cast<GENERAL_NAMES*>(X509_get_ext_d2i(cert.get(), NID_subject_alt_name, nullptr, nullptr));
  std::optional<std::string> identity;
  for (int i = 0; names != nullptr && i < sk_GENERAL_NAME_num(names) && !identity; ++i) {
    const GENERAL_NAME* name = sk_GENERAL_NAME_value(names, i);
    if (name->type == GEN_DNS) identity = text_of(name->d.dNSName);
  }
  GENERAL_NAMES_free(names);
  return identity;
}

void ServePlainConnection(std::shared_ptr<Server::State> state, tcp::socket socket, std::string remote,
                          std::unique_ptr<ConnectionSlot> slot) {
  asio::io_context& io = state->io;
  auto conn = std::make_shared<Connection<beast::tcp_stream>>(std::move(state), beast::tcp_stream(std::move(socket)),
                                                              std::move(remote));
  asio::co_spawn(io, RunAdmitted(std::move(conn), std::move(slot)), asio::detached);
}

void RefusePlainConnection(std::shared_ptr<Server::State> state, tcp::socket socket, Response refusal) {
  asio::io_context& io = state->io;
  asio::co_spawn(io, Refuse(std::move(state), beast::tcp_stream(std::move(socket)), std::move(refusal)),
                 asio::detached);
}

}  // namespace parsyn::http
