#include "fleet.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>

#include "base/sha256.h"
#include "weights/lora_layout.h"
#include "weights/safetensors.h"

namespace parsyn::bench {

namespace fs = std::filesystem;
using nlohmann::json;

void ParseFlags(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {
    std::exit(app.exit(e));  // --help
  } catch (const CLI::ParseError& e) {
    std::cerr << program_invocation_short_name << ": " << e.what() << "\n"
              << "Run '" << program_invocation_short_name << " --help' for usage.\n";
    std::exit(2);
  }
}

namespace {

// Reads the child's stdout until its "listening on URL" line; "" when it did not come within 60 s.
std::string AwaitListening(int out) {
  std::string buffered, url;
  const auto deadline = Clock::now() + std::chrono::seconds(60);
  while (url.empty() && Clock::now() < deadline) {
    pollfd p{.fd = out, .events = POLLIN, .revents = 0};
    if (::poll(&p, 1, 500) <= 0) continue;
    char buf[512];
    ssize_t n = ::read(out, buf, sizeof(buf));
    if (n <= 0) break;
    buffered.append(buf, static_cast<size_t>(n));
    size_t at = buffered.find("listening on ");
    size_t eol = at == std::string::npos ? at : buffered.find('\n', at);
    if (eol != std::string::npos) url = buffered.substr(at + 13, eol - at - 13);
  }
  return url;
}

}  // namespace

ServerProcess::ServerProcess(fs::path data_dir, const std::string& binary, const std::string& log_level,
                             const std::vector<std::string>& extra_args)
    : data_dir_(std::move(data_dir)), log_(data_dir_.string() + ".log") {
  int out[2];
  if (::pipe(out) != 0) Die("pipe failed");
  std::vector<std::string> args = {binary,     "server",      "--data-dir",  data_dir_.string(),
                                   "--listen", "127.0.0.1:0", "--log-level", log_level};
  args.insert(args.end(), extra_args.begin(), extra_args.end());
  pid_ = ::fork();
  if (pid_ < 0) Die("fork failed");
  if (pid_ == 0) {
    ::dup2(out[1], STDOUT_FILENO);
    int err = ::open(log_.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
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
  url_ = AwaitListening(out[0]);
  ::close(out[0]);
  if (url_.empty()) Die("parsyn server did not start; see " + log_ + ":\n" + ReadText(log_));
}

ServerProcess::~ServerProcess() {
  ::kill(pid_, SIGTERM);
  int status = 0;
  ::waitpid(pid_, &status, 0);
}

uint16_t ServerProcess::port() const { return static_cast<uint16_t>(std::stoi(url_.substr(url_.rfind(':') + 1))); }

std::string ServerProcess::admin_key() const { return ReadText(data_dir_ / "admin-key"); }

void ServerProcess::Kill() const { ::kill(pid_, SIGKILL); }

std::string Role(const std::string& url) {
  http::ClientOptions options;
  options.base_url = url;
  options.connect_timeout = std::chrono::milliseconds(500);
  options.timeout = std::chrono::seconds(2);
  options.max_attempts = 1;
  http::Client probe(options);
  StatusOr<http::ClientResponse> res = probe.Get("/readyz");
  if (!res.ok()) return "";
  StatusOr<json> body = res->Json();
  return body.ok() ? body->value("role", "") : "";
}

bool WaitForRole(const std::string& url, std::string_view role, std::chrono::seconds limit,
                 std::chrono::milliseconds every) {
  const auto deadline = Clock::now() + limit;
  while (Role(url) != role) {
    if (Clock::now() > deadline) return false;
    std::this_thread::sleep_for(every);
  }
  return true;
}

std::string LlamaConfig(const LlamaShape& shape) {
  return json{{"model_type", "llama"},
              {"architectures", {"LlamaForCausalLM"}},
              {"hidden_size", shape.hidden},
              {"intermediate_size", shape.intermediate},
              {"num_hidden_layers", shape.layers},
              {"num_attention_heads", shape.heads},
              {"num_key_value_heads", shape.heads},
              {"vocab_size", shape.vocab},
              {"max_position_embeddings", shape.max_positions},
              {"rms_norm_eps", 1e-5}}
      .dump();
}

LoraUpdate MakeLoraUpdate(const std::string& config, int lora_r) {
  weights::LoraLayoutOptions lora;
  lora.r = lora_r;
  weights::WeightSet adapters = Must(weights::InitialLoraAdapters(config, lora, 99), "adapters");
  LoraUpdate u;
  u.image = weights::SerializeSafetensors(adapters);
  u.sha256 = Sha256Hex(std::span<const std::byte>(u.image));
  u.tensors = adapters.tensors().size();
  return u;
}

std::string TextRows(int n) {
  std::string rows;
  for (int i = 0; i < n; ++i) rows += "{\"text\": \"row " + std::to_string(i) + "\"}\n";
  return rows;
}

namespace {

// The call's JSON body when it answered `status`; Die otherwise.
json Expect(StatusOr<http::ClientResponse> res, int status, const std::string& what) {
  http::ClientResponse r = Must(std::move(res), what);
  if (r.status != status) Die(what + " answered " + std::to_string(r.status) + ": " + r.body);
  return Must(r.Json(), what);
}

}  // namespace

int64_t UploadDataset(http::Client& admin, std::string jsonl) {
  return Expect(
      admin.Send(http::Method::kPost, "/api/v1/datasets?name=rows.jsonl", std::move(jsonl), "application/octet-stream"),
      201, "dataset upload")["id"];
}

int64_t CreateModel(http::Client& admin, std::string config_json) {
  // The model is its config.json alone: a job's LoRA layout (and so its updates') follows from it.
  auto config_up = Must(
      admin.Send(http::Method::kPost, "/api/v1/uploads", std::move(config_json), "application/octet-stream"), "config");
  return Expect(admin.PostJson("/api/v1/models", {{"name", "bench-llama"},
                                                  {"files", {{"config.json", (*config_up.Json())["upload_id"]}}}}),
                201, "model create")["id"];
}

std::vector<RegisteredWorker> RegisterWorkers(const http::ClientOptions& admin, int n) {
  std::vector<RegisteredWorker> workers(static_cast<size_t>(n));
  {
    std::vector<std::jthread> registrars;  // joined at the end of this block
    const int threads = std::min(n, 8);
    for (int t = 0; t < threads; ++t) {
      registrars.emplace_back([&, t] {
        http::Client c(admin);
        for (int i = t; i < n; i += threads) {
          const json w = Expect(c.PostJson("/api/v1/workers", {{"name", "w" + std::to_string(i)}, {"kind", "own"}}),
                                201, "worker register");
          workers[static_cast<size_t>(i)] = {.id = w["id"], .token = w["token"]};
        }
      });
    }
  }
  return workers;
}

json JobSpec(const std::string& name, int64_t dataset_id, int64_t model_id, int lora_r, int rounds,
             const std::vector<int64_t>& ids) {
  const int k = static_cast<int>(ids.size());
  return {{"name", name},
          {"dataset_id", dataset_id},
          {"model_id", model_id},
          {"config", {{"use_peft", true}, {"lora_r", lora_r}, {"seed", 7}}},
          {"distributed",
           {{"enabled", true},
            {"num_rounds", rounds},
            {"steps_per_round", 1},
            {"min_workers", k},
            {"max_workers", k},
            {"aggregation_timeout", 3600},
            {"fault_tolerance", 1}}},
          {"worker_selection", {{"mode", "own"}, {"worker_ids", ids}}}};
}

int64_t CreateJob(http::Client& admin, const json& spec) {
  return Expect(admin.PostJson("/api/v1/training-jobs", spec), 201, "job create")["id"];
}

std::string FollowJob(const http::ClientOptions& admin, int64_t job_id, std::chrono::minutes timeout,
                      const std::function<void(const json& committed)>& on_commit) {
  std::string outcome;
  http::CallOptions events_call;
  events_call.timeout = timeout;
  http::Client events(admin);
  Status read = events.ReadEvents(
      "/api/v1/training-jobs/" + std::to_string(job_id) + "/events",
      [&](const http::SseEvent& e) {
        json d = json::parse(e.data, nullptr, false);
        if (d.is_discarded()) return true;
        if (e.event == "round_committed") on_commit(d);
        if (e.event == "job_status") {
          const std::string s = d.value("status", "");
          if (s != "queued" && s != "running") {
            outcome = s;
            return false;
          }
        }
        return true;
      },
      events_call);
  if (!read.ok()) outcome = "events: " + read.ToString();
  return outcome;
}

StatusOr<std::string> Hello(http::Client& api, const std::string& device) {
  StatusOr<http::ClientResponse> hello = api.PostJson("/api/v1/worker/hello", {{"device", device}});
  if (!hello.ok()) return hello.status();
  StatusOr<json> body = hello->Json();
  if (!body.ok()) return body.status();
  return body->value("session_id", "");
}

StatusOr<http::ClientResponse> PollTask(http::Client& api, const std::string& session, int wait_ms,
                                        http::CallOptions call) {
  return api.Get("/api/v1/worker/tasks/next?wait_ms=" + std::to_string(wait_ms) + "&session_id=" + session,
                 std::move(call));
}

long ProcProbe::StatusKib(std::string_view field) const {
  std::ifstream in("/proc/" + std::to_string(pid_) + "/status");
  const std::string prefix = std::string(field) + ":";
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(prefix, 0) == 0) return std::stol(line.substr(prefix.size()));
  }
  return -1;
}

long CpuTicksOf(const std::string& stat_path) {
  std::string stat = ReadText(stat_path);
  const size_t close = stat.rfind(')');
  if (close == std::string::npos) return 0;
  std::istringstream rest(stat.substr(close + 2));
  std::string field;
  long utime = 0, stime = 0;
  for (int i = 3; i <= 15 && rest >> field; ++i) {
    if (i == 14) utime = std::stol(field);
    if (i == 15) stime = std::stol(field);
  }
  return utime + stime;
}

long ProcProbe::CpuTicks() const { return CpuTicksOf("/proc/" + std::to_string(pid_) + "/stat"); }

long ProcProbe::ThreadCpuTicks(pid_t tid) const {
  return CpuTicksOf("/proc/" + std::to_string(pid_) + "/task/" + std::to_string(tid) + "/stat");
}

long long ProcProbe::RunQueueWaitNs(pid_t tid) const {
  std::istringstream in(ReadText("/proc/" + std::to_string(pid_) + "/task/" + std::to_string(tid) + "/schedstat"));
  long long on_cpu = 0, waiting = -1;
  in >> on_cpu >> waiting;
  return in ? waiting : -1;
}

MachineTicks ReadMachineTicks() {
  std::istringstream machine(ReadText("/proc/stat"));
  std::string cpu;
  long user = 0, nice = 0, system = 0, idle = 0, iowait = 0, irq = 0, softirq = 0, steal = 0;
  machine >> cpu >> user >> nice >> system >> idle >> iowait >> irq >> softirq >> steal;
  MachineTicks t;
  t.busy = user + nice + system + irq + softirq + steal;
  t.all = t.busy + idle + iowait;
  return t;
}

AnonRssPeak::AnonRssPeak(pid_t pid)
    : sampler_([this, pid](std::stop_token stop) {
        const ProcProbe probe(pid);
        while (!stop.stop_requested()) {
          peak_kib_ = std::max(peak_kib_.load(), probe.StatusKib("RssAnon"));
          std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
      }) {}

}  // namespace parsyn::bench
