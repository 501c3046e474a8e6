#include "storage/sqlite_store.h"

#include "storage/sql/sql_schema.h"
#include "storage/sql/sqlite_connection.h"

namespace parsyn::storage {

std::span<const Migration> SqliteMigrations() { return SqlMigrations(); }

StatusOr<std::unique_ptr<SqliteMetadataStore>> SqliteMetadataStore::Open(const std::string& path,
                                                                         std::span<const Migration> migrations) {
  PARSYN_ASSIGN_OR_RETURN(std::unique_ptr<SqliteConnection> db, SqliteConnection::Open(path));
  // WAL lets readers (another `parsyn` reading the file) proceed during a write; FULL fsyncs the WAL on every
  // commit, so an acknowledged change survives power loss, not only a crash.
  PARSYN_RETURN_IF_ERROR(db->Exec("PRAGMA journal_mode=WAL", "enabling WAL"));
  PARSYN_RETURN_IF_ERROR(db->Exec("PRAGMA synchronous=FULL", "setting synchronous=FULL"));
  // Migrations run before foreign keys are enforced: rebuilding a table (drop, rename) must not cascade into the rows
  // that refer to it. foreign_key_check then proves the data still holds together.
  PARSYN_RETURN_IF_ERROR(MigrateSchema(*db, migrations));
  PARSYN_ASSIGN_OR_RETURN(std::optional<std::string> dangling,
                          db->QueryText("PRAGMA foreign_key_check", "checking foreign keys"));
  if (dangling) {
    return InternalError("metadata store " + path + ": a row of table " + *dangling +
                         " refers to a missing row after the schema migrations");
  }
  PARSYN_RETURN_IF_ERROR(db->Exec("PRAGMA foreign_keys=ON", "enabling foreign keys"));
  return std::unique_ptr<SqliteMetadataStore>(new SqliteMetadataStore(std::move(db)));
}

SqliteMetadataStore::SqliteMetadataStore(std::unique_ptr<SqliteConnection> db)
    : SqlMetadataStore(std::move(db)), sqlite_(static_cast<SqliteConnection*>(db_.get())) {}

sqlite3* SqliteMetadataStore::handle_for_testing() { return sqlite_->handle(); }

}  // namespace parsyn::storage
