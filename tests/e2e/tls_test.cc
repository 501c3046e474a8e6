// TLS and mutual TLS end to end: a federated tabular job run entirely over HTTPS with client certificates (a CA and a
// server certificate made here with the openssl command, worker certificates issued by `parsyn worker register
// --ca-cert --ca-key`), workers whose token is valid but whose certificate is missing or another worker's refused
// (on the worker routes and on worker-bound blob URLs), managed workers that keep working under mutual TLS, and the
// rule that plain HTTP beyond loopback needs --insecure.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <regex>
#include <set>
#include <thread>

#include "base/subprocess.h"
#include "base/testing/build_paths.h"
#include "e2e_harness.h"
#include "http/signed_url.h"

namespace parsyn::e2e {
namespace {

using std::chrono::seconds;

// Runs an openssl command line; fails the test when it fails.
void OpenSsl(const std::string& args) {
  const std::string command = "openssl " + args + " >/dev/null 2>&1";
  ASSERT_EQ(std::system(command.c_str()), 0) << "the test needs the openssl command: " << command;
}

std::string ReadText(const fs::path& file) {
  std::ifstream in(file);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

bool Contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// Waits (bounded) until `worker` has exited.
bool WaitExited(Worker& worker, seconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (worker.Exited()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return false;
}

class TlsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    pki_ = tmp_.path() / "pki";
    fs::create_directories(pki_);
    // One CA signs the server's certificate (for 127.0.0.1) and, through `parsyn worker register`, the workers'.
    ASSERT_NO_FATAL_FAILURE(
        OpenSsl("req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 "
                "-subj /CN=e2e-ca -addext basicConstraints=critical,CA:TRUE "
                "-addext keyUsage=critical,keyCertSign -keyout " +
                Pki("ca.key") + " -out " + Pki("ca.pem")));
    std::ofstream(Pki("server.ext")) << "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n";
    ASSERT_NO_FATAL_FAILURE(
        OpenSsl("req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes "
                "-subj /CN=127.0.0.1 -keyout " +
                Pki("server.key") + " -out " + Pki("server.csr")));
    ASSERT_NO_FATAL_FAILURE(OpenSsl("x509 -req -in " + Pki("server.csr") + " -CA " + Pki("ca.pem") + " -CAkey " +
                                    Pki("ca.key") + " -CAcreateserial -days 2 -extfile " + Pki("server.ext") +
                                    " -out " + Pki("server.pem")));
  }

  void TearDown() override {
    if (HasFailure()) {
      for (auto& w : workers_) std::fprintf(stderr, "---- %s ----\n%s\n", w->name().c_str(), w->log().c_str());
      if (server_)
        std::fprintf(stderr, "---- server ----\n%s\n", ReadText(server_->data_dir().string() + ".log").c_str());
    }
    workers_.clear();
  }

  std::string Pki(const std::string& name) const { return (pki_ / name).string(); }

  // `parsyn server` over HTTPS with mutual TLS for workers (plus `extra` flags).
  void StartServer(std::vector<std::string> extra = {}) {
    std::vector<std::string> flags = {"--tls-cert",      Pki("server.pem"), "--tls-key",
                                      Pki("server.key"), "--client-ca",     Pki("ca.pem")};
    flags.insert(flags.end(), extra.begin(), extra.end());
    server_ = std::make_unique<Server>(tmp_.path() / "server", FreePort(), flags);
    server_->UseTls(pki_ / "ca.pem");
    server_->Start();
    admin_ = server_->Admin();
  }

  // A separable points.csv of 400 rows and the MLP `parsyn model init` makes for it, uploaded (over TLS, by an admin
  // client that has no client certificate).
  void UploadPointsMlp(int64_t& model_id, int64_t& dataset_id) {
    WriteSeparableCsv(tmp_.path() / "points.csv", 400);
    CommandResult init =
        RunParsyn({"model", "init", "--architecture", "mlp", "--data", (tmp_.path() / "points.csv").string(),
                   "--hidden-sizes", "16", "--out", (tmp_.path() / "model").string(), "--seed", "5"});
    ASSERT_EQ(init.exit_code, 0) << init.output;
    model_id = UploadModel(*admin_, tmp_.path() / "model", "points-mlp");
    dataset_id = UploadDataset(*admin_, tmp_.path() / "points.csv");
  }

  // Registers a worker with `parsyn worker register`, which also issues its certificate into pki/certs.
  Registered RegisterWithCertificate(const std::string& name) {
    CommandResult r = RunParsyn({"worker", "register", "--server", server_->url(), "--api-key", server_->admin_key(),
                                 "--ca-file", Pki("ca.pem"), "--name", name, "--ca-cert", Pki("ca.pem"), "--ca-key",
                                 Pki("ca.key"), "--cert-out", Pki("certs")});
    EXPECT_EQ(r.exit_code, 0) << r.output;
    std::smatch id, token;
    if (!std::regex_search(r.output, id, std::regex("worker (\\d+) '")) ||
        !std::regex_search(r.output, token, std::regex("token \\(shown once[^)]*\\): (\\S+)"))) {
      ADD_FAILURE() << "unexpected output of worker register: " << r.output;
      return {};
    }
    return {std::stoll(id[1]), token[1]};
  }
  fs::path Cert(int64_t id) const { return pki_ / "certs" / ("worker-" + std::to_string(id) + ".pem"); }
  fs::path Key(int64_t id) const { return pki_ / "certs" / ("worker-" + std::to_string(id) + ".key"); }

  Worker& StartWorker(const Registered& r, const std::string& name, std::vector<std::string> flags) {
    workers_.push_back(std::make_unique<Worker>(server_->url(), r.token, name, tmp_.path() / ("cache-" + name), flags));
    workers_.back()->Start();
    return *workers_.back();
  }
  std::vector<std::string> TlsFlags(int64_t cert_of) const {
    return {"--ca-file", Pki("ca.pem"), "--cert", Cert(cert_of).string(), "--key", Key(cert_of).string()};
  }

  // worker id -> status, from the admin API.
  std::map<int64_t, std::string> WorkerStatuses() {
    std::map<int64_t, std::string> statuses;
    StatusOr<http::ClientResponse> res = admin_->Get("/api/v1/workers");
    StatusOr<json> body = res.ok() ? res->Json() : StatusOr<json>(res.status());
    if (!body.ok()) return statuses;
    for (const json& w : (*body)["workers"]) statuses[w["id"].get<int64_t>()] = w["status"];
    return statuses;
  }
  bool WaitOnline(const std::vector<int64_t>& ids) {
    const auto deadline = std::chrono::steady_clock::now() + seconds(60);
    while (std::chrono::steady_clock::now() < deadline) {
      std::map<int64_t, std::string> statuses = WorkerStatuses();
      if (std::all_of(ids.begin(), ids.end(),
                      [&](int64_t id) { return statuses.count(id) > 0 && statuses[id] != "offline"; })) {
        return true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return false;
  }

  // A client of the worker protocol with `token`, presenting the certificate of worker `cert_of` (0: none).
  std::unique_ptr<http::Client> WorkerClient(const std::string& token, int64_t cert_of) const {
    http::ClientOptions options{.base_url = server_->url(), .bearer_token = token, .max_attempts = 1};
    options.ca_file = pki_ / "ca.pem";
    if (cert_of > 0) {
      options.client_cert_file = Cert(cert_of);
      options.client_key_file = Key(cert_of);
    }
    return std::make_unique<http::Client>(options);
  }

  TempDir tmp_;
  fs::path pki_;
  std::unique_ptr<Server> server_;
  std::unique_ptr<http::Client> admin_;
  std::vector<std::unique_ptr<Worker>> workers_;
};

TEST_F(TlsTest, FederatedJobOverMutualTlsRefusesTokensWithoutTheirWorkersCertificate) {
  ASSERT_NO_FATAL_FAILURE(StartServer());
  StatusOr<http::ClientResponse> health = admin_->Get("/healthz");
  ASSERT_TRUE(health.ok()) << health.status().ToString();
  EXPECT_EQ((*health->Json())["status"], "ok");
  EXPECT_EQ((*health->Json())["tls"], true);
  EXPECT_EQ((*health->Json())["insecure"], false);

  // The model and data, uploaded over TLS by an admin client that has no client certificate.
  int64_t model_id = 0, dataset_id = 0;
  ASSERT_NO_FATAL_FAILURE(UploadPointsMlp(model_id, dataset_id));
  ASSERT_GT(model_id, 0);
  ASSERT_GT(dataset_id, 0);

  const Registered w0 = RegisterWithCertificate("w0");
  const Registered w1 = RegisterWithCertificate("w1");
  const Registered no_cert = RegisterWithCertificate("thief-without-cert");
  const Registered wrong_cert = RegisterWithCertificate("thief-with-w0-cert");
  ASSERT_GT(w0.id, 0);
  ASSERT_GT(w1.id, 0);
  struct stat key_stat {};
  ASSERT_EQ(::stat(Key(w0.id).c_str(), &key_stat), 0);
  EXPECT_EQ(key_stat.st_mode & 0777, 0600u) << "the worker's private key must be private";

  StartWorker(w0, "w0", TlsFlags(w0.id));
  StartWorker(w1, "w1", TlsFlags(w1.id));
  // Valid tokens, but one worker presents no certificate and the other presents w0's: both are refused at hello
  // and stop with the coordinator's reason.
  Worker& without = StartWorker(no_cert, "thief-without-cert", {"--ca-file", Pki("ca.pem")});
  Worker& foreign = StartWorker(wrong_cert, "thief-with-w0-cert", TlsFlags(w0.id));
  ASSERT_TRUE(WaitOnline({w0.id, w1.id})) << "the workers with their own certificates did not say hello";
  ASSERT_TRUE(WaitExited(without, seconds(60)));
  ASSERT_TRUE(WaitExited(foreign, seconds(60)));
  EXPECT_TRUE(Contains(without.log(), "requires a client certificate from workers")) << without.log();
  EXPECT_TRUE(Contains(foreign.log(), "the client certificate is for 'worker-" + std::to_string(w0.id) +
                                          "', but this token belongs to 'worker-" + std::to_string(wrong_cert.id)))
      << foreign.log();

  const json spec = TabularJobSpec("e2e-mtls", dataset_id, model_id, {w0.id, w1.id}, 2, 20);
  const int64_t job_id = CreateJob(*admin_, spec);
  ASSERT_GT(job_id, 0);
  json job = WaitForJobEnd(*admin_, job_id, seconds(300));
  ASSERT_EQ(job.value("status", ""), "succeeded") << job.dump(2);

  // Every committed round counts exactly the two certified workers' updates.
  int committed = 0;
  json last_round;
  for (const json& r : Rounds(*admin_, job_id)) {
    if (r["outcome"] != "committed" || r["round"].get<int>() < 1) continue;
    committed++;
    last_round = r;
    std::set<int64_t> accepted;
    for (const json& u : r["updates"]) {
      if (u["status"] == "accepted") accepted.insert(u["worker_id"].get<int64_t>());
    }
    EXPECT_EQ(accepted, (std::set<int64_t>{w0.id, w1.id})) << r.dump();
  }
  EXPECT_EQ(committed, 2);
  std::map<int64_t, std::string> statuses = WorkerStatuses();
  EXPECT_EQ(statuses[no_cert.id], "offline");
  EXPECT_EQ(statuses[wrong_cert.id], "offline");

  // The worker routes, called directly: w1's token needs w1's certificate.
  const json hello = {{"name", "probe"}, {"device", "cpu"}};
  StatusOr<http::ClientResponse> bare = WorkerClient(w1.token, 0)->PostJson("/api/v1/worker/hello", hello);
  EXPECT_EQ(bare.status().code(), StatusCode::kUnauthenticated) << bare.status().ToString();
  StatusOr<http::ClientResponse> other = WorkerClient(w1.token, w0.id)->PostJson("/api/v1/worker/hello", hello);
  EXPECT_EQ(other.status().code(), StatusCode::kPermissionDenied) << other.status().ToString();

  // A blob URL bound to w1 (signed here with the server's secret, as its tasks carry them) serves w1's certificate
  // only.
  ASSERT_FALSE(last_round.is_null());
  char prefix[96];
  std::snprintf(prefix, sizeof(prefix), "jobs/%lld/rounds/%06d-a%d", static_cast<long long>(job_id),
                last_round["round"].get<int>(), last_round["attempt"].get<int>());
  const std::string key = std::string(prefix) + "/global.safetensors";
  std::string secret = ReadText(server_->data_dir() / "url-signing-secret");
  while (!secret.empty() && (secret.back() == '\n' || secret.back() == ' ')) secret.pop_back();
  const int64_t expires =
      std::chrono::duration_cast<seconds>(std::chrono::system_clock::now().time_since_epoch()).count() + 600;
  const std::string url = "/blobs/" + key + "?worker=" + std::to_string(w1.id) + "&" +
                          http::SignUrl(secret, "GET", key + "\nworker " + std::to_string(w1.id), expires);
  StatusOr<http::ClientResponse> own = WorkerClient("", w1.id)->Get(url);
  EXPECT_TRUE(own.ok()) << own.status().ToString();
  StatusOr<http::ClientResponse> foreign_blob = WorkerClient("", w0.id)->Get(url);
  EXPECT_EQ(foreign_blob.status().code(), StatusCode::kPermissionDenied) << foreign_blob.status().ToString();
  StatusOr<http::ClientResponse> anonymous_blob = WorkerClient("", 0)->Get(url);
  EXPECT_EQ(anonymous_blob.status().code(), StatusCode::kUnauthenticated) << anonymous_blob.status().ToString();
}

// Secure aggregation under mutual TLS: every worker signs the keys it advertises with its certificate's key, the
// server accepts only keys signed by their worker's certificate from its --client-ca, and a worker started with
// --peer-ca checks its peers' too. One whose --peer-ca is another CA refuses every peer's keys (it cannot tell them
// from keys a coordinator made up) and leaves each round; the others commit every round without it.
TEST_F(TlsTest, SecureAggregationOverMutualTlsSignsAndChecksEveryKey) {
  ASSERT_NO_FATAL_FAILURE(StartServer());
  ASSERT_NO_FATAL_FAILURE(
      OpenSsl("req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 "
              "-subj /CN=other-ca -addext basicConstraints=critical,CA:TRUE "
              "-addext keyUsage=critical,keyCertSign -keyout " +
              Pki("other.key") + " -out " + Pki("other.pem")));
  int64_t model_id = 0, dataset_id = 0;
  ASSERT_NO_FATAL_FAILURE(UploadPointsMlp(model_id, dataset_id));
  std::vector<Registered> registered;
  for (const char* name : {"s0", "s1", "s2"}) registered.push_back(RegisterWithCertificate(name));
  for (size_t i = 0; i < registered.size(); ++i) {
    std::vector<std::string> flags = TlsFlags(registered[i].id);
    flags.insert(flags.end(), {"--peer-ca", i < 2 ? Pki("ca.pem") : Pki("other.pem")});
    StartWorker(registered[i], "s" + std::to_string(i), flags);
  }
  ASSERT_TRUE(WaitOnline({registered[0].id, registered[1].id, registered[2].id}));
  json spec = TabularJobSpec("e2e-mtls-secure", dataset_id, model_id,
                             {registered[0].id, registered[1].id, registered[2].id}, 2, 20);
  spec["distributed"]["min_workers"] = 2;
  spec["distributed"]["secure_aggregation"] = {{"enabled", true}, {"threshold", 2}, {"clipping_range", 1.0}};
  const int64_t job_id = CreateJob(*admin_, spec);
  ASSERT_GT(job_id, 0);
  json job = WaitForJobEnd(*admin_, job_id, seconds(300));
  ASSERT_EQ(job.value("status", ""), "succeeded") << job.dump(2);
  int committed = 0;
  for (const json& r : Rounds(*admin_, job_id)) {
    if (r["outcome"] != "committed" || r["round"].get<int>() < 1) continue;
    committed++;
    std::set<int64_t> accepted;
    for (const json& u : r["updates"]) {
      if (u["status"] == "accepted") accepted.insert(u["worker_id"].get<int64_t>());
    }
    EXPECT_EQ(accepted, (std::set<int64_t>{registered[0].id, registered[1].id})) << r.dump();
  }
  EXPECT_EQ(committed, 2);
  EXPECT_TRUE(Contains(workers_[2]->log(), "not signed by a valid certificate of the job's CA")) << workers_[2]->log();
}

// Secure aggregation under mutual TLS with one of four workers SIGKILLed in each phase (PARSYN_WORKER_SIGKILL_AFTER:
// the process kills itself right after the phase, as a machine that dies would): every round commits with the
// survivors, and round 1's global is the sample-weighted FedAvg of the summed workers' updates up to quantization.
// Killed after advertising or after sharing its keys, the worker's input is not summed (after sharing, its masks are
// taken off with its masking key rebuilt from the others' shares); killed after its masked input was summed and
// before revealing, its input counts (its self-mask seed rebuilt from the others' shares). The reference updates are
// a plain job's with the same four workers on the same shards (shard i is listed worker i's).
TEST_F(TlsTest, SecureAggregationCommitsWithTheSurvivorsOfAWorkerSigkilledInEachPhase) {
  ASSERT_NO_FATAL_FAILURE(StartServer({"--keep-updates"}));
  int64_t model_id = 0, dataset_id = 0;
  ASSERT_NO_FATAL_FAILURE(UploadPointsMlp(model_id, dataset_id));
  std::vector<Registered> registered;
  std::vector<int64_t> ids;
  for (const char* name : {"k0", "k1", "k2", "k3"}) {
    registered.push_back(RegisterWithCertificate(name));
    ids.push_back(registered.back().id);
  }
  auto flags = [&](size_t i) {
    std::vector<std::string> f = TlsFlags(registered[i].id);
    f.insert(f.end(), {"--peer-ca", Pki("ca.pem")});
    return f;
  };
  for (size_t i = 0; i < 4; ++i) StartWorker(registered[i], "k" + std::to_string(i), flags(i));
  ASSERT_TRUE(WaitOnline(ids));
  auto spec_of = [&](bool secure) {
    json spec = TabularJobSpec("e2e-mtls-sigkill", dataset_id, model_id, ids, 2, 20);
    spec["distributed"]["min_workers"] = 3;
    spec["distributed"]["aggregation_timeout"] = 30;
    if (secure)
      spec["distributed"]["secure_aggregation"] = {{"enabled", true}, {"threshold", 2}, {"clipping_range", 1.0}};
    return spec;
  };
  auto round_of = [&](int64_t job_id, int round) {
    for (const json& r : Rounds(*admin_, job_id)) {
      if (r["outcome"] == "committed" && r["round"] == round) return r;
    }
    ADD_FAILURE() << "job " << job_id << " committed no round " << round;
    return json::object();
  };
  auto accepted_of = [](const json& round) {
    std::vector<int64_t> accepted;
    for (const json& u : round.value("updates", json::array())) {
      if (u["status"] == "accepted") accepted.push_back(u["worker_id"].get<int64_t>());
    }
    std::sort(accepted.begin(), accepted.end());
    return accepted;
  };
  const fs::path blobs = server_->data_dir() / "blobs";
  const int64_t plain_id = CreateJob(*admin_, spec_of(false));
  ASSERT_EQ(WaitForJobEnd(*admin_, plain_id, seconds(300)).value("status", ""), "succeeded");
  const json plain_round = round_of(plain_id, 1);
  ASSERT_EQ(accepted_of(plain_round), ids);
  workers_[3]->Terminate();

  const std::vector<int64_t> healthy(ids.begin(), ids.begin() + 3);
  const double step = 2 * 1.0 / 65535.0;
  for (const std::string phase : {"keys", "shares", "masked_input"}) {
    SCOPED_TRACE("killed after " + phase);
    workers_.push_back(std::make_unique<Worker>(server_->url(), registered[3].token, "k3-" + phase,
                                                tmp_.path() / ("cache-k3-" + phase), flags(3)));
    Worker& doomed = *workers_.back();
    doomed.set_environment({"PARSYN_WORKER_SIGKILL_AFTER=" + phase});
    doomed.Start();
    ASSERT_TRUE(WaitOnline(ids));
    const int64_t job_id = CreateJob(*admin_, spec_of(true));
    json job = WaitForJobEnd(*admin_, job_id, seconds(300));
    ASSERT_EQ(job.value("status", ""), "succeeded") << job.dump(2);
    ASSERT_TRUE(WaitExited(doomed, seconds(10)));
    EXPECT_TRUE(Contains(doomed.log(), "PARSYN_WORKER_SIGKILL_AFTER=" + phase)) << doomed.log();
    const std::vector<int64_t> summed = phase == "masked_input" ? ids : healthy;
    const json secure_round = round_of(job_id, 1);
    EXPECT_EQ(accepted_of(secure_round), summed) << secure_round.dump();
    EXPECT_EQ(accepted_of(round_of(job_id, 2)), healthy);

    std::vector<std::pair<fs::path, double>> updates;
    for (const json& u : plain_round["updates"]) {
      if (std::count(summed.begin(), summed.end(), u["worker_id"].get<int64_t>()) == 0) continue;
      updates.emplace_back(blobs / (AttemptPrefix(plain_id, 1, plain_round["attempt"]) + "/updates/w" +
                                    std::to_string(u["worker_id"].get<int64_t>()) + ".safetensors"),
                           u["num_samples"].get<double>());
    }
    const auto reference = SampleWeightedMean(updates);
    const auto global =
        ReadTensors(blobs / (AttemptPrefix(job_id, 1, secure_round["attempt"]) + "/global.safetensors"));
    ExpectEqualUpToQuantization(reference, global, ReadTensors(tmp_.path() / "model" / "model.safetensors"), step);
  }
}

// Managed workers need nothing set up by hand under mutual TLS: the server issues their certificates.
TEST_F(TlsTest, ManagedWorkersComeOnlineUnderMutualTls) {
  ASSERT_NO_FATAL_FAILURE(StartServer({"--managed-workers", "1"}));
  const auto deadline = std::chrono::steady_clock::now() + seconds(60);
  bool online = false;
  while (!online && std::chrono::steady_clock::now() < deadline) {
    StatusOr<http::ClientResponse> res = admin_->Get("/api/v1/workers");
    StatusOr<json> body = res.ok() ? res->Json() : StatusOr<json>(res.status());
    if (body.ok()) {
      for (const json& w : (*body)["workers"]) online = online || (w["kind"] == "managed" && w["status"] != "offline");
    }
    if (!online) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_TRUE(online) << ReadText(server_->data_dir().string() + ".log");
}

// Worker pods bootstrapping under mutual TLS (`parsyn worker --bootstrap-key-file`): the pod sends a certificate
// request with its registration, the coordinator answers a certificate from its managed workers' CA for that key, and
// the pod comes online with it. A registration without a request is refused, saying what to send, and leaves no worker.
TEST_F(TlsTest, BootstrappedWorkerPodsGetTheirCertificateAndComeOnline) {
  const fs::path key_file = tmp_.path() / "bootstrap-key";
  const std::string bootstrap_key(40, 'k');
  std::ofstream(key_file) << bootstrap_key << "\n";
  ASSERT_NO_FATAL_FAILURE(StartServer({"--worker-bootstrap-key-file", key_file.string()}));
  http::ClientOptions options{.base_url = server_->url(), .bearer_token = bootstrap_key, .max_attempts = 1};
  options.ca_file = pki_ / "ca.pem";
  http::Client pod(options);
  StatusOr<http::ClientResponse> bare = pod.PostJson("/api/v1/workers/bootstrap", {{"name", "bare"}});
  EXPECT_EQ(bare.status().code(), StatusCode::kInvalidArgument) << bare.status().ToString();
  EXPECT_TRUE(Contains(bare.status().message(), "csr")) << bare.status().message();
  EXPECT_TRUE(WorkerStatuses().empty());

  workers_.push_back(std::make_unique<Worker>(
      server_->url(), "", "pod-0", tmp_.path() / "cache-pod-0",
      std::vector<std::string>{"--bootstrap-key-file", key_file.string(), "--ca-file", Pki("ca.pem")}));
  workers_.back()->Start();
  const auto deadline = std::chrono::steady_clock::now() + seconds(60);
  std::map<int64_t, std::string> statuses;
  while (std::chrono::steady_clock::now() < deadline) {
    statuses = WorkerStatuses();
    if (statuses.size() == 1 && statuses.begin()->second != "offline") break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_EQ(statuses.size(), 1u);
  EXPECT_NE(statuses.begin()->second, "offline") << workers_.back()->log();
  EXPECT_TRUE(Contains(workers_.back()->log(), "issued this worker's client certificate")) << workers_.back()->log();
}

// Plain HTTP on an address other machines reach needs --insecure, which the server then reports.
TEST_F(TlsTest, PlainHttpBeyondLoopbackNeedsInsecure) {
  const fs::path data_dir = tmp_.path() / "plain";
  CommandResult refused = RunParsyn({"server", "--data-dir", data_dir.string(), "--listen", "0.0.0.0:0"}, seconds(60));
  EXPECT_EQ(refused.exit_code, 2) << refused.output;
  EXPECT_TRUE(Contains(refused.output, "refusing to serve plain HTTP on 0.0.0.0:0")) << refused.output;
  EXPECT_TRUE(Contains(refused.output, "--insecure")) << refused.output;

  CommandResult no_tls_ca =
      RunParsyn({"server", "--data-dir", data_dir.string(), "--client-ca", Pki("ca.pem")}, seconds(60));
  EXPECT_EQ(no_tls_ca.exit_code, 2) << no_tls_ca.output;
  EXPECT_TRUE(Contains(no_tls_ca.output, "--client-ca needs --tls-cert")) << no_tls_ca.output;

  // With --insecure it starts, warns, and says so in /healthz.
  const int port = FreePort();
  const fs::path log = tmp_.path() / "insecure.log";
  const std::string listen = "0.0.0.0:" + std::to_string(port);
  const int out = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  ASSERT_GE(out, 0);
  const std::string parsyn = test_support::BuildPath("parsyn");
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(out, STDOUT_FILENO);
    ::dup2(out, STDERR_FILENO);
    ::execl(parsyn.c_str(), parsyn.c_str(), "server", "--data-dir", data_dir.c_str(), "--listen", listen.c_str(),
            "--insecure", static_cast<char*>(nullptr));
    ::_exit(127);
  }
  ::close(out);
  ASSERT_GT(pid, 0);
  http::Client probe(http::ClientOptions{.base_url = "http://127.0.0.1:" + std::to_string(port), .max_attempts = 1});
  StatusOr<http::ClientResponse> health = UnavailableError("not asked yet");
  const auto deadline = std::chrono::steady_clock::now() + seconds(30);
  while (!health.ok() && std::chrono::steady_clock::now() < deadline) {
    health = probe.Get("/healthz");
    if (!health.ok()) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ::kill(pid, SIGTERM);
  int status = 0;
  ::waitpid(pid, &status, 0);
  ASSERT_TRUE(health.ok()) << health.status().ToString() << "\n" << ReadText(log);
  EXPECT_EQ((*health->Json())["status"], "ok");
  EXPECT_EQ((*health->Json())["tls"], false);
  EXPECT_EQ((*health->Json())["insecure"], true);
  EXPECT_TRUE(Contains(ReadText(log), "WARNING: --insecure")) << ReadText(log);
}

// The README's "Running a job across several machines" recipe, run as written: its ```sh block is read from README.md
// here (so this test breaks when the README changes) and run by bash with `parsyn` on PATH. What this machine
// cannot do as written is adapted, and only that:
//   - one machine plays them all: 0.0.0.0:8443 and coordinator.example:8443 become 127.0.0.1:<free port> (a test
//     listens on loopback only, and the example host has no DNS); /var/lib/parsyn becomes a folder of the test;
//   - --device cuda:0 becomes --device cpu (no GPU needed);
//   - step 3 ("each worker machine") runs twice, the second time as gpu-box-2 with certs/worker-2.*, since the job
//     asks for workers 1,2;
//   - `parsyn` is a wrapper around the built binary that starts `parsyn server` and `parsyn worker --server ...` (each
//     on its own machine in the recipe) in the background, each worker with a HOME of its own (as on its own machine:
//     two workers sharing one ~/.cache/parsyn collide), and passes the token the last `worker register` printed
//     where the recipe says TOKEN;
//   - the example job is 10 rounds of 500 steps: once round 1 commits, the test stops it (POST .../stop, as `parsyn
//     job stop 1` would from another terminal), so `parsyn job watch 1` ends and `parsyn job download 1` runs.
// The certificates (ca.pem/ca.key, server.pem/server.key for 127.0.0.1), train.jsonl and ./my-model are made first in
// the folder the recipe runs in; HOME is a folder of the test, where step 2 writes the config file.
TEST_F(TlsTest, ReadmeMultiMachineRecipeRunsVerbatim) {
  const std::string readme = ReadText(fs::path(test_support::BuildPath("source_dir")) / "README.md");
  const size_t section = readme.find("## Running a job across several machines");
  ASSERT_NE(section, std::string::npos) << "README.md has no multi-machine recipe";
  const size_t open = readme.find("```sh\n", section);
  ASSERT_NE(open, std::string::npos);
  const size_t close = readme.find("\n```", open + 6);
  ASSERT_NE(close, std::string::npos);
  std::string recipe = readme.substr(open + 6, close - open - 5);

  const int port = FreePort();
  const std::string address = "127.0.0.1:" + std::to_string(port);
  const fs::path var_lib = tmp_.path() / "var-lib-parsyn";
  auto replace_all = [](std::string text, const std::string& from, const std::string& to) {
    EXPECT_NE(text.find(from), std::string::npos) << "the README's recipe no longer has '" << from << "'";
    for (size_t at = text.find(from); at != std::string::npos; at = text.find(from, at + to.size())) {
      text.replace(at, from.size(), to);
    }
    return text;
  };
  recipe = replace_all(recipe, "0.0.0.0:8443", address);
  recipe = replace_all(recipe, "coordinator.example:8443", address);
  recipe = replace_all(recipe, "/var/lib/parsyn", var_lib.string());
  recipe = replace_all(recipe, "--device cuda:0", "--device cpu");
  // Step 3 again for a second worker machine.
  const size_t step3 = recipe.find("\n# 3. ");
  const size_t step4 = recipe.find("\n# 4. ");
  ASSERT_TRUE(step3 != std::string::npos && step4 != std::string::npos) << recipe;
  std::string second_worker = recipe.substr(step3, step4 - step3);
  second_worker = replace_all(second_worker, "gpu-box-1", "gpu-box-2");
  second_worker = replace_all(second_worker, "worker-1.", "worker-2.");
  recipe.insert(step4, second_worker);

  // The recipe's folder: certificates, data and model as its steps expect them, and examples/ beside them.
  const fs::path work = pki_;
  WriteLearnableText(work / "train.jsonl", 64);
  ASSERT_NO_FATAL_FAILURE(InitTinyLlama(work / "my-model"));
  fs::create_directory_symlink(fs::path(test_support::BuildPath("source_dir")) / "examples", work / "examples");
  const fs::path bin = tmp_.path() / "bin";
  const fs::path state = tmp_.path() / "recipe-state";
  fs::create_directories(bin);
  fs::create_directories(state);
  fs::create_directories(tmp_.path() / "home");
  std::ofstream(bin / "parsyn") << "#!/usr/bin/env bash\n"
                                << "real='" << test_support::BuildPath("parsyn") << "'\nstate='" << state.string()
                                << "'\n"
                                << R"sh(if [[ "$1" == server ]]; then
  "$real" "$@" >>"$state/server.log" 2>&1 &
  echo $! >>"$state/pids"
  for _ in $(seq 600); do grep -q 'listening on' "$state/server.log" && exit 0; sleep 0.1; done
  exit 1
fi
if [[ "$1" == worker && "$2" == --server ]]; then
  args=()
  for a in "$@"; do [[ "$a" == TOKEN ]] && a=$(cat "$state/token"); args+=("$a"); done
  machine="$state/machine-$(wc -l <"$state/pids")"  # its own HOME, so its own ~/.cache/parsyn
  mkdir -p "$machine"
  HOME="$machine" "$real" "${args[@]}" >>"$machine.log" 2>&1 &
  echo $! >>"$state/pids"
  exit 0
fi
if [[ "$1" == worker && "$2" == register ]]; then
  "$real" "$@" | tee "$state/register.out"
  rc=${PIPESTATUS[0]}
  sed -n 's/^token (shown once[^)]*): //p' "$state/register.out" >"$state/token"
  exit "$rc"
fi
exec "$real" "$@"
)sh";
  fs::permissions(bin / "parsyn", fs::perms::owner_all);
  std::ofstream(tmp_.path() / "recipe.sh") << "set -euo pipefail\ncd '" << work.string() << "'\n" << recipe;

  SubprocessOptions options;
  options.output = SubprocessOptions::Output::kFile;
  options.output_file = tmp_.path() / "recipe.log";
  options.environment = {{"PATH", bin.string() + ":" + std::getenv("PATH")},
                         {"HOME", (tmp_.path() / "home").string()},
                         {"XDG_CONFIG_HOME", ""},
                         {"PARSYN_CONFIG", ""},
                         {"PARSYN_SERVER", ""},
                         {"PARSYN_API_KEY", ""},
                         {"PARSYN_KEY_FILE", ""},
                         {"PARSYN_CA_FILE", ""},
                         {"PARSYN_DATA_DIR", ""}};
  StatusOr<Subprocess> script = Subprocess::Start("/bin/bash", {(tmp_.path() / "recipe.sh").string()}, options);
  ASSERT_TRUE(script.ok()) << script.status().message();
  // The processes the wrapper started in the background, ended whatever happens below.
  struct EndBackground {
    fs::path pids;
    ~EndBackground() {
      std::ifstream in(pids);
      for (pid_t pid; in >> pid;) {
        ::kill(pid, SIGTERM);
        for (int i = 0; i < 100 && ::kill(pid, 0) == 0; ++i)
          std::this_thread::sleep_for(std::chrono::milliseconds(100));
        ::kill(pid, SIGKILL);
      }
    }
  } end_background{state / "pids"};

  // Once round 1 of job 1 commits, stop the job (10 rounds of 500 steps are more than a test needs).
  const auto deadline = std::chrono::steady_clock::now() + seconds(480);
  std::unique_ptr<http::Client> admin;
  bool stopped = false;
  while (!script->HasExited() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    if (stopped) continue;
    if (!admin && fs::exists(var_lib / "admin-key")) {
      http::ClientOptions admin_options;
      admin_options.base_url = "https://" + address;
      admin_options.max_attempts = 1;
      admin_options.bearer_token = ReadText(var_lib / "admin-key");
      while (!admin_options.bearer_token.empty() && std::isspace(admin_options.bearer_token.back())) {
        admin_options.bearer_token.pop_back();
      }
      admin_options.ca_file = Pki("ca.pem");
      admin = std::make_unique<http::Client>(admin_options);
    }
    if (!admin) continue;
    StatusOr<http::ClientResponse> job = admin->Get("/api/v1/training-jobs/1");
    StatusOr<json> body = job.ok() ? job->Json() : StatusOr<json>(job.status());
    if (body.ok() && body->value("committed_round", 0) >= 1) {
      EXPECT_TRUE(admin->PostJson("/api/v1/training-jobs/1/stop", json::object()).ok());
      stopped = true;
    }
  }
  if (!script->HasExited()) script->Kill();
  const int exit_code = script->Wait();
  const std::string output = ReadText(tmp_.path() / "recipe.log");
  auto logs = [&] {
    std::string all = "---- recipe ----\n" + output;
    for (const auto& entry : fs::directory_iterator(state)) {
      if (entry.path().extension() == ".log")
        all += "---- " + entry.path().filename().string() + " ----\n" + ReadText(entry.path());
    }
    return all;
  };
  ASSERT_EQ(exit_code, 0) << logs();
  EXPECT_TRUE(stopped) << logs();
  EXPECT_TRUE(Contains(output, "worker 1 'gpu-box-1' registered")) << logs();
  EXPECT_TRUE(Contains(output, "worker 2 'gpu-box-2' registered")) << logs();
  EXPECT_TRUE(Contains(output, "created training job 1")) << logs();
  EXPECT_TRUE(Contains(output, "round 1/10 committed")) << logs();
  EXPECT_TRUE(Contains(output, "job stopped")) << logs();
  EXPECT_TRUE(fs::exists(work / "adapter" / "adapter_model.safetensors")) << logs();
  const json adapter_config = json::parse(ReadText(work / "adapter" / "adapter_config.json"), nullptr, false);
  EXPECT_EQ(adapter_config.value("peft_type", ""), "LORA") << logs();
  EXPECT_EQ(adapter_config.value("r", 0), 16);  // the example's lora_r
  // The config file step 2 wrote is what the CLI used: server and key came from nowhere else.
  EXPECT_TRUE(fs::exists(tmp_.path() / "home" / ".config" / "parsyn" / "config.toml"));
}

}  // namespace
}  // namespace parsyn::e2e
