#include "base/subprocess.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>

#include "base/testing/temp_dir.h"

namespace parsyn {
namespace {

constexpr char kRoleEnv[] = "PARSYN_SUBPROCESS_TEST_ROLE";

// This test binary re-run in a role, before gtest starts: "parent" spawns "child" with die_with_parent, prints the
// child's pid and waits to be killed; "child" calls DieWithParentIfAsked and sleeps (as parsyn-trainer trains).
[[maybe_unused]] const bool kRoleRun = [] {
  const char* role = std::getenv(kRoleEnv);
  if (role == nullptr) return false;
  if (std::string_view(role) == "child") {
    DieWithParentIfAsked();
    std::this_thread::sleep_for(std::chrono::minutes(2));
    std::_Exit(0);
  }
  SubprocessOptions options;
  options.output = SubprocessOptions::Output::kInherit;
  options.die_with_parent = true;
  options.environment = {{kRoleEnv, "child"}};
  StatusOr<Subprocess> child = Subprocess::Start(*SelfExecutablePath(), {}, options);
  if (!child.ok()) std::_Exit(3);
  std::printf("%d\n", static_cast<int>(child->pid()));
  std::fflush(stdout);
  std::this_thread::sleep_for(std::chrono::minutes(2));
  std::_Exit(0);
}();

// True while `pid` exists and is not a zombie.
bool Alive(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return false;
  const size_t paren = line.rfind(')');
  return paren != std::string::npos && paren + 2 < line.size() && line[paren + 2] != 'Z';
}

TEST(SubprocessTest, DieWithParentChildDiesWhenItsParentIsKilled) {
  SubprocessOptions options;
  options.environment = {{kRoleEnv, "parent"}};
  StatusOr<Subprocess> parent = Subprocess::Start(*SelfExecutablePath(), {}, options);
  ASSERT_TRUE(parent.ok()) << parent.status().ToString();
  const std::optional<std::string> line = parent->ReadLine();
  ASSERT_TRUE(line.has_value());
  const pid_t child = static_cast<pid_t>(std::stol(*line));
  ASSERT_TRUE(Alive(child));
  parent->Kill();
  parent->Wait();
  // Bounded wait: the kernel kills the child at once, its new parent reaps it when it gets to it.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (Alive(child) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const bool survived = Alive(child);
  if (survived) ::kill(child, SIGKILL);
  EXPECT_FALSE(survived) << "the child outlived its SIGKILLed parent";
}

TEST(SubprocessTest, ReadsStdoutLinesAndTheExitCode) {
  StatusOr<Subprocess> child = Subprocess::Start("/bin/sh", {"-c", "echo one; echo two; exit 7"});
  ASSERT_TRUE(child.ok()) << child.status().ToString();
  EXPECT_EQ(child->ReadLine(), "one");
  EXPECT_EQ(child->ReadLine(), "two");
  EXPECT_EQ(child->ReadLine(), std::nullopt);
  EXPECT_EQ(child->Wait(), 7);
  EXPECT_TRUE(child->HasExited());
  child->Terminate();  // after reaping: nothing to signal, no harm done
}

TEST(SubprocessTest, SignalEndingTheChildIs128PlusItsNumber) {
  StatusOr<Subprocess> child = Subprocess::Start("/bin/sh", {"-c", "echo ready; exec sleep 30"});
  ASSERT_TRUE(child.ok()) << child.status().ToString();
  ASSERT_EQ(child->ReadLine(), "ready");
  EXPECT_FALSE(child->HasExited());
  std::thread terminator([&] { child->Terminate(); });  // from another thread while Wait blocks
  EXPECT_EQ(child->Wait(), 128 + SIGTERM);
  terminator.join();
}

TEST(SubprocessTest, EnvironmentIsAddedToOurs) {
  SubprocessOptions options;
  options.environment = {{"PARSYN_SUBPROCESS_TEST", "set"}, {"HOME", "/nowhere"}};
  StatusOr<Subprocess> child =
      Subprocess::Start("/bin/sh", {"-c", "echo $PARSYN_SUBPROCESS_TEST $HOME ${PATH:+path}"}, options);
  ASSERT_TRUE(child.ok()) << child.status().ToString();
  EXPECT_EQ(child->ReadLine(), "set /nowhere path");
  EXPECT_EQ(child->Wait(), 0);
}

TEST(SubprocessTest, StdinFdBecomesTheChildsStdin) {
  int fds[2];
  ASSERT_EQ(::pipe2(fds, O_CLOEXEC), 0);
  SubprocessOptions options;
  options.stdin_fd = fds[0];
  StatusOr<Subprocess> child = Subprocess::Start("/bin/sh", {"-c", "read line; echo got $line"}, options);
  ::close(fds[0]);
  ASSERT_TRUE(child.ok()) << child.status().ToString();
  ASSERT_EQ(::write(fds[1], "hello\n", 6), 6);
  ::close(fds[1]);
  EXPECT_EQ(child->ReadLine(), "got hello");
  EXPECT_EQ(child->Wait(), 0);
}

TEST(SubprocessTest, OutputFileTakesStdoutAndStderr) {
  test_support::TempDir dir("parsyn-subprocess-test");
  SubprocessOptions options;
  options.output = SubprocessOptions::Output::kFile;
  options.output_file = dir.path() / "log";
  StatusOr<Subprocess> child = Subprocess::Start("/bin/sh", {"-c", "echo out; echo err >&2"}, options);
  ASSERT_TRUE(child.ok()) << child.status().ToString();
  EXPECT_EQ(child->ReadLine(), std::nullopt);  // no pipe
  EXPECT_EQ(child->Wait(), 0);
  std::stringstream log;
  log << std::ifstream(options.output_file).rdbuf();
  EXPECT_EQ(log.str(), "out\nerr\n");
}

TEST(SubprocessTest, MissingProgramIsNotFound) {
  EXPECT_EQ(Subprocess::Start("/nonexistent/program", {}).status().code(), StatusCode::kNotFound);
}

TEST(SubprocessTest, DestructionKillsAChildNotWaitedFor) {
  pid_t pid = -1;
  {
    StatusOr<Subprocess> child = Subprocess::Start("/bin/sleep", {"30"});
    ASSERT_TRUE(child.ok()) << child.status().ToString();
    pid = child->pid();
  }
  EXPECT_NE(::kill(pid, 0), 0);  // gone and reaped
}

// A child holds none of its parent's descriptors beyond stdin, stdout and stderr, though sockets (Boost.Asio's, as
// the coordinator's) are opened without close-on-exec. Otherwise a managed worker holds its coordinator's listening
// socket and connections: a connection the coordinator closes (or that died with it) stays open to its client, whose
// next request on it waits for an answer that never comes.
TEST(SubprocessTest, AChildHoldsNoneOfItsParentsSockets) {
  const int listener = ::socket(AF_INET, SOCK_STREAM, 0);  // no SOCK_CLOEXEC, as Asio opens them
  ASSERT_GE(listener, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(address);
  ASSERT_EQ(::bind(listener, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  ASSERT_EQ(::listen(listener, 4), 0);
  ASSERT_EQ(::getsockname(listener, reinterpret_cast<sockaddr*>(&address), &length), 0);
  const int client = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_EQ(::connect(client, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  const int served = ::accept(listener, nullptr, nullptr);  // no close-on-exec either
  ASSERT_GE(served, 0);

  StatusOr<Subprocess> child = Subprocess::Start("/bin/sleep", {"30"});
  ASSERT_TRUE(child.ok()) << child.status().ToString();
  ::close(served);  // the server ends the connection: its client must see that at once
  pollfd ready{.fd = client, .events = POLLIN, .revents = 0};
  ASSERT_EQ(::poll(&ready, 1, 5000), 1) << "the client saw no end of the connection: the child holds it";
  char byte;
  EXPECT_EQ(::recv(client, &byte, 1, 0), 0);
  // Nor does the child hold the listening socket: once the parent closes it, the port refuses connections.
  ::close(listener);
  const int late = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  EXPECT_NE(::connect(late, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0)
      << "a connection was queued on a listening socket the child kept";
  ::close(late);
  ::close(client);
}

}  // namespace
}  // namespace parsyn
