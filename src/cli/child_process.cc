#include "cli/child_process.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

extern char** environ;

namespace parsyn::cli {

StatusOr<ChildProcess> ChildProcess::Start(const std::filesystem::path& program, const std::vector<std::string>& args) {
  if (access(program.c_str(), X_OK) != 0) {
    return NotFoundError("cannot run " + program.string() + ": " + std::strerror(errno));
  }
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return InternalError(std::string("pipe: ") + std::strerror(errno));
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  // dup2 clears O_CLOEXEC on the child's stdout; both pipe ends themselves close on exec.
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
  std::vector<std::string> argv_strings = {program.string()};
  argv_strings.insert(argv_strings.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : argv_strings) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, program.c_str(), &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  close(fds[1]);
  if (rc != 0) {
    close(fds[0]);
    return InternalError("starting " + program.string() + ": " + std::strerror(rc));
  }
  return ChildProcess(pid, fdopen(fds[0], "r"));
}

ChildProcess::ChildProcess(ChildProcess&& other) noexcept : pid_(other.pid_), out_(other.out_), waited_(other.waited_) {
  other.pid_ = -1;
  other.out_ = nullptr;
}

ChildProcess::~ChildProcess() {
  if (out_) fclose(out_);
  if (pid_ > 0 && !waited_) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
}

std::optional<std::string> ChildProcess::ReadLine() {
  if (!out_) return std::nullopt;
  char* line = nullptr;
  size_t capacity = 0;
  ssize_t n;
  // A signal (Ctrl-C, forwarded to the child by the terminal) interrupts the read; keep reading what the child says.
  do {
    clearerr(out_);
    n = getline(&line, &capacity, out_);
  } while (n < 0 && errno == EINTR && !feof(out_));
  if (n < 0) {
    free(line);
    return std::nullopt;
  }
  std::string result(line, static_cast<size_t>(n));
  free(line);
  if (!result.empty() && result.back() == '\n') result.pop_back();
  return result;
}

int ChildProcess::Wait() {
  int status = 0;
  while (waitpid(pid_, &status, 0) < 0) {
    if (errno != EINTR) return -1;
  }
  waited_ = true;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

StatusOr<std::filesystem::path> SelfExecutablePath() {
  std::error_code ec;
  auto path = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return InternalError("cannot find this program's path: " + ec.message());
  return path;
}

StatusOr<std::filesystem::path> FindTrainer() {
  if (const char* env = std::getenv("PARSYN_TRAINER"); env && *env) return std::filesystem::path(env);
  PARSYN_ASSIGN_OR_RETURN(const std::filesystem::path self, SelfExecutablePath());
  const std::filesystem::path beside = self.parent_path() / "parsyn-trainer";
  if (std::filesystem::exists(beside)) return beside;
  return NotFoundError("parsyn-trainer not found beside " + self.string() +
                       " (build it with the trainer enabled, or set PARSYN_TRAINER to its path)");
}

}  // namespace parsyn::cli
