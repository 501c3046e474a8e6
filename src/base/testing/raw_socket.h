// Test support (header-only; for tests only): raw loopback connections, for requests a client library would not send
// (a header alone, a trickled body, bytes that are not HTTP).
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <string>

namespace parsyn::test_support {

// A blocking TCP connection to 127.0.0.1:port; its fd, or -1 when connecting failed.
inline int ConnectLoopback(uint16_t port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// Everything the peer sends until it closes (or the connection fails).
inline std::string ReadUntilClosed(int fd) {
  std::string received;
  char buf[4096];
  ssize_t n;
  while ((n = ::recv(fd, buf, sizeof buf, 0)) > 0) received.append(buf, static_cast<size_t>(n));
  return received;
}

}  // namespace parsyn::test_support
