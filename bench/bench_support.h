// What the benchmarks share: failing loudly, small file and flag helpers, and the loopback transfer floor. Header-only;
// the fleet that drives a real `parsyn server` is fleet.h.
#pragma once

#include <arpa/inet.h>
#include <errno.h>  // program_invocation_short_name
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <span>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "base/status.h"

namespace parsyn::bench {

using Clock = std::chrono::steady_clock;

inline double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// Prints "<program>: <what>" and exits 1: a benchmark that cannot measure what it set out to has nothing to print.
[[noreturn]] inline void Die(const std::string& what) {
  std::fprintf(stderr, "%s: %s\n", program_invocation_short_name, what.c_str());
  std::exit(1);
}

template <typename T>
T Must(StatusOr<T> v, const std::string& what) {
  if (!v.ok()) Die(what + ": " + v.status().ToString());
  return std::move(*v);
}

inline void Check(const Status& status, const std::string& what) {
  if (!status.ok()) Die(what + ": " + status.ToString());
}

// The file's text without trailing newlines and spaces.
inline std::string ReadText(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  std::string s = ss.str();
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

// "5,100,5" -> {5, 100, 5}.
inline std::vector<int> ParseInts(const std::string& csv) {
  std::vector<int> out;
  std::stringstream ss(csv);
  for (std::string item; std::getline(ss, item, ',');) out.push_back(std::stoi(item));
  return out;
}

// The time to move `count` copies of `bytes` over loopback TCP on min(`lanes`, `count`) connections, each carrying
// its share back to back: a minimal sender/receiver pair, no HTTP, the receiver reading into a reused buffer. One
// reader thread per lane, not per copy (a copy per connection started 10,000 threads at N=10,000). This, one sha256
// pass and one plain read of a round's bytes are the floor the benchmarks compare a round with. Seconds.
inline double TimeLoopbackTransfer(std::span<const char> bytes, int count, int lanes) {
  lanes = std::clamp(lanes, 1, std::max(count, 1));
  const int listener = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (listener < 0 || ::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::listen(listener, 128) != 0 || ::getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    Die(std::string("loopback listener: ") + std::strerror(errno));
  }
  std::atomic<uint64_t> received{0};
  const auto start = Clock::now();
  {
    std::vector<std::jthread> threads;
    for (int lane = 0; lane < lanes; ++lane) {
      threads.emplace_back([&] {
        const int fd = ::accept(listener, nullptr, nullptr);
        if (fd < 0) Die(std::string("loopback accept: ") + std::strerror(errno));
        std::vector<char> buf(size_t{1} << 20);
        for (ssize_t n; (n = ::read(fd, buf.data(), buf.size())) > 0;) received += static_cast<uint64_t>(n);
        ::close(fd);
      });
      threads.emplace_back([&, lane] {
        const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
        if (fd < 0 || ::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0) {
          Die(std::string("loopback connect: ") + std::strerror(errno));
        }
        for (int i = lane; i < count; i += lanes) {
          for (size_t sent = 0; sent < bytes.size();) {
            const ssize_t n = ::write(fd, bytes.data() + sent, bytes.size() - sent);
            if (n <= 0) Die(std::string("loopback write: ") + std::strerror(errno));
            sent += static_cast<size_t>(n);
          }
        }
        ::close(fd);
      });
    }
  }
  const double seconds = Seconds(Clock::now() - start);
  ::close(listener);
  if (received != bytes.size() * static_cast<uint64_t>(count)) Die("loopback transfer lost bytes");
  return seconds;
}

}  // namespace parsyn::bench
