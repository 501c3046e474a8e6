// Test helper: a throwaway PostgreSQL server (Debian's `postgresql` binaries), for the PostgreSQL metadata store's
// tests and the end-to-end tests that point a coordinator at it.
//
// The server runs `initdb` + `postgres` in a fresh temporary directory (data directory and unix socket there), on a
// free 127.0.0.1 port, with trust authentication for its one superuser `parsyn`. PostgreSQL refuses to run as root,
// so as root (tests, CI) both run as the unprivileged system user `parsyn-pg` that `./dev setup` creates; as any other
// user they run as that user. The server is a child of the test process that dies with it (PR_SET_PDEATHSIG), and is
// stopped at exit with SIGQUIT (pg_ctl's "immediate" mode). One server per test process (CTest runs each test in its
// own process), started on first use; a database per test (NewDatabase).
//
// Binaries: $PARSYN_PG_BINDIR, else the newest /usr/lib/postgresql/<version>/bin. Tests skip, saying what is missing
// and how to get it, only when the binaries or the user are not there (PostgresUnavailableReason).
// Thread-safe.
#pragma once

#include <sys/types.h>

#include <filesystem>
#include <memory>
#include <optional>
#include <string>

#include "base/status.h"

namespace parsyn::storage {

// Why no test server can be started here, with how to fix it; nullopt when one can.
std::optional<std::string> PostgresUnavailableReason();

class PostgresForTest {
 public:
  // Starts one (at most 60 s to answer). FailedPrecondition naming what is missing (see PostgresUnavailableReason);
  // Unavailable/Internal with the server's log tail when it does not come up.
  static StatusOr<std::unique_ptr<PostgresForTest>> Start();
  ~PostgresForTest();
  PostgresForTest(const PostgresForTest&) = delete;
  PostgresForTest& operator=(const PostgresForTest&) = delete;

  int port() const { return port_; }
  // postgres://parsyn@127.0.0.1:PORT/DATABASE
  std::string Url(const std::string& database) const;
  // Creates a new empty database (t_1, t_2, ...) and returns its URL.
  StatusOr<std::string> NewDatabase();
  // Stops the server now (SIGQUIT, then waits); the destructor then has nothing left to do.
  void Stop();

 private:
  PostgresForTest() = default;
  std::filesystem::path dir_;  // removed with the server unless $PARSYN_KEEP_PG is set
  pid_t pid_ = -1;
  int port_ = 0;
  int next_database_ = 1;
};

// One server for the whole test process: started by the first call, stopped at exit. A failed start is remembered:
// every call returns its error.
StatusOr<PostgresForTest*> SharedPostgres();

// Runs `sql` (one or more statements) on the database at `url` through libpq: "" when it succeeded, else the error.
// `first_value`, when given, receives the first row's first column of a query that returns rows.
std::string ExecSql(const std::string& url, const std::string& sql, std::string* first_value = nullptr);

}  // namespace parsyn::storage
