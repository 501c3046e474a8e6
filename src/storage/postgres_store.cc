#include "storage/postgres_store.h"

#include "storage/sql/postgres_connection.h"
#include "storage/sql/sql_schema.h"
#include "storage/sql/sql_store_internal.h"

namespace parsyn::storage {

std::span<const Migration> PostgresMigrations() { return SqlMigrations(); }

StatusOr<std::unique_ptr<PostgresMetadataStore>> PostgresMetadataStore::Open(std::string_view uri,
                                                                             std::span<const Migration> migrations) {
  if (!IsPostgresUri(uri)) {
    return InvalidArgumentError("metadata store URL " + RedactPostgresUri(uri) +
                                " is not a PostgreSQL URL; expected postgres://USER:PASSWORD@HOST:PORT/DATABASE");
  }
  PARSYN_ASSIGN_OR_RETURN(std::unique_ptr<PostgresConnection> db, PostgresConnection::Open(uri));
  PARSYN_RETURN_IF_ERROR(MigrateSchema(*db, migrations));
  return std::unique_ptr<PostgresMetadataStore>(new PostgresMetadataStore(std::move(db)));
}

StatusOr<LeaderLease> PostgresMetadataStore::AcquireLeaderLease(std::string_view holder, std::string_view holder_url,
                                                                std::chrono::milliseconds ttl) {
  if (holder.empty()) return InvalidArgumentError("the leader lease needs a holder id");
  PARSYN_LOCK_AND_CONNECT();
  LeaderLease lease{.holder = std::string(holder), .holder_url = std::string(holder_url)};
  {
    // One statement: free, expired or already ours -> ours; a new holder bumps the epoch. The row lock it takes
    // waits for a leader's job write in flight (CheckFenceLocked's FOR SHARE), so a takeover comes after it.
    PARSYN_PREPARE(q,
                   "INSERT INTO coordinator_lease AS l (id, holder, holder_url, epoch, expires_at) "
                   "VALUES (1, $1, $2, 1, clock_timestamp() + $3::float8 * interval '1 millisecond') "
                   "ON CONFLICT (id) DO UPDATE SET "
                   "epoch = CASE WHEN l.holder = EXCLUDED.holder THEN l.epoch ELSE l.epoch + 1 END, "
                   "holder = EXCLUDED.holder, holder_url = EXCLUDED.holder_url, expires_at = EXCLUDED.expires_at "
                   "WHERE l.holder = EXCLUDED.holder OR l.expires_at <= clock_timestamp() RETURNING epoch");
    q->Bind(holder, holder_url, static_cast<int64_t>(ttl.count()));
    PARSYN_ASSIGN_OR_RETURN(bool row, q->Step());
    if (row) {
      lease.held = true;
      lease.epoch = q->Int(0);
      PARSYN_RETURN_IF_ERROR(q->Run());
      fencing_epoch_ = lease.epoch;
      return lease;
    }
  }
  PARSYN_PREPARE(q, "SELECT holder, holder_url, epoch FROM coordinator_lease WHERE id = 1");
  PARSYN_ASSIGN_OR_RETURN(bool row, q->Step());
  lease.holder = row ? q->Text(0) : "";
  lease.holder_url = row ? q->Text(1) : "";
  lease.epoch = row ? q->Int(2) : 0;
  fencing_epoch_ = -1;  // not the leader: every job write is refused
  return lease;
}

Status PostgresMetadataStore::ReleaseLeaderLease(std::string_view holder) {
  PARSYN_LOCK_AND_CONNECT();
  PARSYN_PREPARE(q, "UPDATE coordinator_lease SET expires_at = clock_timestamp() WHERE id = 1 AND holder = $1");
  q->Bind(holder);
  return q->Run();
}

}  // namespace parsyn::storage
