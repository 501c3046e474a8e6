// SqliteMetadataStore: the MetadataStore on one SQLite database file (or ":memory:"): SqlMetadataStore
// (sql/sql_metadata_store.h, the queries both SQL stores share) on a SqliteConnection (sql/sqlite_connection.h).
//
// Settings at open: journal_mode=WAL, synchronous=FULL (every commit is fsynced: an acknowledged change survives
// power loss, not just a crash of this process), foreign_keys=ON, busy_timeout. The schema is the shared one
// (sql/sql_schema.h): Open() applies the missing steps in order, each in its own transaction together with its
// version bump, so a crash mid-migration leaves the previous version; a file at one of SQLite's old versions (1..7,
// before the shared history) is brought forward to it first.
// Threads: one connection guarded by a mutex; every method may be called from any thread (calls are serialised).
#pragma once

#include <sqlite3.h>

#include <memory>
#include <span>
#include <string>

#include "storage/sql/sql_metadata_store.h"

namespace parsyn::storage {

class SqliteConnection;

// The schema this build uses, in order (the shared one, sql/sql_schema.h's SqlMigrations()).
std::span<const Migration> SqliteMigrations();

class SqliteMetadataStore final : public SqlMetadataStore {
 public:
  // Opens (creating if missing) the database at `path` (":memory:" for a private in-memory one) and applies
  // `migrations` that are not applied yet. FailedPrecondition if the database's schema is newer than the last of
  // `migrations` (written by a newer build); Unavailable if it cannot be opened; Internal naming the version if a
  // migration fails (nothing of it is kept). Tests may pass a prefix of SqliteMigrations() or their own list.
  static StatusOr<std::unique_ptr<SqliteMetadataStore>> Open(
      const std::string& path, std::span<const Migration> migrations = SqliteMigrations());

  // The raw connection, for tests that install triggers or functions to inject faults. Not for production code.
  sqlite3* handle_for_testing();

 private:
  explicit SqliteMetadataStore(std::unique_ptr<SqliteConnection> db);

  SqliteConnection* sqlite_;  // db_, as what it is
};

}  // namespace parsyn::storage
