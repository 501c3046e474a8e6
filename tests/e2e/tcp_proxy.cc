#include "tcp_proxy.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace parsyn::e2e {
namespace {

namespace fs = std::filesystem;

// The inode of the socket whose local port is `local_port` and remote port `remote_port` (IPv4), from
// /proc/net/tcp; 0 if none.
unsigned long SocketInode(int local_port, int remote_port) {
  std::ifstream in("/proc/net/tcp");
  std::string line;
  std::getline(in, line);  // header
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string slot, local, remote, state, queues, timer, retransmits, uid, timeout;
    unsigned long inode = 0;
    fields >> slot >> local >> remote >> state >> queues >> timer >> retransmits >> uid >> timeout >> inode;
    auto port_of = [](const std::string& address) {
      const size_t colon = address.find(':');
      return colon == std::string::npos ? -1 : static_cast<int>(std::strtol(address.c_str() + colon + 1, nullptr, 16));
    };
    if (port_of(local) == local_port && port_of(remote) == remote_port) return inode;
  }
  return 0;
}

bool SendAll(int fd, const char* data, size_t n) {
  for (size_t done = 0; done < n;) {
    const ssize_t w = ::send(fd, data + done, n - done, MSG_NOSIGNAL);
    if (w <= 0) return false;
    done += static_cast<size_t>(w);
  }
  return true;
}

}  // namespace

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

void TcpProxy::Track(pid_t pid) {
  std::lock_guard lock(mu_);
  tracked_.insert(pid);
  tracked_generation_++;
}

void TcpProxy::PauseFor(pid_t pid, std::chrono::milliseconds duration) {
  std::lock_guard lock(mu_);
  links_[pid].paused_until = Clock::now() + duration;
}

void TcpProxy::PauseMidRequest(pid_t pid, std::string request_prefix, uint64_t after_bytes,
                               std::chrono::milliseconds duration) {
  std::lock_guard lock(mu_);
  Link& link = links_[pid];
  link.trigger_prefix = std::move(request_prefix);
  link.trigger_after_bytes = after_bytes;
  link.trigger_pause = duration;
  link.trigger_counting = false;
  link.trigger_seen = 0;
  link.triggered = false;
}

void TcpProxy::Throttle(pid_t pid, uint64_t upload_bytes_per_second) {
  std::lock_guard lock(mu_);
  links_[pid].upload_rate = upload_bytes_per_second;
}

void TcpProxy::Cut(pid_t pid) {
  std::lock_guard lock(mu_);
  links_[pid].cut = true;
}

void TcpProxy::Resume(pid_t pid) {
  std::lock_guard lock(mu_);
  Link& link = links_[pid];
  const uint64_t carried = link.upstream_bytes;
  const bool triggered = link.triggered;
  link = Link{};
  link.upstream_bytes = carried;
  link.triggered = triggered;
}

bool TcpProxy::WaitTriggered(pid_t pid, std::chrono::milliseconds timeout) {
  std::unique_lock lock(mu_);
  return triggered_cv_.wait_for(lock, timeout, [&] { return links_[pid].triggered; });
}

uint64_t TcpProxy::upstream_bytes(pid_t pid) {
  std::lock_guard lock(mu_);
  return links_[pid].upstream_bytes;
}

pid_t TcpProxy::OwnerOf(int client_fd) {
  sockaddr_in peer{};
  socklen_t len = sizeof(peer);
  if (::getpeername(client_fd, reinterpret_cast<sockaddr*>(&peer), &len) != 0) return 0;
  const unsigned long inode = SocketInode(ntohs(peer.sin_port), port_);
  if (inode == 0) return 0;
  const std::string wanted = "socket:[" + std::to_string(inode) + "]";
  std::set<pid_t> tracked;
  {
    std::lock_guard lock(mu_);
    tracked = tracked_;
  }
  for (pid_t pid : tracked) {
    std::error_code ec;
    for (const fs::directory_entry& fd : fs::directory_iterator("/proc/" + std::to_string(pid) + "/fd", ec)) {
      std::error_code link_ec;
      if (fs::read_symlink(fd.path(), link_ec).string() == wanted) return pid;
    }
  }
  return 0;
}

TcpProxy::Verdict TcpProxy::Check(pid_t owner) {
  Verdict v;
  if (owner == 0) return v;
  std::lock_guard lock(mu_);
  auto it = links_.find(owner);
  if (it == links_.end()) return v;
  v.close = it->second.cut;
  v.paused = Clock::now() < it->second.paused_until;
  v.upload_rate = it->second.upload_rate;
  return v;
}

bool TcpProxy::NoteUpstream(pid_t owner, const char* chunk, size_t n) {
  if (owner == 0) return false;
  std::lock_guard lock(mu_);
  Link& link = links_[owner];
  link.upstream_bytes += n;
  if (link.trigger_prefix.empty() || link.triggered) return false;
  if (!link.trigger_counting) {
    if (std::search(chunk, chunk + n, link.trigger_prefix.begin(), link.trigger_prefix.end()) == chunk + n) {
      return false;
    }
    link.trigger_counting = true;
    if (link.trigger_after_bytes == 0) {  // hold the request itself
      link.triggered = true;
      link.paused_until = Clock::now() + link.trigger_pause;
      triggered_cv_.notify_all();
      return true;
    }
  }
  link.trigger_seen += n;
  if (link.trigger_seen >= link.trigger_after_bytes) {  // this chunk goes through; the link drops after it
    link.triggered = true;
    link.paused_until = Clock::now() + link.trigger_pause;
    triggered_cv_.notify_all();
  }
  return false;
}

void TcpProxy::AcceptLoop() {
  while (!stopping_) {
    pollfd p{listen_fd_, POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    const int client = ::accept(listen_fd_, nullptr, nullptr);
    if (client < 0) continue;
    const pid_t owner = OwnerOf(client);
    if (down_ || Check(owner).close) {
      ::close(client);
      continue;
    }
    std::lock_guard lock(mu_);
    pumps_.emplace_back([this, client, owner] { Pump(client, owner); });
  }
}

void TcpProxy::Pump(int client, pid_t owner) {
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
  char buffer[16 * 1024];
  std::string held;  // an upstream chunk a pause caught before it was forwarded
  pollfd fds[2] = {{client, POLLIN, 0}, {upstream, POLLIN, 0}};
  // Polls in short slices so that faults, SetDown(true) and the destructor act promptly.
  uint64_t generation = tracked_generation_;
  while (!stopping_ && !down_) {
    // A connection opened before its process was tracked joins that process's link once it is.
    if (owner == 0 && generation != tracked_generation_) {
      generation = tracked_generation_;
      owner = OwnerOf(client);
    }
    const Verdict v = Check(owner);
    if (v.close) break;
    if (v.paused) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      continue;
    }
    if (!held.empty()) {
      if (!SendAll(upstream, held.data(), held.size())) break;
      held.clear();
    }
    if (::poll(fds, 2, 100) <= 0) continue;
    bool closed = false;
    for (int i = 0; i < 2 && !closed; ++i) {
      if ((fds[i].revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
      size_t cap = sizeof(buffer);
      // Throttled uploads move in slices of a tenth of a second's worth.
      if (i == 0 && v.upload_rate > 0) cap = std::clamp<size_t>(v.upload_rate / 10, 1, sizeof(buffer));
      const ssize_t n = ::read(fds[i].fd, buffer, cap);
      if (n <= 0) {
        closed = true;
        break;
      }
      if (i == 0 && NoteUpstream(owner, buffer, static_cast<size_t>(n))) {
        held.assign(buffer, static_cast<size_t>(n));
        break;
      }
      if (!SendAll(fds[1 - i].fd, buffer, static_cast<size_t>(n))) {
        closed = true;
        break;
      }
      if (i == 0 && v.upload_rate > 0) {
        std::this_thread::sleep_for(std::chrono::microseconds(static_cast<uint64_t>(n) * 1'000'000 / v.upload_rate));
      }
    }
    if (closed) break;
  }
  ::close(upstream);
  ::close(client);
}

}  // namespace parsyn::e2e
