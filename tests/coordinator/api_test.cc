// The REST API against a real `parsyn server`: happy paths, pagination, Location headers, validation problems listed
// by field, limits (credentials before bodies, the JSON cap, upload concurrency and rate), and a table of bad requests
// each answered with the right status, code and message while the server stays healthy.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include "base/sha256.h"
#include "base/testing/raw_socket.h"
#include "cli/remote.h"
#include "coordinator/signed_blob_urls.h"
#include "harness.h"
#include "http/signed_url.h"
#include "http/status_codes.h"
#include "net/transport.h"
#include "weights/safetensors.h"

namespace parsyn::testing {
namespace {

class ApiTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = std::make_unique<ServerProcess>(dir_.path() / "data");
    admin_ = AdminClient(*server_);
  }

  TempDir dir_;
  std::unique_ptr<ServerProcess> server_;
  std::unique_ptr<http::Client> admin_;
};

TEST_F(ApiTest, AdminKeyIsWrittenOnceWithMode0600AndStoredHashed) {
  const auto key_file = dir_.path() / "data" / "admin-key";
  auto perms = std::filesystem::status(key_file).permissions();
  EXPECT_EQ(perms & std::filesystem::perms::all,
            std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  const std::string key = server_->admin_key();
  EXPECT_TRUE(key.starts_with("psk_"));
  // Stdout is a pipe (as a container's log is, which keeps it): the key is not printed there, only where it is.
  EXPECT_EQ(server_->startup_output().find(key), std::string::npos) << server_->startup_output();
  EXPECT_NE(server_->startup_output().find("admin API key written to " + key_file.string()), std::string::npos)
      << server_->startup_output();
  server_->Terminate();
  server_->Restart();  // a second start keeps the key
  EXPECT_EQ(server_->admin_key(), key);
  auto admin = AdminClient(*server_);
  EXPECT_TRUE(admin->Get("/api/v1/datasets").ok());
}

TEST_F(ApiTest, HealthzIsOpen) {
  http::ClientOptions o;
  o.base_url = server_->url();
  http::Client anonymous(o);
  auto res = anonymous.Get("/healthz");
  ASSERT_TRUE(res.ok()) << res.status().ToString();
  EXPECT_EQ((*res->Json())["status"], "ok");
}

// GET without credentials through the transport, which answers any status (the client turns non-2xx into errors).
net::Response RawGet(const std::string& url, const std::string& bearer = "") {
  net::Transport transport(net::TransportOptions{.max_attempts = 1});
  net::Request request{.method = "GET", .url = url};
  if (!bearer.empty()) request.headers = {{"Authorization", "Bearer " + bearer}};
  StatusOr<net::Response> res = transport.Perform(request);
  EXPECT_TRUE(res.ok()) << res.status().ToString();
  return res.ok() ? *res : net::Response{};
}

std::string ReadWholeFile(const std::filesystem::path& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// /readyz's status, polled (up to 10 s: probes are shared for a second) until it is `want`; the last answer.
net::Response ReadyzUntil(const std::string& url, int want) {
  net::Response res;
  for (int i = 0; i < 200; ++i) {
    res = RawGet(url + "/readyz");
    if (res.status == want) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return res;
}

// A store operation's count in /metrics' text (0 when absent).
double StoreOperations(const std::string& metrics, const std::string& operation) {
  const std::string name = "parsyn_store_operation_duration_seconds_count{operation=\"" + operation + "\"} ";
  const size_t at = metrics.find(name);
  return at == std::string::npos ? 0 : std::stod(metrics.substr(at + name.size()));
}

// Ready while both stores answer; with the blob directory replaced by a file (which refuses writes even to root),
// 503 naming the blob store with a short reason (the details, a server path among them, only in the log), and ready
// again once it is back.
TEST_F(ApiTest, ReadyzChecksTheMetadataAndBlobStores) {
  net::Response ready = RawGet(server_->url() + "/readyz");
  ASSERT_EQ(ready.status, 200) << ready.body;
  json body = json::parse(ready.body);
  EXPECT_EQ(body["status"], "ready");
  EXPECT_EQ(body["role"], "leader");

  const auto blobs = dir_.path() / "data" / "blobs";
  std::filesystem::rename(blobs, dir_.path() / "blobs-away");
  { std::ofstream(blobs) << "not a directory"; }
  net::Response broken = ReadyzUntil(server_->url(), 503);
  EXPECT_EQ(broken.status, 503) << broken.body;
  body = json::parse(broken.body, nullptr, false);
  EXPECT_EQ(body["status"], "not_ready") << broken.body;
  EXPECT_TRUE(body["not_ready"].contains("blob_store")) << broken.body;
  EXPECT_FALSE(body["not_ready"].contains("metadata_store")) << broken.body;
  EXPECT_EQ(broken.body.find(dir_.path().string()), std::string::npos) << "a server path in an open answer";
  EXPECT_NE(ReadWholeFile(dir_.path() / "data.log").find("readyz: the blob_store does not answer"), std::string::npos);
  // /healthz says the process is up; it does not depend on the stores.
  EXPECT_EQ(RawGet(server_->url() + "/healthz").status, 200);

  std::filesystem::remove(blobs);
  std::filesystem::rename(dir_.path() / "blobs-away", blobs);
  EXPECT_EQ(ReadyzUntil(server_->url(), 200).status, 200);
}

// The open routes cost the stores nothing per call: /readyz's probes are shared for about a second and /metrics'
// stored gauges for about 5 s, however often they are called.
TEST_F(ApiTest, ReadyzAndMetricsShareTheirStoreReads) {
  const std::string before = RawGet(server_->url() + "/metrics").body;
  for (int i = 0; i < 20; ++i) {
    ASSERT_EQ(RawGet(server_->url() + "/readyz").status, 200);
    ASSERT_EQ(RawGet(server_->url() + "/metrics").status, 200);
  }
  const std::string after = RawGet(server_->url() + "/metrics").body;
  // 20 calls in well under the cache's age (a second probe or read at most, where the calls crossed its edge).
  EXPECT_LE(StoreOperations(after, "get_admin_key_hash") - StoreOperations(before, "get_admin_key_hash"), 3) << after;
  EXPECT_LE(StoreOperations(after, "list_jobs") - StoreOperations(before, "list_jobs"), 2) << after;
}

// /metrics is open by default, in the text format, and labels HTTP requests with the route pattern, never the path.
TEST_F(ApiTest, MetricsCountRequestsByRoutePatternAndStoreOperations) {
  ASSERT_FALSE(admin_->Get("/api/v1/datasets/987654").ok());  // a 404 on a route with a parameter
  net::Response res = RawGet(server_->url() + "/metrics");
  ASSERT_EQ(res.status, 200) << res.body;
  EXPECT_EQ(res.headers["content-type"], "text/plain; version=0.0.4; charset=utf-8");
  const std::string& text = res.body;
  EXPECT_NE(text.find("parsyn_http_requests_total{method=\"GET\",route=\"/api/v1/datasets/{id}\",status=\"404\"} 1\n"),
            std::string::npos)
      << text;
  EXPECT_EQ(text.find("987654"), std::string::npos) << "a raw path leaked into a label";
  EXPECT_NE(text.find("parsyn_http_request_duration_seconds_bucket{method=\"GET\",route=\"/api/v1/datasets/{id}\","
                      "le=\"+Inf\"} 1\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("parsyn_store_operation_duration_seconds_count{operation=\"get_dataset\"}"), std::string::npos);
  EXPECT_NE(text.find("parsyn_jobs{status=\"running\"} 0\n"), std::string::npos);
  EXPECT_NE(text.find("\nprocess_open_fds "), std::string::npos);
  EXPECT_NE(text.find("\nprocess_resident_memory_bytes "), std::string::npos);
  // The loop's own latency, sampled on its 100 ms tick: both histograms count samples once it has ticked.
  const auto sampled_count = [](const std::string& metrics, const std::string& name) -> double {
    const size_t at = metrics.find("\n" + name + "_count ");
    return at == std::string::npos ? 0 : std::stod(metrics.substr(at + name.size() + 8));
  };
  std::string sampled = text;
  for (int i = 0; i < 200 && sampled_count(sampled, "parsyn_timer_tick_lateness_seconds") < 2; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    sampled = RawGet(server_->url() + "/metrics").body;
  }
  EXPECT_GE(sampled_count(sampled, "parsyn_event_loop_lag_seconds"), 1) << sampled;
  EXPECT_GE(sampled_count(sampled, "parsyn_timer_tick_lateness_seconds"), 2) << sampled;

  // The access log: one info line per request with the route pattern, status and who; no key, no raw path.
  const std::string log = ReadWholeFile(dir_.path() / "data.log");
  EXPECT_NE(log.find("access: "), std::string::npos) << log;
  EXPECT_NE(log.find("GET /api/v1/datasets/{id} status=404 duration_ms="), std::string::npos) << log;
  EXPECT_NE(log.find("by=admin"), std::string::npos) << log;
  EXPECT_EQ(log.find(server_->admin_key()), std::string::npos) << "the admin key leaked into the log";
  EXPECT_EQ(log.find("987654"), std::string::npos) << log;
}

TEST(MetricsAuthTest, AdminModeNeedsTheAdminKeyAndJsonLogsAreOneObjectALine) {
  TempDir dir;
  ServerProcess server(dir.path() / "data", {"--metrics-auth", "admin", "--log-format", "json"});
  EXPECT_EQ(RawGet(server.url() + "/metrics").status, 401);
  net::Response res = RawGet(server.url() + "/metrics", server.admin_key());
  EXPECT_EQ(res.status, 200) << res.body;
  EXPECT_NE(res.body.find("# TYPE parsyn_rounds_total counter"), std::string::npos);
  server.Terminate();
  std::istringstream log(ReadWholeFile(dir.path() / "data.log"));
  int lines = 0, access = 0;
  for (std::string line; std::getline(log, line);) {
    if (line.empty() || line.front() != '{') continue;  // the CLI's own plain messages (the new admin key notice)
    json entry = json::parse(line, nullptr, false);
    ASSERT_TRUE(entry.is_object()) << line;
    const std::string time = entry.value("time", "");
    EXPECT_EQ(time.size(), 24u) << line;  // 2026-12-01T16:20:34.123Z
    EXPECT_TRUE(time.ends_with("Z")) << line;
    EXPECT_TRUE(entry["level"].is_string()) << line;
    access += entry.value("msg", "").find("access: ") == 0;
    ++lines;
  }
  EXPECT_GT(lines, 0);
  EXPECT_GE(access, 2);  // the two /metrics requests
}

// `parsyn server --admin-key-file --worker-bootstrap-key-file` (deploy/kubernetes): the admin key is the file's and
// follows it across restarts; the bootstrap key registers managed workers through POST /api/v1/workers/bootstrap and
// can do nothing else; without the flag that route answers 404 naming it.
TEST(WorkerBootstrapTest, BootstrapKeyRegistersManagedWorkersOnlyAndTheAdminKeyFollowsItsFile) {
  TempDir dir;
  const std::filesystem::path admin_file = dir.path() / "admin-key", bootstrap_file = dir.path() / "bootstrap-key";
  const std::string admin_key(40, 'a'), bootstrap_key = std::string(40, 'b') + "\n";
  std::ofstream(admin_file) << admin_key << "\n";
  std::ofstream(bootstrap_file) << bootstrap_key;
  ServerProcess server(dir.path() / "data", {"--admin-key-file", admin_file.string(), "--worker-bootstrap-key-file",
                                             bootstrap_file.string()});
  EXPECT_FALSE(std::filesystem::exists(dir.path() / "data" / "admin-key"));  // the operator's file is the key
  auto admin = ClientWithToken(server, admin_key);
  ASSERT_TRUE(admin->Get("/api/v1/workers").ok());

  auto bootstrap = ClientWithToken(server, std::string(40, 'b'));
  auto created = bootstrap->PostJson("/api/v1/workers/bootstrap", {{"name", "parsyn-worker-7d9f-x2"}});
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  EXPECT_EQ(created->status, 201);
  json worker = *created->Json();
  EXPECT_EQ(worker["kind"], "managed");
  EXPECT_EQ(worker["name"], "parsyn-worker-7d9f-x2");
  // Its token is a worker's token like any other.
  auto hello = ClientWithToken(server, worker["token"])->PostJson("/api/v1/worker/hello", {{"device", "cpu (test)"}});
  EXPECT_TRUE(hello.ok()) << hello.status().ToString();

  // The bootstrap key is no admin key, and the admin key (or none) does not bootstrap.
  EXPECT_EQ(bootstrap->Get("/api/v1/workers").status().code(), StatusCode::kUnauthenticated);
  EXPECT_EQ(bootstrap->PostJson("/api/v1/workers", {{"name", "x"}, {"kind", "managed"}}).status().code(),
            StatusCode::kUnauthenticated);
  EXPECT_EQ(admin->PostJson("/api/v1/workers/bootstrap", {{"name", "x"}}).status().code(),
            StatusCode::kUnauthenticated);
  EXPECT_EQ(RawGet(server.url() + "/api/v1/workers", std::string(40, 'b')).status, 401);
  // Bad bodies name the field; a bootstrapped worker is always managed (no "kind" to choose).
  auto nameless = bootstrap->PostJson("/api/v1/workers/bootstrap", json::object());
  EXPECT_EQ(nameless.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(nameless.status().message().find("name"), std::string::npos) << nameless.status().message();
  auto own = bootstrap->PostJson("/api/v1/workers/bootstrap", {{"name", "y"}, {"kind", "own"}});
  EXPECT_EQ(own.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(own.status().message().find("kind"), std::string::npos) << own.status().message();
  auto listed = admin->Get("/api/v1/workers");
  ASSERT_TRUE(listed.ok());
  EXPECT_EQ((*listed->Json())["workers"].size(), 1u) << listed->body;

  // A changed file is the new key at the next start; the old one stops working.
  server.Terminate();
  const std::string rotated(48, 'c');
  std::ofstream(admin_file, std::ios::trunc) << rotated;
  server.Restart();
  EXPECT_EQ(RawGet(server.url() + "/api/v1/workers", admin_key).status, 401);
  EXPECT_EQ(RawGet(server.url() + "/api/v1/workers", rotated).status, 200);

  // Without --worker-bootstrap-key-file the route is off, and says how to turn it on.
  TempDir plain_dir;
  ServerProcess plain(plain_dir.path() / "data");
  auto off = ClientWithToken(plain, std::string(40, 'b'))->PostJson("/api/v1/workers/bootstrap", {{"name", "z"}});
  EXPECT_EQ(off.status().code(), StatusCode::kNotFound);
  EXPECT_NE(off.status().message().find("--worker-bootstrap-key-file"), std::string::npos) << off.status().message();
}

// The bootstrap key cannot mint unlimited workers: bootstraps are rate-limited (--bootstrap-rate) and capped by the
// managed workers not revoked (--max-managed-workers); a pod registering again under its name revokes its earlier
// record; managed workers not heard from for --managed-worker-absence-s are revoked.
TEST(WorkerBootstrapTest, BootstrapsAreRateLimitedCappedAndDepartedPodsRevoked) {
  TempDir dir;
  const std::filesystem::path admin_file = dir.path() / "admin-key", bootstrap_file = dir.path() / "bootstrap-key";
  const std::string admin_key(40, 'a'), bootstrap_key(40, 'b');
  std::ofstream(admin_file) << admin_key << "\n";
  std::ofstream(bootstrap_file) << bootstrap_key << "\n";
  ServerProcess server(dir.path() / "data",
                       {"--admin-key-file", admin_file.string(), "--worker-bootstrap-key-file", bootstrap_file.string(),
                        "--bootstrap-rate", "4", "--max-managed-workers", "2", "--managed-worker-absence-s", "3"});
  auto admin = ClientWithToken(server, admin_key);
  auto bootstrap = ClientWithToken(server, bootstrap_key);
  auto register_pod = [&](const std::string& name) {
    return bootstrap->PostJson("/api/v1/workers/bootstrap", {{"name", name}});
  };
  auto worker = [&](int64_t id) {
    auto got = admin->Get("/api/v1/workers/" + std::to_string(id));
    return got.ok() ? *got->Json() : json();
  };
  auto first = register_pod("pod-0");
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  const int64_t first_id = (*first->Json())["id"];
  // The same pod again (restarted): a new record, the earlier one revoked (its token no longer works).
  auto again = register_pod("pod-0");
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  const int64_t again_id = (*again->Json())["id"];
  EXPECT_NE(again_id, first_id);
  EXPECT_EQ(worker(first_id)["revoked"], true);
  EXPECT_EQ(worker(again_id)["revoked"], false);
  auto stale = ClientWithToken(server, (*first->Json())["token"])->PostJson("/api/v1/worker/hello", json::object());
  EXPECT_EQ(stale.status().code(), StatusCode::kPermissionDenied) << stale.status().ToString();
  ASSERT_TRUE(register_pod("pod-1").ok());
  // Two managed workers live: a third is refused, saying which flag.
  auto capped = register_pod("pod-2");
  EXPECT_EQ(capped.status().code(), StatusCode::kResourceExhausted) << capped.status().ToString();
  EXPECT_NE(capped.status().message().find("--max-managed-workers"), std::string::npos) << capped.status().message();
  // Four bootstraps this minute: the fifth waits.
  auto limited = register_pod("pod-3");
  EXPECT_EQ(limited.status().code(), StatusCode::kResourceExhausted) << limited.status().ToString();
  EXPECT_NE(limited.status().message().find("--bootstrap-rate"), std::string::npos) << limited.status().message();

  // Nobody says hello for longer than the absence allowed: both live records are revoked.
  bool revoked = false;
  for (int i = 0; i < 100 && !revoked; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    revoked = worker(again_id)["revoked"] == true;
  }
  EXPECT_TRUE(revoked) << worker(again_id).dump();
  auto listed = admin->Get("/api/v1/workers");
  ASSERT_TRUE(listed.ok());
  for (const json& w : (*listed->Json())["workers"]) EXPECT_EQ(w["revoked"], true) << w.dump();
}

TEST_F(ApiTest, HappyPathsForDatasetsModelsWorkersAndJobs) {
  Fixture f = MakeFixture(*admin_, 20, 2);
  ASSERT_GT(f.dataset_id, 0);
  ASSERT_GT(f.model_id, 0);
  ASSERT_EQ(f.worker_ids.size(), 2u);

  auto ds = admin_->Get("/api/v1/datasets/" + std::to_string(f.dataset_id));
  ASSERT_TRUE(ds.ok());
  EXPECT_EQ((*ds->Json())["row_count"], 20);
  EXPECT_EQ((*ds->Json())["kind"], "text");
  EXPECT_EQ((*admin_->Get("/api/v1/datasets")->Json())["datasets"].size(), 1u);

  auto model = admin_->Get("/api/v1/models/" + std::to_string(f.model_id));
  ASSERT_TRUE(model.ok());
  EXPECT_EQ((*model->Json())["model_type"], "llama");
  EXPECT_EQ((*model->Json())["files"][0]["path"], "config.json");

  auto workers = admin_->Get("/api/v1/workers");
  ASSERT_TRUE(workers.ok());
  const json worker_list = *workers->Json();
  for (const json& w : worker_list["workers"]) {
    EXPECT_EQ(w["kind"], "own");
    EXPECT_EQ(w["status"], "offline");
    EXPECT_FALSE(w.contains("token"));
    EXPECT_FALSE(w.contains("token_sha256"));
  }

  auto job = admin_->PostJson("/api/v1/training-jobs", DistributedSpec(f, 2, 2, 30));
  ASSERT_TRUE(job.ok()) << job.status().ToString();
  const int64_t job_id = (*job->Json())["id"];
  EXPECT_EQ((*job->Json())["status"], "queued");
  // With no worker online the job waits for workers.
  ASSERT_TRUE(WaitForEvent(
      *admin_, job_id, [](const std::string& t, const json&) { return t == "round_started"; },
      std::chrono::seconds(10)));
  auto got = admin_->Get("/api/v1/training-jobs/" + std::to_string(job_id));
  ASSERT_TRUE(got.ok());
  EXPECT_EQ((*got->Json())["status"], "running");
  EXPECT_EQ((*got->Json())["live"]["phase"], "waiting_for_workers");
  EXPECT_EQ((*got->Json())["total_rounds"], 2);
  EXPECT_EQ((*admin_->Get("/api/v1/training-jobs")->Json())["training_jobs"].size(), 1u);

  // Referenced records cannot be deleted while the job exists.
  auto del = admin_->Delete("/api/v1/datasets/" + std::to_string(f.dataset_id));
  EXPECT_EQ(del.status().code(), StatusCode::kFailedPrecondition);

  auto cancelled = admin_->PostJson("/api/v1/training-jobs/" + std::to_string(job_id) + "/cancel", json::object());
  ASSERT_TRUE(cancelled.ok()) << cancelled.status().ToString();
  EXPECT_EQ((*cancelled->Json())["status"], "cancelled");
  auto again = admin_->PostJson("/api/v1/training-jobs/" + std::to_string(job_id) + "/stop", json::object());
  EXPECT_EQ(again.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(again.status().message().find("already cancelled"), std::string::npos) << again.status().message();

  // Revocation keeps the record and refuses the token.
  auto revoked = admin_->Delete("/api/v1/workers/" + std::to_string(f.worker_ids[0]));
  ASSERT_TRUE(revoked.ok());
  EXPECT_EQ((*revoked->Json())["status"], "revoked");
  auto worker = ClientWithToken(*server_, f.worker_tokens[0]);
  auto hello = worker->PostJson("/api/v1/worker/hello", json::object());
  EXPECT_EQ(hello.status().code(), StatusCode::kPermissionDenied);
}

// Settings accepted but ignored come back as warnings with the created job, and stay in its view.
TEST_F(ApiTest, CreateAnswersWarningsAndTheJobKeepsThem) {
  Fixture f = MakeFixture(*admin_, 20, 2);
  json spec = DistributedSpec(f, 2, 2, 30);  // 5 steps per round
  spec["config"]["epochs"] = 3;
  spec["config"]["label_column"] = "y";  // the fixture's model is a language model
  auto job = admin_->PostJson("/api/v1/training-jobs", spec);
  ASSERT_TRUE(job.ok()) << job.status().ToString();
  const json created = *job->Json();
  EXPECT_EQ(created["status"], "queued");
  const json expected = {
      "config.epochs is ignored: distributed.steps_per_round (5) sets each round's length; set steps_per_round to 0 "
      "to train config.epochs passes per round",
      // 20 rows in 2 shards of 10, each holding out round(10 * 0.1) = 1 validation row.
      "dataset " + std::to_string(f.dataset_id) +
          " has 18 training rows (fewer than 1,000): one worker will likely finish sooner than a distributed job's "
          "coordination overhead; set distributed.enabled to false to train on one worker",
      "config.label_column is ignored: model " + std::to_string(f.model_id) +
          " is a language model (label_column applies to tabular models)"};
  EXPECT_EQ(created["warnings"], expected) << created.dump(2);
  const std::string path = "/api/v1/training-jobs/" + std::to_string(created["id"].get<int64_t>());
  auto got = admin_->Get(path);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ((*got->Json())["warnings"], expected) << got->body;
  // Each is also an event of the job's stream.
  EXPECT_TRUE(WaitForEvent(
      *admin_, created["id"],
      [](const std::string& t, const json& d) {
        return t == "warning" && d.value("message", "").starts_with("config.label_column is ignored");
      },
      std::chrono::seconds(10)));

  // A one-worker job: the distributed fields it gives are ignored; small data is no reason to warn.
  json solo = DistributedSpec(f, 4, 1, 30);
  solo["distributed"] = {{"enabled", false}, {"num_rounds", 4}};
  job = admin_->PostJson("/api/v1/training-jobs", solo);
  ASSERT_TRUE(job.ok()) << job.status().ToString();
  EXPECT_EQ((*job->Json())["warnings"],
            json::array({"distributed.num_rounds is ignored: distributed.enabled is false (the job trains on one "
                         "worker)"}))
      << job->body;

  // Nothing ignored: an empty list.
  solo.erase("distributed");
  job = admin_->PostJson("/api/v1/training-jobs", solo);
  ASSERT_TRUE(job.ok()) << job.status().ToString();
  EXPECT_EQ((*job->Json())["warnings"], json::array()) << job->body;
  got = admin_->Get("/api/v1/training-jobs/" + std::to_string((*job->Json())["id"].get<int64_t>()));
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ((*got->Json())["warnings"], json::array()) << got->body;
}

TEST_F(ApiTest, DatasetValidationNamesTheLine) {
  auto res = admin_->Send(http::Method::kPost, "/api/v1/datasets?name=bad.jsonl",
                          "{\"text\": \"ok\"}\n{\"text\": \"ok\"}\n[1, 2]\n", "application/octet-stream");
  ASSERT_EQ(res.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(res.status().message().find("line 3"), std::string::npos) << res.status().message();
  EXPECT_TRUE((*admin_->Get("/api/v1/datasets")->Json())["datasets"].empty());

  auto csv = admin_->Send(http::Method::kPost, "/api/v1/datasets?name=t.csv", "a,b,label\n1,2,x\n3,4,y\n",
                          "application/octet-stream");
  ASSERT_TRUE(csv.ok()) << csv.status().ToString();
  EXPECT_EQ((*csv->Json())["kind"], "tabular");
  EXPECT_EQ((*csv->Json())["row_count"], 2);
}

struct BadRequest {
  const char* name;
  http::Method method;
  std::string path;
  std::string body;
  std::string auth;  // "admin", "none", "wrong", "worker"
  int status;
  const char* code;
  const char* message_part;
};

TEST_F(ApiTest, BadRequestsGetTheRightStatusAndMessage) {
  Fixture f = MakeFixture(*admin_, 10, 1);
  const std::string valid_spec = DistributedSpec(f, 1, 1, 30).dump();
  auto spec_with = [&](const std::function<void(json&)>& change) {
    json s = json::parse(valid_spec);
    change(s);
    return s.dump();
  };
  const std::vector<BadRequest> table = {
      {"no key", http::Method::kGet, "/api/v1/datasets", "", "none", 401, "unauthenticated", "Authorization"},
      {"wrong key", http::Method::kGet, "/api/v1/datasets", "", "wrong", 401, "unauthenticated", "invalid API key"},
      {"worker token on user API", http::Method::kGet, "/api/v1/datasets", "", "worker", 401, "unauthenticated",
       "invalid API key"},
      {"admin key on worker API", http::Method::kPost, "/api/v1/worker/hello", "{}", "admin", 401, "unauthenticated",
       "invalid worker token"},
      {"malformed JSON", http::Method::kPost, "/api/v1/training-jobs", "{\"name\": ", "admin", 400, "invalid_argument",
       "JSON"},
      {"wrong type", http::Method::kPost, "/api/v1/training-jobs",
       spec_with([](json& s) { s["distributed"]["num_rounds"] = "ten"; }), "admin", 400, "invalid_argument",
       "distributed.num_rounds"},
      {"unknown field", http::Method::kPost, "/api/v1/training-jobs",
       spec_with([](json& s) { s["config"]["lerning_rate"] = 0.1; }), "admin", 400, "invalid_argument",
       "config.lerning_rate"},
      {"out of range", http::Method::kPost, "/api/v1/training-jobs",
       spec_with([](json& s) { s["distributed"]["min_workers"] = 5; }), "admin", 400, "invalid_argument",
       "min_workers"},
      {"bad strategy", http::Method::kPost, "/api/v1/training-jobs",
       spec_with([](json& s) { s["distributed"]["strategy"] = "fedsgd"; }), "admin", 400, "invalid_argument",
       "strategy"},
      {"strategy option out of range", http::Method::kPost, "/api/v1/training-jobs", spec_with([](json& s) {
         s["distributed"]["strategy"] = "trimmed_mean";
         s["distributed"]["strategy_options"] = {{"beta", 0.5}};
       }),
       "admin", 400, "invalid_argument", "distributed.strategy_options.beta"},
      {"option of another strategy", http::Method::kPost, "/api/v1/training-jobs", spec_with([](json& s) {
         s["distributed"]["strategy"] = "fedadam";
         s["distributed"]["strategy_options"] = {{"mu", 0.1}};
       }),
       "admin", 400, "invalid_argument", "distributed.strategy_options.mu: fedadam does not take mu"},
      {"unknown dataset", http::Method::kPost, "/api/v1/training-jobs",
       spec_with([](json& s) { s["dataset_id"] = 999; }), "admin", 400, "invalid_argument",
       "dataset_id: dataset 999 does not exist"},
      {"unknown worker", http::Method::kPost, "/api/v1/training-jobs", spec_with([&](json& s) {
         s["worker_selection"]["worker_ids"] = json::array({f.worker_ids[0], 4242});
       }),
       "admin", 400, "invalid_argument", "worker 4242 does not exist"},
      {"unknown job", http::Method::kGet, "/api/v1/training-jobs/777", "", "admin", 404, "not_found", "777"},
      {"non-numeric id", http::Method::kGet, "/api/v1/datasets/abc", "", "admin", 400, "invalid_argument",
       "positive integer"},
      {"oversize JSON body", http::Method::kPost, "/api/v1/workers", std::string(2 << 20, ' '), "admin", 413,
       "resource_exhausted", ""},
      {"worker unknown field", http::Method::kPost, "/api/v1/workers", R"({"name": "x", "colour": "red"})", "admin",
       400, "invalid_argument", "unknown field 'colour'"},
      {"worker bad kind", http::Method::kPost, "/api/v1/workers", R"({"name": "x", "kind": "rented"})", "admin", 400,
       "invalid_argument", "kind"},
      {"model path traversal", http::Method::kPost, "/api/v1/models",
       R"({"name": "m", "files": {"../../etc/passwd": "0123456789abcdef0123456789abcdef"}})", "admin", 400,
       "invalid_argument", "'..'"},
      {"model upload id traversal", http::Method::kPost, "/api/v1/models",
       R"({"name": "m", "files": {"config.json": "../datasets/x"}})", "admin", 400, "invalid_argument",
       "32 hex digits"},
      {"model without config", http::Method::kPost, "/api/v1/models",
       R"({"name": "m", "files": {"model.safetensors": "0123456789abcdef0123456789abcdef"}})", "admin", 400,
       "invalid_argument", "config.json (language model), tabular_model.json (tabular model) or parsyn_model.json"},
      {"artifact traversal", http::Method::kGet, "/api/v1/training-jobs/1/artifacts/..%2F..%2Fmetadata.db", "", "admin",
       404, "not_found", ""},
      {"blob without signature", http::Method::kGet, "/blobs/datasets/x/data.jsonl", "", "none", 401, "unauthenticated",
       ""},
      {"blob traversal", http::Method::kGet, "/blobs/..%2Fadmin-key?expires=9999999999&signature=x", "", "none", 400,
       "invalid_argument", ""},
      {"no route", http::Method::kGet, "/api/v1/nothing-here", "", "admin", 404, "not_found", "no route"},
  };
  for (const BadRequest& c : table) {
    SCOPED_TRACE(c.name);
    http::ClientOptions o;
    o.base_url = server_->url();
    o.max_attempts = 1;
    if (std::string(c.auth) == "admin") o.bearer_token = server_->admin_key();
    if (std::string(c.auth) == "wrong") o.bearer_token = "psk_nope";
    if (std::string(c.auth) == "worker") o.bearer_token = f.worker_tokens[0];
    http::Client client(o);
    auto res = client.Send(c.method, c.path, c.body, c.body.empty() ? "" : "application/json");
    ASSERT_FALSE(res.ok());
    EXPECT_EQ(http::HttpStatusFor(res.status().code()), c.status) << res.status().ToString();
    EXPECT_EQ(StatusCodeSlug(res.status().code()), c.code) << res.status().ToString();
    EXPECT_NE(res.status().message().find(c.message_part), std::string::npos) << res.status().message();
  }
  // Unharmed: still answers, and the one job-less state is intact.
  EXPECT_TRUE(admin_->Get("/healthz").ok());
  EXPECT_TRUE((*admin_->Get("/api/v1/training-jobs")->Json())["training_jobs"].empty());
}

// Every item of a list route read page by page with ?limit=`limit`, following next_cursor; fails the test when a page
// is larger than asked or the walk does not end.
std::vector<json> WalkPages(http::Client& admin, const std::string& path, const std::string& field, int limit,
                            int* pages) {
  std::vector<json> items;
  std::string cursor;
  *pages = 0;
  for (int guard = 0; guard < 100; ++guard) {
    std::string page_path = path + (path.find('?') == std::string::npos ? "?" : "&") + "limit=" + std::to_string(limit);
    if (!cursor.empty()) page_path += "&cursor=" + cursor;
    auto res = admin.Get(page_path);
    EXPECT_TRUE(res.ok()) << res.status().ToString();
    if (!res.ok()) return items;
    const json page = *res->Json();
    ++*pages;
    EXPECT_LE(page[field].size(), static_cast<size_t>(limit)) << page.dump();
    for (const json& item : page[field]) items.push_back(item);
    EXPECT_TRUE(page.contains("next_cursor")) << page.dump();
    if (page["next_cursor"].is_null()) return items;
    EXPECT_TRUE(page["next_cursor"].is_string()) << page.dump();
    cursor = page["next_cursor"].get<std::string>();
  }
  ADD_FAILURE() << path << ": the cursor walk did not end";
  return items;
}

std::vector<int64_t> IdsOf(const std::vector<json>& items) {
  std::vector<int64_t> ids;
  for (const json& item : items) ids.push_back(item["id"].get<int64_t>());
  return ids;
}

// The list routes answer pages: a cursor walk with a page smaller than the list visits every item exactly once, in
// id order, and ends with next_cursor null; bad paging parameters are 400s naming them.
TEST_F(ApiTest, ListsArePagedWithLimitAndCursor) {
  Fixture f = MakeFixture(*admin_, 10, 7);
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(admin_
                    ->Send(http::Method::kPost, "/api/v1/datasets?name=more" + std::to_string(i) + ".jsonl",
                           TextDataset(5), "application/octet-stream")
                    .ok());
  }
  json solo = DistributedSpec(f, 1, 1, 30);
  solo.erase("distributed");
  solo.erase("worker_selection");
  std::vector<int64_t> job_ids;
  for (int i = 0; i < 5; ++i) {
    auto job = admin_->PostJson("/api/v1/training-jobs", solo);
    ASSERT_TRUE(job.ok()) << job.status().ToString();
    job_ids.push_back((*job->Json())["id"]);
  }

  int pages = 0;
  std::vector<int64_t> workers = IdsOf(WalkPages(*admin_, "/api/v1/workers", "workers", 3, &pages));
  EXPECT_EQ(workers, f.worker_ids);
  EXPECT_EQ(pages, 3);  // 3 + 3 + 1
  std::vector<int64_t> datasets = IdsOf(WalkPages(*admin_, "/api/v1/datasets", "datasets", 2, &pages));
  EXPECT_EQ(datasets.size(), 5u);
  EXPECT_TRUE(std::is_sorted(datasets.begin(), datasets.end()));
  EXPECT_EQ(std::set<int64_t>(datasets.begin(), datasets.end()).size(), 5u);
  EXPECT_EQ(pages, 3);  // 2 + 2 + 1
  EXPECT_EQ(IdsOf(WalkPages(*admin_, "/api/v1/training-jobs", "training_jobs", 2, &pages)), job_ids);
  EXPECT_EQ(pages, 3);
  // A page exactly as long as what is left is the last one: no empty page after it.
  EXPECT_EQ(IdsOf(WalkPages(*admin_, "/api/v1/training-jobs", "training_jobs", 5, &pages)), job_ids);
  EXPECT_EQ(pages, 1);
  EXPECT_EQ(IdsOf(WalkPages(*admin_, "/api/v1/models", "models", 1, &pages)), std::vector<int64_t>{f.model_id});
  EXPECT_EQ(pages, 1);

  // The CLI's list commands read whole lists the same way.
  StatusOr<json> listed = cli::ListAll(*admin_, "/api/v1/training-jobs", "training_jobs", /*page_size=*/2);
  ASSERT_TRUE(listed.ok()) << listed.status().ToString();
  EXPECT_EQ(IdsOf(std::vector<json>(listed->begin(), listed->end())), job_ids);

  // Without limit: the default page (100), the whole of these short lists, and next_cursor null.
  const json all = *admin_->Get("/api/v1/workers")->Json();
  EXPECT_EQ(all["workers"].size(), 7u);
  EXPECT_TRUE(all["next_cursor"].is_null()) << all.dump();
  // A status filter pages the same way.
  EXPECT_EQ(WalkPages(*admin_, "/api/v1/training-jobs?status=succeeded", "training_jobs", 2, &pages).size(), 0u);

  http::ClientOptions o;
  o.base_url = server_->url();
  o.bearer_token = server_->admin_key();
  o.max_attempts = 1;
  http::Client client(o);
  const std::string metrics_path = "/api/v1/training-jobs/" + std::to_string(job_ids[0]) + "/metrics";
  for (const std::string& path : std::vector<std::string>{
           "/api/v1/workers?cursor=abc", "/api/v1/datasets?cursor=-4",
           "/api/v1/models?cursor=", "/api/v1/workers?limit=0", "/api/v1/training-jobs?limit=1001",
           "/api/v1/training-jobs?limit=ten", metrics_path + "?cursor=x1", metrics_path + "?cursor=1&after=1"}) {
    SCOPED_TRACE(path);
    auto res = client.Get(path);
    ASSERT_FALSE(res.ok());
    EXPECT_EQ(res.status().code(), StatusCode::kInvalidArgument) << res.status().ToString();
    const bool names_it =
        res.status().message().find(path.find("cursor") != std::string::npos ? "cursor" : "limit") != std::string::npos;
    EXPECT_TRUE(names_it) << res.status().message();
  }
  // The metrics follow the same convention.
  const json metrics = *admin_->Get(metrics_path)->Json();
  EXPECT_TRUE(metrics.contains("next_cursor") && metrics["next_cursor"].is_null()) << metrics.dump();
}

// Each 201 that creates a resource names its URL in Location, and that URL answers the same resource.
TEST_F(ApiTest, CreatedResourcesAnswerTheirLocation) {
  auto expect_location = [&](const StatusOr<http::ClientResponse>& res, const std::string& collection) {
    ASSERT_TRUE(res.ok()) << res.status().ToString();
    EXPECT_EQ(res->status, 201);
    const int64_t id = (*res->Json())["id"];
    auto location = res->headers.find("location");
    ASSERT_NE(location, res->headers.end()) << collection << " answered no Location";
    EXPECT_EQ(location->second, collection + "/" + std::to_string(id));
    auto got = admin_->Get(location->second);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_EQ((*got->Json())["id"], id);
  };
  auto dataset = admin_->Send(http::Method::kPost, "/api/v1/datasets?name=rows.jsonl", TextDataset(10),
                              "application/octet-stream");
  expect_location(dataset, "/api/v1/datasets");
  auto upload = admin_->Send(http::Method::kPost, "/api/v1/uploads", TinyLlamaConfig(), "application/octet-stream");
  ASSERT_TRUE(upload.ok()) << upload.status().ToString();
  auto model = admin_->PostJson("/api/v1/models",
                                {{"name", "tiny"}, {"files", {{"config.json", (*upload->Json())["upload_id"]}}}});
  expect_location(model, "/api/v1/models");
  auto worker = admin_->PostJson("/api/v1/workers", {{"name", "w0"}});
  expect_location(worker, "/api/v1/workers");
  Fixture f{.dataset_id = (*dataset->Json())["id"], .model_id = (*model->Json())["id"]};
  json solo = DistributedSpec(f, 1, 1, 30);
  solo.erase("distributed");
  solo.erase("worker_selection");
  expect_location(admin_->PostJson("/api/v1/training-jobs", solo), "/api/v1/training-jobs");
}

// A job spec with several problems is refused with all of them: one message, and error.errors listing each with the
// field it is about (the dashboard places them without splitting the message).
TEST_F(ApiTest, JobValidationListsEachProblemWithItsField) {
  Fixture f = MakeFixture(*admin_, 10, 1);
  net::Transport transport(net::TransportOptions{.max_attempts = 1});
  auto post = [&](const std::string& body) {
    auto payload = net::MemoryBody(body);
    net::Request request{
        .method = "POST",
        .url = server_->url() + "/api/v1/training-jobs",
        .headers = {{"Authorization", "Bearer " + server_->admin_key()}, {"Content-Type", "application/json"}},
        .body = payload.get()};
    auto res = transport.Perform(request);
    EXPECT_TRUE(res.ok()) << res.status().ToString();
    EXPECT_EQ(res->status, 400) << res->body;
    return json::parse(res->body, nullptr, false);
  };
  json spec = DistributedSpec(f, 2, 1, 30);
  spec["config"]["lerning_rate"] = 0.1;
  spec["config"]["lora_target_modules"] = {"q_proj", 7};
  spec["distributed"]["min_workers"] = 3;  // above max_workers (1)
  json error = post(spec.dump())["error"];
  EXPECT_EQ(error["code"], "invalid_argument");
  const json expected = json::array(
      {{{"field", "config.lora_target_modules[1]"},
        {"message", "config.lora_target_modules[1] must be a string, got number"}},
       {{"field", "config.lerning_rate"}, {"message", "unknown field config.lerning_rate"}},
       {{"field", "distributed.min_workers"},
        {"message", "distributed.min_workers (3) must be <= distributed.max_workers (1)"}},
       {{"field", "distributed.min_workers"},
        {"message", "distributed.min_workers (3) exceeds the number of workers listed in worker_selection (1)"}}});
  EXPECT_EQ(error["errors"], expected) << error.dump(2);
  std::string joined;
  for (const json& p : error["errors"]) joined += (joined.empty() ? "" : "; ") + p["message"].get<std::string>();
  EXPECT_EQ(error["message"], joined);

  // Ids that do not exist are listed the same way.
  spec = DistributedSpec(f, 2, 1, 30);
  spec["dataset_id"] = 999;
  spec["model_id"] = 998;
  error = post(spec.dump())["error"];
  EXPECT_EQ(error["errors"],
            json::array({{{"field", "dataset_id"}, {"message", "dataset_id: dataset 999 does not exist"}},
                         {{"field", "model_id"}, {"message", "model_id: model 998 does not exist"}}}))
      << error.dump(2);

  // A body that is not JSON: one problem about no one field.
  error = post("{\"name\": ")["error"];
  ASSERT_EQ(error["errors"].size(), 1u) << error.dump(2);
  EXPECT_TRUE(error["errors"][0]["field"].is_null());
  EXPECT_EQ(error["errors"][0]["message"], error["message"]);
}

// A small valid safetensors image: tensors a (F32 [2, 2]) and b (F32 [4]).
std::string TwoTensorWeights() {
  weights::WeightSet set;
  EXPECT_TRUE(set.AddZeros("a", weights::DType::kF32, {2, 2}).ok());
  EXPECT_TRUE(set.AddZeros("b", weights::DType::kF32, {4}).ok());
  const std::vector<std::byte> image = weights::SerializeSafetensors(set);
  return std::string(reinterpret_cast<const char*>(image.data()), image.size());
}

// A safetensors image of `header` text behind its length (or `claimed_length`), then `data_bytes` zero bytes.
std::string RawSafetensors(const std::string& header, size_t data_bytes, uint64_t claimed_length = 0) {
  const uint64_t length = claimed_length != 0 ? claimed_length : header.size();
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(length >> (8 * i));
  return out + header + std::string(data_bytes, '\0');
}

struct ModelCase {
  const char* name;
  std::map<std::string, std::string> files;  // path -> contents
  const char* message_part;                  // empty: registers (201) as `model_type`
  const char* model_type = "llama";
};

// distributed.partition over a platform dataset: each shard's label histogram in GET job; the label is checked against
// the dataset (required for JSONL); a record without the field fails the job naming the line.
TEST_F(ApiTest, PartitionedJobShowsEachShardsLabelHistogram) {
  Fixture f = MakeFixture(*admin_, 10, 2);
  std::string rows;
  for (int i = 0; i < 60; ++i) {
    rows += json({{"text", "row " + std::to_string(i)}, {"topic", i % 3 == 0 ? "sports" : "news"}}).dump() + "\n";
  }
  auto ds = admin_->Send(http::Method::kPost, "/api/v1/datasets?name=topics.jsonl", rows, "application/octet-stream");
  ASSERT_TRUE(ds.ok()) << ds.status().ToString();
  json spec = DistributedSpec(f, 1, 2, 30);
  spec["dataset_id"] = (*ds->Json())["id"];
  spec["distributed"]["partition"] = {{"method", "dirichlet"}, {"alpha", 0.5}};

  // JSONL: the label is required.
  auto refused = admin_->PostJson("/api/v1/training-jobs", spec);
  ASSERT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  const std::string required =
      "HTTP 400: distributed.partition.label is required for method \"dirichlet\" on dataset " +
      std::to_string((*ds->Json())["id"].get<int64_t>()) +
      " (JSONL): name the field of each record that holds its class, e.g. \"label\"";
  EXPECT_TRUE(refused.status().message().ends_with(required)) << refused.status().message();

  spec["distributed"]["partition"]["label"] = "topic";
  auto job = admin_->PostJson("/api/v1/training-jobs", spec);
  ASSERT_TRUE(job.ok()) << job.status().ToString();
  const int64_t job_id = (*job->Json())["id"];
  ASSERT_TRUE(WaitForEvent(
      *admin_, job_id, [](const std::string& t, const json&) { return t == "round_started"; },
      std::chrono::seconds(10)));
  auto got = admin_->Get("/api/v1/training-jobs/" + std::to_string(job_id));
  ASSERT_TRUE(got.ok());
  const json view = *got->Json();
  EXPECT_EQ(view["spec"]["distributed"]["partition"],
            json({{"method", "dirichlet"}, {"alpha", 0.5}, {"label", "topic"}}));
  ASSERT_EQ(view["shards"].size(), 2u) << view.dump(2);
  int64_t sports = 0, news = 0, samples = 0;
  for (size_t k = 0; k < 2; ++k) {
    const json& shard = view["shards"][k];
    EXPECT_EQ(shard["shard"], k);
    int64_t in_histogram = 0;
    for (const auto& [label, count] : shard["label_histogram"].items()) {
      EXPECT_TRUE(label == "sports" || label == "news") << label;
      in_histogram += count.get<int64_t>();
    }
    EXPECT_EQ(in_histogram, shard["train_samples"]);  // the histogram counts the training rows
    EXPECT_GE(shard["train_samples"].get<int64_t>(), 1);
    sports += shard["label_histogram"].value("sports", 0);
    news += shard["label_histogram"].value("news", 0);
    samples += shard["train_samples"].get<int64_t>() + shard["validation_samples"].get<int64_t>();
  }
  EXPECT_EQ(samples, 60);
  EXPECT_EQ(sports + news, 60 - view["shards"][0]["validation_samples"].get<int64_t>() -
                               view["shards"][1]["validation_samples"].get<int64_t>());
  // The same spec again splits the same way (seeded).
  auto twin = admin_->PostJson("/api/v1/training-jobs", spec);
  ASSERT_TRUE(twin.ok()) << twin.status().ToString();
  const int64_t twin_id = (*twin->Json())["id"];
  ASSERT_TRUE(WaitForEvent(
      *admin_, twin_id, [](const std::string& t, const json&) { return t == "round_started"; },
      std::chrono::seconds(10)));
  EXPECT_EQ((*admin_->Get("/api/v1/training-jobs/" + std::to_string(twin_id))->Json())["shards"], view["shards"]);

  // A record without the field: the job fails, naming the line.
  rows += "{\"text\": \"no topic\"}\n";
  auto bad = admin_->Send(http::Method::kPost, "/api/v1/datasets?name=gap.jsonl", rows, "application/octet-stream");
  ASSERT_TRUE(bad.ok()) << bad.status().ToString();
  spec["dataset_id"] = (*bad->Json())["id"];
  auto failing = admin_->PostJson("/api/v1/training-jobs", spec);
  ASSERT_TRUE(failing.ok()) << failing.status().ToString();
  const int64_t failing_id = (*failing->Json())["id"];
  const json failed = WaitForJobEnd(*admin_, failing_id, std::chrono::seconds(20));
  EXPECT_EQ(failed["status"], "failed");
  EXPECT_NE(failed["failure_reason"].get<std::string>().find("distributed.partition.label \"topic\" of dataset " +
                                                             std::to_string((*bad->Json())["id"].get<int64_t>()) +
                                                             ": line 61: the record has no \"topic\" field"),
            std::string::npos)
      << failed.dump(2);

  // CSV: the label must be the column the job trains on.
  auto csv = admin_->Send(http::Method::kPost, "/api/v1/datasets?name=t.csv", "a,b,label\n1,2,x\n3,4,y\n",
                          "application/octet-stream");
  ASSERT_TRUE(csv.ok()) << csv.status().ToString();
  spec["dataset_id"] = (*csv->Json())["id"];
  spec["distributed"]["partition"] = {{"method", "shards_per_worker"}, {"label", "b"}};
  auto wrong_column = admin_->PostJson("/api/v1/training-jobs", spec);
  EXPECT_EQ(wrong_column.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(wrong_column.status().message().find(
                "distributed.partition.label (\"b\") must be the column the job trains on, \"label\" "
                "(config.label_column), for dataset " +
                std::to_string((*csv->Json())["id"].get<int64_t>()) + " (CSV); leave it out to use that column"),
            std::string::npos)
      << wrong_column.status().message();

  // With data.source "workers" a partition is refused, by field.
  json local = DistributedSpec(f, 1, 2, 30);
  local.erase("dataset_id");
  local["data"] = {{"source", "workers"}, {"max_samples_per_worker", 100}};
  local["distributed"]["partition"] = {{"method", "iid"}};
  auto workers_job = admin_->PostJson("/api/v1/training-jobs", local);
  EXPECT_EQ(workers_job.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(workers_job.status().message().find("distributed.partition applies only to data.source \"platform\""),
            std::string::npos)
      << workers_job.status().message();
}

TEST_F(ApiTest, ModelRegistrationChecksConfigAndEveryWeightsFile) {
  const std::string config = TinyLlamaConfig();
  const std::string weights_file = TwoTensorWeights();
  auto config_with = [&](const std::function<void(json&)>& change) {
    json j = json::parse(config);
    change(j);
    return j.dump();
  };
  const std::string header = R"({"a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}})";
  const std::string shard1 = "model-00001-of-00002.safetensors";
  const std::string shard2 = "model-00002-of-00002.safetensors";
  weights::WeightSet second;
  ASSERT_TRUE(second.AddZeros("c", weights::DType::kF16, {3}).ok());
  const std::vector<std::byte> second_image = weights::SerializeSafetensors(second);
  const std::string second_shard(reinterpret_cast<const char*>(second_image.data()), second_image.size());
  auto index = [&](const json& weight_map) {
    return json{{"metadata", json::object()}, {"weight_map", weight_map}}.dump();
  };
  const std::string good_index = index({{"a", shard1}, {"b", shard1}, {"c", shard2}});

  const json tabular = {{"format", "parsyn-tabular"},
                        {"model_type", "mlp"},
                        {"hidden_sizes", {4}},
                        {"label_column", "label"},
                        {"feature_names", {"x0", "x1"}},
                        {"class_names", {"no", "yes"}},
                        {"standardizer", {{"mean", {0.0, 0.0}}, {"std", {1.0, 1.0}}}}};
  auto tabular_with = [&](const std::function<void(json&)>& change) {
    json j = tabular;
    change(j);
    return j.dump();
  };
  const std::vector<ModelCase> table = {
      {"valid single file", {{"config.json", config}, {"model.safetensors", weights_file}}, ""},
      {"valid shards",
       {{"config.json", config},
        {"model.safetensors.index.json", good_index},
        {shard1, weights_file},
        {shard2, second_shard}},
       ""},
      {"truncated weights",
       {{"config.json", config}, {"model.safetensors", weights_file.substr(0, weights_file.size() - 5)}},
       "model.safetensors: tensor 'b': data_offsets [16, 32] run past the end of the data section (27 bytes); the "
       "file is cut short: upload it again"},
      {"cut inside the header",
       {{"config.json", config}, {"model.safetensors", weights_file.substr(0, 30)}},
       "model.safetensors: header length"},
      {"2^62 header length",
       {{"config.json", config}, {"model.safetensors", RawSafetensors(header, 16, uint64_t{1} << 62)}},
       "model.safetensors: header length 4611686018427387904 exceeds the cap of 16777216 bytes; re-export the "
       "weights"},
      {"garbage header",
       {{"config.json", config}, {"model.safetensors", RawSafetensors("\x01garbage, not JSON at all!", 0)}},
       "model.safetensors: header is not valid JSON"},
      {"offsets past the end",
       {{"config.json", config},
        {"model.safetensors", RawSafetensors(R"({"a":{"dtype":"F32","shape":[16],"data_offsets":[0,64]}})", 16)}},
       "model.safetensors: tensor 'a': data_offsets [0, 64] run past the end of the data section (16 bytes)"},
      {"corrupt shard",
       {{"config.json", config},
        {"model.safetensors.index.json", good_index},
        {shard1, weights_file},
        {shard2, second_shard.substr(0, second_shard.size() - 1)}},
       "model-00002-of-00002.safetensors: tensor 'c'"},
      {"index names a missing shard",
       {{"config.json", config}, {"model.safetensors.index.json", good_index}, {shard1, weights_file}},
       "model.safetensors.index.json places tensors in model-00002-of-00002.safetensors, which is not among the "
       "model's files"},
      {"index names a tensor the shard lacks",
       {{"config.json", config},
        {"model.safetensors.index.json", index({{"a", shard1}, {"z", shard2}})},
        {shard1, weights_file},
        {shard2, second_shard}},
       "model.safetensors.index.json places tensor 'z' in model-00002-of-00002.safetensors, which does not contain "
       "it"},
      {"index without weight_map",
       {{"config.json", config}, {"model.safetensors.index.json", "{}"}},
       "model.safetensors.index.json: lacks a non-empty 'weight_map'"},
      {"unknown model_type",
       {{"config.json", config_with([](json& j) { j["model_type"] = "gpt2"; })}},
       "config.json: model_type 'gpt2' is not supported"},
      {"unknown architecture",
       {{"config.json", config_with([](json& j) { j["architectures"] = {"BertModel"}; })}},
       "config.json's 'architectures' entry \"BertModel\" is not supported for model_type 'llama'"},
      {"no hidden_size",
       {{"config.json", config_with([](json& j) { j.erase("hidden_size"); })}},
       "config.json lacks 'hidden_size'"},
      {"no vocab_size",
       {{"config.json", config_with([](json& j) { j.erase("vocab_size"); })}},
       "config.json lacks 'vocab_size'"},
      {"zero heads",
       {{"config.json", config_with([](json& j) { j["num_attention_heads"] = 0; })}},
       "config.json's 'num_attention_heads' must be positive, got 0"},
      {"negative layers",
       {{"config.json", config_with([](json& j) { j["num_hidden_layers"] = -2; })}},
       "config.json's 'num_hidden_layers' must be positive, got -2"},
      {"config not JSON", {{"config.json", "{nope"}}, "config.json is not valid JSON"},
      {"valid tabular model",
       {{"tabular_model.json", tabular.dump()}, {"model.safetensors", weights_file}},
       "",
       "tabular-mlp"},
      {"unknown tabular model",
       {{"tabular_model.json", tabular_with([](json& j) { j["model_type"] = "forest"; })}},
       "tabular_model.json: model_type 'forest' is not supported (mlp, logreg)"},
      {"tabular model without features",
       {{"tabular_model.json", tabular_with([](json& j) { j.erase("feature_names"); })}},
       "tabular_model.json: 'feature_names'"},
      {"tabular model with one class",
       {{"tabular_model.json", tabular_with([](json& j) { j["class_names"] = {"only"}; })}},
       "tabular_model.json: a classifier needs at least 2 classes in column 'label', got 1"},
  };
  size_t registered_files = 0;
  int registered = 0;
  for (const ModelCase& c : table) {
    SCOPED_TRACE(c.name);
    json files = json::object();
    for (const auto& [path, contents] : c.files) {
      auto up = admin_->Send(http::Method::kPost, "/api/v1/uploads", contents, "application/octet-stream");
      ASSERT_TRUE(up.ok()) << up.status().ToString();
      files[path] = (*up->Json())["upload_id"];
    }
    auto res = admin_->PostJson("/api/v1/models", {{"name", c.name}, {"files", files}});
    if (std::string(c.message_part).empty()) {
      ASSERT_TRUE(res.ok()) << res.status().ToString();
      EXPECT_EQ((*res->Json())["model_type"], c.model_type);
      ++registered;
      registered_files += c.files.size();
    } else {
      ASSERT_FALSE(res.ok());
      EXPECT_EQ(http::HttpStatusFor(res.status().code()), 400) << res.status().ToString();
      EXPECT_NE(res.status().message().find(c.message_part), std::string::npos) << res.status().message();
    }
    // Nothing of a refused model stays: no record, and its staged uploads are removed.
    EXPECT_EQ((*admin_->Get("/api/v1/models")->Json())["models"].size(), static_cast<size_t>(registered));
    size_t staged = 0;
    for (const auto& e : std::filesystem::recursive_directory_iterator(dir_.path() / "data" / "blobs" / "uploads")) {
      if (e.is_regular_file() && e.path().filename().string().find('#') == std::string::npos) ++staged;
    }
    EXPECT_EQ(staged, registered_files);
  }
}

// An upload is one model's file: a second model naming it is refused (deleting the first would have deleted the blob
// under the second, and that model's jobs would fail), and the first model keeps it.
TEST_F(ApiTest, TwoModelsNeverShareAnUpload) {
  json files = json::object();
  for (const auto& [path, contents] :
       std::vector<std::pair<std::string, std::string>>{{"config.json", TinyLlamaConfig()}}) {
    auto up = admin_->Send(http::Method::kPost, "/api/v1/uploads", contents, "application/octet-stream");
    ASSERT_TRUE(up.ok()) << up.status().ToString();
    files[path] = (*up->Json())["upload_id"];
  }
  auto first = admin_->PostJson("/api/v1/models", {{"name", "first"}, {"files", files}});
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  const int64_t first_id = (*first->Json())["id"].get<int64_t>();
  auto second = admin_->PostJson("/api/v1/models", {{"name", "second"}, {"files", files}});
  ASSERT_EQ(second.status().code(), StatusCode::kInvalidArgument) << second.status().ToString();
  EXPECT_NE(second.status().message().find("files['config.json']: upload " + files["config.json"].get<std::string>() +
                                           " is already model " + std::to_string(first_id) + "'s config.json"),
            std::string::npos)
      << second.status().message();
  // The refusal removed nothing of the first model's.
  auto got = admin_->Get("/api/v1/models/" + std::to_string(first_id));
  ASSERT_TRUE(got.ok());
  const std::filesystem::path blob =
      dir_.path() / "data" / "blobs" / "uploads" / files["config.json"].get<std::string>();
  EXPECT_TRUE(std::filesystem::exists(blob)) << blob;
  EXPECT_EQ((*admin_->Get("/api/v1/models")->Json())["models"].size(), 1u);
}

// A task's blob URLs live as long as its attempt (aggregation_timeout + 5 min), name the worker they were given to,
// and stop working once that worker is revoked. Blobs download as attachments that browsers do not sniff.
TEST_F(ApiTest, TaskBlobUrlsFollowTheAttemptAndDieWithTheirWorker) {
  Fixture f = MakeFixture(*admin_, 10, 1);
  auto job = admin_->PostJson("/api/v1/training-jobs", DistributedSpec(f, 1, 1, 30));
  ASSERT_TRUE(job.ok()) << job.status().ToString();
  auto worker = ClientWithToken(*server_, f.worker_tokens[0]);
  auto hello = worker->PostJson("/api/v1/worker/hello", {{"device", "cpu (test)"}});
  ASSERT_TRUE(hello.ok()) << hello.status().ToString();
  const std::string session = (*hello->Json())["session_id"];
  EXPECT_EQ((*hello->Json())["worker_name"], "w0");  // the registered name, which the worker's logs use
  json task;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (task.is_null() && std::chrono::steady_clock::now() < deadline) {
    auto next = worker->Get("/api/v1/worker/tasks/next?wait_ms=1000&session_id=" + session);
    ASSERT_TRUE(next.ok()) << next.status().ToString();
    if (next->status == 200) task = *next->Json();
  }
  ASSERT_FALSE(task.is_null()) << "no task within 30 s";
  const int64_t now =
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  const std::string url = task["global_weights"]["url"];
  ASSERT_EQ(url.rfind(server_->url() + "/blobs/", 0), 0u) << url;
  const std::string path = url.substr(server_->url().size());
  EXPECT_NE(path.find("worker=" + std::to_string(f.worker_ids[0]) + "&"), std::string::npos) << path;
  const int64_t expires = std::stoll(path.substr(path.find("expires=") + 8));
  EXPECT_GE(expires, now + 330 - 60) << "aggregation_timeout 30 s + 300 s";
  EXPECT_LE(expires, now + 330 + 5);
  const std::string put_url = task["update_upload"]["url"];
  EXPECT_NE(put_url.find("worker=" + std::to_string(f.worker_ids[0]) + "&"), std::string::npos) << put_url;

  http::ClientOptions o;
  o.base_url = server_->url();
  o.max_attempts = 1;
  http::Client anonymous(o);
  auto got = anonymous.Get(path);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got->headers["x-content-type-options"], "nosniff");
  const std::string key = path.substr(7, path.find('?') - 7);
  EXPECT_EQ(got->headers["content-disposition"], "attachment; filename=\"" + key.substr(key.rfind('/') + 1) + "\"");

  // The worker id is signed: another worker's id does not pass.
  std::string other = path;
  other.replace(other.find("worker=") + 7, std::to_string(f.worker_ids[0]).size(), "999");
  EXPECT_EQ(anonymous.Get(other).status().code(), StatusCode::kUnauthenticated);

  ASSERT_TRUE(admin_->Delete("/api/v1/workers/" + std::to_string(f.worker_ids[0])).ok());
  auto refused = anonymous.Get(path);
  EXPECT_EQ(refused.status().code(), StatusCode::kPermissionDenied);
  EXPECT_NE(refused.status().message().find("revoked"), std::string::npos) << refused.status().message();
}

TEST_F(ApiTest, SignedUrlsRejectTamperingAndExpiry) {
  Fixture f = MakeFixture(*admin_, 10, 1);
  auto ds = admin_->Get("/api/v1/datasets/" + std::to_string(f.dataset_id));
  ASSERT_TRUE(ds.ok());
  // The test knows the secret (it owns the data directory), so it can make URLs the server would make.
  const std::string secret = server_->signing_secret();
  auto list = std::filesystem::recursive_directory_iterator(dir_.path() / "data" / "blobs");
  std::string key;
  for (const auto& e : list) {
    std::string rel = std::filesystem::relative(e.path(), dir_.path() / "data" / "blobs").generic_string();
    if (e.is_regular_file() && rel.starts_with("datasets/") && rel.find('#') == std::string::npos) key = rel;
  }
  ASSERT_FALSE(key.empty());
  http::ClientOptions o;
  o.base_url = server_->url();
  o.max_attempts = 1;
  http::Client anonymous(o);
  const int64_t now =
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  auto good = anonymous.Get("/blobs/" + key + "?" + http::SignUrl(secret, "GET", key, now + 60));
  ASSERT_TRUE(good.ok()) << good.status().ToString();
  EXPECT_EQ(good->body, TextDataset(10));
  // The key as one percent-encoded path parameter ('/' as %2F), as a client generated from docs/openapi.yaml sends it.
  std::string encoded_key = key;
  for (size_t at = encoded_key.find('/'); at != std::string::npos; at = encoded_key.find('/', at)) {
    encoded_key.replace(at, 1, "%2F");
  }
  ASSERT_NE(encoded_key, key);
  auto encoded = anonymous.Get("/blobs/" + encoded_key + "?" + http::SignUrl(secret, "GET", key, now + 60));
  ASSERT_TRUE(encoded.ok()) << encoded.status().ToString();
  EXPECT_EQ(encoded->body, TextDataset(10));

  auto expired = anonymous.Get("/blobs/" + key + "?" + http::SignUrl(secret, "GET", key, now - 5));
  EXPECT_EQ(expired.status().code(), StatusCode::kPermissionDenied);
  EXPECT_NE(expired.status().message().find("expired"), std::string::npos);

  std::string tampered = http::SignUrl(secret, "GET", key, now + 60);
  tampered.back() = tampered.back() == 'A' ? 'B' : 'A';
  EXPECT_EQ(anonymous.Get("/blobs/" + key + "?" + tampered).status().code(), StatusCode::kUnauthenticated);
  // A GET signature does not allow a PUT, nor another key.
  EXPECT_EQ(anonymous
                .Send(http::Method::kPut, "/blobs/" + key + "?" + http::SignUrl(secret, "GET", key, now + 60), "x",
                      "application/octet-stream")
                .status()
                .code(),
            StatusCode::kUnauthenticated);
  EXPECT_EQ(anonymous.Get("/blobs/" + key + "x?" + http::SignUrl(secret, "GET", key, now + 60)).status().code(),
            StatusCode::kUnauthenticated);
}

// --- Limits ---

// A raw connection to the server, for requests a client library would not send (a header alone, a trickled body).
int ConnectTo(const ServerProcess& server) {
  const std::string& url = server.url();
  const int fd = test_support::ConnectLoopback(static_cast<uint16_t>(std::stoi(url.substr(url.rfind(':') + 1))));
  EXPECT_GE(fd, 0) << "cannot connect to " << url;
  return fd;
}

// Waits up to `limit` for an answer on `fd`, then reads it until the server closes; "" when none came.
std::string AnswerWithin(int fd, std::chrono::milliseconds limit) {
  pollfd p{fd, POLLIN, 0};
  if (::poll(&p, 1, static_cast<int>(limit.count())) <= 0) return "";
  return test_support::ReadUntilClosed(fd);
}

TEST_F(ApiTest, CredentialsAreCheckedBeforeABodyIsRead) {
  Fixture f = MakeFixture(*admin_, 10, 1);
  // Headers announcing half a MiB (under the 1 MiB JSON cap), and no body: the server must answer without waiting
  // for it (it would otherwise wait 60 s for the body before looking at the credentials).
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"POST /api/v1/training-jobs", ""},
      {"POST /api/v1/models", "Authorization: Bearer not-the-admin-key\r\n"},
      {"POST /api/v1/worker/result", "Authorization: Bearer not-a-worker-token\r\n"},
      {"POST /api/v1/worker/progress", ""},
  };
  for (const auto& [request_line, auth] : cases) {
    int fd = ConnectTo(*server_);
    const std::string header = request_line + " HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" + auth +
                               "Content-Length: 524288\r\n\r\n";
    ASSERT_GT(::send(fd, header.data(), header.size(), MSG_NOSIGNAL), 0);
    const std::string answer = AnswerWithin(fd, std::chrono::seconds(20));
    ::close(fd);
    EXPECT_TRUE(answer.starts_with("HTTP/1.1 401")) << request_line << ": " << answer;
    EXPECT_NE(answer.find("\"code\":\"unauthenticated\""), std::string::npos) << request_line << ": " << answer;
  }
  // Worker credentials are no admin credentials, also before the body.
  int fd = ConnectTo(*server_);
  const std::string header = "POST /api/v1/training-jobs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " +
                             f.worker_tokens[0] + "\r\nContent-Length: 524288\r\n\r\n";
  ASSERT_GT(::send(fd, header.data(), header.size(), MSG_NOSIGNAL), 0);
  const std::string answer = AnswerWithin(fd, std::chrono::seconds(20));
  ::close(fd);
  EXPECT_TRUE(answer.starts_with("HTTP/1.1 401")) << answer;
  EXPECT_TRUE(admin_->Get("/healthz").ok());
}

// A server with small upload and JSON limits: --upload-min-rate 64 KiB/s over 1 s windows after 3 s of grace, one
// upload at a time per worker, 64 KiB JSON bodies.
class UploadLimitsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = std::make_unique<ServerProcess>(
        dir_.path() / "data", std::vector<std::string>{"--upload-min-rate", "65536", "--upload-rate-window-ms", "1000",
                                                       "--upload-rate-grace-ms", "3000", "--max-json-bytes", "65536",
                                                       "--max-uploads-per-worker", "1"});
    admin_ = AdminClient(*server_);
  }

  // Hello, then long-polls until a task comes (bounded; null task when none did), then heartbeats every 200 ms
  // from a thread of its own until the test ends, so the worker keeps its task however long the test takes.
  json TaskFor(http::Client& worker) {
    auto hello = worker.PostJson("/api/v1/worker/hello", {{"device", "cpu (test)"}});
    EXPECT_TRUE(hello.ok()) << hello.status().ToString();
    if (!hello.ok()) return nullptr;
    const std::string session = (*hello->Json())["session_id"];
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (std::chrono::steady_clock::now() < deadline) {
      auto next = worker.Get("/api/v1/worker/tasks/next?wait_ms=1000&session_id=" + session);
      if (!next.ok()) return nullptr;
      if (next->status == 200) {
        std::lock_guard lock(mu_);
        heartbeats_.emplace_back([&worker, session](std::stop_token stop) {
          while (!stop.stop_requested()) {
            worker.PostJson("/api/v1/worker/heartbeat", {{"session_id", session}}).status().IgnoreError();
            std::this_thread::sleep_for(std::chrono::milliseconds(200));
          }
        });
        return *next->Json();
      }
    }
    return nullptr;
  }
  void TearDown() override {
    std::lock_guard lock(mu_);
    heartbeats_.clear();  // stops and joins them before the clients go
  }

  TempDir dir_;
  std::unique_ptr<ServerProcess> server_;
  std::unique_ptr<http::Client> admin_;
  std::unique_ptr<http::Client> a_;
  std::unique_ptr<http::Client> b_;
  std::mutex mu_;
  std::vector<std::jthread> heartbeats_;
};

TEST_F(UploadLimitsTest, JsonBodiesAreCappedAtMaxJsonBytes) {
  const std::string big = json{{"name", std::string(70'000, 'x')}}.dump();
  auto res = admin_->Send(http::Method::kPost, "/api/v1/models", big, "application/json");
  EXPECT_EQ(res.status().code(), StatusCode::kResourceExhausted) << res.status().ToString();
  EXPECT_NE(res.status().message().find("exceeds the limit of 65536 bytes"), std::string::npos)
      << res.status().message();
}

TEST_F(UploadLimitsTest, ASlowUploadIsCutWhileOthersSucceedAndARetrySupersedesAHeldUpload) {
  Fixture f = MakeFixture(*admin_, 20, 2);
  // Members, not locals: the heartbeat threads use them until TearDown.
  a_ = ClientWithToken(*server_, f.worker_tokens[0]);
  b_ = ClientWithToken(*server_, f.worker_tokens[1]);
  http::Client* a = a_.get();
  http::Client* b = b_.get();
  auto job = admin_->PostJson("/api/v1/training-jobs", DistributedSpec(f, 1, 2, 120));
  ASSERT_TRUE(job.ok()) << job.status().ToString();
  json task_a;
  json task_b;
  std::thread poll_b([&] { task_b = TaskFor(*b); });
  task_a = TaskFor(*a);
  poll_b.join();
  ASSERT_FALSE(task_a.is_null());
  ASSERT_FALSE(task_b.is_null());
  http::ClientOptions o;
  o.max_attempts = 1;
  http::Client blobs(o);
  auto global = blobs.Get(task_a["global_weights"]["url"].get<std::string>());
  ASSERT_TRUE(global.ok()) << global.status().ToString();
  const std::string update = global->body;  // the global itself is a valid update
  const std::string url_a = task_a["update_upload"]["url"];
  const std::string key_a = task_a["update_upload"]["blob_key"];

  // Worker A starts a PUT and trickles it at ~400 B/s (never the last byte).
  int slow = ConnectTo(*server_);
  const std::string target = url_a.substr(server_->url().size());
  const std::string header = "PUT " + target + " HTTP/1.1\r\nHost: x\r\nContent-Type: application/octet-stream\r\n" +
                             "Content-Length: " + std::to_string(update.size()) + "\r\n\r\n";
  ASSERT_GT(::send(slow, header.data(), header.size(), MSG_NOSIGNAL), 0);
  size_t sent = 0;
  auto trickle = [&](std::chrono::milliseconds how_long) {
    const auto until = std::chrono::steady_clock::now() + how_long;
    while (std::chrono::steady_clock::now() < until) {
      const size_t n = std::min<size_t>(20, update.size() - 1 - sent);
      if (n > 0 && ::send(slow, update.data() + sent, n, MSG_NOSIGNAL) > 0) sent += n;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  };
  trickle(std::chrono::milliseconds(500));

  const int64_t now =
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  // A second upload by worker A, to another open key (a URL the test signs for A): over A's cap of 1, 429.
  const std::string key_b = task_b["update_upload"]["blob_key"];
  auto over = blobs.Send(
      http::Method::kPut,
      coordinator::SignedBlobUrl(server_->signing_secret(), server_->url(), "PUT", key_b, now + 60, f.worker_ids[0]),
      update, "application/octet-stream");
  EXPECT_EQ(over.status().code(), StatusCode::kResourceExhausted) << over.status().ToString();
  EXPECT_NE(over.status().message().find("uploads in progress, the most allowed at once (1)"), std::string::npos)
      << over.status().message();

  // Worker B's upload is not held up by A's.
  auto put_b = blobs.Send(http::Method::kPut, task_b["update_upload"]["url"].get<std::string>(), update,
                          "application/octet-stream");
  ASSERT_TRUE(put_b.ok()) << put_b.status().ToString();
  EXPECT_EQ((*put_b->Json())["size_bytes"], update.size());

  // A's body, far under 64 KiB/s, is cut after the grace and a window, with an answer that says why.
  std::string cut;
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (cut.empty() && std::chrono::steady_clock::now() < give_up) {
    trickle(std::chrono::milliseconds(100));
    cut = AnswerWithin(slow, std::chrono::milliseconds(1));
  }
  ::close(slow);
  EXPECT_TRUE(cut.starts_with("HTTP/1.1 504")) << cut;
  EXPECT_NE(cut.find("below the minimum of 65536 bytes/s"), std::string::npos) << cut;

  // Nothing partial was kept: the key is empty.
  auto partial = blobs.Get(server_->url() + "/blobs/" + key_a + "?" +
                           http::SignUrl(server_->signing_secret(), "GET", key_a, now + 60));
  EXPECT_EQ(partial.status().code(), StatusCode::kNotFound) << partial.status().ToString();

  // A's retry while the server still holds an earlier PUT to the same key (half-open: it never finishes): the newer
  // PUT supersedes it. The earlier connection is closed without an answer, and the retry stores the update.
  slow = ConnectTo(*server_);
  ASSERT_GT(::send(slow, header.data(), header.size(), MSG_NOSIGNAL), 0);
  sent = 0;
  trickle(std::chrono::milliseconds(300));
  auto retry = blobs.Send(http::Method::kPut, url_a, update, "application/octet-stream");
  ASSERT_TRUE(retry.ok()) << retry.status().ToString();
  EXPECT_EQ(retry->status, 201);
  EXPECT_EQ((*retry->Json())["size_bytes"], update.size());
  const std::string superseded = AnswerWithin(slow, std::chrono::milliseconds(5000));
  EXPECT_FALSE(superseded.starts_with("HTTP/1.1 2")) << superseded;
  ::close(slow);
  EXPECT_EQ((*retry->Json())["sha256"], Sha256Hex(update));
}

// The soft and hard open-files limits of process `pid`, from /proc/PID/limits.
std::pair<uint64_t, uint64_t> OpenFilesLimitOf(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/limits");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("Max open files", 0) != 0) continue;
    std::istringstream fields(line.substr(std::string("Max open files").size()));
    uint64_t soft = 0, hard = 0;
    fields >> soft >> hard;
    return {soft, hard};
  }
  return {0, 0};
}

// Out of file descriptors: the server raised its soft limit to the hard one at start; with the limit then cut
// below the connections it is asked to hold, the connections beyond are refused with a 503 that says why, counted in
// /healthz, and the server serves again once connections close.
TEST(FdExhaustionTest, ConnectionsBeyondTheLimitAreRefusedCountedAndServedOnceSomeClose) {
  TempDir dir;
  rlimit ours{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &ours), 0);
  // Start it under a low soft limit (inherited), to see it raise its own.
  rlimit low = ours;
  low.rlim_cur = std::min<rlim_t>(ours.rlim_max, 256);
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &low), 0);
  ServerProcess server(dir.path() / "data");
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &ours), 0);
  ASSERT_TRUE(server.running());
  const auto [soft, hard] = OpenFilesLimitOf(server.pid());
  EXPECT_EQ(soft, hard);

  // Cut its limit to what it holds now plus a few connections.
  size_t open_now = 0;
  for ([[maybe_unused]] const auto& fd :
       std::filesystem::directory_iterator("/proc/" + std::to_string(server.pid()) + "/fd")) {
    ++open_now;
  }
  constexpr size_t kSpare = 6;
  constexpr int kConnections = 30;
  const rlimit cut{.rlim_cur = open_now + kSpare, .rlim_max = open_now + kSpare};
  ASSERT_EQ(::prlimit(server.pid(), RLIMIT_NOFILE, &cut, nullptr), 0);
  const uint16_t port = static_cast<uint16_t>(std::stoi(server.url().substr(server.url().rfind(':') + 1)));
  std::vector<int> fds;
  for (int i = 0; i < kConnections; ++i) {
    const int fd = test_support::ConnectLoopback(port);  // the kernel completes it; the server may not accept it
    ASSERT_GE(fd, 0);
    fds.push_back(fd);
  }
  // The connections it cannot hold get the 503 and are closed (bounded wait for the first of them).
  std::string refusal;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (refusal.empty() && std::chrono::steady_clock::now() < deadline) {
    for (int fd : fds) {
      pollfd p{.fd = fd, .events = POLLIN, .revents = 0};
      if (::poll(&p, 1, 0) == 1) {
        refusal = test_support::ReadUntilClosed(fd);
        if (!refusal.empty()) break;
      }
    }
    if (refusal.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_NE(refusal.find("HTTP/1.1 503"), std::string::npos) << refusal;
  EXPECT_NE(refusal.find("out of file descriptors"), std::string::npos) << refusal;
  EXPECT_NE(refusal.find("ulimit -n"), std::string::npos) << refusal;

  // Once the clients go, the server answers again, and /healthz counts the refusals.
  for (int fd : fds) ::close(fd);
  http::ClientOptions o;
  o.base_url = server.url();
  o.max_attempts = 10;  // GET: retried while the server is still closing the idle connections
  http::Client anonymous(o);
  auto health = anonymous.Get("/healthz");
  ASSERT_TRUE(health.ok()) << health.status().ToString();
  const json body = *health->Json();
  EXPECT_EQ(body["status"], "ok");
  EXPECT_GE(body["accept_failures_fd_exhausted"].get<int64_t>(), 1);
  EXPECT_GT(body["last_accept_failure_fd_exhausted_at_ms"].get<int64_t>(), 0);
}

}  // namespace
}  // namespace parsyn::testing
