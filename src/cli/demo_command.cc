// parsyn demo [--data-dir DIR]: the whole platform on this machine, end to end. Starts `parsyn server` on the
// embedded defaults (SQLite and a blob folder under DIR), writes a small Llama-architecture model and a synthetic
// instruction dataset it can learn (each question has one exact answer, scored by exact match), registers and starts
// two own `parsyn worker` processes beside one the server manages (--managed-workers 1), runs a multi-round federated
// LoRA job (bf16 where the CPU computes it, fp32 elsewhere: --precision) with live progress, and prints a summary.
// Every process it starts is stopped before it returns (also on Ctrl-C).
#include <signal.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "base/subprocess.h"
#include "base/text_file.h"
#include "cli/commands.h"
#include "cli/trainer_runner.h"
#include "http/client.h"

namespace parsyn::cli {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using SteadyClock = std::chrono::steady_clock;

struct DemoFlags {
  std::string data_dir = "parsyn-data";
  std::string listen = "127.0.0.1:8080";
  int workers = 3;
  int rounds = 6;
  int64_t steps = 80;
  std::string precision = "auto";  // auto, bf16 or fp32
};

// True when this CPU multiplies bf16 in hardware (AMX or AVX512-BF16). Elsewhere libtorch emulates bf16 with fp32
// arithmetic and conversions: on such a CPU (an AMD EPYC, 2 cores) the demo's job took 123 s in bf16 against 27 s in
// fp32, with the same accuracy; where the CPU has AMX it took 22 s in bf16.
bool CpuComputesBf16() { return __builtin_cpu_supports("amx-bf16") || __builtin_cpu_supports("avx512bf16"); }

// The precision the demo's job trains in: --precision, or for "auto" bf16 where the CPU computes it and fp32 else.
std::string DemoPrecision(const DemoFlags& f) {
  if (f.precision != "auto") return f.precision;
  return CpuComputesBf16() ? "bf16" : "fp32";
}

// The precision as the demo says it, with why when --precision was left at auto.
std::string DemoPrecisionSaid(const DemoFlags& f) {
  if (f.precision != "auto") return f.precision;
  return CpuComputesBf16() ? "bf16 (this CPU computes it)"
                           : "fp32 (this CPU has no bf16 units; --precision bf16 emulates them, about 4x slower)";
}

// Adapters on every projection: a tiny model learns the answers within a few rounds.
const std::vector<std::string> kTargets = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};

std::atomic<bool> g_interrupted{false};
void OnInterrupt(int) { g_interrupted = true; }

// A background process whose output goes to a log file; SIGTERM then reaped on destruction.
class Background {
 public:
  // `environment`: variables set for the child on top of this process's (a worker's token goes there, not on its
  // command line, which every user of the machine can read in /proc).
  Background(const fs::path& program, const std::vector<std::string>& args, const fs::path& log,
             std::vector<std::pair<std::string, std::string>> environment = {}) {
    SubprocessOptions options;
    options.output = SubprocessOptions::Output::kFile;
    options.output_file = log;
    options.environment = std::move(environment);
    if (StatusOr<Subprocess> started = Subprocess::Start(program, args, options); started.ok()) {
      child_.emplace(std::move(*started));
    }
  }
  ~Background() { Stop(); }
  Background(const Background&) = delete;
  Background& operator=(const Background&) = delete;
  bool started() const { return child_.has_value(); }
  void Stop() {
    if (!child_) return;
    child_->Terminate();
    for (int i = 0; i < 200 && !child_->HasExited();
         ++i) {  // up to 20 s for a clean exit (a worker stops its trainer first)
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    child_->Kill();  // no-op for one that has exited
    child_->Wait();
    child_.reset();
  }

 private:
  std::optional<Subprocess> child_;
};

// Questions with one short answer each: "what color is a banana?" -> " yellow". Rows repeat, so the validation
// slice asks questions the model has seen: exact-match accuracy rises as the adapter learns the answers.
void WriteInstructions(const fs::path& file) {
  const std::pair<const char*, const char*> facts[] = {{"banana", "yellow"}, {"grass", "green"}, {"sky", "blue"},
                                                       {"snow", "white"},    {"coal", "black"},  {"tomato", "red"},
                                                       {"carrot", "orange"}, {"plum", "purple"}};
  std::mt19937 rng(11);
  std::ofstream out(file);
  for (int i = 0; i < 480; ++i) {
    const auto& [thing, color] = facts[rng() % std::size(facts)];
    out << json{{"prompt", std::string("what color is ") + thing + "?"}, {"completion", std::string(" ") + color}}
               .dump()
        << "\n";
  }
}

// POSTs a file; returns the answer's `field` ("upload_id" for /uploads, "id" for /datasets).
StatusOr<json> UploadFile(http::Client& api, const std::string& path, const fs::path& file, const char* field) {
  PARSYN_ASSIGN_OR_RETURN(http::ClientResponse res, api.UploadFile(http::Method::kPost, path, file));
  PARSYN_ASSIGN_OR_RETURN(json body, res.Json());
  if (!body.contains(field)) return InternalError("POST " + path + " answered without '" + field + "'");
  return body[field];
}

// Exact-match accuracy and loss of the model (with `adapter`, or the base model) on the demo's questions.
StatusOr<json> Evaluate(const fs::path& work, const fs::path& model, const fs::path& data, const fs::path& adapter) {
  const fs::path task = work / "eval-task.json";
  json t = {{"model_dir", model.string()},
            {"data", data.string()},
            {"config",
             {{"use_peft", true},
              {"lora_r", 8},
              {"lora_alpha", 16},
              {"max_seq_len", 32},
              {"lora_target_modules", kTargets},
              {"batch_size", 16},
              {"validation_fraction", 0.1}}},
            {"steps", 0},
            {"threads", 1},
            {"output", {{"weights", (work / "eval.safetensors").string()}, {"result", (work / "eval.json").string()}}}};
  if (!adapter.empty()) t["initial_weights"] = adapter.string();
  std::ofstream(task) << t.dump();
  PARSYN_ASSIGN_OR_RETURN(TrainerOutcome outcome, RunTrainer({"run", task.string()}, nullptr));
  if (outcome.exit_code != 0) return InternalError("evaluation failed: " + TrainerFailureMessage(outcome));
  return outcome.done.value("validation_before", json::object());
}

// The server the demo starts, and an API client with its admin key.
struct DemoServer {
  std::unique_ptr<Background> process;
  std::string url;
  std::unique_ptr<http::Client> api;
};

StatusOr<DemoServer> StartServer(const fs::path& self, const DemoFlags& f, const fs::path& data_dir,
                                 const fs::path& work) {
  std::cout << "==> starting parsyn server (" << data_dir.string() << ")\n";
  std::error_code ec;
  fs::remove(data_dir / "server.json", ec);
  // One of the demo's workers is managed: the server starts and supervises it, as `--managed-workers` does in
  // production.
  DemoServer server;
  server.process =
      std::make_unique<Background>(self,
                                   std::vector<std::string>{"server", "--data-dir", data_dir.string(), "--listen",
                                                            f.listen, "--managed-workers", "1"},
                                   work / "server.log");
  if (!server.process->started()) return InternalError("cannot start parsyn server");
  for (int i = 0; i < 300 && !fs::exists(data_dir / "server.json"); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the server writes it once it listens
  }
  try {
    server.url = json::parse(std::ifstream(data_dir / "server.json")).at("url").get<std::string>();
  } catch (const std::exception&) {
    return UnavailableError("parsyn server did not start; see " + (work / "server.log").string());
  }
  StatusOr<std::string> admin_key = ReadTrimmedTextFile(data_dir / "admin-key");
  server.api = std::make_unique<http::Client>(
      http::ClientOptions{.base_url = server.url, .bearer_token = admin_key.ok() ? *admin_key : ""});
  return server;
}

// The demo's model and dataset, written here and registered with the server.
struct DemoInputs {
  fs::path model;  // the model folder
  fs::path data;   // the instructions file
  int64_t model_id = 0;
  json dataset_id;
};

StatusOr<DemoInputs> RegisterModelAndData(http::Client& api, const fs::path& work) {
  std::cout << "==> writing a small Llama model and a synthetic instruction dataset\n";
  DemoInputs inputs{.model = work / "model", .data = work / "instructions.jsonl"};
  json init = {
      {"architecture", "llama"},        {"hidden_size", 64}, {"num_hidden_layers", 2}, {"num_attention_heads", 4},
      {"max_position_embeddings", 128}, {"seed", 5},         {"dtype", "F32"}};
  StatusOr<TrainerOutcome> made = RunTrainer({"model-init", inputs.model.string(), init.dump()}, nullptr);
  if (!made.ok() || made->exit_code != 0) return InternalError("model init failed");
  WriteInstructions(inputs.data);

  json files = json::object();
  for (const auto& entry : fs::directory_iterator(inputs.model)) {
    PARSYN_ASSIGN_OR_RETURN(json id, UploadFile(api, "/api/v1/uploads", entry.path(), "upload_id"));
    files[entry.path().filename().string()] = id;
  }
  PARSYN_ASSIGN_OR_RETURN(http::ClientResponse model_res,
                          api.PostJson("/api/v1/models", {{"name", "demo-llama"}, {"files", files}}));
  PARSYN_ASSIGN_OR_RETURN(json model_body, model_res.Json());
  inputs.model_id = model_body["id"];
  PARSYN_ASSIGN_OR_RETURN(inputs.dataset_id,
                          UploadFile(api, "/api/v1/datasets?name=demo-instructions.jsonl", inputs.data, "id"));
  return inputs;
}

// The id of the managed worker the server registers as it starts (waits up to 30 s for it).
StatusOr<json> ManagedWorkerIds(http::Client& api, const fs::path& work) {
  json managed_ids = json::array();
  for (int i = 0; i < 300 && managed_ids.empty(); ++i) {
    auto listed = api.Get("/api/v1/workers");
    StatusOr<json> body = listed.ok() ? listed->Json() : StatusOr<json>(listed.status());
    if (body.ok()) {
      for (const json& w : (*body)["workers"]) {  // `body` outlives the loop (a temporary would not)
        if (w.value("kind", "") == "managed" && w.value("name", "") == "managed-1") managed_ids.push_back(w["id"]);
      }
    }
    if (managed_ids.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  if (managed_ids.empty()) {
    return UnavailableError("the server did not register its managed worker; see " + (work / "server.log").string());
  }
  return managed_ids;
}

// Registers `count` own workers and starts a `parsyn worker` process for each; their ids go to `worker_ids`.
Status StartOwnWorkers(http::Client& api, const fs::path& self, const std::string& url, const fs::path& work, int count,
                       std::vector<std::unique_ptr<Background>>& workers, json& worker_ids) {
  for (int i = 0; i < count; ++i) {
    const std::string name = "demo-" + std::to_string(i + 1);
    PARSYN_ASSIGN_OR_RETURN(
        http::ClientResponse registered,
        api.PostJson("/api/v1/workers", {{"name", name + "-" + std::to_string(getpid())}, {"kind", "own"}}));
    PARSYN_ASSIGN_OR_RETURN(json body, registered.Json());
    worker_ids.push_back(body["id"]);
    workers.push_back(std::make_unique<Background>(
        self,
        std::vector<std::string>{"worker", "--server", url, "--name", name, "--cache-dir",
                                 (work / ("worker-" + std::to_string(i + 1))).string(), "--threads", "1"},
        work / ("worker-" + std::to_string(i + 1) + ".log"),
        std::vector<std::pair<std::string, std::string>>{{"PARSYN_WORKER_TOKEN", body["token"].get<std::string>()}}));
  }
  return Status::Ok();
}

json DemoJobSpec(const DemoFlags& f, const DemoInputs& inputs, const json& worker_ids, const json& managed_ids) {
  return {{"name", "demo-federated-lora"},
          {"dataset_id", inputs.dataset_id},
          {"model_id", inputs.model_id},
          {"config",
           {{"batch_size", 16},
            {"learning_rate", 1e-2},
            {"mixed_precision", DemoPrecision(f) == "bf16" ? "bf16" : "no"},
            {"use_peft", true},
            {"lora_r", 8},
            {"lora_alpha", 16},
            {"lora_dropout", 0.0},
            {"max_seq_len", 32},
            {"lora_target_modules", kTargets},
            {"lr_scheduler", "constant"},
            {"validation_fraction", 0.1},
            {"seed", 1}}},
          {"distributed",
           {{"enabled", true},
            {"num_rounds", f.rounds},
            {"steps_per_round", f.steps},
            {"min_workers", f.workers},
            {"max_workers", f.workers},
            {"aggregation_timeout", 300},
            {"fault_tolerance", 2}}},
          {"worker_selection", {{"mode", "mixed"}, {"worker_ids", worker_ids}, {"parsyn_worker_ids", managed_ids}}}};
}

// Prints one event of the job's stream; false once the job has ended (its status goes to `final_status`).
bool PrintJobEvent(const http::SseEvent& e, std::string& final_status) {
  json d = json::parse(e.data, nullptr, false);
  if (e.event == "worker_progress") {
    std::printf("\r  round %d  worker %lld  step %lld/%lld  loss %.4f   ", d.value("round", 0),
                static_cast<long long>(d.value("worker_id", int64_t{0})),
                static_cast<long long>(d.value("step", int64_t{0})),
                static_cast<long long>(d["total_steps"].is_number() ? d["total_steps"].get<int64_t>() : 0),
                d["loss"].is_number() ? d["loss"].get<double>() : 0.0);
    std::fflush(stdout);
  } else if (e.event == "round_committed") {
    std::printf("\r  round %d/%d committed: train loss %.4f%s\n", d.value("round", 0), d.value("total_rounds", 0),
                d["train_loss"].is_number() ? d["train_loss"].get<double>() : 0.0, "                    ");
  } else if (e.event == "round_failed") {
    std::printf("\n  round %d failed: %s\n", d.value("round", 0), d.value("reason", "").c_str());
  } else if (e.event == "job_status") {
    final_status = d.value("status", "");
    if (final_status != "queued" && final_status != "running") return false;
  }
  return true;
}

// Follows the job's event stream with live progress until it ends (or Ctrl-C); returns its final status.
StatusOr<std::string> FollowJob(http::Client& api, int64_t job_id) {
  std::string final_status;
  http::CallOptions follow;
  follow.timeout = std::chrono::minutes(10);
  std::stop_source stop_follow;
  follow.stop = stop_follow.get_token();
  std::jthread interrupt_watch([&](std::stop_token done) {
    while (!done.stop_requested() && !g_interrupted) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    if (g_interrupted) stop_follow.request_stop();
  });
  Status followed = api.ReadEvents(
      "/api/v1/training-jobs/" + std::to_string(job_id) + "/events",
      [&](const http::SseEvent& e) { return PrintJobEvent(e, final_status); }, follow);
  interrupt_watch.request_stop();
  if (g_interrupted) return CancelledError("interrupted; stopping the workers and the server");
  PARSYN_RETURN_IF_ERROR(followed);
  return final_status;
}

// The summary: the starting and per-round validation losses (each printed with the weights it measured: a round's is
// that of the global it committed), the best round, and exact-match accuracy before and after.
void PrintSummary(const StatusOr<json>& job_body, const StatusOr<json>& rounds_body, const StatusOr<json>& before,
                  const StatusOr<json>& after) {
  auto loss_text = [](const json& v) { return v.is_number() ? std::to_string(v.get<double>()) : std::string("-"); };
  std::cout << "\n==> summary\n";
  if (job_body.ok()) {
    std::cout << "  validation loss of the starting weights: "
              << loss_text(job_body->value("initial_validation_loss", json())) << "\n";
  }
  std::printf("  %-6s %-12s %-28s %s\n", "round", "train loss", "validation loss after round", "bytes down / up");
  if (!rounds_body.ok()) std::cout << "  (rounds unavailable: " << rounds_body.status().message() << ")\n";
  if (rounds_body.ok()) {
    for (const json& r : (*rounds_body)["rounds"]) {
      if (r["outcome"] != "committed") continue;
      const auto bytes = [&](const char* field) {
        return r.contains(field) && r[field].is_number() ? r[field].get<long long>() : 0LL;
      };
      std::printf("  %-6d %-12.4f %-28s %lld / %lld\n", r["round"].get<int>(),
                  r["train_loss"].is_number() ? r["train_loss"].get<double>() : 0.0,
                  loss_text(r["validation_loss"]).c_str(), bytes("bytes_down"), bytes("bytes_up"));
    }
  }
  if (job_body.ok() && job_body->value("best_round", json()).is_number()) {
    std::cout << "  best: round " << (*job_body)["best_round"] << " (validation loss after round "
              << (*job_body)["best_round"] << ": " << loss_text((*job_body)["best_validation_loss"]) << ")\n";
  }
  auto accuracy = [](const StatusOr<json>& m) {
    if (!m.ok() || !m->contains("exact_match")) return std::string("n/a");
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%.1f%%", 100.0 * (*m)["exact_match"].get<double>());
    return std::string(buf);
  };
  std::cout << "  exact-match accuracy: before " << accuracy(before) << ", after " << accuracy(after) << "\n";
}

StatusOr<json> GetJson(http::Client& api, const std::string& path) {
  PARSYN_ASSIGN_OR_RETURN(http::ClientResponse res, api.Get(path));
  return res.Json();
}

int RunDemo(const DemoFlags& f) {
  const auto started = SteadyClock::now();
  struct sigaction action {};
  action.sa_handler = OnInterrupt;
  sigemptyset(&action.sa_mask);
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);

  StatusOr<fs::path> self = SelfExecutablePath();
  if (!self.ok()) return Fail("demo", self.status().message());
  if (f.workers < 2)
    return Fail("demo", "--workers must be at least 2 (one managed by the server, the rest own workers)");
  const fs::path data_dir = fs::absolute(f.data_dir);
  const fs::path work = data_dir / "demo";
  std::error_code ec;
  fs::remove_all(work, ec);
  fs::create_directories(work, ec);
  if (ec) return Fail("demo", "cannot create " + work.string() + ": " + ec.message());

  StatusOr<DemoServer> server = StartServer(*self, f, data_dir, work);
  if (!server.ok()) return Fail("demo", server.status().message());
  http::Client& api = *server->api;
  StatusOr<DemoInputs> inputs = RegisterModelAndData(api, work);
  if (!inputs.ok()) return Fail("demo", inputs.status().message());

  std::cout << "==> starting " << f.workers - 1 << " own workers beside the server's managed one\n";
  StatusOr<json> managed_ids = ManagedWorkerIds(api, work);
  if (!managed_ids.ok()) return Fail("demo", managed_ids.status().message());
  std::vector<std::unique_ptr<Background>> workers;
  json worker_ids = json::array();
  Status started_workers = StartOwnWorkers(api, *self, server->url, work, f.workers - 1, workers, worker_ids);
  if (!started_workers.ok()) return Fail("demo", started_workers.message());

  StatusOr<json> before = Evaluate(work, inputs->model, inputs->data, {});
  auto job_res = api.PostJson("/api/v1/training-jobs", DemoJobSpec(f, *inputs, worker_ids, *managed_ids));
  if (!job_res.ok()) return Fail("demo", job_res.status().message());
  const int64_t job_id = (*job_res->Json())["id"];
  std::cout << "==> federated LoRA job " << job_id << ": " << f.rounds << " rounds x " << f.steps << " steps, "
            << f.workers << " workers, " << DemoPrecisionSaid(f) << " (dashboard: " << server->url << "/)\n";
  StatusOr<std::string> final_status = FollowJob(api, job_id);
  if (!final_status.ok()) return Fail("demo", final_status.status().message());
  if (*final_status != "succeeded")
    return Fail("demo", "the job ended " + *final_status + "; logs in " + work.string());

  const fs::path adapter = work / "adapter";
  fs::create_directories(adapter, ec);
  const std::string job_path = "/api/v1/training-jobs/" + std::to_string(job_id);
  for (const char* name : {"adapter_model.safetensors", "adapter_config.json"}) {
    auto got = api.DownloadToFile(job_path + "/artifacts/" + name, adapter / name);
    if (!got.ok()) return Fail("demo", got.status().message());
  }
  StatusOr<json> after = Evaluate(work, inputs->model, inputs->data, adapter / "adapter_model.safetensors");
  StatusOr<json> rounds = GetJson(api, job_path + "/rounds");
  StatusOr<json> job_view = GetJson(api, job_path);
  for (auto& w : workers) w->Stop();

  PrintSummary(job_view, rounds, before, after);
  std::printf("  wall time: %.0f s\n", std::chrono::duration<double>(SteadyClock::now() - started).count());
  std::cout << "  adapter: " << adapter.string() << "\n  dashboard: " << server->url << "/ (while a server runs on "
            << data_dir.string() << ")\n  logs: " << work.string() << "\n";
  return 0;
}

}  // namespace

void AddDemoCommand(CLI::App& app, int& exit_code) {
  auto flags = std::make_shared<DemoFlags>();
  CLI::App* demo = app.add_subcommand("demo", "run the platform end to end on this machine (server, 3 workers, a job)");
  demo->add_option("--data-dir", flags->data_dir, "the server's data folder")->capture_default_str();
  demo->add_option("--listen", flags->listen, "the server's address")->capture_default_str();
  demo->add_option("--workers", flags->workers, "local workers (one of them managed by the server), at least 2")
      ->capture_default_str();
  demo->add_option("--rounds", flags->rounds, "federated rounds")->capture_default_str();
  demo->add_option("--steps", flags->steps, "steps per round")->capture_default_str();
  demo->add_option("--precision", flags->precision,
                   "the job's precision: bf16, fp32, or auto (bf16 where the CPU has AMX or AVX512-BF16, else fp32)")
      ->check(CLI::IsMember({"auto", "bf16", "fp32"}))
      ->capture_default_str();
  demo->callback([flags, &exit_code] { exit_code = RunDemo(*flags); });
}

}  // namespace parsyn::cli
