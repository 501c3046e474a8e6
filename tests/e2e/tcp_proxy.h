// TcpProxy: a TCP forwarder on 127.0.0.1 in front of another local port, which a test can take down and bring back
// (a network outage of the service behind it, without losing that service's state). Tests only.
#pragma once

#include <atomic>
#include <mutex>
#include <thread>
#include <vector>

namespace parsyn::e2e {

class TcpProxy {
 public:
  // Listens on a free port of 127.0.0.1 and forwards each connection to 127.0.0.1:target_port.
  explicit TcpProxy(int target_port);
  ~TcpProxy();
  TcpProxy(const TcpProxy&) = delete;
  TcpProxy& operator=(const TcpProxy&) = delete;

  int port() const { return port_; }
  // Down: open connections are cut and new ones are closed as soon as they are accepted. Up: forwarding again.
  void SetDown(bool down) { down_ = down; }

 private:
  void AcceptLoop();
  void Pump(int client);

  int target_port_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> down_{false};
  std::atomic<bool> stopping_{false};
  std::thread acceptor_;
  std::mutex mu_;
  std::vector<std::thread> pumps_;
};

}  // namespace parsyn::e2e
