#include "e2e_harness.h"
#include "base/testing/build_paths.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include "base/testing/free_port.h"
#include "weights/safetensors.h"

namespace parsyn::e2e {

namespace {

std::string Trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ' || s.back() == '\r')) s.pop_back();
  return s;
}

// Forks and execs argv with stdout and stderr to `out_fd` (-1: /dev/null). Returns the pid.
pid_t Spawn(const std::vector<std::string>& args, int out_fd, const std::vector<std::string>& environment = {}) {
  pid_t pid = ::fork();
  if (pid == 0) {
    for (const std::string& assignment : environment) {
      const size_t eq = assignment.find('=');
      ::setenv(assignment.substr(0, eq).c_str(), assignment.substr(eq + 1).c_str(), 1);
    }
    int target = out_fd >= 0 ? out_fd : ::open("/dev/null", O_WRONLY);
    ::dup2(target, STDOUT_FILENO);
    ::dup2(target, STDERR_FILENO);
    std::vector<char*> argv;
    std::vector<std::string> copy = args;
    for (std::string& a : copy) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  return pid;
}

int ExitStatus(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return -1;
}

// Waits for `pid` up to `timeout`; SIGKILLs it at the deadline. Returns the exit status.
int WaitBounded(pid_t pid, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  int status = 0;
  while (true) {
    pid_t r = ::waitpid(pid, &status, WNOHANG);
    if (r == pid) return ExitStatus(status);
    if (r < 0) return -1;
    if (std::chrono::steady_clock::now() >= deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      return ExitStatus(status);
    }
    // A child's exit has no descriptor to wait on here; poll its state.
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

CommandResult RunProgram(const std::vector<std::string>& args, std::chrono::seconds timeout) {
  int pipefd[2];
  EXPECT_EQ(::pipe(pipefd), 0);
  pid_t pid = Spawn(args, pipefd[1]);
  ::close(pipefd[1]);
  CommandResult result;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  bool killed = false;
  while (true) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      ::kill(pid, SIGKILL);
      killed = true;
      break;
    }
    pollfd p{.fd = pipefd[0], .events = POLLIN, .revents = 0};
    if (::poll(&p, 1, static_cast<int>(std::min<int64_t>(left.count(), 1000))) <= 0) continue;
    char buf[4096];
    ssize_t n = ::read(pipefd[0], buf, sizeof(buf));
    if (n <= 0) break;
    result.output.append(buf, static_cast<size_t>(n));
  }
  ::close(pipefd[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  result.exit_code = ExitStatus(status);
  if (killed) result.output += "\n[killed at the timeout]";
  return result;
}

}  // namespace

std::string ReadWholeFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

CommandResult RunParsyn(const std::vector<std::string>& args, std::chrono::seconds timeout) {
  std::vector<std::string> argv = {test_support::BuildPath("parsyn")};
  argv.insert(argv.end(), args.begin(), args.end());
  return RunProgram(argv, timeout);
}

CommandResult RunTrainer(const std::vector<std::string>& args, std::chrono::seconds timeout) {
  std::vector<std::string> argv = {test_support::BuildPath("parsyn-trainer")};
  argv.insert(argv.end(), args.begin(), args.end());
  return RunProgram(argv, timeout);
}

int FreePort() {
  StatusOr<int> port = test_support::FreeLoopbackPort();
  EXPECT_TRUE(port.ok()) << port.status().ToString();
  return port.ok() ? *port : 0;
}

Server::Server(fs::path data_dir, int port, std::vector<std::string> extra)
    : data_dir_(std::move(data_dir)), port_(port), extra_(std::move(extra)) {}

Server::~Server() {
  if (pid_ > 0) Terminate();
}

void Server::Start() {
  const fs::path log = data_dir_.string() + ".log";
  int out = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  std::vector<std::string> args = {test_support::BuildPath("parsyn"),
                                   "server",
                                   "--data-dir",
                                   data_dir_.string(),
                                   "--listen",
                                   "127.0.0.1:" + std::to_string(port_),
                                   "--heartbeat-interval-ms",
                                   "300",
                                   "--heartbeat-timeout-ms",
                                   "3000",
                                   "--max-poll-wait-ms",
                                   "2000"};
  args.insert(args.end(), extra_.begin(), extra_.end());
  pid_ = Spawn(args, out);
  ::close(out);
  // Ready when the API answers; the server has no other signal a separate process can wait on.
  http::Client probe(http::ClientOptions{
      .base_url = url(), .connect_timeout = std::chrono::milliseconds(500), .max_attempts = 1, .ca_file = ca_file_});
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  bool answered = false;
  while (!answered && std::chrono::steady_clock::now() < deadline) {
    StatusOr<http::ClientResponse> r = probe.Get("/healthz");
    answered =
        r.ok() || (r.status().code() != StatusCode::kUnavailable && r.status().code() != StatusCode::kDeadlineExceeded);
    if (!answered) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  if (!answered) {
    ADD_FAILURE() << "parsyn server did not start; its log:\n" << ReadWholeFile(log);
    return;
  }
  // On PostgreSQL a server answers before its first try for the leader lease is done: a standby that knows no leader
  // yet refuses every API call (503). Wait for that try (a standby that names a leader is a test's own standby).
  while (std::chrono::steady_clock::now() < deadline) {
    StatusOr<http::ClientResponse> r = probe.Get("/readyz");
    StatusOr<nlohmann::json> body = r.ok() ? r->Json() : StatusOr<nlohmann::json>(r.status());
    if (!body.ok() || body->value("role", "") != "standby" || body->contains("leader_url")) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

void Server::Kill() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGKILL);
  ::waitpid(pid_, nullptr, 0);
  pid_ = -1;
}

int Server::Terminate() {
  if (pid_ <= 0) return -1;
  ::kill(pid_, SIGTERM);
  int status = WaitBounded(pid_, std::chrono::seconds(20));
  pid_ = -1;
  return status;
}

std::string Server::admin_key() const { return Trim(ReadWholeFile(data_dir_ / "admin-key")); }

std::unique_ptr<http::Client> Server::Admin() const {
  return std::make_unique<http::Client>(http::ClientOptions{
      .base_url = url(), .bearer_token = admin_key(), .timeout = std::chrono::seconds(30), .ca_file = ca_file_});
}

Worker::Worker(std::string server_url, std::string token, std::string name, fs::path cache_dir,
               std::vector<std::string> extra)
    : server_url_(std::move(server_url)),
      token_(std::move(token)),
      name_(std::move(name)),
      cache_dir_(std::move(cache_dir)),
      extra_(std::move(extra)) {}

Worker::~Worker() {
  if (pid_ > 0) Terminate();
}

void Worker::Start() {
  int out = ::open((cache_dir_.string() + ".log").c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  std::vector<std::string> args = {test_support::BuildPath("parsyn"),
                                   "worker",
                                   "--server",
                                   server_url_,
                                   "--token",
                                   token_,
                                   "--name",
                                   name_,
                                   "--cache-dir",
                                   cache_dir_.string(),
                                   "--threads",
                                   "1"};
  args.insert(args.end(), extra_.begin(), extra_.end());
  pid_ = Spawn(args, out, environment_);
  ::close(out);
}

void Worker::Kill() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGKILL);
  ::waitpid(pid_, nullptr, 0);
  pid_ = -1;
}

int Worker::Terminate() {
  if (pid_ <= 0) return -1;
  ::kill(pid_, SIGTERM);
  int status = WaitBounded(pid_, std::chrono::seconds(20));
  pid_ = -1;
  return status;
}

bool Worker::Exited() {
  if (pid_ <= 0) return true;
  int status = 0;
  if (::waitpid(pid_, &status, WNOHANG) == pid_) {
    pid_ = -1;
    return true;
  }
  return false;
}

std::string Worker::log() const { return ReadWholeFile(cache_dir_.string() + ".log"); }

void InitTinyLlama(const fs::path& dir, int hidden_size) {
  CommandResult r = RunParsyn({"model", "init", "--out", dir.string(), "--hidden-size", std::to_string(hidden_size),
                               "--layers", "2", "--heads", "2", "--max-position-embeddings", "128", "--seed", "3"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
}

int64_t UploadModel(http::Client& admin, const fs::path& dir, const std::string& name) {
  json files = json::object();
  for (const auto& entry : fs::directory_iterator(dir)) {
    StatusOr<http::ClientResponse> up = admin.UploadFile(http::Method::kPost, "/api/v1/uploads", entry.path());
    EXPECT_TRUE(up.ok()) << up.status().ToString();
    if (!up.ok()) return 0;
    files[entry.path().filename().string()] = (*up->Json())["upload_id"];
  }
  StatusOr<http::ClientResponse> model = admin.PostJson("/api/v1/models", {{"name", name}, {"files", files}});
  EXPECT_TRUE(model.ok()) << model.status().ToString();
  return model.ok() ? (*model->Json())["id"].get<int64_t>() : 0;
}

int64_t UploadDataset(http::Client& admin, const fs::path& file) {
  StatusOr<http::ClientResponse> ds =
      admin.UploadFile(http::Method::kPost, "/api/v1/datasets?name=" + file.filename().string(), file);
  EXPECT_TRUE(ds.ok()) << ds.status().ToString();
  return ds.ok() ? (*ds->Json())["id"].get<int64_t>() : 0;
}

Registered RegisterWorker(http::Client& admin, const std::string& name, const std::string& kind) {
  StatusOr<http::ClientResponse> w = admin.PostJson("/api/v1/workers", {{"name", name}, {"kind", kind}});
  EXPECT_TRUE(w.ok()) << w.status().ToString();
  if (!w.ok()) return {};
  json body = *w->Json();
  return {body["id"].get<int64_t>(), body["token"].get<std::string>()};
}

int64_t CreateJob(http::Client& admin, const json& spec) {
  StatusOr<http::ClientResponse> job = admin.PostJson("/api/v1/training-jobs", spec);
  EXPECT_TRUE(job.ok()) << job.status().ToString();
  return job.ok() ? (*job->Json())["id"].get<int64_t>() : 0;
}

json TabularJobSpec(const std::string& name, int64_t dataset_id, int64_t model_id,
                    const std::vector<int64_t>& worker_ids, int rounds, int steps_per_round) {
  const int workers = static_cast<int>(worker_ids.size());
  return {{"name", name},
          {"dataset_id", dataset_id},
          {"model_id", model_id},
          {"config",
           {{"batch_size", 16},
            {"learning_rate", 0.01},
            {"use_peft", false},
            {"label_column", "label"},
            {"lr_scheduler", "constant"},
            {"validation_fraction", 0.15},
            {"seed", 7}}},
          {"distributed",
           {{"enabled", true},
            {"num_rounds", rounds},
            {"steps_per_round", steps_per_round},
            {"min_workers", workers},
            {"max_workers", workers},
            {"aggregation_timeout", 120},
            {"fault_tolerance", 1}}},
          {"worker_selection", {{"mode", "own"}, {"worker_ids", worker_ids}}}};
}

std::vector<json> CommittedRounds(http::Client& admin, int64_t job_id) {
  std::vector<json> committed;
  for (const json& r : Rounds(admin, job_id)) {
    if (r["outcome"] == "committed" && r["round"].get<int>() >= 1) committed.push_back(r);
  }
  return committed;
}

json Rounds(http::Client& admin, int64_t job_id) {
  StatusOr<http::ClientResponse> r = admin.Get("/api/v1/training-jobs/" + std::to_string(job_id) + "/rounds");
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? (*r->Json())["rounds"] : json::array();
}

void WriteLearnableText(const fs::path& file, int rows) {
  // Short sentences from a tiny grammar: after a few dozen steps the model predicts most of each line.
  const char* names[] = {"alice", "bob", "carol", "dave"};
  const char* verbs[] = {"likes", "sees", "helps"};
  std::ofstream out(file);
  for (int i = 0; i < rows; ++i) {
    const std::string text =
        std::string(names[i % 4]) + " " + verbs[(i / 4) % 3] + " " + names[(i + 1) % 4] + ". the end.";
    out << json{{"text", text}}.dump() << "\n";
  }
}

void WriteSeparableCsv(const fs::path& file, int rows) {
  std::ofstream out(file);
  out << "x1,x2,label\n";
  uint64_t state = 12345;
  auto next = [&] {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    return static_cast<double>(state >> 11) / static_cast<double>(1ULL << 53) * 2.0 - 1.0;
  };
  for (int i = 0; i < rows; ++i) {
    const double x1 = next(), x2 = next();
    out << x1 << "," << x2 << "," << (x1 + x2 > 0 ? 1 : 0) << "\n";
  }
}

std::map<std::string, std::vector<double>> SampleWeightedMean(const std::vector<std::pair<fs::path, double>>& updates) {
  std::map<std::string, std::vector<double>> sum;
  double total = 0;
  for (const auto& [file, n] : updates) {
    EXPECT_GT(n, 0) << file;
    total += n;
    for (auto& [name, values] : ReadTensors(file)) {
      std::vector<double>& s = sum[name];
      s.resize(values.size(), 0.0);
      for (size_t i = 0; i < values.size(); ++i) s[i] += n * values[i];
    }
  }
  for (auto& [name, values] : sum) {
    for (double& v : values) v /= total;
  }
  return sum;
}

void ExpectEqualUpToQuantization(const std::map<std::string, std::vector<double>>& reference,
                                 const std::map<std::string, std::vector<double>>& actual,
                                 const std::map<std::string, std::vector<double>>& initial, double step) {
  double largest_change = 0, largest_difference = 0;
  for (const auto& [name, values] : reference) {
    ASSERT_TRUE(actual.contains(name) && initial.contains(name)) << name;
    ASSERT_EQ(actual.at(name).size(), values.size()) << name;
    ASSERT_EQ(initial.at(name).size(), values.size()) << name;
    for (size_t i = 0; i < values.size(); ++i) {
      largest_change = std::max(largest_change, std::abs(values[i] - initial.at(name)[i]));
      largest_difference = std::max(largest_difference, std::abs(values[i] - actual.at(name)[i]));
    }
  }
  EXPECT_LE(largest_difference, 3 * step);
  EXPECT_GT(largest_change, 30 * step) << "the round must move the weights well beyond the tolerance";
}

std::string AttemptPrefix(int64_t job_id, int round, int attempt) {
  char buf[96];
  std::snprintf(buf, sizeof(buf), "jobs/%lld/rounds/%06d-a%d", static_cast<long long>(job_id), round, attempt);
  return buf;
}

std::map<std::string, std::vector<double>> ReadTensors(const fs::path& file) {
  std::map<std::string, std::vector<double>> out;
  StatusOr<weights::WeightSet> set = weights::ReadSafetensorsFile(file);
  EXPECT_TRUE(set.ok()) << file << ": " << set.status().ToString();
  if (!set.ok()) return out;
  for (const weights::Tensor& t : set->tensors()) {
    std::vector<double>& values = out[t.name];
    if (t.dtype == weights::DType::kF32) {
      for (float v : t.as<float>()) values.push_back(v);
    } else if (t.dtype == weights::DType::kBF16) {
      for (uint16_t v : t.as<uint16_t>()) {
        uint32_t bits = static_cast<uint32_t>(v) << 16;
        float f;
        std::memcpy(&f, &bits, sizeof(f));
        values.push_back(f);
      }
    } else {
      ADD_FAILURE() << t.name << " in " << file << " has an unexpected dtype";
    }
  }
  return out;
}

json RunEvaluationTask(const fs::path& dir, json task) {
  task["steps"] = 0;
  task["output"] = {{"weights", (dir / "eval-out.safetensors").string()},
                    {"result", (dir / "eval-result.json").string()}};
  const fs::path task_file = dir / "eval-task.json";
  std::ofstream(task_file) << task.dump();
  CommandResult eval = RunTrainer({"run", task_file.string()});
  EXPECT_EQ(eval.exit_code, 0) << eval.output;
  if (eval.exit_code != 0) return json();
  return json::parse(std::ifstream(dir / "eval-result.json"));
}

}  // namespace parsyn::e2e
