#include "storage/postgres_for_test.h"

#include <fcntl.h>
#include <grp.h>
#include <libpq-fe.h>
#include <pwd.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>
#include <vector>

#include "base/temp_file.h"
#include "base/testing/free_port.h"

namespace parsyn::storage {
namespace {

namespace fs = std::filesystem;

constexpr char kServerUser[] = "parsyn-pg";  // created by ./dev setup
constexpr char kSuperuser[] = "parsyn";      // the cluster's superuser (initdb -U)

bool Executable(const fs::path& p) { return ::access(p.c_str(), X_OK) == 0; }

std::optional<fs::path> FindBinDir() {
  if (const char* dir = std::getenv("PARSYN_PG_BINDIR"); dir != nullptr && *dir != '\0') {
    if (Executable(fs::path(dir) / "initdb") && Executable(fs::path(dir) / "postgres")) return fs::path(dir);
    return std::nullopt;
  }
  std::optional<fs::path> best;
  int best_version = -1;
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator("/usr/lib/postgresql", ec)) {
    const fs::path bin = e.path() / "bin";
    int version = std::atoi(e.path().filename().c_str());
    if (version > best_version && Executable(bin / "initdb") && Executable(bin / "postgres")) {
      best = bin;
      best_version = version;
    }
  }
  return best;
}

// Whom the server runs as: nullopt for this process's own user (not root), else parsyn-pg.
struct RunAs {
  uid_t uid;
  gid_t gid;
};

StatusOr<std::optional<RunAs>> ServerUser() {
  if (::geteuid() != 0) return std::optional<RunAs>();
  struct passwd* pw = ::getpwnam(kServerUser);
  if (pw == nullptr) {
    return FailedPreconditionError(std::string("PostgreSQL refuses to run as root and the user ") + kServerUser +
                                   " does not exist: run ./dev setup (it creates it with useradd --system)");
  }
  return std::optional<RunAs>(RunAs{pw->pw_uid, pw->pw_gid});
}

std::string Tail(const fs::path& log, size_t max_chars = 2000) {
  std::ifstream in(log);
  std::stringstream text;
  text << in.rdbuf();
  std::string s = text.str();
  return s.size() > max_chars ? s.substr(s.size() - max_chars) : s;
}

// Starts `argv` as `run_as` with stdout and stderr appended to `log`; the child is killed when this process dies.
StatusOr<pid_t> Spawn(const std::vector<std::string>& argv, const std::optional<RunAs>& run_as, const fs::path& log) {
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const pid_t parent = ::getpid();
  pid_t pid = ::fork();
  if (pid < 0) return UnavailableError("fork() failed");
  if (pid == 0) {
    int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) {
      ::dup2(fd, 1);
      ::dup2(fd, 2);
    }
    int null_fd = ::open("/dev/null", O_RDONLY);
    if (null_fd >= 0) ::dup2(null_fd, 0);
    if (run_as) {
      if (::setgroups(0, nullptr) != 0 || ::setgid(run_as->gid) != 0 || ::setuid(run_as->uid) != 0) ::_exit(126);
    }
    // After the uid change, which clears the parent-death signal.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(125);
    ::execv(args[0], args.data());
    ::_exit(127);
  }
  return pid;
}

}  // namespace

std::optional<std::string> PostgresUnavailableReason() {
  if (!FindBinDir()) {
    return "the PostgreSQL server binaries (initdb, postgres) were not found in $PARSYN_PG_BINDIR or "
           "/usr/lib/postgresql/*/bin: install Debian's postgresql package (./dev setup does)";
  }
  StatusOr<std::optional<RunAs>> user = ServerUser();
  if (!user.ok()) return user.status().message();
  return std::nullopt;
}

StatusOr<std::unique_ptr<PostgresForTest>> PostgresForTest::Start() {
  if (std::optional<std::string> why = PostgresUnavailableReason()) return FailedPreconditionError(*why);
  const fs::path bin = *FindBinDir();
  PARSYN_ASSIGN_OR_RETURN(std::optional<RunAs> run_as, ServerUser());

  std::unique_ptr<PostgresForTest> server(new PostgresForTest());
  // Under /tmp (world-searchable), not $TMPDIR, which may sit in a home the server's user cannot enter.
  PARSYN_ASSIGN_OR_RETURN(server->dir_, CreateTempDir("/tmp", "parsyn-pg"));
  const fs::path dir = server->dir_;
  if (run_as && ::chown(dir.c_str(), run_as->uid, run_as->gid) != 0) {
    return InternalError("cannot give " + dir.string() + " to " + kServerUser);
  }
  const fs::path data = dir / "data";
  const fs::path log = dir / "server.log";

  // --no-sync: a throwaway cluster need not survive power loss; it saves seconds per test process.
  PARSYN_ASSIGN_OR_RETURN(pid_t initdb, Spawn({(bin / "initdb").string(), "-D", data.string(), "-U", kSuperuser,
                                               "--auth=trust", "--encoding=UTF8", "--no-locale", "--no-sync"},
                                              run_as, log));
  int wstatus = 0;
  ::waitpid(initdb, &wstatus, 0);
  if (!WIFEXITED(wstatus) || WEXITSTATUS(wstatus) != 0) {
    return InternalError("initdb failed (status " + std::to_string(wstatus) + "):\n" + Tail(log));
  }

  // The free port may be taken before the server binds it: then it exits at once, and we try another.
  for (int attempt = 0; attempt < 3; ++attempt) {
    PARSYN_ASSIGN_OR_RETURN(int port, test_support::FreeLoopbackPort());
    // fsync=off: the tests check the store's semantics, not the disk's; durability is PostgreSQL's own.
    PARSYN_ASSIGN_OR_RETURN(pid_t pid,
                            Spawn({(bin / "postgres").string(), "-D", data.string(), "-p", std::to_string(port), "-k",
                                   dir.string(), "-c", "listen_addresses=127.0.0.1", "-c", "fsync=off", "-c",
                                   "max_connections=40", "-c", "shared_buffers=16MB"},
                                  run_as, log));
    server->pid_ = pid;
    server->port_ = port;
    const std::string conninfo =
        "host=127.0.0.1 port=" + std::to_string(port) + " dbname=postgres user=" + kSuperuser + " connect_timeout=2";
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    bool exited = false;
    while (std::chrono::steady_clock::now() < deadline) {
      if (::waitpid(pid, &wstatus, WNOHANG) == pid) {
        server->pid_ = -1;
        exited = true;
        break;
      }
      if (PQping(conninfo.c_str()) == PQPING_OK) return server;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    if (!exited) {
      return DeadlineExceededError("PostgreSQL did not answer on port " + std::to_string(port) + " within 60 s:\n" +
                                   Tail(log));
    }
    if (Tail(log).find("could not bind") == std::string::npos) {
      return UnavailableError("PostgreSQL exited during startup (status " + std::to_string(wstatus) + "):\n" +
                              Tail(log));
    }
  }
  return UnavailableError("PostgreSQL could not bind a free port:\n" + Tail(log));
}

std::string PostgresForTest::Url(const std::string& database) const {
  return std::string("postgres://") + kSuperuser + "@127.0.0.1:" + std::to_string(port_) + "/" + database;
}

StatusOr<std::string> PostgresForTest::NewDatabase() {
  static std::mutex mu;
  std::lock_guard lock(mu);
  const std::string name = "t_" + std::to_string(next_database_++);
  PGconn* conn = PQconnectdb(Url("postgres").c_str());
  std::string error;
  if (PQstatus(conn) != CONNECTION_OK) {
    error = PQerrorMessage(conn);
  } else {
    PGresult* r = PQexec(conn, ("CREATE DATABASE " + name).c_str());
    if (PQresultStatus(r) != PGRES_COMMAND_OK) error = PQresultErrorMessage(r);
    PQclear(r);
  }
  PQfinish(conn);
  if (!error.empty()) return UnavailableError("creating test database " + name + ": " + error);
  return Url(name);
}

void PostgresForTest::Stop() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGQUIT);  // immediate shutdown: the postmaster ends its backends and exits
  ::waitpid(pid_, nullptr, 0);
  pid_ = -1;
}

PostgresForTest::~PostgresForTest() {
  Stop();
  if (!dir_.empty() && std::getenv("PARSYN_KEEP_PG") == nullptr) {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
}

StatusOr<PostgresForTest*> SharedPostgres() {
  static const StatusOr<std::unique_ptr<PostgresForTest>> server = PostgresForTest::Start();
  if (!server.ok()) return server.status();
  return server->get();
}

std::string ExecSql(const std::string& url, const std::string& sql, std::string* first_value) {
  PGconn* conn = PQconnectdb(url.c_str());
  std::string error;
  if (PQstatus(conn) != CONNECTION_OK) {
    error = PQerrorMessage(conn);
  } else {
    PGresult* r = PQexec(conn, sql.c_str());
    if (PQresultStatus(r) != PGRES_COMMAND_OK && PQresultStatus(r) != PGRES_TUPLES_OK) {
      error = PQresultErrorMessage(r);
    } else if (first_value != nullptr && PQntuples(r) > 0) {
      *first_value = PQgetvalue(r, 0, 0);
    }
    PQclear(r);
  }
  PQfinish(conn);
  return error;
}

}  // namespace parsyn::storage
