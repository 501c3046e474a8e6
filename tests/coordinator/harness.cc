#include "harness.h"
#include "base/testing/build_paths.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>

#include "base/sha256.h"
#include "weights/safetensors.h"

namespace parsyn::testing {

namespace {

std::string ReadFile(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  std::string s = ss.str();
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

uint64_t Fnv(std::string_view s) {
  uint64_t h = 1469598103934665603ULL;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ULL;
  return h;
}

}  // namespace

ServerProcess::ServerProcess(std::filesystem::path data_dir, std::vector<std::string> extra)
    : data_dir_(std::move(data_dir)), extra_(std::move(extra)) {
  Launch();
}

ServerProcess::~ServerProcess() {
  if (pid_ > 0) Terminate();
}

void ServerProcess::Launch() {
  int out[2];
  ASSERT_EQ(::pipe(out), 0);
  std::vector<std::string> args = {test_support::BuildPath("parsyn"),
                                   "server",
                                   "--data-dir",
                                   data_dir_.string(),
                                   "--listen",
                                   "127.0.0.1:0",
                                   "--heartbeat-interval-ms",
                                   "200",
                                   "--heartbeat-timeout-ms",
                                   "1500",
                                   "--max-poll-wait-ms",
                                   "2000"};
  // An extra flag that is among the defaults above replaces its value (the CLI takes each flag once).
  const size_t defaults = args.size();
  for (size_t i = 0; i < extra_.size(); ++i) {
    auto known = std::find(args.begin() + 2, args.begin() + static_cast<std::ptrdiff_t>(defaults), extra_[i]);
    const bool has_value = i + 1 < extra_.size() && extra_[i + 1].rfind("--", 0) != 0;
    if (extra_[i].rfind("--", 0) == 0 && known != args.begin() + static_cast<std::ptrdiff_t>(defaults) && has_value) {
      *std::next(known) = extra_[++i];
    } else {
      args.push_back(extra_[i]);
    }
  }
  const std::string log = (data_dir_.parent_path() / (data_dir_.filename().string() + ".log")).string();
  pid_ = ::fork();
  ASSERT_GE(pid_, 0);
  if (pid_ == 0) {
    ::dup2(out[1], STDOUT_FILENO);
    int err = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (err >= 0) ::dup2(err, STDERR_FILENO);
    ::close(out[0]);
    ::close(out[1]);
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  ::close(out[1]);
  std::string buffered;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (url_.empty() && std::chrono::steady_clock::now() < deadline) {
    pollfd p{.fd = out[0], .events = POLLIN, .revents = 0};
    if (::poll(&p, 1, 500) <= 0) continue;
    char buf[512];
    ssize_t n = ::read(out[0], buf, sizeof(buf));
    if (n <= 0) break;
    buffered.append(buf, static_cast<size_t>(n));
    size_t at = buffered.find("listening on ");
    size_t eol = at == std::string::npos ? at : buffered.find('\n', at);
    if (eol != std::string::npos) url_ = buffered.substr(at + 13, eol - at - 13);
  }
  ::close(out[0]);  // the server's later stdout writes go nowhere; it prints nothing else
  startup_output_ = buffered;
  ASSERT_FALSE(url_.empty()) << "parsyn server did not start; see " << log << ":\n" << ReadFile(log);
}

std::string ServerProcess::admin_key() const { return ReadFile(data_dir_ / "admin-key"); }
std::string ServerProcess::signing_secret() const { return ReadFile(data_dir_ / "url-signing-secret"); }

void ServerProcess::Kill() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGKILL);
  int status = 0;
  ::waitpid(pid_, &status, 0);
  pid_ = -1;
}

int ServerProcess::Terminate() {
  if (pid_ <= 0) return -1;
  ::kill(pid_, SIGTERM);
  int status = 0;
  ::waitpid(pid_, &status, 0);
  pid_ = -1;
  return status;
}

void ServerProcess::Restart() {
  url_.clear();
  Launch();
}

std::unique_ptr<http::Client> ClientWithToken(const ServerProcess& server, const std::string& token) {
  http::ClientOptions options;
  options.base_url = server.url();
  options.bearer_token = token;
  options.timeout = std::chrono::milliseconds(15'000);
  options.max_attempts = 1;
  return std::make_unique<http::Client>(options);
}

std::unique_ptr<http::Client> AdminClient(const ServerProcess& server) {
  return ClientWithToken(server, server.admin_key());
}

std::string TextDataset(int rows) {
  std::string out;
  for (int i = 0; i < rows; ++i) out += "{\"text\": \"row " + std::to_string(i) + "\"}\n";
  return out;
}

std::string TinyLlamaConfig() {
  return json{{"model_type", "llama"},
              {"architectures", {"LlamaForCausalLM"}},
              {"hidden_size", 16},
              {"intermediate_size", 32},
              {"num_hidden_layers", 2},
              {"num_attention_heads", 2},
              {"num_key_value_heads", 2},
              {"vocab_size", 64},
              {"max_position_embeddings", 64},
              {"rms_norm_eps", 1e-5}}
      .dump();
}

Fixture MakeFixture(http::Client& admin, int rows, int workers) {
  Fixture f;
  auto ds = admin.Send(http::Method::kPost, "/api/v1/datasets?name=rows.jsonl", TextDataset(rows),
                       "application/octet-stream");
  EXPECT_TRUE(ds.ok()) << ds.status().ToString();
  if (ds.ok()) f.dataset_id = (*ds->Json())["id"];
  auto up = admin.Send(http::Method::kPost, "/api/v1/uploads", TinyLlamaConfig(), "application/octet-stream");
  EXPECT_TRUE(up.ok()) << up.status().ToString();
  if (up.ok()) {
    auto model = admin.PostJson("/api/v1/models",
                                {{"name", "tiny-llama"}, {"files", {{"config.json", (*up->Json())["upload_id"]}}}});
    EXPECT_TRUE(model.ok()) << model.status().ToString();
    if (model.ok()) f.model_id = (*model->Json())["id"];
  }
  for (int i = 0; i < workers; ++i) {
    auto w = admin.PostJson("/api/v1/workers", {{"name", "w" + std::to_string(i)}, {"kind", "own"}});
    EXPECT_TRUE(w.ok()) << w.status().ToString();
    if (!w.ok()) continue;
    f.worker_ids.push_back((*w->Json())["id"]);
    f.worker_tokens.push_back((*w->Json())["token"]);
  }
  return f;
}

json DistributedSpec(const Fixture& f, int rounds, int min_workers, double aggregation_timeout_s, int fault_tolerance) {
  return {{"name", "test-job"},
          {"dataset_id", f.dataset_id},
          {"model_id", f.model_id},
          {"config", {{"use_peft", true}, {"lora_r", 4}, {"lora_alpha", 8}, {"seed", 7}}},
          {"distributed",
           {{"enabled", true},
            {"num_rounds", rounds},
            {"steps_per_round", 5},
            {"min_workers", min_workers},
            {"max_workers", static_cast<int>(f.worker_ids.size())},
            {"aggregation_timeout", aggregation_timeout_s},
            {"fault_tolerance", fault_tolerance}}},
          {"worker_selection", {{"mode", "own"}, {"worker_ids", f.worker_ids}}}};
}

bool WaitForWorkersOnline(http::Client& admin, const std::vector<int64_t>& ids, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    auto res = admin.Get("/api/v1/workers");
    if (res.ok()) {
      size_t online = 0;
      const json body = json::parse(res->body);
      for (const json& w : body["workers"]) {
        if (std::find(ids.begin(), ids.end(), w["id"].get<int64_t>()) != ids.end() && w["status"] != "offline") {
          ++online;
        }
      }
      if (online == ids.size()) return true;
    }
    // Hello is a remote event with no stream to wait on; re-check shortly.
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

std::vector<std::pair<std::string, std::vector<float>>> DecodeF32(const std::string& bytes) {
  std::vector<std::pair<std::string, std::vector<float>>> out;
  auto set = weights::ParseSafetensors(std::as_bytes(std::span(bytes.data(), bytes.size())));
  if (!set.ok()) return out;
  for (const weights::Tensor& t : set->tensors()) {
    if (t.dtype != weights::DType::kF32) return {};
    auto values = t.as<float>();
    out.emplace_back(t.name, std::vector<float>(values.begin(), values.end()));
  }
  return out;
}

ScriptedWorker::ScriptedWorker(const ServerProcess& server, int64_t id, std::string token, Behaviour behaviour)
    : url_(server.url()), id_(id), token_(std::move(token)), behaviour_(behaviour) {}

ScriptedWorker::~ScriptedWorker() { Stop(); }

void ScriptedWorker::Start() {
  thread_ = std::jthread([this](std::stop_token stop) { Run(stop); });
}

void ScriptedWorker::Stop() {
  if (thread_.joinable()) {
    thread_.request_stop();
    thread_.join();
  }
}

void ScriptedWorker::Reconnect(const ServerProcess& server) {
  std::lock_guard lock(mu_);
  url_ = server.url();
}

std::vector<Upload> ScriptedWorker::uploads() const {
  std::lock_guard lock(mu_);
  return uploads_;
}

std::vector<json> ScriptedWorker::results() const {
  std::lock_guard lock(mu_);
  return results_;
}

void ScriptedWorker::Run(std::stop_token stop) {
  std::string session;
  std::string url;
  std::unique_ptr<http::Client> client;
  while (!stop.stop_requested()) {
    {
      std::lock_guard lock(mu_);
      if (url != url_) {
        url = url_;
        http::ClientOptions options;
        options.base_url = url;
        options.bearer_token = token_;
        options.timeout = std::chrono::milliseconds(10'000);
        options.connect_timeout = std::chrono::milliseconds(1'000);
        options.max_attempts = 1;
        client = std::make_unique<http::Client>(options);
        session.clear();
      }
    }
    http::CallOptions call;
    call.stop = stop;
    if (session.empty()) {
      auto hello = client->PostJson("/api/v1/worker/hello", {{"device", "cpu (scripted)"}}, call);
      if (!hello.ok()) {
        // The server is down (a restart test): try again shortly.
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        continue;
      }
      session = (*hello->Json())["session_id"];
    }
    auto hb = client->PostJson("/api/v1/worker/heartbeat", {{"session_id", session}}, call);
    if (!hb.ok()) {
      session.clear();
      continue;
    }
    auto res = client->Get(
        "/api/v1/worker/tasks/next?wait_ms=" + std::to_string(poll_wait_ms_.load()) + "&session_id=" + session, call);
    if (!res.ok()) {
      // A poll cut short by Stop() ends the session (its connection closed); the goodbye below is still answered.
      if (!stop.stop_requested()) session.clear();
      continue;
    }
    if (res->status == 204) continue;
    auto task = res->Json();
    if (!task.ok()) continue;
    ++tasks_seen_;
    const Behaviour b = behaviour_;
    if (b == Behaviour::kCrashAfterTask) return;  // vanishes: no goodbye, no heartbeats
    if (b == Behaviour::kSilent && (*task)["kind"] == "train") {
      // Keeps its session alive but never reports this task.
      const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
      while (!stop.stop_requested() && std::chrono::steady_clock::now() < until) {
        if (!client->PostJson("/api/v1/worker/heartbeat", {{"session_id", session}}, call).ok()) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(150));
      }
      continue;
    }
    if (b == Behaviour::kReportsFailure && (*task)["kind"] == "train") {
      // Says at once that its task failed, then polls again like any healthy worker.
      auto said = client->PostJson("/api/v1/worker/failure",
                                   {{"session_id", session},
                                    {"job_id", (*task)["job_id"]},
                                    {"round", (*task)["round"]},
                                    {"attempt", (*task)["attempt"]},
                                    {"reason", "the trainer ran out of memory"}},
                                   call);
      std::lock_guard lock(mu_);
      results_.push_back({{"failure_reported", said.ok() ? said->status : 0}});
      continue;
    }
    // A failed transfer (the server was killed, a round ended) is the server's to judge: recorded, not fatal.
    Status handled = HandleTask(*task);
    if (!handled.ok()) {
      std::lock_guard lock(mu_);
      results_.push_back({{"error", handled.ToString()}});
    }
  }
  if (client && !session.empty() && behaviour_ != Behaviour::kCrashAfterTask) {
    client->PostJson("/api/v1/worker/goodbye", {{"session_id", session}}).status().IgnoreError();
  }
}

Status ScriptedWorker::HandleTask(const json& task) {
  http::ClientOptions options;
  options.timeout = std::chrono::milliseconds(10'000);
  options.max_attempts = 1;
  http::Client blobs(options);  // signed URLs carry their own credential
  const int64_t job_id = task["job_id"];
  const int round = task["round"], attempt = task["attempt"];
  json result = {{"job_id", job_id}, {"round", round}, {"attempt", attempt}};
  result["validation_samples"] = task["data"]["validation_rows"];
  result["validation_loss"] = 2.0 / round;
  if (task["kind"] == "train") {
    auto global = blobs.Get(task["global_weights"]["url"].get<std::string>());
    if (!global.ok()) return global.status();
    if (Sha256Hex(global->body) != task["global_weights"]["sha256"]) {
      return DataLossError("global weights sha256 mismatch");
    }
    auto tensors = DecodeF32(global->body);
    if (tensors.empty()) return DataLossError("global weights do not decode");
    const uint64_t seed = task["seed"];
    weights::WeightSet update;
    for (auto& [name, values] : tensors) {
      for (size_t i = 0; i < values.size(); ++i) {
        const uint64_t r = Mix(seed ^ Fnv(name) ^ Mix(i));
        values[i] += static_cast<float>(static_cast<int64_t>(r % 2001) - 1000) * 1e-5f;
      }
    }
    const Behaviour b = behaviour_;
    if (b == Behaviour::kNaN) tensors[0].second[0] = std::nanf("");
    auto layout = weights::ParseSafetensors(std::as_bytes(std::span(global->body.data(), global->body.size())));
    if (!layout.ok()) return layout.status();
    for (size_t t = 0; t < tensors.size(); ++t) {
      const weights::Tensor& g = (*layout)[t];
      std::vector<int64_t> shape = g.shape;
      if (b == Behaviour::kWrongShape && t == 0) shape = {static_cast<int64_t>(tensors[t].second.size())};
      PARSYN_RETURN_IF_ERROR(
          update.Add(tensors[t].first, weights::DType::kF32, shape, std::as_bytes(std::span(tensors[t].second))));
    }
    if (b == Behaviour::kOversize) {
      const uint64_t extra = task["update_upload"]["max_size_bytes"].get<uint64_t>() / 4 + 16;
      std::vector<float> big(extra, 0.5f);
      PARSYN_RETURN_IF_ERROR(
          update.Add("padding", weights::DType::kF32, {static_cast<int64_t>(extra)}, std::as_bytes(std::span(big))));
    }
    std::vector<std::byte> image = weights::SerializeSafetensors(update);
    std::string bytes(reinterpret_cast<const char*>(image.data()), image.size());
    if (b == Behaviour::kCorrupt) bytes = "this is not a safetensors file";
    auto put = blobs.Send(http::Method::kPut, task["update_upload"]["url"].get<std::string>(), bytes,
                          "application/octet-stream");
    if (!put.ok() && b != Behaviour::kOversize) return put.status();
    result["blob_key"] = task["update_upload"]["blob_key"];
    result["sha256"] = b == Behaviour::kBadSha ? std::string(64, '0') : Sha256Hex(bytes);
    result["sample_count"] = task["data"]["train_rows"];
    result["train_loss"] = 1.0 / round;
    if (b == Behaviour::kHonest) {
      std::lock_guard lock(mu_);
      uploads_.push_back({.job_id = job_id,
                          .round = round,
                          .attempt = attempt,
                          .worker_id = id_,
                          .sample_count = task["data"]["train_rows"],
                          .shard = task["shard"],
                          .global_round = task["global_weights"]["round"],
                          .tensors = DecodeF32(bytes)});
    }
  }
  http::ClientOptions api_options;
  {
    std::lock_guard lock(mu_);
    api_options.base_url = url_;
  }
  api_options.bearer_token = token_;
  api_options.max_attempts = 1;
  http::Client api(api_options);
  auto progress = api.PostJson("/api/v1/worker/progress", {{"job_id", job_id},
                                                           {"round", round},
                                                           {"attempt", attempt},
                                                           {"step", 5},
                                                           {"total_steps", 5},
                                                           {"loss", 1.0 / round}});
  (void)progress;  // a progress report for a finished job is refused; not this worker's concern
  auto answer = api.PostJson("/api/v1/worker/result", result);
  std::lock_guard lock(mu_);
  if (answer.ok()) {
    results_.push_back(*answer->Json());
  } else {
    results_.push_back(
        {{"error", answer.status().message()}, {"code", std::string(StatusCodeName(answer.status().code()))}});
  }
  return Status::Ok();
}

}  // namespace parsyn::testing
