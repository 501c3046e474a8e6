// PostgresMetadataStore: the MetadataStore on a PostgreSQL database, through libpq: SqlMetadataStore
// (sql/sql_metadata_store.h, the queries both SQL stores share) on a PostgresConnection (sql/postgres_connection.h),
// plus the coordinator lease.
//
// URL: postgres://USER:PASSWORD@HOST:PORT/DATABASE?PARAMS (or postgresql://), libpq's own URI form, so libpq's
// parameters (sslmode, connect_timeout, ...) and environment (PGPASSWORD, ~/.pgpass) apply. Errors name the host,
// port, database and user, never the password.
//
// Semantics are SQLite's (sqlite_store.h): the same code, typed records, errors and messages (the contract suite in
// metadata_store_contract.h runs against both). Multi-record changes lock the job's row first (SELECT ... FOR
// UPDATE), so two stores on one database (two coordinators) serialise per job. Durability is the server's
// (synchronous_commit=on by default: a commit returns after its WAL is flushed).
//
// Schema: the shared one (sql/sql_schema.h), applied at Open() under an advisory lock so two processes opening one
// database at once migrate it once; a database at one of PostgreSQL's old versions (1..6, before the shared history)
// is brought forward to it first.
//
// Failover: the table coordinator_lease holds the leader lease (AcquireLeaderLease); once a store has asked for it,
// its writes check the lease's epoch in their own transaction (fencing), so a deposed leader's late writes are
// refused by the database (docs/architecture.md, "Failover").
//
// Threads: one connection guarded by a mutex; every method may be called from any thread (calls are serialised).
// A connection the server dropped is re-established at the next call (its error was Unavailable).
#pragma once

#include <chrono>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "storage/sql/sql_metadata_store.h"

namespace parsyn::storage {

// The PostgreSQL schema this build uses, in order (the shared one, sql/sql_schema.h's SqlMigrations()).
std::span<const Migration> PostgresMigrations();

// Whether `uri` names a PostgreSQL database (postgres:// or postgresql://).
bool IsPostgresUri(std::string_view uri);

// `uri` with its passwords, if any (USER:PASSWORD@ and password= query values), replaced by "***": safe for logs
// and messages.
std::string RedactPostgresUri(std::string_view uri);

class PostgresMetadataStore final : public SqlMetadataStore {
 public:
  // Connects to `uri` and applies `migrations` that are not applied yet. InvalidArgument for a malformed URL;
  // Unavailable naming host:port (never the password) if the server cannot be reached or refuses the login;
  // FailedPrecondition if the database's schema is newer than the last of `migrations`; Internal naming the version if
  // a migration fails (nothing of it is kept). Tests may pass a prefix of PostgresMigrations() or their own list.
  static StatusOr<std::unique_ptr<PostgresMetadataStore>> Open(
      std::string_view uri, std::span<const Migration> migrations = PostgresMigrations());

  // The lease is the row of `coordinator_lease`, with its expiry by the database's clock.
  bool SharedByCoordinators() const override { return true; }
  StatusOr<LeaderLease> AcquireLeaderLease(std::string_view holder, std::string_view holder_url,
                                           std::chrono::milliseconds ttl) override;
  Status ReleaseLeaderLease(std::string_view holder) override;

 private:
  using SqlMetadataStore::SqlMetadataStore;
};

}  // namespace parsyn::storage
