// The deployment files run for real: every container command line of deploy/kubernetes/*.yaml and
// the Dockerfile's ENTRYPOINT + CMD, as tests/deploy/commands.mjs extracts them, is started against the built
// binaries, so a renamed or removed flag breaks a test. This machine stands in for the cluster: the image's paths
// (/usr/local/bin, /var/lib/parsyn, Secret mounts) are folders of a temporary directory, Secret values are written
// where the manifests mount them or set where they name them in env, $(VAR) references are expanded as Kubernetes
// does, the Service address (https://parsyn-coordinator:8080) is the coordinator started here, and 0.0.0.0:8080 is a
// free loopback port. The manifests serve HTTPS by default: the parsyn-tls and parsyn-ca Secrets hold a CA and a server
// certificate made here with the openssl command (for parsyn-coordinator and 127.0.0.1), and the coordinators must
// say "tls": true. PostgreSQL and S3 are a throwaway PostgreSQL (storage/postgres_for_test.h) and moto_server.
// Skips, saying why, when node's packages (tests/deploy/node_modules), PostgreSQL or moto are not installed. Docker:
// the image build is not exercised here (no daemon on these machines); DockerImageBuilds says so when it skips.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <regex>
#include <thread>

#include "base/subprocess.h"
#include "base/testing/build_paths.h"
#include "base/testing/missing_dependency.h"
#include "e2e_harness.h"
#include "storage/postgres_for_test.h"
#include "storage/s3_moto_for_test.h"

namespace parsyn::e2e {
namespace {

// The Service's address after the URL scheme, which stays as the manifest writes it (https:// in the manifests).
constexpr std::string_view kServiceAddress = "://parsyn-coordinator:8080";
constexpr std::string_view kContainerListen = "0.0.0.0:8080";

// The output of tests/deploy/commands.mjs; null when node or its packages are missing (then `why` says so).
json Commands(std::string* why) {
  const std::string command = "node '" + test_support::SourcePath("tests/deploy/commands.mjs") + "' '" +
                              test_support::BuildPath("source_dir") + "' 2>&1";
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) {
    *why = "cannot run node";
    return nullptr;
  }
  std::string out;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof(buf), pipe)) > 0;) out.append(buf, n);
  const int status = ::pclose(pipe);
  const int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  if (code == 77 || code == 127) {
    *why = "node or the npm packages of tests/deploy are not installed (./dev setup installs them): " + out;
    return nullptr;
  }
  json parsed = json::parse(out, nullptr, false);
  EXPECT_EQ(code, 0) << out;
  EXPECT_FALSE(parsed.is_discarded()) << out;
  return code == 0 && !parsed.is_discarded() ? parsed : json();
}

// The container of `workload` in the manifest file ending in `file`.
json FindContainer(const json& commands, std::string_view file, std::string_view workload) {
  for (const json& c : commands["containers"]) {
    if (c["file"].get<std::string>().ends_with(file) && c["workload"] == workload) return c;
  }
  ADD_FAILURE() << "no " << workload << " in " << file;
  return nullptr;
}

// What stands in for the cluster around one pod.
struct Cluster {
  fs::path root;                                                        // pods' file systems: root/<pod>/<path>
  std::map<std::string, std::map<std::string, std::string>> secrets{};  // Secret -> key -> value
  int listen_port = 0;  // 0.0.0.0:8080 in a coordinator pod, and the Service's port (127.0.0.1:<listen_port>)
  fs::path ca_file{};   // the CA of the parsyn-tls certificate (the parsyn-ca Secret), trusted by the test's calls
};

std::string ReplaceAll(std::string s, std::string_view from, std::string_view to) {
  for (size_t at = 0; (at = s.find(from, at)) != std::string::npos; at += to.size()) s.replace(at, from.size(), to);
  return s;
}

// A container started as Kubernetes would start it, with the stand-ins of Cluster; its output goes to <pod>.log.
class Pod {
 public:
  Pod(const json& container, const Cluster& cluster, std::string name)
      : name_(std::move(name)), ca_file_(cluster.ca_file) {
    const fs::path fs_root = cluster.root / name_;
    log_ = cluster.root / (name_ + ".log");
    // Paths of the image and of the mounts, as folders of this pod's file system.
    std::vector<std::pair<std::string, std::string>> paths;
    for (const char* image_path : {"/var/lib/parsyn", "/var/cache/parsyn"}) {
      paths.emplace_back(image_path, (fs_root / fs::path(image_path).relative_path()).string());
    }
    for (const json& mount : container["mounts"]) {
      const std::string path = mount["path"];
      const fs::path local = fs_root / fs::path(path).relative_path();
      fs::create_directories(local);
      paths.emplace_back(path, local.string());
      if (!mount.contains("secret")) continue;
      auto secret = cluster.secrets.find(mount["secret"]);
      if (secret == cluster.secrets.end()) {
        ADD_FAILURE() << name_ << ": the test has no value for Secret " << mount["secret"];
        continue;
      }
      for (const auto& [key, value] : secret->second) std::ofstream(local / key) << value;
    }
    for (const auto& [from, to] : paths) fs::create_directories(to);
    // An image path at the start of a value (a whole arg, an env value, or what follows "--flag="), replaced once,
    // by the longest path that matches.
    auto localize = [&](std::string s) {
      s = ReplaceAll(s, kServiceAddress, "://127.0.0.1:" + std::to_string(cluster.listen_port));
      s = ReplaceAll(s, kContainerListen, "127.0.0.1:" + std::to_string(cluster.listen_port));
      const size_t value_at = s.starts_with("--") && s.find('=') != std::string::npos ? s.find('=') + 1 : 0;
      const std::string value = s.substr(value_at);
      const std::pair<std::string, std::string>* best = nullptr;
      for (const auto& path : paths) {
        const bool under = value == path.first || value.starts_with(path.first + "/");
        if (under && (best == nullptr || path.first.size() > best->first.size())) best = &path;
      }
      if (best != nullptr) s = s.substr(0, value_at) + best->second + value.substr(best->first.size());
      return s;
    };
    std::map<std::string, std::string> env;
    for (const json& e : container["env"]) {
      std::string value;
      if (e.contains("value")) {
        value = e["value"];
      } else if (e.contains("field")) {
        EXPECT_EQ(e["field"], "metadata.name") << name_ << ": env " << e["name"];
        value = name_;
      } else {
        const std::string secret = e["secret"]["name"], key = e["secret"]["key"];
        auto s = cluster.secrets.find(secret);
        if (s == cluster.secrets.end() || !s->second.contains(key)) {
          ADD_FAILURE() << name_ << ": the test has no value for Secret " << secret << " key " << key;
        } else {
          value = s->second.at(key);
        }
      }
      env[e["name"]] = localize(value);
    }
    if (container.contains("image_env")) {
      for (const auto& [k, v] : container["image_env"].items()) env.try_emplace(k, localize(v.get<std::string>()));
    }
    std::vector<std::string> argv;
    for (const json& arg : container["argv"]) {
      std::string a = arg;
      // $(VAR): the container's env, as Kubernetes expands it in command and args.
      for (const auto& [k, v] : env) a = ReplaceAll(a, "$(" + k + ")", v);
      argv.push_back(localize(a));
    }
    EXPECT_EQ(argv.at(0), "/usr/local/bin/parsyn") << "the image installs parsyn there";
    // The image's /usr/local/bin/parsyn (parsyn-trainer beside it) is the build's.
    argv[0] = test_support::BuildPath("parsyn");
    args_ = argv;
    // A coordinator pod's address: HTTPS when its command line has --tls-cert.
    const bool tls = std::any_of(argv.begin(), argv.end(), [](const std::string& a) {
      return a == "--tls-cert" || a.starts_with("--tls-cert=");
    });
    url_ = (tls ? "https://127.0.0.1:" : "http://127.0.0.1:") + std::to_string(cluster.listen_port);
    SubprocessOptions options;
    options.output = SubprocessOptions::Output::kFile;
    options.output_file = log_;
    options.environment.assign(env.begin(), env.end());
    StatusOr<Subprocess> started =
        Subprocess::Start(argv[0], std::vector<std::string>(argv.begin() + 1, argv.end()), options);
    EXPECT_TRUE(started.ok()) << started.status().ToString();
    if (started.ok()) process_ = std::make_unique<Subprocess>(std::move(*started));
  }
  ~Pod() {
    if (process_ != nullptr && !process_->HasExited()) Terminate();
  }

  // SIGTERM (what Kubernetes sends a pod that goes away), then the exit status; SIGKILL after 30 s.
  int Terminate() {
    process_->Terminate();
    for (int i = 0; i < 300 && !process_->HasExited(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    if (!process_->HasExited()) process_->Kill();
    return process_->Wait();
  }
  bool Exited() { return process_ == nullptr || process_->HasExited(); }
  // A coordinator pod's URL (https:// when it serves TLS), as the Service reaches it.
  const std::string& url() const { return url_; }

  // GET path on this coordinator pod (optionally with a bearer key), trusting the cluster's CA: the status, 0 when
  // nothing answers.
  int StatusOf(const std::string& path, const std::string& bearer = "", std::string* body = nullptr) const {
    http::ClientOptions options;
    options.base_url = url_;
    options.bearer_token = bearer;
    options.max_attempts = 1;
    options.timeout = std::chrono::seconds(10);
    options.ca_file = ca_file_;
    http::Client client(options);
    StatusOr<http::ClientResponse> res = client.Get(path);
    if (res.ok()) {
      if (body != nullptr) *body = res->body;
      return res->status;
    }
    const StatusCode code = res.status().code();
    if (body != nullptr) *body = res.status().message();
    if (code == StatusCode::kUnauthenticated) return 401;
    if (code == StatusCode::kNotFound) return 404;
    return code == StatusCode::kUnavailable && res.status().message().find("503") != std::string::npos ? 503 : 0;
  }
  std::string Describe() const {
    std::string command;
    for (const std::string& a : args_) command += a + " ";
    std::ifstream in(log_);
    return "pod " + name_ + ": " + command + "\n" +
           std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  }

 private:
  std::string name_;
  fs::path ca_file_;
  std::string url_;
  fs::path log_;
  std::vector<std::string> args_;
  std::unique_ptr<Subprocess> process_;
};

// Waits (at most 60 s) for the coordinator pod to answer /readyz with 200; fails with its log otherwise.
void ExpectReady(Pod& pod) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  std::string body;
  while (std::chrono::steady_clock::now() < deadline && !pod.Exited()) {
    if (pod.StatusOf("/readyz", "", &body) == 200) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  ADD_FAILURE() << "no 200 from /readyz (last: " << body << ")\n" << pod.Describe();
}

// The manifests' coordinators serve HTTPS (the TLS default): the pod's command line has --tls-cert and /healthz,
// reached over https:// with the CA of the parsyn-ca Secret, says "tls": true.
void ExpectTls(const Pod& coordinator) {
  EXPECT_TRUE(coordinator.url().starts_with("https://")) << "no --tls-cert\n" << coordinator.Describe();
  std::string body;
  ASSERT_EQ(coordinator.StatusOf("/healthz", "", &body), 200) << body << "\n" << coordinator.Describe();
  const json health = json::parse(body, nullptr, false);
  EXPECT_TRUE(health.is_object() && health.value("tls", false)) << body;
  EXPECT_FALSE(health.is_object() && health.value("insecure", false)) << body;
}

// Waits (at most 60 s) until the coordinator lists a worker named `name` of kind managed with `status`.
void ExpectWorker(const Pod& coordinator, const std::string& admin_key, const std::string& name,
                  const std::string& status, Pod& pod) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  std::string body;
  while (std::chrono::steady_clock::now() < deadline) {
    if (coordinator.StatusOf("/api/v1/workers?limit=1000", admin_key, &body) == 200) {
      const json listed = json::parse(body);
      for (const json& w : listed["workers"]) {
        if (w["name"] == name && w["kind"] == "managed" && w["status"] == status) return;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  ADD_FAILURE() << "no managed worker '" << name << "' " << status << ": " << body << "\n" << pod.Describe();
}

// Runs an openssl command line; fails the test (and returns false) when it fails.
bool OpenSsl(const std::string& args) {
  const std::string command = "openssl " + args + " >/dev/null 2>&1";
  const bool ok = std::system(command.c_str()) == 0;
  if (!ok) ADD_FAILURE() << "the test needs the openssl command: " << command;
  return ok;
}

std::string ReadText(const fs::path& file) {
  std::ifstream in(file);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// A CA and a server certificate signed by it, for the Service's names and for 127.0.0.1 (where the pods reach the
// coordinator here), as an operator makes them (docs/deploy.md): the parsyn-tls and parsyn-ca Secrets.
void MakeTlsSecrets(Cluster& cluster) {
  const fs::path pki = cluster.root / "pki";
  fs::create_directories(pki);
  auto at = [&](const char* name) { return "'" + (pki / name).string() + "'"; };
  std::ofstream(pki / "server.ext") << "subjectAltName=DNS:parsyn-coordinator,DNS:parsyn-coordinator.parsyn.svc,"
                                       "DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n";
  if (!OpenSsl("req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 -subj /CN=parsyn-ca "
               "-addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign -keyout " +
               at("ca.key") + " -out " + at("ca.pem")) ||
      !OpenSsl("req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj /CN=parsyn-coordinator "
               "-keyout " +
               at("server.key") + " -out " + at("server.csr")) ||
      !OpenSsl("x509 -req -in " + at("server.csr") + " -CA " + at("ca.pem") + " -CAkey " + at("ca.key") +
               " -CAcreateserial -days 2 -extfile " + at("server.ext") + " -out " + at("server.pem"))) {
    return;
  }
  cluster.secrets["parsyn-tls"] = {{"tls.crt", ReadText(pki / "server.pem")},
                                   {"tls.key", ReadText(pki / "server.key")}};
  cluster.secrets["parsyn-ca"]["ca.crt"] = ReadText(pki / "ca.pem");
  cluster.ca_file = pki / "ca.pem";
}

// The Secrets the manifests name, with this test's values; each must be one secrets.example.yaml declares.
Cluster MakeCluster(const fs::path& root, const json& commands) {
  Cluster cluster{.root = root};
  cluster.listen_port = FreePort();
  cluster.secrets["parsyn-admin"]["admin-key"] = "admin-0123456789abcdef0123456789abcdef";
  cluster.secrets["parsyn-worker-bootstrap"]["bootstrap-key"] = "bootstrap-0123456789abcdef0123456789abcdef";
  MakeTlsSecrets(cluster);
  for (const auto& [secret, keys] : cluster.secrets) {
    for (const auto& [key, value] : keys) {
      const json declared = commands["secrets"].value(secret, json::array());
      EXPECT_NE(std::find(declared.begin(), declared.end(), key), declared.end())
          << "secrets.example.yaml has no Secret " << secret << " key " << key;
    }
  }
  return cluster;
}

#define PARSYN_COMMANDS_OR_SKIP(commands)                    \
  std::string why;                                           \
  const json commands = Commands(&why);                      \
  if (!why.empty()) PARSYN_SKIP_FOR_MISSING_DEPENDENCY(why); \
  ASSERT_TRUE(commands.is_object()) << "commands.mjs failed"

// The SQLite coordinator (coordinator-sqlite.yaml) serves HTTPS with the parsyn-tls Secret and reaches /readyz with
// the admin key of its Secret; two GPU worker pods (workers.yaml) reach it over https, trusting the parsyn-ca Secret,
// and register themselves with the bootstrap Secret as managed workers named after their pods; a pod that goes away
// (SIGTERM) is a worker that leaves.
TEST(DeployTest, SqliteCoordinatorAndWorkerPodsFromTheManifests) {
  PARSYN_COMMANDS_OR_SKIP(commands);
  TempDir dir;
  Cluster cluster = MakeCluster(dir.path(), commands);
  const std::string admin_key = cluster.secrets["parsyn-admin"]["admin-key"];
  Pod coordinator(FindContainer(commands, "coordinator-sqlite.yaml", "Deployment/parsyn-coordinator"), cluster,
                  "parsyn-coordinator-0");
  ExpectReady(coordinator);
  ExpectTls(coordinator);
  EXPECT_EQ(coordinator.StatusOf("/api/v1/workers", admin_key), 200) << coordinator.Describe();
  EXPECT_EQ(coordinator.StatusOf("/healthz"), 200);
  EXPECT_EQ(coordinator.StatusOf("/metrics"), 200);  // what the scrape annotations point at

  const json worker = FindContainer(commands, "workers.yaml", "Deployment/parsyn-worker");
  Pod a(worker, cluster, "parsyn-worker-5f7c9-abcde");
  Pod b(worker, cluster, "parsyn-worker-5f7c9-fghij");
  ExpectWorker(coordinator, admin_key, "parsyn-worker-5f7c9-abcde", "online", a);
  ExpectWorker(coordinator, admin_key, "parsyn-worker-5f7c9-fghij", "online", b);
  EXPECT_EQ(a.Terminate(), 0) << a.Describe();
  ExpectWorker(coordinator, admin_key, "parsyn-worker-5f7c9-abcde", "offline", a);
  EXPECT_EQ(b.Terminate(), 0) << b.Describe();
  EXPECT_EQ(coordinator.Terminate(), 0) << coordinator.Describe();
}

// The failover coordinator (coordinator-postgres.yaml) on PostgreSQL and S3 from its Secrets' env serves HTTPS and
// reaches /readyz, and a worker pod registers with it over https.
TEST(DeployTest, PostgresCoordinatorFromTheManifestOnPostgresAndS3) {
  PARSYN_COMMANDS_OR_SKIP(commands);
  if (std::optional<std::string> missing = storage::PostgresUnavailableReason()) {
    PARSYN_SKIP_FOR_MISSING_DEPENDENCY(*missing);
  }
  if (!storage::FindMotoServer())
    PARSYN_SKIP_FOR_MISSING_DEPENDENCY("moto_server is not installed (./dev setup installs it)");
  StatusOr<storage::PostgresForTest*> postgres = storage::SharedPostgres();
  ASSERT_TRUE(postgres.ok()) << postgres.status().ToString();
  StatusOr<std::string> database = (*postgres)->NewDatabase();
  ASSERT_TRUE(database.ok()) << database.status().ToString();
  StatusOr<storage::MotoServer*> moto = storage::SharedMotoServer();
  ASSERT_TRUE(moto.ok()) << moto.status().ToString();
  ASSERT_TRUE((*moto)->CreateBucket("parsyn-deploy").ok());

  TempDir dir;
  Cluster cluster = MakeCluster(dir.path(), commands);
  cluster.secrets["parsyn-postgres"]["url"] = *database;
  cluster.secrets["parsyn-s3"] = {{"blobs", "s3://parsyn-deploy/parsyn?endpoint=" + (*moto)->endpoint()},
                                  {"AWS_ACCESS_KEY_ID", "deploy-test"},
                                  {"AWS_SECRET_ACCESS_KEY", "deploy-test-secret"},
                                  {"AWS_REGION", "us-east-1"}};
  const std::string admin_key = cluster.secrets["parsyn-admin"]["admin-key"];
  Pod coordinator(FindContainer(commands, "coordinator-postgres.yaml", "Deployment/parsyn-coordinator"), cluster,
                  "parsyn-coordinator-6d8b-k2x9q");
  ExpectReady(coordinator);
  ExpectTls(coordinator);
  EXPECT_EQ(coordinator.StatusOf("/api/v1/workers", admin_key), 200) << coordinator.Describe();
  Pod worker(FindContainer(commands, "workers.yaml", "Deployment/parsyn-worker"), cluster, "parsyn-worker-0");
  ExpectWorker(coordinator, admin_key, "parsyn-worker-0", "online", worker);
  EXPECT_EQ(worker.Terminate(), 0) << worker.Describe();
  EXPECT_EQ(coordinator.Terminate(), 0) << coordinator.Describe();
}

// The image's own command (ENTRYPOINT + CMD, with its ENV): a coordinator on SQLite in the data volume (plain HTTP,
// or HTTPS when the Dockerfile's command gives --tls-cert).
TEST(DeployTest, DockerfileCommandStartsACoordinator) {
  PARSYN_COMMANDS_OR_SKIP(commands);
  TempDir dir;
  Cluster cluster = MakeCluster(dir.path(), commands);
  json container = {{"argv", commands["dockerfile"]["argv"]},
                    {"env", json::array()},
                    {"mounts", json::array()},
                    {"image_env", commands["dockerfile"]["env"]}};
  Pod coordinator(container, cluster, "docker-run");
  ExpectReady(coordinator);
  // The first start made the admin key in the volume; it works.
  std::ifstream key_file(dir.path() / "docker-run" / "var" / "lib" / "parsyn" / "admin-key");
  std::string admin_key;
  std::getline(key_file, admin_key);
  EXPECT_EQ(coordinator.StatusOf("/api/v1/workers", admin_key), 200) << coordinator.Describe();
  EXPECT_EQ(coordinator.Terminate(), 0) << coordinator.Describe();
}

// Keys from Secrets must be real keys: a short one stops the server at start, naming the flag.
TEST(DeployTest, ShortOperatorKeysAreRefusedAtStart) {
  TempDir dir;
  std::ofstream(dir.path() / "short") << "too-short\n";
  CommandResult r = RunParsyn({"server", "--data-dir", (dir.path() / "data").string(), "--listen", "127.0.0.1:0",
                               "--admin-key-file", (dir.path() / "short").string()},
                              std::chrono::seconds(30));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("--admin-key-file"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("at least 32"), std::string::npos) << r.output;
  r = RunParsyn({"worker", "--server", "http://127.0.0.1:1", "--bootstrap-key-file", (dir.path() / "missing").string()},
                std::chrono::seconds(30));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("--bootstrap-key-file"), std::string::npos) << r.output;
}

// Building the image needs a Docker daemon (and a network for debian:12), which these machines do not have.
TEST(DeployTest, DockerImageBuilds) {
  if (std::getenv("PARSYN_TEST_DOCKER_BUILD") == nullptr || std::system("docker info >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "the image build is not exercised here: it needs a Docker daemon and PARSYN_TEST_DOCKER_BUILD=1 "
                    "(the Dockerfile's command line is run by DockerfileCommandStartsACoordinator)";
  }
  const int built =
      std::system(("docker build -t parsyn:test '" + test_support::BuildPath("source_dir") + "'").c_str());
  EXPECT_EQ(built, 0);
}

}  // namespace
}  // namespace parsyn::e2e
