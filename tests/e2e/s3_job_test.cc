// Federated LoRA jobs with the coordinator's blobs in S3 (a real moto_server on loopback, behind a TCP proxy the test
// can take down): workers move weights and data only through presigned URLs, the coordinator checks every update's
// bytes, and a store outage in the middle of a job costs a retried round attempt, never a committed round.
#include <stdlib.h>

#include <chrono>
#include <fstream>
#include <set>
#include <thread>

#include "base/sha256.h"
#include "base/testing/missing_dependency.h"
#include "llama_fixture.h"
#include "storage/s3_blob_store.h"
#include "storage/s3_moto_for_test.h"
#include "tcp_proxy.h"

namespace parsyn::e2e {
namespace {

constexpr char kBucket[] = "parsyn-e2e";

std::string Sha256Of(const fs::path& file) {
  StatusOr<std::string> sha = Sha256File(file);
  return sha.ok() ? *sha : "(" + sha.status().ToString() + ")";
}
constexpr char kPrefix[] = "run-1";

class S3LlamaJobTest : public LlamaJobTest {
 protected:
  void SetUp() override {
    if (!storage::FindMotoServer())
      PARSYN_SKIP_FOR_MISSING_DEPENDENCY("moto_server is not installed (./dev setup installs it)");
    StatusOr<std::unique_ptr<storage::MotoServer>> moto = storage::MotoServer::Start();
    ASSERT_TRUE(moto.ok()) << moto.status().ToString();
    moto_ = std::move(*moto);
    ASSERT_TRUE(moto_->CreateBucket(kBucket).ok());
    proxy_ = std::make_unique<TcpProxy>(moto_->port());
    // The server (a child process) takes its credentials from the environment, as in production.
    ::setenv("AWS_ACCESS_KEY_ID", "parsyn-e2e-key", 1);
    ::setenv("AWS_SECRET_ACCESS_KEY", "parsyn-e2e-secret", 1);
    server_flags_.insert(server_flags_.end(), {"--blobs", std::string("s3://") + kBucket + "/" + kPrefix + BlobsQuery(),
                                               "--s3-endpoint", "http://127.0.0.1:" + std::to_string(proxy_->port())});
    // What the test itself reads goes straight to moto, so it still sees the store while the proxy is down.
    storage::S3BlobStoreOptions options;
    options.bucket = kBucket;
    options.prefix = std::string(kPrefix) + "/";
    options.endpoint = {.scheme = "http",
                        .host = "127.0.0.1:" + std::to_string(moto_->port()),
                        .region = "us-east-1",
                        .path_style = true};
    options.credentials = {.access_key_id = "parsyn-e2e-key", .secret_access_key = "parsyn-e2e-secret"};
    StatusOr<std::unique_ptr<storage::S3BlobStore>> store = storage::S3BlobStore::Create(options);
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    store_ = std::move(*store);
    LlamaJobTest::SetUp();
  }

  // Extra query options of the --blobs URI.
  virtual std::string BlobsQuery() const { return ""; }

  fs::path BlobPath(const std::string& key) override {
    const fs::path dest = tmp_.path() / "from-s3" / key;
    if (fs::exists(dest)) return dest;
    fs::create_directories(dest.parent_path());
    StatusOr<std::unique_ptr<storage::ByteSource>> source = store_->Get(key);
    EXPECT_TRUE(source.ok()) << key << ": " << source.status().ToString();
    if (!source.ok()) return dest;
    StatusOr<std::string> bytes = storage::ReadAll(**source, size_t{256} << 20);
    EXPECT_TRUE(bytes.ok()) << bytes.status().ToString();
    if (bytes.ok()) std::ofstream(dest, std::ios::binary) << *bytes;
    return dest;
  }

  // Everything the job left in the bucket, and no upload that never completed.
  void ExpectJobBlobsInTheBucket(int64_t job_id, int rounds) {
    StatusOr<std::vector<std::string>> keys = store_->List("jobs/" + std::to_string(job_id) + "/");
    ASSERT_TRUE(keys.ok()) << keys.status().ToString();
    std::set<std::string> all(keys->begin(), keys->end());
    int updates = 0, globals = 0, shards = 0;
    for (const std::string& k : all) {
      updates += k.find("/updates/") != std::string::npos;
      globals += k.ends_with("/global.safetensors");
      shards += k.find("/shards/") != std::string::npos;
    }
    EXPECT_GE(updates, 2 * rounds);
    EXPECT_GE(globals, rounds + 1);  // the initial adapters and one per committed round
    EXPECT_EQ(shards, 4);            // train + validation for two workers
    StatusOr<std::vector<storage::IncompleteUpload>> incomplete = store_->ListIncompleteUploads("jobs/");
    ASSERT_TRUE(incomplete.ok()) << incomplete.status().ToString();
    EXPECT_TRUE(incomplete->empty()) << incomplete->size() << " upload(s) left incomplete, e.g. "
                                     << incomplete->front().key;
    // Nothing went to the coordinator's own disk.
    const fs::path local_blobs = server_->data_dir() / "blobs";
    EXPECT_TRUE(!fs::exists(local_blobs) || fs::is_empty(local_blobs));
  }

  std::unique_ptr<storage::MotoServer> moto_;
  std::unique_ptr<TcpProxy> proxy_;
  std::unique_ptr<storage::S3BlobStore> store_;
};

TEST_F(S3LlamaJobTest, LoraJobMovesEveryBlobThroughPresignedUrls) {
  std::vector<int64_t> ids = StartWorkers(2);
  const int kRounds = 2;
  const int64_t job_id = CreateJob(*admin_, LoraSpec(ids, kRounds, 6, 2));
  ASSERT_GT(job_id, 0);
  json job = WaitForJobEnd(*admin_, job_id, std::chrono::seconds(300));
  ASSERT_EQ(job.value("status", ""), "succeeded") << job.dump(2);
  EXPECT_EQ(ExpectGlobalsAreFedAvg(job_id), kRounds);
  ExpectJobBlobsInTheBucket(job_id, kRounds);

  // The adapter a user downloads through the API is the object in the bucket.
  const fs::path adapter = tmp_.path() / "adapter_model.safetensors";
  StatusOr<uint64_t> got = admin_->DownloadToFile(
      "/api/v1/training-jobs/" + std::to_string(job_id) + "/artifacts/adapter_model.safetensors", adapter);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  json rounds = Rounds(*admin_, job_id);
  const json& last = rounds.back()["outcome"] == "committed" ? rounds.back() : rounds[rounds.size() - 2];
  const std::string global_key = AttemptPrefix(job_id, last["round"], last["attempt"]) + "/global.safetensors";
  EXPECT_EQ(Sha256Of(adapter), Sha256Of(BlobPath(global_key)));
  // The workers' uploads were checked by the coordinator: their recorded sizes are the objects' sizes.
  for (const json& u : last["updates"]) {
    const std::string key = AttemptPrefix(job_id, last["round"], last["attempt"]) + "/updates/w" +
                            std::to_string(u["worker_id"].get<int64_t>()) + ".safetensors";
    EXPECT_EQ(u["size_bytes"].get<int64_t>(), static_cast<int64_t>(fs::file_size(BlobPath(key)))) << u.dump();
  }
  for (auto& w : workers_) EXPECT_EQ(w->Terminate(), 0) << w->log();
}

// Every update as a multipart upload (a threshold of 0 MiB), so the presigned part URLs and the coordinator's
// completion and abort are on the path; the store goes away after round 1 commits and comes back.
class S3MultipartOutageTest : public S3LlamaJobTest {
 protected:
  std::string BlobsQuery() const override { return "?multipart_threshold_mib=0"; }
};

TEST_F(S3MultipartOutageTest, StoreOutageMidJobRetriesTheRoundAndLosesNothingCommitted) {
  std::vector<int64_t> ids = StartWorkers(2);
  const int kRounds = 3;
  json spec = LoraSpec(ids, kRounds, 6, 2);
  spec["distributed"]["fault_tolerance"] = 20;  // the outage may fail several attempts in a row
  const int64_t job_id = CreateJob(*admin_, spec);
  ASSERT_GT(job_id, 0);

  std::string round1_sha;
  ASSERT_TRUE(WaitForEvent(
      *admin_, job_id,
      [&](const std::string& type, const json& data) {
        if (type != "round_committed" || data["round"] != 1) return false;
        round1_sha = data["global_sha256"];
        return true;
      },
      std::chrono::seconds(240)));
  proxy_->SetDown(true);
  // Down until an attempt has failed because of it: its reason must say what happened.
  std::string failure_reason;
  const bool failed = WaitForEvent(
      *admin_, job_id,
      [&](const std::string& type, const json& data) {
        if (type != "round_failed") return false;
        failure_reason = data["reason"];
        return true;
      },
      std::chrono::seconds(120));
  proxy_->SetDown(false);
  ASSERT_TRUE(failed) << "no round attempt failed while the store was down";
  std::printf("[figures] attempt failed during the store outage: %s\n", failure_reason.c_str());
  // The outage shows up as the coordinator failing to prepare the tasks or the workers failing their transfers.
  EXPECT_TRUE(failure_reason.find("could not prepare the task") != std::string::npos ||
              failure_reason.find("task failed") != std::string::npos)
      << failure_reason;

  json job = WaitForJobEnd(*admin_, job_id, std::chrono::seconds(300));
  ASSERT_EQ(job.value("status", ""), "succeeded") << job.dump(2);
  json rounds = Rounds(*admin_, job_id);
  std::vector<int> committed;
  int failed_attempts = 0;
  for (const json& r : rounds) {
    if (r["outcome"] == "committed") committed.push_back(r["round"]);
    failed_attempts += r["outcome"] == "failed";
  }
  EXPECT_EQ(committed, (std::vector<int>{1, 2, 3})) << rounds.dump(2);  // none lost, skipped or repeated
  EXPECT_GE(failed_attempts, 1);
  // Round 1's global is untouched in the store.
  const std::string round1_key = AttemptPrefix(job_id, 1, rounds[0]["attempt"]) + "/global.safetensors";
  EXPECT_EQ(Sha256Of(BlobPath(round1_key)), round1_sha);
  EXPECT_EQ(ExpectGlobalsAreFedAvg(job_id), kRounds);
  ExpectJobBlobsInTheBucket(job_id, kRounds);
  for (auto& w : workers_) EXPECT_EQ(w->Terminate(), 0) << w->log();
}

}  // namespace
}  // namespace parsyn::e2e
