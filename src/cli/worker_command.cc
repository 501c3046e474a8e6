// parsyn worker --server URL --token TOKEN [--name N] [--device cpu|cuda:N] [--data PATH] [--cache-dir DIR]
//               [--ca-file CA.pem] [--cert worker.pem --key worker.key] [--trainer NAME=COMMAND ...] [--config FILE]
// Runs the worker agent (src/worker/agent.h) until SIGTERM or SIGINT; trainers run as its child processes.
// --trainer (repeatable; also the config file's [trainers] section, which the flags override name by name) offers a
// trainer of the trainer contract (docs/trainer-contract.md) under NAME; "builtin" is parsyn-trainer unless mapped to
// another command. Every trainer's --describe runs at start: one that is missing or fails stops the worker.
// --ca-file trusts a coordinator's private CA (besides the system's); --cert/--key are this worker's client
// certificate for a coordinator with mutual TLS (`parsyn server --client-ca`; issued by `parsyn worker register
// --ca-cert --ca-key`), whose identity must be this token's worker ("worker-<id>").
// --data: the worker's own file, trained on by jobs whose data.source is "workers" (it never leaves the machine).
// --lora-rank and --device-memory: what the hello announces of the worker's capacity, which sizes its LoRA rank in
// jobs of mixed ranks (docs/training.md "Workers of different ranks").
// --bootstrap-key-file (instead of --token): the worker registers itself as a managed worker first (POST
// /api/v1/workers/bootstrap with the operator's bootstrap key; `parsyn server --worker-bootstrap-key-file`) under
// --name, else the host name (a Kubernetes pod's name), waiting for a coordinator that does not answer yet. Each
// start registers a new worker and revokes the earlier record of that name (deploy/kubernetes/workers.yaml). Over
// https it sends a certificate request for a new key, so a coordinator with mutual TLS answers its certificate.
// Shares the `worker` group with `parsyn worker register|list` (worker_commands.cc): without a subcommand, the group
// itself runs the agent.
#include <signal.h>
#include <sys/prctl.h>

#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <mutex>
#include <regex>
#include <thread>

#include "base/atomic_file.h"
#include "base/log.h"
#include "base/subprocess.h"
#include "base/text_file.h"
#include "cli/commands.h"
#include "cli/config_file.h"
#include "cli/trainer_runner.h"
#include "coordinator/auth.h"
#include "http/client.h"
#include "protocol/messages.h"
#include "worker/agent.h"

namespace parsyn::cli {
namespace {

namespace fs = std::filesystem;

std::atomic<bool> g_stop_signal{false};
static_assert(std::atomic<bool>::is_always_lock_free);
void OnStopSignal(int) { g_stop_signal = true; }

fs::path DefaultCacheDir() {
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg != nullptr && *xdg != '\0') {
    return fs::path(xdg) / "parsyn" / "worker";
  }
  if (const char* home = std::getenv("HOME"); home != nullptr && *home != '\0') {
    return fs::path(home) / ".cache" / "parsyn" / "worker";
  }
  return fs::current_path() / "parsyn-worker-cache";
}

struct AgentFlags {
  std::string server;
  std::string token;
  std::string name;
  std::string device = "cpu";
  std::string data;
  std::string cache_dir;
  std::string ca_file;
  std::string cert;
  std::string key;
  std::string peer_ca;
  std::string bootstrap_key_file;
  std::vector<std::string> trainers;  // NAME=COMMAND
  std::string config;                 // --config: the config file whose [trainers] section applies
  int threads = 0;
  int lora_rank = 0;             // --lora-rank: 0, any
  double device_memory_gib = 0;  // --device-memory: 0, measured
  bool exit_with_parent = false;
};

// What a bootstrap registration gives: the worker's token and, from a coordinator with mutual TLS, its client
// certificate (PEM) for the key of the request the worker sent.
struct BootstrapIdentity {
  std::string token;
  std::string certificate_pem;
  std::string private_key_pem;
};

// Registers this worker as a managed worker with the bootstrap key in `f.bootstrap_key_file` (see the top of the
// file). Over https without --cert, it sends a certificate signing request for a new key, so that a coordinator with
// mutual TLS can answer a certificate. Retries, every few seconds, while the coordinator cannot be reached or answers
// 5xx (it may be starting, or a standby); fails at once on any other answer (a wrong key: 401).
StatusOr<BootstrapIdentity> Bootstrap(const AgentFlags& f, const std::string& server_url, const std::string& name) {
  StatusOr<std::string> key = ReadTrimmedTextFile(f.bootstrap_key_file);
  if (!key.ok()) return InvalidArgumentError("--bootstrap-key-file: " + key.status().message());
  http::ClientOptions options;
  options.base_url = server_url;
  options.bearer_token = *key;
  options.ca_file = f.ca_file;
  options.client_cert_file = f.cert;
  options.client_key_file = f.key;
  options.max_attempts = 1;
  http::Client client(options);
  nlohmann::json body = {{"name", name}};
  std::optional<coordinator::KeyAndCertificateRequest> request;
  if (f.cert.empty() && server_url.starts_with("https://")) {
    StatusOr<coordinator::KeyAndCertificateRequest> made = coordinator::NewKeyAndCertificateRequest(name);
    if (!made.ok()) return made.status();
    request = std::move(*made);
    body["csr"] = request->request_pem;
  }
  for (int attempt = 1;; ++attempt) {
    // Non-2xx answers come back as errors: 5xx and unreachable are worth waiting out, the rest are not.
    StatusOr<http::ClientResponse> res = client.PostJson("/api/v1/workers/bootstrap", body);
    if (res.ok()) {
      StatusOr<nlohmann::json> worker = res->Json();
      if (!worker.ok() || !worker->contains("token")) return InternalError("the bootstrap answer has no token");
      PARSYN_LOG_INFO("worker: registered as managed worker {} '{}'", (*worker)["id"].dump(), name);
      BootstrapIdentity identity{.token = (*worker)["token"].get<std::string>()};
      if (request && worker->value("certificate", nlohmann::json()).is_string()) {
        identity.certificate_pem = (*worker)["certificate"].get<std::string>();
        identity.private_key_pem = request->private_key_pem;
      }
      return identity;
    }
    const StatusCode code = res.status().code();
    if (code != StatusCode::kUnavailable && code != StatusCode::kInternal && code != StatusCode::kDeadlineExceeded) {
      return res.status().WithContext("the coordinator refused the bootstrap registration");
    }
    if (g_stop_signal) return CancelledError("stopped before the coordinator answered");
    PARSYN_LOG_WARN("worker: bootstrap registration at {} failed (attempt {}): {}; retrying", server_url, attempt,
                    res.status().ToString());
    for (int i = 0; i < 30 && !g_stop_signal; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

// The trainers the worker offers: parsyn-trainer as "builtin", then the config file's [trainers], then --trainer, a
// later entry of a name replacing an earlier one; each described (its --describe run). The first problem, named.
// When parsyn-trainer itself is offered, `launcher` forks its runs from one started copy (ForkRunsOf).
StatusOr<std::vector<worker::DescribedTrainer>> OfferedTrainers(const AgentFlags& f,
                                                                worker::ProcessTrainerLauncher& launcher) {
  std::vector<worker::TrainerCommand> commands;
  auto offer = [&commands](worker::TrainerCommand command) {
    for (worker::TrainerCommand& c : commands) {
      if (c.name == command.name) {
        c = std::move(command);
        return;
      }
    }
    commands.push_back(std::move(command));
  };
  PARSYN_ASSIGN_OR_RETURN(const fs::path builtin, FindTrainer());
  offer({.name = "builtin", .argv = {builtin.string()}});
  PARSYN_ASSIGN_OR_RETURN(const CliConfig config, LoadCliConfig(f.config));
  for (const auto& [name, command] : config.trainers) {
    StatusOr<worker::TrainerCommand> trainer = worker::ParseTrainerCommand(name + "=" + command);
    if (!trainer.ok()) return trainer.status().WithContext(config.path.string() + " [trainers]");
    offer(std::move(*trainer));
  }
  for (const std::string& spec : f.trainers) {
    PARSYN_ASSIGN_OR_RETURN(worker::TrainerCommand trainer, worker::ParseTrainerCommand(spec));
    offer(std::move(trainer));
  }
  for (const worker::TrainerCommand& command : commands) {
    if (command.argv == std::vector<std::string>{builtin.string()}) launcher.ForkRunsOf(builtin);
  }
  worker::TrainerSupervisor supervisor(launcher);
  return worker::DescribeTrainers(supervisor, commands);
}

// The agent's options from the flags, each checked (InvalidArgument saying which flag and why); creates the cache.
// `bootstrap`: the worker registers itself with a bootstrap key (no token).
StatusOr<worker::AgentOptions> AgentOptionsFrom(const AgentFlags& f, bool bootstrap) {
  if (!std::regex_match(f.device, std::regex("cpu|cuda(:[0-9]+)?"))) {
    return InvalidArgumentError("--device must be cpu, cuda or cuda:N, not '" + f.device + "'");
  }
  worker::AgentOptions options;
  options.server_url = f.server;
  while (!options.server_url.empty() && options.server_url.back() == '/') options.server_url.pop_back();
  options.token = f.token;
  // Without --name, the worker logs under the name it was registered with, once the coordinator's hello answer says it.
  options.name = f.name.empty() ? "worker-" + std::to_string(getpid()) : f.name;
  options.name_from_coordinator = f.name.empty();
  if (bootstrap && f.name.empty()) {
    char host[256] = {};
    options.name = ::gethostname(host, sizeof(host) - 1) == 0 && host[0] != '\0' ? host : options.name;
    options.name_from_coordinator = false;
  }
  options.device = f.device;
  options.trainer_threads = f.threads;
  if (f.lora_rank < 0 || f.lora_rank > protocol::kMaxLoraRank) {
    return InvalidArgumentError("--lora-rank must be between 1 and " + std::to_string(protocol::kMaxLoraRank) +
                                ", not " + std::to_string(f.lora_rank));
  }
  options.lora_rank = f.lora_rank;
  if (!(f.device_memory_gib >= 0) || f.device_memory_gib > 1e6) {
    return InvalidArgumentError("--device-memory must be a number of GiB between 0 and 1000000, not " +
                                std::to_string(f.device_memory_gib));
  }
  options.device_memory_bytes = static_cast<uint64_t>(f.device_memory_gib * 1024 * 1024 * 1024);
  if (f.cert.empty() != f.key.empty()) {
    return InvalidArgumentError("--cert and --key go together (a client certificate and its key)");
  }
  for (const auto& [flag, file] :
       {std::pair{"--ca-file", &f.ca_file}, {"--cert", &f.cert}, {"--key", &f.key}, {"--peer-ca", &f.peer_ca}}) {
    if (!file->empty() && !fs::is_regular_file(*file)) {
      return InvalidArgumentError(std::string(flag) + " " + *file + " is not a file");
    }
  }
  for (const std::string& url : worker::SplitServerUrls(options.server_url)) {
    if (!f.cert.empty() && !url.starts_with("https://")) {
      return InvalidArgumentError(
          "--cert and --key need an https:// --server (client certificates exist only over TLS), not " + url);
    }
  }
  options.ca_file = f.ca_file;
  options.client_cert_file = f.cert;
  options.client_key_file = f.key;
  options.peer_ca_file = f.peer_ca;
  std::error_code ec;
  if (!f.data.empty()) {
    options.local_data = fs::absolute(f.data, ec);
    if (!fs::is_regular_file(options.local_data)) {
      return InvalidArgumentError("--data " + f.data + " is not a readable file");
    }
    const std::string ext = options.local_data.extension().string();
    if (ext != ".jsonl" && ext != ".csv")
      return InvalidArgumentError("--data must be a .jsonl or .csv file, not " + f.data);
  }
  options.cache_dir = fs::absolute(f.cache_dir.empty() ? DefaultCacheDir() : fs::path(f.cache_dir), ec);
  PARSYN_RETURN_IF_ERROR(worker::CreateCacheRoot(options.cache_dir));
  return options;
}

// Registers this worker with the bootstrap key and takes the identity the coordinator answers: its token, and under
// mutual TLS this run's certificate and key, kept beside the cache (the key 0600).
Status TakeBootstrapIdentity(const AgentFlags& f, worker::AgentOptions& options) {
  PARSYN_ASSIGN_OR_RETURN(BootstrapIdentity identity, Bootstrap(f, options.server_url, options.name));
  options.token = identity.token;
  if (identity.certificate_pem.empty()) return Status::Ok();
  options.client_cert_file = options.cache_dir / "bootstrap-client.pem";
  options.client_key_file = options.cache_dir / "bootstrap-client.key";
  for (const auto& [file, pem, mode] : {std::tuple{options.client_key_file, identity.private_key_pem, 0600},
                                        std::tuple{options.client_cert_file, identity.certificate_pem, 0644}}) {
    PARSYN_RETURN_IF_ERROR(WriteFileAtomically(file, pem, static_cast<mode_t>(mode)));
  }
  PARSYN_LOG_INFO("worker: the coordinator issued this worker's client certificate (mutual TLS)");
  return Status::Ok();
}

void LogWorkerStart(const worker::AgentOptions& options) {
  std::string offered;
  for (const worker::DescribedTrainer& t : options.trainers) {
    offered += (offered.empty() ? "" : ", ") + t.command.name + " (" + t.command.CommandLine() + ")";
  }
  PARSYN_LOG_INFO("worker {}: server {}, device {}, cache {}{}, trainers: {}", options.name, options.server_url,
                  options.device, options.cache_dir.string(),
                  options.local_data.empty() ? "" : ", local data " + options.local_data.string(), offered);
}

int RunAgent(const AgentFlags& f) {
  auto fail = [](const std::string& message) {
    std::cerr << "parsyn worker: " << message << "\n";
    return 1;
  };
  if (f.exit_with_parent) {
    // A supervised worker (parsyn server --managed-workers) must not outlive a server that was SIGKILLed: the kernel
    // sends SIGTERM, which the agent handles as a clean leave. The check after prctl closes the race with an
    // already-dead parent. The parent to check is the one that started this process (SubprocessOptions::
    // die_with_parent names it): read here, getppid() may already be the process that inherited the orphan.
    const char* named = std::getenv(kDieWithParentEnv);
    const pid_t parent = named != nullptr ? static_cast<pid_t>(std::strtol(named, nullptr, 10)) : getppid();
    ::unsetenv(kDieWithParentEnv);
    if (prctl(PR_SET_PDEATHSIG, SIGTERM) != 0 || getppid() != parent) return fail("the supervising process is gone");
  }
  if (f.server.empty()) return fail("--server URL is required (or PARSYN_SERVER)");
  // A token wins over a bootstrap key (which a managed worker of `parsyn server` may inherit through the environment).
  const bool bootstrap = f.token.empty() && !f.bootstrap_key_file.empty();
  if (f.token.empty() && !bootstrap) {
    return fail(
        "--token TOKEN is required (or PARSYN_WORKER_TOKEN): see `parsyn worker register`; or "
        "--bootstrap-key-file FILE to register as a managed worker");
  }
  ::unsetenv("PARSYN_WORKER_TOKEN");  // read: the trainer children need not inherit it
  StatusOr<worker::AgentOptions> options = AgentOptionsFrom(f, bootstrap);
  if (!options.ok()) return fail(options.status().message());
  worker::ProcessTrainerLauncher launcher;
  StatusOr<std::vector<worker::DescribedTrainer>> trainers = OfferedTrainers(f, launcher);
  if (!trainers.ok()) return fail(trainers.status().message());
  options->trainers = std::move(*trainers);

  // A handler (not SIG_IGN, not a blocked mask) so that the trainer child, after exec, still stops on SIGTERM.
  struct sigaction action {};
  action.sa_handler = OnStopSignal;
  sigemptyset(&action.sa_mask);
  sigaction(SIGTERM, &action, nullptr);
  sigaction(SIGINT, &action, nullptr);
  signal(SIGPIPE, SIG_IGN);

  if (bootstrap) {
    if (Status taken = TakeBootstrapIdentity(f, *options); !taken.ok()) return fail(taken.message());
  }

  std::stop_source stop;
  std::jthread watcher([&stop](std::stop_token done) {
    while (!done.stop_requested()) {
      if (g_stop_signal) {
        PARSYN_LOG_INFO("worker: stopping (signal)");
        stop.request_stop();
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  });
  LogWorkerStart(*options);
  worker::Agent agent(*options, launcher);
  Status s = agent.Run(stop.get_token());
  watcher.request_stop();
  if (!s.ok()) return fail(s.message());
  return 0;
}

}  // namespace

void AddWorkerCommand(CLI::App& app, int& exit_code) {
  CLI::App* group = nullptr;
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) {
    if (sub->get_name() == "worker") group = sub;
  }
  if (group == nullptr) group = app.add_subcommand("worker", "run a worker, or register and list workers");
  auto flags = std::make_shared<AgentFlags>();
  group
      ->add_option("--server", flags->server,
                   "coordinator URL, e.g. http://10.0.0.5:8080; several, comma-separated, for coordinators in failover "
                   "(the worker follows the leader)")
      ->envname("PARSYN_SERVER");
  group->add_option("--token", flags->token, "this worker's token (from `parsyn worker register`)")
      ->envname("PARSYN_WORKER_TOKEN");
  group->add_option("--name", flags->name, "name used in this worker's logs (default: its registered name)");
  group
      ->add_option("--bootstrap-key-file", flags->bootstrap_key_file,
                   "instead of --token: register as a managed worker with this bootstrap key (the server's "
                   "--worker-bootstrap-key-file) under --name, else the host name")
      ->envname("PARSYN_WORKER_BOOTSTRAP_KEY_FILE");
  group->add_option("--device", flags->device, "cpu, cuda or cuda:N")->capture_default_str();
  group->add_option(
      "--data", flags->data,
      "your own .csv/.jsonl data, for jobs whose data.source is \"workers\" (only its row count is sent)");
  group->add_option("--cache-dir", flags->cache_dir, "models, shards and task files (default ~/.cache/parsyn/worker)");
  group
      ->add_option("--ca-file", flags->ca_file,
                   "PEM CA certificate(s) to trust for the coordinator's certificate, besides the system's")
      ->envname("PARSYN_CA_FILE");
  group->add_option("--cert", flags->cert,
                    "this worker's client certificate (PEM), for a coordinator with mutual TLS (--client-ca)");
  group->add_option("--key", flags->key, "the private key (PEM) of --cert");
  group->add_option("--peer-ca", flags->peer_ca,
                    "the CA (PEM) of the workers' client certificates: in securely aggregated rounds this worker then "
                    "checks that each peer's keys are signed by that peer's certificate (docs/secure-aggregation.md)");
  group->add_option("--threads", flags->threads, "the trainers' intra-op threads (0: the framework's default)")
      ->capture_default_str();
  group->add_option("--lora-rank", flags->lora_rank,
                    "the highest LoRA rank this worker trains: with config.lora_r \"auto\" it trains at most this, "
                    "and a task of a higher rank is refused (default: any)");
  group->add_option("--device-memory", flags->device_memory_gib,
                    "GiB of memory to announce for training, which config.lora_r \"auto\" sizes the rank by "
                    "(default: the GPU's, else the machine's)");
  group->add_option("--trainer", flags->trainers,
                    "NAME=COMMAND: offer a trainer of the trainer contract (docs/trainer-contract.md) under NAME, for "
                    "jobs whose config.trainer is NAME (repeatable; builtin=COMMAND replaces parsyn-trainer)");
  group->add_option("--config", flags->config,
                    "config file whose [trainers] section adds trainers (default: PARSYN_CONFIG, then "
                    "~/.config/parsyn/config.toml)");
  group->add_flag("--exit-with-parent", flags->exit_with_parent,
                  "stop when the parent process dies (used by parsyn server --managed-workers, which names itself in "
                  "PARSYN_DIE_WITH_PARENT)");
  group->callback([group, flags, &exit_code] {
    if (!group->get_subcommands().empty()) return;  // `parsyn worker register|list`
    exit_code = RunAgent(*flags);
  });
}

}  // namespace parsyn::cli
