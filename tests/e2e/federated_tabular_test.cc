// A federated tabular job: an MLP on a separable CSV with two real `parsyn worker` processes. The starting model
// folder comes from `parsyn model init --architecture mlp --data CSV` (standardisation and classes from the whole
// file) and is registered as a tabular model; every worker trains that same model on its shard, all weights are
// FedAvg'ed (use_peft false), and the final model, as a user downloads it, classifies held-out rows.
// Also the ordinary one-worker job (no `distributed`, or enabled false), tabular and LoRA: config.epochs passes over
// all the training data, with progress, the final validation loss and the result as artifacts.
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <sstream>

#include <libpq-fe.h>

#include "base/sha256.h"
#include "base/subprocess.h"
#include "base/testing/build_paths.h"
#include "base/testing/missing_dependency.h"
#include "llama_fixture.h"
#include "storage/postgres_for_test.h"

namespace parsyn::e2e {
namespace {

// Rows x1,x2 in [-1, 1) with label x1 + x2 > 0, from a generator other than WriteSeparableCsv's (so none of these
// rows is a training row).
void WriteHeldOutCsv(const fs::path& file, int rows) {
  std::ofstream out(file);
  out << "x1,x2,label\n";
  uint64_t state = 987654321;
  auto next = [&] {
    state = state * 2862933555777941757ULL + 3037000493ULL;
    return static_cast<double>(state >> 11) / static_cast<double>(1ULL << 53) * 2.0 - 1.0;
  };
  for (int i = 0; i < rows; ++i) {
    const double x1 = next(), x2 = next();
    out << x1 << "," << x2 << "," << (x1 + x2 > 0 ? 1 : 0) << "\n";
  }
}

// The Llama fixture's server, workers and FedAvg check, with a tabular model and CSV dataset instead.
class TabularJobTest : public LlamaJobTest {
 protected:
  void SetUp() override { ASSERT_NO_FATAL_FAILURE(StartTabularMlpServer()); }

  json MlpSpec(const std::vector<int64_t>& worker_ids, int rounds, int steps) const {
    json spec = TabularJobSpec("e2e-tabular", dataset_id_, model_id_, worker_ids, rounds, steps);
    spec["config"]["hidden_sizes"] = {16};  // the folder fixes the layers: ignored, with a warning
    return spec;
  }
};

// The same server on PostgreSQL (`--metadata postgres://...`, a database of the test's own server).
class PostgresTabularJobTest : public TabularJobTest {
 protected:
  void SetUp() override {
    if (std::optional<std::string> why = storage::PostgresUnavailableReason()) PARSYN_SKIP_FOR_MISSING_DEPENDENCY(*why);
    StatusOr<storage::PostgresForTest*> server = storage::SharedPostgres();
    ASSERT_TRUE(server.ok()) << server.status().ToString();
    StatusOr<std::string> url = (*server)->NewDatabase();
    ASSERT_TRUE(url.ok()) << url.status().ToString();
    metadata_url_ = *url;
    // A short lease: the restarted server waits, as a standby, for its killed predecessor's lease to expire (the
    // default 10 s would be most of the test).
    server_flags_.insert(server_flags_.end(), {"--metadata", metadata_url_, "--leader-lease-ms", "2000"});
    TabularJobTest::SetUp();
  }

  // The first column of the first row of `sql` on the job's database, as another client reads it.
  std::string QueryDatabase(const std::string& sql) const {
    PGconn* conn = PQconnectdb(metadata_url_.c_str());
    std::string out = "<" + std::string(PQerrorMessage(conn)) + ">";
    if (PQstatus(conn) == CONNECTION_OK) {
      PGresult* r = PQexec(conn, sql.c_str());
      out = PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) > 0 ? PQgetvalue(r, 0, 0)
                                                                     : "<" + std::string(PQresultErrorMessage(r)) + ">";
      PQclear(r);
    }
    PQfinish(conn);
    return out;
  }

  std::string metadata_url_;
};

// A federated job whose coordinator is killed after round 1 and started again: every record lives in PostgreSQL
// (no metadata.db), the job resumes at its last committed round and ends as the uninterrupted run would.
TEST_F(PostgresTabularJobTest, JobSurvivesACoordinatorKillWithItsRecordsInPostgres) {
  std::vector<int64_t> ids = StartWorkers(2);
  const int kRounds = 3;
  const int64_t job_id = CreateJob(*admin_, MlpSpec(ids, kRounds, 10));
  ASSERT_GT(job_id, 0);
  ASSERT_TRUE(WaitForEvent(
      *admin_, job_id,
      [&](const std::string& type, const json& d) { return type == "round_committed" && d.value("round", 0) == 1; },
      std::chrono::seconds(300)));
  server_->Kill();
  server_->Start();  // same flags: the same PostgreSQL database; the workers reconnect on their own
  json job = WaitForJobEnd(*admin_, job_id, std::chrono::seconds(300));
  ASSERT_EQ(job.value("status", ""), "succeeded") << job.dump(2);
  EXPECT_EQ(ExpectGlobalsAreFedAvg(job_id), kRounds);

  EXPECT_FALSE(fs::exists(server_->data_dir() / "metadata.db"));
  const std::string id = std::to_string(job_id);
  EXPECT_EQ(QueryDatabase("SELECT status FROM jobs WHERE id = " + id), "succeeded");
  EXPECT_EQ(QueryDatabase("SELECT count(*) FROM rounds WHERE status = 'committed' AND job_id = " + id),
            std::to_string(kRounds));
  EXPECT_EQ(QueryDatabase("SELECT count(*) FROM round_updates WHERE status = 'accepted' AND job_id = " + id),
            std::to_string(2 * kRounds));
  EXPECT_EQ(QueryDatabase("SELECT count(*) >= 1 FROM job_events WHERE type = 'job_resumed' AND job_id = " + id), "t");
  for (auto& w : workers_) EXPECT_EQ(w->Terminate(), 0) << w->log();
}

bool Contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// `--metadata` takes a path, sqlite://, postgres:// or postgresql://; anything else, or a database that cannot be
// reached, stops the server with a message saying so (and never the password).
TEST(MetadataFlagTest, ServerRefusesAnUnknownSchemeAndNamesAnUnreachableDatabase) {
  TempDir tmp;
  CommandResult unknown = RunParsyn({"server", "--data-dir", (tmp.path() / "a").string(), "--listen", "127.0.0.1:0",
                                     "--metadata", "mysql://u:s3cret-pw@db/parsyn"});
  EXPECT_NE(unknown.exit_code, 0) << unknown.output;
  EXPECT_TRUE(Contains(unknown.output, "scheme 'mysql' is not supported")) << unknown.output;
  EXPECT_TRUE(Contains(unknown.output, "postgres://USER:PASSWORD@HOST:PORT/DATABASE")) << unknown.output;
  EXPECT_FALSE(Contains(unknown.output, "s3cret-pw")) << unknown.output;

  const std::string where = "127.0.0.1:" + std::to_string(FreePort());  // nothing listens there
  CommandResult unreachable = RunParsyn({"server", "--data-dir", (tmp.path() / "b").string(), "--listen", "127.0.0.1:0",
                                         "--metadata", "postgres://u:s3cret-pw@" + where + "/parsyn"});
  EXPECT_NE(unreachable.exit_code, 0) << unreachable.output;
  EXPECT_TRUE(Contains(unreachable.output, "cannot connect to the PostgreSQL metadata store at " + where))
      << unreachable.output;
  EXPECT_FALSE(Contains(unreachable.output, "s3cret-pw")) << unreachable.output;
}

TEST_F(TabularJobTest, RegistersTheFolderAsATabularModel) {
  StatusOr<http::ClientResponse> model = admin_->Get("/api/v1/models/" + std::to_string(model_id_));
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  EXPECT_EQ((*model->Json())["model_type"], "tabular-mlp") << model->body;
}

// The folder fixes the layers and the label column: the job's own say is ignored, and the create answer says so.
TEST_F(TabularJobTest, WarnsAboutConfigKeysTheTabularModelFixes) {
  json spec = MlpSpec({RegisterWorker(*admin_, "w-idle").id}, 1, 5);
  spec.erase("distributed");
  spec["config"]["label_column"] = "x2";
  spec["config"]["max_seq_len"] = 64;
  StatusOr<http::ClientResponse> job = admin_->PostJson("/api/v1/training-jobs", spec);
  ASSERT_TRUE(job.ok()) << job.status().ToString();
  const std::string model = "model " + std::to_string(model_id_);
  const json expected = {
      "config.hidden_sizes is ignored: " + model + " is a tabular model whose tabular_model.json fixes its layers",
      "config.label_column (\"x2\") is ignored: " + model +
          "'s tabular_model.json names the label column \"label\", which the workers train on",
      "config.max_seq_len is ignored: " + model + " is a tabular model (max_seq_len applies to language models)"};
  EXPECT_EQ((*job->Json())["warnings"], expected) << job->body;
}

TEST_F(TabularJobTest, RefusesAJobPairingTheTabularModelWithTextData) {
  WriteLearnableText(tmp_.path() / "text.jsonl", 20);
  const int64_t text_dataset = UploadDataset(*admin_, tmp_.path() / "text.jsonl");
  json spec = MlpSpec({RegisterWorker(*admin_, "w-text").id}, 1, 5);
  spec["dataset_id"] = text_dataset;
  StatusOr<http::ClientResponse> job = admin_->PostJson("/api/v1/training-jobs", spec);
  ASSERT_FALSE(job.ok());
  EXPECT_EQ(job.status().code(), StatusCode::kInvalidArgument) << job.status().ToString();
  EXPECT_NE(job.status().message().find("model " + std::to_string(model_id_) + " is a tabular model but dataset " +
                                        std::to_string(text_dataset) + " is text"),
            std::string::npos)
      << job.status().message();
}

TEST_F(TabularJobTest, TwoWorkersTrainAnMlpThatClassifiesHeldOutRows) {
  const auto started = std::chrono::steady_clock::now();
  std::vector<int64_t> ids = StartWorkers(2);
  const int kRounds = 3;
  const int64_t job_id = CreateJob(*admin_, MlpSpec(ids, kRounds, 30));
  ASSERT_GT(job_id, 0);
  json job = WaitForJobEnd(*admin_, job_id, std::chrono::seconds(300));
  ASSERT_EQ(job.value("status", ""), "succeeded") << job.dump(2);

  int committed = 0;
  std::string losses;
  for (const json& r : Rounds(*admin_, job_id)) {
    if (r["outcome"] != "committed" || r["round"].get<int>() < 1) continue;
    committed++;
    int accepted = 0;
    for (const json& u : r["updates"]) accepted += u["status"] == "accepted";
    EXPECT_EQ(accepted, 2) << r.dump();
    if (r["train_loss"].is_number()) losses += std::to_string(r["train_loss"].get<double>()) + " ";
  }
  EXPECT_EQ(committed, kRounds);
  EXPECT_EQ(ExpectGlobalsAreFedAvg(job_id), kRounds);

  // The final model as a user assembles it: the registered folder's tabular_model.json with the job's weights.
  const fs::path final_model = tmp_.path() / "final-model";
  fs::create_directories(final_model);
  fs::copy_file(tmp_.path() / "model" / "tabular_model.json", final_model / "tabular_model.json");
  StatusOr<uint64_t> got =
      admin_->DownloadToFile("/api/v1/training-jobs/" + std::to_string(job_id) + "/artifacts/model.safetensors",
                             final_model / "model.safetensors");
  ASSERT_TRUE(got.ok()) << got.status().ToString();

  // An evaluation-only task on rows none of the workers saw: half of them form its validation slice.
  WriteHeldOutCsv(tmp_.path() / "held-out.csv", 200);
  json result = RunEvaluationTask(
      tmp_.path(), {{"model_dir", final_model.string()},
                    {"data", (tmp_.path() / "held-out.csv").string()},
                    {"config", {{"use_peft", false}, {"validation_fraction", 0.5}, {"batch_size", 50}}}});
  ASSERT_TRUE(result["validation_before"].is_object()) << result.dump();
  const double accuracy = result["validation_before"].value("accuracy", 0.0);
  EXPECT_GE(result["validation_before"].value("num_examples", 0), 100) << result.dump();
  EXPECT_GE(accuracy, 0.9) << result.dump();

  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  std::printf("[figures] tabular mlp: rounds %d, train loss per round: %s, held-out accuracy %.3f, wall %.1f s\n",
              committed, losses.c_str(), accuracy, seconds);
  for (auto& w : workers_) EXPECT_EQ(w->Terminate(), 0) << w->log();
}

// Finds `program` on PATH (Debian's prometheus package puts promtool and prometheus in /usr/bin); "" if absent.
std::string FindProgram(const std::string& program) {
  const char* path = std::getenv("PATH");
  std::istringstream dirs(path ? path : "/usr/bin:/bin");
  for (std::string dir; std::getline(dirs, dir, ':');) {
    const fs::path candidate = fs::path(dir) / program;
    if (::access(candidate.c_str(), X_OK) == 0) return candidate.string();
  }
  return "";
}

std::string FileText(const fs::path& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// After a tabular job, /metrics passes `promtool check metrics` (Debian's prometheus package), and a real prometheus
// server scraping it on loopback reports the job's committed rounds through its query API.
TEST_F(TabularJobTest, PrometheusScrapesTheRoundCounter) {
  const std::string promtool = FindProgram("promtool"), prometheus = FindProgram("prometheus");
  if (promtool.empty() || prometheus.empty()) {
    PARSYN_SKIP_FOR_MISSING_DEPENDENCY(
        "promtool or prometheus is not installed (Debian package prometheus; ./dev setup installs it)");
  }
  std::vector<int64_t> ids = StartWorkers(2);
  const int kRounds = 2;
  const int64_t job_id = CreateJob(*admin_, MlpSpec(ids, kRounds, 10));
  ASSERT_GT(job_id, 0);
  json job = WaitForJobEnd(*admin_, job_id, std::chrono::seconds(300));
  ASSERT_EQ(job.value("status", ""), "succeeded") << job.dump(2);

  StatusOr<http::ClientResponse> scraped = admin_->Get("/metrics");
  ASSERT_TRUE(scraped.ok()) << scraped.status().ToString();
  const std::string& text = scraped->body;
  EXPECT_NE(text.find("parsyn_rounds_total{outcome=\"committed\"} " + std::to_string(kRounds) + "\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("parsyn_updates_accepted_total " + std::to_string(2 * kRounds) + "\n"), std::string::npos)
      << text;
  EXPECT_NE(text.find("parsyn_jobs{status=\"succeeded\"} 1\n"), std::string::npos) << text;
  EXPECT_NE(text.find("parsyn_round_duration_seconds_count " + std::to_string(kRounds) + "\n"), std::string::npos)
      << text;
  EXPECT_NE(text.find("parsyn_round_phase_duration_seconds_count{phase=\"commit\"} " + std::to_string(kRounds)),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("parsyn_workers_connected{kind=\"own\",status=\"online\"} 2\n"), std::string::npos) << text;
  EXPECT_NE(text.find("route=\"/api/v1/worker/tasks/next\""), std::string::npos) << text;
  // The job's blob bytes each way: every update went up within a round; down, the rounds' downloads and the final
  // evaluation's global.
  const auto counter = [&](const std::string& series) {
    const size_t at = text.find(series + " ");
    return at == std::string::npos ? -1.0 : std::stod(text.substr(at + series.size() + 1));
  };
  StatusOr<http::ClientResponse> listed = admin_->Get("/api/v1/training-jobs/" + std::to_string(job_id) + "/rounds");
  ASSERT_TRUE(listed.ok()) << listed.status().ToString();
  StatusOr<json> rounds = listed->Json();
  ASSERT_TRUE(rounds.ok()) << listed->body;
  double down = 0, up = 0;
  for (const json& r : (*rounds)["rounds"]) {
    down += r["bytes_down"].get<double>();
    up += r["bytes_up"].get<double>();
  }
  EXPECT_GT(up, 0);
  EXPECT_EQ(counter("parsyn_job_blob_bytes_total{direction=\"up\"}"), up) << text;
  EXPECT_GE(counter("parsyn_job_blob_bytes_total{direction=\"down\"}"), down) << text;
  EXPECT_GT(down, 0);

  // promtool's exposition and lint checks.
  const fs::path exposition = tmp_.path() / "metrics.txt";
  { std::ofstream(exposition) << text; }
  const fs::path promtool_out = tmp_.path() / "promtool.out";
  StatusOr<Subprocess> check =
      Subprocess::Start("/bin/sh", {"-c", "\"$0\" check metrics < \"$1\"", promtool, exposition.string()},
                        {.output = SubprocessOptions::Output::kFile, .output_file = promtool_out});
  ASSERT_TRUE(check.ok()) << check.status().ToString();
  EXPECT_EQ(check->Wait(), 0) << FileText(promtool_out);

  // A real prometheus scraping the server every second, asked through its HTTP API.
  const fs::path prom_dir = tmp_.path() / "prometheus";
  fs::create_directories(prom_dir / "data");
  const std::string target = server_->url().substr(server_->url().find("//") + 2);
  {
    std::ofstream config(prom_dir / "prometheus.yml");
    config << "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
           << "scrape_configs:\n  - job_name: parsyn\n    static_configs:\n      - targets: ['" << target << "']\n";
  }
  const int prom_port = FreePort();
  StatusOr<Subprocess> prom = Subprocess::Start(
      prometheus,
      {"--config.file=" + (prom_dir / "prometheus.yml").string(), "--storage.tsdb.path=" + (prom_dir / "data").string(),
       "--web.listen-address=127.0.0.1:" + std::to_string(prom_port)},
      {.output = SubprocessOptions::Output::kFile, .output_file = prom_dir / "prometheus.log"});
  ASSERT_TRUE(prom.ok()) << prom.status().ToString();
  http::ClientOptions options;
  options.base_url = "http://127.0.0.1:" + std::to_string(prom_port);
  http::Client prom_api(options);
  const std::string query = "/api/v1/query?query=sum(parsyn_rounds_total%7Boutcome%3D%22committed%22%7D)";
  std::string last;
  double rounds_seen = -1;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (std::chrono::steady_clock::now() < deadline && rounds_seen < kRounds) {
    StatusOr<http::ClientResponse> answer = prom_api.Get(query);
    if (answer.ok()) {
      last = answer->body;
      json body = json::parse(answer->body, nullptr, false);
      if (body.is_object() && body["status"] == "success" && !body["data"]["result"].empty()) {
        rounds_seen = std::stod(body["data"]["result"][0]["value"][1].get<std::string>());
      }
    } else {
      last = answer.status().ToString();
    }
    if (rounds_seen < kRounds) std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
  EXPECT_EQ(rounds_seen, kRounds) << "last answer: " << last << "\nprometheus log:\n"
                                  << FileText(prom_dir / "prometheus.log");
  prom->Terminate();
  prom->Wait();
  for (auto& w : workers_) EXPECT_EQ(w->Terminate(), 0) << w->log();
}

// The product spec's example numbers: 3 selected workers, min_workers 2, max_workers 5. Every round must train all
// three: the last reporter of a round is still busy when the next round could start with the other two, and the
// round waits for it (the join window) instead of leaving a third of the workers idle.
TEST_F(TabularJobTest, SpecExampleThreeWorkersWithMinTwoTrainInEveryRound) {
  std::vector<int64_t> ids = StartWorkers(3);
  const int kRounds = 4;
  json spec = MlpSpec(ids, kRounds, 10);
  spec["distributed"]["min_workers"] = 2;
  spec["distributed"]["max_workers"] = 5;
  const int64_t job_id = CreateJob(*admin_, spec);
  ASSERT_GT(job_id, 0);
  json job = WaitForJobEnd(*admin_, job_id, std::chrono::seconds(300));
  ASSERT_EQ(job.value("status", ""), "succeeded") << job.dump(2);
  std::string per_round;
  int committed = 0;
  for (const json& r : Rounds(*admin_, job_id)) {
    if (r["outcome"] != "committed" || r["round"].get<int>() < 1) continue;
    committed++;
    int accepted = 0;
    for (const json& u : r["updates"]) accepted += u["status"] == "accepted";
    EXPECT_EQ(accepted, 3) << "round " << r["round"] << " did not train every selected worker: " << r.dump();
    per_round += std::to_string(accepted) + " ";
  }
  EXPECT_EQ(committed, kRounds);
  std::printf("[figures] 3 workers, min_workers 2: participants per round: %s\n", per_round.c_str());
  for (auto& w : workers_) EXPECT_EQ(w->Terminate(), 0) << w->log();
}

// What a finished one-worker job shows: one committed round with one accepted update of `expected_steps` optimizer
// steps, progress points of that round, and the final global's validation loss (the evaluation after the last round).
// Returns {validation loss of the initial global, of the final one}.
std::pair<double, double> ExpectOneWorkerJobTrained(http::Client& admin, int64_t job_id, int64_t expected_steps) {
  json job = WaitForJobEnd(admin, job_id, std::chrono::seconds(300));
  EXPECT_EQ(job.value("status", ""), "succeeded") << job.dump(2);
  EXPECT_EQ(job["total_rounds"], 1) << job.dump(2);
  EXPECT_EQ(job["committed_round"], 1) << job.dump(2);
  // The job view names each loss by the weights it measured: the starting weights, and after round 1 (the last).
  EXPECT_TRUE(job["initial_validation_loss"].is_number()) << job.dump(2);
  const double initial_loss = job.value("initial_validation_loss", -1.0);
  int committed = 0;
  for (const json& r : Rounds(admin, job_id)) {
    if (r["outcome"] != "committed" || r["round"] != 1) continue;
    committed++;
    EXPECT_EQ(r["updates"].size(), 1u) << r.dump();
    for (const json& u : r["updates"]) {
      EXPECT_EQ(u["status"], "accepted") << u.dump();
      EXPECT_EQ(u["metrics"].value("steps", -1), expected_steps) << u.dump();
    }
    EXPECT_EQ(r["validation_loss"], job["final_validation_loss"]) << "round 1's loss is the loss after round 1";
  }
  EXPECT_EQ(committed, 1);

  StatusOr<http::ClientResponse> metrics = admin.Get("/api/v1/training-jobs/" + std::to_string(job_id) + "/metrics");
  EXPECT_TRUE(metrics.ok()) << metrics.status().ToString();
  size_t points = 0;
  // Held in a variable: a range-for over a member of the temporary StatusOr would read freed memory.
  json by_worker;
  if (StatusOr<json> parsed = metrics.ok() ? metrics->Json() : metrics.status(); parsed.ok()) by_worker = *parsed;
  if (by_worker.is_object()) {
    for (const json& w : by_worker["workers"]) {
      for (const json& p : w["points"]) {
        points++;
        EXPECT_EQ(p["round"], 1) << p.dump();
        EXPECT_GE(p["step"].get<int64_t>(), 1) << p.dump();
        EXPECT_LE(p["step"].get<int64_t>(), expected_steps) << p.dump();
      }
    }
  }
  EXPECT_GT(points, 0u) << "no progress was reported: " << by_worker.dump();

  std::optional<double> final_loss;
  WaitForEvent(
      admin, job_id,
      [&](const std::string& type, const json& data) {
        if (type == "global_evaluated" && data.value("global_round", -1) == 1 && data["validation_loss"].is_number()) {
          final_loss = data["validation_loss"].get<double>();
        }
        return final_loss.has_value();
      },
      std::chrono::seconds(30));
  EXPECT_TRUE(final_loss.has_value()) << "no validation loss of the final model was recorded";
  return {initial_loss, final_loss.value_or(-1)};
}

// The dashboard form's default ({"enabled": false}) and a body without `distributed` are the same job: one worker,
// one round of config.epochs passes over all the training data.
TEST_F(TabularJobTest, OneWorkerJobsTrainConfigEpochsPasses) {
  std::vector<int64_t> ids = StartWorkers(1);
  for (const bool distributed_given : {false, true}) {
    SCOPED_TRACE(distributed_given ? "distributed {enabled: false}" : "no distributed");
    json spec = MlpSpec(ids, 1, 0);
    if (distributed_given) {
      spec["distributed"] = {{"enabled", false}};
    } else {
      spec.erase("distributed");
    }
    spec["config"]["epochs"] = 3;
    // config.epochs counts here; what the coordinator does say is about the tabular model's fixed layers.
    const std::string warning = "config.hidden_sizes is ignored: model " + std::to_string(model_id_) +
                                " is a tabular model whose tabular_model.json fixes its layers";
    int64_t job_id = 0;
    if (distributed_given) {
      // Through `parsyn job create`, which prints the warnings after the created line.
      const fs::path file = tmp_.path() / "solo-job.json";
      std::ofstream(file) << spec.dump();
      CommandResult create = RunParsyn(
          {"job", "create", "-f", file.string(), "--server", server_->url(), "--api-key", server_->admin_key()});
      ASSERT_EQ(create.exit_code, 0) << create.output;
      EXPECT_NE(create.output.find("warning: " + warning + "\n"), std::string::npos) << create.output;
      long long created_id = 0;
      ASSERT_EQ(std::sscanf(create.output.c_str(), "created training job %lld", &created_id), 1) << create.output;
      job_id = created_id;
    } else {
      StatusOr<http::ClientResponse> created = admin_->PostJson("/api/v1/training-jobs", spec);
      ASSERT_TRUE(created.ok()) << created.status().ToString();
      EXPECT_EQ((*created->Json())["warnings"], json::array({warning})) << created->body;
      job_id = (*created->Json())["id"];
    }
    StatusOr<http::ClientResponse> view = admin_->Get("/api/v1/training-jobs/" + std::to_string(job_id));
    ASSERT_TRUE(view.ok()) << view.status().ToString();
    EXPECT_EQ((*view->Json())["warnings"], json::array({warning})) << view->body;

    // 400 rows, 15% held out: 340 training rows, 22 batches of 16 per pass.
    const auto [initial_loss, final_loss] = ExpectOneWorkerJobTrained(*admin_, job_id, 3 * 22);
    if (distributed_given) {
      // `parsyn job watch` of the ended job replays its events as lines for people.
      const std::string watched = WatchEndedJob(job_id);
      EXPECT_NE(watched.find("round 1/1 committed"), std::string::npos) << "stdout of job watch: " << watched;
      EXPECT_NE(watched.find("job succeeded"), std::string::npos) << "stdout of job watch: " << watched;
    }
    EXPECT_GT(initial_loss, 0) << "the round's record lacks the starting model's validation loss";
    EXPECT_LT(final_loss, initial_loss) << "three passes did not lower the validation loss";

    // The trained model, as a user downloads it: every tensor of the starting model, with new values.
    const fs::path downloaded = tmp_.path() / ("solo-" + std::to_string(job_id) + ".safetensors");
    StatusOr<uint64_t> got = admin_->DownloadToFile(
        "/api/v1/training-jobs/" + std::to_string(job_id) + "/artifacts/model.safetensors", downloaded);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    auto trained = ReadTensors(downloaded);
    auto initial = ReadTensors(tmp_.path() / "model" / "model.safetensors");
    ASSERT_EQ(trained.size(), initial.size());
    bool changed = false;
    for (const auto& [name, values] : initial) {
      ASSERT_EQ(trained[name].size(), values.size()) << name;
      changed = changed || trained[name] != values;
    }
    EXPECT_TRUE(changed) << "the model's weights are those it started from";
    std::printf("[figures] one-worker tabular job (%s): validation loss %.4f -> %.4f\n",
                distributed_given ? "enabled false" : "no distributed", initial_loss, final_loss);
  }
  for (auto& w : workers_) EXPECT_EQ(w->Terminate(), 0) << w->log();
}

// A LoRA job without `distributed` on the tiny Llama: one worker, config.epochs passes, and the adapter.
TEST_F(LlamaJobTest, OneWorkerLoraJobWithoutDistributedTrainsAnAdapter) {
  std::vector<int64_t> ids = StartWorkers(1);
  json spec = LoraSpec(ids, 1, 0, 1);
  spec.erase("distributed");
  spec["config"]["epochs"] = 2;
  const int64_t job_id = CreateJob(*admin_, spec);
  ASSERT_GT(job_id, 0);
  // 96 rows, 15% held out: 82 training rows, 21 batches of 4 per pass.
  const auto [initial_loss, final_loss] = ExpectOneWorkerJobTrained(*admin_, job_id, 2 * 21);
  EXPECT_LT(final_loss, initial_loss);
  for (const char* name : {"adapter_model.safetensors", "adapter_config.json"}) {
    StatusOr<uint64_t> got = admin_->DownloadToFile(
        "/api/v1/training-jobs/" + std::to_string(job_id) + "/artifacts/" + name, tmp_.path() / name);
    ASSERT_TRUE(got.ok()) << name << ": " << got.status().ToString();
    EXPECT_GT(*got, 0u) << name;
  }
  for (auto& w : workers_) EXPECT_EQ(w->Terminate(), 0) << w->log();
}

// Early stopping that triggers: with a learning rate too small to move the loss by min_delta, patience 2 ends the
// job after round 3 of 6 (global 2's loss, the second without improvement on the starting weights', arrives with
// round 3's results), succeeded, with the reason; the best/ artifact is the global of best_round, byte for byte.
TEST_F(TabularJobTest, EarlyStoppingEndsTheJobAndKeepsTheBestGlobal) {
  std::vector<int64_t> ids = StartWorkers(2);
  json spec = MlpSpec(ids, 6, 5);
  spec["config"]["learning_rate"] = 1e-9;
  spec["distributed"]["early_stopping"] = {{"patience", 2}, {"min_delta", 0.01}};
  const int64_t job_id = CreateJob(*admin_, spec);
  ASSERT_GT(job_id, 0);
  json job = WaitForJobEnd(*admin_, job_id, std::chrono::seconds(300));
  ASSERT_EQ(job.value("status", ""), "succeeded") << job.dump(2);
  EXPECT_EQ(job["committed_round"], 3) << job.dump(2);
  EXPECT_NE(job.value("status_reason", "").find("stopped early after round 3 of 6"), std::string::npos) << job.dump(2);
  ASSERT_TRUE(job["initial_validation_loss"].is_number()) << job.dump(2);
  ASSERT_TRUE(job["final_validation_loss"].is_number()) << job.dump(2);
  ASSERT_TRUE(job["best_round"].is_number()) << job.dump(2);
  const int best_round = job["best_round"];

  std::string best_sha;
  for (const json& r : Rounds(*admin_, job_id)) {
    if (r["outcome"] != "committed") continue;
    EXPECT_TRUE(r["validation_loss"].is_number()) << "round " << r["round"] << ": " << r.dump();
    if (r["round"] == best_round) {
      best_sha = r["global_sha256"];
      EXPECT_EQ(r["validation_loss"], job["best_validation_loss"]) << r.dump();
    }
  }
  ASSERT_FALSE(best_sha.empty()) << "no committed round " << best_round;
  StatusOr<http::ClientResponse> best =
      admin_->Get("/api/v1/training-jobs/" + std::to_string(job_id) + "/artifacts/best/model.safetensors");
  ASSERT_TRUE(best.ok()) << best.status().ToString();
  EXPECT_EQ(Sha256Hex(best->body), best_sha);
  std::printf("[figures] early stopping: %s\n", job["status_reason"].get<std::string>().c_str());
  for (auto& w : workers_) EXPECT_EQ(w->Terminate(), 0) << w->log();
}

}  // namespace
}  // namespace parsyn::e2e
