// ProcessTrainerLauncher with the real parsyn-trainer forked from its fork server, and its fallback when a program
// has no fork server.
#include "worker/trainer_launcher.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>

#include <nlohmann/json.hpp>

#include "base/testing/build_paths.h"
#include "base/testing/temp_dir.h"

namespace parsyn::worker {
namespace {

// Every line a run prints, and its exit code.
struct Finished {
  std::vector<std::string> lines;
  int exit_code = -1;
};

Finished RunToEnd(TrainerLauncher& launcher, const std::vector<std::string>& argv) {
  StatusOr<std::unique_ptr<TrainerRun>> run = launcher.Start(argv);
  EXPECT_TRUE(run.ok()) << run.status().ToString();
  if (!run.ok()) return {};
  Finished finished;
  while (std::optional<std::string> line = (*run)->ReadLine()) finished.lines.push_back(*line);
  finished.exit_code = (*run)->Wait();
  return finished;
}

TEST(TrainerLauncherTest, ForkedParsynTrainerRunsAnswerAsAFreshStartDoes) {
  const std::string trainer = test_support::BuildPath("parsyn-trainer");
  ProcessTrainerLauncher fresh;
  ProcessTrainerLauncher forking;
  forking.ForkRunsOf(trainer);
  const Finished expected = RunToEnd(fresh, {trainer, "--describe"});
  ASSERT_EQ(expected.exit_code, 0);
  ASSERT_EQ(expected.lines.size(), 1u);
  EXPECT_EQ(nlohmann::json::parse(expected.lines[0]).value("name", ""), "parsyn-trainer");
  for (int i = 0; i < 3; ++i) {  // each a fork of the same started copy
    const Finished forked = RunToEnd(forking, {trainer, "--describe"});
    EXPECT_EQ(forked.exit_code, 0);
    EXPECT_EQ(forked.lines, expected.lines);
  }
  EXPECT_TRUE(forking.ForksRuns()) << "the runs above were started anew, not forked";
  EXPECT_FALSE(fresh.ForksRuns());
  // A usage error keeps its exit code (2) through the server.
  EXPECT_EQ(RunToEnd(forking, {trainer, "no-such-command"}).exit_code, 2);
  // A run blocked opening a FIFO no one writes does not stop on SIGTERM once its handler is in place (it checks for
  // a stop between micro-batches): it is killed after the grace period. Both signals go through the server. Sent
  // before the handler is in place, the SIGTERM ends it (143).
  test_support::TempDir tmp("parsyn-launcher-test");
  const std::filesystem::path fifo = tmp.path() / "task.json";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  ProcessTrainerLauncher quick_to_kill(std::chrono::milliseconds(300));
  quick_to_kill.ForkRunsOf(trainer);
  StatusOr<std::unique_ptr<TrainerRun>> blocked = quick_to_kill.Start({trainer, "run", fifo.string()});
  ASSERT_TRUE(blocked.ok());
  (*blocked)->Terminate();
  const int code = (*blocked)->Wait();
  EXPECT_TRUE(code == 128 + SIGKILL || code == 128 + SIGTERM) << code;
}

TEST(TrainerLauncherTest, AProgramWithoutAForkServerIsStartedAnewForEachRun) {
  // /bin/true exits at once instead of serving forks: the launcher says so in its log and starts runs itself.
  ProcessTrainerLauncher launcher;
  launcher.ForkRunsOf("/bin/true");
  EXPECT_EQ(RunToEnd(launcher, {"/bin/true"}).exit_code, 0);
  EXPECT_FALSE(launcher.ForksRuns());
  EXPECT_EQ(RunToEnd(launcher, {"/bin/true"}).exit_code, 0);
  ProcessTrainerLauncher missing;
  missing.ForkRunsOf("/no/such/trainer");
  EXPECT_FALSE(missing.ForksRuns());
  StatusOr<std::unique_ptr<TrainerRun>> run = missing.Start({"/no/such/trainer"});
  ASSERT_FALSE(run.ok());
  EXPECT_EQ(run.status().code(), StatusCode::kNotFound) << run.status().ToString();
}

}  // namespace
}  // namespace parsyn::worker
