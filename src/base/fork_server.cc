#include "base/fork_server.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <map>

namespace parsyn {
namespace {

// A request is at most this long: argv's strings, each ending in '\0'.
constexpr size_t kMaxRequestBytes = 64 << 10;

// What the server sends on a run's channel: the run's pid (kPid), its exit status (kExit), or the errno of a fork
// that failed (kForkFailed). The client sends a bare int32 signal number.
struct Reply {
  int32_t kind = 0;
  int32_t value = 0;
};
constexpr int32_t kPid = 1;
constexpr int32_t kExit = 2;
constexpr int32_t kForkFailed = 3;

bool SendReply(int channel, int32_t kind, int32_t value) {
  const Reply reply{kind, value};
  return ::send(channel, &reply, sizeof reply, MSG_NOSIGNAL) == static_cast<ssize_t>(sizeof reply);
}

struct Request {
  std::vector<std::string> argv;
  int channel = -1;  // the run's channel (the server's end)
  int out = -1;      // the write end of the run's stdout pipe
};

enum class Received { kRequest, kClosed, kMalformed };

// Reads one request from the control channel. kClosed when the client closed it (or it failed); kMalformed when the
// message was not argv with two descriptors (their descriptors closed).
Received ReceiveRequest(int control_fd, Request& request) {
  std::vector<char> payload(kMaxRequestBytes);
  iovec iov{payload.data(), payload.size()};
  alignas(cmsghdr) char control[CMSG_SPACE(2 * sizeof(int))];
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  ssize_t n;
  do {
    n = ::recvmsg(control_fd, &msg, MSG_CMSG_CLOEXEC);
  } while (n < 0 && errno == EINTR);
  if (n <= 0) return Received::kClosed;
  std::vector<int> fds;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int fd;
      std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
      fds.push_back(fd);
    }
  }
  const bool whole = (msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) == 0 && payload[static_cast<size_t>(n) - 1] == '\0';
  if (!whole || fds.size() != 2) {
    for (int fd : fds) ::close(fd);
    return Received::kMalformed;
  }
  request.argv.clear();
  for (size_t at = 0; at < static_cast<size_t>(n);) {
    request.argv.emplace_back(payload.data() + at);
    at += request.argv.back().size() + 1;
  }
  request.channel = fds[0];
  request.out = fds[1];
  return Received::kRequest;
}

// The server's state: the runs not yet reaped, by pid, with their channels (-1 once the client closed one).
struct Server {
  int control_fd = -1;
  int signal_fd = -1;
  std::map<pid_t, int> runs;
  sigset_t child_mask{};  // the caller's signal mask and dispositions, restored in each child
  struct sigaction child_int {};
  struct sigaction child_term {};
  struct sigaction child_pipe {};
};

// In the forked child: becomes the run (never returns).
[[noreturn]] void BecomeRun(const Server& server, pid_t server_pid, const Request& request,
                            const std::function<int(const std::vector<std::string>&)>& run) {
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != server_pid) ::raise(SIGKILL);  // the server died before the prctl
  ::close(server.control_fd);
  ::close(server.signal_fd);
  for (const auto& [pid, channel] : server.runs) {
    if (channel >= 0) ::close(channel);
  }
  ::close(request.channel);
  ::dup2(request.out, STDOUT_FILENO);
  ::close(request.out);
  if (const int null = ::open("/dev/null", O_RDONLY); null >= 0) {
    ::dup2(null, STDIN_FILENO);
    ::close(null);
  }
  ::sigaction(SIGINT, &server.child_int, nullptr);
  ::sigaction(SIGTERM, &server.child_term, nullptr);
  ::sigaction(SIGPIPE, &server.child_pipe, nullptr);
  ::pthread_sigmask(SIG_SETMASK, &server.child_mask, nullptr);
  const int code = run(request.argv);
  // Buffered output flushed, but no exit handlers or static destructors: libtorch's unregister every operator, which
  // in a forked copy also copies each page they write (they were most of a forked trainer run's CPU).
  std::fflush(nullptr);
  ::_exit(code);
}

void StartRun(Server& server, Request& request, const std::function<int(const std::vector<std::string>&)>& run) {
  const pid_t server_pid = ::getpid();
  const pid_t pid = ::fork();
  if (pid == 0) BecomeRun(server, server_pid, request, run);
  ::close(request.out);
  if (pid < 0) {
    SendReply(request.channel, kForkFailed, errno);
    ::close(request.channel);
    return;
  }
  SendReply(request.channel, kPid, pid);
  server.runs[pid] = request.channel;
}

// Reaps every run that exited and sends each its status.
void ReapRuns(Server& server) {
  signalfd_siginfo info;
  while (::read(server.signal_fd, &info, sizeof info) > 0) {
  }
  int status = 0;
  pid_t pid;
  while ((pid = ::waitpid(-1, &status, WNOHANG)) > 0) {
    const auto it = server.runs.find(pid);
    if (it == server.runs.end()) continue;
    if (it->second >= 0) {
      SendReply(it->second, kExit, WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
      ::close(it->second);
    }
    server.runs.erase(it);
  }
}

// A run's channel is readable: a signal to deliver, or the client closed it (then the run is killed).
void ServeRunChannel(pid_t pid, int& channel) {
  int32_t signal = 0;
  const ssize_t n = ::recv(channel, &signal, sizeof signal, MSG_DONTWAIT);
  if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
  if (n == static_cast<ssize_t>(sizeof signal)) {
    if (signal > 0 && signal < NSIG) ::kill(pid, signal);
    return;
  }
  ::kill(pid, SIGKILL);
  ::close(channel);
  channel = -1;
}

Status SetUpServer(Server& server) {
  sigset_t child;
  sigemptyset(&child);
  sigaddset(&child, SIGCHLD);
  if (::pthread_sigmask(SIG_BLOCK, &child, &server.child_mask) != 0) return InternalError("blocking SIGCHLD");
  server.signal_fd = ::signalfd(-1, &child, SFD_CLOEXEC | SFD_NONBLOCK);
  if (server.signal_fd < 0) return InternalError(std::string("signalfd: ") + std::strerror(errno));
  // Ctrl-C reaches the whole process group: the runs stop on it, as trainers do; the server stays to report them.
  struct sigaction ignore {};
  ignore.sa_handler = SIG_IGN;
  sigemptyset(&ignore.sa_mask);
  ::sigaction(SIGINT, &ignore, &server.child_int);
  ::sigaction(SIGTERM, &ignore, &server.child_term);
  ::sigaction(SIGPIPE, &ignore, &server.child_pipe);
  return Status::Ok();
}

}  // namespace

int ServeForks(int control_fd, const std::function<int(const std::vector<std::string>& argv)>& run) {
  Server server;
  server.control_fd = control_fd;
  if (Status set_up = SetUpServer(server); !set_up.ok()) {
    std::cerr << "fork server: " << set_up.message() << std::endl;
    return 1;
  }
  for (bool open = true; open;) {
    std::vector<pollfd> polled = {{control_fd, POLLIN, 0}, {server.signal_fd, POLLIN, 0}};
    std::vector<pid_t> polled_runs;
    for (const auto& [pid, channel] : server.runs) {
      if (channel < 0) continue;
      polled.push_back({channel, POLLIN, 0});
      polled_runs.push_back(pid);
    }
    if (::poll(polled.data(), polled.size(), -1) < 0) continue;  // EINTR
    if (polled[1].revents != 0) ReapRuns(server);
    for (size_t i = 0; i < polled_runs.size(); ++i) {
      const auto it = server.runs.find(polled_runs[i]);
      if (polled[i + 2].revents != 0 && it != server.runs.end() && it->second >= 0) {
        ServeRunChannel(it->first, it->second);
      }
    }
    if (polled[0].revents == 0) continue;
    Request request;
    const Received received = ReceiveRequest(control_fd, request);
    if (received == Received::kClosed) open = false;
    if (received == Received::kRequest) StartRun(server, request, run);
  }
  for (const auto& [pid, channel] : server.runs) ::kill(pid, SIGKILL);
  for (const auto& [pid, channel] : server.runs) {
    while (::waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
    }
    if (channel >= 0) ::close(channel);
  }
  return 0;
}

struct ForkedProcess::State {
  pid_t pid = -1;
  int channel = -1;
  std::FILE* out = nullptr;
  std::mutex mutex;     // guards `exited` against signals sent while Wait reads the exit
  bool exited = false;  // once true, the server has reaped the run
  int exit_code = -1;
};

ForkedProcess::ForkedProcess(std::unique_ptr<State> state) : state_(std::move(state)) {}

ForkedProcess::ForkedProcess(ForkedProcess&& other) noexcept = default;

ForkedProcess::~ForkedProcess() {
  if (!state_) return;
  if (state_->out) std::fclose(state_->out);
  ::close(state_->channel);
}

std::optional<std::string> ForkedProcess::ReadLine() { return ReadOutputLine(state_->out); }

void ForkedProcess::Signal(int signal) {
  std::lock_guard lock(state_->mutex);
  const int32_t number = signal;
  if (!state_->exited) ::send(state_->channel, &number, sizeof number, MSG_NOSIGNAL);
}

void ForkedProcess::Terminate() { Signal(SIGTERM); }

void ForkedProcess::Kill() { Signal(SIGKILL); }

int ForkedProcess::Wait() {
  {
    std::lock_guard lock(state_->mutex);
    if (state_->exited) return state_->exit_code;
  }
  Reply reply;
  ssize_t n;
  do {
    n = ::recv(state_->channel, &reply, sizeof reply, 0);
  } while (n < 0 && errno == EINTR);
  std::lock_guard lock(state_->mutex);
  state_->exited = true;
  const bool reported = n == static_cast<ssize_t>(sizeof reply) && reply.kind == kExit;
  state_->exit_code = reported ? reply.value : 128 + SIGKILL;  // else the server died, and the run with it
  return state_->exit_code;
}

pid_t ForkedProcess::pid() const { return state_->pid; }

StatusOr<std::unique_ptr<ForkServer>> ForkServer::Start(const std::filesystem::path& program,
                                                        const std::vector<std::string>& server_args) {
  int fds[2] = {-1, -1};
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, fds) != 0) {
    return InternalError(std::string("socketpair: ") + std::strerror(errno));
  }
  SubprocessOptions options;
  options.output = SubprocessOptions::Output::kInherit;
  options.die_with_parent = true;
  options.stdin_fd = fds[1];
  StatusOr<Subprocess> server = Subprocess::Start(program, server_args, options);
  ::close(fds[1]);
  if (!server.ok()) {
    ::close(fds[0]);
    return server.status();
  }
  return std::unique_ptr<ForkServer>(new ForkServer(fds[0], std::move(*server)));
}

std::unique_ptr<ForkServer> ForkServer::Connect(int control_fd) {
  return std::unique_ptr<ForkServer>(new ForkServer(control_fd, std::nullopt));
}

ForkServer::ForkServer(int control_fd, std::optional<Subprocess> server)
    : control_fd_(control_fd), server_(std::move(server)) {}

ForkServer::~ForkServer() {
  ::close(control_fd_);  // the server kills its runs and exits; a server this started is killed and reaped below
}

namespace {

// Sends a request (`payload`: argv's strings, each ending in '\0') with the run's channel and stdout write end.
// False when the server is gone.
bool SendRequest(int control_fd, std::string& payload, int channel, int out) {
  iovec iov{payload.data(), payload.size()};
  alignas(cmsghdr) char control[CMSG_SPACE(2 * sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(2 * sizeof(int));
  const int fds[2] = {channel, out};
  std::memcpy(CMSG_DATA(c), fds, sizeof fds);
  ssize_t n;
  do {
    n = ::sendmsg(control_fd, &msg, MSG_NOSIGNAL);
  } while (n < 0 && errno == EINTR);
  return n == static_cast<ssize_t>(payload.size());
}

}  // namespace

StatusOr<ForkedProcess> ForkServer::Fork(const std::vector<std::string>& argv) {
  if (argv.empty()) return InvalidArgumentError("a forked run needs an argv[0]");
  std::string payload;
  for (const std::string& arg : argv) payload.append(arg).push_back('\0');
  if (payload.size() > kMaxRequestBytes) return InvalidArgumentError("a forked run's argv is over 64 KiB");
  int channel[2] = {-1, -1};
  int out[2] = {-1, -1};
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, channel) != 0 || ::pipe2(out, O_CLOEXEC) != 0) {
    const std::string why = std::strerror(errno);
    for (int fd : {channel[0], channel[1], out[0], out[1]}) {
      if (fd >= 0) ::close(fd);
    }
    return InternalError("making a forked run's descriptors: " + why);
  }
  bool sent;
  {
    std::lock_guard lock(mutex_);
    sent = SendRequest(control_fd_, payload, channel[1], out[1]);
  }
  ::close(channel[1]);
  ::close(out[1]);
  Reply reply;
  ssize_t n = -1;
  if (sent) {
    do {
      n = ::recv(channel[0], &reply, sizeof reply, 0);
    } while (n < 0 && errno == EINTR);
  }
  if (n != static_cast<ssize_t>(sizeof reply) || reply.kind != kPid) {
    ::close(channel[0]);
    ::close(out[0]);
    if (n == static_cast<ssize_t>(sizeof reply) && reply.kind == kForkFailed) {
      return UnavailableError(std::string("the fork server could not fork: ") + std::strerror(reply.value));
    }
    return UnavailableError("the fork server is gone (it exited or refused the request)");
  }
  auto state = std::make_unique<ForkedProcess::State>();
  state->pid = reply.value;
  state->channel = channel[0];
  state->out = ::fdopen(out[0], "r");
  return ForkedProcess(std::move(state));
}

}  // namespace parsyn
