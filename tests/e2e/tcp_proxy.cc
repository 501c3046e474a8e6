#include "tcp_proxy.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>

namespace parsyn::e2e {

TcpProxy::TcpProxy(int target_port) : target_port_(target_port) {
  listen_fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
  int one = 1;
  ::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || ::listen(listen_fd_, 64) != 0) {
    std::abort();  // a test machine without loopback sockets is broken
  }
  socklen_t len = sizeof(addr);
  ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
  port_ = ntohs(addr.sin_port);
  acceptor_ = std::thread([this] { AcceptLoop(); });
}

TcpProxy::~TcpProxy() {
  stopping_ = true;
  acceptor_.join();
  ::close(listen_fd_);
  std::lock_guard lock(mu_);
  for (std::thread& t : pumps_) t.join();
}

void TcpProxy::AcceptLoop() {
  while (!stopping_) {
    pollfd p{listen_fd_, POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    const int client = ::accept(listen_fd_, nullptr, nullptr);
    if (client < 0) continue;
    if (down_) {
      ::close(client);
      continue;
    }
    std::lock_guard lock(mu_);
    pumps_.emplace_back([this, client] { Pump(client); });
  }
}

void TcpProxy::Pump(int client) {
  const int upstream = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(target_port_));
  if (::connect(upstream, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(upstream);
    ::close(client);
    return;
  }
  char buffer[64 * 1024];
  pollfd fds[2] = {{client, POLLIN, 0}, {upstream, POLLIN, 0}};
  // Polls in short slices so that SetDown(true) and the destructor cut the connection promptly.
  while (!stopping_ && !down_) {
    if (::poll(fds, 2, 100) <= 0) continue;
    bool closed = false;
    for (int i = 0; i < 2 && !closed; ++i) {
      if ((fds[i].revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
      const ssize_t n = ::read(fds[i].fd, buffer, sizeof(buffer));
      if (n <= 0) {
        closed = true;
        break;
      }
      for (ssize_t done = 0; done < n;) {
        const ssize_t w = ::send(fds[1 - i].fd, buffer + done, static_cast<size_t>(n - done), MSG_NOSIGNAL);
        if (w <= 0) {
          closed = true;
          break;
        }
        done += w;
      }
    }
    if (closed) break;
  }
  ::close(upstream);
  ::close(client);
}

}  // namespace parsyn::e2e
