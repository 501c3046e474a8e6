// SqliteConnection: the SqlConnection (sql_connection.h) on one SQLite database file (or ":memory:"), for
// SqliteMetadataStore (storage/sqlite_store.h).
//
// Prepared statements are cached by their text; $n placeholders become SQLite's ?n. Errors map by SQLite's extended
// result code (a unique or primary key: AlreadyExists; a foreign key: FailedPrecondition; busy, I/O, full: Unavailable,
// a full disk as DiskFullError; a damaged file: DataLoss). Every commit is counted through a commit hook, so a
// statement outside a transaction counts as one.
// Threads: not for concurrent use (the store's mutex serialises calls).
#pragma once

#include <sqlite3.h>

#include <atomic>
#include <map>
#include <memory>
#include <string>
#include <string_view>

#include "storage/sql/sql_connection.h"

namespace parsyn::storage {

// The steps of this kind of database's schema before the shared history (SqlConnection::LegacyMigrations), for tests
// that build databases as older builds left them.
std::span<const Migration> SqliteLegacyMigrations();

class SqliteConnection final : public SqlConnection {
 public:
  // Opens (creating if missing) the database at `path` with extended result codes and a busy timeout; no pragma
  // beyond those (SqliteMetadataStore::Open sets WAL, synchronous and foreign keys). Unavailable if it cannot.
  static StatusOr<std::unique_ptr<SqliteConnection>> Open(const std::string& path);
  ~SqliteConnection() override;

  Status EnsureReady() override { return Status::Ok(); }
  StatusOr<std::unique_ptr<SqlStatement>> Prepare(std::string_view sql) override;
  Status Exec(std::string_view sql, std::string_view context) override;
  Status Begin() override { return Exec("BEGIN IMMEDIATE", "starting a transaction"); }
  Status Commit() override { return Exec("COMMIT", "committing"); }
  Status Rollback() override;
  int64_t commits() const override { return commits_.load(std::memory_order_relaxed); }

  std::string_view RowLock() const override { return ""; }
  std::string_view SharedRowLock() const override { return ""; }
  std::string_view ByteOrder() const override { return ""; }
  std::string_view AutoIdType() const override { return "INTEGER PRIMARY KEY AUTOINCREMENT"; }

  Status LockSchema() override { return Status::Ok(); }
  std::span<const Migration> LegacyMigrations() const override;
  std::string_view LegacyToSharedSql() const override;
  std::string Describe() const override { return "database " + path_; }

  // The first row of `sql`'s first column as text, nullopt when it returns no row; for pragmas and checks.
  StatusOr<std::optional<std::string>> QueryText(std::string_view sql, std::string_view context);
  sqlite3* handle() { return db_; }

 private:
  struct StatementDeleter {
    void operator()(sqlite3_stmt* stmt) const { sqlite3_finalize(stmt); }
  };

  SqliteConnection(sqlite3* db, std::string path);

  sqlite3* db_;  // owned: closed after the statements are finalized
  std::string path_;
  std::map<std::string, std::unique_ptr<sqlite3_stmt, StatementDeleter>, std::less<>> statements_;
  std::atomic<int64_t> commits_{0};
};

}  // namespace parsyn::storage
