// parsyn job create -f FILE | list | get ID | watch ID | stop ID | cancel ID | download ID [--out DIR]
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <map>
#include <sstream>

#include "cli/coordinator_commands.h"
#include "cli/progress_bar.h"
#include "cli/remote.h"

namespace parsyn::cli {
namespace {

using nlohmann::json;

struct JobFlags {
  RemoteFlags remote;
  std::string file;
  int64_t id = 0;
  std::string out;
  bool all = false;
  // `job create` overrides of the spec file's ids (0 / -1 / empty: keep the file's).
  int64_t dataset_id = 0;
  int64_t model_id = 0;
  std::vector<int64_t> worker_ids;
  int managed_workers = -1;
};

std::string JobPath(int64_t id, std::string_view suffix = "") {
  return "/api/v1/training-jobs/" + std::to_string(id) + std::string(suffix);
}

// The ids of the server's first `count` managed workers (not revoked, lowest ids first): what
// `parsyn server --managed-workers N` runs. FailedPrecondition when it has fewer.
StatusOr<std::vector<int64_t>> ManagedWorkerIds(http::Client& client, int count) {
  PARSYN_ASSIGN_OR_RETURN(json workers, ListAll(client, "/api/v1/workers", "workers"));
  std::vector<int64_t> ids;
  for (const json& w : workers) {
    if (w.value("kind", "") == "managed" && w.value("status", "") != "revoked") ids.push_back(w["id"].get<int64_t>());
  }
  std::sort(ids.begin(), ids.end());
  if (static_cast<int>(ids.size()) < count) {
    return FailedPreconditionError("--managed-workers " + std::to_string(count) + ": the server has " +
                                   std::to_string(ids.size()) +
                                   " managed workers (start it with `parsyn server --managed-workers N`)");
  }
  ids.resize(static_cast<size_t>(count));
  return ids;
}

// Applies --dataset, --model, --workers and --managed-workers to the spec (docs/training.md, "Job spec"), so that
// a spec written for another server (examples/*.json) runs as it is. Changing a worker list sets
// worker_selection.mode from the lists that are left (both: mixed; one: own or managed).
Status ApplyCreateOverrides(const JobFlags& f, http::Client& client, json& spec) {
  if (!spec.is_object()) return InvalidArgumentError(f.file + " must hold a JSON object (the job spec)");
  if (f.dataset_id > 0) spec["dataset_id"] = f.dataset_id;
  if (f.model_id > 0) spec["model_id"] = f.model_id;
  if (f.worker_ids.empty() && f.managed_workers < 0) return Status::Ok();
  if (!spec.contains("worker_selection") || !spec["worker_selection"].is_object()) {
    spec["worker_selection"] = json::object();
  }
  json& selection = spec["worker_selection"];
  if (!f.worker_ids.empty()) selection["worker_ids"] = f.worker_ids;
  if (f.managed_workers == 0) selection.erase("parsyn_worker_ids");
  if (f.managed_workers > 0) {
    PARSYN_ASSIGN_OR_RETURN(std::vector<int64_t> managed, ManagedWorkerIds(client, f.managed_workers));
    selection["parsyn_worker_ids"] = managed;
  }
  auto listed = [&](const char* key) {
    return selection.contains(key) && selection[key].is_array() && !selection[key].empty();
  };
  const bool own = listed("worker_ids");
  const bool managed = listed("parsyn_worker_ids");
  if (own || managed) selection["mode"] = own && managed ? "mixed" : own ? "own" : "managed";
  return Status::Ok();
}

int Create(const JobFlags& f) {
  std::ifstream in(f.file);
  if (!in) return Fail("job create", NotFoundError("cannot read " + f.file));
  std::stringstream ss;
  ss << in.rdbuf();
  json body = json::parse(ss.str(), nullptr, false);
  if (body.is_discarded()) return Fail("job create", InvalidArgumentError(f.file + " is not valid JSON"));
  auto client = ConnectToServer(f.remote);
  if (!client.ok()) return Fail("job create", client.status());
  if (Status s = ApplyCreateOverrides(f, **client, body); !s.ok()) return Fail("job create", s);
  auto res = (*client)->PostJson("/api/v1/training-jobs", body);
  if (!res.ok()) return Fail("job create", res.status());
  auto job = res->Json();
  if (!job.ok()) return Fail("job create", job.status());
  if (JsonOutput(f.remote)) {
    PrintJson(*job);
  } else {
    std::cout << "created training job " << (*job)["id"] << " (" << (*job)["status"].get<std::string>() << ")"
              << std::endl;
  }
  // Settings the server accepted but ignores (or that make the job a poor fit); the job is created all the same.
  if (auto warnings = job->find("warnings"); warnings != job->end() && warnings->is_array()) {
    for (const json& w : *warnings) {
      if (w.is_string()) std::cerr << "warning: " << w.get<std::string>() << "\n";
    }
  }
  return 0;
}

int ListJobs(const JobFlags& f) {
  auto client = ConnectToServer(f.remote);
  if (!client.ok()) return Fail("job list", client.status());
  StatusOr<json> jobs = ListAll(**client, "/api/v1/training-jobs", "training_jobs");
  if (!jobs.ok()) return Fail("job list", jobs.status());
  if (JsonOutput(f.remote)) {
    PrintJson(ListAnswer("training_jobs", *std::move(jobs)));
    return 0;
  }
  std::cout << std::left << std::setw(6) << "ID" << std::setw(28) << "NAME" << std::setw(11) << "STATUS"
            << "ROUND\n";
  for (const json& j : *jobs) {
    std::cout << std::left << std::setw(6) << j["id"].get<int64_t>() << std::setw(28) << j["name"].get<std::string>()
              << std::setw(11) << j["status"].get<std::string>() << j["committed_round"].get<int64_t>() << "/"
              << (j["total_rounds"].is_null() ? json("?") : j["total_rounds"]) << "\n";
  }
  return 0;
}

int SimpleCall(const JobFlags& f, const std::string& command, http::Method method, std::string_view suffix) {
  auto client = ConnectToServer(f.remote);
  if (!client.ok()) return Fail(command, client.status());
  auto res = method == http::Method::kGet ? (*client)->Get(JobPath(f.id, suffix))
                                          : (*client)->PostJson(JobPath(f.id, suffix), json::object());
  if (!res.ok()) return Fail(command, res.status());
  auto body = res->Json();
  if (!body.ok()) return Fail(command, body.status());
  if (JsonOutput(f.remote)) {
    PrintJson(*body);
  } else {
    // stop/cancel answer with the job: say what happened in a line (`--output json` has the whole job). A stop lets
    // the round in flight finish, so the job may still be running.
    const std::string status = body->value("status", std::string("?"));
    std::cout << "job " << f.id << ": " << status;
    if (status == "queued" || status == "running") {
      std::cout << " (" << command.substr(4) << " requested; `parsyn job watch " << f.id << "` follows it to the end)";
    }
    std::cout << "\n";
  }
  return 0;
}

// `job get`: the job's JSON on stdout (for scripts), then its validation losses, each named by the weights it
// measured, on stderr (for people; `| jq` still sees only the JSON).
int Get(const JobFlags& f) {
  auto client = ConnectToServer(f.remote);
  if (!client.ok()) return Fail("job get", client.status());
  auto res = (*client)->Get(JobPath(f.id, ""));
  if (!res.ok()) return Fail("job get", res.status());
  auto body = res->Json();
  if (!body.ok()) return Fail("job get", body.status());
  PrintJson(*body);
  if (JsonOutput(f.remote)) return 0;  // the JSON alone
  const json& j = *body;
  if (j.value("initial_validation_loss", json()).is_number()) {
    std::cerr << "validation loss of the starting weights: " << RoundedNumber(j["initial_validation_loss"]) << "\n";
  }
  if (j.value("final_validation_loss", json()).is_number()) {
    std::cerr << "validation loss after round " << j["committed_round"]
              << " (the last, final evaluation): " << RoundedNumber(j["final_validation_loss"]) << "\n";
  }
  if (j.value("best_round", json()).is_number()) {
    std::cerr << "best: round " << j["best_round"] << " (validation loss after round " << j["best_round"] << ": "
              << RoundedNumber(j["best_validation_loss"]) << "; its global is the best/ artifact once the job ends)\n";
  }
  if (j.contains("status_reason") && j["status"] != "failed") {
    std::cerr << j["status"].get<std::string>() << ": " << j["status_reason"].get<std::string>() << "\n";
  }
  return 0;
}

// What `job watch` shows and remembers between events.
struct WatchScreen {
  WatchScreen(std::ostream& out, bool interactive) : out(out), interactive(interactive) {}

  std::ostream& out;
  bool interactive;                     // `out` is a terminal: progress bars are redrawn in place
  std::map<int64_t, std::string> bars;  // worker -> its latest progress line
  int64_t total_rounds = 0;             // from round events; a round above it is the final evaluation
  std::map<int64_t, StepPace> paces;    // worker -> the pace of its current task (its ETA)
  std::string final_status;             // the job's status once it has ended

  void RedrawBars() {
    for (const auto& [worker, line] : bars) out << "  worker " << worker << "  " << line << "\n";
    if (interactive && !bars.empty()) out << "\033[" << bars.size() << "A" << std::flush;
  }
};

// A worker_progress event: the worker's bar, printed at once where bars are not redrawn.
void ShowWorkerProgress(const json& d, WatchScreen& screen) {
  const int64_t total = d.value("total_steps", json()).is_number() ? d["total_steps"].get<int64_t>() : 0;
  const double loss = d["loss"].is_number() ? d["loss"].get<double>() : 0.0;
  // The protocol carries no learning rate; throughput is tokens/s or samples/s, whichever the trainer counts
  // (named in throughput_unit by workers that say it).
  const double rate = d.value("throughput", json()).is_number() ? d["throughput"].get<double>() : std::nan("");
  // A worker that does not name the unit (older ones) gets no rate shown rather than a guessed one.
  const json unit = d.value("throughput_unit", json());
  const std::string per_second = unit.is_string() ? unit.get<std::string>() : "";
  const int64_t worker = d["worker_id"].get<int64_t>();
  const int64_t step = d["step"].get<int64_t>();
  const double eta = screen.paces[worker].EtaSeconds(step, total, std::chrono::steady_clock::now());
  screen.bars[worker] = FormatProgressLine(step, total, loss, std::nan(""), rate, per_second, eta);
  if (!screen.interactive) {
    screen.out << "  worker " << d["worker_id"] << "  " << screen.bars[d["worker_id"].get<int64_t>()] << "\n";
  }
}

// A round_committed event's line: its updates, train loss and (dp_fedavg) the privacy spent so far; an asynchronous
// job's rounds are versions, with their updates' staleness.
void ShowRoundCommitted(const json& d, std::ostream& out) {
  const bool version = d.contains("staleness");
  out << (version ? "version " : "round ") << d["round"] << "/" << d["total_rounds"]
      << " committed: " << d["num_updates"] << " updates";
  if (version) {
    std::string staleness;
    for (const json& s : d["staleness"]) staleness += (staleness.empty() ? "" : ", ") + s.dump();
    out << " (staleness " << staleness << ")";
  }
  out << ", train loss " << RoundedNumber(d["train_loss"]);
  // dp_fedavg: the privacy spent so far (ε for the job's δ), as GET .../rounds reports it.
  if (const json privacy = d.value("privacy", json()); privacy.is_object()) {
    out << ", privacy " << (privacy["epsilon"].is_number() ? "ε " + RoundedNumber(privacy["epsilon"]) : "unbounded")
        << " at δ " << privacy["delta"].dump();
  }
  out << "\n";
}

// A job_status event: the status, its reason and best round; an ended job's status is kept as the final one.
void ShowJobStatus(const json& d, WatchScreen& screen) {
  std::ostream& out = screen.out;
  const std::string status = d["status"].get<std::string>();
  out << "job " << status;
  if (d.contains("reason")) out << ": " << d["reason"].get<std::string>();
  out << "\n";
  if (d.contains("best_round")) {
    out << "best: round " << d["best_round"] << " (validation loss after round " << d["best_round"] << ": "
        << RoundedNumber(d["best_validation_loss"]) << ")\n";
  }
  if (status != "queued" && status != "running") screen.final_status = status;
}

// Shows one of the job's events (its name and its data).
void ShowJobEvent(const std::string& event, const json& d, WatchScreen& screen) {
  std::ostream& out = screen.out;
  if (d.value("total_rounds", json()).is_number_integer()) screen.total_rounds = d["total_rounds"].get<int64_t>();
  if (event == "worker_progress") {
    ShowWorkerProgress(d, screen);
  } else if (event == "round_started") {
    screen.bars.clear();
    screen.paces.clear();
    out << "round " << d["round"] << "/" << d["total_rounds"] << " (attempt " << d["attempt"] << ") started\n";
  } else if (event == "round_committed") {
    ShowRoundCommitted(d, out);
  } else if (event == "round_failed") {
    out << "round " << d["round"] << " attempt " << d["attempt"] << " failed (" << d["consecutive_failures"] << "/"
        << d["fault_tolerance"] << "): " << d["reason"].get<std::string>() << "\n";
  } else if (event == "worker_dropped") {
    const bool final_evaluation = screen.total_rounds > 0 && d["round"].get<int64_t>() > screen.total_rounds;
    out << "worker " << d["worker_id"] << " left "
        << (final_evaluation ? std::string("the final evaluation") : "round " + d["round"].dump()) << ": "
        << d["reason"].get<std::string>() << "\n";
  } else if (event == "update_rejected") {
    out << "update of worker " << d["worker_id"] << " rejected: " << d["reason"].get<std::string>() << "\n";
  } else if (event == "task_assigned") {
    // An evaluate task is the job's final evaluation (its round number is total_rounds + 1: not shown).
    const bool evaluate = d.value("kind", "") == "evaluate";
    screen.paces.erase(d["worker_id"].get<int64_t>());
    screen.bars[d["worker_id"].get<int64_t>()] =
        (evaluate ? "final evaluation on shard " : "assigned shard ") + std::to_string(d["shard"].get<int>());
  } else if (event == "global_evaluated") {
    // Each loss names the weights it measured; the final evaluation belongs to the job's end.
    const int64_t global_round = d["global_round"].get<int64_t>();
    out << (d.value("final", false) ? "final evaluation: " : "") << "validation loss "
        << (global_round == 0 ? "of the starting weights" : "after round " + std::to_string(global_round)) << ": "
        << RoundedNumber(d["validation_loss"]) << "\n";
  } else if (event == "warning") {
    out << "warning: " << d.value("message", "") << "\n";
  } else if (event == "job_status") {
    ShowJobStatus(d, screen);
  }
}

// Prints the job's events as they happen: round starts and commits, per-worker progress bars, drops, the end.
int Watch(const JobFlags& f) {
  auto client = ConnectToServer(f.remote);
  if (!client.ok()) return Fail("job watch", client.status());
  // Under --output json the lines for people go to stderr and stdout gets the job's JSON once it ends.
  const bool json_output = JsonOutput(f.remote);
  WatchScreen screen(json_output ? std::cerr : std::cout, isatty(json_output ? STDERR_FILENO : STDOUT_FILENO) != 0);
  std::ostream& out = screen.out;
  const bool interactive = screen.interactive;
  const std::string& final_status = screen.final_status;
  std::string last_event_id;
  for (int attempt = 0; attempt < 5 && final_status.empty(); ++attempt) {
    http::CallOptions call;
    call.timeout = std::chrono::milliseconds(0);
    if (!last_event_id.empty()) call.headers.push_back({"Last-Event-ID", last_event_id});
    Status s = (*client)->ReadEvents(
        JobPath(f.id, "/events"),
        [&](const http::SseEvent& e) {
          if (!e.id.empty()) last_event_id = e.id;
          json d = json::parse(e.data, nullptr, false);
          if (d.is_discarded()) return true;
          if (interactive && !screen.bars.empty()) out << "\033[J";
          ShowJobEvent(e.event, d, screen);
          if (interactive) screen.RedrawBars();
          out << std::flush;
          return final_status.empty();
        },
        call);
    if (!s.ok() && final_status.empty()) {
      if (s.code() == StatusCode::kNotFound || s.code() == StatusCode::kUnauthenticated) return Fail("job watch", s);
      std::cerr << "parsyn job watch: " << s.message() << " (reconnecting)\n";
    }
  }
  if (interactive && !screen.bars.empty()) out << "\033[J";
  if (json_output && !final_status.empty()) {
    auto res = (*client)->Get(JobPath(f.id, ""));
    if (!res.ok()) return Fail("job watch", res.status());
    auto job = res->Json();
    if (!job.ok()) return Fail("job watch", job.status());
    PrintJson(*job);
  }
  return final_status == "succeeded" || final_status == "stopped" ? 0 : 1;
}

int Download(const JobFlags& f) {
  auto client = ConnectToServer(f.remote);
  if (!client.ok()) return Fail("job download", client.status());
  auto res = (*client)->Get(JobPath(f.id, "/artifacts"));
  if (!res.ok()) return Fail("job download", res.status());
  auto body = res->Json();
  if (!body.ok()) return Fail("job download", body.status());
  const std::filesystem::path out = f.out.empty() ? "job-" + std::to_string(f.id) : f.out;
  int downloaded = 0;
  json files = json::array();
  for (const json& a : (*body)["artifacts"]) {
    const std::string name = a["name"];
    if (!f.all && name.rfind("rounds/", 0) == 0) continue;  // per-round globals only with --all
    const std::filesystem::path dest = out / name;
    std::error_code ec;
    std::filesystem::create_directories(dest.parent_path(), ec);
    http::CallOptions call;
    TransferProgress progress(std::cerr, ShowTransferProgress(f.remote), name,
                              a.value("size_bytes", json()).is_number_unsigned() ? a["size_bytes"].get<uint64_t>() : 0);
    call.on_transfer = [&progress](uint64_t bytes) { progress.Update(bytes); };
    auto got = (*client)->DownloadToFile(JobPath(f.id, "/artifacts/" + name), dest, call);
    progress.Finish();
    if (!got.ok()) return Fail("job download", got.status());
    if (!JsonOutput(f.remote)) std::cout << dest.string() << " (" << *got << " bytes)\n";
    files.push_back(json{{"name", name}, {"path", dest.string()}, {"size_bytes", *got}});
    ++downloaded;
  }
  if (downloaded == 0) {
    return Fail("job download", FailedPreconditionError("training job " + std::to_string(f.id) +
                                                        " has no result yet (no round committed)"));
  }
  if (JsonOutput(f.remote)) PrintJson(json{{"job_id", f.id}, {"out", out.string()}, {"files", files}});
  return 0;
}

bool IsDigits(const std::string& value) {
  return !value.empty() && std::all_of(value.begin(), value.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// Ids are positive integers; CLI11's own range check would print the whole range of a double.
const CLI::Validator kId(
    [](const std::string& value) {
      return IsDigits(value) && value.size() < 19 && std::stoll(value) > 0
                 ? std::string()
                 : "must be a positive id, not '" + value + "'";
    },
    "ID");

}  // namespace

void AddJobCommands(CLI::App& app, int& exit_code) {
  auto flags = std::make_shared<JobFlags>();
  CLI::App* job = SubcommandGroup(app, "job", "training jobs on a coordinator");
  job->require_subcommand(1);
  auto add = [&](const std::string& name, const std::string& help, bool takes_id) {
    CLI::App* cmd = job->add_subcommand(name, help);
    AddRemoteFlags(*cmd, flags->remote);
    if (takes_id) cmd->add_option("id", flags->id, "training job id")->required();
    return cmd;
  };
  CLI::App* create = add("create", "create a job from a JSON spec file", false);
  create->callback([flags, &exit_code] { exit_code = Create(*flags); });
  create->add_option("-f,--file", flags->file, "the job spec (JSON)")->required();
  create->add_option("--dataset", flags->dataset_id, "dataset id (replaces the file's dataset_id)")->check(kId);
  create->add_option("--model", flags->model_id, "model id (replaces the file's model_id)")->check(kId);
  create->add_option("--workers", flags->worker_ids, "own worker ids, e.g. 1,3 (replaces worker_selection.worker_ids)")
      ->delimiter(',')
      ->check(kId);
  create
      ->add_option("--managed-workers", flags->managed_workers,
                   "use the server's first N managed workers (replaces worker_selection.parsyn_worker_ids; 0: none)")
      ->check(CLI::Validator(
          [](const std::string& value) {
            return IsDigits(value) && value.size() < 6 ? std::string()
                                                       : "must be a count (0 or more), not '" + value + "'";
          },
          "N"));
  add("list", "list jobs", false)->callback([flags, &exit_code] { exit_code = ListJobs(*flags); });
  add("get", "show a job", true)->callback([flags, &exit_code] { exit_code = Get(*flags); });
  add("watch", "follow a job's rounds and workers live", true)->callback([flags, &exit_code] {
    exit_code = Watch(*flags);
  });
  add("stop", "finish with the latest committed weights", true)->callback([flags, &exit_code] {
    exit_code = SimpleCall(*flags, "job stop", http::Method::kPost, "/stop");
  });
  add("cancel", "cancel a job", true)->callback([flags, &exit_code] {
    exit_code = SimpleCall(*flags, "job cancel", http::Method::kPost, "/cancel");
  });
  CLI::App* download = add("download", "download the job's result (the adapter in PEFT layout, or the model)", true);
  download->add_option("--out", flags->out, "destination folder (default: job-<id>)");
  download->add_flag("--all", flags->all, "also every round's global");
  AddProgressFlag(*download, flags->remote);
  download->callback([flags, &exit_code] { exit_code = Download(*flags); });
}

}  // namespace parsyn::cli
