// Test support (header-only; for tests and benchmarks, never for production code): a loopback TCP port to hand to a
// server under test.
//
// Contract: FreeLoopbackPort() binds an ephemeral port on 127.0.0.1, reads which one the kernel picked, and closes the
// socket again: nothing listens on the port when it returns, and it stays free only until someone else takes it, so
// a server started on it may find it taken (retry with another). Unavailable when no socket can be bound.
// Thread-safe.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/status.h"

namespace parsyn::test_support {

inline StatusOr<int> FreeLoopbackPort() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return UnavailableError("socket() failed");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    ::close(fd);
    return UnavailableError("could not bind a loopback port");
  }
  ::close(fd);
  return static_cast<int>(ntohs(addr.sin_port));
}

}  // namespace parsyn::test_support
