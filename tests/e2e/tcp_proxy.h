// TcpProxy: a TCP forwarder on 127.0.0.1 in front of another local port, which a test can take down and bring back
// (a network outage of the service behind it, without losing that service's state), and whose links to single
// client processes it can break in the ways real networks do. Tests only.
//
// A link is every connection of one client process: at accept, the proxy finds which tracked process (Track(pid))
// owns the other end of the connection, from /proc/net/tcp and /proc/<pid>/fd. So one proxy in front of the
// coordinator, given as both a worker's --server and the server's --public-url (the signed blob URLs), carries all of
// that worker's traffic, and each worker's link can fail on its own. Faults of a link:
//   - Pause / PauseFor: nothing flows either way and nothing is reset (a dropped link: bytes in flight wait in the
//     kernel's buffers, and flow again when it resumes, unless an end gave up meanwhile). New connections are
//     accepted and held likewise.
//   - PauseMidRequest: a pause that arms itself when a request starting with a given line (e.g. "PUT /blobs/") has
//     carried some bytes upstream: the link drops in the middle of that request. With after_bytes 0 the request
//     is held whole (the server never sees it).
//   - Throttle: the client's uploads (client -> server) are limited to a byte rate, per connection.
//   - Cut: open connections are closed and new ones are closed as soon as they are accepted (a link gone for good;
//     Resume brings it back).
//   - Resume: every fault of the link is cleared.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace parsyn::e2e {

class TcpProxy {
 public:
  using Clock = std::chrono::steady_clock;

  // Listens on a free port of 127.0.0.1 and forwards each connection to 127.0.0.1:target_port.
  explicit TcpProxy(int target_port);
  ~TcpProxy();
  TcpProxy(const TcpProxy&) = delete;
  TcpProxy& operator=(const TcpProxy&) = delete;

  int port() const { return port_; }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  // Down: open connections are cut and new ones are closed as soon as they are accepted. Up: forwarding again.
  void SetDown(bool down) { down_ = down; }

  // Connections of `pid` belong to its link from now on (those it already has open too).
  void Track(pid_t pid);

  void Pause(pid_t pid) { PauseFor(pid, std::chrono::hours(24)); }
  void PauseFor(pid_t pid, std::chrono::milliseconds duration);
  void PauseMidRequest(pid_t pid, std::string request_prefix, uint64_t after_bytes, std::chrono::milliseconds duration);
  void Throttle(pid_t pid, uint64_t upload_bytes_per_second);
  void Cut(pid_t pid);
  void Resume(pid_t pid);

  // Whether a pause armed by PauseMidRequest has started, waiting up to `timeout` for it.
  bool WaitTriggered(pid_t pid, std::chrono::milliseconds timeout);
  // Bytes the link has carried upstream (client -> server) so far.
  uint64_t upstream_bytes(pid_t pid);

 private:
  struct Link {
    Clock::time_point paused_until{};
    uint64_t upload_rate = 0;  // bytes per second; 0: unlimited
    bool cut = false;
    // An armed PauseMidRequest.
    std::string trigger_prefix;
    uint64_t trigger_after_bytes = 0;
    std::chrono::milliseconds trigger_pause{0};
    bool trigger_counting = false;
    uint64_t trigger_seen = 0;
    bool triggered = false;
    uint64_t upstream_bytes = 0;
  };
  // What a pump may do now on its link.
  struct Verdict {
    bool close = false;
    bool paused = false;
    uint64_t upload_rate = 0;
  };

  void AcceptLoop();
  void Pump(int client, pid_t owner);
  pid_t OwnerOf(int client_fd);
  Verdict Check(pid_t owner);
  // Accounts `chunk` (just read upstream) to the link; true when the link must pause before forwarding it.
  bool NoteUpstream(pid_t owner, const char* chunk, size_t n);

  int target_port_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> down_{false};
  std::atomic<bool> stopping_{false};
  std::thread acceptor_;
  std::mutex mu_;  // guards pumps_, tracked_, links_
  std::condition_variable triggered_cv_;
  std::vector<std::thread> pumps_;
  std::set<pid_t> tracked_;
  std::atomic<uint64_t> tracked_generation_{0};  // bumped by Track
  std::map<pid_t, Link> links_;
};

}  // namespace parsyn::e2e
