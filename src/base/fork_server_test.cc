#include "base/fork_server.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

namespace parsyn {
namespace {

// A server in a child of this test process, serving `run`, and a client on its control channel.
struct TestServer {
  pid_t pid = -1;
  std::unique_ptr<ForkServer> client;
};

TestServer StartTestServer(const std::function<int(const std::vector<std::string>&)>& run) {
  int fds[2];
  EXPECT_EQ(::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, fds), 0);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[0]);
    ::_exit(ServeForks(fds[1], run));
  }
  ::close(fds[1]);
  return {pid, ForkServer::Connect(fds[0])};
}

bool Gone(pid_t pid) { return ::kill(pid, 0) != 0 && errno == ESRCH; }

// Whether `done` holds within 10 s.
bool Eventually(const std::function<bool()>& done) {
  for (int i = 0; i < 1000; ++i) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return done();
}

// Prints its argv, one per line, then how stdin answers, and exits with the number of arguments.
int EchoRun(const std::vector<std::string>& argv) {
  for (const std::string& arg : argv) std::cout << "[" << arg << "]\n";
  std::cout << (std::getchar() == EOF ? "stdin at its end" : "stdin had data") << "\n";
  return static_cast<int>(argv.size());
}

// Prints its pid, then waits for signals forever.
int WaitingRun(const std::vector<std::string>&) {
  std::cout << ::getpid() << std::endl;
  for (;;) ::pause();
}

TEST(ForkServerTest, EachRunGetsItsArgvItsOwnStdoutAndReturnsItsExitCode) {
  TestServer server = StartTestServer(EchoRun);
  StatusOr<ForkedProcess> first = server.client->Fork({"prog", "two words", ""});
  StatusOr<ForkedProcess> second = server.client->Fork({"prog", "x"});
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  EXPECT_NE(first->pid(), second->pid());
  EXPECT_EQ(second->ReadLine(), "[prog]");
  EXPECT_EQ(second->ReadLine(), "[x]");
  EXPECT_EQ(second->ReadLine(), "stdin at its end");
  EXPECT_EQ(second->ReadLine(), std::nullopt);
  EXPECT_EQ(second->Wait(), 2);
  EXPECT_EQ(first->ReadLine(), "[prog]");
  EXPECT_EQ(first->ReadLine(), "[two words]");
  EXPECT_EQ(first->ReadLine(), "[]");
  EXPECT_EQ(first->ReadLine(), "stdin at its end");
  EXPECT_EQ(first->Wait(), 3);
  EXPECT_EQ(first->Wait(), 3);  // a second Wait answers the same
}

TEST(ForkServerTest, SignalsReachTheRunWithTheirDefaultActionsThoughTheServerIgnoresThem) {
  TestServer server = StartTestServer(WaitingRun);
  StatusOr<ForkedProcess> terminated = server.client->Fork({"prog"});
  StatusOr<ForkedProcess> killed = server.client->Fork({"prog"});
  ASSERT_TRUE(terminated.ok() && killed.ok());
  ASSERT_EQ(terminated->ReadLine(), std::to_string(terminated->pid()));  // running, past the fork
  ASSERT_EQ(killed->ReadLine(), std::to_string(killed->pid()));
  terminated->Terminate();
  EXPECT_EQ(terminated->Wait(), 128 + SIGTERM);
  killed->Kill();
  EXPECT_EQ(killed->Wait(), 128 + SIGKILL);
  killed->Terminate();  // after the exit: nothing is sent to a pid that may be reused
  EXPECT_EQ(::kill(server.pid, 0), 0) << "the server outlives its runs";
}

TEST(ForkServerTest, ARunWhoseOwnerLetsGoIsKilled) {
  TestServer server = StartTestServer(WaitingRun);
  pid_t pid;
  {
    StatusOr<ForkedProcess> run = server.client->Fork({"prog"});
    ASSERT_TRUE(run.ok());
    ASSERT_EQ(run->ReadLine(), std::to_string(run->pid()));
    pid = run->pid();
  }
  EXPECT_TRUE(Eventually([pid] { return Gone(pid); })) << "run " << pid << " outlived its ForkedProcess";
}

TEST(ForkServerTest, ClosingTheControlChannelKillsTheRunsAndEndsTheServer) {
  TestServer server = StartTestServer(WaitingRun);
  StatusOr<ForkedProcess> run = server.client->Fork({"prog"});
  ASSERT_TRUE(run.ok());
  ASSERT_EQ(run->ReadLine(), std::to_string(run->pid()));
  server.client.reset();
  int status = -1;
  ASSERT_EQ(::waitpid(server.pid, &status, 0), server.pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  EXPECT_EQ(run->Wait(), 128 + SIGKILL);
  EXPECT_TRUE(Eventually([&] { return Gone(run->pid()); }));
}

TEST(ForkServerTest, RunsDieWithAKilledServerAndANewForkSaysTheServerIsGone) {
  TestServer server = StartTestServer(WaitingRun);
  StatusOr<ForkedProcess> run = server.client->Fork({"prog"});
  ASSERT_TRUE(run.ok());
  ASSERT_EQ(run->ReadLine(), std::to_string(run->pid()));
  ASSERT_EQ(::kill(server.pid, SIGKILL), 0);
  ASSERT_EQ(::waitpid(server.pid, nullptr, 0), server.pid);
  EXPECT_EQ(run->Wait(), 128 + SIGKILL);
  EXPECT_TRUE(Eventually([&] { return Gone(run->pid()); })) << "the run outlived its server";
  StatusOr<ForkedProcess> late = server.client->Fork({"prog"});
  ASSERT_FALSE(late.ok());
  EXPECT_EQ(late.status().code(), StatusCode::kUnavailable) << late.status().ToString();
}

TEST(ForkServerTest, AnEmptyArgvIsRefused) {
  TestServer server = StartTestServer(EchoRun);
  EXPECT_EQ(server.client->Fork({}).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace parsyn
