#include "base/subprocess.h"

#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <fstream>
#include <sstream>
#include <thread>

#include "base/testing/temp_dir.h"

namespace parsyn {
namespace {

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

}  // namespace
}  // namespace parsyn
