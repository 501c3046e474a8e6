// The control plane at a scale the suite affords: a job over 2,000 simulated workers (tests/support/sim_workers.h,
// one thread of this process speaking the real protocol to a real `parsyn server`, one connection per worker) runs to
// completion, every worker taking part in every round, heartbeating while it "trains" (idle workers hold only their
// polls). PARSYN_SCALE_WORKERS changes N.
#include <gtest/gtest.h>

#include <cstdlib>

#include "base/fd_limit.h"
#include "base/sha256.h"
#include "harness.h"
#include "support/sim_workers.h"
#include "weights/lora_layout.h"
#include "weights/safetensors.h"

namespace parsyn::testing {
namespace {

int ScaleWorkers() {
  const char* n = std::getenv("PARSYN_SCALE_WORKERS");
  return n != nullptr && std::atoi(n) > 0 ? std::atoi(n) : 2000;
}

TEST(ScaleTest, AJobOverThousandsOfSimulatedWorkersRunsToCompletion) {
  const int n = ScaleWorkers();
  // One connection per worker here, as many on the server (which raises its own limit the same way).
  StatusOr<OpenFilesLimit> fds = RaiseOpenFilesLimit();
  ASSERT_TRUE(fds.ok()) << fds.status().ToString();
  if (fds->after < static_cast<uint64_t>(n + 256)) {
    GTEST_SKIP() << "needs ~" << n + 256 << " file descriptors; the hard RLIMIT_NOFILE is " << fds->hard;
  }
  TempDir dir;
  ServerProcess server(dir.path() / "data",
                       {"--heartbeat-interval-ms", "5000", "--heartbeat-timeout-ms", "60000", "--max-poll-wait-ms",
                        "300000", "--max-connections", "0", "--max-connections-per-address", "0"});
  ASSERT_TRUE(server.running());
  auto admin = AdminClient(server);
  const Fixture f = MakeFixture(*admin, 4 * n, n);
  ASSERT_EQ(f.worker_tokens.size(), static_cast<size_t>(n));

  // Every task is answered with the job's LoRA layout (r = 4 on the tiny model, as DistributedSpec asks).
  weights::LoraLayoutOptions lora;
  lora.r = 4;
  StatusOr<weights::WeightSet> adapters = weights::InitialLoraAdapters(TinyLlamaConfig(), lora, 99);
  ASSERT_TRUE(adapters.ok()) << adapters.status().ToString();
  const std::vector<std::byte> image = weights::SerializeSafetensors(*adapters);
  const uint16_t port = static_cast<uint16_t>(std::stoi(server.url().substr(server.url().rfind(':') + 1)));
  test_support::SimWorkers workers({.port = port,
                                    .tokens = f.worker_tokens,
                                    .update = std::string(reinterpret_cast<const char*>(image.data()), image.size()),
                                    .update_sha256 = Sha256Hex(std::span<const std::byte>(image)),
                                    // 100-200 ms of "training" per task, heartbeating every 100 ms meanwhile (1-2 each)
                                    .train_time = std::chrono::milliseconds(100),
                                    .heartbeat_interval = std::chrono::milliseconds(100)});
  workers.Start();
  const auto hello_deadline = std::chrono::steady_clock::now() + std::chrono::minutes(3);
  while (workers.hellos() < n && workers.error_count() == 0 && std::chrono::steady_clock::now() < hello_deadline) {
    // Hellos come from the fleet's thread with nothing to wait on but their count.
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_EQ(workers.hellos(), n) << (workers.errors().empty() ? "" : workers.errors().front());

  auto job = admin->PostJson("/api/v1/training-jobs", DistributedSpec(f, 2, n, 600));
  ASSERT_TRUE(job.ok() && job->status == 201) << (job.ok() ? job->body : job.status().ToString());
  const int64_t job_id = (*job->Json())["id"];
  std::string status;
  test_support::WaitForJobEvent(
      *admin, job_id,
      [&](const std::string& type, const json& data) {
        if (type != "job_status") return false;
        status = data.value("status", "");
        return status != "queued" && status != "running";
      },
      std::chrono::minutes(10), test_support::OnStreamEnd::kGiveUp);
  EXPECT_EQ(status, "succeeded");
  const std::vector<std::string> errors = workers.errors();
  EXPECT_TRUE(errors.empty()) << errors.size() << " worker errors, the first: " << errors.front();

  // Every worker took part in both rounds: one train task each per round.
  std::map<int, int> train_tasks;
  for (const test_support::SimWorkers::TaskSeen& t : workers.tasks()) {
    if (t.job_id == job_id && t.kind == "train") train_tasks[t.round]++;
  }
  EXPECT_EQ(train_tasks[1], n);
  EXPECT_EQ(train_tasks[2], n);
  // Heartbeats went on the workers' one connection while they trained (each answered 200: no errors above).
  EXPECT_GE(workers.heartbeats().size(), static_cast<size_t>(n));
  auto got = admin->Get("/api/v1/training-jobs/" + std::to_string(job_id));
  ASSERT_TRUE(got.ok());
  EXPECT_EQ((*got->Json())["committed_round"], 2);
  workers.Stop();
}

}  // namespace
}  // namespace parsyn::testing
