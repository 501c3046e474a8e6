#include "storage/s3_moto_for_test.h"

#include <curl/curl.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <thread>
#include <vector>

#include "base/testing/free_port.h"

namespace parsyn::storage {
namespace {

namespace fs = std::filesystem;

std::optional<fs::path> FindOnPath(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::string dirs = path ? path : "";
  size_t start = 0;
  while (start <= dirs.size()) {
    size_t end = dirs.find(':', start);
    if (end == std::string::npos) end = dirs.size();
    fs::path candidate = fs::path(dirs.substr(start, end - start)) / name;
    if (end > start && ::access(candidate.c_str(), X_OK) == 0) return candidate;
    start = end + 1;
  }
  return std::nullopt;
}

size_t DiscardBody(char*, size_t size, size_t count, void*) { return size * count; }

// The HTTP status of a bodyless request, or 0 if nothing answered.
long HttpStatus(const std::string& method, const std::string& url) {
  CURL* curl = curl_easy_init();
  curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
  curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, method.c_str());
  if (method == "PUT") curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE, 0L);
  if (method == "PUT") curl_easy_setopt(curl, CURLOPT_POSTFIELDS, "");
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, DiscardBody);
  curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, 2000L);
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
  long status = 0;
  if (curl_easy_perform(curl) == CURLE_OK) curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &status);
  curl_easy_cleanup(curl);
  return status;
}

}  // namespace

std::optional<fs::path> FindMotoServer() {
  if (auto on_path = FindOnPath("moto_server")) return on_path;
  fs::path pyenv = "/root/.pyenv/shims/moto_server";
  if (::access(pyenv.c_str(), X_OK) == 0) return pyenv;
  return std::nullopt;
}

std::optional<fs::path> FindS3ReferencePython() {
  std::optional<fs::path> moto = FindMotoServer();
  if (!moto) return std::nullopt;
  fs::path python = moto->parent_path() / "python3";
  if (::access(python.c_str(), X_OK) != 0) return std::nullopt;
  return python;
}

StatusOr<std::string> RunAndCapture(const std::vector<std::string>& argv) {
  int out_pipe[2];
  int err_pipe[2];
  if (::pipe(out_pipe) != 0 || ::pipe(err_pipe) != 0) return InternalError("pipe() failed");
  pid_t pid = ::fork();
  if (pid < 0) return InternalError("fork() failed");
  if (pid == 0) {
    ::dup2(out_pipe[1], 1);
    ::dup2(err_pipe[1], 2);
    ::close(out_pipe[0]);
    ::close(err_pipe[0]);
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execv(args[0], args.data());
    ::_exit(127);
  }
  ::close(out_pipe[1]);
  ::close(err_pipe[1]);
  // stderr is small (a traceback at most); read it after stdout, which may be large.
  auto drain = [](int fd) {
    std::string text;
    char buf[65536];
    ssize_t n;
    while ((n = ::read(fd, buf, sizeof(buf))) > 0) text.append(buf, static_cast<size_t>(n));
    ::close(fd);
    return text;
  };
  std::string out = drain(out_pipe[0]);
  std::string err = drain(err_pipe[0]);
  int wstatus = 0;
  ::waitpid(pid, &wstatus, 0);
  if (!WIFEXITED(wstatus) || WEXITSTATUS(wstatus) != 0) {
    return InternalError(argv[0] + " failed (status " + std::to_string(wstatus) + "): " + err);
  }
  return out;
}

StatusOr<std::unique_ptr<MotoServer>> MotoServer::Start() {
  // The free port may be taken by someone else before moto binds it: then moto exits at once, and we try another.
  Status last = UnavailableError("not started");
  for (int attempt = 0; attempt < 3; ++attempt) {
    StatusOr<std::unique_ptr<MotoServer>> server = StartOnce();
    if (server.ok() || server.status().code() != StatusCode::kUnavailable) return server;
    last = server.status();
  }
  return last;
}

StatusOr<MotoServer*> SharedMotoServer() {
  static const StatusOr<std::unique_ptr<MotoServer>> server = MotoServer::Start();
  if (!server.ok()) return server.status();
  return server->get();
}

StatusOr<std::unique_ptr<MotoServer>> MotoServer::StartOnce() {
  std::optional<fs::path> moto = FindMotoServer();
  if (!moto) return FailedPreconditionError("moto_server is not installed");
  PARSYN_ASSIGN_OR_RETURN(int port, test_support::FreeLoopbackPort());
  pid_t pid = ::fork();
  if (pid < 0) return UnavailableError("fork() failed");
  if (pid == 0) {
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive a test that crashed
    int null_fd = ::open("/dev/null", O_RDWR);
    ::dup2(null_fd, 0);
    ::dup2(null_fd, 1);
    ::dup2(null_fd, 2);
    std::string port_text = std::to_string(port);
    ::execl(moto->c_str(), moto->c_str(), "-H", "127.0.0.1", "-p", port_text.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  ::setpgid(pid, pid);  // also from the parent, so Kill() works even if the child has not run yet
  std::unique_ptr<MotoServer> server(new MotoServer(pid, port));
  // Polls until it answers: the wait is bounded, and a server that exits is reported at once.
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (std::chrono::steady_clock::now() < deadline) {
    int wstatus = 0;
    if (::waitpid(pid, &wstatus, WNOHANG) == pid) {
      server->pid_ = -1;
      return UnavailableError("moto_server exited during startup (status " + std::to_string(wstatus) + ")");
    }
    if (HttpStatus("GET", server->endpoint() + "/") != 0) return server;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return DeadlineExceededError("moto_server did not answer on port " + std::to_string(port) + " within 60 s");
}

Status MotoServer::CreateBucket(const std::string& bucket) const {
  long status = HttpStatus("PUT", endpoint() + "/" + bucket);
  if (status != 200) return UnavailableError("creating bucket " + bucket + ": HTTP " + std::to_string(status));
  return Status::Ok();
}

void MotoServer::Kill() {
  if (pid_ <= 0) return;
  ::kill(-pid_, SIGKILL);
  ::waitpid(pid_, nullptr, 0);
  pid_ = -1;
}

MotoServer::~MotoServer() { Kill(); }

}  // namespace parsyn::storage
