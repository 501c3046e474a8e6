#include "base/subprocess.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

extern char** environ;

namespace parsyn {

struct Subprocess::State {
  pid_t pid = -1;
  std::FILE* out = nullptr;
  std::mutex mutex;     // guards `reaped` against signals sent while Wait reaps
  bool reaped = false;  // once true, `pid` may belong to another process
  int exit_code = -1;
};

namespace {

// This process's environment with `overrides` set on top.
std::vector<std::string> ChildEnvironment(const std::vector<std::pair<std::string, std::string>>& overrides) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string_view entry(*e);
    const std::string_view name = entry.substr(0, entry.find('='));
    bool replaced = false;
    for (const auto& [key, value] : overrides) replaced = replaced || key == name;
    if (!replaced) env.emplace_back(entry);
  }
  for (const auto& [key, value] : overrides) env.push_back(key + "=" + value);
  return env;
}

std::vector<char*> NullTerminated(std::vector<std::string>& strings) {
  std::vector<char*> pointers;
  for (std::string& s : strings) pointers.push_back(s.data());
  pointers.push_back(nullptr);
  return pointers;
}

}  // namespace

StatusOr<Subprocess> Subprocess::Start(const std::filesystem::path& program, const std::vector<std::string>& args,
                                       const SubprocessOptions& options) {
  if (::access(program.c_str(), X_OK) != 0) {
    return NotFoundError("cannot run " + program.string() + ": " + std::strerror(errno));
  }
  int fds[2] = {-1, -1};
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  switch (options.output) {
    case SubprocessOptions::Output::kPipe:
      if (::pipe2(fds, O_CLOEXEC) != 0) {
        posix_spawn_file_actions_destroy(&actions);
        return InternalError(std::string("pipe: ") + std::strerror(errno));
      }
      // dup2 clears O_CLOEXEC on the child's stdout; both pipe ends themselves close on exec.
      posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
      break;
    case SubprocessOptions::Output::kFile:
      posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, options.output_file.c_str(),
                                       O_WRONLY | O_CREAT | O_TRUNC, 0644);
      posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
      break;
    case SubprocessOptions::Output::kInherit: break;
  }
  if (options.stdin_fd >= 0) posix_spawn_file_actions_adddup2(&actions, options.stdin_fd, STDIN_FILENO);
  std::vector<std::string> argv_strings = {program.string()};
  argv_strings.insert(argv_strings.end(), args.begin(), args.end());
  std::vector<char*> argv = NullTerminated(argv_strings);
  std::vector<std::string> env_strings;
  std::vector<char*> envp;
  std::vector<std::pair<std::string, std::string>> environment = options.environment;
  if (options.die_with_parent) environment.emplace_back(kDieWithParentEnv, std::to_string(::getpid()));
  if (!environment.empty()) {
    env_strings = ChildEnvironment(environment);
    envp = NullTerminated(env_strings);
  }
  // The child gets stdin, stdout and stderr only. Sockets are opened without close-on-exec (Boost.Asio's, the
  // coordinator's listening one and its connections among them): a managed worker holding them would keep a
  // connection its coordinator closed (or that died with it) open to its client, which then waits on it in vain.
#if defined(__GLIBC__) && __GLIBC_PREREQ(2, 34)
  posix_spawn_file_actions_addclosefrom_np(&actions, STDERR_FILENO + 1);
#else
#error "Subprocess needs posix_spawn_file_actions_addclosefrom_np (glibc 2.34 or later)"
#endif
  pid_t pid = -1;
  const int rc =
      posix_spawn(&pid, program.c_str(), &actions, nullptr, argv.data(), envp.empty() ? environ : envp.data());
  posix_spawn_file_actions_destroy(&actions);
  if (fds[1] >= 0) ::close(fds[1]);
  if (rc != 0) {
    if (fds[0] >= 0) ::close(fds[0]);
    return InternalError("starting " + program.string() + ": " + std::strerror(rc));
  }
  auto state = std::make_unique<State>();
  state->pid = pid;
  if (fds[0] >= 0) state->out = ::fdopen(fds[0], "r");
  return Subprocess(std::move(state));
}

void DieWithParentIfAsked() {
  const char* value = std::getenv(kDieWithParentEnv);
  if (value == nullptr) return;
  const long expected_parent = std::strtol(value, nullptr, 10);
  ::unsetenv(kDieWithParentEnv);
#ifdef __linux__
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
#endif
  // The parent may have died between the spawn and the prctl: this process was then reparented already.
  if (static_cast<long>(::getppid()) != expected_parent) ::raise(SIGKILL);
}

Subprocess::Subprocess(std::unique_ptr<State> state) : state_(std::move(state)) {}

Subprocess::Subprocess(Subprocess&& other) noexcept = default;

Subprocess::~Subprocess() {
  if (!state_) return;
  if (state_->out) std::fclose(state_->out);
  if (!state_->reaped) {
    ::kill(state_->pid, SIGKILL);
    while (::waitpid(state_->pid, nullptr, 0) < 0 && errno == EINTR) {
    }
  }
}

std::optional<std::string> Subprocess::ReadLine() { return ReadOutputLine(state_->out); }

std::optional<std::string> ReadOutputLine(std::FILE* out) {
  if (!out) return std::nullopt;
  char* line = nullptr;
  size_t capacity = 0;
  ssize_t n;
  // A signal (Ctrl-C, forwarded to the child by the terminal) interrupts the read; keep reading what the child says.
  do {
    clearerr(out);
    n = getline(&line, &capacity, out);
  } while (n < 0 && errno == EINTR && !feof(out));
  if (n < 0) {
    free(line);
    return std::nullopt;
  }
  std::string result(line, static_cast<size_t>(n));
  free(line);
  if (!result.empty() && result.back() == '\n') result.pop_back();
  return result;
}

void Subprocess::Signal(int signal) {
  std::lock_guard lock(state_->mutex);
  if (!state_->reaped) ::kill(state_->pid, signal);
}

void Subprocess::Terminate() { Signal(SIGTERM); }

void Subprocess::Kill() { Signal(SIGKILL); }

bool Subprocess::HasExited() {
  std::lock_guard lock(state_->mutex);
  if (state_->reaped) return true;
  siginfo_t info{};
  return ::waitid(P_PID, static_cast<id_t>(state_->pid), &info, WEXITED | WNOHANG | WNOWAIT) == 0 && info.si_pid != 0;
}

int Subprocess::Wait() {
  // Wait for the exit without reaping (signals may still be sent meanwhile: the pid cannot be reused yet), then
  // reap under the lock that Signal takes.
  siginfo_t info{};
  while (::waitid(P_PID, static_cast<id_t>(state_->pid), &info, WEXITED | WNOWAIT) < 0 && errno == EINTR) {
  }
  std::lock_guard lock(state_->mutex);
  if (state_->reaped) return state_->exit_code;
  int status = 0;
  while (::waitpid(state_->pid, &status, 0) < 0) {
    if (errno != EINTR) return -1;
  }
  state_->reaped = true;
  state_->exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return state_->exit_code;
}

pid_t Subprocess::pid() const { return state_->pid; }

StatusOr<std::filesystem::path> SelfExecutablePath() {
  std::error_code ec;
  auto path = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return InternalError("cannot find this program's path: " + ec.message());
  return path;
}

}  // namespace parsyn
